//! Tokenizers built from GGUF metadata (`pagellm::internals::gguf::tokenizer`) against the model's own
//! `tokenizer.json`:
//!
//! - the fixtures converted by llama.cpp's converter (tests/fixtures/gguf) encode and decode
//!   every text below exactly as their folders' `tokenizer.json` does, special tokens
//!   included, with the same BOS and EOS;
//! - run with `--ignored` and `PAGELLM_GGUF_VOCAB_DIR` pointing at llama.cpp's `models/` folder (its
//!   `ggml-vocab-*.gguf` files with their `.inp`/`.out` cases, 16 MB, not committed here),
//!   the Llama 3, Qwen2, GPT-2 (byte-level BPE) and Llama 2 (SentencePiece) vocabularies
//!   tokenize llama.cpp's test cases as llama.cpp does.

#[path = "common/converted.rs"]
mod converted;
use converted::CONVERTED;
use pagellm::internals::gguf::file::GgufFile;
use pagellm::internals::gguf::tokenizer::tokenizer;
use pagellm::internals::tokenizer::Tokenizer;
use std::path::Path;

const TEXTS: [&str; 12] = [
    "Hello world",
    " leading space and  two   gaps",
    "don't stop; we'll see what they've done",
    "numbers 1 12 123 1234 12345 and 3.14159",
    "line one\nline two\n\n\ttabbed",
    "unicode: café, naïve, Ελληνικά, 日本語, 🦀🚀",
    "<s>special tokens</s> inside <s> text",
    "",
    "   ",
    "trailing newline\n",
    "MiXeD CaSe WORDS and_under_scores",
    "punctuation!!! ??? ... --- ((()))",
];

#[test]
fn converted_fixtures_tokenize_as_their_tokenizer_json_does() {
    for name in CONVERTED {
        let file =
            GgufFile::open(&Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"))).unwrap();
        let from_gguf = tokenizer(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let own = Tokenizer::from_dir(&Path::new("tests/fixtures").join(name)).unwrap();
        // The converter pads the vocabulary to the model's (520 rows for 512 tokens in
        // llama-bias-mha) with tokens no text encodes to.
        assert!(from_gguf.vocab_size() >= own.vocab_size(), "{name}");
        assert_eq!(from_gguf.bos_token_id(), own.bos_token_id(), "{name}");
        assert_eq!(from_gguf.eos_token_ids(), own.eos_token_ids(), "{name}");
        for text in TEXTS {
            let (a, b) = (from_gguf.encode(text).unwrap(), own.encode(text).unwrap());
            assert_eq!(a, b, "{name}: {text:?}");
            for skip in [false, true] {
                assert_eq!(
                    from_gguf.decode(&a, skip).unwrap(),
                    own.decode(&b, skip).unwrap(),
                    "{name}: decoding {text:?} (skip special {skip})"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs llama.cpp's vocabulary files: PAGELLM_GGUF_VOCAB_DIR=.../models cargo test -- --ignored"]
fn llama_cpp_vocabularies_tokenize_its_test_cases() {
    let dir = std::env::var("PAGELLM_GGUF_VOCAB_DIR").expect(
        "PAGELLM_GGUF_VOCAB_DIR: llama.cpp's models/ folder with its ggml-vocab-*.gguf files",
    );
    for vocab in ["gpt-2", "llama-bpe", "qwen2", "llama-spm"] {
        let path = Path::new(&dir).join(format!("ggml-vocab-{vocab}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let tok = tokenizer(&file).unwrap_or_else(|e| panic!("{vocab}: {e}"));
        let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
        // Each case ends with the separator line.
        let sep = "\n__ggml_vocab_test__\n";
        let cases: Vec<&str> = inp.strip_suffix(sep).unwrap_or(&inp).split(sep).collect();
        let want: Vec<Vec<u32>> = out
            .lines()
            .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
            .collect();
        assert!(
            cases.len() >= 30 && cases.len() == want.len(),
            "{vocab}: {} cases, {} results",
            cases.len(),
            want.len()
        );
        let mut failed = Vec::new();
        for (text, want) in cases.iter().zip(&want) {
            let got = tok.encode_plain(text).unwrap();
            if &got != want {
                failed.push(format!("{text:?}: {got:?}, want {want:?}"));
            }
            let back = tok.decode(&got, false).unwrap();
            if back != *text {
                failed.push(format!("{text:?} decodes back to {back:?}"));
            }
        }
        assert!(
            failed.is_empty(),
            "{vocab}: {} of {} cases differ:\n{}",
            failed.len(),
            cases.len(),
            failed.join("\n")
        );
    }
}

#[test]
fn a_sentencepiece_vocabulary_tokenizes_as_sentencepiece_does() {
    // tools/make_tokenizer_fixtures.py: a SentencePiece BPE model as a GGUF file holds it,
    // and SentencePiece's own ids and decoded text for each case.
    let dir = Path::new("tests/fixtures/gguf");
    let file = GgufFile::open(&dir.join("spm-tokenizer.gguf")).unwrap();
    let tok = tokenizer(&file).unwrap();
    let text = std::fs::read_to_string(dir.join("spm-tokenizer.json")).unwrap();
    let want: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        tok.vocab_size() as u64,
        want["vocab_size"].as_u64().unwrap()
    );
    assert_eq!(tok.bos_token_id().map(u64::from), want["bos"].as_u64());
    assert_eq!(tok.eos_token_ids(), [want["eos"].as_u64().unwrap() as u32]);
    let bos = tok.bos_token_id().unwrap();
    for case in want["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode_plain(text).unwrap(), ids, "{text:?}");
        // add_bos_token: the encoding a prompt gets starts with BOS.
        let with_bos: Vec<u32> = std::iter::once(bos).chain(ids.iter().copied()).collect();
        assert_eq!(tok.encode(text).unwrap(), with_bos, "{text:?} with BOS");
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decoding {text:?}"
        );
    }
}

#[test]
fn metadata_a_tokenizer_cannot_be_built_from_is_named() {
    // The fixture's bytes with one string changed in place (same length).
    let path = Path::new("tests/fixtures/gguf/spm-tokenizer.gguf");
    let bytes = std::fs::read(path).unwrap();
    let patch = |from: &[u8], to: &[u8]| {
        let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
        let mut b = bytes.clone();
        b[at..at + to.len()].copy_from_slice(to);
        pagellm::internals::gguf::file::Gguf::parse(b).unwrap()
    };
    // The key, its type (8: string), the string's length, then the value.
    let key = b"tokenizer.ggml.model\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00";
    let e = tokenizer(&patch(
        &[&key[..], b"llama"].concat(),
        &[&key[..], b"rwkv5"].concat(),
    ))
    .unwrap_err();
    assert!(
        e.contains("\"rwkv5\" is not supported") && e.contains("tokenizer.json"),
        "{e}"
    );
    let e = tokenizer(&patch(b"tokenizer.ggml.scores", b"tokenizer.ggml.scoreZ")).unwrap_err();
    assert!(e.contains("tokenizer.ggml.scores is missing"), "{e}");
}

#[test]
fn a_gguf_model_path_finds_its_tokenizer_and_chat_template_in_the_file() {
    use pagellm::internals::model::{open_chat_template, open_tokenizer};
    use pagellm::internals::tokenizer::ChatMessage;
    // No tokenizer.json beside the file: both come from its metadata.
    let dir = std::env::temp_dir().join(format!("pagellm-gguf-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.gguf");
    std::fs::copy("tests/fixtures/gguf/spm-tokenizer.gguf", &path).unwrap();
    let tok = open_tokenizer(&path).unwrap();
    assert_eq!(tok.vocab_size(), 400);
    let template = open_chat_template(&path).unwrap();
    let messages = [ChatMessage::new("user", "hi")];
    assert_eq!(
        template.render(&messages, true).unwrap(),
        "<s>user: hi</s><s>assistant:"
    );
    // A model path with neither: the error says what was looked for.
    std::fs::remove_file(&path).unwrap();
    let e = open_tokenizer(&dir).unwrap_err().to_string();
    assert!(e.contains("no tokenizer.json") && e.contains("GGUF"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
