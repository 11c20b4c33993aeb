//! What constrained decoding costs, measured side by side in one run.
//!
//! 1. Compile and mask time on the CPU, per kind of constraint (a JSON schema, any JSON
//!    object, a regex, a choice among 20 strings, a Lark grammar), over three byte-level
//!    BPE vocabularies: the shipped model's 2,048 tokens and two grown from it to 32,000
//!    and 128,256 tokens (the sizes of Llama 2's and Llama 3's) by random merges of
//!    existing tokens up to 12 characters, so the token trie is as wide as a real one. The
//!    vocabulary's setup (`Compiler::new`: token trie and lexer slices) is timed once;
//!    `Compiler::compile` is the median of five. Masks are timed along random walks (each
//!    step one uniformly random allowed token, restarting when the output is complete):
//!    `Constraint::prepare` (llguidance computing the mask) and `Constraint::apply` (our
//!    loop setting a logits row to -inf outside it) per token, mean and 99th percentile.
//! 2. Engine decode throughput on the shipped model: 16 requests at temperature 1 (seeded,
//!    64 tokens each, `ignore_eos`), once unconstrained and once with every request held to
//!    a JSON schema (an array of at least 64 records, so no output completes early). Both
//!    engines hold their requests at once and step in turn, so drift hits both alike; the
//!    decode steps after the first token are timed. Ratio: constrained over unconstrained
//!    tokens per second (target: at least 0.95).
//!
//! Run: `cargo bench --bench structured` (`-- --quick` for short walks and one vocabulary
//! fewer; adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`; `-- --cpu` runs section 1
//! only, without a GPU).

#[path = "common/mod.rs"]
mod common;
use common::TempDir;

use pagellm::internals::constrain::{Compiler, StructuredOutput};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::sampling::SamplingParams;
use pagellm::internals::tokenizer::Tokenizer;
use pagellm::GpuContext;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SHIPPED: &str = "models/fortunes-llama";
const SEQS: usize = 16;
const TOKENS: usize = 64;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The schema both sections use: many small records, with strings, bounded integers, an
/// enum, a boolean and a nested array.
fn schema() -> Value {
    json!({
        "type": "array",
        "minItems": 64,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "mood": {"enum": ["good", "bad", "strange"]},
                "member": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
            },
            "required": ["name", "age", "mood"],
            "additionalProperties": false
        }
    })
}

fn kinds() -> Vec<StructuredOutput> {
    let choices = (0..20)
        .map(|i| format!("option number {i} of twenty"))
        .collect();
    vec![
        StructuredOutput::JsonSchema(schema()),
        StructuredOutput::JsonObject,
        StructuredOutput::Regex(r"([A-Z][a-z]{2,8} (is|was) [0-9]{1,3}(\.[0-9]+)?[,;] )+".into()),
        StructuredOutput::Choice(choices),
        StructuredOutput::Grammar(
            "start: sum\nsum: term ((\"+\" | \"-\") term)*\n\
             term: NUMBER | \"(\" sum \")\"\nNUMBER: /[1-9][0-9]*/\n"
                .into(),
        ),
    ]
}

// ---------------------------------------------------------------------------------------
// Vocabularies
// ---------------------------------------------------------------------------------------

/// The shipped tokenizer with its vocabulary grown to `size` tokens: each new token joins
/// two existing ones (recorded as a merge, so the file stays a valid BPE) into at most 12
/// characters; the second part is drawn from the shipped tokens half the time, which keeps
/// the lengths spread as in a trained vocabulary.
fn grown_tokenizer(size: usize) -> (TempDir, Tokenizer) {
    let src = Path::new(SHIPPED);
    let tmp = common::temp_dir(&format!("vocab-{size}"));
    let dir = tmp.0.clone();
    let text = std::fs::read_to_string(src.join("tokenizer.json")).expect("tokenizer.json");
    let mut t: Value = serde_json::from_str(&text).expect("tokenizer json");
    let vocab: HashMap<String, u64> =
        serde_json::from_value(t["model"]["vocab"].clone()).expect("vocab");
    let mut by_id: Vec<(u64, String)> = vocab.iter().map(|(k, &v)| (v, k.clone())).collect();
    by_id.sort();
    let specials = 3;
    let mut tokens: Vec<String> = by_id.into_iter().map(|(_, s)| s).collect();
    let base = tokens.len();
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = t["model"]["merges"].as_array().expect("merges").clone();
    let mut rng = ChaCha8Rng::seed_from_u64(size as u64);
    while tokens.len() < size {
        let a = &tokens[rng.random_range(specials..tokens.len())];
        let hi = if rng.random_bool(0.5) {
            base
        } else {
            tokens.len()
        };
        let b = &tokens[rng.random_range(specials..hi)];
        let joined = format!("{a}{b}");
        if joined.chars().count() > 12 || b.starts_with('Ġ') && rng.random_bool(0.7) {
            continue;
        }
        if seen.insert(joined.clone()) {
            merges.push(json!([a, b]));
            tokens.push(joined);
        }
    }
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), json!(i)))
        .collect();
    t["model"]["vocab"] = Value::Object(vocab);
    t["model"]["merges"] = Value::Array(merges);
    std::fs::write(dir.join("tokenizer.json"), t.to_string()).expect("write tokenizer.json");
    for f in ["tokenizer_config.json", "generation_config.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy tokenizer files");
        }
    }
    let tok = Tokenizer::from_dir(&dir).expect("the grown tokenizer loads");
    assert_eq!(tok.vocab_size(), size, "grown vocabulary size");
    (tmp, tok)
}

// ---------------------------------------------------------------------------------------
// 1. Compile and mask time
// ---------------------------------------------------------------------------------------

struct MaskTimes {
    compile: Duration,
    prepare: Vec<Duration>,
    apply: Vec<Duration>,
}

/// Times `spec` on `compiler`: five compiles, then random walks until `tokens` masks.
fn time_kind(
    compiler: &Compiler,
    spec: &StructuredOutput,
    vocab: usize,
    tokens: usize,
) -> MaskTimes {
    let compiles: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            compiler.compile(spec).expect("compile");
            start.elapsed()
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut row = vec![0.0f32; vocab];
    let (mut prepare, mut apply) = (Vec::new(), Vec::new());
    let mut c = compiler.compile(spec).expect("compile");
    while prepare.len() < tokens {
        if c.is_finished() {
            c = compiler.compile(spec).expect("compile");
        }
        let start = Instant::now();
        c.prepare().expect("mask");
        prepare.push(start.elapsed());
        row.fill(0.0);
        let start = Instant::now();
        c.apply(&mut row).expect("apply");
        apply.push(start.elapsed());
        let allowed: Vec<u32> = (0..vocab as u32)
            .filter(|&i| row[i as usize].is_finite())
            .collect();
        let token = allowed[rng.random_range(0..allowed.len())];
        // An end-of-sequence id is allowed once the output may end: start over.
        if c.accept(token).is_err() || c.is_finished() {
            c = compiler.compile(spec).expect("compile");
        }
    }
    MaskTimes {
        compile: median(compiles),
        prepare,
        apply,
    }
}

fn mean_p99(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let mean = v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64;
    (mean, us(v[(v.len() * 99 / 100).min(v.len() - 1)]))
}

fn masks(quick: bool) {
    let sizes: &[usize] = if quick {
        &[2048, 32000]
    } else {
        &[2048, 32000, 128256]
    };
    let tokens = if quick { 64 } else { 400 };
    println!(
        "| vocabulary | kind | compile (ms) | mask mean (us) | mask p99 (us) | apply mean (us) | tokens |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for &size in sizes {
        let (_tmp, tok) = if size == 2048 {
            let t = Tokenizer::from_dir(Path::new(SHIPPED)).expect("shipped tokenizer");
            (None, t)
        } else {
            let (d, t) = grown_tokenizer(size);
            (Some(d), t)
        };
        let start = Instant::now();
        let compiler = Compiler::new(Arc::new(tok), size).expect("compiler");
        let setup = start.elapsed();
        println!(
            "| {size} | (setup: token trie) | {:.1} | | | | |",
            setup.as_secs_f64() * 1e3
        );
        for spec in kinds() {
            let t = time_kind(&compiler, &spec, size, tokens);
            let n = t.prepare.len();
            let (pm, p99) = mean_p99(t.prepare);
            let (am, _) = mean_p99(t.apply);
            println!(
                "| {size} | {} | {:.2} | {pm:.1} | {p99:.1} | {am:.1} | {n} |",
                spec.kind(),
                t.compile.as_secs_f64() * 1e3
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. Engine decode throughput
// ---------------------------------------------------------------------------------------

fn params(seed: u64, constrained: bool) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: TOKENS,
        ignore_eos: true,
        structured_output: constrained.then(|| StructuredOutput::JsonSchema(schema())),
        ..SamplingParams::default()
    }
}

/// Median decode step of each engine, stepped in turn over `rounds` rounds.
fn decode(ctx: &Arc<GpuContext>, rounds: usize) -> [Duration; 2] {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(SHIPPED);
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let mut engines: Vec<Engine> = (0..2)
            .map(|_| {
                Engine::with_context(ctx.clone(), &dir, EngineConfig::default(), |_, _| {})
                    .expect("engine")
            })
            .collect();
        let mut handles = Vec::new();
        for (k, e) in engines.iter_mut().enumerate() {
            for i in 0..SEQS {
                let seed = (round * SEQS + i) as u64;
                let p = params(seed, k == 1);
                let prompt = Prompt::Text(format!("Record {i}:"));
                handles.push(e.add_request(prompt, p).expect("add"));
            }
        }
        // The first step prefills every prompt and samples the first tokens.
        common::alternate_steps(&mut engines, 1, &mut times);
        for h in handles {
            let out = h.wait().expect("request");
            assert_eq!(
                out.outputs[0].token_ids.len(),
                TOKENS,
                "every request runs to max_tokens"
            );
        }
    }
    let [a, b] = times;
    [median(a), median(b)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let cpu_only = args.iter().any(|a| a == "--cpu");
    println!("# Constrained decoding");
    println!();
    println!("## 1. Compile and mask time (CPU)");
    println!();
    masks(quick);
    println!();
    if cpu_only {
        return;
    }
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    println!("## 2. Decode throughput, {SEQS} sequences, shipped model");
    println!();
    println!("adapter: {}", ctx.describe());
    println!();
    let [free, held] = decode(&ctx, if quick { 1 } else { 3 });
    let tps = |d: Duration| SEQS as f64 / d.as_secs_f64();
    println!("| requests | decode step (ms) | tokens/s |");
    println!("|---|---:|---:|");
    println!(
        "| unconstrained | {:.3} | {:.0} |",
        free.as_secs_f64() * 1e3,
        tps(free)
    );
    println!(
        "| JSON schema | {:.3} | {:.0} |",
        held.as_secs_f64() * 1e3,
        tps(held)
    );
    println!();
    println!(
        "constrained / unconstrained throughput: {:.3} (target >= 0.95)",
        tps(held) / tps(free)
    );
}
