//! The model registry: one module per Hugging Face architecture (`model_type` in
//! `config.json`). Each declares
//!
//! - its **config fields** (`configure`): the family's own keys and defaults, read on top of
//!   the fields every family shares (sizes, heads, rope, vocabulary, special tokens);
//! - its **recipe** ([`Recipe`]): which norm, activation and attention options the shared
//!   layer graph uses, its mixture of experts ([`Moe`]), and per layer ([`LayerRecipe`]) its
//!   sliding window, rope table and whether its MLP is the mixture;
//! - its **tensors** (`layer`): where each of a layer's weights lives in the checkpoint,
//!   including rows of fused tensors and each expert's projections ([`LayerTensors`]);
//!   checkpoints that stack their experts are split at load (`prepare_checkpoint`).
//!
//! The GPU forward pass ([`super::forward`]) and the plain-Rust reference
//! ([`super::reference`]) both follow the recipe; neither names an architecture. Adding a
//! family means a module here, a line in [`REGISTRY`], and a fixture.

mod gemma2;
mod gemma3;
pub(crate) mod gpt_oss;
mod llama;
mod mistral;
mod mixtral;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use super::config::{ConfigReader, ModelConfig};
use super::error::{ModelError, Result};
pub use super::recipe::{Architecture, LayerRecipe, Moe, NormKind, Recipe, Rope, Routing};
use crate::nn::Activation;

/// Where one logical weight lives: a checkpoint tensor, or a run of its rows (a fused
/// projection split at load).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub name: String,
    /// `(first row, rows)` of a 2-D tensor; `None` for the whole tensor.
    pub rows: Option<(usize, usize)>,
}

/// One decoder layer's weights.
#[derive(Clone, Debug)]
pub struct LayerTensors {
    pub input_norm: Slice,
    pub q: Slice,
    pub k: Slice,
    pub v: Slice,
    pub o: Slice,
    pub q_bias: Option<Slice>,
    pub k_bias: Option<Slice>,
    pub v_bias: Option<Slice>,
    pub o_bias: Option<Slice>,
    /// Per-head norms of q and k ([`Recipe::qk_norm`]).
    pub q_norm: Option<Slice>,
    pub k_norm: Option<Slice>,
    /// The norm of the attention output ([`Recipe::sandwich_norms`]).
    pub post_attn_norm: Option<Slice>,
    /// Each head's sink logit (`[heads]`, [`Recipe::attn_sinks`]).
    pub sinks: Option<Slice>,
    /// The norm in front of the MLP.
    pub mlp_norm: Slice,
    /// The norm of the MLP output ([`Recipe::sandwich_norms`]).
    pub post_mlp_norm: Option<Slice>,
    pub mlp: MlpTensors,
    /// Every checkpoint tensor the slices come from, with its full shape.
    pub checkpoint: Vec<(String, Vec<usize>)>,
}

/// A layer's MLP: dense, or a mixture of experts ([`LayerRecipe::sparse`]).
#[derive(Clone, Debug)]
pub enum MlpTensors {
    Dense(DenseMlp),
    Experts(ExpertTensors),
}

/// A gated MLP's projections and their optional biases.
#[derive(Clone, Debug)]
pub struct DenseMlp {
    pub gate: Slice,
    pub up: Slice,
    pub down: Slice,
    pub gate_bias: Option<Slice>,
    pub up_bias: Option<Slice>,
    pub down_bias: Option<Slice>,
}

/// A mixture of experts' weights: the router `[experts, hidden]` and each expert's gate
/// and up `[intermediate, hidden]` and down `[hidden, intermediate]`, in expert order; with
/// [`Moe::biased`], their biases (`[experts]`, `[intermediate]`, `[hidden]`).
#[derive(Clone, Debug)]
pub struct ExpertTensors {
    pub router: Slice,
    pub gate: Vec<Slice>,
    pub up: Vec<Slice>,
    pub down: Vec<Slice>,
    pub router_bias: Option<Slice>,
    pub gate_bias: Option<Vec<Slice>>,
    pub up_bias: Option<Vec<Slice>>,
    pub down_bias: Option<Vec<Slice>>,
}

/// An architecture of the registry.
pub struct ArchDef {
    pub model_type: &'static str,
    pub architecture: Architecture,
    /// `tie_word_embeddings` when config.json does not say (transformers' default for the
    /// family).
    pub tied_by_default: bool,
    /// transformers' defaults for keys config.json may leave out: `head_dim` (`None`:
    /// hidden_size / num_attention_heads), `max_position_embeddings`, `rms_norm_eps`.
    pub defaults: Defaults,
    /// Reads the family's own config fields and sets [`ModelConfig::recipe`]; the shared
    /// fields are read already.
    pub configure: fn(&ConfigReader<'_>, &mut ModelConfig) -> Result<()>,
    /// The tensors of layer `i`.
    pub layer: fn(&ModelConfig, usize) -> LayerTensors,
}

/// Per-family defaults of shared config keys (see [`ArchDef::defaults`]).
#[derive(Clone, Copy, Debug)]
pub struct Defaults {
    pub head_dim: Option<usize>,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
}

impl Defaults {
    const fn new(head_dim: Option<usize>, max_position_embeddings: usize, eps: f64) -> Self {
        Defaults {
            head_dim,
            max_position_embeddings,
            rms_norm_eps: eps,
        }
    }
}

/// Every supported architecture.
pub const REGISTRY: &[&ArchDef] = &[
    &llama::DEF,
    &mistral::DEF,
    &qwen2::DEF,
    &qwen3::DEF,
    &gemma2::DEF,
    &gemma3::DEF,
    &phi3::DEF,
    &mixtral::DEF,
    &qwen3_moe::DEF,
    &gpt_oss::DEF,
];

/// The registry entry of `model_type`.
pub fn lookup(model_type: &str) -> Option<&'static ArchDef> {
    REGISTRY
        .iter()
        .copied()
        .find(|d| d.model_type == model_type)
}

/// The registry entry of an architecture.
pub fn def(a: Architecture) -> &'static ArchDef {
    REGISTRY
        .iter()
        .copied()
        .find(|d| d.architecture == a)
        .expect("every architecture is registered")
}

/// The `model_type`s the registry knows, for error messages.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|d| d.model_type).collect()
}

/// Collects a layer's checkpoint tensors while its slices are declared.
struct Tensors {
    prefix: String,
    list: Vec<(String, Vec<usize>)>,
}

impl Tensors {
    fn new(i: usize) -> Self {
        Tensors {
            prefix: format!("model.layers.{i}"),
            list: Vec::new(),
        }
    }

    /// The whole tensor `{prefix}.{name}` of `shape`.
    fn whole(&mut self, name: &str, shape: Vec<usize>) -> Slice {
        let name = format!("{}.{name}", self.prefix);
        self.list.push((name.clone(), shape));
        Slice { name, rows: None }
    }

    fn opt(&mut self, on: bool, name: &str, shape: Vec<usize>) -> Option<Slice> {
        on.then(|| self.whole(name, shape))
    }

    /// A mixture of experts' router and projections, named as `names` says.
    fn experts(&mut self, names: &ExpertNames, moe: &Moe, hidden: usize) -> ExpertTensors {
        let (n, inter, module) = (moe.experts, moe.intermediate, names.module);
        let router_name = format!("{module}.{}", names.router);
        let router = self.whole(&format!("{router_name}.weight"), vec![n, hidden]);
        let router_bias = self.opt(moe.biased, &format!("{router_name}.bias"), vec![n]);
        let mut each = |which: &str, kind: &str, shape: &[usize]| -> Vec<Slice> {
            (0..n)
                .map(|e| {
                    let name = format!("{module}.{}.{kind}", (names.expert)(e, which));
                    self.whole(&name, shape.to_vec())
                })
                .collect()
        };
        let gate = each("gate", "weight", &[inter, hidden]);
        let up = each("up", "weight", &[inter, hidden]);
        let down = each("down", "weight", &[hidden, inter]);
        let gate_bias = moe.biased.then(|| each("gate", "bias", &[inter]));
        let up_bias = moe.biased.then(|| each("up", "bias", &[inter]));
        let down_bias = moe.biased.then(|| each("down", "bias", &[hidden]));
        ExpertTensors {
            router,
            gate,
            up,
            down,
            router_bias,
            gate_bias,
            up_bias,
            down_bias,
        }
    }

    /// Consecutive row runs of the fused 2-D tensor `{prefix}.{name}`, `parts` rows each.
    fn split(&mut self, name: &str, parts: &[usize], cols: usize) -> Vec<Slice> {
        let name = format!("{}.{name}", self.prefix);
        self.list
            .push((name.clone(), vec![parts.iter().sum(), cols]));
        let mut first = 0;
        parts
            .iter()
            .map(|&n| {
                let s = Slice {
                    name: name.clone(),
                    rows: Some((first, n)),
                };
                first += n;
                s
            })
            .collect()
    }
}

/// Separate q/k/v/o and gate/up/down projections under Llama's names, with the biases
/// `cfg` asks for, q/k norms when the recipe has them, and the norms the recipe puts around
/// attention and the MLP: Llama's two (`post_attention_layernorm` is the MLP's input norm)
/// or, with [`Recipe::sandwich_norms`], Gemma's four (`post_attention_layernorm`
/// normalises the attention output, `pre_feedforward_layernorm` is the MLP's input norm).
fn separate_layer(cfg: &ModelConfig, i: usize) -> LayerTensors {
    separate_layer_named(cfg, i, &EXPERTS)
}

/// How a family names a mixture of experts' tensors: `{module}.{router}.weight` is the
/// router, `{module}.{expert(e, which)}.weight` expert e's projection `which` ("gate", "up"
/// or "down"); biases, where [`Moe::biased`], end in `.bias` instead.
struct ExpertNames {
    module: &'static str,
    router: &'static str,
    expert: fn(usize, &str) -> String,
}

/// Qwen's (and most families') names: `mlp.experts.{e}.gate_proj.weight`, ...
const EXPERTS: ExpertNames = ExpertNames {
    module: "mlp",
    router: "gate",
    expert: |e, which| format!("experts.{e}.{which}_proj"),
};

/// [`separate_layer`] with a family's own names for its experts.
fn separate_layer_named(cfg: &ModelConfig, i: usize, names: &ExpertNames) -> LayerTensors {
    let (h, inter, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let mut t = Tensors::new(i);
    let input_norm = t.whole("input_layernorm.weight", vec![h]);
    let q = t.whole("self_attn.q_proj.weight", vec![qd, h]);
    let k = t.whole("self_attn.k_proj.weight", vec![kvd, h]);
    let v = t.whole("self_attn.v_proj.weight", vec![kvd, h]);
    let o = t.whole("self_attn.o_proj.weight", vec![h, qd]);
    let q_bias = t.opt(cfg.qkv_bias, "self_attn.q_proj.bias", vec![qd]);
    let k_bias = t.opt(cfg.qkv_bias, "self_attn.k_proj.bias", vec![kvd]);
    let v_bias = t.opt(cfg.qkv_bias, "self_attn.v_proj.bias", vec![kvd]);
    let o_bias = t.opt(cfg.o_bias, "self_attn.o_proj.bias", vec![h]);
    let qk = cfg.recipe.qk_norm;
    let q_norm = t.opt(qk, "self_attn.q_norm.weight", vec![hd]);
    let k_norm = t.opt(qk, "self_attn.k_norm.weight", vec![hd]);
    let sinks = t.opt(
        cfg.recipe.attn_sinks,
        "self_attn.sinks",
        vec![cfg.num_heads],
    );
    let sandwich = cfg.recipe.sandwich_norms;
    let post_attn_norm = t.opt(sandwich, "post_attention_layernorm.weight", vec![h]);
    let mlp_norm = match sandwich {
        true => t.whole("pre_feedforward_layernorm.weight", vec![h]),
        false => t.whole("post_attention_layernorm.weight", vec![h]),
    };
    let post_mlp_norm = t.opt(sandwich, "post_feedforward_layernorm.weight", vec![h]);
    let mlp = match (cfg.recipe.layers[i].sparse, cfg.recipe.moe) {
        (true, Some(moe)) => MlpTensors::Experts(t.experts(names, &moe, h)),
        _ => MlpTensors::Dense(DenseMlp {
            gate: t.whole("mlp.gate_proj.weight", vec![inter, h]),
            up: t.whole("mlp.up_proj.weight", vec![inter, h]),
            down: t.whole("mlp.down_proj.weight", vec![h, inter]),
            gate_bias: t.opt(cfg.mlp_bias, "mlp.gate_proj.bias", vec![inter]),
            up_bias: t.opt(cfg.mlp_bias, "mlp.up_proj.bias", vec![inter]),
            down_bias: t.opt(cfg.mlp_bias, "mlp.down_proj.bias", vec![h]),
        }),
    };
    LayerTensors {
        input_norm,
        q,
        k,
        v,
        o,
        q_bias,
        k_bias,
        v_bias,
        o_bias,
        q_norm,
        k_norm,
        post_attn_norm,
        mlp_norm,
        post_mlp_norm,
        sinks,
        mlp,
        checkpoint: t.list,
    }
}

/// gpt-oss's experts' clamped SwiGLU with the config's `swiglu_alpha` and `swiglu_limit`
/// (transformers' defaults 1.702 and 7).
fn activation_default_swiglu(r: &ConfigReader<'_>) -> Result<Activation> {
    let alpha = r.opt_f32("swiglu_alpha")?.unwrap_or(1.702);
    let limit = r.opt_f32("swiglu_limit")?.unwrap_or(7.0);
    Ok(Activation::ClampedSwiglu { alpha, limit })
}

/// What a family's checkpoint needs before its tensors match the spec (gpt-oss's stacked
/// experts split, [`gpt_oss::split_experts`]); nothing for most.
pub(crate) fn prepare_checkpoint(cfg: &ModelConfig, ck: &mut super::Checkpoint) -> Result<()> {
    match cfg.architecture {
        Architecture::GptOss => gpt_oss::split_experts(cfg, ck),
        _ => Ok(()),
    }
}

/// The activation a config names (`key` is `hidden_act` or Gemma's `hidden_activation`).
fn activation(r: &ConfigReader<'_>, key: &str, default: &str) -> Result<Activation> {
    let name = r.str(key)?.unwrap_or(default);
    match name {
        "silu" | "swish" => Ok(Activation::Silu),
        "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        other => Err(ModelError::Unsupported(format!(
            "{key} {other:?} (implemented: silu, gelu_pytorch_tanh)"
        ))),
    }
}

/// Which layers slide: `layer_types` when config.json lists them, else `default(i)`.
/// Every sliding layer gets `window`; without a window they attend to everything, as in
/// transformers. Returns which layers are of the sliding type.
fn layer_windows(
    r: &ConfigReader<'_>,
    cfg: &mut ModelConfig,
    window: Option<usize>,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>> {
    let n = cfg.num_layers;
    let sliding: Vec<bool> = match r.get("layer_types") {
        None => (0..n).map(default).collect(),
        Some(v) => {
            let list = v.as_array().filter(|a| a.len() == n).ok_or_else(|| {
                r.err(format!("layer_types must list {n} layer types, found {v}"))
            })?;
            list.iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(false),
                    Some("sliding_attention") => Ok(true),
                    _ => Err(ModelError::Unsupported(format!(
                        "layer type {t} (implemented: full_attention, sliding_attention)"
                    ))),
                })
                .collect::<Result<_>>()?
        }
    };
    for (l, &s) in cfg.recipe.layers.iter_mut().zip(&sliding) {
        l.window = if s { window } else { None };
    }
    Ok(sliding)
}

/// The window every layer of Mistral and Phi-3 uses (transformers applies
/// `sliding_window` to all their layers and ignores `layer_types`).
fn all_layers(cfg: &mut ModelConfig, window: Option<usize>) {
    cfg.recipe.layers.iter_mut().for_each(|l| l.window = window);
}

/// `sliding_window`: `default` when the key is absent, none when it is null.
fn window_or(r: &ConfigReader<'_>, default: Option<usize>) -> Result<Option<usize>> {
    match r.v.get("sliding_window") {
        None => Ok(default),
        Some(_) => r.opt_usize("sliding_window"),
    }
}

/// Qwen2/Qwen3's windows: with `use_sliding_window` and a window, layers from
/// `max_window_layers` on slide (or as `layer_types` says).
fn qwen_windows(r: &ConfigReader<'_>, cfg: &mut ModelConfig) -> Result<()> {
    let window = match r.bool("use_sliding_window")?.unwrap_or(false) {
        true => window_or(r, Some(4096))?,
        false => None,
    };
    let from = r.opt_usize("max_window_layers")?.unwrap_or(28);
    layer_windows(r, cfg, window, |i| window.is_some() && i >= from).map(drop)
}

/// Refuses config keys whose feature is not implemented when they are set to anything
/// other than their neutral value.
fn refuse_bool(r: &ConfigReader<'_>, key: &str, what: &str) -> Result<()> {
    if r.bool(key)?.unwrap_or(false) {
        return Err(ModelError::Unsupported(format!("{key}: {what}")));
    }
    Ok(())
}

/// The most experts a mixture may have, and the most it may run per token (the routing
/// kernel's limits, above every published model's 128-256 and 8).
pub const MAX_EXPERTS: usize = 256;
pub const MAX_TOP_K: usize = 16;

/// A mixture of experts' settings from the config: the expert count (`num_local_experts`,
/// or its alias `num_experts`, as transformers' attribute maps read them), `top_k` from
/// `num_experts_per_tok`, each absent one the family's default (`defaults`: experts, top
/// k), and each expert's width.
fn moe(
    r: &ConfigReader<'_>,
    intermediate: usize,
    defaults: (usize, usize),
    routing: Routing,
) -> Result<Moe> {
    let experts = match (
        r.opt_usize("num_local_experts")?,
        r.opt_usize("num_experts")?,
    ) {
        (Some(a), Some(b)) if a != b => {
            return Err(r.err(format!(
                "num_local_experts ({a}) and num_experts ({b}) disagree"
            )))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => defaults.0,
    };
    let top_k = r.opt_usize("num_experts_per_tok")?.unwrap_or(defaults.1);
    if top_k > experts {
        return Err(r.err(format!(
            "num_experts_per_tok ({top_k}) exceeds the number of experts ({experts})"
        )));
    }
    if experts > MAX_EXPERTS || top_k > MAX_TOP_K {
        return Err(ModelError::Unsupported(format!(
            "{experts} experts with {top_k} per token (implemented: up to {MAX_EXPERTS} \
             experts and {MAX_TOP_K} per token)"
        )));
    }
    Ok(Moe {
        experts,
        top_k,
        intermediate,
        routing,
        biased: false,
    })
}
