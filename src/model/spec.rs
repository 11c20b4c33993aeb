//! The tensors a checkpoint must hold, named as Hugging Face names them
//! (`model.layers.{i}.self_attn.q_proj.weight`, ...), with the shapes `config.json` implies.
//! Each architecture's module in [`super::arch`] declares its layers' tensors; this list is
//! the checkpoint format's documentation and the loader's validation.

use super::arch::{self, LayerTensors};
use super::checkpoint::Checkpoint;
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use crate::kernels::WeightDtype;

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// The tensors of layer `i`, as its architecture declares them.
pub fn layer(cfg: &ModelConfig, i: usize) -> LayerTensors {
    (arch::def(cfg.architecture).layer)(cfg, i)
}

/// Every tensor the model needs, with its expected shape.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = vec![(EMBED.to_string(), vec![v, h])];
    for i in 0..cfg.num_layers {
        out.extend(layer(cfg, i).checkpoint);
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
        let half = matches!(t.dtype, WeightDtype::F16 | WeightDtype::BF16);
        if half && shape.last().is_some_and(|c| c % 2 != 0) {
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
