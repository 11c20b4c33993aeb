//! `mistral` (MistralForCausalLM): Llama's graph without biases, every layer windowed by
//! `sliding_window` (transformers' default 4096 when the key is absent; `null` for none).

use super::{activation, all_layers, separate_layer, window_or, ArchDef, Architecture, Defaults};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "mistral",
    architecture: Architecture::Mistral,
    tied_by_default: false,
    defaults: Defaults::new(None, 4096 * 32, 1e-6),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        (cfg.qkv_bias, cfg.o_bias) = (false, false);
        all_layers(cfg, window_or(r, Some(4096))?);
        Ok(())
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
