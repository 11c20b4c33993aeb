//! A plain-Rust forward pass in f32 (f64 accumulation inside the reference kernels), with no
//! KV cache and no batching: every call recomputes the whole sequence. It is the oracle the
//! GPU engine is tested against, built only from [`crate::reference`] and the checkpoint,
//! and it follows the same architecture recipe ([`super::arch::Recipe`]) as the GPU graph.

use super::arch::{MlpTensors, Moe, Slice};
use super::error::ModelError;
use super::error::Result;
use super::gpu::{computing_config, norm_values};
use super::spec;
use super::{ModelConfig, ModelFiles};
use crate::nn::Activation;
use crate::reference as r;

struct Layer {
    input_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    o_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
    mlp_norm: Vec<f32>,
    post_mlp_norm: Option<Vec<f32>>,
    mlp: Mlp,
    /// Inverse frequencies of this layer's rope, and the factor on cos/sin.
    inv_freq: Vec<f64>,
    rope_factor: f32,
}

/// A gated MLP's weights: `[inter, hidden]` gate and up, `[hidden, inter]` down.
struct Dense {
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    gate_bias: Option<Vec<f32>>,
    up_bias: Option<Vec<f32>>,
    down_bias: Option<Vec<f32>>,
}

enum Mlp {
    Dense(Dense),
    /// The router `[experts, hidden]` and each expert's MLP.
    Experts {
        moe: Moe,
        router: Vec<f32>,
        router_bias: Option<Vec<f32>>,
        experts: Vec<Dense>,
    },
}

/// A layer's MLP weights widened to f32.
fn mlp(cfg: &ModelConfig, ck: &super::Checkpoint, tensors: &MlpTensors) -> Result<Mlp> {
    let get = |s: &Slice| ck.part(s).map(|p| p.to_f32());
    let opt = |s: &Option<Slice>| s.as_ref().map(get).transpose();
    Ok(match tensors {
        MlpTensors::Dense(d) => Mlp::Dense(Dense {
            gate: get(&d.gate)?,
            up: get(&d.up)?,
            down: get(&d.down)?,
            gate_bias: opt(&d.gate_bias)?,
            up_bias: opt(&d.up_bias)?,
            down_bias: opt(&d.down_bias)?,
        }),
        MlpTensors::Experts(x) => Mlp::Experts {
            moe: cfg.recipe.moe.ok_or_else(|| {
                ModelError::Unsupported("expert tensors without the recipe's experts".into())
            })?,
            router: get(&x.router)?,
            router_bias: opt(&x.router_bias)?,
            experts: (0..x.gate.len())
                .map(|e| {
                    let bias = |b: &Option<Vec<Slice>>| b.as_ref().map(|v| get(&v[e])).transpose();
                    Ok(Dense {
                        gate: get(&x.gate[e])?,
                        up: get(&x.up[e])?,
                        down: get(&x.down[e])?,
                        gate_bias: bias(&x.gate_bias)?,
                        up_bias: bias(&x.up_bias)?,
                        down_bias: bias(&x.down_bias)?,
                    })
                })
                .collect::<Result<_>>()?,
        },
    })
}

/// The model's weights widened to f32 on the host.
pub struct ReferenceModel {
    pub config: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Option<Vec<f32>>,
}

impl ReferenceModel {
    /// The model for its default context ([`ModelConfig::default_context`]).
    pub fn new(files: &ModelFiles) -> Result<Self> {
        Self::for_context(files, files.config.default_context())
    }

    /// The model for sequences of up to `context` tokens (which picks LongRoPE's factors,
    /// see [`ModelConfig::for_context`]).
    pub fn for_context(files: &ModelFiles, context: usize) -> Result<Self> {
        let ck = &files.checkpoint;
        let cfg = computing_config(files, context)?;
        let get = |s: &Slice| ck.part(s).map(|p| p.to_f32());
        let opt = |s: &Option<Slice>| s.as_ref().map(get).transpose();
        let norm = |s: &Slice| get(s).map(|w| norm_values(&cfg, w));
        let opt_norm = |s: &Option<Slice>| s.as_ref().map(norm).transpose();
        let whole = |name: &str| Slice {
            name: name.to_string(),
            rows: None,
        };
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let n = spec::layer(&cfg, i);
                let rope = cfg.layer_rope(i);
                Ok(Layer {
                    input_norm: norm(&n.input_norm)?,
                    q: get(&n.q)?,
                    k: get(&n.k)?,
                    v: get(&n.v)?,
                    o: get(&n.o)?,
                    q_bias: opt(&n.q_bias)?,
                    k_bias: opt(&n.k_bias)?,
                    v_bias: opt(&n.v_bias)?,
                    o_bias: opt(&n.o_bias)?,
                    q_norm: opt_norm(&n.q_norm)?,
                    k_norm: opt_norm(&n.k_norm)?,
                    post_attn_norm: opt_norm(&n.post_attn_norm)?,
                    sinks: opt(&n.sinks)?,
                    mlp_norm: norm(&n.mlp_norm)?,
                    post_mlp_norm: opt_norm(&n.post_mlp_norm)?,
                    mlp: mlp(&cfg, ck, &n.mlp)?,
                    inv_freq: crate::nn::rope::inv_freq(cfg.head_dim, rope.theta, &rope.scaling)
                        .into_iter()
                        .map(f64::from)
                        .collect(),
                    rope_factor: rope.scaling.attention_factor(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ReferenceModel {
            embed: get(&whole(spec::EMBED))?,
            layers,
            norm: norm(&whole(spec::FINAL_NORM))?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(get(&whole(spec::LM_HEAD))?)
            },
            config: cfg,
        })
    }

    /// Logits `[tokens.len(), vocab]` at every position of `tokens` (causal).
    pub fn forward(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let rc = &c.recipe;
        let (t, h, hd) = (tokens.len(), c.hidden_size, c.head_dim);
        let (nh, nkv, inter) = (c.num_heads, c.num_kv_heads, c.intermediate_size);
        let eps = c.rms_norm_eps;
        let mut x = r::embedding(&self.embed, h, tokens);
        if let Some(s) = rc.embed_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        // The residual add, through the output norm when the recipe has one.
        let add = |x: &mut Vec<f32>, y: Vec<f32>, norm: &Option<Vec<f32>>| {
            let y = match norm {
                Some(w) => r::rms_norm(&y, w, eps),
                None => y,
            };
            x.iter_mut().zip(&y).for_each(|(x, y)| *x += y);
        };
        for (i, l) in self.layers.iter().enumerate() {
            let a = r::rms_norm(&x, &l.input_norm, eps);
            let mut q = r::matmul(&a, &l.q, l.q_bias.as_deref(), t, nh * hd, h);
            let mut k = r::matmul(&a, &l.k, l.k_bias.as_deref(), t, nkv * hd, h);
            let v = r::matmul(&a, &l.v, l.v_bias.as_deref(), t, nkv * hd, h);
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                q = r::rms_norm(&q, qn, eps);
                k = r::rms_norm(&k, kn, eps);
            }
            for pos in 0..t {
                let rows = q[pos * nh * hd..(pos + 1) * nh * hd]
                    .chunks_mut(hd)
                    .chain(k[pos * nkv * hd..(pos + 1) * nkv * hd].chunks_mut(hd));
                for head in rows {
                    r::rope_head(head, pos, &l.inv_freq);
                    head.iter_mut().for_each(|v| *v *= l.rope_factor);
                }
            }
            let window = rc.layers[i].window;
            let heads = (nh, nkv, hd);
            let extras = r::AttentionExtras {
                window,
                softcap: rc.attn_softcap,
                sinks: l.sinks.as_deref(),
            };
            let attn = r::windowed_attention(&q, &k, &v, heads, rc.attn_scale, extras);
            let o = r::matmul(&attn, &l.o, l.o_bias.as_deref(), t, h, nh * hd);
            add(&mut x, o, &l.post_attn_norm);
            let m = r::rms_norm(&x, &l.mlp_norm, eps);
            let d = match &l.mlp {
                Mlp::Dense(d) => self.dense(d, &m, t, inter),
                Mlp::Experts {
                    moe,
                    router,
                    router_bias,
                    experts,
                } => self.experts(moe, (router, router_bias.as_deref()), experts, &m, t),
            };
            add(&mut x, d, &l.post_mlp_norm);
        }
        let x = r::rms_norm(&x, &self.norm, eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = r::matmul(&x, head, None, t, c.vocab_size, h);
        if let Some(cap) = rc.final_softcap {
            logits
                .iter_mut()
                .for_each(|v| *v = (cap as f64 * (*v as f64 / cap as f64).tanh()) as f32);
        }
        logits.chunks(c.vocab_size).map(<[f32]>::to_vec).collect()
    }

    /// A gated MLP of width `inter` over `t` rows of `m`.
    fn dense(&self, d: &Dense, m: &[f32], t: usize, inter: usize) -> Vec<f32> {
        let h = self.config.hidden_size;
        let g = r::matmul(m, &d.gate, d.gate_bias.as_deref(), t, inter, h);
        let u = r::matmul(m, &d.up, d.up_bias.as_deref(), t, inter, h);
        let act = match self.config.recipe.activation {
            Activation::Silu => r::silu_mul(&g, &u),
            Activation::GeluTanh => r::gelu_tanh_mul(&g, &u),
            Activation::ClampedSwiglu { alpha, limit } => r::clamped_swiglu(&g, &u, alpha, limit),
        };
        r::matmul(&act, &d.down, d.down_bias.as_deref(), t, h, inter)
    }

    /// A mixture of experts over `t` rows of `m`: each row's chosen experts' outputs, times
    /// their routing weights, summed in f64.
    fn experts(
        &self,
        moe: &Moe,
        (router, router_bias): (&[f32], Option<&[f32]>),
        experts: &[Dense],
        m: &[f32],
        t: usize,
    ) -> Vec<f32> {
        let h = self.config.hidden_size;
        let logits = r::matmul(m, router, router_bias, t, moe.experts, h);
        let mut out = vec![0.0; t * h];
        for (row, (x, y)) in m.chunks(h).zip(out.chunks_mut(h)).enumerate() {
            let chosen = r::route(
                &logits[row * moe.experts..][..moe.experts],
                moe.top_k,
                moe.routing,
            );
            let mut acc = vec![0.0f64; h];
            for (e, w) in chosen {
                let d = self.dense(&experts[e], x, 1, moe.intermediate);
                acc.iter_mut()
                    .zip(&d)
                    .for_each(|(a, &v)| *a += w as f64 * v as f64);
            }
            y.iter_mut().zip(&acc).for_each(|(y, &a)| *y = a as f32);
        }
        out
    }

    /// `n` greedy tokens after `prompt`, recomputing the sequence at each step.
    pub fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut seq = prompt.to_vec();
        for _ in 0..n {
            let logits = self.forward(&seq);
            let last = logits.last().map(|row| r::argmax(row) as u32).unwrap_or(0);
            seq.push(last);
        }
        seq[prompt.len()..].to_vec()
    }
}

/// log_softmax of a logits row, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}
