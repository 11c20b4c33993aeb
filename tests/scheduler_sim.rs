//! Randomized simulation of the scheduler and block manager, no GPU: seeded random mixes of
//! prompt lengths (1 to beyond the pool), `n` 1..8, beam widths 1..4, output lengths,
//! arrivals over time and random aborts, on random pools from tiny to ample, random
//! `max_num_seqs` and budgets, with and without prefix caching (and its host tier, and
//! prefixes pinned and let go of as the run goes), in all three preemption modes
//! (automatic with random injected costs), with and without a sliding window, with the
//! device lost now and then (some host blocks counted as never landed) and the device pool
//! resized between a quarter and twice its size (as a live KV budget does). Each
//! step's results go through `Scheduler::commit`, the code the engine runs. The driver
//! checks after every step: the block manager's invariants, no sequence scheduled twice,
//! gang scheduling, the budget and `max_num_seqs`, decode first, released blocks only
//! outside the window. At the end of each run: every request finished, failed
//! with a reason or was aborted within a bounded number of steps; nothing leaked; a request
//! fails only if it could really never fit (beside the most pins held at once); and every
//! finished request produced exactly what it produces alone on an ample pool.

#[path = "common/sched_driver.rs"]
mod driver;

use driver::{splitmix, Driver, Outcome, Req};
use pagellm::internals::cache::{CacheConfig, HostBlockId};
use pagellm::internals::engine::scheduler::PreemptionCosts;
use pagellm::internals::engine::sequence::GroupShape;
use pagellm::internals::engine::{EngineConfig, PreemptionMode, SpeculativeConfig};
use std::collections::BTreeMap;
use std::io::Write;

/// A small seeded generator (the driver's mixer), so each run is reproducible by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix(self.0);
        self.0
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

struct Setup {
    config: EngineConfig,
    cache: CacheConfig,
    costs: Option<PreemptionCosts>,
    /// A sliding window in every layer: blocks that left it are released.
    window: Option<usize>,
    /// How the window is kept: by the scheduler (`Scheduler::with_window`), as one
    /// windowed KV cache group (what the engine does when every layer slides), or as a
    /// global group and two windowed ones (a model mixing windowed and global layers).
    groups: Option<Vec<Option<usize>>>,
}

fn random_setup(g: &mut Rng) -> Setup {
    let block_size = [1, 2, 4, 16][g.range(0, 3)];
    let blocks = match g.range(0, 2) {
        0 => g.range(2, 8),
        1 => g.range(8, 40),
        _ => g.range(40, 300),
    };
    let host = [0, g.range(1, 20), g.range(20, 400)][g.range(0, 2)];
    let watermark = g.range(0, (blocks / 10).min(2));
    let mode = [
        Some(PreemptionMode::Swap),
        Some(PreemptionMode::Recompute),
        None,
    ][g.range(0, 2)];
    let prefix = g.chance(50);
    let config = EngineConfig {
        block_size,
        preemption_mode: mode,
        max_num_seqs: g.range(1, 16),
        max_num_batched_tokens: [1, g.range(2, 16), g.range(16, 128)][g.range(0, 2)],
        enable_prefix_caching: prefix,
        decode_first: g.chance(85),
        speculative: g.chance(40).then(|| SpeculativeConfig {
            num_tokens: g.range(1, 6),
            ..SpeculativeConfig::default()
        }),
        ..EngineConfig::default()
    };
    // Half the runs with prefix caching and a host pool keep a host tier of the prefix
    // cache in part of it, half of those writing every named block through to it.
    let tier = match prefix && host > 0 && g.chance(50) {
        true => g.range(1, host),
        false => 0,
    };
    let cache = CacheConfig::new(block_size, blocks, host)
        .with_watermark_blocks(watermark)
        .with_prefix_caching(prefix)
        .with_host_tier(tier);
    let cache = cache.with_tier_write_through(cache.has_host_tier() && g.chance(50));
    let costs = (mode.is_none() && g.chance(70)).then(|| {
        let mut c = PreemptionCosts::new(1 << g.range(10, 24));
        c.record_swap(1 << g.range(20, 34), 1.0);
        c.record_prefill(g.range(10, 100_000), 1.0);
        c
    });
    let window = g.chance(40).then(|| g.range(1, 40));
    let groups = match (window, g.range(0, 2)) {
        (None, _) | (_, 0) => None,
        (Some(w), 1) => Some(vec![Some(w)]),
        (Some(w), _) => Some(vec![None, Some(w), Some(w)]),
    };
    Setup {
        config,
        cache,
        costs,
        window,
        groups,
    }
}

fn random_request(g: &mut Rng, s: &Setup, seed: u64) -> Req {
    let pool_tokens = s.cache.num_device_blocks * s.cache.block_size;
    let len = match g.range(0, 9) {
        0 => g.range(pool_tokens / 2 + 1, pool_tokens + 20),
        1..=3 => g.range(1, 4),
        _ => g.range(1, (pool_tokens / 3).max(2)),
    };
    let shape = match g.range(0, 9) {
        0..=4 => GroupShape::Samples(1),
        5..=7 => GroupShape::Samples(g.range(2, 8)),
        _ => GroupShape::Beams(g.range(1, 4)),
    };
    // Prompts share prefixes now and then, for the prefix cache.
    let family = g.range(0, 3) as u32;
    Req {
        prompt: (0..len as u32)
            .map(|i| 20 + (i * 31 + family * 7) % 900)
            .collect(),
        shape,
        max_tokens: g.range(1, 24),
        seed,
        ignore_eos: g.chance(30),
    }
}

/// A request's output alone on an ample pool, memoized by its description.
fn alone(cache: &mut BTreeMap<String, Outcome>, r: &Req) -> Outcome {
    let key = format!("{r:?}");
    if let Some(o) = cache.get(&key) {
        return o.clone();
    }
    let config = EngineConfig {
        block_size: 4,
        max_num_seqs: 64,
        max_num_batched_tokens: 256,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut d = Driver::new(
        config,
        CacheConfig::new(4, 8192, 0).with_watermark_blocks(0),
    );
    d.add(0, r.clone());
    d.run(100_000).expect("alone on an ample pool");
    let o = d.outcomes[&0].clone();
    cache.insert(key, o.clone());
    o
}

/// What the runs exercised, to show the mix is not trivial.
#[derive(Debug, Default)]
struct Tally {
    steps: u64,
    finished: u64,
    failed: u64,
    aborted: u64,
    swaps: u64,
    recomputes: u64,
    cow_copies: u64,
    prefix_hits: u64,
    window_releases: u64,
    proposed: u64,
    accepted: u64,
}

/// One simulated run, added to `t`.
fn run(seed: u64, memo: &mut BTreeMap<String, Outcome>, t: &mut Tally) -> Result<(), String> {
    let mut g = Rng(seed);
    let setup = random_setup(&mut g);
    let mut d = match &setup.groups {
        Some(windows) => Driver::with_groups(setup.config.clone(), setup.cache, windows.clone()),
        None => Driver::with_window(setup.config.clone(), setup.cache, setup.window),
    };
    if let Some(c) = setup.costs {
        d.sched.costs = c;
    }
    let num_requests = g.range(1, 24);
    let mut reqs: BTreeMap<u64, Req> = BTreeMap::new();
    let mut next = 0u64;
    let mut work = 0usize;
    let steps_before = d.steps;
    // A third of the runs with prefix caching pin prefixes of earlier prompts now and then
    // (and let go of them): pins take blocks out of what one request may ever get.
    let pinning = setup.cache.enable_prefix_caching && g.chance(33);
    let mut pins = Vec::new();
    let mut capacity = setup.cache.num_device_blocks - setup.cache.watermark_blocks;
    // Arrivals over time and random aborts while the engine runs.
    while next < num_requests as u64 || !d.is_idle() {
        if next < num_requests as u64 && g.chance(40) {
            let r = random_request(&mut g, &setup, seed.wrapping_mul(1000) + next);
            work += (r.prompt.len() + r.max_tokens) * r.shape.width();
            d.add(next, r.clone());
            reqs.insert(next, r);
            next += 1;
        }
        if g.chance(3) {
            let victim = g.range(0, next.max(1) as usize - 1) as u64;
            d.abort(victim);
        }
        if pinning && next > 0 && g.chance(5) {
            let r = &reqs[&(g.range(0, next as usize - 1) as u64)];
            let len = g.range(1, r.prompt.len());
            // No room kept for a sequence (0 tokens): the simulation tracks the capacity.
            let pinned = d
                .sched
                .prefix_cache()
                .pin_prefix_within(&r.prompt[..len], 0);
            if let Ok((Some(pin), _)) = pinned {
                pins.push(pin);
                capacity = capacity.min(d.sched.blocks().group_capacity());
            }
        }
        if !pins.is_empty() && g.chance(4) {
            let pin = pins.swap_remove(g.range(0, pins.len() - 1));
            d.sched
                .prefix_cache()
                .unpin(pin)
                .map_err(|e| e.to_string())?;
        }
        if g.chance(2) {
            lose_device(&mut d, &mut g);
        }
        if g.chance(3) {
            resize_pool(&mut d, &mut g, setup.cache.num_device_blocks);
            capacity = capacity.min(d.sched.blocks().group_capacity());
        }
        if d.steps - steps_before > 200 + 20 * work as u64 {
            return Err(format!(
                "liveness: {} of {next} requests still pending after {} steps ({work} tokens of work) with {:?}",
                d.pending(),
                d.steps - steps_before,
                setup.config
            ));
        }
        d.step().map_err(|e| {
            format!(
                "{e} with {:?} {:?} window {:?} groups {:?}",
                setup.config, setup.cache, setup.window, setup.groups
            )
        })?;
    }
    for pin in pins {
        d.sched
            .prefix_cache()
            .unpin(pin)
            .map_err(|e| e.to_string())?;
    }
    d.check_drained()?;
    let c = &setup.config;
    for (id, r) in &reqs {
        match &d.outcomes[id] {
            Outcome::Aborted => {}
            Outcome::Failed(msg) => {
                let w = r.shape.width();
                // Every sequence at its full length, nothing shared; a windowed KV cache
                // group holds at most its window and a step's chunk.
                let worst = match setup.groups {
                    Some(_) => {
                        w * d
                            .sched
                            .blocks()
                            .blocks_between(0, r.prompt.len() + r.max_tokens)
                    }
                    None => r.worst_blocks(setup.cache.block_size),
                };
                let could_fit =
                    worst <= capacity && w <= c.max_num_seqs && w <= c.max_num_batched_tokens;
                if could_fit {
                    return Err(format!(
                        "request {id} {r:?} failed although it always fits beside the pins \
                         ({capacity} blocks): {msg} ({:?} {:?}, groups {:?})",
                        c, setup.cache, setup.groups
                    ));
                }
            }
            out @ Outcome::Finished(_) => {
                let want = alone(memo, r);
                if *out != want {
                    return Err(format!(
                        "request {id} {r:?} produced {out:?}, alone {want:?} ({c:?} {:?})",
                        setup.cache
                    ));
                }
            }
        }
    }
    let st = d.sched.blocks().stats();
    t.steps += d.steps;
    t.swaps += d.sched.stats.preempted_by_swap;
    t.recomputes += d.sched.stats.preempted_by_recompute;
    t.cow_copies += st.cow_copies;
    t.prefix_hits += st.prefix_hits;
    t.window_releases += st.window_released_blocks;
    t.proposed += d.sched.stats.spec_proposed;
    t.accepted += d.sched.stats.spec_accepted;
    if d.sched.stats.spec_accepted != d.proposals_accepted {
        return Err(format!(
            "the scheduler counted {} accepted proposals, sampling {}",
            d.sched.stats.spec_accepted, d.proposals_accepted
        ));
    }
    for o in d.outcomes.values() {
        match o {
            Outcome::Finished(_) => t.finished += 1,
            Outcome::Failed(_) => t.failed += 1,
            Outcome::Aborted => t.aborted += 1,
        }
    }
    Ok(())
}

/// The device is lost between steps: every group is requeued or kept swapped (with some
/// host blocks, at random, counted as never landed).
fn lose_device(d: &mut Driver, g: &mut Rng) {
    let host = d.sched.blocks().config().num_host_blocks;
    let unlanded: Vec<HostBlockId> = (0..host)
        .filter(|_| g.chance(10))
        .map(|h| HostBlockId(h as u32))
        .collect();
    d.sched.device_lost(&unlanded);
}

/// The device pool changes size between steps, from a quarter to twice its first size, as
/// `Engine::set_kv_budget` does it (the swap-outs it needs are taken, as the engine carries
/// them out); a size below pinned blocks is refused and changes nothing more.
fn resize_pool(d: &mut Driver, g: &mut Rng, first: usize) {
    let n = g.range((first / 4).max(2), first * 2);
    if d.sched.vacate_above(n).is_ok() {
        let _ = d.sched.take_block_ops();
        let _ = d.sched.resize_pool(n, n / 100);
    }
}

#[test]
fn random_mixes_keep_every_promise() {
    let runs: u64 = std::env::var("PAGELLM_SIM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let mut memo = BTreeMap::new();
    let mut t = Tally::default();
    // PAGELLM_SIM_SEED=s replays run s alone.
    let seeds = match std::env::var("PAGELLM_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(s) => s..s + 1,
        None => 0..runs,
    };
    for seed in seeds {
        run(seed, &mut memo, &mut t).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
    // Straight to stderr, past the test harness's capture, so CI logs show the count.
    let _ = writeln!(
        std::io::stderr(),
        "scheduler simulation: {runs} runs, {} simulated steps; {t:?}",
        t.steps
    );
    if std::env::var("PAGELLM_SIM_SEED").is_ok() {
        return;
    }
    assert!(t.steps >= 10_000, "only {} steps simulated", t.steps);
    // The mix reaches every path.
    for (what, n) in [
        ("finished", t.finished),
        ("failed", t.failed),
        ("aborted", t.aborted),
        ("swap preemptions", t.swaps),
        ("recompute preemptions", t.recomputes),
        ("copy-on-write copies", t.cow_copies),
        ("prefix-cache hits", t.prefix_hits),
        ("blocks released by a sliding window", t.window_releases),
        ("proposed tokens", t.proposed),
        ("accepted proposals", t.accepted),
        ("rejected proposals", t.proposed - t.accepted),
    ] {
        assert!(n > 0, "no {what} in {runs} runs");
    }
}
