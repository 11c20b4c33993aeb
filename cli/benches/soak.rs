//! Soak benchmark: `pagellm serve` on the shipped model under a mix of well-behaved and
//! badly-behaved clients for minutes, recording the server's resident memory over time and
//! the latencies clients see. Not a test: its numbers go to docs/BENCHMARKS.md.
//!
//! Each of the clients loops over: a streamed request read to its end (half the time), a
//! streamed request dropped after three tokens (a client that goes away), a non-streamed
//! request, and a malformed request (a tenth each of the rest). Prompts vary in length and
//! sampling is seeded, so the mix reaches prefix caching, sampling and aborts alike.
//!
//! Run: `cargo bench --bench soak -- [--secs 120] [--clients 32]`. Prints a Markdown report:
//! requests by kind, TTFT and end-to-end percentiles, RSS at the start, its peak and at the
//! end (after the first tenth of the run, once pipelines are compiled and pools allocated,
//! memory should stay flat), and KV usage once the run is over (must be 0).

use serde_json::json;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, serve};

const WORDS: [&str; 16] = [
    "the", "wise", "man", "said", "never", "trust", "a", "computer", "you", "cannot", "throw",
    "out", "of", "window", "life", "is",
];

#[derive(Default)]
struct Tally {
    full: usize,
    dropped: usize,
    whole: usize,
    bad: usize,
    ttft: Vec<Duration>,
    e2e: Vec<Duration>,
    errors: Vec<String>,
}

fn prompt(i: u64) -> String {
    let len = 4 + (i * 7 % 40) as usize;
    (0..len)
        .map(|j| WORDS[(i as usize * 5 + j * 3) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A streamed request; reads `keep` tokens (all of them with `None`), then drops the
/// connection. Time to the first token.
fn streamed(url: &str, i: u64, keep: Option<usize>) -> Result<Duration, String> {
    let body = json!({
        "prompt": prompt(i), "max_tokens": 24, "temperature": 0.8, "seed": i, "stream": true,
    });
    let start = Instant::now();
    let r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .map_err(|e| e.to_string())?;
    if r.status() != 200 {
        return Err(format!("stream answered {}", r.status()));
    }
    let (mut ttft, mut tokens) = (None, 0);
    for line in BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        if line == "data: [DONE]" {
            break;
        }
        if line.starts_with("data: ") {
            ttft.get_or_insert_with(|| start.elapsed());
            tokens += 1;
            if keep.is_some_and(|k| tokens >= k) {
                break;
            }
        }
    }
    ttft.ok_or_else(|| "a stream without tokens".into())
}

fn whole(url: &str, i: u64) -> Result<Duration, String> {
    let body = json!({"prompt": prompt(i), "max_tokens": 24, "temperature": 0, "n": 1 + i % 3});
    let start = Instant::now();
    let mut r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .map_err(|e| e.to_string())?;
    let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    match r.status().as_u16() {
        200 => Ok(start.elapsed()),
        s => Err(format!("{s}: {text}")),
    }
}

fn bad(url: &str, i: u64) -> Result<(), String> {
    let bodies = [
        r#"{"prompt": "x", "max_tokens": -1}"#,
        r#"{"prompt": [999999]}"#,
        r#"{"prompt": "x", "temperature": "hot"}"#,
        r#"{"prompt": "#,
    ];
    let mut r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(bodies[i as usize % bodies.len()])
        .map_err(|e| e.to_string())?;
    let _ = r.body_mut().read_to_string();
    match r.status().as_u16() {
        400 => Ok(()),
        s => Err(format!("a malformed request answered {s}")),
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn client(url: String, c: u64, stop: Arc<AtomicBool>, tally: Arc<Mutex<Tally>>) {
    let mut i = c * 1_000_000;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let kind = i % 10;
        let r = match kind {
            0..=4 => streamed(&url, i, None).map(Some),
            5 | 6 => streamed(&url, i, Some(3)).map(Some),
            7 | 8 => whole(&url, i).map(Some),
            _ => bad(&url, i).map(|_| None),
        };
        let mut t = tally.lock().unwrap();
        match (kind, r) {
            (_, Err(e)) => t.errors.push(e),
            (0..=4, Ok(d)) => {
                t.full += 1;
                t.ttft.extend(d);
            }
            (5 | 6, Ok(_)) => t.dropped += 1,
            (7 | 8, Ok(d)) => {
                t.whole += 1;
                t.e2e.extend(d);
            }
            _ => t.bad += 1,
        }
    }
}

fn main() {
    let secs = arg("--secs", 120);
    let clients = arg("--clients", 32);
    let server = serve(env!("CARGO_BIN_EXE_pagellm"), &[]);
    let pid = server.child.id();
    let url = format!("{}/v1/completions", server.base);
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let rss_start = rss_kib(pid);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, stop, tally) = (url.clone(), stop.clone(), tally.clone());
            std::thread::spawn(move || client(url, c, stop, tally))
        })
        .collect();
    let mut samples = Vec::new();
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        samples.push((start.elapsed().as_secs_f64(), rss_kib(pid)));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    // Dropped streams are aborted at the engine's next step; give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let mut r = agent()
        .get(&format!("{}/metrics", server.base))
        .call()
        .unwrap();
    let metrics = r.body_mut().read_to_string().unwrap();
    let kv = metrics
        .lines()
        .find(|l| l.starts_with("pagellm_kv_cache_usage_ratio{pool=\"device\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    let settled = samples
        .iter()
        .find(|(t, _)| *t >= secs as f64 / 10.0)
        .map_or(rss_start, |s| s.1);
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let end = samples.last().map_or(0, |s| s.1);
    let mut t = tally.lock().unwrap();
    let total = t.full + t.dropped + t.whole + t.bad;
    println!("# pagellm soak benchmark");
    println!();
    println!("command: cargo bench --bench soak -- --secs {secs} --clients {clients}");
    println!(
        "{total} requests in {secs} s ({:.1}/s): {} streams read to the end, {} dropped after \
         3 tokens, {} non-streamed (n 1-3), {} malformed; {} unexpected answers",
        total as f64 / secs as f64,
        t.full,
        t.dropped,
        t.whole,
        t.bad,
        t.errors.len()
    );
    for e in t.errors.iter().take(5) {
        println!("  unexpected: {e}");
    }
    println!();
    println!("| | p50 (ms) | p90 (ms) | p99 (ms) |");
    println!("|---|---:|---:|---:|");
    let (p50, p90, p99) = (
        pct(&mut t.ttft, 0.5),
        pct(&mut t.ttft, 0.9),
        pct(&mut t.ttft, 0.99),
    );
    println!("| time to first token (streams) | {p50:.1} | {p90:.1} | {p99:.1} |");
    let (p50, p90, p99) = (
        pct(&mut t.e2e, 0.5),
        pct(&mut t.e2e, 0.9),
        pct(&mut t.e2e, 0.99),
    );
    println!("| end to end (non-streamed) | {p50:.1} | {p90:.1} | {p99:.1} |");
    println!();
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "server RSS: {:.1} MiB at the start, {:.1} MiB after the first tenth, peak {:.1} MiB, \
         {:.1} MiB at the end (end / after the first tenth: {:.3})",
        mib(rss_start),
        mib(settled),
        mib(peak),
        mib(end),
        end as f64 / settled.max(1) as f64
    );
    let at = |f: f64| {
        samples
            .iter()
            .find(|(t, _)| *t >= secs as f64 * f)
            .map_or(end, |s| s.1)
    };
    println!(
        "RSS at a quarter, half and three quarters of the run: {:.1}, {:.1}, {:.1} MiB",
        mib(at(0.25)),
        mib(at(0.5)),
        mib(at(0.75))
    );
    println!(
        "device KV usage after the run: {}",
        kv.map_or("not reported".into(), |k| k.to_string())
    );
}
