//! Reading a `config.json`: the fields every family shares (sizes, heads, rope, vocabulary,
//! special tokens), checked, then the family's own (its registry entry's `configure`, in
//! [`super::arch`]).

use super::arch;
use super::config::{parse_rope, read_json_in, ConfigReader, ModelConfig};
use super::error::{ModelError, Result};
use super::recipe::Recipe;
use crate::mapped::Folder;
use serde_json::Value;
use std::path::Path;

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_folder(Folder::Disk(dir))
    }

    /// Reads a folder's `config.json`, on disk or in memory.
    pub fn from_folder(folder: Folder<'_>) -> Result<Self> {
        Self::parse(
            &folder.path("config.json"),
            &read_json_in(folder, "config.json")?,
        )
    }

    pub fn parse(path: &Path, v: &Value) -> Result<Self> {
        let r = ConfigReader { path, v };
        let def = registry_entry(v)?;
        let (hidden_size, num_heads, num_kv_heads, head_dim) = attention_shape(&r, def)?;
        let num_layers = r.usize("num_hidden_layers")?;
        let max_position_embeddings = r
            .opt_usize("max_position_embeddings")?
            .unwrap_or(def.defaults.max_position_embeddings);

        // The main rope. transformers 5 nests it in rope_parameters (per layer type for
        // families with two ropes: then this is the full-attention layers' one);
        // transformers 4 keeps rope_theta at the top level and scaling in rope_scaling.
        let rope_params = r
            .get("rope_parameters")
            .map(|p| p.get("full_attention").unwrap_or(p));
        let rope = parse_rope(
            &r,
            rope_params,
            10000.0,
            (head_dim, max_position_embeddings),
        )?;

        let attention_bias = r.bool("attention_bias")?.unwrap_or(false);
        let mut eos_token_ids = r.ids("eos_token_id");
        eos_token_ids.dedup();
        let mut cfg = ModelConfig {
            architecture: def.architecture,
            vocab_size: r.usize("vocab_size")?,
            hidden_size,
            intermediate_size: r.usize("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: r.f64("rms_norm_eps")?.unwrap_or(def.defaults.rms_norm_eps) as f32,
            rope_theta: rope.theta,
            rope_scaling: rope.scaling,
            max_position_embeddings,
            tie_word_embeddings: r
                .bool("tie_word_embeddings")?
                .unwrap_or(def.tied_by_default),
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            mlp_bias: r.bool("mlp_bias")?.unwrap_or(false),
            bos_token_id: r.ids("bos_token_id").first().copied(),
            eos_token_ids,
            recipe: Recipe::llama(num_layers, head_dim),
        };
        (def.configure)(&r, &mut cfg)?;
        Ok(cfg)
    }
}

/// The registry entry of config.json's `model_type`, or an error listing what is supported.
fn registry_entry(v: &Value) -> Result<&'static arch::ArchDef> {
    let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    arch::lookup(model_type).ok_or_else(|| ModelError::UnknownArchitecture {
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
        supported: arch::supported().join(", "),
    })
}

/// `(hidden_size, num_attention_heads, num_key_value_heads, head_dim)`, checked: heads
/// divide into KV heads, and the head size is one the attention kernels take.
fn attention_shape(
    r: &ConfigReader<'_>,
    def: &arch::ArchDef,
) -> Result<(usize, usize, usize, usize)> {
    let hidden_size = r.usize("hidden_size")?;
    let num_heads = r.usize("num_attention_heads")?;
    let num_kv_heads = r.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    let head_dim = match r.opt_usize("head_dim")?.or(def.defaults.head_dim) {
        Some(d) => d,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(r.err(format!(
                "hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads} \
                 and head_dim is not given"
            )))
        }
    };
    if num_heads % num_kv_heads != 0 {
        return Err(r.err(format!(
            "num_attention_heads {num_heads} is not a multiple of num_key_value_heads \
             {num_kv_heads}"
        )));
    }
    if head_dim % 2 != 0 || head_dim > crate::kernels::paged_attention::MAX_HEAD_DIM {
        return Err(ModelError::Unsupported(format!(
            "head_dim {head_dim} (must be even and at most {})",
            crate::kernels::paged_attention::MAX_HEAD_DIM
        )));
    }
    Ok((hidden_size, num_heads, num_kv_heads, head_dim))
}
