//! `pagellm serve` against the requests a hostile client or a web page in the user's browser
//! sends, over raw TCP where an HTTP client library would not send them: stalled headers,
//! idle connections, stalled, slow ("slow POST") and oversized bodies, foreign `Host` and `Origin` values,
//! non-JSON bodies, wrong methods; and a shutdown with requests in flight.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::golden;
use serde_json::Value;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, connect, exchange, parse, read_all, serve};

fn skip() -> bool {
    common::contexts().is_empty()
}

fn fixture() -> String {
    golden::fixture_arg("llama-gqa")
}

fn post_request(host: &str, extra: &str, content_type: &str, body: &str) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{extra}\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

const BODY: &str = r#"{"prompt": "x", "max_tokens": 2, "temperature": 0}"#;

fn error_message(v: &Value) -> &str {
    v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {v}"))
}

#[test]
fn stalled_idle_and_lying_clients_are_cut_off() {
    if skip() {
        return;
    }
    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &fixture(),
            "--header-timeout-secs",
            "1",
            "--body-timeout-secs",
            "1",
            "--max-body-bytes",
            "4096",
        ],
    );
    // Headers begun and never finished, and a connection that sends nothing: both closed
    // after the header timeout, not held open; the first is told why.
    for opening in ["POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n", ""] {
        let mut tcp = connect(&s);
        tcp.write_all(opening.as_bytes()).unwrap();
        let start = Instant::now();
        let raw = read_all(&mut tcp);
        let held = start.elapsed();
        assert!(
            held >= Duration::from_millis(900) && held < Duration::from_secs(5),
            "{opening:?}: closed after {held:?}"
        );
        if opening.is_empty() {
            assert_eq!(raw, "", "an idle connection is closed without a word");
        } else {
            let (status, v) = parse(&raw);
            assert_eq!(status, 408, "{raw}");
            assert!(error_message(&v).contains("--header-timeout-secs"), "{v}");
        }
    }
    // A head trickled a byte every 0.2 s, each well within the timeout: cut all the same,
    // for the timeout bounds the whole head.
    let mut tcp = connect(&s);
    let mut writer = tcp.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for b in "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            .repeat(4)
            .bytes()
        {
            if writer.write_all(&[b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let start = Instant::now();
    let raw = read_all(&mut tcp);
    let held = start.elapsed();
    assert!(
        held >= Duration::from_millis(900) && held < Duration::from_secs(3),
        "a trickled head closed after {held:?}"
    );
    assert_eq!(parse(&raw).0, 408, "{raw}");
    drop(tcp);
    sender.join().unwrap();
    // A body declared larger than the limit: refused before any of it is read, so the
    // client that asked to continue is never told to.
    let huge = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \
                application/json\r\nContent-Length: 100000000\r\nExpect: 100-continue\r\n\r\n";
    let (status, v, raw) = exchange(&s, huge);
    assert_eq!(status, 413, "{raw}");
    assert!(!raw.contains("100 Continue"), "{raw}");
    assert!(error_message(&v).contains("4096 bytes"), "{v}");
    // A body that stops short of its Content-Length: 408 after the body timeout.
    let short = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \
                 application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
    let start = Instant::now();
    let (status, v, raw) = exchange(&s, short);
    assert_eq!(status, 408, "{raw}");
    assert!(error_message(&v).contains("stalled"), "{v}");
    assert!(start.elapsed() >= Duration::from_millis(900));
    // None of it got in the way of a well-formed request.
    let (status, v, raw) = exchange(&s, &post_request("127.0.0.1", "", "application/json", BODY));
    assert_eq!(status, 200, "{raw}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Each cut counted by its kind.
    let metrics = http::metrics_text(&s);
    for (kind, n) in [("head_deadline", 3), ("body_stall", 1), ("body_rate", 0)] {
        let line = format!("pagellm_http_cuts_total{{kind=\"{kind}\"}} {n}\n");
        assert!(metrics.contains(&line), "{line:?} in\n{metrics}");
    }
}

/// Sends a request's head, then its body a byte every `every` until the server answers (or
/// `bytes` were sent); returns the answer and when it came.
fn trickle(s: &http::Served, bytes: usize, every: Duration) -> (u16, Value, Duration) {
    let mut tcp = connect(s);
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {bytes}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).unwrap();
    let mut writer = tcp.try_clone().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let sender = std::thread::spawn(move || {
        for _ in 0..bytes {
            if stopped.load(std::sync::atomic::Ordering::Relaxed) || writer.write_all(b" ").is_err()
            {
                break;
            }
            std::thread::sleep(every);
        }
    });
    let start = Instant::now();
    let raw = read_all(&mut tcp);
    let took = start.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
    let (status, v) = parse(&raw);
    (status, v, took)
}

/// A body sent a byte at a time, each within the pause limit, is cut for its pace after the
/// grace period, and one that keeps a fair pace is cut at the whole body's deadline; both
/// with a JSON 408, and neither holds the server's only connection slot from a well-formed
/// request for long.
#[test]
fn slow_bodies_are_cut_by_their_pace_and_their_deadline() {
    if skip() {
        return;
    }
    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &["--model", &fixture(), "--max-connections", "1"],
    );
    // The default minimum of 1024 bytes/s after 5 s: a byte every 0.7 s is cut at 5-6 s.
    let (status, v, took) = trickle(&s, 1000, Duration::from_millis(700));
    assert_eq!(status, 408, "{v}");
    assert!(error_message(&v).contains("bytes/s"), "{v}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(9),
        "cut after {took:?}"
    );
    let (status, _, _) = exchange(&s, &post_request("127.0.0.1", "", "application/json", BODY));
    assert_eq!(status, 200, "the slot was given back");
    drop(s);

    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &fixture(),
            "--body-deadline-secs",
            "2",
            "--min-body-rate",
            "0",
        ],
    );
    let (status, v, took) = trickle(&s, 1000, Duration::from_millis(100));
    assert_eq!(status, 408, "{v}");
    assert!(error_message(&v).contains("2 s in all"), "{v}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "cut after {took:?}"
    );
}

#[test]
fn a_web_page_cannot_use_the_local_server() {
    if skip() {
        return;
    }
    let s = serve(env!("CARGO_BIN_EXE_pagellm"), &["--model", &fixture()]);
    let port = s.base.rsplit(':').next().unwrap().to_string();
    // DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own name.
    for host in ["evil.example", &format!("evil.example:{port}")] {
        let (status, v, _) = exchange(&s, &post_request(host, "", "application/json", BODY));
        assert_eq!(status, 403, "{host}: {v}");
        assert!(error_message(&v).contains("--allowed-hosts"), "{v}");
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "app.localhost".into(),
    ] {
        let (status, v, _) = exchange(&s, &post_request(&host, "", "application/json", BODY));
        assert_eq!(status, 200, "{host}: {v}");
    }
    // A JSON body sent as text/plain (a "simple" cross-site request, no preflight), as a
    // form, or with no type at all.
    for ty in [
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let (status, v, _) = exchange(&s, &post_request("127.0.0.1", "", ty, BODY));
        assert_eq!(status, 415, "{ty}: {v}");
        assert!(error_message(&v).contains("application/json"), "{v}");
    }
    let untyped = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    assert_eq!(exchange(&s, &untyped).0, 415);
    // A cross-origin fetch as a browser sends it: refused, and its preflight gets no
    // permission; a page on localhost is served and allowed.
    let evil = "Origin: https://evil.example\r\n";
    let (status, v, _) = exchange(
        &s,
        &post_request("127.0.0.1", evil, "application/json", BODY),
    );
    assert_eq!(status, 403, "{v}");
    assert!(error_message(&v).contains("--allowed-origins"), "{v}");
    let preflight = |origin: &str| {
        let req = format!(
            "OPTIONS /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
             Access-Control-Request-Headers: content-type\r\n\r\n"
        );
        let mut tcp = connect(&s);
        tcp.write_all(req.as_bytes()).unwrap();
        read_all(&mut tcp).to_ascii_lowercase()
    };
    assert!(!preflight("https://evil.example").contains("access-control-allow-origin"));
    let local = preflight("http://localhost:3000");
    assert!(
        local.contains("access-control-allow-origin: http://localhost:3000"),
        "{local}"
    );
    let page = "Origin: http://localhost:3000\r\n";
    let (status, _, raw) = exchange(
        &s,
        &post_request("127.0.0.1", page, "application/json", BODY),
    );
    assert_eq!(status, 200, "{raw}");
    assert!(raw
        .to_ascii_lowercase()
        .contains("access-control-allow-origin: http://localhost:3000"));
}

#[test]
fn allowed_hosts_and_origins_extend_the_defaults() {
    if skip() {
        return;
    }
    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &fixture(),
            "--allowed-hosts",
            "my.box,Other.Box",
            "--allowed-origins",
            "https://app.example",
        ],
    );
    let app = "Origin: https://app.example\r\n";
    for host in ["my.box:8000", "other.box", "localhost"] {
        let (status, v, raw) = exchange(&s, &post_request(host, app, "application/json", BODY));
        assert_eq!(status, 200, "{host}: {v}");
        assert!(raw
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: https://app.example"));
    }
    let (status, _, _) = exchange(
        &s,
        &post_request("third.box", app, "application/json", BODY),
    );
    assert_eq!(status, 403);
    let other = "Origin: https://other.example\r\n";
    let (status, _, _) = exchange(&s, &post_request("my.box", other, "application/json", BODY));
    assert_eq!(status, 403);
}

#[test]
fn routing_and_parser_refusals_are_json_errors() {
    if skip() {
        return;
    }
    let s = serve(env!("CARGO_BIN_EXE_pagellm"), &["--model", &fixture()]);
    for (method, path, status) in [
        ("GET", "/v1/completions", 405),
        ("DELETE", "/v1/chat/completions", 405),
        ("POST", "/health", 405),
        ("PUT", "/v1/models", 405),
        ("GET", "/nowhere", 404),
    ] {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let (got, v, raw) = exchange(&s, &req);
        assert_eq!(got, status, "{method} {path}: {raw}");
        assert!(!error_message(&v).is_empty());
    }
    // What the HTTP parser refuses before any route sees it (hyper's limits: a URI of at
    // most 65534 bytes, 100 headers; a head over its 400 KB buffer is refused
    // the same way, but unread bytes left behind make the close a reset that can drop it).
    let get = |extra: &str| format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n");
    let many: String = (0..120).map(|i| format!("X-Header-{i}: v\r\n")).collect();
    let long_uri = format!(
        "GET /v1/models?q={} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "a".repeat(70_000)
    );
    for (what, req, status, needle) in [
        (
            "no request line",
            "GARBAGE\r\n\r\n".to_string(),
            400,
            "not valid HTTP",
        ),
        (
            "a header without a colon",
            get("Bad Header Line\r\n"),
            400,
            "not valid HTTP",
        ),
        (
            "a Content-Length that is no number",
            get("Content-Length: abc\r\n"),
            400,
            "Content-Length",
        ),
        ("a 70,000-byte URI", long_uri, 414, "URI"),
        ("120 headers", get(&many), 431, "headers"),
    ] {
        let (got, v, raw) = exchange(&s, &req);
        let head = raw.split("\r\n\r\n").next().unwrap_or_default();
        assert_eq!(got, status, "{what}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{what}: {head}"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {raw}");
        assert!(error_message(&v).contains(needle), "{what}: {v}");
    }
    // The server still answers afterwards.
    let (got, _, raw) = exchange(&s, &get("Connection: close\r\n"));
    assert_eq!(got, 200, "{raw}");
}

#[test]
fn a_shutdown_answers_503_until_its_requests_are_done_or_aborted() {
    if skip() {
        return;
    }
    // One sequence at a time, so sixteen 250-token requests (4000 decode steps) take
    // several times the grace even on a fast machine; three did not.
    let mut s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &fixture(),
            "--max-num-seqs",
            "1",
            "--shutdown-grace-secs",
            "1",
        ],
    );
    let url = format!("{}/v1/completions", s.base);
    let body = r#"{"prompt": "x", "max_tokens": 250, "temperature": 0, "ignore_eos": true}"#;
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut r = agent()
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(body)
                    .unwrap();
                let status = r.status().as_u16();
                let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap())
                    .unwrap_or(Value::Null);
                (status, v)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // Four streams as well, queued behind those: aborted at the grace's end, each ends with
    // its `abort` finish reason and then an OpenAI-shaped error event.
    let streams: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            let body = body.replace('}', r#", "stream": true}"#);
            std::thread::spawn(move || http::post_stream(&url, &body, &[]))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    s.terminate();
    // During the grace period the listener stays open and says it is going away.
    std::thread::sleep(Duration::from_millis(200));
    let mut r = agent().get(&format!("{}/health", s.base)).call().unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert!(r
        .body_mut()
        .read_to_string()
        .unwrap()
        .contains("shutting down"));
    let (status, v, _) = exchange(&s, &post_request("127.0.0.1", "", "application/json", BODY));
    assert_eq!(status, 503, "{v}");
    let results: Vec<(u16, Value)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    // Finished within the grace period, or aborted at its end with a 503 and a reason.
    for (status, v) in &results {
        match status {
            200 => assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}"),
            503 => assert!(error_message(v).contains("shut down"), "{v}"),
            _ => panic!("{status}: {v}"),
        }
    }
    assert!(results.iter().any(|(st, _)| *st == 503), "{results:?}");
    for stream in streams {
        let events = stream.join().unwrap();
        let reason = events
            .iter()
            .find_map(|e| e["choices"][0]["finish_reason"].as_str())
            .unwrap_or_else(|| panic!("no finish reason: {events:?}"));
        assert_eq!(reason, "abort", "{events:?}");
        let errors: Vec<&Value> = events.iter().filter(|e| e.get("error").is_some()).collect();
        assert_eq!(errors.len(), 1, "{events:?}");
        assert!(error_message(errors[0]).contains("shut down"), "{errors:?}");
        assert_eq!(errors[0]["error"]["type"], "server_error");
    }
    s.assert_exits_cleanly();
}

#[test]
fn timeouts_must_be_positive_seconds() {
    // Refused before the model loads, so no adapter is needed.
    for (flag, value) in [
        ("--header-timeout-secs", "0"),
        ("--body-timeout-secs", "-1"),
        ("--body-timeout-secs", "inf"),
        ("--body-deadline-secs", "0"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
            .args(["serve", "--port", "0", &format!("{flag}={value}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} {value}");
        assert!(
            err.contains(&format!("{flag} must be a positive number of seconds")),
            "{flag} {value}: {err}"
        );
    }
}

#[test]
fn a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized() {
    if skip() {
        return;
    }
    let s = serve(env!("CARGO_BIN_EXE_pagellm"), &["--model", &fixture()]);
    // 3 MiB of text against a 256-token context: no tokenization of it can fit.
    let text = "lorem ipsum dolor sit amet ".repeat(3 << 20 >> 5);
    let body = serde_json::json!({"prompt": text, "max_tokens": 1});
    let mut r = agent()
        .post(&format!("{}/v1/completions", s.base))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    let message = error_message(&v);
    assert!(
        message.contains("however it is tokenized") && message.contains("256 tokens"),
        "{v}"
    );
    assert_eq!(v["error"]["param"], "prompt");
    // A prompt within the bound still reaches the engine's own exact check.
    let (status, v, _) = exchange(
        &s,
        &post_request(
            "127.0.0.1",
            "",
            "application/json",
            &serde_json::json!({"prompt": "x ".repeat(300), "max_tokens": 1}).to_string(),
        ),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        !error_message(&v).contains("however it is tokenized"),
        "{v}"
    );
}

#[test]
fn a_body_without_the_api_key_is_not_read() {
    if skip() {
        return;
    }
    let s = serve(
        env!("CARGO_BIN_EXE_pagellm"),
        &[
            "--model",
            &fixture(),
            "--api-key",
            "k",
            "--body-timeout-secs",
            "20",
        ],
    );
    // 10 of 1000 declared bytes: an unauthorised client is answered at once, without the
    // server waiting for (or buffering) its body.
    let partial = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \
                   application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\":";
    let start = Instant::now();
    let (status, v, raw) = exchange(&s, partial);
    assert_eq!(status, 401, "{raw}");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let with_key = "Authorization: Bearer k\r\n";
    let (status, v, _) = exchange(
        &s,
        &post_request("127.0.0.1", with_key, "application/json", BODY),
    );
    assert_eq!(status, 200, "{v}");
}
