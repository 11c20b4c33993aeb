//! `gemma3_text` (Gemma3ForCausalLM, the text model). Gemma 2's graph with:
//!
//! - per-head q and k norms (weighing by `1 + w`, like every Gemma norm);
//! - no attention soft-capping (transformers' Gemma 3 attention ignores
//!   `attn_logit_softcapping`), final soft-capping only when configured;
//! - five sliding-window layers to one global (`sliding_window_pattern`, default 6) unless
//!   `layer_types` says otherwise;
//! - two ropes: the global layers' (`rope_parameters.full_attention`, base 1e6 by default,
//!   possibly scaled) and the local layers' (`rope_parameters.sliding_attention`, or
//!   `rope_local_base_freq`, base 1e4 by default).

use super::gemma2::{gemma_common, gemma_window};
use super::{layer_windows, separate_layer, ArchDef, Architecture, Defaults};
use crate::model::config::parse_rope;

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "gemma3_text",
    architecture: Architecture::Gemma3,
    tied_by_default: true,
    defaults: Defaults::new(Some(256), 131_072, 1e-6),
    configure: |r, cfg| {
        gemma_common(r, cfg, (None, None))?;
        cfg.recipe.attn_softcap = None;
        cfg.recipe.qk_norm = true;
        // The global rope's base defaults to 1e6 here, not 1e4.
        let params = r.get("rope_parameters");
        let global = params.map(|p| p.get("full_attention").unwrap_or(p));
        let has_theta =
            global.is_some_and(|g| g.get("rope_theta").is_some()) || r.get("rope_theta").is_some();
        if !has_theta {
            cfg.rope_theta = 1_000_000.0;
        }
        let local_theta = r.f64("rope_local_base_freq")?.unwrap_or(10_000.0);
        let local = match params.and_then(|p| p.get("sliding_attention")) {
            Some(p) => parse_rope(
                &r.nested(p),
                Some(p),
                local_theta,
                (cfg.head_dim, cfg.max_position_embeddings),
            )?,
            None => super::Rope {
                theta: local_theta,
                scaling: crate::nn::rope::RopeScaling::None,
            },
        };
        cfg.recipe.local_rope = Some(local);
        let window = gemma_window(r)?;
        let pattern = r.opt_usize("sliding_window_pattern")?.unwrap_or(6);
        // Sliding-type layers use the local rope, with or without a window.
        let sliding = layer_windows(r, cfg, window, |i| (i + 1) % pattern != 0)?;
        for (l, s) in cfg.recipe.layers.iter_mut().zip(sliding) {
            l.local_rope = s;
        }
        Ok(())
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
