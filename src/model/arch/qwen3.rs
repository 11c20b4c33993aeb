//! `qwen3` (Qwen3ForCausalLM): Qwen2 without the fixed q/k/v biases (`attention_bias` on
//! q/k/v/o instead), plus an RMSNorm over each head of q and of k (`q_norm`, `k_norm`, one
//! weight of `head_dim`) before rope. `head_dim` is given, independent of the hidden size.

use super::{activation, qwen_windows, separate_layer, ArchDef, Architecture, Defaults};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "qwen3",
    architecture: Architecture::Qwen3,
    tied_by_default: false,
    defaults: Defaults::new(Some(128), 32768, 1e-6),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        cfg.recipe.qk_norm = true;
        qwen_windows(r, cfg)
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
