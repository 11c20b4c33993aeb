//! Speculative decoding by prompt lookup against plain decoding, side by side in one run.
//!
//! Two engines on the shipped model, one without speculation and one with
//! `--speculative ngram` (k = 4 unless `-- --k N`), hold the same requests and step in
//! turn (`common::alternate_steps`), so drift hits both alike. Decode throughput is the
//! output tokens after each request's first, over the time of the steps after the first
//! (the prefill); both engines must produce the same tokens, which the bench checks.
//!
//! Workloads, each at 1 and 16 concurrent sequences:
//! - **repetitive**: each prompt quotes a passage (text the model itself wrote from a
//!   seed phrase) and then starts it again, as an edit or a summary that quotes its source
//!   does; greedy, 96 tokens.
//! - **non-repetitive**: short prompts sampled at temperature 1 (seeded), 96 tokens, where
//!   proposals are rarely right; the adaptive k must keep this at parity.
//!
//! Run: `cargo bench --bench speculative` (`-- --quick` for one round; adapter chosen as
//! usual, e.g. `PAGELLM_BACKEND=gl`).

#[path = "common/mod.rs"]
mod common;

use pagellm::engine::{Engine, EngineConfig, Prompt, RequestHandle, SpeculativeConfig};
use pagellm::sampling::SamplingParams;
use pagellm::tokenizer::Tokenizer;
use pagellm::GpuContext;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const TOKENS: usize = 96;

const SEEDS: [&str; 16] = [
    "A wise man once said",
    "The secret of life is",
    "Never trust a",
    "In the beginning there was",
    "My grandfather used to say",
    "The trouble with computers is",
    "Love is",
    "When in doubt,",
    "There are two kinds of people:",
    "The best way to predict the future",
    "Money can't buy",
    "If you want to be happy,",
    "A fool and his money",
    "Nothing is certain but",
    "The only thing worse than",
    "Every cloud has",
];

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama")
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// The repetitive prompts: a 48-token passage the model writes from each seed phrase,
/// then a line break and the passage's first 8 tokens again.
fn repetitive_prompts(ctx: &Arc<GpuContext>, n: usize) -> Vec<Vec<u32>> {
    let mut e = Engine::with_context(ctx.clone(), &dir(), EngineConfig::default(), |_, _| {})
        .expect("engine");
    let hs: Vec<RequestHandle> = SEEDS[..n]
        .iter()
        .map(|s| {
            e.add_request(Prompt::Text(s.to_string()), greedy(48))
                .expect("add")
        })
        .collect();
    e.run_to_completion().expect("passages");
    let tok = Tokenizer::from_dir(&dir()).expect("tokenizer");
    let nl = tok.encode("\n", false).expect("newline");
    hs.iter()
        .map(|h| {
            let out = h.wait().expect("passage");
            let passage = [&out.prompt_token_ids[..], &out.outputs[0].token_ids[..]].concat();
            [&passage[..], &nl[..], &passage[..9]].concat()
        })
        .collect()
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: TOKENS,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

struct Run {
    /// Decode step times of the two engines (plain, speculating).
    times: [Vec<Duration>; 2],
    /// Output tokens after each request's first, per engine.
    tokens: [usize; 2],
    proposed: u64,
    accepted: u64,
    drafts: u64,
}

fn run(ctx: &Arc<GpuContext>, k: usize, work: &[(Vec<u32>, SamplingParams)]) -> Run {
    let configs = [
        EngineConfig::default(),
        EngineConfig {
            speculative: Some(SpeculativeConfig {
                num_tokens: k,
                ..SpeculativeConfig::default()
            }),
            ..EngineConfig::default()
        },
    ];
    let mut engines: Vec<Engine> = configs
        .into_iter()
        .map(|c| Engine::with_context(ctx.clone(), &dir(), c, |_, _| {}).expect("engine"))
        .collect();
    let handles: Vec<Vec<RequestHandle>> = engines
        .iter_mut()
        .map(|e| {
            work.iter()
                .map(|(p, s)| {
                    e.add_request(Prompt::Tokens(p.clone()), s.clone())
                        .expect("add")
                })
                .collect()
        })
        .collect();
    let mut times = [Vec::new(), Vec::new()];
    common::alternate_steps(&mut engines, 1, &mut times);
    let outs: Vec<Vec<Vec<u32>>> = handles
        .iter()
        .map(|hs| {
            hs.iter()
                .map(|h| h.wait().expect("request").outputs[0].token_ids.clone())
                .collect()
        })
        .collect();
    assert_eq!(outs[0], outs[1], "speculation changed an output");
    let tokens = outs[0].iter().map(|o| o.len() - 1).sum();
    let s = engines[1].stats().scheduler;
    Run {
        times,
        tokens: [tokens, tokens],
        proposed: s.spec_proposed,
        accepted: s.spec_accepted,
        drafts: s.spec_drafts,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let k = args
        .iter()
        .position(|a| a == "--k")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let rounds = if quick { 1 } else { 3 };
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    println!("# Speculative decoding (prompt lookup, k = {k})");
    println!();
    println!("adapter: {}", ctx.describe());
    println!();
    println!(
        "| workload | sequences | plain tokens/s | ngram tokens/s | speedup | steps plain / ngram | accepted / proposed | accepted per draft |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let tok = Tokenizer::from_dir(&dir()).expect("tokenizer");
    for seqs in [1, 16] {
        let prompts = repetitive_prompts(&ctx, seqs);
        let workloads: [(&str, Vec<(Vec<u32>, SamplingParams)>); 2] = [
            (
                "repetitive",
                prompts.into_iter().map(|p| (p, greedy(TOKENS))).collect(),
            ),
            (
                "non-repetitive",
                SEEDS[..seqs]
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (tok.encode(s, true).expect("encode"), sampled(i as u64)))
                    .collect(),
            ),
        ];
        for (name, work) in &workloads {
            let mut total = [Duration::ZERO; 2];
            let mut steps = [0; 2];
            let mut tokens = [0; 2];
            let (mut proposed, mut accepted, mut drafts) = (0, 0, 0);
            for _ in 0..rounds {
                let r = run(&ctx, k, work);
                for i in 0..2 {
                    total[i] += r.times[i].iter().sum::<Duration>();
                    steps[i] += r.times[i].len();
                    tokens[i] += r.tokens[i];
                }
                proposed += r.proposed;
                accepted += r.accepted;
                drafts += r.drafts;
            }
            let tps = |i: usize| tokens[i] as f64 / total[i].as_secs_f64();
            println!(
                "| {name} | {seqs} | {:.1} | {:.1} | {:.2}x | {} / {} | {:.1}% of {proposed} | {:.2} |",
                tps(0),
                tps(1),
                tps(1) / tps(0),
                steps[0],
                steps[1],
                100.0 * accepted as f64 / proposed.max(1) as f64,
                accepted as f64 / drafts.max(1) as f64
            );
        }
    }
}
