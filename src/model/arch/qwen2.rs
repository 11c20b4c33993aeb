//! `qwen2` (Qwen2ForCausalLM): Llama's graph with q/k/v biases (never o), and with
//! `use_sliding_window` a window on the layers from `max_window_layers` on.

use super::{activation, qwen_windows, separate_layer, ArchDef, Architecture, Defaults};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "qwen2",
    architecture: Architecture::Qwen2,
    tied_by_default: false,
    defaults: Defaults::new(None, 32768, 1e-6),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        (cfg.qkv_bias, cfg.o_bias) = (true, false);
        qwen_windows(r, cfg)
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
