//! `llama` (LlamaForCausalLM): the base recipe. Optional biases: `attention_bias` on q/k/v/o,
//! `mlp_bias` on gate/up/down.

use super::{activation, separate_layer, ArchDef, Architecture, Defaults};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "llama",
    architecture: Architecture::Llama,
    tied_by_default: false,
    defaults: Defaults::new(None, 2048, 1e-6),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        Ok(())
    },
    layer: |cfg, i| separate_layer(cfg, i),
};
