//! A `pagellm serve` child process on a free loopback port, and an HTTP client that
//! reports every status instead of failing on 4xx/5xx. Shared by the server tests and the
//! serving benchmark.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

/// A running `pagellm serve`, killed on drop.
pub struct Served {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// Sends the server SIGTERM (a graceful shutdown).
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    }

    /// Waits up to 20 s for the server to exit and asserts it exited with success.
    pub fn assert_exits_cleanly(&mut self) {
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still running after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status:?}");
    }
}

/// Starts `pagellm serve --port 0 ARGS`, reads the address it prints, and waits until
/// `/health` answers 200.
pub fn serve(binary: &str, args: &[&str]) -> Served {
    serve_with_env(binary, args, &[])
}

/// [`serve`] with these environment variables set for the server.
pub fn serve_with_env(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(binary)
        .args(["serve", "--port", "0"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pagellm serve");
    let base = listening(&mut child);
    let s = Served { child, base };
    let start = Instant::now();
    while agent()
        .get(&format!("{}/health", s.base))
        .call()
        .map_or(true, |r| r.status() != 200)
    {
        assert!(start.elapsed() < Duration::from_secs(120), "never healthy");
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

/// The base URL a starting server prints on stderr; keeps draining stderr afterwards so
/// the server never blocks on a full pipe.
pub fn listening(child: &mut Child) -> String {
    let stderr = child.stderr.take().expect("stderr piped");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("pagellm serve exited before listening")
            .expect("stderr");
        if let Some(i) = line.find("listening on ") {
            break line[i + "listening on ".len()..].trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    base
}

/// The server's `/metrics` text.
pub fn metrics_text(s: &Served) -> String {
    agent()
        .get(&format!("{}/metrics", s.base))
        .call()
        .expect("GET /metrics")
        .body_mut()
        .read_to_string()
        .expect("metrics text")
}

// Raw HTTP/1.1 over TCP, for requests a client library would not send.

pub fn connect(s: &Served) -> TcpStream {
    let addr = s.base.trim_start_matches("http://");
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp
}

/// Everything the server sends until it closes the connection (or 20 s pass).
pub fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Status and JSON body of a complete response in `raw`.
pub fn parse(raw: &str) -> (u16, serde_json::Value) {
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"));
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default();
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: body of {raw:?}"));
    (status, json)
}

/// Sends `request` on a fresh connection that the server is asked to close after it.
pub fn exchange(s: &Served, request: &str) -> (u16, serde_json::Value, String) {
    let mut tcp = connect(s);
    tcp.write_all(request.as_bytes()).unwrap();
    let raw = read_all(&mut tcp);
    let (status, json) = parse(&raw);
    (status, json, raw)
}

/// Posts a JSON `body` that asks for a stream and returns every `data:` payload of the
/// Server-Sent Events that answer it, until `[DONE]` (which must come).
pub fn post_stream(url: &str, body: &str, headers: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let mut req = agent().post(url).header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send(body).expect("stream request");
    assert_eq!(r.status().as_u16(), 200);
    let mut out = Vec::new();
    for line in BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return out;
        }
        out.push(serde_json::from_str(data).unwrap());
    }
    panic!("the stream ended without [DONE]: {out:?}");
}
