//! `pagellm perplexity` (teacher-forced scoring on the command line, `pagellm::internals::eval`): it
//! saves a baseline's log-probabilities and compares a KV cache setting with it (KL
//! divergence and top-1 agreement, as JSON), and refuses a baseline of another window, both
//! options at once, and a missing file, by name.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::contexts;
use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("pagellm-cli-ppl-{}-{name}", std::process::id()))
}

#[test]
fn the_perplexity_command_saves_a_baseline_and_compares_with_it() {
    if contexts().is_empty() {
        return;
    }
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pagellm"))
            .arg("perplexity")
            .args(args)
            .output()
            .expect("run pagellm");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let text = temp("text.txt");
    std::fs::write(
        &text,
        "The cat keeps no calendar. The tide is never late. ".repeat(12),
    )
    .unwrap();
    let base = temp("cli.lp");
    let (t, b) = (text.to_str().unwrap(), base.to_str().unwrap());
    let (ok, out, err) = run(&[
        "--file",
        t,
        "--context",
        "64",
        "--kv-dtype",
        "f32",
        "--save-logits",
        b,
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("perplexity:") && out.contains("saved log-probabilities"),
        "{out}"
    );
    let (ok, out, err) = run(&[
        "--file",
        t,
        "--context",
        "64",
        "--kv-dtype",
        "int4",
        "--kl-divergence",
        b,
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(v["kv_dtype"], "int4");
    assert_eq!(v["kv_rotation"], "hadamard", "int4's automatic rotation");
    let kld = v["mean_kld"].as_f64().unwrap();
    assert!(kld > 0.0 && kld < 0.1, "{v}");
    assert!(v["top1_agreement"].as_f64().unwrap() > 0.5, "{v}");
    // The same baseline with another window size is refused by name; so are both options
    // at once, and a missing file.
    let (ok, _, err) = run(&["--file", t, "--context", "32", "--kl-divergence", b]);
    assert!(!ok && err.contains("window size"), "{err}");
    let (ok, _, err) = run(&["--file", t, "--save-logits", b, "--kl-divergence", b]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = run(&["--file", "/no/such/text.txt"]);
    assert!(
        !ok && err.contains("/no/such/text.txt") && !err.contains("panicked"),
        "{err}"
    );
    let _ = std::fs::remove_file(&text);
    let _ = std::fs::remove_file(&base);
}
