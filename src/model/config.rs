//! `config.json` of a Hugging Face checkpoint, read into the few numbers the runtime needs
//! and checked for consistency: the fields every family shares here, the family's own
//! fields and its layer recipe in its [`super::arch`] module.
//!
//! Rope settings come in two spellings: transformers 4 writes `rope_theta` and
//! `rope_scaling` at the top level; transformers 5 writes a `rope_parameters` object
//! (`rope_theta`, `rope_type`, `factor`, ...). Both are read.

use super::error::{ModelError, Result};
pub use super::recipe::Architecture;
use super::recipe::{Recipe, Rope};
use crate::mapped::Folder;
use crate::nn::rope::RopeScaling;
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// The main rope's base; layers with a local rope use [`Recipe::local_rope`].
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2 always; others when `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (`attention_bias` of Llama, Qwen3, Gemma).
    pub o_bias: bool,
    /// MLP projections carry a bias (Llama `mlp_bias`).
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// How the layer graph computes (norms, activation, attention options, per-layer
    /// windows), set by the architecture's module.
    pub recipe: Recipe,
}

/// Typed access to one JSON object of `config.json`, with errors naming the file.
pub struct ConfigReader<'a> {
    pub(crate) path: &'a Path,
    pub(crate) v: &'a Value,
}

impl<'a> ConfigReader<'a> {
    /// A reader of a nested object of the same file.
    pub(crate) fn nested(&self, v: &'a Value) -> ConfigReader<'a> {
        ConfigReader { path: self.path, v }
    }

    pub(crate) fn err(&self, message: String) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            message,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(format!("missing {key}")))
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(format!("{key} must be a positive integer, found {v}"))),
        }
    }

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} must be a number, found {v}"))),
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} must be true or false, found {v}"))),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} must be a string, found {v}"))),
        }
    }

    /// A positive number, or `None` when the key is absent or null.
    pub(crate) fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.f64(key)? {
            Some(x) if x > 0.0 => Ok(Some(x as f32)),
            Some(x) => Err(self.err(format!("{key} must be positive, found {x}"))),
            None => Ok(None),
        }
    }

    pub(crate) fn ids(&self, key: &str) -> Vec<u32> {
        match self.get(key) {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// File `name` of `folder` as JSON.
pub(crate) fn read_json_in(folder: Folder<'_>, name: &str) -> Result<Value> {
    let path = folder.path(name);
    let text = folder
        .read_to_string(name)
        .map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path,
        message: e.to_string(),
    })
}

impl ModelConfig {
    /// The sizes the kernel plan depends on.
    pub fn dims(&self) -> crate::kernels::ModelDims {
        crate::kernels::ModelDims {
            hidden: self.hidden_size,
            head_dim: self.head_dim,
            q_width: self.num_heads * self.head_dim,
            intermediate: self.intermediate_size,
        }
    }

    /// The longest sequence the model may process: `max_position_embeddings`, or for YaRN
    /// the original context times the factor when that is longer (a checkpoint such as
    /// Qwen3 keeps its pretrained `max_position_embeddings` and gets YaRN added to reach
    /// four times as far; vLLM derives the same length).
    pub fn max_model_len(&self) -> usize {
        match self.rope_scaling {
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                ..
            } => {
                let scaled = (original_max_position_embeddings * factor).floor();
                self.max_position_embeddings.max(scaled as usize)
            }
            _ => self.max_position_embeddings,
        }
    }

    /// The context an engine serves unless told otherwise: [`Self::max_model_len`], except
    /// for LongRoPE checkpoints the original context their short factors are for, where
    /// every result equals transformers' (a longer `max_model_len` switches to the long
    /// factors; see [`RopeScaling::LongRope`]).
    pub fn default_context(&self) -> usize {
        match &self.rope_scaling {
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } => (*original_max_position_embeddings).min(self.max_position_embeddings),
            _ => self.max_position_embeddings,
        }
    }

    /// This config for a context of `context` tokens: the rope scalings as
    /// [`RopeScaling::for_context`] picks them.
    pub fn for_context(&self, context: usize) -> ModelConfig {
        let mut c = self.clone();
        c.rope_scaling = c.rope_scaling.for_context(context);
        if let Some(local) = &mut c.recipe.local_rope {
            local.scaling = local.scaling.for_context(context);
        }
        c
    }

    /// The rope of layer `i` (its local rope or the main one).
    pub fn layer_rope(&self, i: usize) -> Rope {
        match (&self.recipe.local_rope, self.recipe.layers[i].local_rope) {
            (Some(local), true) => local.clone(),
            _ => Rope {
                theta: self.rope_theta,
                scaling: self.rope_scaling.clone(),
            },
        }
    }
}

/// A rope from a `rope_parameters` object (transformers 5), or from the top-level
/// `rope_theta` / `rope_scaling` (transformers 4) where the object does not say.
/// `dims` is (head_dim, max_position_embeddings).
pub(crate) fn parse_rope(
    r: &ConfigReader<'_>,
    params: Option<&Value>,
    default_theta: f64,
    dims: (usize, usize),
) -> Result<Rope> {
    let theta = match params {
        Some(p) => r.nested(p).f64("rope_theta")?,
        None => None,
    }
    .or(r.f64("rope_theta")?)
    .unwrap_or(default_theta);
    let partial = match params {
        Some(p) => r.nested(p).f64("partial_rotary_factor")?,
        None => None,
    }
    .or(r.f64("partial_rotary_factor")?)
    .unwrap_or(1.0);
    if partial != 1.0 {
        return Err(ModelError::Unsupported(format!(
            "partial_rotary_factor {partial} (rope over part of each head is not implemented)"
        )));
    }
    let scaling = match r.get("rope_scaling").or(params) {
        None => RopeScaling::None,
        Some(s) => parse_scaling(&r.nested(s), r, dims)?,
    };
    Ok(Rope { theta, scaling })
}

/// `top` is the whole config, for the fields LongRoPE reads from it; `dims` is (head_dim,
/// max_position_embeddings).
fn parse_scaling(
    r: &ConfigReader<'_>,
    top: &ConfigReader<'_>,
    dims: (usize, usize),
) -> Result<RopeScaling> {
    let (head_dim, max_pos) = dims;
    let kind = r
        .get("rope_type")
        .or(r.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = || {
        r.f64("factor")?
            .filter(|f| *f > 0.0)
            .ok_or_else(|| r.err(format!("rope scaling {kind:?} needs a positive factor")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: factor()? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: r.f64("low_freq_factor")?.unwrap_or(1.0),
            high_freq_factor: r.f64("high_freq_factor")?.unwrap_or(4.0),
            original_max_position_embeddings: r
                .f64("original_max_position_embeddings")?
                .unwrap_or(8192.0),
        }),
        "longrope" | "su" => {
            let list = |key: &str| -> Result<Vec<f32>> {
                let v = r
                    .get(key)
                    .ok_or_else(|| r.err(format!("longrope scaling needs {key}")))?;
                let xs: Option<Vec<f32>> = v
                    .as_array()
                    .map(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
                    .unwrap_or(None);
                match xs {
                    Some(xs) if xs.len() == head_dim / 2 && xs.iter().all(|x| *x > 0.0) => Ok(xs),
                    _ => Err(r.err(format!(
                        "{key} must list {} positive numbers (head_dim / 2), found {v}",
                        head_dim / 2
                    ))),
                }
            };
            // transformers (Phi-3): the top-level field wins, then the scaling's own, then
            // Phi-3's default of 4096.
            let original = match top.opt_usize("original_max_position_embeddings")? {
                Some(n) => n,
                None => r
                    .opt_usize("original_max_position_embeddings")?
                    .unwrap_or(4096),
            };
            // transformers: the factor defaults to the context's growth, and the attention
            // factor to sqrt(1 + ln(factor) / ln(original)).
            let factor = r.f64("factor")?.unwrap_or(max_pos as f64 / original as f64);
            let attention_factor = match r.f64("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short_factor: list("short_factor")?,
                long_factor: list("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor,
                long: false,
            })
        }
        "yarn" => parse_yarn(r, top, max_pos),
        other => Err(ModelError::Unsupported(format!(
            "rope scaling type {other:?} (supported: default, linear, llama3, longrope, yarn)"
        ))),
    }
}

/// YaRN's settings as transformers reads them; `top` is the whole config, `max_pos` its
/// `max_position_embeddings`.
fn parse_yarn(r: &ConfigReader<'_>, top: &ConfigReader<'_>, max_pos: usize) -> Result<RopeScaling> {
    // transformers: the top-level field wins, then the scaling's own, then the
    // model's whole context.
    let original = match top.f64("original_max_position_embeddings")? {
        Some(n) => n,
        None => r
            .f64("original_max_position_embeddings")?
            .unwrap_or(max_pos as f64),
    };
    if original <= 0.0 {
        return Err(r.err(format!(
            "yarn scaling needs a positive original_max_position_embeddings, not \
             {original}"
        )));
    }
    let factor = match r.f64("factor")? {
        Some(f) if f > 0.0 => f,
        Some(f) => {
            let why = format!("yarn scaling needs a positive factor, not {f}");
            return Err(r.err(why));
        }
        None => max_pos as f64 / original,
    };
    // The paper's attention factor, 0.1 ln(factor) + 1, or DeepSeek's ratio of two
    // such when mscale and mscale_all_dim are both given.
    let mscale = |m: f64| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    let attention_factor = match (
        r.f64("attention_factor")?,
        r.f64("mscale")?.filter(|m| *m != 0.0),
        r.f64("mscale_all_dim")?.filter(|m| *m != 0.0),
    ) {
        (Some(a), _, _) if a > 0.0 => a,
        (Some(a), _, _) => {
            return Err(r.err(format!(
                "yarn scaling needs a positive attention_factor, not {a}"
            )))
        }
        (None, Some(m), Some(all)) => mscale(m) / mscale(all),
        (None, _, _) => mscale(1.0),
    };
    // transformers: a missing (or zero) beta takes the paper's value.
    let beta = |key: &str, default: f64| -> Result<f64> {
        Ok(r.f64(key)?.filter(|b| *b != 0.0).unwrap_or(default))
    };
    let (beta_fast, beta_slow) = (beta("beta_fast", 32.0)?, beta("beta_slow", 1.0)?);
    if beta_fast <= 0.0 || beta_slow <= 0.0 {
        return Err(r.err(format!(
            "yarn scaling needs positive beta_fast and beta_slow, not {beta_fast} and \
             {beta_slow}"
        )));
    }
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate: r.bool("truncate")?.unwrap_or(true),
    })
}
