//! Rotary position embedding: the host-side frequency table (rope_theta plus linear or
//! Llama-3 frequency scaling, following Hugging Face's `rope_init_fn`s) and the launcher for
//! `shaders/rope.wgsl`.

use super::{check_len, groups, params, ROPE};
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind, GpuContext};

params!(RopeParams for ROPE {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    max_positions: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
});

/// Frequency scaling of the rotary embedding (`rope_scaling` / `rope_parameters`).
#[derive(Clone, Debug, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// LongRoPE (Phi-3): every frequency divided by its own factor, and cos/sin multiplied
    /// by `attention_factor`. transformers switches a sequence from the short factors to
    /// the long ones once it grows past `original_max_position_embeddings`, which a KV
    /// cache cannot follow without recomputing the sequence. pagellm picks one set for the
    /// whole context it serves ([`RopeScaling::for_context`]): the short factors up to the
    /// original length (transformers' numbers for every sequence), the long ones beyond
    /// (transformers' numbers for sequences longer than the original length).
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
        /// Use `long_factor`.
        long: bool,
    },
}

impl RopeScaling {
    /// The scaling a context of `context` tokens uses: LongRoPE's long factors when the
    /// context exceeds the original one; anything else unchanged.
    pub fn for_context(&self, context: usize) -> RopeScaling {
        let mut s = self.clone();
        if let RopeScaling::LongRope {
            original_max_position_embeddings,
            long,
            ..
        } = &mut s
        {
            *long = context > *original_max_position_embeddings;
        }
        s
    }

    /// The factor cos and sin are multiplied by (1 except for LongRoPE).
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::LongRope {
                attention_factor, ..
            } => *attention_factor as f32,
            _ => 1.0,
        }
    }
}

/// The `head_dim / 2` inverse frequencies, in f32 as transformers computes them.
pub fn inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let f = 1.0 / (theta as f32).powf(exponent);
            match *scaling {
                RopeScaling::None => f,
                RopeScaling::Linear { factor } => f / factor as f32,
                // transformers: 1 / (factor * theta^exponent), in f32.
                RopeScaling::LongRope {
                    ref short_factor,
                    ref long_factor,
                    long,
                    ..
                } => {
                    let factor = if long {
                        long_factor[i]
                    } else {
                        short_factor[i]
                    };
                    1.0 / (factor * (theta as f32).powf(exponent))
                }
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: old,
                } => {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let low_freq_wavelen = old / low_freq_factor;
                    let high_freq_wavelen = old / high_freq_factor;
                    let scaled = if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    };
                    scaled as f32
                }
            }
        })
        .collect()
}

/// The table rope.wgsl reads: `[max_positions, head_dim]`, each row `cos` of the
/// `head_dim/2` angles then their `sin`, each times `attention_factor` (in f32, as
/// transformers scales them). Angles are f32 products as in transformers; the
/// trigonometry is done in f64.
pub fn cos_sin_table(inv_freq: &[f32], max_positions: usize, attention_factor: f32) -> Vec<f32> {
    let half = inv_freq.len();
    let mut table = vec![0.0f32; max_positions * half * 2];
    for pos in 0..max_positions {
        let row = &mut table[pos * half * 2..(pos + 1) * half * 2];
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = (pos as f32 * f) as f64;
            row[i] = angle.cos() as f32 * attention_factor;
            row[half + i] = angle.sin() as f32 * attention_factor;
        }
    }
    table
}

/// The cos/sin table on the GPU.
#[derive(Debug)]
pub struct RopeTable {
    pub buffer: wgpu::Buffer,
    pub head_dim: usize,
    pub max_positions: usize,
}

impl RopeTable {
    pub fn new(
        ctx: &GpuContext,
        head_dim: usize,
        theta: f64,
        scaling: &RopeScaling,
        max_positions: usize,
    ) -> Result<Self> {
        if !head_dim.is_multiple_of(2) || head_dim == 0 || max_positions == 0 {
            return Err(GpuError::invalid(
                "rope",
                format!(
                    "head_dim {head_dim} must be even and max_positions {max_positions} positive"
                ),
            ));
        }
        let table = cos_sin_table(
            &inv_freq(head_dim, theta, scaling),
            max_positions,
            scaling.attention_factor(),
        );
        Ok(RopeTable {
            buffer: ctx.upload("rope cos/sin", &table)?,
            head_dim,
            max_positions,
        })
    }
}

/// Rotates q `[num_tokens, num_heads, head_dim]` and k `[num_tokens, num_kv_heads,
/// head_dim]` in place by the angles of `positions` (`[num_tokens]` u32, each below the
/// table's `max_positions`; larger ones are clamped).
#[allow(clippy::too_many_arguments)]
pub fn rope<'a>(
    batch: &mut Batch,
    table: &RopeTable,
    positions: impl Into<Bind<'a>>,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    num_tokens: usize,
    num_heads: usize,
    num_kv_heads: usize,
) -> Result<()> {
    let positions: Bind<'_> = positions.into();
    const K: &str = "rope";
    let hd = table.head_dim;
    check_len(K, "positions", positions, num_tokens)?;
    check_len(K, "q", q, num_tokens * num_heads * hd)?;
    check_len(K, "k", k, num_tokens * num_kv_heads * hd)?;
    let p = RopeParams {
        num_tokens: num_tokens as u32,
        num_heads: num_heads as u32,
        num_kv_heads: num_kv_heads as u32,
        head_dim: hd as u32,
        max_positions: table.max_positions as u32,
        ..Default::default()
    };
    batch.dispatch(
        ROPE,
        &[],
        &p,
        &[positions, (&table.buffer).into(), q.into(), k.into()],
        [
            groups((num_heads + num_kv_heads) * hd / 2, 64),
            num_tokens as u32,
            1,
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies_follow_theta() {
        let f = inv_freq(8, 10000.0, &RopeScaling::None);
        let want = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() < 1e-6 * b.max(1e-3), "{f:?}");
        }
    }

    #[test]
    fn llama3_scaling_by_hand() {
        // theta = 10000, head_dim = 8: frequencies 1, 0.1, 0.01, 0.001 rad/token, i.e.
        // wavelengths 6.28, 62.8, 628, 6283 tokens. With 64 original positions, factor 8,
        // low_freq_factor 1 and high_freq_factor 4: wavelengths below 16 keep their
        // frequency, above 64 are divided by 8, and between (62.8) blend with
        // smooth = (64 / 62.83 - 1) / 3 = 0.00619.
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let f = inv_freq(8, 10000.0, &s);
        let smooth = (64.0 / (2.0 * std::f64::consts::PI / 0.1) - 1.0) / 3.0;
        let mid = ((1.0 - smooth) * 0.1 / 8.0 + smooth * 0.1) as f32;
        let want = [1.0, mid, 0.01 / 8.0, 0.001 / 8.0];
        for (a, b) in f.iter().zip(want) {
            assert!((a - b).abs() <= 1e-6 * b, "got {f:?}, want {want:?}");
        }
    }

    #[test]
    fn linear_scaling_divides() {
        let f = inv_freq(4, 100.0, &RopeScaling::Linear { factor: 4.0 });
        assert!(
            (f[0] - 0.25).abs() < 1e-7 && (f[1] - 0.025).abs() < 1e-7,
            "{f:?}"
        );
    }
}
