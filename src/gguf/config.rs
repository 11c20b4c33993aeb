//! A GGUF file's metadata as the model registry reads a Hugging Face `config.json`: the
//! `{arch}.*` keys llama.cpp's converter writes, mapped back to the transformers names, so
//! that one parser ([`ModelConfig::parse`](crate::model::ModelConfig::parse)) and one set of
//! per-family rules serve both kinds of checkpoint.
//!
//! Families read: GGUF `llama` (Llama and Mistral, which llama.cpp converts to `llama`),
//! `qwen2`, `qwen3`, `gemma2`, `gemma3` and `phi3`. Whether projections carry biases and
//! whether the LM head is tied are read from the tensor directory (`blk.0.attn_q.bias`,
//! `output.weight`), as the converter records them only there; so are per-frequency rope
//! factors (`rope_freqs.weight`, `rope_factors_short/long.weight`).
//!
//! Where the converter drops a setting, the config gets the value llama.cpp computes with,
//! so a file computes here what it computes there:
//!
//! - Gemma's `query_pre_attn_scalar` is the head size, except for the 27B shapes (46 layers
//!   for Gemma 2, 62 for Gemma 3), whose scalar is `hidden_size / heads`;
//! - Gemma 3's windowed layers are five of every six unless the file says otherwise
//!   (`attention.sliding_window_pattern`), and without `attention.sliding_window` no layer
//!   is windowed;
//! - Qwen3's sliding window is not recorded, so every layer attends to every position.

use super::file::{Gguf, Value};
use serde_json::{json, Map, Value as Json};

/// GGUF architectures this mapping reads, and the transformers `model_type` and class of
/// each.
const FAMILIES: [(&str, &str, &str); 8] = [
    ("llama", "llama", "LlamaForCausalLM"),
    ("qwen2", "qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "qwen3", "Qwen3ForCausalLM"),
    ("qwen3moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
    ("gpt-oss", "gpt_oss", "GptOssForCausalLM"),
    ("gemma2", "gemma2", "Gemma2ForCausalLM"),
    ("gemma3", "gemma3_text", "Gemma3ForCausalLM"),
    ("phi3", "phi3", "Phi3ForCausalLM"),
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
    // llama.cpp converts Mixtral to its `llama` architecture, with experts.
    let experts = opt_uint(file, &key("expert_count"))?.filter(|&n| n > 0);
    let (model_type, class) = match (arch.as_str(), experts) {
        ("llama", Some(_)) => ("mixtral", "MixtralForCausalLM"),
        _ => (model_type, class),
    };
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    if let Some(n) = experts {
        experts_config(file, &arch, n, &mut c)?;
    }
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
    let head_dim = head_dim(file, &arch)?;
    if let Some(head_dim) = head_dim {
        c.insert("head_dim".into(), json!(head_dim));
    }
    let head_dim = head_dim.unwrap_or(hidden / heads.max(1));
    if let Some(dims) = opt_uint(file, &key("rope.dimension_count"))? {
        // Rope over part of each head; the config parser names it as unsupported.
        if dims != head_dim {
            let partial = dims as f64 / head_dim as f64;
            c.insert("partial_rotary_factor".into(), json!(partial));
        }
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
    if let Some(window) = opt_uint(file, &key("attention.sliding_window"))? {
        c.insert("sliding_window".into(), json!(window));
    }
    if arch.starts_with("gemma") {
        gemma(file, &arch, head_dim, &mut c)?;
    }
    directory_and_tokens(file, &arch, &mut c)?;
    Ok(Json::Object(c))
}

/// What the converter records only in the tensor directory (a tied LM head, biases) and
/// the special tokens.
fn directory_and_tokens<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    arch: &str,
    c: &mut Map<String, Json>,
) -> Result<(), String> {
    let has = |name: &str| file.tensor(name).is_some();
    c.insert("tie_word_embeddings".into(), json!(!has("output.weight")));
    // Qwen2's q, k and v always carry biases; transformers' `attention_bias` then names the
    // output projection's. Elsewhere it names all four.
    let attention_bias = match arch {
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
    Ok(())
}

/// A mixture of experts' settings: the expert count and the experts per token, each
/// expert's width (`expert_feed_forward_length`, where the family's experts are narrower
/// than its dense MLPs), whether the chosen experts' weights are renormalised
/// (`expert_weights_norm`; llama.cpp renormalises Mixtral's and Qwen3-MoE's always), and
/// which layers are dense: those without a router tensor.
fn experts_config<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    arch: &str,
    experts: u64,
    c: &mut Map<String, Json>,
) -> Result<(), String> {
    let key = |k: &str| format!("{arch}.{k}");
    c.insert("num_local_experts".into(), json!(experts));
    let used = uint(file, &key("expert_used_count"))?;
    c.insert("num_experts_per_tok".into(), json!(used));
    if let Some(width) = opt_uint(file, &key("expert_feed_forward_length"))? {
        c.insert("moe_intermediate_size".into(), json!(width));
    }
    let norm = match file.get(&key("expert_weights_norm")) {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "{} is {v:?}, not a bool",
                key("expert_weights_norm")
            ))
        }
    };
    c.insert("norm_topk_prob".into(), json!(norm));
    let layers = uint(file, &key("block_count"))?;
    let dense: Vec<u64> = (0..layers)
        .filter(|i| {
            file.tensor(&format!("blk.{i}.ffn_gate_inp.weight"))
                .is_none()
        })
        .collect();
    c.insert("mlp_only_layers".into(), json!(dense));
    Ok(())
}

/// What Gemma 2 and 3 files say, or llama.cpp assumes, beyond Llama's keys.
fn gemma<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    arch: &str,
    head_dim: u64,
    c: &mut Map<String, Json>,
) -> Result<(), String> {
    let key = |k: &str| format!("{arch}.{k}");
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(v) = opt_float(file, &key(cap))? {
            c.insert(cap.into(), json!(v));
        }
    }
    let layers = uint(file, &key("block_count"))?;
    let (hidden, heads) = (
        uint(file, &key("embedding_length"))?,
        uint(file, &key("attention.head_count"))?.max(1),
    );
    let big = if arch == "gemma2" { 46 } else { 62 };
    let scalar = if layers == big {
        hidden / heads
    } else {
        head_dim
    };
    c.insert("query_pre_attn_scalar".into(), json!(scalar));
    if arch != "gemma3" {
        return Ok(());
    }
    if let Some(theta) = opt_float(file, &key("rope.freq_base_swa"))? {
        c.insert("rope_local_base_freq".into(), json!(theta));
    }
    let types: Vec<&str> = match file.get(&key("attention.sliding_window_pattern")) {
        _ if !c.contains_key("sliding_window") => vec!["full_attention"; layers as usize],
        None => return Ok(()),
        Some(Value::Array(flags)) => flags
            .iter()
            .map(|f| match f {
                Value::Bool(true) => Ok("sliding_attention"),
                Value::Bool(false) => Ok("full_attention"),
                other => Err(format!(
                    "{arch}.attention.sliding_window_pattern holds {other:?}, not booleans"
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            let period = v.as_u64().filter(|p| *p > 0).ok_or_else(|| {
                format!("{arch}.attention.sliding_window_pattern is {v:?}, not a period")
            })?;
            c.insert("sliding_window_pattern".into(), json!(period));
            return Ok(());
        }
    };
    c.insert("layer_types".into(), json!(types));
    Ok(())
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

/// Rope scaling: per-frequency factors stored as tensors (Llama 3's `rope_freqs.weight`,
/// Phi-3's `rope_factors_short/long.weight`) become LongRoPE, which divides each frequency
/// by its factor; otherwise `rope.scaling.type` "linear" and its factor, and "none" or no
/// key is no scaling. Other kinds are an error naming them.
fn rope_scaling<B: AsRef<[u8]>>(
    file: &Gguf<B>,
    arch: &str,
    c: &mut Map<String, Json>,
) -> Result<(), String> {
    let key = |k: &str| format!("{arch}.{k}");
    let context = opt_uint(file, &key("context_length"))?;
    if let Some(factors) = factors(file, "rope_freqs.weight")? {
        // One set for every context; an attention factor of 1 leaves cos and sin as they are.
        c.insert(
            "rope_scaling".into(),
            json!({"rope_type": "longrope", "short_factor": factors, "long_factor": factors,
                   "original_max_position_embeddings": context, "attention_factor": 1.0}),
        );
        return Ok(());
    }
    if let Some(long) = factors(file, "rope_factors_long.weight")? {
        let short = factors(file, "rope_factors_short.weight")?
            .ok_or("rope_factors_long.weight without rope_factors_short.weight")?;
        let original = opt_uint(file, &key("rope.scaling.original_context_length"))?;
        let mut s = json!({"rope_type": "longrope", "short_factor": short, "long_factor": long});
        if let Some(original) = original {
            s["original_max_position_embeddings"] = json!(original);
            c.insert("original_max_position_embeddings".into(), json!(original));
        }
        if let Some(a) = opt_float(file, &key("rope.scaling.attn_factor"))? {
            s["attention_factor"] = json!(a);
        }
        c.insert("rope_scaling".into(), s);
        return Ok(());
    }
    let ty = match file.get(&key("rope.scaling.type")) {
        None => return Ok(()),
        Some(v) => v
            .as_str()
            .ok_or_else(|| format!("{arch}.rope.scaling.type is a {}", v.type_name()))?,
    };
    match ty {
        "none" => Ok(()),
        "linear" => {
            let factor = float(file, &key("rope.scaling.factor"))?;
            c.insert(
                "rope_scaling".into(),
                json!({"rope_type": "linear", "factor": factor}),
            );
            Ok(())
        }
        "yarn" => {
            // llama.cpp rounds the ramp's ends outwards (ggml's YaRN correction dimensions
            // are floored and ceiled): transformers' `truncate`.
            let mut s = json!({
                "rope_type": "yarn",
                "factor": float(file, &key("rope.scaling.factor"))?,
                "original_max_position_embeddings":
                    uint(file, &key("rope.scaling.original_context_length"))?,
                "truncate": true,
            });
            for (gguf, hf) in [
                ("rope.scaling.yarn_beta_fast", "beta_fast"),
                ("rope.scaling.yarn_beta_slow", "beta_slow"),
                ("rope.scaling.attn_factor", "attention_factor"),
            ] {
                if let Some(v) = opt_float(file, &key(gguf))? {
                    s[hf] = json!(v);
                }
            }
            c.insert("rope_scaling".into(), s);
            Ok(())
        }
        other => Err(format!(
            "rope scaling {other:?} is not read from GGUF files yet (supported: none, linear, \
             yarn, per-frequency factors)"
        )),
    }
}

/// The values of the one-dimensional F32 tensor `name`, if the file has it.
fn factors<B: AsRef<[u8]>>(file: &Gguf<B>, name: &str) -> Result<Option<Vec<f32>>, String> {
    let Some(t) = file.tensor(name) else {
        return Ok(None);
    };
    if t.ty != crate::formats::GgmlType::F32 || t.dims.len() != 1 {
        return Err(format!(
            "{name} is a {:?} tensor of extents {:?}, not a list of F32 factors",
            t.ty, t.dims
        ));
    }
    let data = file.data(t);
    Ok(Some(
        data.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    ))
}

/// Tensors that hold settings the config reads, not weights.
pub const CONFIG_TENSORS: [&str; 3] = [
    "rope_freqs.weight",
    "rope_factors_long.weight",
    "rope_factors_short.weight",
];

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
