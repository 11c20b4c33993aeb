//! What a model computes, as plain data: its architecture, and the recipe the shared layer
//! graph follows for it ([`Recipe`]: norms, activation, attention options, and per layer
//! ([`LayerRecipe`]) its sliding window and rope table). The registry (`arch`) fills these
//! in per family; the config, the GPU forward pass and the reference all read them.

use crate::nn::rope::RopeScaling;
use crate::nn::Activation;

/// Which Hugging Face architecture a checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Mixtral,
    Qwen3Moe,
    GptOss,
}

/// How a norm applies its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / rms(x) * w` (Llama and most families).
    Weight,
    /// `x / rms(x) * (1 + w)` (Gemma: weights are stored as offsets from one). Loaders add
    /// the one in f32, as transformers does, so the kernels see an ordinary weight.
    OnePlusWeight,
}

/// One rotary embedding: base and frequency scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// What one decoder layer does differently from its neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerRecipe {
    /// Sliding-window attention: a query at position p sees keys at positions
    /// `p - window + 1 ..= p` (transformers' `kv_idx > q_idx - sliding_window`).
    pub window: Option<usize>,
    /// Uses [`Recipe::local_rope`] instead of the model's main rope (Gemma 3's local layers).
    pub local_rope: bool,
    /// The MLP is the mixture of experts of [`Recipe::moe`] (else the dense MLP).
    pub sparse: bool,
}

/// How a mixture-of-experts layer turns its router's logits into the weights of the `k`
/// experts it runs for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// A softmax over every expert's logit; the `k` largest probabilities kept, divided by
    /// their sum when `renormalize` (Mixtral always; Qwen3-MoE with `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The `k` largest logits, then a softmax over those alone (gpt-oss).
    TopKSoftmax,
}

/// The mixture-of-experts MLP of a family's sparse layers: a router (a linear map to one
/// logit per expert), the top `top_k` experts per token by [`Routing`], each a gated MLP of
/// `intermediate` (the recipe's activation), and their outputs summed with the routing
/// weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub routing: Routing,
    /// The router and every expert projection carry a bias (gpt-oss).
    pub biased: bool,
}

/// How the shared layer graph computes for one architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub norm: NormKind,
    pub activation: Activation,
    /// Per-head RMSNorm of q and k (weights of `head_dim`) before rope (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Norms after attention and after the MLP too, before each residual add (Gemma 2/3):
    /// `x += norm(attn(norm(x)))`, `x += norm(mlp(norm(x)))`.
    pub sandwich_norms: bool,
    /// Embeddings multiplied by this (Gemma: sqrt(hidden_size), in f32).
    pub embed_scale: Option<f32>,
    /// Attention scores' scale (`head_dim^-0.5`, or Gemma's `query_pre_attn_scalar^-0.5`).
    pub attn_scale: f32,
    /// `cap * tanh(score / cap)` on attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// A learned logit per head (`self_attn.sinks`) joins each softmax's sum as a score with
    /// no value (gpt-oss's attention sinks).
    pub attn_sinks: bool,
    /// `cap * tanh(logit / cap)` on the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The rope of layers with [`LayerRecipe::local_rope`].
    pub local_rope: Option<Rope>,
    /// The experts of the layers with [`LayerRecipe::sparse`].
    pub moe: Option<Moe>,
    /// One entry per layer.
    pub layers: Vec<LayerRecipe>,
}

impl Recipe {
    /// Llama's graph for `num_layers` layers of full attention, scale `head_dim^-0.5`.
    pub fn llama(num_layers: usize, head_dim: usize) -> Self {
        Recipe {
            norm: NormKind::Weight,
            activation: Activation::Silu,
            qk_norm: false,
            sandwich_norms: false,
            embed_scale: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_softcap: None,
            attn_sinks: false,
            final_softcap: None,
            local_rope: None,
            moe: None,
            layers: vec![
                LayerRecipe {
                    window: None,
                    local_rope: false,
                    sparse: false,
                };
                num_layers
            ],
        }
    }

    /// The window every layer shares, when every layer is windowed: then a KV block whose
    /// tokens all lie outside it can be freed.
    pub fn common_window(&self) -> Option<usize> {
        let first = self.layers.first()?.window?;
        self.layers
            .iter()
            .all(|l| l.window == Some(first))
            .then_some(first)
    }
}
