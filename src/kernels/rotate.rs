//! Launchers for `shaders/rotate_rows.wgsl` and `shaders/rotate_qk.wgsl`: the Hadamard
//! rotation of cached keys (and the queries that meet them) (`shaders/rotate_common.wgsl` has the transform).

use super::{check_len, params, ROTATE_QK, ROTATE_ROWS};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch};

params!(RotateRowsParams for ROTATE_ROWS {
    num_rows: u32,
    head_dim: u32,
    inverse: u32,
    _pad: u32,
});

params!(RotateQkParams for ROTATE_QK {
    rows_q: u32,
    rows_k: u32,
    head_dim: u32,
    _pad: u32,
});

fn check_head_dim(kernel: &'static str, head_dim: usize) -> Result<()> {
    if !head_dim.is_multiple_of(2)
        || head_dim == 0
        || head_dim > super::paged_attention::MAX_HEAD_DIM
    {
        return Err(GpuError::invalid(
            kernel,
            format!("head_dim {head_dim} must be even and at most 256"),
        ));
    }
    Ok(())
}

/// One workgroup per 256 / head_dim rows.
fn grid(batch: &Batch, rows: usize, head_dim: usize) -> [u32; 3] {
    let per_group = super::paged_attention::MAX_HEAD_DIM / head_dim;
    grid_2d(
        rows.div_ceil(per_group) as u32,
        batch.ctx().limits.max_compute_workgroups_per_dimension,
    )
}

/// Rotates each of `num_rows` rows of `head_dim` f32 values of `x` in place by R = H D (or,
/// with `inverse`, by its transpose D H); see the shader for R.
pub fn rotate_rows(
    batch: &mut Batch,
    x: &wgpu::Buffer,
    num_rows: usize,
    head_dim: usize,
    inverse: bool,
) -> Result<()> {
    const K: &str = "rotate_rows";
    check_head_dim(K, head_dim)?;
    if num_rows == 0 {
        return Ok(());
    }
    check_len(K, "x", x, num_rows * head_dim)?;
    let p = RotateRowsParams {
        num_rows: num_rows as u32,
        head_dim: head_dim as u32,
        inverse: inverse as u32,
        _pad: 0,
    };
    let g = grid(batch, num_rows, head_dim);
    batch.dispatch(ROTATE_ROWS, &[], &p, &[x.into()], g)
}

/// Rotates `rows_q` rows of `q` and `rows_k` rows of `k` in place by R, in one dispatch.
pub fn rotate_qk(
    batch: &mut Batch,
    q: &wgpu::Buffer,
    k: &wgpu::Buffer,
    rows_q: usize,
    rows_k: usize,
    head_dim: usize,
) -> Result<()> {
    const K: &str = "rotate_qk";
    check_head_dim(K, head_dim)?;
    let rows = rows_q + rows_k;
    if rows == 0 {
        return Ok(());
    }
    check_len(K, "q", q, rows_q * head_dim)?;
    check_len(K, "k", k, rows_k * head_dim)?;
    let p = RotateQkParams {
        rows_q: rows_q as u32,
        rows_k: rows_k as u32,
        head_dim: head_dim as u32,
        _pad: 0,
    };
    let g = grid(batch, rows, head_dim);
    batch.dispatch(ROTATE_QK, &[], &p, &[q.into(), k.into()], g)
}
