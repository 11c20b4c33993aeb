//! A plain-Rust forward pass in f32 (f64 accumulation inside the reference kernels), with no
//! KV cache and no batching: every call recomputes the whole sequence. It is the oracle the
//! GPU engine is tested against, built only from [`crate::reference`] and the checkpoint.

use super::error::Result;
use super::spec::{self, LayerNames};
use super::{ModelConfig, ModelFiles};
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
    post_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    gate_bias: Option<Vec<f32>>,
    up_bias: Option<Vec<f32>>,
    down_bias: Option<Vec<f32>>,
}

/// The model's weights widened to f32 on the host.
pub struct ReferenceModel {
    pub config: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Option<Vec<f32>>,
    inv_freq: Vec<f64>,
}

impl ReferenceModel {
    pub fn new(files: &ModelFiles) -> Result<Self> {
        let ck = &files.checkpoint;
        let cfg = files.config.clone();
        let get = |name: &str| ck.get(name).map(|t| t.to_f32());
        let opt = |name: &Option<String>| name.as_deref().map(get).transpose();
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let n = LayerNames::new(&cfg, i);
                Ok(Layer {
                    input_norm: get(&n.input_norm)?,
                    q: get(&n.q)?,
                    k: get(&n.k)?,
                    v: get(&n.v)?,
                    o: get(&n.o)?,
                    q_bias: opt(&n.q_bias)?,
                    k_bias: opt(&n.k_bias)?,
                    v_bias: opt(&n.v_bias)?,
                    o_bias: opt(&n.o_bias)?,
                    post_norm: get(&n.post_norm)?,
                    gate: get(&n.gate)?,
                    up: get(&n.up)?,
                    down: get(&n.down)?,
                    gate_bias: opt(&n.gate_bias)?,
                    up_bias: opt(&n.up_bias)?,
                    down_bias: opt(&n.down_bias)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let inv_freq =
            crate::kernels::rope::inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
                .into_iter()
                .map(f64::from)
                .collect();
        Ok(ReferenceModel {
            embed: get(spec::EMBED)?,
            layers,
            norm: get(spec::FINAL_NORM)?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(get(spec::LM_HEAD)?)
            },
            inv_freq,
            config: cfg,
        })
    }

    /// Logits `[tokens.len(), vocab]` at every position of `tokens` (causal).
    pub fn forward(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let (t, h, hd) = (tokens.len(), c.hidden_size, c.head_dim);
        let (nh, nkv, inter) = (c.num_heads, c.num_kv_heads, c.intermediate_size);
        let mut x = r::embedding(&self.embed, h, tokens);
        for l in &self.layers {
            let a = r::rms_norm(&x, &l.input_norm, c.rms_norm_eps);
            let mut q = r::matmul(&a, &l.q, l.q_bias.as_deref(), t, nh * hd, h);
            let mut k = r::matmul(&a, &l.k, l.k_bias.as_deref(), t, nkv * hd, h);
            let v = r::matmul(&a, &l.v, l.v_bias.as_deref(), t, nkv * hd, h);
            for pos in 0..t {
                for head in q[pos * nh * hd..(pos + 1) * nh * hd].chunks_mut(hd) {
                    r::rope_head(head, pos, &self.inv_freq);
                }
                for head in k[pos * nkv * hd..(pos + 1) * nkv * hd].chunks_mut(hd) {
                    r::rope_head(head, pos, &self.inv_freq);
                }
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let attn = r::causal_attention(&q, &k, &v, nh, nkv, hd, scale);
            let o = r::matmul(&attn, &l.o, l.o_bias.as_deref(), t, h, nh * hd);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let m = r::rms_norm(&x, &l.post_norm, c.rms_norm_eps);
            let g = r::matmul(&m, &l.gate, l.gate_bias.as_deref(), t, inter, h);
            let u = r::matmul(&m, &l.up, l.up_bias.as_deref(), t, inter, h);
            let d = r::matmul(
                &r::silu_mul(&g, &u),
                &l.down,
                l.down_bias.as_deref(),
                t,
                h,
                inter,
            );
            x.iter_mut().zip(&d).for_each(|(x, d)| *x += d);
        }
        let x = r::rms_norm(&x, &self.norm, c.rms_norm_eps);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        r::matmul(&x, head, None, t, c.vocab_size, h)
            .chunks(c.vocab_size)
            .map(<[f32]>::to_vec)
            .collect()
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
