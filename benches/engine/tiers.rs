//! `-- --tiers`: the prefix cache's lower tiers (issue 25), side by side in one run.
//!
//! 1. Restart: time to first token of a 2047-token prompt (127 full blocks of 16, on the
//!    2048-token context) in a fresh engine that must compute it, against a fresh engine
//!    whose `kv_cache_dir` an earlier engine filled with the same prompt (a restart). The
//!    time runs from `add_request` (which reads the disk records into the host tier) to the
//!    first token; engine construction is not counted. Rounds alternate the two, each with a
//!    new prompt and folder; the first tokens must agree.
//! 2. Conversations: eight conversations of four turns, each turn's prompt the previous
//!    prompt, its reply (24 greedy tokens) and 40 new tokens, all eight of a turn submitted
//!    together, over a 48-block device pool that holds about two conversations. Prompt tokens
//!    the engine had to compute (prompt tokens less prefix-cache hits), with the device pool
//!    alone, with a host tier of 256 blocks, and with a 24-block host tier over a disk tier;
//!    the outputs must be identical.
//! 3. Write-through: wall time of 16 sequences decoding 64 tokens each from fresh prompts,
//!    with every full block copied down and written to the disk tier, against no tiers.
//! 3. Write-through: wall time of 16 sequences decoding 64 tokens each from fresh prompts,
//!    with every full block copied down and written to the disk tier, against no tiers.

use super::{engine, greedy, median, ms, prompt, BLOCK};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt, RequestEvent};
use pagellm::GpuContext;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A folder for one engine's disk tier, removed on drop.
struct Folder(PathBuf);

impl Folder {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("pagellm-tiers-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Folder(dir)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn base() -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens: 1024,
        ..EngineConfig::default()
    }
}

/// Time to the first token of `p` and that token.
fn first_token(e: &mut Engine, p: &[u32]) -> (Duration, u32) {
    let start = Instant::now();
    let h = e
        .add_request(Prompt::Tokens(p.to_vec()), greedy(1))
        .expect("add request");
    loop {
        e.step().expect("step");
        if let Some(token) = h.events.try_iter().find_map(|ev| match ev {
            RequestEvent::Token { token_id, .. } => Some(token_id),
            _ => None,
        }) {
            let t = start.elapsed();
            e.run_to_completion().expect("finish");
            return (t, token);
        }
    }
}

pub fn tiers_section(ctx: &Arc<GpuContext>, dir: &Path, quick: bool) {
    restart(
        ctx,
        dir,
        if quick { 511 } else { 2047 },
        if quick { 2 } else { 4 },
    );
    conversations(ctx, dir);
    write_through(ctx, dir, if quick { 2 } else { 5 });
}

/// Decode throughput of 16 sequences with every full block written through to the disk
/// tier, against the same engine without tiers; rounds alternate the two.
fn write_through(ctx: &Arc<GpuContext>, dir: &Path, rounds: u64) {
    println!();
    println!("## Prefix tiers: what writing every block through to disk costs a decode");
    println!();
    let folder = Folder::new("write-through");
    let mut plain = engine(ctx, dir, base());
    let mut tiered = engine(
        ctx,
        dir,
        EngineConfig {
            kv_cache_dir: Some(folder.0.clone()),
            ..base()
        },
    );
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (e, t) in [&mut plain, &mut tiered].into_iter().zip(&mut times) {
            // Fresh prompts each round: nothing is found in any tier.
            let hs: Vec<_> = (0..16)
                .map(|i| {
                    let p = prompt(900 + 100 * round + i, 16);
                    e.add_request(Prompt::Tokens(p), greedy(64)).expect("add")
                })
                .collect();
            let start = Instant::now();
            e.run_to_completion().expect("decode");
            t.push(start.elapsed());
            drop(hs);
        }
    }
    let disk = tiered.stats().disk.unwrap_or_default();
    let [p, w] = times.map(median);
    println!(
        "16 sequences x (16-token prompt + 64 tokens), {rounds} rounds, median wall: without \
         tiers {:.1} ms, writing through {:.1} ms: **{:.3}x** ({} blocks written, {:.1} MiB)",
        ms(p),
        ms(w),
        w.as_secs_f64() / p.as_secs_f64(),
        disk.writes,
        disk.bytes as f64 / (1 << 20) as f64
    );
}

fn restart(ctx: &Arc<GpuContext>, dir: &Path, len: usize, rounds: u64) {
    println!();
    println!("## Prefix tiers: a {len}-token prompt after a restart (disk tier) vs computed");
    println!();
    println!("| round | computed (ms) | from disk (ms) | disk / computed | blocks read |");
    println!("|---:|---:|---:|---:|---:|");
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let p = prompt(500 + round, len);
        let (t_cold, tok_cold) = first_token(&mut engine(ctx, dir, base()), &p);
        let folder = Folder::new(&round.to_string());
        let with_disk = EngineConfig {
            kv_cache_dir: Some(folder.0.clone()),
            ..base()
        };
        first_token(&mut engine(ctx, dir, with_disk.clone()), &p);
        let mut restarted = engine(ctx, dir, with_disk);
        let (t_warm, tok_warm) = first_token(&mut restarted, &p);
        assert_eq!(tok_cold, tok_warm, "the disk tier changed the first token");
        let read = restarted.stats().disk.map_or(0, |d| d.hits);
        println!(
            "| {round} | {:.1} | {:.1} | {:.3} | {read} |",
            ms(t_cold),
            ms(t_warm),
            t_warm.as_secs_f64() / t_cold.as_secs_f64()
        );
        cold.push(t_cold);
        warm.push(t_warm);
    }
    let (c, w) = (median(cold), median(warm));
    println!();
    println!(
        "median: computed {:.1} ms, from disk {:.1} ms: **{:.3}x** (first tokens identical)",
        ms(c),
        ms(w),
        w.as_secs_f64() / c.as_secs_f64()
    );
}

/// Runs the conversations; returns every reply and the prompt tokens submitted.
fn converse(e: &mut Engine) -> (Vec<Vec<u32>>, usize) {
    const CONVERSATIONS: u64 = 8;
    let mut prompts: Vec<Vec<u32>> = (0..CONVERSATIONS).map(|c| prompt(700 + c, 40)).collect();
    let mut replies = Vec::new();
    let mut submitted = 0;
    for turn in 0..4u64 {
        submitted += prompts.iter().map(Vec::len).sum::<usize>();
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                e.add_request(Prompt::Tokens(p.clone()), greedy(24))
                    .expect("add request")
            })
            .collect();
        e.run_to_completion().expect("turn");
        for (c, h) in hs.iter().enumerate() {
            let out = h.wait().expect("reply");
            let reply = out.outputs[0].token_ids.clone();
            prompts[c].extend(&reply);
            prompts[c].extend(prompt(800 + 10 * turn + c as u64, 40));
            replies.push(reply);
        }
    }
    (replies, submitted)
}

fn conversations(ctx: &Arc<GpuContext>, dir: &Path) {
    println!();
    println!(
        "## Prefix tiers: 8 conversations x 4 turns over a 48-block device pool (blocks of {BLOCK})"
    );
    println!();
    println!(
        "| prefix cache | prompt tokens | computed | reused from host | preemptions | wall (s) | \
         computed vs device only |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let small = EngineConfig {
        num_gpu_blocks: Some(48),
        num_cpu_blocks: Some(256),
        max_model_len: Some(512),
        ..base()
    };
    let folder = Folder::new("conversations");
    let setups = [
        ("device only", small.clone()),
        (
            "+ host tier (256 blocks)",
            EngineConfig {
                host_tier_blocks: Some(256),
                ..small.clone()
            },
        ),
        (
            "+ host tier (24) + disk",
            EngineConfig {
                host_tier_blocks: Some(24),
                kv_cache_dir: Some(folder.0.clone()),
                ..small.clone()
            },
        ),
    ];
    let mut baseline = None;
    let mut first_replies = None;
    for (name, cfg) in setups {
        let mut e = engine(ctx, dir, cfg);
        let start = Instant::now();
        let (replies, prompt_tokens) = converse(&mut e);
        let wall = start.elapsed();
        match &first_replies {
            None => first_replies = Some(replies),
            Some(r) => assert_eq!(r, &replies, "{name}: the replies differ"),
        }
        let s = e.stats();
        let computed = prompt_tokens - s.cache.prefix_hits as usize * BLOCK;
        let base = *baseline.get_or_insert(computed);
        println!(
            "| {name} | {prompt_tokens} | {computed} | {} | {} | {:.1} | {:.2}x fewer |",
            s.cache.host_tier.hits as usize * BLOCK,
            s.scheduler.preemptions,
            wall.as_secs_f64(),
            base as f64 / computed.max(1) as f64
        );
    }
    println!();
    println!("replies identical in every setup");
}
