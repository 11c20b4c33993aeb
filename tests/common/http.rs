//! A `pagellm serve` child process on a free loopback port, and an HTTP client that
//! reports every status instead of failing on 4xx/5xx. Shared by the server tests and the
//! serving benchmark.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
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

/// Starts `pagellm serve --port 0 ARGS`, reads the address it prints, and waits until
/// `/health` answers 200.
pub fn serve(binary: &str, args: &[&str]) -> Served {
    let mut child = Command::new(binary)
        .args(["serve", "--port", "0"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
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
