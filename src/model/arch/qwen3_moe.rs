//! `qwen3_moe` (Qwen3MoeForCausalLM; Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention
//! (per-head q/k norms) with a mixture of experts (`mlp.gate` and `mlp.experts.{e}`) in the
//! sparse layers: a softmax over the `num_experts` router logits, the top
//! `num_experts_per_tok` kept (renormalised only with `norm_topk_prob`), each expert a gated
//! MLP of `moe_intermediate_size`. Layer i is sparse unless `mlp_only_layers` lists it or
//! `decoder_sparse_step` skips it ((i + 1) % step != 0); dense layers keep an MLP of
//! `intermediate_size`. With `use_sliding_window` every layer is windowed.

use super::{
    activation, all_layers, moe, separate_layer, window_or, ArchDef, Architecture, Defaults,
    Routing,
};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "qwen3_moe",
    architecture: Architecture::Qwen3Moe,
    tied_by_default: false,
    defaults: Defaults::new(None, 32768, 1e-6),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        cfg.recipe.qk_norm = true;
        let window = match r.bool("use_sliding_window")?.unwrap_or(false) {
            true => window_or(r, Some(4096))?,
            false => None,
        };
        all_layers(cfg, window);
        let inter = r.opt_usize("moe_intermediate_size")?.unwrap_or(768);
        let renormalize = r.bool("norm_topk_prob")?.unwrap_or(false);
        let m = moe(r, inter, (128, 8), Routing::SoftmaxTopK { renormalize })?;
        let step = r.opt_usize("decoder_sparse_step")?.unwrap_or(1);
        let dense: Vec<u64> = match r.get("mlp_only_layers") {
            None => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_u64()).collect())
                .ok_or_else(|| {
                    r.err(format!(
                        "mlp_only_layers must list layer numbers, found {v}"
                    ))
                })?,
        };
        for (i, l) in cfg.recipe.layers.iter_mut().enumerate() {
            l.sparse = !dense.contains(&(i as u64)) && (i + 1) % step == 0;
        }
        cfg.recipe.moe = Some(m);
        Ok(())
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
