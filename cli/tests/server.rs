//! `pagellm serve` over real HTTP on loopback: the binary is started on a free port and
//! driven with an HTTP client. Greedy completions (whole and streamed) equal `pagellm
//! generate --json` token for token with logprobs; 32 concurrent streams through a pool
//! small enough to preempt all complete with their solo outputs; a client that disconnects
//! mid-stream frees its blocks; bad requests get the right status and error type; the
//! queue limit answers 503 with Retry-After; SIGTERM with requests in flight exits cleanly;
//! a speculating server streams what `generate` writes and exports its proposal counts.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::golden;
use serde_json::{json, Value};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, listening, serve, Served};

struct Server(Served);

impl std::ops::Deref for Server {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Served {
        &mut self.0
    }
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server(serve(env!("CARGO_BIN_EXE_pagellm"), args))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = get(&self.url("/metrics"));
        text.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }
}

fn get(url: &str) -> (u16, String) {
    match agent().get(url).call() {
        Ok(mut r) => (
            r.status().as_u16(),
            r.body_mut().read_to_string().unwrap_or_default(),
        ),
        Err(_) => (0, String::new()),
    }
}

fn post(url: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Value, Option<String>) {
    let mut req = agent().post(url).header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send(body).expect("request");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
        retry,
    )
}

/// Every `data:` payload of a streamed completion, until `[DONE]`.
fn stream(url: &str, body: &Value) -> Vec<Value> {
    http::post_stream(url, &body.to_string(), &[])
}

/// Per choice index: concatenated text, token logprobs, finish reason.
type Choices = Vec<(String, Vec<f64>, String)>;

/// The [`Choices`] of a streamed completion's chunks.
fn collect(chunks: &[Value]) -> Choices {
    let mut v: Vec<(String, Vec<f64>, String)> = Vec::new();
    for c in chunks {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            if v.len() <= i {
                v.resize(i + 1, Default::default());
            }
            v[i].0.push_str(ch["text"].as_str().unwrap());
            if let Some(lps) = ch["logprobs"]["token_logprobs"].as_array() {
                v[i].1.extend(lps.iter().map(|x| x.as_f64().unwrap()));
            }
            if let Some(r) = ch["finish_reason"].as_str() {
                v[i].2 = r.to_string();
            }
        }
    }
    v
}

fn skip() -> bool {
    common::contexts().is_empty()
}

/// `pagellm generate --json` of a greedy request (`ignore_eos`): its first output and that
/// output's token logprobs.
fn greedy_generate(dir: &str, prompt: &str, max_tokens: u32, logprobs: u32) -> (Value, Vec<f64>) {
    let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["generate", "--model", dir, "--prompt", prompt])
        .args(["--temperature", "0", "--ignore-eos", "--json"])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args(["--logprobs", &logprobs.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = json["outputs"][0].clone();
    let lps = want["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["logprob"].as_f64().unwrap())
        .collect();
    (want, lps)
}

fn fixture() -> String {
    golden::fixture_arg("llama-gqa")
}

#[test]
fn greedy_completions_equal_generate_json_whole_and_streamed() {
    if skip() {
        return;
    }
    let f = golden::load("llama-gqa");
    let dir = fixture();
    let server = Server::start(&["--model", &dir]);
    for case in &f.cases {
        let (want, want_lps) = greedy_generate(&dir, &case.prompt, 16, 2);
        let want = &want;
        let body = json!({
            "model": "llama-gqa", "prompt": case.prompt, "max_tokens": 16,
            "temperature": 0, "ignore_eos": true, "logprobs": 2,
        });
        let (status, whole, _) = post(&server.url("/v1/completions"), &body.to_string(), &[]);
        assert_eq!(status, 200, "{whole}");
        let choice = &whole["choices"][0];
        assert_eq!(choice["text"], want["text"], "{:?}", case.prompt);
        let lps: Vec<f64> = choice["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(lps, want_lps, "{:?}", case.prompt);
        assert_eq!(whole["usage"]["completion_tokens"], 16);
        assert_eq!(
            whole["usage"]["prompt_tokens"],
            json!(case.prompt_ids.len())
        );
        // The same request streamed: the pieces add up to the same text and logprobs.
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["stream_options"] = json!({"include_usage": true});
        let chunks = stream(&server.url("/v1/completions"), &sbody);
        let got = collect(&chunks);
        assert_eq!(got[0].0, want["text"].as_str().unwrap());
        assert_eq!(got[0].1, want_lps);
        assert_eq!(got[0].2, "length");
        assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);
    }
}

#[test]
fn every_sampling_field_reaches_the_engine_as_generate_passes_it() {
    if skip() {
        return;
    }
    let dir = fixture();
    let server = Server::start(&["--model", &dir]);
    // Seeded sampling with every filter and penalty: the server must pass each field on
    // exactly as the same generate flags do, or the sampled text differs.
    let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["generate", "--model", &dir, "--prompt", "the cat sat"])
        .args([
            "--max-tokens",
            "12",
            "--temperature",
            "0.9",
            "--top-p",
            "0.9",
        ])
        .args([
            "--top-k", "40", "--min-p", "0.02", "--seed", "5", "--n", "2",
        ])
        .args(["--presence-penalty", "0.4", "--frequency-penalty", "0.3"])
        .args(["--repetition-penalty", "1.2", "--ignore-eos", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Value = serde_json::from_slice(&out.stdout).unwrap();
    let body = json!({
        "prompt": "the cat sat", "max_tokens": 12, "temperature": 0.9, "top_p": 0.9,
        "top_k": 40, "min_p": 0.02, "seed": 5, "n": 2, "presence_penalty": 0.4,
        "frequency_penalty": 0.3, "repetition_penalty": 1.2, "ignore_eos": true,
    });
    let (status, got, _) = post(&server.url("/v1/completions"), &body.to_string(), &[]);
    assert_eq!(status, 200, "{got}");
    for i in 0..2 {
        assert_eq!(
            got["choices"][i]["text"], want["outputs"][i]["text"],
            "sample {i}"
        );
    }
    // And the penalties matter: without them the text changes.
    let mut plain = body.clone();
    for k in [
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    ] {
        plain.as_object_mut().unwrap().remove(k);
    }
    let (_, other, _) = post(&server.url("/v1/completions"), &plain.to_string(), &[]);
    assert_ne!(other["choices"], got["choices"]);
}

#[test]
fn many_prompts_samples_stops_and_echo() {
    if skip() {
        return;
    }
    let server = Server::start(&["--model", &fixture()]);
    let url = server.url("/v1/completions");
    // Two prompts, two seeded samples each: choices 0-3, whole and streamed alike.
    let body = json!({
        "prompt": ["the cat", "a dog"], "n": 2, "max_tokens": 8, "seed": 3,
        "temperature": 0.8, "ignore_eos": true,
    });
    let (status, whole, _) = post(&url, &body.to_string(), &[]);
    assert_eq!(status, 200, "{whole}");
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let streamed = collect(&stream(&url, &sbody));
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], json!(i));
        assert_eq!(streamed[i].0, c["text"].as_str().unwrap(), "choice {i}");
    }
    // A stop string ends the text before it, in both forms: the first non-blank piece of
    // text after its third character.
    let text = choices[0]["text"].as_str().unwrap().to_string();
    let stop: String = text
        .char_indices()
        .skip(3)
        .find(|(_, c)| !c.is_whitespace())
        .map(|(i, _)| text[i..].chars().take(2).collect())
        .unwrap_or_default();
    assert!(!stop.trim().is_empty(), "no usable stop string in {text:?}");
    {
        let b = json!({
            "prompt": "the cat", "n": 2, "max_tokens": 8, "seed": 3, "temperature": 0.8,
            "ignore_eos": true, "stop": stop,
        });
        let (_, w, _) = post(&url, &b.to_string(), &[]);
        let cut = w["choices"][0]["text"].as_str().unwrap();
        assert!(
            text.starts_with(cut) && !cut.contains(&stop),
            "{cut:?} / {stop:?}"
        );
        assert_eq!(w["choices"][0]["finish_reason"], "stop");
        let mut sb = b.clone();
        sb["stream"] = json!(true);
        assert_eq!(collect(&stream(&url, &sb))[0].0, cut);
    }
    // Echo puts the prompt first.
    let b = json!({"prompt": "the cat", "max_tokens": 4, "temperature": 0, "echo": true});
    let (_, w, _) = post(&url, &b.to_string(), &[]);
    assert!(w["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("the cat"));
    // Beam search (vLLM's use_beam_search with best_of), whole and streamed.
    let b = json!({
        "prompt": "the cat", "max_tokens": 6, "n": 2, "best_of": 3, "use_beam_search": true,
        "ignore_eos": true,
    });
    let (status, w, _) = post(&url, &b.to_string(), &[]);
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["choices"].as_array().unwrap().len(), 2);
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let streamed = collect(&stream(&url, &sb));
    for i in 0..2 {
        assert_eq!(streamed[i].0, w["choices"][i]["text"].as_str().unwrap());
    }
    // Token-id prompts work too.
    let b = json!({"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3, "temperature": 0});
    let (status, w, _) = post(&url, &b.to_string(), &[]);
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["usage"]["prompt_tokens"], 5);
}

#[test]
fn concurrent_streams_through_a_small_pool_equal_their_solo_runs() {
    if skip() {
        return;
    }
    let dir = fixture();
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("request {i} is about {} things", i * 7 % 13))
        .collect();
    let body = |p: &str, stream: bool| {
        json!({
            "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
            "logprobs": 1, "stream": stream,
        })
    };
    let solo: Vec<(String, Vec<f64>)> = {
        let s = Server::start(&["--model", &dir]);
        prompts
            .iter()
            .map(|p| {
                let (_, w, _) = post(&s.url("/v1/completions"), &body(p, false).to_string(), &[]);
                let c = collect(std::slice::from_ref(&w));
                (c[0].0.clone(), c[0].1.clone())
            })
            .collect()
    };
    // 12 blocks of 16 tokens for 32 sequences of ~34 tokens: constant preemption.
    let s = Server::start(&[
        "--model",
        &dir,
        "--num-gpu-blocks",
        "12",
        "--max-model-len",
        "64",
        "--num-cpu-blocks",
        "64",
        "--max-batched-tokens",
        "64",
    ]);
    let url = s.url("/v1/completions");
    let threads: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (url, b) = (url.clone(), body(p, true));
            std::thread::spawn(move || collect(&stream(&url, &b)).remove(0))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let (text, lps, finish) = t.join().unwrap();
        assert_eq!((text, lps), solo[i].clone(), "request {i}");
        assert_eq!(finish, "length");
    }
    let swaps = s.metric("pagellm_preemptions_total{mode=\"swap\"}");
    let recomputes = s.metric("pagellm_preemptions_total{mode=\"recompute\"}");
    assert!(swaps + recomputes > 0.0, "no preemption was counted");
    assert_eq!(s.metric("pagellm_generation_tokens_total"), 32.0 * 24.0);
    // The pool: 12 blocks of 16 tokens; an f16 token of this fixture is 2 layers x K and V
    // x 2 KV heads x 16 values x 2 bytes.
    assert_eq!(s.metric("pagellm_kv_cache_capacity_tokens"), 12.0 * 16.0);
    assert_eq!(s.metric("pagellm_kv_cache_bytes_per_token"), 256.0);
    // A dense model: no experts, and a token reads every weight.
    let total = s.metric("pagellm_model_weight_bytes{part=\"total\"}");
    assert!(total > 0.0);
    assert_eq!(
        s.metric("pagellm_model_weight_bytes{part=\"experts\"}"),
        0.0
    );
    assert_eq!(
        s.metric("pagellm_model_weight_bytes{part=\"active\"}"),
        total
    );
}

/// Eight streamed completions: greedy ones, and seeded n = 2 samples.
fn story_bodies() -> Vec<Value> {
    (0..8)
        .map(|i| {
            let prompt = format!("story {i} begins with {} birds", i * 5 % 7);
            match i % 2 {
                0 => json!({"prompt": prompt, "max_tokens": 20, "temperature": 0,
                            "ignore_eos": true, "logprobs": 1, "stream": true}),
                _ => json!({"prompt": prompt, "max_tokens": 20, "temperature": 0.9,
                            "seed": i, "n": 2, "ignore_eos": true, "logprobs": 1,
                            "stream": true}),
            }
        })
        .collect()
}

/// Streams every body at once (with `headers`), checks that no stream carried an error,
/// and returns what each produced.
fn stream_all(
    s: &Server,
    bodies: &[Value],
    headers: &'static [(&'static str, &'static str)],
) -> Vec<std::thread::JoinHandle<Choices>> {
    let url = s.url("/v1/completions");
    bodies
        .iter()
        .map(|b| {
            let (url, b) = (url.clone(), b.to_string());
            std::thread::spawn(move || {
                let chunks = http::post_stream(&url, &b, headers);
                assert!(
                    chunks.iter().all(|c| c.get("error").is_none()),
                    "{chunks:?}"
                );
                collect(&chunks)
            })
        })
        .collect()
}

fn joined<T>(threads: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// A small pool (12 blocks of 16 tokens, 64-token context): requests preempt each other.
const SMALL_POOL: [&str; 6] = [
    "--num-gpu-blocks",
    "12",
    "--max-model-len",
    "64",
    "--num-cpu-blocks",
    "64",
];

#[test]
fn streams_go_on_across_device_losses_with_unchanged_tokens() {
    if skip() {
        return;
    }
    let dir = fixture();
    let args: Vec<&str> = ["--model", dir.as_str()]
        .into_iter()
        .chain(SMALL_POOL)
        .collect();
    let calm = joined(stream_all(&Server::start(&args), &story_bodies(), &[]));
    let lossy = Server(http::serve_with_env(
        env!("CARGO_BIN_EXE_pagellm"),
        &args,
        &[("PAGELLM_INJECT_DEVICE_LOSS", "3,8,14")],
    ));
    assert_eq!(joined(stream_all(&lossy, &story_bodies(), &[])), calm);
    assert_eq!(lossy.metric("pagellm_device_losses_total"), 3.0);
    assert_eq!(lossy.metric("pagellm_device_recoveries_total"), 3.0);
    let (status, _) = get(&lossy.url("/health"));
    assert_eq!(status, 200);
}

#[test]
fn the_kv_budget_shrinks_and_grows_under_streams_with_the_api_key() {
    if skip() {
        return;
    }
    let dir = fixture();
    let args = [
        "--model",
        dir.as_str(),
        "--num-gpu-blocks",
        "48",
        "--max-model-len",
        "64",
    ];
    let calm = joined(stream_all(&Server::start(&args), &story_bodies(), &[]));
    let keyed: Vec<&str> = args.into_iter().chain(["--api-key", "k"]).collect();
    let s = Server::start(&keyed);
    let auth: &'static [(&str, &str)] = &[("Authorization", "Bearer k")];
    let budget = |body: &str| post(&s.url("/admin/kv_budget"), body, auth);
    let streams = stream_all(&s, &story_bodies(), auth);
    let (status, shrunk, _) = budget(r#"{"blocks": 12}"#);
    assert_eq!(status, 200, "{shrunk}");
    assert_eq!(
        (
            shrunk["blocks_before"].as_u64(),
            shrunk["blocks_after"].as_u64()
        ),
        (Some(48), Some(12))
    );
    assert_eq!(s.metric("pagellm_kv_cache_capacity_tokens"), 12.0 * 16.0);
    std::thread::sleep(Duration::from_millis(200));
    let bytes = shrunk["bytes_before"].as_u64().unwrap();
    let (status, grown, _) = budget(&format!(r#"{{"bytes": {bytes}}}"#));
    assert_eq!(status, 200, "{grown}");
    assert_eq!(grown["blocks_after"].as_u64(), Some(48));
    assert_eq!(joined(streams), calm);
    // Refusals: no key, a budget below one full-context sequence, a malformed body.
    let (status, _, _) = post(&s.url("/admin/kv_budget"), r#"{"blocks": 12}"#, &[]);
    assert_eq!(status, 401);
    let (status, e, _) = budget(r#"{"blocks": 2}"#);
    assert!(
        status == 400
            && e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("needs 4 blocks"),
        "{e}"
    );
    for bad in [
        r#"{"bytes": -1}"#,
        r#"{"blocks": 4, "bytes": 9}"#,
        r#"{}"#,
        "[1]",
    ] {
        let (status, e, _) = budget(bad);
        assert_eq!(status, 400, "{bad}: {e}");
    }
    // A server without an API key has no admin endpoints.
    let open = Server::start(&args);
    let (status, e, _) = post(&open.url("/admin/kv_budget"), r#"{"blocks": 12}"#, &[]);
    assert!(
        status == 403
            && e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--api-key"),
        "{e}"
    );
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    if skip() {
        return;
    }
    let s = Server::start(&["--model", &fixture(), "--max-model-len", "256"]);
    let body = json!({
        "prompt": "a long story", "max_tokens": 240, "temperature": 0,
        "ignore_eos": true, "stream": true, "n": 3,
    });
    {
        let r = agent()
            .post(&s.url("/v1/completions"))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap();
        let mut reader = r.into_body().into_reader();
        let mut buf = [0u8; 256];
        reader.read_exact(&mut buf).unwrap();
        // The engine thread publishes statistics at most every 50 ms while busy, so the
        // first tokens can arrive before the first figures do.
        let start = Instant::now();
        while s.metric("pagellm_kv_cache_usage_ratio{pool=\"device\"}") == 0.0 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the request never showed in the metrics"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The connection closes here, long before 240 tokens.
    }
    let start = Instant::now();
    loop {
        let used = s.metric("pagellm_kv_cache_usage_ratio{pool=\"device\"}");
        let running = s.metric("pagellm_num_requests_running");
        if used == 0.0 && running == 0.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "blocks still used ({used}) or requests running ({running}) after the disconnect"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The engine aborted it for the lost client (a finished request would not count).
    assert_eq!(s.metric("pagellm_requests_abandoned_total"), 1.0);
}

#[test]
fn a_non_streaming_client_that_gives_up_frees_its_blocks() {
    if skip() {
        return;
    }
    let s = Server::start(&["--model", &fixture(), "--max-model-len", "256"]);
    let impatient: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_millis(300)))
        .build()
        .into();
    let body =
        json!({"prompt": "x", "max_tokens": 240, "temperature": 0, "ignore_eos": true, "n": 4});
    let r = impatient
        .post(&s.url("/v1/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string());
    if r.is_ok() {
        // A real GPU may finish 960 tokens of this tiny model within 300 ms; then there is
        // nothing to abandon (on the CI's software adapters it takes seconds).
        eprintln!("note: the request finished before the client gave up; nothing to check");
        return;
    }
    // The engine aborts it for the lost client (a finished request would not count), then
    // its blocks are free. Figures are published at most every 50 ms, and on a loaded
    // machine the request may not even have started when the client gave up, so wait for
    // the abort first.
    let start = Instant::now();
    while s.metric("pagellm_requests_abandoned_total") < 1.0
        || s.metric("pagellm_kv_cache_usage_ratio{pool=\"device\"}") > 0.0
        || s.metric("pagellm_num_requests_running") > 0.0
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the abandoned request was not aborted and freed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.metric("pagellm_requests_abandoned_total"), 1.0);
}

#[test]
fn bad_requests_get_the_right_status_and_error() {
    if skip() {
        return;
    }
    let s = Server::start(&[
        "--model",
        &fixture(),
        "--api-key",
        "sekrit",
        "--max-body-bytes",
        "4096",
        "--served-model-name",
        "tiny",
    ]);
    let url = s.url("/v1/completions");
    let auth = [("Authorization", "Bearer sekrit")];
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5000));
    let cases: Vec<(&str, String, u16, &str, Option<&str>)> = vec![
        (
            "malformed JSON",
            "{not json".into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "wrong type",
            r#"{"prompt": "x", "max_tokens": "ten"}"#.into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "no prompt",
            r#"{"max_tokens": 3}"#.into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "empty prompt list",
            r#"{"prompt": []}"#.into(),
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            "zero max_tokens",
            r#"{"prompt": "x", "max_tokens": 0}"#.into(),
            400,
            "invalid_request_error",
            Some("max_tokens"),
        ),
        (
            "negative temperature",
            r#"{"prompt": "x", "temperature": -1}"#.into(),
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            "top_p of 0",
            r#"{"prompt": "x", "top_p": 0}"#.into(),
            400,
            "invalid_request_error",
            Some("top_p"),
        ),
        (
            "presence penalty 3",
            r#"{"prompt": "x", "presence_penalty": 3}"#.into(),
            400,
            "invalid_request_error",
            Some("presence_penalty"),
        ),
        (
            "n of 0",
            r#"{"prompt": "x", "n": 0}"#.into(),
            400,
            "invalid_request_error",
            Some("n"),
        ),
        (
            "best_of below n",
            r#"{"prompt": "x", "n": 3, "best_of": 2}"#.into(),
            400,
            "invalid_request_error",
            Some("best_of"),
        ),
        (
            "too long for the context",
            r#"{"prompt": "x", "max_tokens": 100000}"#.into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "token id outside the vocabulary",
            r#"{"prompt": [100000]}"#.into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "unknown model",
            r#"{"prompt": "x", "model": "gpt-4"}"#.into(),
            404,
            "invalid_request_error",
            Some("model"),
        ),
        (
            "body over the limit",
            big,
            413,
            "invalid_request_error",
            None,
        ),
    ];
    for (what, body, status, kind, param) in cases {
        let (got, v, _) = post(&url, &body, &auth);
        assert_eq!(got, status, "{what}: {v}");
        assert_eq!(v["error"]["type"], kind, "{what}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}"
        );
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{what}: {v}");
        }
    }
    // The scheme is case-insensitive.
    let (got, v, _) = post(
        &url,
        r#"{"prompt": "x", "max_tokens": 1}"#,
        &[("Authorization", "bearer sekrit")],
    );
    assert_eq!(got, 200, "{v}");
    for headers in [&[][..], &[("Authorization", "Bearer wrong")][..]] {
        let (got, v, _) = post(&url, r#"{"prompt": "x"}"#, headers);
        assert_eq!(got, 401, "{v}");
        assert_eq!(v["error"]["type"], "authentication_error");
    }
    // The server is unharmed, and health and metrics need no key.
    let (got, v, _) = post(
        &url,
        r#"{"prompt": "x", "max_tokens": 2, "model": "tiny"}"#,
        &auth,
    );
    assert_eq!(got, 200, "{v}");
    assert_eq!(get(&s.url("/health")).0, 200);
    let (_, models) = get(&s.url("/v1/models"));
    assert!(models.contains("authentication_error"), "{models}");
    let (got, _) = get(&s.url("/nope"));
    assert_eq!(got, 404);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    if skip() {
        return;
    }
    let s = Server::start(&["--model", &fixture(), "--max-queued-requests", "1"]);
    let url = s.url("/v1/completions");
    let long = json!({
        "prompt": "x", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true,
    });
    let r = agent()
        .post(&url)
        .header("Content-Type", "application/json")
        .send(long.to_string())
        .unwrap();
    let mut reader = r.into_body().into_reader();
    let mut buf = [0u8; 64];
    reader.read_exact(&mut buf).unwrap();
    let (status, v, retry) = post(&url, r#"{"prompt": "y", "max_tokens": 2}"#, &[]);
    assert_eq!(status, 503, "{v}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-queued-requests"));
}

#[test]
fn sigterm_with_requests_in_flight_exits_cleanly() {
    if skip() {
        return;
    }
    let mut s = Server::start(&["--model", &fixture(), "--shutdown-grace-secs", "1"]);
    let url = s.url("/v1/completions");
    let long = json!({
        "prompt": "x", "max_tokens": 240, "temperature": 0, "ignore_eos": true,
        "stream": true, "model": "llama-gqa",
    });
    let client = std::thread::spawn(move || stream(&url, &long));
    std::thread::sleep(Duration::from_millis(300));
    s.terminate();
    let chunks = client.join().unwrap();
    // The stream ended properly: finished within the grace period, or aborted after it, when
    // an error event after the last chunk says why.
    let (errors, chunks): (Vec<Value>, Vec<Value>) =
        chunks.into_iter().partition(|c| c.get("error").is_some());
    let got = collect(&chunks);
    match got[0].2.as_str() {
        "length" => assert!(errors.is_empty(), "{errors:?}"),
        "abort" => {
            assert_eq!(errors.len(), 1, "{errors:?}");
            let message = errors[0]["error"]["message"].as_str().unwrap();
            assert!(message.contains("shut down"), "{message}");
        }
        other => panic!("finish reason {other}: {got:?}"),
    }
    s.assert_exits_cleanly();
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args([
            "serve",
            "--port",
            "0",
            "--model",
            &fixture(),
            "--api-key",
            "",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--api-key is empty"), "{err}");
}

#[test]
fn health_is_503_when_the_model_fails_to_load() {
    if skip() {
        return;
    }
    // A tokenizer and a config but no weights.
    let dir = std::env::temp_dir().join(format!("pagellm-noweights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(golden::fixture_dir("llama-gqa").join(f), dir.join(f)).unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .args(["serve", "--port", "0", "--model", dir.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = listening(&mut child);
    let start = Instant::now();
    let (status, body) = loop {
        let (status, body) = get(&format!("{base}/health"));
        if body.contains("safetensors") || start.elapsed() > Duration::from_secs(20) {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 503, "{body}");
    let (status, v, _) = post(&format!("{base}/v1/completions"), r#"{"prompt": "x"}"#, &[]);
    assert_eq!(status, 503, "{v}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of the llama-gqa fixture whose tokenizer_config.json carries `template`.
fn model_with_template(template: &str) -> std::path::PathBuf {
    let src = golden::fixture_dir("llama-gqa");
    let dir = std::env::temp_dir().join(format!(
        "pagellm-chat-{}-{}",
        std::process::id(),
        template.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap())
            .unwrap();
    cfg["chat_template"] = json!(template);
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

fn chat_fixture() -> Value {
    let p = common::repo_root().join("tests/fixtures/chat/expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn chat_completions_render_the_models_template_as_transformers_does() {
    if skip() {
        return;
    }
    let f = chat_fixture();
    let case = f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "headers"
                && c["conversation"] == 1
                && c["add_generation_prompt"] == true
        })
        .unwrap();
    let dir = model_with_template(f["templates"]["headers"].as_str().unwrap());
    let s = Server::start(&[
        "--model",
        dir.to_str().unwrap(),
        "--served-model-name",
        "chat",
    ]);
    let messages = &f["conversations"][1];
    let params = json!({"max_tokens": 10, "temperature": 0, "ignore_eos": true});
    // The chat request equals a completion of transformers' rendered prompt ids.
    let mut chat =
        json!({"model": "chat", "messages": messages, "logprobs": true, "top_logprobs": 2});
    let mut plain = json!({"model": "chat", "prompt": case["ids"], "logprobs": 2});
    for (k, v) in params.as_object().unwrap() {
        chat[k] = v.clone();
        plain[k] = v.clone();
    }
    let (st, c, _) = post(&s.url("/v1/chat/completions"), &chat.to_string(), &[]);
    assert_eq!(st, 200, "{c}");
    let (st, p, _) = post(&s.url("/v1/completions"), &plain.to_string(), &[]);
    assert_eq!(st, 200, "{p}");
    assert_eq!(c["object"], "chat.completion");
    let msg = &c["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["content"], p["choices"][0]["text"]);
    assert_eq!(c["usage"], p["usage"]);
    let chat_lps: Vec<f64> = c["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["logprob"].as_f64().unwrap())
        .collect();
    let plain_lps: Vec<f64> = p["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(chat_lps, plain_lps);
    assert_eq!(
        c["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Streamed: the role first, then content deltas that add up to the same reply.
    chat["stream"] = json!(true);
    let chunks = stream(&s.url("/v1/chat/completions"), &chat);
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, msg["content"].as_str().unwrap());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chat_without_a_template_or_against_it_is_a_clear_400() {
    if skip() {
        return;
    }
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let s = Server::start(&["--model", &fixture()]);
    let (st, v, _) = post(&s.url("/v1/chat/completions"), &body.to_string(), &[]);
    assert_eq!(st, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("chat_template.jinja"), "{v}");
    // Files are named within the model folder; the server's own paths stay private.
    let abs = std::fs::canonicalize(fixture()).unwrap();
    assert!(
        !message.contains(&fixture()) && !message.contains(abs.to_str().unwrap()),
        "{v}"
    );
    drop(s);
    let f = chat_fixture();
    let dir = model_with_template(f["templates"]["inst"].as_str().unwrap());
    let s = Server::start(&["--model", dir.to_str().unwrap()]);
    let twice =
        json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]});
    let (st, v, _) = post(&s.url("/v1/chat/completions"), &twice.to_string(), &[]);
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must alternate"),
        "{v}"
    );
    // No max_tokens: the reply may use the rest of the context.
    let (st, v, _) = post(&s.url("/v1/chat/completions"), &body.to_string(), &[]);
    assert_eq!(st, 200, "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_speculating_server_streams_what_generate_writes_and_counts_its_proposals() {
    if skip() {
        return;
    }
    let dir = fixture();
    let prompt = "the cat sat on the mat, the cat sat on the mat, the cat sat on the";
    let (want, want_lps) = greedy_generate(&dir, prompt, 40, 1);
    let server = Server::start(&["--model", &dir, "--speculative", "ngram"]);
    let body = json!({
        "model": "llama-gqa", "prompt": prompt, "max_tokens": 40, "temperature": 0,
        "ignore_eos": true, "logprobs": 1, "stream": true,
    });
    let got = collect(&stream(&server.url("/v1/completions"), &body));
    assert_eq!(got[0].0, want["text"].as_str().unwrap());
    assert_eq!(got[0].1, want_lps);
    // Statistics are published at most every 50 ms, and once more when the engine idles.
    let start = Instant::now();
    while server.metric("pagellm_spec_decode_num_drafts_total") == 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no speculation in the metrics"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let proposed = server.metric("pagellm_spec_decode_num_draft_tokens_total");
    let accepted = server.metric("pagellm_spec_decode_num_accepted_tokens_total");
    let drafts = server.metric("pagellm_spec_decode_num_drafts_total");
    assert!(
        drafts > 0.0 && proposed >= drafts && accepted <= proposed,
        "drafts {drafts}, proposed {proposed}, accepted {accepted}"
    );
}

#[test]
fn a_restarted_server_reads_a_prompt_from_the_disk_tier_and_counts_it_per_tier() {
    if skip() {
        return;
    }
    let dir = fixture();
    let cache = tempfile::TempDir::new().unwrap();
    let cache_dir = cache.path().to_string_lossy().into_owned();
    let prompt = "the quick brown fox jumps over the lazy dog while the cat sat on the mat and \
                  the bird sang in the tree by the river under the sky";
    let (want, want_lps) = greedy_generate(&dir, prompt, 12, 1);
    let body = json!({
        "model": "llama-gqa", "prompt": prompt, "max_tokens": 12, "temperature": 0,
        "ignore_eos": true, "logprobs": 1, "stream": true,
    });
    let args = [
        "--model",
        &dir,
        "--kv-cache-dir",
        &cache_dir,
        "--block-size",
        "4",
    ];
    let tier = |s: &Server, metric: &str, tier: &str| {
        s.metric(&format!(
            "pagellm_prefix_cache_tier_{metric}{{tier=\"{tier}\"}}"
        ))
    };
    {
        let server = Server::start(&args);
        for _ in 0..2 {
            let got = collect(&stream(&server.url("/v1/completions"), &body));
            assert_eq!(got[0].0, want["text"].as_str().unwrap());
            assert_eq!(got[0].1, want_lps);
        }
        // Statistics are published at most every 50 ms, and once more when the engine idles.
        let start = Instant::now();
        while tier(&server, "hits_total", "device") == 0.0 {
            assert!(start.elapsed() < Duration::from_secs(5), "no device hits");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tier(&server, "bytes", "disk") > 0.0);
    }
    let server = Server::start(&args);
    let got = collect(&stream(&server.url("/v1/completions"), &body));
    assert_eq!(got[0].0, want["text"].as_str().unwrap());
    assert_eq!(got[0].1, want_lps);
    let start = Instant::now();
    while tier(&server, "hits_total", "disk") == 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "nothing read from disk"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(tier(&server, "hits_total", "host") > 0.0);
    assert_eq!(tier(&server, "evictions_total", "disk"), 0.0);
}

#[test]
fn cache_salts_keep_prefixes_apart_and_never_change_the_text() {
    if skip() {
        return;
    }
    let dir = fixture();
    let prompt = "the quick brown fox jumps over the lazy dog while the cat sat on the mat and \
                  the bird sang in the tree by the river under the sky";
    let server = Server::start(&["--model", &dir, "--block-size", "4"]);
    let url = server.url("/v1/completions");
    // Sends the prompt under `salt` and returns its text and the prompt blocks it hit
    // (statistics are published when the engine idles: wait for its lookups to count).
    let run = |salt: Option<&str>| {
        let queries = server.metric("pagellm_prefix_cache_queries_total");
        let hits = server.metric("pagellm_prefix_cache_hits_total");
        let mut body = json!({
            "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
        });
        if let Some(s) = salt {
            body["cache_salt"] = json!(s);
        }
        let (status, v, _) = post(&url, &body.to_string(), &[]);
        assert_eq!(status, 200, "{v}");
        let start = Instant::now();
        while server.metric("pagellm_prefix_cache_queries_total") == queries {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no lookups counted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        (
            text,
            server.metric("pagellm_prefix_cache_hits_total") - hits,
        )
    };
    let (text, hits) = run(Some("alice"));
    assert_eq!(hits, 0.0);
    for (salt, hit) in [(Some("bob"), false), (None, false), (Some("alice"), true)] {
        let (t, hits) = run(salt);
        assert_eq!(t, text, "{salt:?}");
        assert_eq!(hits > 0.0, hit, "{salt:?}: {hits} hits");
    }
    let body = json!({"prompt": prompt, "max_tokens": 2, "cache_salt": ""});
    let (status, v, _) = post(&url, &body.to_string(), &[]);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "cache_salt", "{v}");
}
