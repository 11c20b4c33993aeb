//! A bounded fuzz run against `pagellm serve`: a few thousand seeded, generated requests
//! over every route, method and request field, with values of every JSON type and their
//! extremes, from eight clients at once. Every answer must be a success or an OpenAI-shaped
//! JSON error with a 4xx status (or 503); no 500, no hang; and when the run is over the
//! engine holds no KV blocks and still answers a plain request as it did before.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::golden;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{exchange, serve, Served};

const CLIENTS: u64 = 8;
const REQUESTS_PER_CLIENT: usize = 500;

/// Values of every JSON type, with the extremes validation must handle.
fn any_value(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    let scalars = [
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(1),
        json!(2),
        json!(-1),
        json!(0.5),
        json!(1e-45),
        json!(1e30),
        json!(3.4e38),
        json!(1e308),
        json!(-1e308),
        json!(i64::MAX),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(""),
        json!("x"),
        json!("hello world"),
        json!("\u{0}\u{fffd}é😀"),
        json!("llama-gqa"),
    ];
    match rng.random_range(0..10) {
        0..=5 => scalars.choose(rng).unwrap().clone(),
        6 => json!("word ".repeat(rng.random_range(0..2000))),
        7 if depth < 2 => Value::Array(
            (0..rng.random_range(0..5))
                .map(|_| any_value(rng, depth + 1))
                .collect(),
        ),
        8 if depth < 2 => {
            let keys = ["type", "name", "content", "role", "a", "json_schema"];
            Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| {
                        let k = keys.choose(rng).unwrap().to_string();
                        (k, any_value(rng, depth + 1))
                    })
                    .collect(),
            )
        }
        _ => json!(rng.random_range(-3i64..600)),
    }
}

/// Mostly plausible values for the fields that decide whether a request runs, so that many
/// requests get as far as the engine; any value now and then.
fn field_value(rng: &mut ChaCha8Rng, field: &str) -> Value {
    if rng.random_bool(0.3) {
        return any_value(rng, 0);
    }
    match field {
        "prompt" => match rng.random_range(0..3) {
            0 => json!("the cat sat on"),
            1 => json!([5, 80, 17]),
            _ => json!(["a", "b c"]),
        },
        "messages" => json!([{"role": "user", "content": "hi"}]),
        "max_tokens" | "max_completion_tokens" => json!(rng.random_range(0..6)),
        "n" | "best_of" | "logprobs" | "top_logprobs" | "top_k" => json!(rng.random_range(0..4)),
        "temperature" | "top_p" | "min_p" | "length_penalty" => json!(rng.random::<f64>() * 2.0),
        "presence_penalty" | "frequency_penalty" => json!(rng.random::<f64>() * 4.0 - 2.0),
        "repetition_penalty" => json!(rng.random::<f64>() * 3.0),
        "stop" => json!(["\n", "e"].choose(rng).unwrap()),
        "stop_token_ids" => json!([rng.random_range(0..512)]),
        "seed" => json!(rng.random::<u32>()),
        "stream_options" => json!({"include_usage": rng.random_bool(0.5)}),
        "model" => json!("llama-gqa"),
        "response_format" => match rng.random_range(0..3) {
            0 => json!({"type": "json_object"}),
            1 => json!({"type": "json_schema", "json_schema": {"name": "x",
                        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
            _ => json!({"type": "text"}),
        },
        "structured_outputs" => json!({"choice": ["yes", "no"]}),
        "guided_choice" => json!(["a", "b"]),
        "guided_regex" => json!(["[0-9]+", "(", "a{2,3}"].choose(rng).unwrap()),
        "guided_json" => json!({"type": "array", "items": {"type": "boolean"}}),
        "guided_grammar" => json!("start: \"x\"+"),
        "tools" => json!([{"type": "function", "function": {"name": "f",
                           "parameters": {"type": "object"}}}]),
        "tool_choice" => json!(["none", "auto", "required"].choose(rng).unwrap()),
        "tokens" => json!([1, rng.random_range(0..600)]),
        "logit_bias" => {
            json!({rng.random_range(0..600).to_string(): rng.random::<f64>() * 300.0 - 150.0})
        }
        _ => json!(rng.random_bool(0.5)),
    }
}

const FIELDS: [&str; 38] = [
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "best_of",
    "use_beam_search",
    "length_penalty",
    "stop",
    "stop_token_ids",
    "seed",
    "logprobs",
    "top_logprobs",
    "echo",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "stream",
    "stream_options",
    "model",
    "add_generation_prompt",
    "response_format",
    "logit_bias",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "tokens",
];

/// One request: (method, path, headers, body).
fn request(rng: &mut ChaCha8Rng) -> (String, String, String, Vec<u8>) {
    let paths = [
        "/v1/completions",
        "/v1/completions",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
        "/v1/embeddings",
        "/v1/completions?x=1",
        "/%ff",
        "//v1/completions",
    ];
    let path = paths.choose(rng).unwrap().to_string();
    let method = if rng.random_bool(0.9) {
        if path.contains("completions") || path.contains("tokenize") {
            "POST"
        } else {
            "GET"
        }
    } else {
        *["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
            .choose(rng)
            .unwrap()
    };
    let body: Vec<u8> = match rng.random_range(0..20) {
        0 => (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
        1 => b"{\"prompt\": \"unterminated".to_vec(),
        2 => any_value(rng, 0).to_string().into_bytes(),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.random_range(0..8) {
                let f = FIELDS.choose(rng).unwrap();
                m.insert(f.to_string(), field_value(rng, f));
            }
            if !m.contains_key("prompt") && rng.random_bool(0.7) {
                m.insert("prompt".into(), json!("the cat"));
            }
            let chatty = path.contains("chat") || path == "/tokenize";
            if !m.contains_key("messages") && chatty && rng.random_bool(0.7) {
                m.insert("messages".into(), field_value(rng, "messages"));
            }
            Value::Object(m).to_string().into_bytes()
        }
    };
    let content_type = if rng.random_bool(0.95) {
        "application/json"
    } else {
        "text/plain"
    };
    let headers = format!("Content-Type: {content_type}\r\n");
    (method.to_string(), path, headers, body)
}

fn kv_usage(s: &Served) -> f64 {
    let raw = exchange_raw(s, "GET", "/metrics", "", b"");
    raw.lines()
        .find(|l| l.starts_with("pagellm_kv_cache_usage_ratio{pool=\"device\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no device KV usage in\n{raw}"))
}

fn exchange_raw(s: &Served, method: &str, path: &str, headers: &str, body: &[u8]) -> String {
    use std::io::Write;
    let mut tcp = http::connect(s);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    tcp.write_all(&bytes).unwrap();
    http::read_all(&mut tcp)
}

/// Checks one answer; returns its status.
fn check(raw: &str, what: &str) -> u16 {
    let status: u16 = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no status line in {raw:?}"));
    assert!(
        status < 500 || status == 503,
        "{what}: answered {status}:\n{raw}"
    );
    let head = raw.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let streamed = head.contains("text/event-stream");
    if streamed {
        assert!(
            body.contains("[DONE]"),
            "{what}: stream without [DONE]:\n{raw}"
        );
    } else if status >= 400 && !body.is_empty() {
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{what}: {status} without a JSON body ({e}):\n{raw}"));
        assert!(v["error"]["message"].is_string(), "{what}: {v}");
    }
    status
}

#[test]
fn thousands_of_generated_requests_get_answers_and_leave_nothing_behind() {
    if common::contexts().is_empty() {
        return;
    }
    let dir = golden::fixture_dir("llama-gqa")
        .to_string_lossy()
        .into_owned();
    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &dir,
            "--max-model-len",
            "48",
            "--max-num-seqs",
            "16",
        ],
    );
    let plain = r#"{"prompt": "the cat sat on", "max_tokens": 6, "temperature": 0}"#;
    let post = |s: &Served| {
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{plain}",
            plain.len()
        );
        exchange(s, &req).1["choices"][0]["text"].clone()
    };
    let before = post(&s);
    let statuses = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let s = &s;
                scope.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(c);
                    let mut seen = std::collections::BTreeMap::new();
                    for i in 0..REQUESTS_PER_CLIENT {
                        let (method, path, headers, body) = request(&mut rng);
                        let what = format!(
                            "client {c} request {i}: {method} {path} {}",
                            String::from_utf8_lossy(&body)
                                .chars()
                                .take(300)
                                .collect::<String>()
                        );
                        let raw = exchange_raw(s, &method, &path, &headers, &body);
                        *seen.entry(check(&raw, &what)).or_insert(0usize) += 1;
                    }
                    seen
                })
            })
            .collect();
        let mut all = std::collections::BTreeMap::new();
        for h in handles {
            for (status, n) in h.join().unwrap() {
                *all.entry(status).or_insert(0usize) += n;
            }
        }
        all
    });
    eprintln!("statuses: {statuses:?}");
    // The run reached the engine, not only the validation.
    assert!(
        statuses.get(&200).copied().unwrap_or(0) > 200,
        "{statuses:?}"
    );
    // Every request is answered, so nothing may hold blocks any more.
    let start = std::time::Instant::now();
    while kv_usage(&s) != 0.0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "KV blocks still held after the run"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(post(&s), before, "a greedy request changed after the run");
}
