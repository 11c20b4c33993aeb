//! `phi3` (Phi3ForCausalLM; Phi-3 and Phi-4-mini). Llama's graph with fused projections:
//! `self_attn.qkv_proj` holds q, k and v rows one after the other and `mlp.gate_up_proj`
//! the gate rows then the up rows; q, k and v are split at load (gate and up are used
//! stacked, as every family's are). Rope may be LongRoPE (`longrope`,
//! formerly `su`), and every layer is windowed when `sliding_window` is set.

use super::{
    activation, all_layers, window_or, ArchDef, Architecture, Defaults, DenseMlp, LayerTensors,
    MlpTensors, Tensors,
};
use crate::model::config::ModelConfig;

fn layer(cfg: &ModelConfig, i: usize) -> LayerTensors {
    let (h, inter, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut t = Tensors::new(i);
    let input_norm = t.whole("input_layernorm.weight", vec![h]);
    let mut qkv = t
        .split("self_attn.qkv_proj.weight", &[qd, kvd, kvd], h)
        .into_iter();
    let (q, k, v) = (
        qkv.next().unwrap(),
        qkv.next().unwrap(),
        qkv.next().unwrap(),
    );
    let o = t.whole("self_attn.o_proj.weight", vec![h, qd]);
    let mlp_norm = t.whole("post_attention_layernorm.weight", vec![h]);
    let mut gate_up = t
        .split("mlp.gate_up_proj.weight", &[inter, inter], h)
        .into_iter();
    let (gate, up) = (gate_up.next().unwrap(), gate_up.next().unwrap());
    let down = t.whole("mlp.down_proj.weight", vec![h, inter]);
    LayerTensors {
        input_norm,
        q,
        k,
        v,
        o,
        q_bias: None,
        k_bias: None,
        v_bias: None,
        o_bias: None,
        q_norm: None,
        k_norm: None,
        post_attn_norm: None,
        mlp_norm,
        post_mlp_norm: None,
        sinks: None,
        mlp: MlpTensors::Dense(DenseMlp {
            gate,
            up,
            down,
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        }),
        checkpoint: t.list,
    }
}

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "phi3",
    architecture: Architecture::Phi3,
    tied_by_default: false,
    defaults: Defaults::new(None, 4096, 1e-5),
    configure: |r, cfg| {
        cfg.recipe.activation = activation(r, "hidden_act", "silu")?;
        (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) = (false, false, false);
        all_layers(cfg, window_or(r, None)?);
        Ok(())
    },
    layer,
};
