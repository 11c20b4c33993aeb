//! The transformers reference checkpoints of tests/fixtures and what transformers computed
//! for them (expected.json: prompt ids, prompt logits, 16 greedy tokens, top-5 logprobs).
//!
//! Tolerances, measured against transformers' own numbers: for the float32 checkpoints our
//! logits and logprobs agree to ~2e-5, so we require 1e-3. For the float16/bfloat16
//! checkpoints transformers' outputs deviate from an f32 computation of the same weights
//! once attention mixes several positions (single-token prompts agree to 1e-5; longer ones
//! by up to 0.064 in logits and 0.045 in logprobs), so we require 0.1 there. The fixtures
//! written by tools/make_fixtures.py were computed by transformers in float32 from their
//! on-disk weights whatever those are (`"compute_dtype": "float32"` in expected.json); they
//! agree to ~1e-4 and get 1e-3 too. Greedy tokens must match exactly everywhere.

use pagellm::internals::kernels::WeightDtype;
use pagellm::internals::model::{spec, ModelFiles};
use serde_json::Value;
use std::path::PathBuf;

pub const NAMES: [&str; 17] = [
    "llama-gqa",
    "qwen2-bias-tied",
    "mistral-f16",
    "llama3-rope-scaled",
    // Written by tools/make_fixtures.py.
    "llama-bias-mha",
    "qwen2-sharded-untied",
    "llama-odd-heads",
    "llama-tf4-config",
    // More families, with sliding windows of 8 tokens that the long prompt crosses.
    "qwen3-qknorm-window",
    "gemma2-softcap-window",
    "gemma3-local-rope",
    "phi3-longrope-window",
    // YaRN rope scaling.
    "llama-yarn",
    // Mixtures of experts (Qwen3-MoE with a dense layer between two sparse ones).
    "mixtral-moe",
    "qwen3-moe-dense-layer",
    // gpt-oss: attention sinks, alternating windows, YaRN, biased router and experts.
    "gpt-oss-sinks-moe",
    // The same as released: its experts' weights MXFP4 blocks and scales.
    "gpt-oss-mxfp4",
];

/// The fixtures whose MLPs are mixtures of experts. Their random routers pick experts by
/// margins of 0.014 (qwen3-moe-dense-layer), 0.036 (mixtral-moe), 0.012
/// (gpt-oss-sinks-moe) and 0.013 (gpt-oss-mxfp4) between a token's last chosen and first other expert's logits:
/// enough for f16 and f32 caches, not for the errors of an int8 cache, which move the hidden
/// states by more and flip choices.
pub const MOE: [&str; 4] = [
    "mixtral-moe",
    "qwen3-moe-dense-layer",
    "gpt-oss-sinks-moe",
    "gpt-oss-mxfp4",
];

pub struct Case {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    /// Per greedy step, the five most likely (token, logprob).
    pub top5: Vec<Vec<(u32, f64)>>,
    /// `[prompt_len][vocab]`.
    pub prompt_logits: Vec<Vec<f32>>,
}

pub struct Fixture {
    pub name: &'static str,
    pub dir: PathBuf,
    pub files: ModelFiles,
    pub cases: Vec<Case>,
    pub logit_tol: f32,
    pub logprob_tol: f64,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn fixture_dir(name: &str) -> PathBuf {
    super::repo_root().join("tests/fixtures").join(name)
}

/// [`fixture_dir`] as a command-line argument.
pub fn fixture_arg(name: &str) -> String {
    fixture_dir(name).to_string_lossy().into_owned()
}

pub fn load(name: &'static str) -> Fixture {
    let dir = fixture_dir(name);
    let files = ModelFiles::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let cases = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: c["prompt"].as_str().unwrap_or_default().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            greedy_ids: ids(&c["greedy_ids"]),
            top5: c["top5"]
                .as_array()
                .unwrap()
                .iter()
                .map(|step| {
                    step.as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
                        .collect()
                })
                .collect(),
            prompt_logits: c["prompt_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect(),
        })
        .collect();
    let f32_weights = files.checkpoint.get(spec::EMBED).unwrap().dtype == WeightDtype::F32;
    let f32_compute = f32_weights || v["compute_dtype"].as_str() == Some("float32");
    Fixture {
        name,
        dir,
        files,
        cases,
        logit_tol: if f32_compute { 1e-3 } else { 0.1 },
        logprob_tol: if f32_compute { 1e-3 } else { 0.1 },
    }
}

pub fn all() -> Vec<Fixture> {
    NAMES.iter().map(|n| load(n)).collect()
}

/// Asserts `got` (`[positions][vocab]`) is within the fixture's tolerance of transformers';
/// returns the largest deviation.
#[track_caller]
pub fn check_logits(f: &Fixture, case: &Case, got: &[Vec<f32>], what: &str) -> f32 {
    assert_eq!(got.len(), case.prompt_logits.len(), "{what}: positions");
    let mut worst = 0.0f32;
    for (pos, (g, w)) in got.iter().zip(&case.prompt_logits).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: vocabulary at position {pos}");
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            worst = worst.max((a - b).abs());
            assert!(
                (a - b).abs() <= f.logit_tol,
                "{} {what} {:?}: logit of token {i} at position {pos} is {a}, transformers {b} (tolerance {})",
                f.name,
                case.prompt,
                f.logit_tol
            );
        }
    }
    worst
}

/// Asserts the logprobs of transformers' top-5 tokens at greedy step `step`; returns the
/// largest deviation.
#[track_caller]
pub fn check_top5(f: &Fixture, case: &Case, step: usize, logprobs: &[f64], what: &str) -> f64 {
    let mut worst = 0.0f64;
    for &(id, want) in &case.top5[step] {
        let got = logprobs[id as usize];
        worst = worst.max((got - want).abs());
        assert!(
            (got - want).abs() <= f.logprob_tol,
            "{} {what} {:?} step {step}: logprob of {id} is {got}, transformers {want} (tolerance {})",
            f.name,
            case.prompt,
            f.logprob_tol
        );
    }
    worst
}
