//! Rotary position embedding on the GPU: the cos/sin table (computed by [`crate::nn::rope`])
//! uploaded once, and the launcher for `shaders/rope.wgsl`.

use super::{check_len, groups, params, ROPE};
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind, GpuContext};
use crate::nn::rope::{cos_sin_table, inv_freq, RopeScaling};

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
