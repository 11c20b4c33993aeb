//! Launcher for `shaders/embedding.wgsl`: token ids to hidden vectors.

use super::{check_len, groups, params, Weight, EMBEDDING};
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind};

params!(EmbeddingParams for EMBEDDING {
    num_tokens: u32,
    hidden: u32,
    row_offset: u32,
    num_rows: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
});

/// `out[t, :] = table[ids[t], :]` for `num_tokens` ids (`ids`: `[num_tokens]` u32, `out`:
/// [num_tokens, hidden] f32). Ids must have been checked against the vocabulary by the
/// caller; an id outside the table leaves its output row untouched.
pub fn embedding<'a>(
    batch: &mut Batch,
    table: &Weight,
    ids: impl Into<Bind<'a>>,
    out: &wgpu::Buffer,
    num_tokens: usize,
) -> Result<()> {
    scaled_embedding(batch, table, ids, out, num_tokens, 1.0)
}

/// [`embedding`] with every value multiplied by `scale` (in f32).
pub fn scaled_embedding<'a>(
    batch: &mut Batch,
    table: &Weight,
    ids: impl Into<Bind<'a>>,
    out: &wgpu::Buffer,
    num_tokens: usize,
    scale: f32,
) -> Result<()> {
    let ids: Bind<'_> = ids.into();
    const K: &str = "embedding";
    if num_tokens == 0 {
        return Ok(());
    }
    check_len(K, "ids", ids, num_tokens)?;
    check_len(K, "out", out, num_tokens * table.cols)?;
    if num_tokens > batch.ctx().limits.max_compute_workgroups_per_dimension as usize {
        return Err(GpuError::invalid(
            K,
            format!("{num_tokens} tokens in one call"),
        ));
    }
    for chunk in &table.chunks {
        let p = EmbeddingParams {
            num_tokens: num_tokens as u32,
            hidden: table.cols as u32,
            row_offset: chunk.first_row as u32,
            num_rows: chunk.rows as u32,
            scale,
            ..Default::default()
        };
        batch.dispatch(
            EMBEDDING,
            &[("WEIGHT_DTYPE", chunk.dtype.code())],
            &p,
            &[ids, (&chunk.buffer).into(), out.into()],
            [groups(table.cols, 256), num_tokens as u32, 1],
        )?;
    }
    Ok(())
}
