//! A GGUF file's metadata as the model registry reads a Hugging Face `config.json`: the
//! `{arch}.*` keys llama.cpp's converter writes, mapped back to the transformers names, so
//! that one parser ([`ModelConfig::parse`](crate::model::ModelConfig::parse)) and one set of
//! per-family rules serve both kinds of checkpoint.
//!
//! Families read so far: GGUF `llama` (Llama and Mistral, which llama.cpp converts to
//! `llama`), `qwen2` and `qwen3`. Whether projections carry biases and whether the LM head
//! is tied are read from the tensor directory (`blk.0.attn_q.bias`, `output.weight`), as the
//! converter records them only there.

use super::file::{Gguf, Value};
use serde_json::{json, Map, Value as Json};

/// GGUF architectures this mapping reads, and the transformers `model_type` and class of
/// each.
const FAMILIES: [(&str, &str, &str); 3] = [
    ("llama", "llama", "LlamaForCausalLM"),
    ("qwen2", "qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "qwen3", "Qwen3ForCausalLM"),
];

/// The names of the architectures [`hf_config`] reads, for error messages.
pub fn supported() -> String {
    FAMILIES.map(|f| f.0).join(", ")
}

/// The transformers-style config of the model `file` holds; an error names a missing or
/// mistyped key, or an architecture this mapping does not read.
pub fn hf_config<B: AsRef<[u8]>>(file: &Gguf<B>) -> Result<Json, String> {
    let arch = string(file, "general.architecture")?;
    let Some(&(_, model_type, class)) = FAMILIES.iter().find(|f| f.0 == arch) else {
        return Err(format!(
            "GGUF architecture {arch:?} is not supported (supported: {})",
            supported()
        ));
    };
    let key = |k: &str| format!("{arch}.{k}");
    let heads = uint(file, &key("attention.head_count"))?;
    let hidden = uint(file, &key("embedding_length"))?;
    let mut c = Map::new();
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("vocab_size".into(), json!(vocab_size(file, &arch)?));
    c.insert(
        "intermediate_size".into(),
        json!(uint(file, &key("feed_forward_length"))?),
    );
    c.insert(
        "num_hidden_layers".into(),
        json!(uint(file, &key("block_count"))?),
    );
    c.insert("num_attention_heads".into(), json!(heads));
    let kv_heads = opt_uint(file, &key("attention.head_count_kv"))?.unwrap_or(heads);
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    if let Some(head_dim) = head_dim(file, &arch)? {
        c.insert("head_dim".into(), json!(head_dim));
    }
    let eps = float(file, &key("attention.layer_norm_rms_epsilon"))?;
    c.insert("rms_norm_eps".into(), json!(eps));
    if let Some(theta) = opt_float(file, &key("rope.freq_base"))? {
        c.insert("rope_theta".into(), json!(theta));
    }
    if let Some(ctx) = opt_uint(file, &key("context_length"))? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    rope_scaling(file, &arch, &mut c)?;
    let has = |name: &str| file.tensor(name).is_some();
    c.insert("tie_word_embeddings".into(), json!(!has("output.weight")));
    // Qwen2's q, k and v always carry biases; transformers' `attention_bias` then names the
    // output projection's. Elsewhere it names all four.
    let attention_bias = match arch.as_str() {
        "qwen2" => has("blk.0.attn_output.bias"),
        _ => has("blk.0.attn_q.bias"),
    };
    c.insert("attention_bias".into(), json!(attention_bias));
    c.insert("mlp_bias".into(), json!(has("blk.0.ffn_down.bias")));
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = opt_uint(file, gguf_key)? {
            c.insert(hf_key.into(), json!(id));
        }
    }
    Ok(Json::Object(c))
}

/// `{arch}.vocab_size`, else the tokenizer's token count, else the embedding's rows.
fn vocab_size<B: AsRef<[u8]>>(file: &Gguf<B>, arch: &str) -> Result<u64, String> {
    if let Some(v) = opt_uint(file, &format!("{arch}.vocab_size"))? {
        return Ok(v);
    }
    if let Some(tokens) = file.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
        return Ok(tokens.len() as u64);
    }
    match file.tensor("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => Ok(t.dims[1]),
        _ => Err(
            "no vocabulary size: neither {arch}.vocab_size, tokenizer.ggml.tokens nor a \
                  2-dimensional token_embd.weight"
                .replace("{arch}", arch),
        ),
    }
}

/// The head size where the file states one (`attention.key_length`, which must equal
/// `value_length` where both are given).
fn head_dim<B: AsRef<[u8]>>(file: &Gguf<B>, arch: &str) -> Result<Option<u64>, String> {
    let k = opt_uint(file, &format!("{arch}.attention.key_length"))?;
    let v = opt_uint(file, &format!("{arch}.attention.value_length"))?;
    match (k, v) {
        (Some(k), Some(v)) if k != v => Err(format!(
            "key heads of {k} and value heads of {v} (only equal sizes are supported)"
        )),
        (k, v) => Ok(k.or(v)),
    }
}

/// Linear rope scaling (`rope.scaling.type` "linear" and its factor); "none" or no key is
/// no scaling. Other kinds are an error naming them, as is a `rope_freqs.weight` tensor
/// (how the converter stores Llama 3's frequency-dependent scaling).
fn rope_scaling<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    arch: &str,
    c: &mut Map<String, Json>,
) -> Result<(), String> {
    if file.tensor("rope_freqs.weight").is_some() {
        return Err(
            "per-frequency rope factors (rope_freqs.weight, Llama 3 scaling) are not \
                    read from GGUF files yet"
                .into(),
        );
    }
    let ty = match file.get(&format!("{arch}.rope.scaling.type")) {
        None => return Ok(()),
        Some(v) => v
            .as_str()
            .ok_or_else(|| format!("{arch}.rope.scaling.type is a {}", v.type_name()))?,
    };
    match ty {
        "none" => Ok(()),
        "linear" => {
            let factor = float(file, &format!("{arch}.rope.scaling.factor"))?;
            c.insert(
                "rope_scaling".into(),
                json!({"rope_type": "linear", "factor": factor}),
            );
            Ok(())
        }
        other => Err(format!(
            "rope scaling {other:?} is not read from GGUF files yet (supported: none, linear)"
        )),
    }
}

pub(crate) fn string<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<String, String> {
    match file.get(key) {
        None => Err(format!("metadata key {key} is missing")),
        Some(v) => v
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{key} is a {}, not a string", v.type_name())),
    }
}

pub(crate) fn opt_uint<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<Option<u64>, String> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} is {v:?}, not a non-negative integer")),
    }
}

fn uint<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<u64, String> {
    opt_uint(file, key)?.ok_or_else(|| format!("metadata key {key} is missing"))
}

fn opt_float<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<Option<f64>, String> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("{key} is {v:?}, not a number")),
    }
}

fn float<B: AsRef<[u8]>>(file: &Gguf<B>, key: &str) -> Result<f64, String> {
    opt_float(file, key)?.ok_or_else(|| format!("metadata key {key} is missing"))
}
