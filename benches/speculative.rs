//! Speculative decoding by prompt lookup against plain decoding, side by side in one run.
//!
//! Four engines on the shipped model hold the same requests and step in turn, in an order
//! drawn anew each round of steps (`common::alternate_steps_shuffled`), so drift and the
//! after-effects of one engine's heavy step hit all alike: plain decoding, `--speculative
//! ngram` as shipped (k = 7 unless `-- --k N`, adapted per request to its acceptance rate and
//! the measured cost of a row), the same with the row cost fixed at 0 (it proposes k
//! whenever its acceptance rate is above 5%), and plain decoding again, whose ratio to the
//! first shows the run's noise. The engines are made once per workload and kept across its
//! rounds, as a server keeps its engine; the first round is untimed (pipelines compiled on
//! first use, step costs and acceptance rates learned). Decode throughput is the output
//! tokens after each request's first, over the time of the steps after the first (the
//! prefill); all engines must produce the same tokens, which the bench checks.
//!
//! Workloads, each at 1 and 16 concurrent sequences:
//! - **repetitive**: each prompt quotes a passage (text the model itself wrote from a
//!   seed phrase) and then starts it again, as an edit or a summary that quotes its source
//!   does; greedy, 96 tokens.
//! - **non-repetitive**: short prompts sampled at temperature 1 (seeded), 96 tokens, where
//!   proposals are rarely right; the adaptive k must keep this at parity.
//!
//! Run: `cargo bench --bench speculative` (`-- --quick` for one round; adapter chosen as
//! usual, e.g. `PAGELLM_BACKEND=gl`). Diagnostics: `-- --focus` runs only the
//! non-repetitive workload (`-- --focus --repetitive`: the repetitive one) at one sequence,
//! 12 rounds, and prints each engine's step-time distribution per round; `-- --only N`
//! gives all four engines configuration `N` (0 plain,
//! 1 adaptive, 2 always), an A/A run of one configuration. `-- --draft DIR` has the two
//! speculating engines propose with the draft model in DIR instead of the n-gram lookup
//! (its time counts in their steps).

#[path = "common/mod.rs"]
mod common;

use pagellm::internals::engine::{Engine, EngineConfig, Prompt, RequestHandle, SpeculativeConfig};
use pagellm::internals::sampling::SamplingParams;
use pagellm::internals::tokenizer::Tokenizer;
use pagellm::GpuContext;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const TOKENS: usize = 96;

/// Requests: prompt ids and sampling parameters.
type Work = Vec<(Vec<u32>, SamplingParams)>;

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
    let mut e = Engine::with_context(ctx.clone(), dir(), EngineConfig::default(), |_, _| {})
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
    let nl = tok.encode_plain("\n").expect("newline");
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
    /// Decode step times of each engine (plain, adaptive, always, plain again).
    times: [Vec<Duration>; 4],
    /// Output tokens after each request's first.
    tokens: usize,
    /// Proposed, accepted and drafts of the two speculating engines.
    spec: [[u64; 3]; 2],
}

/// The four engines (plain, adaptive, always, plain again, or `-- --only N`'s), made once
/// per workload and kept across its rounds, as a server keeps its engine: what they learn
/// (step costs, acceptance rates) and what they cache (pipelines, bind groups) carries over,
/// and the first round, untimed, is their warm-up.
fn engines(ctx: &Arc<GpuContext>, k: usize) -> Vec<Engine> {
    let spec = |row_cost| EngineConfig {
        speculative: Some(SpeculativeConfig {
            num_tokens: k,
            row_cost,
            ..SpeculativeConfig::default()
        }),
        draft_model: draft_dir(),
        ..EngineConfig::default()
    };
    let configs = [
        EngineConfig::default(),
        spec(None),
        spec(Some(0.0)),
        EngineConfig::default(),
    ];
    let configs: Vec<EngineConfig> = match flag_value("--only") {
        Some(i) => vec![configs[i].clone(); 4],
        None => configs.to_vec(),
    };
    configs
        .into_iter()
        .map(|c| Engine::with_context(ctx.clone(), dir(), c, |_, _| {}).expect("engine"))
        .collect()
}

fn run(engines: &mut [Engine], work: &[(Vec<u32>, SamplingParams)], round: usize) -> Run {
    let counts = |e: &Engine| {
        let s = e.stats().scheduler;
        [s.spec_proposed, s.spec_accepted, s.spec_drafts]
    };
    let before = [counts(&engines[1]), counts(&engines[2])];
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
    let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    common::alternate_steps_shuffled(engines, 1, &mut times, round as u64);
    if std::env::args().any(|a| a == "--focus") {
        for t in &times {
            let mut v = t.clone();
            v.sort();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            eprintln!(
                "steps {} median {:.0} p90 {:.0} max {:.0} sum {:.0}",
                v.len(),
                us(v[v.len() / 2]),
                us(v[v.len() * 9 / 10]),
                us(v[v.len() - 1]),
                us(v.iter().sum())
            );
        }
    }
    let outs: Vec<Vec<Vec<u32>>> = handles
        .iter()
        .map(|hs| {
            hs.iter()
                .map(|h| h.wait().expect("request").outputs[0].token_ids.clone())
                .collect()
        })
        .collect();
    assert_eq!(outs[0], outs[1], "speculation changed an output");
    assert_eq!(outs[0], outs[2], "speculation changed an output");
    assert_eq!(outs[0], outs[3], "plain decoding is not deterministic");
    let tokens = outs[0].iter().map(|o| o.len() - 1).sum();
    let mut spec = [counts(&engines[1]), counts(&engines[2])];
    for (after, before) in spec.iter_mut().zip(before) {
        for (a, b) in after.iter_mut().zip(before) {
            *a -= b;
        }
    }
    Run {
        times,
        tokens,
        spec,
    }
}

/// The draft model given by `--draft DIR`, if any.
fn draft_dir() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--draft")?;
    args.get(i + 1).map(PathBuf::from)
}

/// The number after `flag` on the command line.
fn flag_value(flag: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let k = flag_value("--k").unwrap_or(SpeculativeConfig::default().num_tokens);
    let only1 = args.iter().any(|a| a == "--focus");
    let focus = match args.iter().any(|a| a == "--repetitive") {
        true => "repetitive",
        false => "non-repetitive",
    };
    let rounds = if quick {
        1
    } else if only1 {
        12
    } else {
        4
    };
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    match draft_dir() {
        Some(d) => println!(
            "# Speculative decoding (draft model {}, k = {k})",
            d.display()
        ),
        None => println!("# Speculative decoding (prompt lookup, k = {k})"),
    }
    println!();
    println!("adapter: {}", ctx.describe());
    println!();
    println!(
        "| workload | sequences | plain tokens/s | plain again (noise) | adaptive k: tokens/s | speedup | accepted / proposed | per draft | always k: tokens/s | speedup | accepted / proposed | per draft |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let tok = Tokenizer::from_dir(&dir()).expect("tokenizer");
    for seqs in if only1 { vec![1] } else { vec![1, 16] } {
        let prompts = repetitive_prompts(&ctx, seqs);
        let workloads: [(&str, Work); 2] = [
            (
                "repetitive",
                prompts.into_iter().map(|p| (p, greedy(TOKENS))).collect(),
            ),
            (
                "non-repetitive",
                SEEDS[..seqs]
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (tok.encode(s).expect("encode"), sampled(i as u64)))
                    .collect(),
            ),
        ];
        for (name, work) in workloads.iter().filter(|w| !only1 || w.0 == focus) {
            let mut total = [Duration::ZERO; 4];
            let mut tokens = 0;
            let mut spec = [[0u64; 3]; 2];
            // One round untimed first: pipelines compiled on first use (the first engine to
            // run a row count pays for every engine) are not a cost of any configuration.
            let mut engines = engines(&ctx, k);
            run(&mut engines, work, 0);
            for round in 0..rounds {
                let r = run(&mut engines, work, round);
                for (t, rt) in total.iter_mut().zip(&r.times) {
                    *t += rt.iter().sum::<Duration>();
                }
                tokens += r.tokens;
                for (a, b) in spec.iter_mut().zip(r.spec) {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x += y;
                    }
                }
            }
            let tps = |i: usize| tokens as f64 / total[i].as_secs_f64();
            let cols = |i: usize| {
                let [p, a, d] = spec[i - 1];
                format!(
                    "{:.1} | {:.2}x | {:.1}% of {p} | {:.2}",
                    tps(i),
                    tps(i) / tps(0),
                    100.0 * a as f64 / p.max(1) as f64,
                    a as f64 / d.max(1) as f64
                )
            };
            println!(
                "| {name} | {seqs} | {:.1} | {:.2}x | {} | {} |",
                tps(0),
                tps(3) / tps(0),
                cols(1),
                cols(2)
            );
        }
    }
}
