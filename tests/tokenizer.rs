//! Loading tokenizer folders: encoding against transformers' own ids (the fixtures'
//! `expected.json`), BOS/EOS resolution across the three config files, and a clear error for
//! every kind of broken folder.

mod common;
use pagellm::internals::tokenizer::{Tokenizer, TokenizerError};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A fresh folder under the target's temp dir holding a copy of the fixture tokenizer.json
/// (unless `with_tokenizer` is false) and the given extra files.
fn temp_model(test: &str, with_tokenizer: bool, files: &[(&str, &str)]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tokenizer-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    if with_tokenizer {
        std::fs::copy(
            fixture("llama-gqa").join("tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
    }
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

#[test]
fn fixture_special_tokens_and_vocab() {
    let tok = Tokenizer::from_dir(&fixture("llama-gqa")).unwrap();
    assert_eq!(tok.bos_token_id(), Some(0));
    assert_eq!(tok.eos_token_ids(), &[1]);
    assert!(tok.is_eos(1) && !tok.is_eos(0));
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!(tok.token_to_id("<s>"), Some(0));
    assert_eq!(tok.token_to_id("</s>"), Some(1));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("</s>"));
    assert_eq!(tok.id_to_token(512), None);
}

#[test]
fn encode_matches_transformers_prompt_ids() {
    for name in common::golden::NAMES {
        let dir = fixture(name);
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let cases = expected["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let prompt = case["prompt"].as_str().unwrap();
            let want: Vec<u32> = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(prompt).unwrap();
            assert_eq!(got, want, "{name}: encode({prompt:?})");
            assert_eq!(tok.decode(&got, false).unwrap(), prompt, "{name}: decode");
        }
    }
}

#[test]
fn byte_level_vocab_round_trips_any_text() {
    let tok = Tokenizer::from_dir(&fixture("llama-gqa")).unwrap();
    for text in [
        "naïve café 日本語 🙂",
        "tabs\tnewlines\n\r\nnul\0 and \u{7f}",
        "  leading and trailing spaces  ",
        "ẞ Ω ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
}

#[test]
fn decode_keeps_or_skips_special_tokens() {
    let tok = Tokenizer::from_dir(&fixture("llama-gqa")).unwrap();
    let mut ids = vec![0];
    ids.extend(tok.encode("Hello").unwrap());
    ids.push(1);
    assert_eq!(tok.decode(&ids, false).unwrap(), "<s>Hello</s>");
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello");
}

#[test]
fn eos_ids_are_the_union_of_all_files_in_order() {
    let dir = temp_model(
        "union",
        true,
        &[
            (
                "generation_config.json",
                r#"{"bos_token_id": null, "eos_token_id": [1, 5]}"#,
            ),
            ("config.json", r#"{"eos_token_id": 7, "bos_token_id": 3}"#),
            (
                "tokenizer_config.json",
                r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#,
            ),
        ],
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    // BOS: generation_config has null, so config.json's 3 wins over tokenizer_config's <s>.
    assert_eq!(tok.bos_token_id(), Some(3));
    assert_eq!(tok.eos_token_ids(), &[1, 5, 7]);
}

#[test]
fn tokenizer_config_strings_resolve_through_vocabulary() {
    let dir = temp_model(
        "strings",
        true,
        &[(
            "tokenizer_config.json",
            r#"{"bos_token": "<s>", "eos_token": {"content": "</s>", "special": true}}"#,
        )],
    );
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.bos_token_id(), Some(0));
    assert_eq!(tok.eos_token_ids(), &[1]);
}

#[test]
fn folder_without_config_files_has_no_special_ids() {
    let dir = temp_model("bare", true, &[]);
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.bos_token_id(), None);
    assert!(tok.eos_token_ids().is_empty());
    assert_eq!(tok.encode("x").unwrap(), vec![89]);
}

fn load_err(dir: &Path) -> (TokenizerError, String) {
    let err = Tokenizer::from_dir(dir).unwrap_err();
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn missing_tokenizer_json_is_named() {
    let dir = temp_model("missing", false, &[("config.json", "{}")]);
    let (err, msg) = load_err(&dir);
    assert!(
        matches!(err, TokenizerError::MissingTokenizerJson { .. }),
        "{err:?}"
    );
    assert!(msg.contains("no tokenizer.json in"), "{msg}");
    assert!(msg.contains("tokenizer-missing"), "{msg}");
}

#[test]
fn malformed_tokenizer_json_is_named() {
    for (case, text) in [
        ("trunc", r#"{"version": "1.0", "model": {"#),
        ("notatok", r#"{"hello": "world"}"#),
    ] {
        let dir = temp_model(&format!("bad-{case}"), false, &[("tokenizer.json", text)]);
        let (err, msg) = load_err(&dir);
        assert!(
            matches!(err, TokenizerError::InvalidTokenizerJson { .. }),
            "{err:?}"
        );
        assert!(
            msg.contains("tokenizer.json is not a valid tokenizer file"),
            "{msg}"
        );
    }
}

#[test]
fn malformed_config_json_is_named() {
    let dir = temp_model("badjson", true, &[("generation_config.json", "{ eos: 1 ")]);
    let (err, msg) = load_err(&dir);
    assert!(matches!(err, TokenizerError::ConfigJson { .. }), "{err:?}");
    assert!(
        msg.contains("generation_config.json is not valid JSON"),
        "{msg}"
    );
}

#[test]
fn config_that_is_not_an_object_is_named() {
    let dir = temp_model("array", true, &[("config.json", "[1, 2]")]);
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("config.json"), "{msg}");
    assert!(
        msg.contains("must be a JSON object, found an array"),
        "{msg}"
    );
}

#[test]
fn bad_id_fields_are_named() {
    for (case, text) in [
        ("string", r#"{"eos_token_id": "two"}"#),
        ("negative", r#"{"eos_token_id": -1}"#),
        ("float", r#"{"eos_token_id": [1, 2.5]}"#),
        ("huge", r#"{"eos_token_id": 5000000000}"#),
    ] {
        let dir = temp_model(&format!("id-{case}"), true, &[("config.json", text)]);
        let (err, msg) = load_err(&dir);
        assert!(
            matches!(err, TokenizerError::ConfigField { .. }),
            "{case}: {err:?}"
        );
        assert!(msg.contains("config.json"), "{msg}");
        assert!(
            msg.contains("\"eos_token_id\" must hold token ids"),
            "{msg}"
        );
    }
}

#[test]
fn bad_token_fields_are_named() {
    let dir = temp_model(
        "tok-num",
        true,
        &[("tokenizer_config.json", r#"{"bos_token": 0}"#)],
    );
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("tokenizer_config.json"), "{msg}");
    assert!(
        msg.contains("\"bos_token\" must be a token string"),
        "{msg}"
    );

    let dir = temp_model(
        "tok-obj",
        true,
        &[(
            "tokenizer_config.json",
            r#"{"eos_token": {"text": "</s>"}}"#,
        )],
    );
    let (_, msg) = load_err(&dir);
    assert!(
        msg.contains("\"eos_token\" is an object without a \"content\" string"),
        "{msg}"
    );

    let dir = temp_model(
        "tok-unknown",
        true,
        &[("tokenizer_config.json", r#"{"eos_token": "<|eot_id|>"}"#)],
    );
    let (err, msg) = load_err(&dir);
    assert!(
        matches!(err, TokenizerError::UnknownSpecialToken { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("eos_token is \"<|eot_id|>\", which is not in the tokenizer's vocabulary"),
        "{msg}"
    );
}

#[test]
fn unreadable_config_is_named() {
    // A directory where a file should be: exists, but reading it fails.
    let dir = temp_model("unreadable", true, &[]);
    std::fs::create_dir_all(dir.join("generation_config.json")).unwrap();
    let (err, msg) = load_err(&dir);
    assert!(matches!(err, TokenizerError::Read { .. }), "{err:?}");
    assert!(msg.contains("cannot read"), "{msg}");
    assert!(msg.contains("generation_config.json"), "{msg}");
}

mod bytes_per_token {
    use super::fixture;
    use pagellm::internals::tokenizer::Tokenizer;
    use proptest::prelude::*;

    /// The byte-level BPE of the shipped model and fixtures, and the SentencePiece
    /// vocabulary built from a GGUF file (byte fallback).
    fn tokenizers() -> Vec<Tokenizer> {
        let mut t: Vec<Tokenizer> = ["llama-gqa", "qwen2-bias-tied", "gemma3-local-rope"]
            .iter()
            .map(|n| Tokenizer::from_dir(&fixture(n)).unwrap())
            .collect();
        t.push(Tokenizer::from_dir(std::path::Path::new("models/fortunes-llama")).unwrap());
        t.push(
            pagellm::internals::model::open_tokenizer(fixture("gguf/spm-tokenizer.gguf")).unwrap(),
        );
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        // What the server relies on to refuse a prompt unread: no text has fewer tokens than
        // its bytes divided by the bound.
        #[test]
        fn no_token_covers_more_bytes_than_the_bound(text in "\\PC{0,200}|[ \\t\\n]{0,300}|(ab|xyz|\u{3000}|\u{fb00}){0,100}") {
            for tok in tokenizers() {
                let bound = tok.max_bytes_per_token().expect("BPE models have a bound");
                let n = tok.encode_plain(&text).unwrap().len();
                prop_assert!(n * bound >= text.len(), "{n} tokens x {bound} < {} bytes", text.len());
            }
        }
    }

    #[test]
    fn a_model_that_fuses_unknown_text_has_no_bound() {
        use tokenizers::models::wordlevel::WordLevel;
        let vocab = [("a".to_string(), 0u32), ("[UNK]".to_string(), 1)];
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let tok = Tokenizer::from_parts(tokenizers::Tokenizer::new(model), Default::default());
        assert_eq!(tok.max_bytes_per_token(), None);
    }
}
