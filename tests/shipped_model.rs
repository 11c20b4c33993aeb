//! The model that ships in models/fortunes-llama, and its 2-layer draft in
//! models/fortunes-draft: each loads, and pagellm's greedy tokens equal what transformers
//! produced for it when it was trained (expected.json, written by
//! tools/train_tiny_model.py from the saved folder computed in float32).

mod common;
use common::{arc, contexts};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::pool::KvDtype;
use pagellm::internals::sampling::SamplingParams;
use serde_json::Value;
use std::path::Path;

#[test]
fn shipped_model_matches_transformers_greedy_tokens() {
    greedy_tokens_with(KvDtype::F32);
}

#[test]
fn shipped_draft_model_matches_transformers_greedy_tokens() {
    greedy_tokens_of("models/fortunes-draft", KvDtype::F32);
}

/// A trained model's decisions have margins (expected.json's `min_top2_logit_gap`) that an
/// 8-bit cache does not cross, and on this model neither does a 4-bit one.
#[test]
fn shipped_model_greedy_tokens_with_quantized_caches() {
    greedy_tokens_with(KvDtype::Int8);
    greedy_tokens_with(KvDtype::Int4);
}

fn greedy_tokens_with(kv_dtype: KvDtype) {
    greedy_tokens_of("models/fortunes-llama", kv_dtype);
}

fn greedy_tokens_of(model: &str, kv_dtype: KvDtype) {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(model);
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let cfg = EngineConfig {
        kv_dtype,
        ..EngineConfig::default()
    };
    let mut e = Engine::with_context(arc(ctx), &dir, cfg, |_, _| {}).unwrap();
    let ids = common::json_ids;
    let cases = expected["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let h = e
            .add_request(
                Prompt::Text(prompt.to_string()),
                SamplingParams {
                    max_tokens: 16,
                    ignore_eos: true,
                    ..SamplingParams::greedy()
                },
            )
            .unwrap();
        e.run_to_completion().unwrap();
        let out = h.wait().unwrap();
        assert_eq!(
            out.prompt_token_ids,
            ids(&case["prompt_ids"]),
            "{prompt:?}: tokenization"
        );
        assert_eq!(
            out.outputs[0].token_ids,
            ids(&case["greedy_ids"]),
            "{prompt:?}: greedy tokens with a {kv_dtype} cache"
        );
    }
}
