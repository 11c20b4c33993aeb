//! `mixtral` (MixtralForCausalLM): Mistral's attention with a mixture of experts in every
//! layer's place of the MLP: `block_sparse_moe.gate` routes each token to
//! `num_experts_per_tok` of `num_local_experts` experts (softmax over all, the top k
//! renormalised to sum 1), each a SiLU-gated MLP of `intermediate_size` (`w1` the gate, `w3`
//! the up and `w2` the down projection).

use super::{
    activation, all_layers, moe, separate_layer_named, window_or, ArchDef, Architecture, Defaults,
    ExpertNames, Routing,
};

const NAMES: ExpertNames = ExpertNames {
    module: "block_sparse_moe",
    router: "gate",
    expert: |e, which| {
        let w = match which {
            "gate" => "w1",
            "up" => "w3",
            _ => "w2",
        };
        format!("experts.{e}.{w}")
    },
};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "mixtral",
    architecture: Architecture::Mixtral,
    tied_by_default: false,
    defaults: Defaults::new(None, 4096 * 32, 1e-5),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) = (false, false, false);
        all_layers(cfg, window_or(r, None)?);
        let routing = Routing::SoftmaxTopK { renormalize: true };
        cfg.recipe.moe = Some(moe(r, cfg.intermediate_size, (8, 2), routing)?);
        cfg.recipe.layers.iter_mut().for_each(|l| l.sparse = true);
        Ok(())
    },
    layer: |cfg, i| separate_layer_named(cfg, i, &NAMES),
};
