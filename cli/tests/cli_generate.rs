//! `pagellm generate` as a user runs it: JSON output whose greedy tokens equal
//! transformers', a prompts file answered in input order, streaming text, clear errors,
//! and the constraint flags (each output checked by the `jsonschema` and `regex` crates), with
//! the bad lines of a prompts file failing alone; a second run reading its prompt's blocks
//! from the disk tier.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::golden;
use serde_json::Value;
use std::process::Command;

fn generate(args: &[&str]) -> (bool, String, String) {
    generate_with(args, &[])
}

fn generate_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pagellm"))
        .arg("generate")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .envs(env.iter().copied())
        .output()
        .expect("run pagellm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn skip() -> bool {
    common::contexts().is_empty()
}

#[test]
fn json_output_has_transformers_greedy_tokens() {
    if skip() {
        return;
    }
    // One fixture per architecture family; the long prompt crosses the windowed ones'
    // 8-token windows several times.
    for name in [
        "llama-gqa",
        "qwen2-bias-tied",
        "mistral-f16",
        "qwen3-qknorm-window",
        "gemma2-softcap-window",
        "gemma3-local-rope",
        "phi3-longrope-window",
        "mixtral-moe",
        "qwen3-moe-dense-layer",
        "gpt-oss-sinks-moe",
    ] {
        json_output_matches(name);
    }
}

fn json_output_matches(name: &'static str) {
    let f = golden::load(name);
    let case = &f.cases[2];
    let dir = f.dir.to_string_lossy().into_owned();
    let (ok, stdout, stderr) = generate(&[
        "--model",
        &dir,
        "--prompt",
        &case.prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--json",
        "--logprobs",
        "3",
    ]);
    assert!(ok, "{name}: {stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let ids = |x: &Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    assert_eq!(ids(&v["prompt_token_ids"]), case.prompt_ids);
    let out = &v["outputs"][0];
    assert_eq!(ids(&out["token_ids"]), case.greedy_ids, "{name}");
    assert_eq!(out["finish_reason"], "length");
    let lp = out["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), 16);
    let (top_id, top_lp) = case.top5[0][0];
    assert_eq!(lp[0]["token_id"].as_u64().unwrap() as u32, top_id);
    assert!(
        (lp[0]["logprob"].as_f64().unwrap() - top_lp).abs() < 5e-2,
        "{name}"
    );
    assert_eq!(lp[0]["top"].as_array().unwrap().len(), 3);
}

#[test]
fn prompts_file_requests_are_batched_and_answered_in_order() {
    if skip() {
        return;
    }
    let f = golden::load("llama-gqa");
    let dir = f.dir.to_string_lossy().into_owned();
    let path = std::env::temp_dir().join(format!("pagellm-prompts-{}.jsonl", std::process::id()));
    let lines: Vec<String> = f
        .cases
        .iter()
        .map(|c| {
            serde_json::json!({"prompt": c.prompt, "max_tokens": 16, "temperature": 0}).to_string()
        })
        .chain(std::iter::once(
            r#"{"prompt": "Hi", "n": 3, "seed": 5, "max_tokens": 4, "temperature": 1.0}"#
                .to_string(),
        ))
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (ok, stdout, stderr) = generate(&[
        "--model",
        &dir,
        "--prompts-file",
        path.to_str().unwrap(),
        "--json",
        "--ignore-eos",
        "--stats",
    ]);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), f.cases.len() + 1);
    for (row, case) in rows.iter().zip(&f.cases) {
        let got: Vec<u32> = row["outputs"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(got, case.greedy_ids, "{:?}", case.prompt);
    }
    assert_eq!(rows.last().unwrap()["outputs"].as_array().unwrap().len(), 3);
    assert!(stderr.contains("peak running sequences:"), "{stderr}");
    let peak: usize = stderr
        .lines()
        .find(|l| l.starts_with("peak running sequences:"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        peak > 1,
        "requests from one file run together (peak {peak})"
    );
}

#[test]
fn streams_text_after_the_prompt() {
    if skip() {
        return;
    }
    let dir = golden::fixture_dir("qwen2-bias-tied")
        .to_string_lossy()
        .into_owned();
    let (ok, stdout, stderr) = generate(&[
        "--model",
        &dir,
        "--prompt",
        "Hello",
        "--max-tokens",
        "5",
        "--seed",
        "1",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("Hello"), "{stdout}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    if skip() {
        return;
    }
    let dir = golden::fixture_dir("llama-gqa")
        .to_string_lossy()
        .into_owned();
    let (ok, _, stderr) = generate(&["--model", &dir, "--prompt", "x", "--top-p", "1.5"]);
    assert!(!ok && stderr.contains("top_p"), "{stderr}");
    let (ok, _, stderr) = generate(&["--model", "/no/such/model", "--prompt", "x"]);
    assert!(!ok && stderr.contains("/no/such/model"), "{stderr}");
    let bad = std::env::temp_dir().join(format!("pagellm-bad-{}.jsonl", std::process::id()));
    std::fs::write(&bad, "{\"prompt\": \"a\", \"temprature\": 1}\n").unwrap();
    let (ok, _, stderr) = generate(&["--model", &dir, "--prompts-file", bad.to_str().unwrap()]);
    let _ = std::fs::remove_file(&bad);
    assert!(
        !ok && stderr.contains("line 1") && stderr.contains("temprature"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_small_pool_serves_under_max_model_len_and_stats_show_the_preemptions() {
    if skip() {
        return;
    }
    let dir = golden::fixture_dir("llama-gqa")
        .to_string_lossy()
        .into_owned();
    // The fixture's 256-token context needs 16 blocks of 16; 4 blocks are refused, and the
    // error names the option that makes them valid.
    let small = [
        "--model",
        &dir,
        "--num-gpu-blocks",
        "4",
        "--prompt",
        "the cat",
    ];
    let (ok, _, stderr) = generate(&small);
    assert!(!ok && stderr.contains("--max-model-len"), "{stderr}");
    // Capped at 64 tokens, 4 blocks serve three requests of ~33 tokens (3 blocks each)
    // by preempting.
    let file = std::env::temp_dir().join(format!("pagellm-small-{}.jsonl", std::process::id()));
    let lines = ["the cat", "a dog ran", "my bird"]
        .map(|p| format!("{{\"prompt\": \"{p}\"}}\n"))
        .concat();
    std::fs::write(&file, lines).unwrap();
    let (ok, stdout, stderr) = generate(&[
        "--model",
        &dir,
        "--num-gpu-blocks",
        "4",
        "--max-model-len",
        "64",
        "--prompts-file",
        file.to_str().unwrap(),
        "--max-tokens",
        "30",
        "--temperature",
        "0",
        "--ignore-eos",
        "--stats",
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.matches("=== request").count(), 3, "{stdout}");
    let preemptions: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("preemptions:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no preemption count in {stderr}"));
    assert!(preemptions > 0, "{stderr}");
    assert!(stderr.contains("measured:"), "{stderr}");
    // Prompt plus max_tokens beyond the cap is that request's error.
    let mut long = small.to_vec();
    long.extend(["--max-model-len", "64", "--max-tokens", "100"]);
    let (ok, _, stderr) = generate(&long);
    assert!(!ok && stderr.contains("max_tokens is 100"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn injected_device_losses_change_no_output_and_stats_count_them() {
    if skip() {
        return;
    }
    let dir = common::shipped_model();
    let file = std::env::temp_dir().join(format!("pagellm-loss-{}.jsonl", std::process::id()));
    let lines = ["The sea", "A wise man once said", "In the morning"]
        .map(|p| format!("{{\"prompt\": \"{p}\", \"n\": 2, \"seed\": 5}}\n"))
        .concat();
    std::fs::write(&file, lines).unwrap();
    let args = [
        "--model",
        &dir,
        "--prompts-file",
        file.to_str().unwrap(),
        "--max-tokens",
        "24",
        "--temperature",
        "0.8",
        "--stats",
    ];
    let (ok, calm, stderr) = generate(&args);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("device lost:"), "{stderr}");
    let (ok, lossy, stderr) =
        generate_with(&args, &[("PAGELLM_INJECT_DEVICE_LOSS", "load,2,7,reload")]);
    assert!(ok, "{stderr}");
    assert_eq!(lossy, calm, "{stderr}");
    assert!(
        stderr.contains("device lost:            2 times, recovered 2"),
        "{stderr}"
    );
    let (ok, _, stderr) = generate_with(&args, &[("PAGELLM_INJECT_DEVICE_LOSS", "2,soon")]);
    let _ = std::fs::remove_file(&file);
    assert!(
        !ok && stderr.contains("PAGELLM_INJECT_DEVICE_LOSS") && stderr.contains("\"soon\""),
        "{stderr}"
    );
}

/// `args` and then `extra`.
fn plus<'a>(args: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(extra).copied().collect()
}

/// The device pool's blocks `--stats` reports.
fn kv_blocks(stderr: &str) -> usize {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("KV cache:"))
        .unwrap_or_else(|| panic!("no KV cache line in {stderr}"));
    let before = line.split(" blocks hold").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn the_pool_is_fitted_to_the_reported_free_memory_without_changing_outputs() {
    if skip() {
        return;
    }
    let dir = common::shipped_model();
    let args = [
        "--model",
        &dir,
        "--prompt",
        "The sea",
        "--n",
        "2",
        "--max-tokens",
        "24",
        "--seed",
        "7",
        "--stats",
    ];
    let (ok, plain, stderr) = generate(&args);
    assert!(ok, "{stderr}");
    // These adapters report no free memory: 256 MiB at most, and the shipped model's
    // 64 sequences at its full context (32 blocks each) take less.
    assert_eq!(kv_blocks(&stderr), 64 * 32, "{stderr}");
    // 16 MiB free: the weights (6.5 MiB) leave about 9.5, of which the pool takes 80%.
    let (ok, fitted, stderr) =
        generate_with(&args, &[("PAGELLM_INJECT_DEVICE_MEMORY", "16777216")]);
    assert!(ok, "{stderr}");
    let blocks = kv_blocks(&stderr);
    assert!((200..260).contains(&blocks), "{blocks}: {stderr}");
    assert_eq!(fitted, plain);
    // A size in bytes; a size in bytes and in blocks at once is refused, as is a share
    // outside (0, 1].
    let sized = plus(&args, &["--kv-cache-bytes", "2097152"]);
    let (ok, out, stderr) = generate(&sized);
    assert!(ok && kv_blocks(&stderr) == 64, "{stderr}");
    assert_eq!(out, plain);
    let both = plus(&sized, &["--num-gpu-blocks", "64"]);
    let (ok, _, stderr) = generate(&both);
    assert!(!ok && stderr.contains("--num-gpu-blocks"), "{stderr}");
    let share = plus(&args, &["--kv-memory-fraction", "1.5"]);
    let (ok, _, stderr) = generate(&share);
    assert!(!ok && stderr.contains("kv_memory_fraction 1.5"), "{stderr}");
}

#[test]
fn a_step_budget_changes_no_output_and_an_impossible_one_is_refused() {
    if skip() {
        return;
    }
    let dir = common::shipped_model();
    let args = [
        "--model",
        &dir,
        "--prompt",
        "Once upon a time there was a little bird who",
        "--max-tokens",
        "16",
        "--temperature",
        "0",
    ];
    let (ok, plain, stderr) = generate(&args);
    assert!(ok, "{stderr}");
    let paced = plus(&args, &["--max-step-ms", "0.5"]);
    let (ok, out, stderr) = generate(&paced);
    assert!(ok, "{stderr}");
    assert_eq!(out, plain);
    for bad in ["0", "-3", "soon"] {
        let mut a = args.to_vec();
        let given = format!("--max-step-ms={bad}");
        a.push(&given);
        let (ok, _, stderr) = generate(&a);
        assert!(!ok && stderr.contains("--max-step-ms"), "{bad}: {stderr}");
    }
}

#[test]
fn kv_dtypes_report_their_capacity_and_unknown_ones_are_refused() {
    if skip() {
        return;
    }
    let dir = &common::shipped_model();
    // 4 layers x 2 KV heads x 64 values, K and V: 2048 bytes a token in f16; int4 codes with
    // an f16 scale per 32 values take 4.5 bits a value: 576 bytes.
    for (dtype, bytes) in [("f16", 2048), ("int8", 1056), ("int4", 576)] {
        let (ok, stdout, stderr) = generate(&[
            "--model",
            dir,
            "--prompt",
            "The sea",
            "--max-tokens",
            "4",
            "--kv-dtype",
            dtype,
            "--num-gpu-blocks",
            "40",
            "--stats",
        ]);
        assert!(ok && !stdout.is_empty(), "{dtype}: {stderr}");
        let want = format!(
            "KV cache:               {dtype}, {bytes} bytes/token, 40 blocks hold 640 tokens"
        );
        assert!(stderr.contains(&want), "{dtype}: no {want:?} in {stderr}");
    }
    let (ok, _, stderr) = generate(&["--model", dir, "--prompt", "x", "--kv-dtype", "int9"]);
    assert!(
        !ok && stderr.contains("int9") && stderr.contains("int8"),
        "{stderr}"
    );
}

#[test]
fn an_installed_binary_without_its_model_says_where_it_looked() {
    // The binary copied away from the checkout and run elsewhere: no path compiled into it
    // is used; the error names the places searched and the ways to give a model.
    let dir = std::env::temp_dir().join(format!("pagellm-installed-{}", std::process::id()));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("pagellm");
    std::fs::copy(env!("CARGO_BIN_EXE_pagellm"), &exe).unwrap();
    for sub in ["generate", "serve", "perplexity"] {
        let mut cmd = Command::new(&exe);
        cmd.arg(sub)
            .current_dir(&dir)
            .env_remove("PAGELLM_MODEL")
            .env("RUST_BACKTRACE", "0");
        match sub {
            "generate" => cmd.args(["--prompt", "hi"]),
            "perplexity" => cmd.args(["--file", "/dev/null"]),
            _ => cmd.args(["--port", "0"]),
        };
        // A test spawning a process while the copy was still open for writing hands the
        // child that file descriptor, and until the child execs, running the copy fails
        // with "text file busy"; it passes within moments.
        let mut tries = 0;
        let out = loop {
            match cmd.output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.unwrap(),
            }
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sub}: {err}");
        assert!(
            err.contains("no --model given")
                && err.contains("PAGELLM_MODEL")
                && err.contains(&bin.join("models/fortunes-llama").display().to_string()),
            "{sub}: {err}"
        );
        let root = common::repo_root().display().to_string();
        assert!(!err.contains(&root), "{sub}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--json` output's first text, for a run that must succeed.
fn first_text(args: &[&str]) -> String {
    let (ok, stdout, stderr) = generate(args);
    assert!(ok, "{args:?}: {stderr}");
    let row: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    row["outputs"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn constraint_flags_shape_the_output_and_a_failing_line_fails_alone() {
    if skip() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("pagellm-cli-constraints-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 12},
                       "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["word", "n"], "additionalProperties": false
    });
    let schema_file = tmp.join("schema.json");
    std::fs::write(&schema_file, schema.to_string()).unwrap();
    let grammar_file = tmp.join("sum.lark");
    std::fs::write(&grammar_file, "start: NUM (\"+\" NUM)*\nNUM: /[1-9]/\n").unwrap();
    let (schema_path, grammar_path) = (
        schema_file.to_str().unwrap(),
        grammar_file.to_str().unwrap(),
    );
    // The shipped model writes nonsense; the constraint is what makes each output valid.
    let base = [
        "--prompt",
        "Fortune:",
        "--temperature",
        "1",
        "--json",
        "--max-tokens",
        "120",
    ];
    let validator = jsonschema::validator_for(&schema).unwrap();
    let code = regex::Regex::new("^[a-z]{3}-[0-9]{2}$").unwrap();
    let sum = regex::Regex::new(r"^[1-9](\+[1-9])*$").unwrap();
    for seed in ["1", "2", "3"] {
        let run = |extra: &[&str]| {
            let args: Vec<&str> = base
                .iter()
                .chain(&["--seed", seed])
                .chain(extra)
                .copied()
                .collect();
            first_text(&args)
        };
        let text = run(&["--json-schema", schema_path]);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(validator.is_valid(&v), "{text}");
        let text = run(&["--choice", "heads,tails,edge"]);
        assert!(
            ["heads", "tails", "edge"].contains(&text.as_str()),
            "{text}"
        );
        let text = run(&["--regex", "[a-z]{3}-[0-9]{2}"]);
        assert!(code.is_match(&text), "{text}");
        let text = run(&["--grammar", grammar_path]);
        assert!(sum.is_match(&text), "{text}");
    }
    // Two constraints at once are refused before anything loads.
    let (ok, _, stderr) = generate(&["--prompt", "x", "--regex", "a", "--choice", "a,b"]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
    // A file whose bad lines fail alone, each on its own output line, in input order.
    let long = "word ".repeat(3000);
    let lines = [
        serde_json::json!({"prompt": "A", "choice": ["yes", "no"], "temperature": 1, "seed": 2}),
        serde_json::json!({"prompt": "B", "regex": "[unclosed"}),
        serde_json::json!({"prompt": "C", "temperature": -1}),
        serde_json::json!({"prompt": long, "max_tokens": 4}),
        serde_json::json!({"prompt": "D", "regex": "[0-9]{4}", "temperature": 1, "seed": 4}),
        serde_json::json!({"prompt": "E", "json_schema": schema, "choice": ["a"]}),
    ];
    let file = tmp.join("requests.jsonl");
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let (ok, stdout, stderr) = generate(&["--prompts-file", file.to_str().unwrap(), "--json"]);
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(!ok, "a failed line makes the exit status non-zero");
    assert!(stderr.contains("4 of 6 requests failed"), "{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    let text = |i: usize| rows[i]["outputs"][0]["text"].as_str().unwrap().to_string();
    assert!(["yes", "no"].contains(&text(0).as_str()), "{:?}", rows[0]);
    assert!(
        regex::Regex::new("^[0-9]{4}$").unwrap().is_match(&text(4)),
        "{:?}",
        rows[4]
    );
    for (i, needle) in [
        (1, "regex"),
        (2, "temperature"),
        (3, "context"),
        (5, "at most one"),
    ] {
        assert_eq!(rows[i]["line"], i + 1, "{:?}", rows[i]);
        let msg = rows[i]["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "line {}: {msg}", i + 1);
    }
}

#[test]
fn speculative_decoding_keeps_the_output_and_reports_its_acceptance() {
    if skip() {
        return;
    }
    let dir = &common::shipped_model();
    let prompt = "Never trust a man who says never. Never trust a man who says never. Never";
    let base = [
        "--model",
        dir,
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "60",
        "--ignore-eos",
    ];
    let (ok, plain, stderr) = generate(&base);
    assert!(ok, "{stderr}");
    let mut spec = base.to_vec();
    spec.extend([
        "--speculative",
        "ngram",
        "--num-speculative-tokens",
        "5",
        // A fixed cost, so that whether proposals are made does not hang on timing (a
        // loaded machine measured rows dear enough to switch them off once).
        "--speculative-row-cost",
        "0",
        "--stats",
    ]);
    let (ok, fast, stderr) = generate(&spec);
    assert!(ok, "{stderr}");
    assert_eq!(fast, plain, "speculation changed the output");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("speculative decoding:"))
        .unwrap_or_else(|| panic!("no speculation statistics in {stderr}"));
    let accepted: u64 = line
        .split(',')
        .nth(1)
        .and_then(|p| p.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no accepted count in {line}"));
    assert!(accepted > 0, "{line}");
    // A draft model (here the model itself, so its greedy proposals are the target's
    // arg-max): the same text, and proposals accepted.
    let mut drafted = base.to_vec();
    let with_draft = format!("draft:{dir}");
    drafted.extend([
        "--speculative",
        &with_draft,
        "--speculative-row-cost",
        "0",
        "--stats",
    ]);
    let (ok, text, stderr) = generate(&drafted);
    assert!(ok, "{stderr}");
    assert_eq!(text, plain, "draft speculation changed the output");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("speculative decoding:"))
        .unwrap_or_else(|| panic!("no speculation statistics in {stderr}"));
    assert!(!line.contains(" 0 accepted"), "{line}");
    // What cannot run is a clear error.
    let mut draft = base.to_vec();
    draft.extend(["--speculative", "draft:/some/model"]);
    let (ok, _, stderr) = generate(&draft);
    assert!(
        !ok && stderr.contains("draft model /some/model"),
        "{stderr}"
    );
    let mut cost = base.to_vec();
    cost.extend(["--speculative", "ngram", "--speculative-row-cost", "1.5"]);
    let (ok, _, stderr) = generate(&cost);
    assert!(!ok && stderr.contains("between 0 and 1"), "{stderr}");
    let mut orphan = base.to_vec();
    orphan.extend(["--num-speculative-tokens", "3"]);
    let (ok, _, stderr) = generate(&orphan);
    assert!(!ok && stderr.contains("--speculative"), "{stderr}");
    let mut range = base.to_vec();
    range.extend([
        "--speculative",
        "ngram",
        "--ngram-min",
        "3",
        "--ngram-max",
        "2",
    ]);
    let (ok, _, stderr) = generate(&range);
    assert!(!ok && stderr.contains("n-gram sizes"), "{stderr}");
    let mut zero = base.to_vec();
    zero.extend(["--speculative", "ngram", "--num-speculative-tokens", "0"]);
    let (ok, _, stderr) = generate(&zero);
    assert!(!ok && stderr.contains("num-speculative-tokens"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_second_run_reads_the_prompt_from_the_disk_tier() {
    if skip() {
        return;
    }
    let dir = &common::shipped_model();
    let cache = tempfile::TempDir::new().unwrap();
    let cache_dir = cache.path().to_string_lossy().into_owned();
    let prompt = "A wise man once said that the road to wisdom is paved with fortune cookies, \
                  and that every cookie holds a fortune for someone who reads it slowly.";
    let args = [
        "--model",
        dir,
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--stats",
    ];
    let (ok, plain, stderr) = generate(&args);
    assert!(ok, "{stderr}");
    let mut tiered = args.to_vec();
    tiered.extend(["--kv-cache-dir", &cache_dir, "--block-size", "4"]);
    // "disk tier: H hits, M misses, C corrupt, W written, ...": the count before `what`.
    let count = |stderr: &str, what: &str| -> u64 {
        let line = stderr
            .lines()
            .find(|l| l.starts_with("disk tier:"))
            .unwrap_or_else(|| panic!("no disk tier statistics in {stderr}"));
        line.trim_start_matches("disk tier:")
            .split(',')
            .find(|p| p.trim_end().ends_with(what))
            .and_then(|p| p.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {what} count in {line}"))
    };
    let (ok, first, stderr) = generate(&tiered);
    assert!(ok, "{stderr}");
    assert_eq!(first, plain, "the disk tier changed the output");
    assert!(count(&stderr, "written") > 0, "nothing written: {stderr}");
    let (ok, second, stderr) = generate(&tiered);
    assert!(ok, "{stderr}");
    assert_eq!(second, plain, "a run from the disk tier changed the output");
    let hits = count(&stderr, "hits");
    assert!(hits > 5, "the second run read nothing from disk: {stderr}");
    // A folder that cannot be made is a clear error; the disk budget needs a folder.
    let blocked = cache.path().join("a-file");
    std::fs::write(&blocked, b"x").unwrap();
    let below = blocked.join("kv").to_string_lossy().into_owned();
    let mut bad = args.to_vec();
    bad.extend(["--kv-cache-dir", &below]);
    let (ok, _, stderr) = generate(&bad);
    assert!(!ok && stderr.contains("KV cache folder"), "{stderr}");
    let mut orphan = args.to_vec();
    orphan.extend(["--kv-cache-disk-bytes", "1000"]);
    let (ok, _, stderr) = generate(&orphan);
    assert!(!ok && stderr.contains("--kv-cache-dir"), "{stderr}");
}

#[test]
fn stats_show_the_kv_cache_groups_of_a_model_mixing_windowed_and_global_layers() {
    if skip() {
        return;
    }
    let dir = golden::fixture_dir("gemma3-local-rope")
        .to_string_lossy()
        .into_owned();
    let (ok, _, stderr) = generate(&[
        "--model",
        &dir,
        "--prompt",
        "The quick brown fox jumps over the lazy dog again and again",
        "--max-tokens",
        "40",
        "--ignore-eos",
        "--block-size",
        "4",
        "--stats",
    ]);
    assert!(ok, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("KV cache groups:"))
        .unwrap_or_else(|| panic!("no groups line: {stderr}"));
    assert!(
        line.contains("3 of 1 layer(s) per block: global, window 8, window 8"),
        "{line}"
    );
    let released: u64 = line
        .split(';')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(released > 0, "{line}");
}

#[test]
fn stats_count_a_mixtures_expert_bytes() {
    if skip() {
        return;
    }
    // mixtral-moe: 2 layers of 4 experts, each a gate, an up and a down of 64 x 48 in f32:
    // 294,912 bytes, 0.28 MiB; a token runs 2 of the 4.
    let dir = golden::fixture_dir("mixtral-moe")
        .to_string_lossy()
        .into_owned();
    let (ok, _, stderr) = generate(&[
        "--model",
        &dir,
        "--prompt",
        "Hi",
        "--max-tokens",
        "2",
        "--stats",
    ]);
    assert!(ok, "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("model:"))
        .unwrap_or_else(|| panic!("no model line in {stderr}"));
    let numbers: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches([',', ';']).parse().ok())
        .collect();
    let [total, experts, reads] = numbers[..] else {
        panic!("{line}")
    };
    assert_eq!(experts, 0.3, "{line}");
    assert!((total - experts / 2.0 - reads).abs() < 0.06, "{line}");
}

/// The `(N tokens in S steps` of a `--stats` throughput line starting with `label`.
fn throughput_counts(stderr: &str, label: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in {stderr}"));
    let inner = line.split('(').nth(1).unwrap_or_else(|| panic!("{line}"));
    let words: Vec<&str> = inner.split_whitespace().collect();
    (words[0].parse().unwrap(), words[3].parse().unwrap())
}

#[test]
fn stats_report_throughput_and_warmup_leaves_its_run_out() {
    if skip() {
        return;
    }
    let args = [
        "--prompt",
        "The sea",
        "--max-tokens",
        "9",
        "--ignore-eos",
        "--temperature",
        "0",
        "--json",
        "--stats",
    ];
    let (ok, cold, cold_err) = generate(&args);
    assert!(ok, "{cold_err}");
    let (ok, warm, warm_err) = generate(&plus(&args, &["--warmup"]));
    assert!(ok, "{warm_err}");
    let row: Value = serde_json::from_str(cold.lines().next().unwrap()).unwrap();
    let warm_row: Value = serde_json::from_str(warm.lines().next().unwrap()).unwrap();
    // The warm-up changes no output (it runs under a cache salt of its own).
    assert_eq!(
        row["outputs"][0]["token_ids"],
        warm_row["outputs"][0]["token_ids"]
    );
    let prompt = row["prompt_token_ids"].as_array().unwrap().len() as u64;
    // One prefill step computes the prompt (and samples the first token); each of the other
    // eight tokens is a decode step of one row, with or without a warm-up before them.
    for stderr in [&cold_err, &warm_err] {
        assert_eq!(
            throughput_counts(stderr, "prefill throughput:"),
            (prompt, 1),
            "{stderr}"
        );
        assert_eq!(
            throughput_counts(stderr, "decode throughput:"),
            (8, 8),
            "{stderr}"
        );
    }
    assert!(
        warm_err.contains("the warm-up run not counted"),
        "{warm_err}"
    );
    assert!(
        !cold_err.contains("the warm-up run not counted"),
        "{cold_err}"
    );
}
