//! One step of the forward pass as the engine and the scorer both record it: the flat
//! batch's metadata, token ids and sampled rows written in place, in one write, into
//! buffers kept across steps (so the step's bind groups are the last step's), then the
//! forward pass over them.

use super::forward::{forward, StepInput, Workspace};
use super::gpu::GpuModel;
use crate::error::{GpuError, Result};
use crate::gpu::Batch;
use crate::kernels::paged_attention::{AttentionBuffers, AttentionMetadata, SeqSlice};
use crate::pool::KvPool;

/// What one step computes.
#[derive(Clone, Copy, Debug)]
pub struct FlatBatch<'a> {
    /// Each sequence's share, back to back.
    pub seqs: &'a [SeqSlice<'a>],
    /// `[num_tokens]` the token ids computed, in the order of `seqs`.
    pub tokens: &'a [u32],
    /// Indices into `tokens` of the rows whose logits are wanted; with none, row 0 is
    /// gathered anyway (harmless) to keep shapes simple.
    pub rows: &'a [u32],
    /// Also reduce the logits to their arg-max.
    pub argmax: bool,
}

/// Records the step's upload into `kept` (allocated, or grown, as needed) and its forward
/// pass into `batch`.
pub fn record_step(
    batch: &mut Batch,
    model: &GpuModel,
    pool: &KvPool,
    ws: &Workspace,
    kept: &mut Option<AttentionBuffers>,
    step: &FlatBatch,
) -> Result<()> {
    let meta = AttentionMetadata::build(step.seqs, pool.layout.block_size)?;
    meta.write_into(batch, kept, &[step.tokens, step.rows])?;
    let missing = || GpuError::invalid("step metadata", "an extra array is missing");
    let bufs = kept.as_ref().ok_or_else(missing)?;
    let input = StepInput {
        tokens: bufs.extra(0).ok_or_else(missing)?,
        meta: bufs,
        rows: bufs.extra(1).ok_or_else(missing)?,
        num_rows: step.rows.len().max(1),
        argmax: step.argmax,
    };
    forward(batch, model, pool, ws, &input)
}
