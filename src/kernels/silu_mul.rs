//! Launcher for `shaders/silu_mul.wgsl`.

use super::{check_len, groups, params, SILU_MUL};
use crate::error::Result;
use crate::gpu::{grid_2d, Batch};
use crate::nn::Activation;

params!(SiluMulParams for SILU_MUL {
    rows: u32,
    width: u32,
    ld: u32,
    up_offset: u32,
    alpha: f32,
    limit: f32,
    _pad0: u32,
    _pad1: u32,
});

/// `out[i] = silu(gate[i]) * up[i]` over `len` f32 elements.
pub fn silu_mul(
    batch: &mut Batch,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    gated(batch, Activation::Silu, gate, up, out, len)
}

/// `out[i] = act(gate[i]) * up[i]` over `len` f32 elements.
pub fn gated(
    batch: &mut Batch,
    act: Activation,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    for (what, b) in [("gate", gate), ("up", up), ("out", out)] {
        check_len("silu_mul", what, b, len)?;
    }
    // One row of `len`, or rows of the widest power of two that divides it and fits a grid
    // row (a row's workgroups span one grid dimension).
    let max = batch.ctx().limits.max_compute_workgroups_per_dimension as usize * 256;
    let width = if len <= max {
        len
    } else {
        (0..=max.ilog2())
            .rev()
            .map(|b| 1usize << b)
            .find(|w| len.is_multiple_of(*w))
            .unwrap_or(1)
    };
    let rows = len.div_ceil(width.max(1));
    dispatch(batch, act, (gate, up, out), rows, width, width, 0)
}

/// out[r, i] = act(gu[r, i]) * gu[r, width + i] for `rows` rows: `gu` is `[rows, 2 * width]`,
/// each row's gate then its up (the stacked gate-up projection's output); `out` is
/// `[rows, width]`.
pub fn gated_rows(
    batch: &mut Batch,
    act: Activation,
    gu: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: usize,
    width: usize,
) -> Result<()> {
    check_len("silu_mul", "gate up", gu, 2 * rows * width)?;
    check_len("silu_mul", "out", out, rows * width)?;
    dispatch(batch, act, (gu, gu, out), rows, width, 2 * width, width)
}

fn dispatch(
    batch: &mut Batch,
    act: Activation,
    (gate, up, out): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
    rows: usize,
    width: usize,
    ld: usize,
    up_offset: usize,
) -> Result<()> {
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let (code, alpha, limit) = match act {
        Activation::Silu => (0.0, 0.0, 0.0),
        Activation::GeluTanh => (1.0, 0.0, 0.0),
        Activation::ClampedSwiglu { alpha, limit } => (2.0, alpha, limit),
    };
    let p = SiluMulParams {
        rows: rows as u32,
        width: width as u32,
        ld: ld as u32,
        up_offset: up_offset as u32,
        alpha,
        limit,
        _pad0: 0,
        _pad1: 0,
    };
    let max = batch.ctx().limits.max_compute_workgroups_per_dimension;
    let [y, z, _] = grid_2d(rows as u32, max);
    let grid = [groups(width, 256), y, z];
    batch.dispatch(
        SILU_MUL,
        &[("ACTIVATION", code)],
        &p,
        &[gate.into(), up.into(), out.into()],
        grid,
    )
}
