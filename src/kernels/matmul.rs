//! Launchers for `shaders/matmul.wgsl` (tiled, any m) and `shaders/matvec.wgsl` (m <= 8,
//! decode). Both compute y = x · Wᵀ (+ bias) (+ y) for a Hugging Face `[out, in]` weight,
//! one dispatch per weight chunk.

use super::{check_len, groups, params, Weight, MATMUL, MATVEC};
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

params!(MatvecParams for MATVEC {
    m: u32,
    n: u32,
    k: u32,
    n_offset: u32,
    ldy: u32,
    has_bias: u32,
    accumulate: u32,
    _pad: u32,
});

/// Rows handled by the matvec kernel; more rows go to the tiled kernel.
pub const MATVEC_MAX_M: usize = 8;

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
        if m <= MATVEC_MAX_M {
            let grid = grid_2d(chunk.rows as u32, max_dim);
            let pv: MatvecParams = bytemuck::cast(p);
            batch.dispatch(MATVEC, &constants, &pv, &storage, grid)?;
        } else {
            let grid = [groups(chunk.rows, 64), groups(m, 64), 1];
            if grid[1] > max_dim {
                return Err(GpuError::invalid(K, format!("{m} rows in one call")));
            }
            batch.dispatch(MATMUL, &constants, &p, &storage, grid)?;
        }
    }
    Ok(())
}
