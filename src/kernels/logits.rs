//! The last stage of a forward pass: pick the rows that sample this step (the last position
//! of each sequence), compute their logits with the LM head, and optionally reduce them to
//! the arg-max and its logprob on the GPU, so greedy decoding reads back 8 bytes per
//! sequence.
//! Launchers for `shaders/gather_rows.wgsl` and the arg-max kernels: `argmax.wgsl` (a
//! 256-thread tree per row), `argmax_lanes.wgsl` (eight lanes per row, CPU adapters) and
//! `argmax_slices.wgsl` + `argmax_merge.wgsl` (a row split across workgroups, GPUs); see
//! [`ArgmaxKernel`].

use super::matmul::{matmul, Matmul, Norm};
use super::plan::KernelPlan;
use super::{
    check_len, groups, params, Weight, ARGMAX, ARGMAX_LANES, ARGMAX_MERGE, ARGMAX_SLICES,
    GATHER_ROWS,
};
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind};

params!(GatherRowsParams for GATHER_ROWS {
    num_rows: u32,
    width: u32,
    num_src_rows: u32,
    _pad: u32,
});

params!(ArgmaxParams for ARGMAX {
    num_rows: u32,
    width: u32,
    slices: u32,
    _pad1: u32,
});

/// Logits per slice of the split arg-max (`SLICE` in `shaders/argmax_common.wgsl`).
pub const ARGMAX_SLICE: usize = 2048;

/// u32 words of the partials buffer that the split arg-max ([`ArgmaxKernel::Split`]) needs
/// for `num_rows` rows of `width` logits: a maximum, its index and a sum per slice.
pub fn argmax_partials_len(num_rows: usize, width: usize) -> usize {
    3 * num_rows * width.div_ceil(ARGMAX_SLICE)
}

/// `out[r, :] = x[rows[r], :]`; `x`: `[num_src_rows, width]`, `rows`: `[num_rows]` u32.
pub fn gather_rows<'a>(
    batch: &mut Batch,
    x: &wgpu::Buffer,
    rows: impl Into<Bind<'a>>,
    out: &wgpu::Buffer,
    num_src_rows: usize,
    num_rows: usize,
    width: usize,
) -> Result<()> {
    let rows: Bind<'_> = rows.into();
    check_len("gather_rows", "x", x, num_src_rows * width)?;
    check_len("gather_rows", "rows", rows, num_rows)?;
    check_len("gather_rows", "out", out, num_rows * width)?;
    let p = GatherRowsParams {
        num_rows: num_rows as u32,
        width: width as u32,
        num_src_rows: num_src_rows as u32,
        _pad: 0,
    };
    batch.dispatch(
        GATHER_ROWS,
        &[],
        &p,
        &[rows, x.into(), out.into()],
        [groups(width, 256), num_rows as u32, 1],
    )
}

pub use super::choice::ArgmaxKernel;

/// `out[r] = argmax(logits[r, :])` (first index on ties) and `out[num_rows + r]` = the bits of
/// that token's log-probability as f32 (read them with [`argmax_logprobs`]), by `kernel`;
/// `out`: [2, num_rows] u32; `partials`: scratch of [`argmax_partials_len`] words, needed by
/// [`ArgmaxKernel::Split`].
pub fn argmax(
    batch: &mut Batch,
    kernel: ArgmaxKernel,
    logits: &wgpu::Buffer,
    out: &wgpu::Buffer,
    partials: Option<&wgpu::Buffer>,
    num_rows: usize,
    width: usize,
) -> Result<()> {
    check_len("argmax", "logits", logits, num_rows * width)?;
    check_len("argmax", "out", out, 2 * num_rows)?;
    if width == 0 {
        return Err(GpuError::invalid("argmax", "empty rows"));
    }
    let max = batch.ctx().limits.max_compute_workgroups_per_dimension as usize;
    if num_rows > max {
        return Err(GpuError::invalid(
            "argmax",
            format!("{num_rows} rows in one call (at most {max})"),
        ));
    }
    let slices = width.div_ceil(ARGMAX_SLICE);
    let p = ArgmaxParams {
        num_rows: num_rows as u32,
        width: width as u32,
        slices: slices as u32,
        ..Default::default()
    };
    let source = match kernel {
        ArgmaxKernel::Workgroup => ARGMAX,
        ArgmaxKernel::Lanes => ARGMAX_LANES,
        ArgmaxKernel::Split => {
            let need = argmax_partials_len(num_rows, width);
            let partials = partials.ok_or_else(|| {
                GpuError::invalid(
                    "argmax",
                    format!("the split arg-max needs a partials buffer of {need} words"),
                )
            })?;
            check_len("argmax", "partials", partials, need)?;
            let grid = [slices as u32, num_rows as u32, 1];
            let bufs = [logits.into(), partials.into()];
            batch.dispatch(ARGMAX_SLICES, &[], &p, &bufs, grid)?;
            let grid = [groups(num_rows, 64), 1, 1];
            let bufs = [partials.into(), out.into()];
            return batch.dispatch(ARGMAX_MERGE, &[], &p, &bufs, grid);
        }
    };
    batch.dispatch(
        source,
        &[],
        &p,
        &[logits.into(), out.into()],
        [num_rows as u32, 1, 1],
    )
}

/// Splits what [`argmax`] wrote for `num_rows` rows into token ids and their logprobs.
pub fn argmax_logprobs(out: &[u32], num_rows: usize) -> (Vec<u32>, Vec<f32>) {
    let ids = out[..num_rows].to_vec();
    let lps = out[num_rows..2 * num_rows]
        .iter()
        .map(|&b| f32::from_bits(b))
        .collect();
    (ids, lps)
}

/// Scratch and output buffers of [`lm_head`].
#[derive(Debug)]
pub struct LogitsBuffers<'a> {
    /// `[num_rows, hidden]` scratch for the gathered rows.
    pub gathered: &'a wgpu::Buffer,
    /// `[num_rows, vocab]` logits.
    pub logits: &'a wgpu::Buffer,
    /// `[2, num_rows]` arg-max token ids and their logprobs (see [`argmax`]), when wanted.
    pub argmax: Option<&'a wgpu::Buffer>,
    /// The arg-max's partials ([`argmax_partials_len`]), where the adapter splits it.
    pub argmax_partials: Option<&'a wgpu::Buffer>,
    /// Soft-capping of the logits, `cap * tanh(logit / cap)` (Gemma 2), before the arg-max.
    pub softcap: Option<f32>,
    /// The final RMSNorm, computed by the LM head as it reads the gathered rows
    /// ([`Input::Normed`](super::matmul::Input::Normed)); `None` when the hidden states are normed already.
    pub norm: Option<Norm<'a>>,
}

/// Logits (and optionally their arg-max) of the rows `rows` of the final hidden states
/// `hidden` (`[num_tokens, hidden_size]`, normed by `out.norm` if it is given) under the LM
/// head `head` (`[vocab, hidden_size]`), by the kernels of `plan`.
#[allow(clippy::too_many_arguments)]
pub fn lm_head<'a>(
    batch: &mut Batch,
    plan: &KernelPlan,
    hidden: &wgpu::Buffer,
    num_tokens: usize,
    rows: impl Into<Bind<'a>>,
    num_rows: usize,
    head: &Weight,
    out: LogitsBuffers<'_>,
) -> Result<()> {
    let rows: Bind<'_> = rows.into();
    let (gathered, vocab) = (out.gathered, head.rows);
    gather_rows(
        batch, hidden, rows, gathered, num_tokens, num_rows, head.cols,
    )?;
    let call = Matmul::new(gathered, head, out.logits, num_rows);
    let call = match out.norm {
        Some(norm) => call.normed(norm),
        None => call,
    };
    matmul(batch, &plan.matmul, &call)?;
    if let Some(cap) = out.softcap {
        super::softcap::softcap(batch, out.logits, num_rows * vocab, cap)?;
    }
    if let Some(am) = out.argmax {
        let partials = out.argmax_partials;
        argmax(
            batch,
            plan.argmax,
            out.logits,
            am,
            partials,
            num_rows,
            vocab,
        )?;
    }
    Ok(())
}
