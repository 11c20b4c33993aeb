//! `config.json` of a Hugging Face Llama-family checkpoint (model types `llama`, `mistral`,
//! `qwen2`), read into the few numbers the runtime needs and checked for consistency.
//!
//! Rope settings come in two spellings: transformers 4 writes `rope_theta` and
//! `rope_scaling` at the top level; transformers 5 writes a `rope_parameters` object
//! (`rope_theta`, `rope_type`, `factor`, ...). Both are read.

use super::error::{ModelError, Result};
use crate::kernels::rope::RopeScaling;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Which Hugging Face architecture the checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
}

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
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2 always; Llama when `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (Llama `attention_bias`).
    pub o_bias: bool,
    /// MLP projections carry a bias (Llama `mlp_bias`).
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Mistral/Qwen2 sliding-window attention span, when the checkpoint uses one.
    pub sliding_window: Option<usize>,
}

struct Reader<'a> {
    path: &'a Path,
    v: &'a Value,
}

impl Reader<'_> {
    fn err(&self, message: String) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            message,
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(format!("missing {key}")))
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(format!("{key} must be a positive integer, found {v}"))),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} must be a number, found {v}"))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(format!("{key} must be true or false, found {v}"))),
        }
    }

    fn ids(&self, key: &str) -> Vec<u32> {
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

/// Reads and parses a JSON file, with errors naming it.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|error| ModelError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path: PathBuf = dir.join("config.json");
        Self::parse(&path, &read_json(&path)?)
    }

    pub fn parse(path: &Path, v: &Value) -> Result<Self> {
        let r = Reader { path, v };
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let architecture = match model_type {
            "llama" => Architecture::Llama,
            "mistral" => Architecture::Mistral,
            "qwen2" => Architecture::Qwen2,
            _ => {
                return Err(ModelError::UnknownArchitecture {
                    model_type: model_type.to_string(),
                    architectures: v
                        .get("architectures")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            }
        };
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(ModelError::Unsupported(format!(
                    "hidden_act {act:?} (only silu is implemented)"
                )));
            }
        }
        let hidden_size = r.usize("hidden_size")?;
        let num_heads = r.usize("num_attention_heads")?;
        let num_kv_heads = r.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = match r.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(r.err(format!(
                    "hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads} and head_dim is not given"
                )))
            }
        };
        if num_heads % num_kv_heads != 0 {
            return Err(r.err(format!(
                "num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}"
            )));
        }
        if head_dim % 2 != 0 || head_dim > crate::kernels::paged_attention::MAX_HEAD_DIM {
            return Err(ModelError::Unsupported(format!(
                "head_dim {head_dim} (must be even and at most {})",
                crate::kernels::paged_attention::MAX_HEAD_DIM
            )));
        }

        // Rope: transformers 5 nests it in rope_parameters; transformers 4 keeps rope_theta
        // at the top level and scaling in rope_scaling.
        let rope_params = r.get("rope_parameters");
        let rope_theta = match rope_params {
            Some(p) => Reader { path, v: p }.f64("rope_theta")?,
            None => None,
        }
        .or(r.f64("rope_theta")?)
        .unwrap_or(10000.0);
        let scaling_obj = r.get("rope_scaling").or(rope_params);
        let rope_scaling = match scaling_obj {
            None => RopeScaling::None,
            Some(s) => parse_scaling(&Reader { path, v: s })?,
        };

        let attention_bias = r.bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let mut eos_token_ids = r.ids("eos_token_id");
        eos_token_ids.dedup();
        let mut cfg = ModelConfig {
            architecture,
            vocab_size: r.usize("vocab_size")?,
            hidden_size,
            intermediate_size: r.usize("intermediate_size")?,
            num_layers: r.usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: r.f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: r.opt_usize("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: r.bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: r.bool("mlp_bias")?.unwrap_or(false),
            bos_token_id: r.ids("bos_token_id").first().copied(),
            eos_token_ids,
            sliding_window: None,
        };
        if cfg.architecture != Architecture::Llama {
            let used = r
                .bool("use_sliding_window")?
                .unwrap_or(cfg.architecture == Architecture::Mistral);
            if used {
                cfg.sliding_window = r.opt_usize("sliding_window")?;
            }
        }
        Ok(cfg)
    }

    /// The longest sequence the model may process: `max_position_embeddings`, or a shorter
    /// sliding window (sliding-window attention is not implemented; within the window it
    /// equals full attention, so capping the context keeps results exact).
    pub fn max_model_len(&self) -> usize {
        match self.sliding_window {
            Some(w) => w.min(self.max_position_embeddings),
            None => self.max_position_embeddings,
        }
    }
}

fn parse_scaling(r: &Reader<'_>) -> Result<RopeScaling> {
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
        other => Err(ModelError::Unsupported(format!(
            "rope scaling type {other:?} (supported: default, linear, llama3)"
        ))),
    }
}
