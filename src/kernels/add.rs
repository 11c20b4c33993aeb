//! Launcher for `shaders/add.wgsl`.

use super::{check_len, groups, params, ADD};
use crate::error::Result;
use crate::gpu::{grid_2d, Batch};

params!(AddParams for ADD {
    len: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
});

/// `x[i] += y[i]` over `len` f32 elements (the residual connection).
pub fn add(batch: &mut Batch, x: &wgpu::Buffer, y: &wgpu::Buffer, len: usize) -> Result<()> {
    check_len("add", "x", x, len)?;
    check_len("add", "y", y, len)?;
    let p = AddParams {
        len: len as u32,
        ..Default::default()
    };
    let grid = grid_2d(
        groups(len, 256),
        batch.ctx().limits.max_compute_workgroups_per_dimension,
    );
    batch.dispatch(ADD, &[], &p, &[x.into(), y.into()], grid)
}
