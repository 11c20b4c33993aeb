//! The last stage of a forward pass: pick the rows that sample this step (the last position
//! of each sequence), compute their logits with the LM head, and optionally reduce them to
//! the arg-max and its logprob on the GPU, so greedy decoding reads back 8 bytes per
//! sequence.
//! Launchers for `shaders/gather_rows.wgsl` and `shaders/argmax.wgsl`.

use super::matmul::{matmul, Output};
use super::{check_len, groups, params, Weight, ARGMAX, GATHER_ROWS};
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
    _pad0: u32,
    _pad1: u32,
});

/// out[r, :] = x[rows[r], :]; `x`: [num_src_rows, width], `rows`: [num_rows] u32.
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

/// out[r] = argmax(logits[r, :]) (first index on ties) and out[num_rows + r] = the bits of
/// that token's log-probability as f32 (read them with [`argmax_logprobs`]); `out`:
/// [2, num_rows] u32.
pub fn argmax(
    batch: &mut Batch,
    logits: &wgpu::Buffer,
    out: &wgpu::Buffer,
    num_rows: usize,
    width: usize,
) -> Result<()> {
    check_len("argmax", "logits", logits, num_rows * width)?;
    check_len("argmax", "out", out, 2 * num_rows)?;
    if width == 0 {
        return Err(GpuError::invalid("argmax", "empty rows"));
    }
    let p = ArgmaxParams {
        num_rows: num_rows as u32,
        width: width as u32,
        ..Default::default()
    };
    batch.dispatch(
        ARGMAX,
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
    /// Soft-capping of the logits, `cap * tanh(logit / cap)` (Gemma 2), before the arg-max.
    pub softcap: Option<f32>,
}

/// Logits (and optionally their arg-max) of the rows `rows` of the final hidden states
/// `hidden` (`[num_tokens, hidden_size]`) under the LM head `head` (`[vocab, hidden_size]`).
pub fn lm_head<'a>(
    batch: &mut Batch,
    hidden: &wgpu::Buffer,
    num_tokens: usize,
    rows: impl Into<Bind<'a>>,
    num_rows: usize,
    head: &Weight,
    out: LogitsBuffers<'_>,
) -> Result<()> {
    let rows: Bind<'_> = rows.into();
    gather_rows(
        batch,
        hidden,
        rows,
        out.gathered,
        num_tokens,
        num_rows,
        head.cols,
    )?;
    matmul(
        batch,
        out.gathered,
        head,
        None,
        out.logits,
        num_rows,
        Output::Overwrite,
    )?;
    if let Some(cap) = out.softcap {
        super::softcap::softcap(batch, out.logits, num_rows * head.rows, cap)?;
    }
    if let Some(am) = out.argmax {
        argmax(batch, out.logits, am, num_rows, head.rows)?;
    }
    Ok(())
}
