//! Launcher for `shaders/rms_norm.wgsl`.

use super::{check_len, params, Weight, RMS_NORM};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch};

params!(RmsNormParams for RMS_NORM {
    num_tokens: u32,
    hidden: u32,
    eps: f32,
    _pad: u32,
});

/// out = x / sqrt(mean(x^2) + eps) * weight, row by row. `x`, `out`: [num_tokens, hidden];
/// `weight`: a [1, hidden] weight. `x` and `out` may not be the same buffer. Rows may be
/// tokens times heads (per-head norms), more than one grid dimension holds.
pub fn rms_norm(
    batch: &mut Batch,
    x: &wgpu::Buffer,
    weight: &Weight,
    out: &wgpu::Buffer,
    num_tokens: usize,
    eps: f32,
) -> Result<()> {
    const K: &str = "rms_norm";
    let hidden = weight.rows * weight.cols;
    if weight.chunks.len() != 1 {
        return Err(GpuError::invalid(K, "a norm weight must fit one buffer"));
    }
    check_len(K, "x", x, num_tokens * hidden)?;
    check_len(K, "out", out, num_tokens * hidden)?;
    let p = RmsNormParams {
        num_tokens: num_tokens as u32,
        hidden: hidden as u32,
        eps,
        _pad: 0,
    };
    batch.dispatch(
        RMS_NORM,
        &[("WEIGHT_DTYPE", weight.dtype.code())],
        &p,
        &[x.into(), (&weight.chunks[0].buffer).into(), out.into()],
        grid_2d(
            num_tokens as u32,
            batch.ctx().limits.max_compute_workgroups_per_dimension,
        ),
    )
}
