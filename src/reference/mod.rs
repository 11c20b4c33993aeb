//! Plain-Rust reference versions of the kernels: simple loops in f32 (f64 where accuracy
//! matters), written from the definitions rather than from the shaders. Tests compare the
//! GPU against these, and the reference forward pass ([`crate::model::reference`]) is
//! built from them.
//!
//! Shapes follow the kernels: activations row-major `[rows, cols]`, weights Hugging Face
//! `[out, in]`.

/// `out[t] = table[ids[t]]`.
pub fn embedding(table: &[f32], hidden: usize, ids: &[u32]) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| {
            table[id as usize * hidden..(id as usize + 1) * hidden]
                .iter()
                .copied()
        })
        .collect()
}

/// Row-wise RMSNorm, accumulated in f64.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let h = weight.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(h) {
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(weight)
                .map(|(&v, &w)| ((v as f64 * inv) as f32) * w),
        );
    }
    out
}

/// y = x · wᵀ + bias, accumulated in f64. x: [m, k], w: [n, k], y: [m, n].
pub fn matmul(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f64;
            for kk in 0..k {
                acc += x[i * k + kk] as f64 * w[j * k + kk] as f64;
            }
            y[i * n + j] = acc as f32 + bias.map_or(0.0, |b| b[j]);
        }
    }
    y
}

/// Rotates one head vector in place in the Hugging Face layout (element i pairs with
/// i + d/2) by angles `pos * inv_freq[i]`, computed in f64.
pub fn rope_head(x: &mut [f32], pos: usize, inv_freq: &[f64]) {
    let half = x.len() / 2;
    for i in 0..half {
        let angle = pos as f64 * inv_freq[i];
        let (s, c) = angle.sin_cos();
        let (x1, x2) = (x[i] as f64, x[i + half] as f64);
        x[i] = (x1 * c - x2 * s) as f32;
        x[i + half] = (x2 * c + x1 * s) as f32;
    }
}

/// Inverse frequencies theta^(-2i/d), in f64, without scaling.
pub fn inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64))
        .collect()
}

/// silu(gate) * up.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| ((g as f64 / (1.0 + (-g as f64).exp())) * u as f64) as f32)
        .collect()
}

/// gpt-oss's clamped SwiGLU: `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` with
/// `g = min(gate, limit)`, in f64.
pub fn clamped_swiglu(gate: &[f32], up: &[f32], alpha: f32, limit: f32) -> Vec<f32> {
    let (alpha, limit) = (alpha as f64, limit as f64);
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = (g as f64).min(limit);
            let u = (u as f64).clamp(-limit, limit);
            ((u + 1.0) * g / (1.0 + (-alpha * g).exp())) as f32
        })
        .collect()
}

/// gelu(gate) * up, GELU with the tanh approximation (`gelu_pytorch_tanh`).
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g as f64;
            (0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u as f64) as f32
        })
        .collect()
}

/// The experts a mixture of experts runs for one token and their weights, from its router
/// logits: the `top_k` largest logits (the lower expert index first among equal ones), in
/// decreasing order, weighted as `routing` says, in f64.
pub fn route(
    logits: &[f32],
    top_k: usize,
    routing: crate::model::arch::Routing,
) -> Vec<(usize, f32)> {
    use crate::model::arch::Routing;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: equal logits keep increasing expert order.
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(top_k);
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let exp = |e: usize| (logits[e] as f64 - max).exp();
    match routing {
        Routing::SoftmaxTopK { renormalize } => {
            let all: f64 = (0..logits.len()).map(exp).sum();
            let kept: f64 = order.iter().map(|&e| exp(e) / all).sum();
            let scale = if renormalize { kept } else { 1.0 };
            order
                .iter()
                .map(|&e| (e, (exp(e) / all / scale) as f32))
                .collect()
        }
        Routing::TopKSoftmax => {
            // The chosen logits' own softmax, from the largest of them (the first).
            let top = order.first().map_or(0.0, |&e| logits[e] as f64);
            let chosen: Vec<f64> = order
                .iter()
                .map(|&e| (logits[e] as f64 - top).exp())
                .collect();
            let sum: f64 = chosen.iter().sum();
            order
                .iter()
                .zip(&chosen)
                .map(|(&e, &x)| (e, (x / sum) as f32))
                .collect()
        }
    }
}

/// Causal attention of one query head vector over a contiguous history.
/// `keys`, `values`: `[ctx_len, head_dim]` rows of this query's KV head; the query attends to
/// all `ctx_len` rows. Softmax in f64 with the max subtracted.
pub fn attend(q: &[f32], keys: &[f32], values: &[f32], head_dim: usize, scale: f32) -> Vec<f32> {
    attend_capped(q, keys, values, head_dim, scale, None)
}

/// [`attend`] with scores soft-capped, `cap * tanh(score / cap)`.
pub fn attend_capped(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    head_dim: usize,
    scale: f32,
    softcap: Option<f32>,
) -> Vec<f32> {
    attend_with_sink(q, keys, values, head_dim, scale, (softcap, None))
}

/// [`attend_capped`] (`extras.0` the soft-cap) with a sink (`extras.1`): a logit that joins
/// the softmax's sum as one more score, with no value (gpt-oss).
pub fn attend_with_sink(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    head_dim: usize,
    scale: f32,
    (softcap, sink): (Option<f32>, Option<f32>),
) -> Vec<f32> {
    let n = keys.len() / head_dim;
    let scores: Vec<f64> = (0..n)
        .map(|j| {
            let s = (0..head_dim)
                .map(|d| q[d] as f64 * keys[j * head_dim + d] as f64)
                .sum::<f64>()
                * scale as f64;
            match softcap {
                Some(c) => c as f64 * (s / c as f64).tanh(),
                None => s,
            }
        })
        .collect();
    let sink = sink.map(f64::from);
    let max = scores
        .iter()
        .chain(&sink)
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
    (0..head_dim)
        .map(|d| {
            (0..n)
                .map(|j| weights[j] * values[j * head_dim + d] as f64)
                .sum::<f64>()
                / sum
        })
        .map(|v| v as f32)
        .collect()
}

/// What [`windowed_attention`] computes besides plain causal attention: a sliding window
/// (a query at position p sees `p - window + 1 ..= p`), soft-capped scores, and a sink logit
/// per query head.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionExtras<'a> {
    pub window: Option<usize>,
    pub softcap: Option<f32>,
    pub sinks: Option<&'a [f32]>,
}

/// Causal multi-head attention of the query tokens of one sequence over its contiguous
/// history. `q`: `[query_len, num_heads, head_dim]` for positions `ctx_len - query_len ..
/// ctx_len`; `k`, `v`: `[ctx_len, num_kv_heads, head_dim]`. Returns `[query_len, num_heads,
/// head_dim]`. Query head h reads KV head h / (num_heads / num_kv_heads).
pub fn causal_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    scale: f32,
) -> Vec<f32> {
    let heads = (num_heads, num_kv_heads, head_dim);
    windowed_attention(q, k, v, heads, scale, AttentionExtras::default())
}

/// [`causal_attention`] where a query at position p sees only positions `p - window + 1
/// ..= p` (with a window), with scores soft-capped (with a cap). `heads` is (query heads,
/// KV heads, head_dim).
pub fn windowed_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: (usize, usize, usize),
    scale: f32,
    extras: AttentionExtras<'_>,
) -> Vec<f32> {
    let AttentionExtras {
        window,
        softcap,
        sinks,
    } = extras;
    let (num_heads, num_kv_heads, head_dim) = heads;
    let ctx_len = k.len() / (num_kv_heads * head_dim);
    let query_len = q.len() / (num_heads * head_dim);
    let group = num_heads / num_kv_heads;
    let mut out = Vec::with_capacity(q.len());
    for t in 0..query_len {
        let pos = ctx_len - query_len + t;
        for h in 0..num_heads {
            let kvh = h / group;
            let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let rows = |src: &[f32]| -> Vec<f32> {
                (first..=pos)
                    .flat_map(|j| {
                        let o = (j * num_kv_heads + kvh) * head_dim;
                        src[o..o + head_dim].to_vec()
                    })
                    .collect()
            };
            let qo = (t * num_heads + h) * head_dim;
            let sink = sinks.map(|s| s[h]);
            out.extend(attend_with_sink(
                &q[qo..qo + head_dim],
                &rows(k),
                &rows(v),
                head_dim,
                scale,
                (softcap, sink),
            ));
        }
    }
    out
}

/// Index of the largest value, the first on ties.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Rounds through f16, as the default KV pool stores values.
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// Rounds through bf16.
pub fn round_bf16(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect()
}

/// The sign D applies to element `i` of a rotated row: -1 when bit 31 of `i * 0x9E3779B1`
/// is set.
pub fn rotation_sign(i: usize) -> f32 {
    if (i as u32).wrapping_mul(0x9E37_79B1) >> 31 == 1 {
        -1.0
    } else {
        1.0
    }
}

/// The blocks (offset, size) the Hadamard rotation of a `head_dim` row works on: the
/// descending powers of two that sum to it.
pub fn rotation_blocks(head_dim: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut off, mut rest) = (0, head_dim);
    while rest > 1 {
        let n = 1 << (usize::BITS - 1 - rest.leading_zeros());
        out.push((off, n));
        off += n;
        rest -= n;
    }
    out
}

/// Rotates every `head_dim` row of `x` in place by R = H D (H the normalized Walsh-Hadamard
/// transform on each block of [`rotation_blocks`], D the signs of [`rotation_sign`]), or by
/// its inverse D H: what `shaders/rotate_rows.wgsl` does.
pub fn rotate_rows(x: &mut [f32], head_dim: usize, inverse: bool) {
    let blocks = rotation_blocks(head_dim);
    for row in x.chunks_mut(head_dim) {
        if !inverse {
            for (i, v) in row.iter_mut().enumerate() {
                *v *= rotation_sign(i);
            }
        }
        for &(off, n) in &blocks {
            let b = &mut row[off..off + n];
            let mut h = 1;
            while h < n {
                for i in (0..n).step_by(2 * h) {
                    for j in i..i + h {
                        let (a, c) = (b[j], b[j + h]);
                        b[j] = a + c;
                        b[j + h] = a - c;
                    }
                }
                h *= 2;
            }
            let s = 1.0 / (n as f32).sqrt();
            b.iter_mut().for_each(|v| *v *= s);
        }
        if inverse {
            for (i, v) in row.iter_mut().enumerate() {
                *v *= rotation_sign(i);
            }
        }
    }
}
