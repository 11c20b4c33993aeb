//! `gemma2` (Gemma2ForCausalLM). Against Llama:
//!
//! - norms weigh by `(1 + w)`, and there are four per layer: before and after attention,
//!   before and after the MLP (`post_attention_layernorm` normalises the attention output);
//! - embeddings are multiplied by sqrt(hidden_size);
//! - the MLP's activation is `hidden_activation` (GELU, tanh approximation);
//! - scores are scaled by `query_pre_attn_scalar^-0.5` and soft-capped by
//!   `attn_logit_softcapping`, the final logits by `final_logit_softcapping`;
//! - layers alternate between sliding-window (even layers) and global attention, unless
//!   `layer_types` says otherwise.

use super::{
    activation, layer_windows, separate_layer, window_or, ArchDef, Architecture, Defaults, NormKind,
};
use crate::model::config::{ConfigReader, ModelConfig};
use crate::model::error::Result;

/// What Gemma 2 and Gemma 3 share. `softcap_defaults` are transformers' defaults of
/// (attention, final) soft-capping when config.json leaves the keys out.
pub(super) fn gemma_common(
    r: &ConfigReader<'_>,
    cfg: &mut ModelConfig,
    softcap_defaults: (Option<f32>, Option<f32>),
) -> Result<()> {
    let recipe = &mut cfg.recipe;
    recipe.norm = NormKind::OnePlusWeight;
    recipe.activation = activation(r, "hidden_activation", "gelu_pytorch_tanh")?;
    recipe.sandwich_norms = true;
    recipe.embed_scale = Some((cfg.hidden_size as f64).sqrt() as f32);
    let scalar = r.f64("query_pre_attn_scalar")?.unwrap_or(256.0);
    if scalar <= 0.0 {
        return Err(r.err(format!(
            "query_pre_attn_scalar must be positive, found {scalar}"
        )));
    }
    recipe.attn_scale = scalar.powf(-0.5) as f32;
    let cap = |key: &str, default: Option<f32>| match r.v.get(key) {
        None => Ok(default),
        Some(_) => r.opt_f32(key),
    };
    recipe.attn_softcap = cap("attn_logit_softcapping", softcap_defaults.0)?;
    recipe.final_softcap = cap("final_logit_softcapping", softcap_defaults.1)?;
    super::refuse_bool(
        r,
        "use_bidirectional_attention",
        "bidirectional attention is not implemented",
    )?;
    Ok(())
}

/// Gemma's window: `sliding_window` (4096 when absent).
pub(super) fn gemma_window(r: &ConfigReader<'_>) -> Result<Option<usize>> {
    window_or(r, Some(4096))
}

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "gemma2",
    architecture: Architecture::Gemma2,
    tied_by_default: true,
    defaults: Defaults::new(Some(256), 8192, 1e-6),
    configure: |r, cfg| {
        gemma_common(r, cfg, (Some(50.0), Some(30.0)))?;
        let window = gemma_window(r)?;
        layer_windows(r, cfg, window, |i| i % 2 == 0).map(drop)
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
