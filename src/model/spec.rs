//! The tensors a Llama-family checkpoint must hold, named as Hugging Face names them
//! (`model.layers.{i}.self_attn.q_proj.weight`, ...), with the shapes `config.json` implies.
//! This list is the checkpoint format's documentation and the loader's validation.

use super::checkpoint::Checkpoint;
use super::config::ModelConfig;
use super::error::{ModelError, Result};

/// Names of one decoder layer's tensors.
#[derive(Clone, Debug)]
pub struct LayerNames {
    pub input_norm: String,
    pub q: String,
    pub k: String,
    pub v: String,
    pub o: String,
    pub q_bias: Option<String>,
    pub k_bias: Option<String>,
    pub v_bias: Option<String>,
    pub o_bias: Option<String>,
    pub post_norm: String,
    pub gate: String,
    pub up: String,
    pub down: String,
    pub gate_bias: Option<String>,
    pub up_bias: Option<String>,
    pub down_bias: Option<String>,
}

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

impl LayerNames {
    pub fn new(cfg: &ModelConfig, i: usize) -> Self {
        let p = format!("model.layers.{i}");
        let bias = |on: bool, name: &str| on.then(|| format!("{p}.{name}.bias"));
        LayerNames {
            input_norm: format!("{p}.input_layernorm.weight"),
            q: format!("{p}.self_attn.q_proj.weight"),
            k: format!("{p}.self_attn.k_proj.weight"),
            v: format!("{p}.self_attn.v_proj.weight"),
            o: format!("{p}.self_attn.o_proj.weight"),
            q_bias: bias(cfg.qkv_bias, "self_attn.q_proj"),
            k_bias: bias(cfg.qkv_bias, "self_attn.k_proj"),
            v_bias: bias(cfg.qkv_bias, "self_attn.v_proj"),
            o_bias: bias(cfg.o_bias, "self_attn.o_proj"),
            post_norm: format!("{p}.post_attention_layernorm.weight"),
            gate: format!("{p}.mlp.gate_proj.weight"),
            up: format!("{p}.mlp.up_proj.weight"),
            down: format!("{p}.mlp.down_proj.weight"),
            gate_bias: bias(cfg.mlp_bias, "mlp.gate_proj"),
            up_bias: bias(cfg.mlp_bias, "mlp.up_proj"),
            down_bias: bias(cfg.mlp_bias, "mlp.down_proj"),
        }
    }
}

/// Every tensor the model needs, with its expected shape.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v, inter) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let (q_out, kv_out) = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
    );
    let mut out = vec![(EMBED.to_string(), vec![v, h])];
    for i in 0..cfg.num_layers {
        let n = LayerNames::new(cfg, i);
        out.push((n.input_norm, vec![h]));
        out.push((n.q, vec![q_out, h]));
        out.push((n.k, vec![kv_out, h]));
        out.push((n.v, vec![kv_out, h]));
        out.push((n.o, vec![h, q_out]));
        for (b, len) in [
            (n.q_bias, q_out),
            (n.k_bias, kv_out),
            (n.v_bias, kv_out),
            (n.o_bias, h),
        ] {
            if let Some(b) = b {
                out.push((b, vec![len]));
            }
        }
        out.push((n.post_norm, vec![h]));
        out.push((n.gate, vec![inter, h]));
        out.push((n.up, vec![inter, h]));
        out.push((n.down, vec![h, inter]));
        for (b, len) in [(n.gate_bias, inter), (n.up_bias, inter), (n.down_bias, h)] {
            if let Some(b) = b {
                out.push((b, vec![len]));
            }
        }
    }
    out.push((FINAL_NORM.to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push((LM_HEAD.to_string(), vec![v, h]));
    }
    out
}

/// Tensors a checkpoint may carry that the runtime ignores.
fn ignorable(name: &str, cfg: &ModelConfig) -> bool {
    name.ends_with("rotary_emb.inv_freq") || (cfg.tie_word_embeddings && name == LM_HEAD)
}

/// Checks that the checkpoint holds exactly the tensors `cfg` implies, with the right shapes
/// and supported dtypes.
pub fn validate(cfg: &ModelConfig, ck: &Checkpoint) -> Result<()> {
    let expected = expected_tensors(cfg);
    for (name, shape) in &expected {
        let t = ck.get(name)?;
        if t.shape != shape.as_slice() {
            return Err(ModelError::Shape {
                name: name.clone(),
                expected: shape.clone(),
                found: t.shape.to_vec(),
            });
        }
        if t.dtype != crate::kernels::WeightDtype::F32 && shape.last().is_some_and(|c| c % 2 != 0) {
            return Err(ModelError::Unsupported(format!(
                "{name}: 16-bit weights need an even row length, found {shape:?}"
            )));
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    let extra: Vec<String> = ck
        .names()
        .filter(|n| !known.contains(n) && !ignorable(n, cfg))
        .map(String::from)
        .collect();
    if !extra.is_empty() {
        return Err(ModelError::UnexpectedTensors { names: extra });
    }
    Ok(())
}
