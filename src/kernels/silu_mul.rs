//! Launcher for `shaders/silu_mul.wgsl`.

use super::{check_len, groups, params, SILU_MUL};
use crate::error::Result;
use crate::gpu::{grid_2d, Batch};
use crate::model::arch::Activation;

params!(SiluMulParams for SILU_MUL {
    len: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
});

/// out[i] = silu(gate[i]) * up[i] over `len` f32 elements.
pub fn silu_mul(
    batch: &mut Batch,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    gated(batch, Activation::Silu, gate, up, out, len)
}

/// out[i] = act(gate[i]) * up[i] over `len` f32 elements.
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
    let p = SiluMulParams {
        len: len as u32,
        ..Default::default()
    };
    let grid = grid_2d(
        groups(len, 256),
        batch.ctx().limits.max_compute_workgroups_per_dimension,
    );
    batch.dispatch(
        SILU_MUL,
        &[(
            "ACTIVATION",
            match act {
                Activation::Silu => 0.0,
                Activation::GeluTanh => 1.0,
            },
        )],
        &p,
        &[gate.into(), up.into(), out.into()],
        grid,
    )
}
