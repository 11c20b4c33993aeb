//! The scale-out recipe of docs/DEPLOY.md, for real on loopback: two `pagellm serve`
//! replicas behind nginx (least connections, buffering off), 16 concurrent streaming
//! clients through it. Every stream completes, equals the same request answered by one
//! server alone, and both replicas serve some of them.
//!
//! Needs nginx (Debian's `nginx-light`, which `.ci/run` installs); without it the test says
//! so and skips, unless `PAGELLM_REQUIRE_NGINX=1` (CI) makes that a failure.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::golden;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, serve, Served};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A replica and its `host:port`.
fn replica(dir: &str) -> (Served, String) {
    let s = serve(env!("CARGO_BIN_EXE_pagellm"), &["--model", dir]);
    let addr = s.base.trim_start_matches("http://").to_string();
    (s, addr)
}

fn nginx() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn streamed_text(url: &str, body: &Value) -> (String, String) {
    let r = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (mut text, mut finish) = (String::new(), String::new());
    for line in BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return (text, finish);
        }
        let v: Value = serde_json::from_str(data).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.into();
        }
    }
    panic!("stream ended without [DONE]");
}

fn generation_tokens(addr: &str) -> f64 {
    let mut r = agent()
        .get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    text.lines()
        .find(|l| l.starts_with("pagellm_generation_tokens_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap()
}

#[test]
fn two_replicas_behind_nginx_stream_what_one_server_streams() {
    if common::contexts().is_empty() {
        return;
    }
    let Some(nginx) = nginx() else {
        if std::env::var("PAGELLM_REQUIRE_NGINX").as_deref() == Ok("1") {
            panic!("nginx is required (PAGELLM_REQUIRE_NGINX=1) but not installed");
        }
        eprintln!("\n*** SKIPPED: nginx is not installed (apt-get install nginx-light) ***\n");
        return;
    };
    let dir = golden::fixture_dir("llama-gqa")
        .to_string_lossy()
        .into_owned();
    let (_a, a) = replica(&dir);
    let (_b, b) = replica(&dir);
    let prefix = std::env::temp_dir().join(format!("pagellm-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&prefix).unwrap();
    let port = free_port();
    let conf = format!(
        "daemon off;\nmaster_process off;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
         \x20 upstream pagellm {{ least_conn; server {a}; server {b}; }}\n\
         \x20 server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
         \x20     proxy_pass http://pagellm;\n      proxy_http_version 1.1;\n\
         \x20     proxy_set_header Connection \"\";\n      proxy_set_header Host $host;\n\
         \x20     proxy_buffering off;\n\
         \x20     proxy_read_timeout 600s;\n    }}\n  }}\n}}\n",
        p = prefix.display()
    );
    std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
    let _lb = Proc(
        Command::new(&nginx)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(prefix.join("nginx.conf"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx"),
    );
    let lb = format!("http://127.0.0.1:{port}");
    let start = Instant::now();
    while agent()
        .get(&format!("{lb}/health"))
        .call()
        .map_or(true, |r| r.status() != 200)
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nginx never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = |i: usize| {
        json!({
            "prompt": format!("client {i} asks about {} things", i * 5 % 11),
            "max_tokens": 32, "temperature": 0, "ignore_eos": true, "stream": true,
        })
    };
    // Each request answered by replica A alone, one at a time.
    let solo: Vec<(String, String)> = (0..16)
        .map(|i| streamed_text(&format!("http://{a}/v1/completions"), &body(i)))
        .collect();
    let (before_a, before_b) = (generation_tokens(&a), generation_tokens(&b));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (url, b) = (format!("{lb}/v1/completions"), body(i));
            std::thread::spawn(move || streamed_text(&url, &b))
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        assert_eq!(t.join().unwrap(), solo[i], "client {i}");
    }
    let (da, db) = (
        generation_tokens(&a) - before_a,
        generation_tokens(&b) - before_b,
    );
    assert_eq!(da + db, 16.0 * 32.0);
    assert!(
        da > 0.0 && db > 0.0,
        "one replica took everything: {da} / {db}"
    );
    let _ = std::fs::remove_dir_all(&prefix);
}
