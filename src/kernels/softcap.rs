//! Launcher for `shaders/softcap.wgsl`.

use super::{check_len, groups, params, SOFTCAP};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch};

params!(SoftcapParams for SOFTCAP {
    len: u32,
    cap: f32,
    _pad0: u32,
    _pad1: u32,
});

/// `x[i] = cap * tanh(x[i] / cap)` over `len` f32 elements, in place.
pub fn softcap(batch: &mut Batch, x: &wgpu::Buffer, len: usize, cap: f32) -> Result<()> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(GpuError::invalid(
            "softcap",
            format!("cap {cap} must be positive"),
        ));
    }
    check_len("softcap", "x", x, len)?;
    let p = SoftcapParams {
        len: len as u32,
        cap,
        ..Default::default()
    };
    let grid = grid_2d(
        groups(len, 256),
        batch.ctx().limits.max_compute_workgroups_per_dimension,
    );
    batch.dispatch(SOFTCAP, &[], &p, &[x.into()], grid)
}
