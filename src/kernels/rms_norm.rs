//! Launcher for `shaders/rms_norm.wgsl` and `shaders/rms_norm_lanes.wgsl`.

use super::{check_len, params, Weight, RMS_NORM, RMS_NORM_LANES};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch};

params!(RmsNormParams for RMS_NORM {
    num_tokens: u32,
    hidden: u32,
    eps: f32,
    _pad: u32,
});

pub use super::choice::RmsNormKernel;

/// out = x / sqrt(mean(x^2) + eps) * weight, row by row, by `kernel`. `x`, `out`:
/// [num_tokens, hidden]; `weight`: a [1, hidden] weight. `x` and `out` may not be the same
/// buffer. Rows may be tokens times heads (per-head norms), more than one grid dimension
/// holds.
pub fn rms_norm(
    batch: &mut Batch,
    kernel: RmsNormKernel,
    x: &wgpu::Buffer,
    weight: &Weight,
    out: &wgpu::Buffer,
    num_tokens: usize,
    eps: f32,
) -> Result<()> {
    const K: &str = "rms_norm";
    let hidden = weight.rows * weight.cols;
    if !kernel.supports(hidden) {
        return Err(GpuError::invalid(
            K,
            format!("{kernel:?} cannot normalise rows of {hidden}"),
        ));
    }
    if weight.chunks.len() != 1 || weight.dtype().is_block() {
        return Err(GpuError::invalid(
            K,
            format!(
                "a norm weight must be f32, f16 or bf16 in one buffer, not {} in {}",
                weight.dtype().name(),
                weight.chunks.len()
            ),
        ));
    }
    check_len(K, "x", x, num_tokens * hidden)?;
    check_len(K, "out", out, num_tokens * hidden)?;
    let p = RmsNormParams {
        num_tokens: num_tokens as u32,
        hidden: hidden as u32,
        eps,
        _pad: 0,
    };
    let (source, groups) = match kernel {
        RmsNormKernel::Workgroup => (RMS_NORM, num_tokens),
        RmsNormKernel::Lanes => (RMS_NORM_LANES, num_tokens.div_ceil(8)),
    };
    batch.dispatch(
        source,
        &[("WEIGHT_DTYPE", weight.dtype().code())],
        &p,
        &[x.into(), (&weight.chunks[0].buffer).into(), out.into()],
        grid_2d(
            groups as u32,
            batch.ctx().limits.max_compute_workgroups_per_dimension,
        ),
    )
}
