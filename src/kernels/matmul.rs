//! Launcher for `shaders/matmul.wgsl`: y = x · Wᵀ (+ bias) (+ y) for a Hugging Face
//! `[out, in]` weight, one dispatch per weight chunk.
//!
//! Batch invariance by construction: in both kernels each output element is one thread's
//! sequential sum over k, in increasing k, with the same expression, so a row's result does
//! not depend on how many other rows share the step or which kernel ran. That makes the
//! engine batch-invariant (a request produces the same tokens alone or in a batch, prefilled
//! or recomputed). `matmul_skinny.wgsl` serves up to [`SKINNY_MAX_M`] rows (decode) without
//! the 64-row tile's wasted arithmetic; a parallel reduction over k would be faster still
//! on a GPU but would round differently.

use super::{check_len, groups, params, Weight, MATMUL, MATMUL_SKINNY};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch};

params!(MatmulParams for MATMUL {
    m: u32,
    n: u32,
    k: u32,
    n_offset: u32,
    ldy: u32,
    has_bias: u32,
    accumulate: u32,
    _pad: u32,
});

params!(MatmulSkinnyParams for MATMUL_SKINNY {
    m: u32,
    n: u32,
    k: u32,
    n_offset: u32,
    ldy: u32,
    has_bias: u32,
    accumulate: u32,
    _pad: u32,
});

/// Rows up to which the skinny kernel runs instead of the tiled one.
pub const SKINNY_MAX_M: usize = 8;

/// How the product combines with what `y` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Overwrite,
    /// y += x · Wᵀ: the residual connection fused into the projection.
    Accumulate,
}

/// y[m, out] = x[m, in] · weight[out, in]ᵀ + bias[out]. `x`: [m, in] f32, `y`: [m, out]
/// f32, `bias`: [out] f32 or `None`.
pub fn matmul(
    batch: &mut Batch,
    x: &wgpu::Buffer,
    weight: &Weight,
    bias: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    m: usize,
    output: Output,
) -> Result<()> {
    const K: &str = "matmul";
    let (n_total, k) = (weight.rows, weight.cols);
    if m == 0 {
        return Ok(());
    }
    check_len(K, "x", x, m * k)?;
    check_len(K, "y", y, m * n_total)?;
    if let Some(b) = bias {
        check_len(K, "bias", b, n_total)?;
    }
    let max_dim = batch.ctx().limits.max_compute_workgroups_per_dimension;
    for chunk in &weight.chunks {
        let p = MatmulParams {
            m: m as u32,
            n: chunk.rows as u32,
            k: k as u32,
            n_offset: chunk.first_row as u32,
            ldy: n_total as u32,
            has_bias: bias.is_some() as u32,
            accumulate: (output == Output::Accumulate) as u32,
            _pad: 0,
        };
        // The bias binding must be valid even when unused.
        let bias_buf = bias.unwrap_or(&chunk.buffer);
        let storage = [x.into(), (&chunk.buffer).into(), bias_buf.into(), y.into()];
        let constants = [("WEIGHT_DTYPE", weight.dtype.code())];
        if m <= SKINNY_MAX_M {
            let ps: MatmulSkinnyParams = bytemuck::cast(p);
            let grid = grid_2d(groups(chunk.rows, 64), max_dim);
            batch.dispatch(MATMUL_SKINNY, &constants, &ps, &storage, grid)?;
            continue;
        }
        let grid = [groups(chunk.rows, 64), groups(m, 64), 1];
        if grid[0] > max_dim || grid[1] > max_dim {
            return Err(GpuError::invalid(
                K,
                format!("{m} x {} outputs in one call", chunk.rows),
            ));
        }
        batch.dispatch(MATMUL, &constants, &p, &storage, grid)?;
    }
    Ok(())
}
