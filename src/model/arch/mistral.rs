//! `mistral` (MistralForCausalLM): Llama's graph without biases, every layer windowed by
//! `sliding_window` (transformers' default 4096 when the key is absent; `null` for none).

use super::{activation, layer_windows, separate_layer, ArchDef, Architecture, LLAMA_NORMS};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "mistral",
    architecture: Architecture::Mistral,
    tied_by_default: false,
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        (cfg.qkv_bias, cfg.o_bias) = (false, false);
        let window = match r.v.get("sliding_window") {
            None => Some(4096),
            Some(_) => r.opt_usize("sliding_window")?,
        };
        layer_windows(r, cfg, window, |_| window.is_some())
    },
    layer: |cfg, i| separate_layer(cfg, i, &LLAMA_NORMS),
};
