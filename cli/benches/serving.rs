//! Serving benchmark: `pagellm serve` on the shipped model, driven over HTTP by a small
//! OpenAI-protocol load generator at concurrency 1, 8 and 32, against the same prompts
//! through `pagellm generate --prompts-file` (offline) in the same run.
//!
//! Workload: 32 requests, prompts made of fortune-like words (10-40 tokens), greedy, 32 new
//! tokens each (`ignore_eos`, so every run generates exactly the same 1,024 tokens).
//! Client side, per request: time to first token (request sent to first streamed token)
//! and inter-token latency (gaps between streamed tokens); per run: requests/s and output
//! tokens/s over the wall time of the whole run. Offline, two ways: the wall time of
//! `pagellm generate --prompts-file` less that of the same command with one 1-token request
//! (model loading and process start; the full run still compiles the pipelines of its
//! larger batches, which the warmed-up server does not), and the same 32 requests through
//! the engine API in this process after one untimed warm-up pass (what `generate` runs,
//! without process start or compilation). The ratio is taken against the faster.
//!
//! Run: `cargo bench --bench serving` (adapter chosen as usual). Prints a Markdown report.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REQUESTS: usize = 32;
const TOKENS: usize = 32;
const WORDS: [&str; 24] = [
    "the", "wise", "man", "said", "never", "trust", "a", "computer", "you", "cannot", "throw",
    "out", "of", "window", "life", "is", "what", "happens", "when", "busy", "making", "other",
    "plans", "today",
];

fn prompts() -> Vec<String> {
    (0..REQUESTS)
        .map(|i| {
            let len = 8 + (i * 7) % 25;
            (0..len)
                .map(|j| WORDS[(i * 13 + j * 5) % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, serve};

/// One streamed request: time to first token, the gaps after it, and the text.
fn one(url: &str, prompt: &str) -> (Duration, Vec<Duration>, String) {
    let body = json!({
        "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": true,
        "stream": true,
    });
    let start = Instant::now();
    let r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .expect("request");
    let mut last: Option<Instant> = None;
    let (mut ttft, mut gaps, mut text) = (Duration::ZERO, Vec::new(), String::new());
    for line in BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.expect("stream");
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).expect("chunk");
        if !v["choices"][0]["finish_reason"].is_null() {
            continue;
        }
        let now = Instant::now();
        match last {
            None => ttft = now - start,
            Some(t) => gaps.push(now - t),
        }
        last = Some(now);
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
    }
    (ttft, gaps, text)
}

struct Run {
    wall: Duration,
    ttft: Vec<Duration>,
    itl: Vec<Duration>,
    texts: Vec<String>,
}

fn run(url: &str, prompts: &[String], concurrency: usize) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(vec![None; prompts.len()]));
    let prompts = Arc::new(prompts.to_vec());
    let start = Instant::now();
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, results, prompts, url) = (
                next.clone(),
                results.clone(),
                prompts.clone(),
                url.to_string(),
            );
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= prompts.len() {
                    return;
                }
                let r = one(&url, &prompts[i]);
                results.lock().unwrap()[i] = Some(r);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let wall = start.elapsed();
    let mut out = Run {
        wall,
        ttft: Vec::new(),
        itl: Vec::new(),
        texts: Vec::new(),
    };
    for r in results.lock().unwrap().drain(..) {
        let (ttft, gaps, text) = r.expect("every request answered");
        out.ttft.push(ttft);
        out.itl.extend(gaps);
        out.texts.push(text);
    }
    out
}

fn pct(mut v: Vec<Duration>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

/// Wall time of `pagellm generate --prompts-file` over `lines`, and its JSON outputs.
fn generate(lines: &[Value]) -> (Duration, Vec<Value>) {
    let path = std::env::temp_dir().join(format!("pagellm-serving-{}.jsonl", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    drop(f);
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["generate", "--prompts-file"])
        .arg(&path)
        .args(["--temperature", "0", "--ignore-eos", "--json"])
        .output()
        .expect("pagellm generate");
    let wall = start.elapsed();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outputs = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (wall, outputs)
}

fn main() {
    let prompts = prompts();
    let total_tokens = REQUESTS * TOKENS;
    println!("# pagellm serving benchmark");
    println!();
    println!("command: cargo bench --bench serving");
    println!(
        "workload: {REQUESTS} requests, prompts of 10-40 tokens, greedy, {TOKENS} new tokens each \
         (ignore_eos), streamed; shipped model (models/fortunes-llama)"
    );
    let server = serve(env!("CARGO_BIN_EXE_pagellm"), &[]);
    let url = format!("{}/v1/completions", server.base);
    // Warm-up: compile the pipelines.
    one(&url, "warm up");
    println!();
    println!("| concurrency | wall (s) | requests/s | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | ITL p99 (ms) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut served = Vec::new();
    for c in [1, 8, 32] {
        let r = run(&url, &prompts, c);
        let secs = r.wall.as_secs_f64();
        println!(
            "| {c} | {secs:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            REQUESTS as f64 / secs,
            total_tokens as f64 / secs,
            pct(r.ttft.clone(), 0.5),
            pct(r.ttft.clone(), 0.99),
            pct(r.itl.clone(), 0.5),
            pct(r.itl.clone(), 0.99),
        );
        served.push(r);
    }
    drop(server);
    let lines: Vec<Value> = prompts
        .iter()
        .map(|p| json!({"prompt": p, "max_tokens": TOKENS}))
        .collect();
    let (offline_wall, outputs) = generate(&lines);
    let (load_wall, _) = generate(&[json!({"prompt": "x", "max_tokens": 1})]);
    let offline = offline_wall.saturating_sub(load_wall).as_secs_f64();
    println!();
    println!(
        "offline: `pagellm generate --prompts-file` (all {REQUESTS} at once) {:.2} s, less {:.2} s \
         for loading and process start (the same command with one 1-token request) = {offline:.2} s: \
         {:.1} output tokens/s",
        offline_wall.as_secs_f64(),
        load_wall.as_secs_f64(),
        total_tokens as f64 / offline
    );
    // The same work through the engine API in this process, warmed up.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/fortunes-llama");
    let mut engine = pagellm::internals::engine::Engine::new(
        &dir,
        pagellm::internals::engine::EngineConfig::default(),
    )
    .expect("engine");
    let params = pagellm::internals::sampling::SamplingParams {
        max_tokens: TOKENS,
        ignore_eos: true,
        ..pagellm::internals::sampling::SamplingParams::greedy()
    };
    let mut warm = Duration::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                engine
                    .add_request(
                        pagellm::internals::engine::Prompt::Text(p.clone()),
                        params.clone(),
                    )
                    .expect("add")
            })
            .collect();
        engine.run_to_completion().expect("run");
        warm = t.elapsed();
        drop(hs);
    }
    let warm = warm.as_secs_f64();
    println!(
        "offline in process (engine API, after a warm-up pass): {warm:.2} s: {:.1} output tokens/s",
        total_tokens as f64 / warm
    );
    let offline = offline.min(warm);
    let same = served.iter().all(|r| {
        r.texts
            .iter()
            .zip(&outputs)
            .all(|(t, o)| o["outputs"][0]["text"].as_str() == Some(t.as_str()))
    });
    println!(
        "outputs of every served run equal the offline run's: {}",
        if same { "yes" } else { "NO" }
    );
    let ratio =
        (total_tokens as f64 / served[2].wall.as_secs_f64()) / (total_tokens as f64 / offline);
    println!();
    println!("**server at concurrency 32 / offline throughput: {ratio:.2}** (target: >= 0.90)");
}
