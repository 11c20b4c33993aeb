//! Swap or recompute, decided per preemption by measured cost. vLLM fixes the recovery mode
//! per group shape (recompute single sequences, swap groups); here the engine measures, as
//! it runs, what moving KV blocks through the staging path costs (bytes per second, both
//! ways) and what prefilling costs at the current batch (tokens per second), and the
//! scheduler picks for each victim whichever of "swap its blocks out and back in" and
//! "recompute its tokens" is cheaper. Explicit modes (`--preemption-mode`) override.

use crate::config::PreemptionMode;

/// Weight of the newest measurement in the running averages.
const EWMA_ALPHA: f64 = 0.3;

/// The engine's running measurements, fed by the engine as steps complete.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PreemptionCosts {
    /// Bytes one KV block occupies across all layers (what one block's swap moves).
    pub block_bytes: u64,
    /// Host<->device throughput of swapping, bytes per second, both ways together: what
    /// each extra block adds to a step, without the fixed cost of a submit (a swap rides
    /// in the step's own submit).
    pub swap_bytes_per_s: Option<f64>,
    /// Prefill throughput at the batch sizes seen, tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
}

/// What recovering one victim is estimated to cost, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostEstimate {
    /// Moving the victim's blocks to host memory and back.
    pub swap_s: f64,
    /// Recomputing the victim's tokens.
    pub recompute_s: f64,
}

/// What the scheduler knows about a victim when it chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Distinct device blocks the group holds (what a swap-out moves).
    pub blocks: usize,
    /// Tokens recomputation would prefill again: its live sequences' computed tokens
    /// (tokens not yet computed cost the same either way).
    pub tokens: usize,
    /// Live sequences; more than one lose their block sharing when recomputed.
    pub seqs: usize,
    /// The host pool has room for the group's blocks.
    pub host_has_room: bool,
    /// After recomputation the group's sequences, no longer sharing, still fit the pool at
    /// their longest.
    pub recompute_fits: bool,
}

impl PreemptionCosts {
    pub fn new(block_bytes: u64) -> Self {
        PreemptionCosts {
            block_bytes,
            ..Default::default()
        }
    }

    /// Records `bytes` moved between host and device in `seconds` (either direction).
    pub fn record_swap(&mut self, bytes: u64, seconds: f64) {
        if bytes > 0 && seconds > 0.0 {
            ewma(&mut self.swap_bytes_per_s, bytes as f64 / seconds);
        }
    }

    /// Records a step that computed `tokens` tokens, prefill chunks among them, in
    /// `seconds`.
    pub fn record_prefill(&mut self, tokens: usize, seconds: f64) {
        if tokens > 0 && seconds > 0.0 {
            ewma(&mut self.prefill_tokens_per_s, tokens as f64 / seconds);
        }
    }

    /// Both costs of recovering a group of `blocks` blocks and `tokens` tokens, once both
    /// rates have been measured.
    pub fn estimate(&self, blocks: usize, tokens: usize) -> Option<CostEstimate> {
        let bw = self.swap_bytes_per_s?;
        let tps = self.prefill_tokens_per_s?;
        Some(CostEstimate {
            swap_s: 2.0 * blocks as f64 * self.block_bytes as f64 / bw,
            recompute_s: tokens as f64 / tps,
        })
    }
}

fn ewma(slot: &mut Option<f64>, value: f64) {
    *slot = Some(match *slot {
        None => value,
        Some(old) => old + EWMA_ALPHA * (value - old),
    });
}

/// The recovery mode for `victim`, and the estimate it rested on (none when an explicit
/// mode or a hard constraint decided, or before both rates are measured).
///
/// - An explicit mode is kept, except that swapping falls back to recomputing when the host
///   pool is full.
/// - Automatic: recompute when the host pool is full; swap a group whose sequences would
///   not fit the pool once they no longer share blocks; otherwise the cheaper estimate,
///   and before there are estimates the static rule: swap groups of several sequences
///   (recomputing them would lose their sharing), recompute single ones.
pub fn choose_mode(
    explicit: Option<PreemptionMode>,
    costs: &PreemptionCosts,
    victim: &Victim,
) -> (PreemptionMode, Option<CostEstimate>) {
    use PreemptionMode::{Recompute, Swap};
    if !victim.host_has_room {
        return (Recompute, None);
    }
    if let Some(mode) = explicit {
        return (mode, None);
    }
    if victim.seqs > 1 && !victim.recompute_fits {
        return (Swap, None);
    }
    match costs.estimate(victim.blocks, victim.tokens) {
        Some(e) => (
            if e.swap_s <= e.recompute_s {
                Swap
            } else {
                Recompute
            },
            Some(e),
        ),
        None if victim.seqs > 1 => (Swap, None),
        None => (Recompute, None),
    }
}
