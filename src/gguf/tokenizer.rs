//! The tokenizer a GGUF file carries in its metadata, built as a `tokenizers` tokenizer so
//! that the rest of pagellm uses it as it uses a `tokenizer.json`.
//!
//! Two kinds (`tokenizer.ggml.model`): `llama`, SentencePiece's BPE with scores and byte
//! fallback (Llama 2, Mistral 7B, Gemma; see `sentencepiece_bpe`), and the byte-level BPE
//! that llama.cpp calls `gpt2` (Llama 3, Qwen2 and Qwen3, most recent models), whose parts
//! are:
//!
//! - `tokenizer.ggml.tokens` (the vocabulary, by id) and `tokenizer.ggml.merges` (`"a b"`
//!   strings, highest priority first) make the BPE model;
//! - `tokenizer.ggml.pre` names the pre-tokenizer's split pattern, which the file does not
//!   store: `gpt-2` and `default` use GPT-2's own, `llama-bpe` (Llama 3) and `qwen2` the
//!   patterns of those models' `tokenizer.json` files; another name is an error naming it,
//!   since a wrong split silently changes every prompt's tokens;
//! - `tokenizer.ggml.token_type` marks control tokens (type 3: special, never split, skipped
//!   when decoding with `skip_special_tokens`) and user-defined ones (type 4: never split);
//! - `tokenizer.ggml.add_bos_token` prepends `tokenizer.ggml.bos_token_id` to every encoding,
//!   as the post-processor of a `tokenizer.json` does; the BOS and EOS ids (also
//!   `tokenizer.ggml.eot_token_id` and `eom_token_id`) become the [`SpecialTokens`].
//!
//! A `tokenizer.json` beside the file takes precedence (it is the model's own).

use super::config::{opt_uint, string};
use super::file::{Gguf, Value};
use crate::tokenizer::{SpecialTokens, Tokenizer};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::NormalizerWrapper;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// Llama 3's split pattern (its `tokenizer.json`): contractions, letter runs with one
/// leading non-letter, digit runs of up to three, punctuation runs, newlines, spaces.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's (and Qwen3's): Llama 3's with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// The tokenizer of `file`'s metadata; an error names the key that is missing or wrong.
pub fn tokenizer<B: AsRef<[u8]>>(file: &Gguf<B>) -> Result<Tokenizer, String> {
    let model = string(file, "tokenizer.ggml.model")?;
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let mut inner = match model.as_str() {
        "gpt2" => byte_level_bpe(file, &tokens)?,
        "llama" => sentencepiece_bpe(file, &tokens)?,
        other => {
            return Err(format!(
                "tokenizer.ggml.model {other:?} is not supported (supported: \"gpt2\", \
                 byte-level BPE, and \"llama\", SentencePiece); put the model's tokenizer.json \
                 beside the file"
            ))
        }
    };
    let special = special_tokens(file, tokens.len())?;
    if let (true, Some(bos)) = (flag(file, "tokenizer.ggml.add_bos_token")?, special.bos) {
        inner.with_post_processor(Some(bos_template(&tokens[bos as usize], bos)?));
    }
    add_special(&mut inner, file, &tokens)?;
    Ok(Tokenizer::from_parts(inner, special))
}

/// `gpt2`: byte-level BPE from the vocabulary and `tokenizer.ggml.merges`.
fn byte_level_bpe<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    tokens: &[String],
) -> Result<tokenizers::Tokenizer, String> {
    let merges = strings(file, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok((a.to_string(), b.to_string())),
            None => Err(format!("tokenizer.ggml.merges holds {m:?}, not two tokens")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Llama 3 takes a word that is in the vocabulary whole, as its tokenizer.json says
    // (`ignore_merges`); the others merge every word.
    let pre = pre_name(file)?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab(tokens), merges)
        .ignore_merges(matches!(pre.as_str(), "llama-bpe" | "llama3"))
        .build()
        .map_err(|e| format!("tokenizer.ggml.merges: {e}"))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer(&pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}

/// `llama`: SentencePiece's BPE (Llama 2, Mistral 7B v0.1-v0.3, Gemma). SentencePiece
/// merges the adjacent pair whose union has the highest score, so the merges are every
/// split of a token into two tokens, ranked by the score of the token they make
/// (`tokenizer.ggml.scores`; equal scores in vocabulary order), as transformers' converter
/// builds them; characters outside the vocabulary fall back to `<0xNN>` byte tokens.
/// Spaces become `▁`, with one more in front of the text unless
/// `tokenizer.ggml.add_space_prefix` is false.
fn sentencepiece_bpe<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    tokens: &[String],
) -> Result<tokenizers::Tokenizer, String> {
    let scores = floats(file, "tokenizer.ggml.scores")?;
    if scores.len() != tokens.len() {
        return Err(format!(
            "tokenizer.ggml.scores has {} scores for {} tokens",
            scores.len(),
            tokens.len()
        ));
    }
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab(tokens), score_merges(tokens, &scores))
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = opt_uint(file, "tokenizer.ggml.unknown_token_id")? {
        let t = tokens.get(unk as usize).ok_or_else(|| {
            format!("tokenizer.ggml.unknown_token_id {unk} is outside the vocabulary")
        })?;
        builder = builder.unk_token(t.clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("tokenizer.ggml.scores: {e}"))?;
    let prefix = match file.get("tokenizer.ggml.add_space_prefix") {
        None => true,
        Some(_) => flag(file, "tokenizer.ggml.add_space_prefix")?,
    };
    let space = |from: &str, to: &str| Replace::new(from, to).map_err(|e| e.to_string());
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if prefix {
        normalizers.push(Prepend::new("\u{2581}".into()).into());
    }
    normalizers.push(space(" ", "\u{2581}")?.into());
    let mut decoders: Vec<DecoderWrapper> = vec![
        space("\u{2581}", " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(|e| format!("the SentencePiece normalizer: {e}"))?;
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}

/// SentencePiece's merges as BPE merges: for each token (in id order), each split into two
/// tokens (by the ids of the halves), then all of them ordered by the whole's score,
/// highest first, keeping that order among equal scores.
fn score_merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    for (whole, t) in tokens.iter().enumerate() {
        let mut splits: Vec<(usize, usize)> = t
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((*ids.get(&t[..at])?, *ids.get(&t[at..])?)))
            .collect();
        splits.sort_unstable();
        merges.extend(splits.into_iter().map(|(l, r)| (scores[whole], l, r)));
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges
        .into_iter()
        .map(|(_, l, r)| (tokens[l].clone(), tokens[r].clone()))
        .collect()
}

fn vocab(tokens: &[String]) -> Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect()
}

/// A post-processor that puts `name` (id `bos`) before every sequence.
fn bos_template(name: &str, bos: u32) -> Result<TemplateProcessing, String> {
    let bad = |e: String| format!("a BOS template for {name:?}: {e}");
    TemplateProcessing::builder()
        .try_single(format!("{name} $A"))
        .and_then(|b| b.try_pair(format!("{name} $A {name} $B")))
        .map_err(bad)?
        .special_tokens(vec![(name.to_string(), bos)])
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// `tokenizer.ggml.pre`, `default` where absent.
fn pre_name<B: AsRef<[u8]>>(file: &Gguf<B>) -> Result<String, String> {
    match file.get("tokenizer.ggml.pre") {
        None => Ok("default".to_string()),
        Some(_) => string(file, "tokenizer.ggml.pre"),
    }
}

/// The pre-tokenizer `tokenizer.ggml.pre` names: a split pattern, then the byte-level
/// mapping.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, String> {
    let pattern = match pre {
        "default" | "gpt-2" => return Ok(ByteLevel::new(false, true, true).into()),
        "llama-bpe" | "llama3" => LLAMA3_SPLIT,
        "qwen2" => QWEN2_SPLIT,
        other => {
            return Err(format!(
                "tokenizer.ggml.pre {other:?} is not supported yet (supported: gpt-2, default, \
                 llama-bpe, qwen2); put the model's tokenizer.json beside the file"
            ))
        }
    };
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| format!("the {pre} split pattern: {e}"))?;
    Ok(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, true, false).into(),
    ])
    .into())
}

/// Control and user-defined tokens as added tokens, so that text holding them encodes to
/// their ids instead of being split.
fn add_special<B: AsRef<[u8]>>(
    inner: &mut tokenizers::Tokenizer,
    file: &Gguf<B>,
    tokens: &[String],
) -> Result<(), String> {
    let Some(types) = file.get("tokenizer.ggml.token_type") else {
        return Ok(());
    };
    let types = types
        .as_array()
        .filter(|t| t.len() == tokens.len())
        .ok_or_else(|| {
            format!(
                "tokenizer.ggml.token_type is not one type per token ({} tokens)",
                tokens.len()
            )
        })?;
    let (mut special, mut user) = (Vec::new(), Vec::new());
    for (t, ty) in tokens.iter().zip(types) {
        match int(ty) {
            Some(CONTROL) => special.push(AddedToken::from(t.clone(), true)),
            Some(USER_DEFINED) => user.push(AddedToken::from(t.clone(), false)),
            Some(_) => {}
            None => return Err(format!("tokenizer.ggml.token_type holds {ty:?}")),
        }
    }
    inner
        .add_special_tokens(special)
        .and_then(|_| inner.add_tokens(user))
        .map_err(|e| format!("the control and user-defined tokens: {e}"))?;
    Ok(())
}

fn int(v: &Value) -> Option<i64> {
    match *v {
        Value::I32(x) => Some(x.into()),
        Value::I64(x) => Some(x),
        _ => v.as_u64().and_then(|x| i64::try_from(x).ok()),
    }
}

/// BOS and EOS from the metadata, checked against the vocabulary of `n` tokens.
fn special_tokens<B: AsRef<[u8]>>(file: &Gguf<B>, n: usize) -> Result<SpecialTokens, String> {
    let id = |key: &str| -> Result<Option<u32>, String> {
        match opt_uint(file, key)? {
            Some(id) if id as usize >= n => Err(format!("{key} {id} is outside the {n} tokens")),
            other => Ok(other.map(|id| id as u32)),
        }
    };
    let mut eos = Vec::new();
    for key in ["eos_token_id", "eot_token_id", "eom_token_id"] {
        if let Some(e) = id(&format!("tokenizer.ggml.{key}"))? {
            if !eos.contains(&e) {
                eos.push(e);
            }
        }
    }
    Ok(SpecialTokens {
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos,
    })
}

fn flag<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<bool, String> {
    match file.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(format!("{key} is a {}, not a bool", v.type_name())),
    }
}

fn floats<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<Vec<f32>, String> {
    let v = file
        .get(key)
        .ok_or_else(|| format!("metadata key {key} is missing"))?;
    v.as_array()
        .and_then(|a| a.iter().map(|x| x.as_f64().map(|f| f as f32)).collect())
        .ok_or_else(|| format!("{key} is not an array of numbers"))
}

fn strings<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<Vec<String>, String> {
    let v = file
        .get(key)
        .ok_or_else(|| format!("metadata key {key} is missing"))?;
    v.as_array()
        .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_owned)).collect())
        .ok_or_else(|| format!("{key} is not an array of strings"))
}
