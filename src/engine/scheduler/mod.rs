//! Continuous batching with chunked prefill (after vLLM's scheduler, Kwon et al. SOSP 2023,
//! and its chunked-prefill policy, Agrawal et al., "Sarathi-Serve", OSDI 2024).
//!
//! The scheduler owns the sequence groups: its waiting, running and swapped queues hold
//! them, so the queue a group sits in is its status and nothing mirrors it (`queues.rs`).
//! Each step has two halves, both plain Rust:
//!
//! - [`Scheduler::schedule`] plans the step, in order:
//!   1. **Running decodes** (every live sequence has only its newest token to compute),
//!      oldest first, get the slots their new tokens need. When the pool is short, the
//!      newest running group is preempted (swap or recompute, see `preempt.rs`) until the
//!      group at hand fits, possibly preempting that group itself.
//!   2. **Running prefills** get chunks of their prompts from what is left of the budget,
//!      and the blocks for each chunk as it is scheduled (preempting newer groups as a
//!      decode does, when the pool is short).
//!   3. If nothing was preempted this step, **swapped groups** come back, oldest first,
//!      while they fit.
//!   4. If nothing was preempted and nothing is left in host memory, **waiting groups** are
//!      admitted first come, first served, while blocks (above the watermark), sequence
//!      slots and the budget allow. An admitted prompt gets blocks for its prefix-cache hits
//!      and its first chunk only, not for the whole prompt; whether the whole prompt can
//!      ever fit is checked first (`limits.rs`), so a partly computed prompt never waits for
//!      blocks it cannot have, and since the oldest running group can always preempt the
//!      newer ones, partly computed prompts cannot hold the pool so that none finishes.
//!   5. **Proposed tokens** (speculative decoding) of decoding sequences take what is left:
//!      budget, rows, and blocks above the watermark.
//! - [`Scheduler::commit`] (`commit.rs`) takes what the forward pass computed and what
//!   sampling made of it: progress, forks, beams, finished sequences and groups.
//!
//! A group is scheduled as a unit (gang scheduling): all its live sequences compute their
//! next token in the same step or none do, and a group reserves its full width of sequence
//! slots from admission on, so a later fork never exceeds `max_num_seqs`. A group that can
//! never run (`limits.rs`) fails alone, with a reason, the moment that is known; what every
//! other group produces is unchanged.
//!
//! Sequences progress by their computed count (the block manager's, the one record of it)
//! against their token count (the sequence's own); there is no separate prefill phase. Groups carry the engine's own data as type parameters (see
//! `sequence.rs`), so the scheduler and the block manager run, and are tested, without a
//! GPU.

mod commit;
mod cost;
mod limits;
mod lost;
mod preempt;
mod queues;
mod resize;

pub use commit::{BeamChild, Committed, Fork, NextToken, SampleOutcome, Sampled};
pub use cost::{choose_mode, CostEstimate, PreemptionCosts, Victim};
pub use lost::DeviceLoss;
pub use queues::Queue;

use super::output::RequestId;
use super::sequence::{GroupShape, SequenceGroup};
use crate::cache::{AllocStatus, BlockManager, BlockOps, CacheError, DeviceBlockId, SeqId};
use crate::config::EngineConfig;
use std::collections::{HashMap, VecDeque};

/// Prompt tokens a step under a time budget may always hold beside its decodes
/// ([`Scheduler::step_token_limit`]).
pub const MIN_PACED_PREFILL: usize = 16;

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub request_id: RequestId,
    /// Index into the group's `seqs`.
    pub seq: usize,
    pub id: SeqId,
    /// First token computed this step (= the sequence's `num_computed`).
    pub start: usize,
    /// Tokens computed this step: `len - proposed` of the sequence's own, then `proposed`
    /// of its proposals.
    pub len: usize,
    /// The step reaches the sequence's last token, so a new token is sampled (from each of
    /// the last `1 + proposed` rows, to verify the proposals).
    pub sample: bool,
    /// Proposed tokens (the first of the sequence's `proposed`) computed after its own, with
    /// slots given for them; 0 without speculation.
    pub proposed: usize,
}

impl ScheduledSeq {
    /// Rows this sequence samples this step.
    pub fn rows(&self) -> usize {
        if self.sample {
            1 + self.proposed
        } else {
            0
        }
    }

    /// The sequence's own tokens computed this step.
    pub fn own_len(&self) -> usize {
        self.len - self.proposed
    }
}

/// A group the scheduler gave up, with the reason; its blocks are already free.
pub struct FailedGroup<D = (), R = ()> {
    pub group: SequenceGroup<D, R>,
    pub reason: String,
}

impl<D, R> std::fmt::Debug for FailedGroup<D, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailedGroup")
            .field("request_id", &self.group.request_id)
            .field("reason", &self.reason)
            .finish()
    }
}

/// A scheduled sequence's block table in one KV cache group: `holes` leading blocks
/// released (no query attends to them any more), then its live blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTable {
    pub holes: usize,
    pub blocks: Vec<DeviceBlockId>,
}

#[derive(Debug)]
pub struct SchedulerOutput<D = (), R = ()> {
    /// Sequences of one group are next to each other.
    pub scheduled: Vec<ScheduledSeq>,
    /// Per scheduled sequence (in the order of `scheduled`), its block table in every KV
    /// cache group: what the step's attention reads.
    pub tables: Vec<Vec<BlockTable>>,
    pub ops: BlockOps,
    /// Requests that can never run. The scheduler has already let them go and freed their
    /// blocks; the caller reports them.
    pub failed: Vec<FailedGroup<D, R>>,
}

impl<D, R> Default for SchedulerOutput<D, R> {
    fn default() -> Self {
        SchedulerOutput {
            scheduled: Vec::new(),
            tables: Vec::new(),
            ops: BlockOps::default(),
            failed: Vec::new(),
        }
    }
}

/// Counters for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    /// Steps scheduled.
    pub steps: u64,
    /// Groups preempted, in all.
    pub preemptions: u64,
    /// Of which swapped to host memory.
    pub preempted_by_swap: u64,
    /// Of which freed, to be recomputed.
    pub preempted_by_recompute: u64,
    /// Automatic choices that rested on measured costs (the rest followed a hard
    /// constraint or the static rule).
    pub chosen_by_cost: u64,
    /// The estimate behind the latest cost-based choice.
    pub last_estimate: Option<CostEstimate>,
    /// Tokens computed again after a preemption by recomputation.
    pub recomputed_tokens: u64,
    /// Prefill chunks that stopped short of the sequence's end (chunked prefill at work).
    pub partial_prefills: u64,
    /// Speculative decoding: steps of a sequence that verified proposals.
    pub spec_drafts: u64,
    /// The tokens proposed and scheduled.
    pub spec_proposed: u64,
    /// Those accepted (counted at commit).
    pub spec_accepted: u64,
    /// Requests failed because they could never run.
    pub failed_requests: u64,
    /// Most sequences running at once.
    pub peak_running_seqs: usize,
    /// Most device blocks in use at once.
    pub peak_blocks_used: usize,
}

pub struct Scheduler<D = (), R = ()> {
    pub config: EngineConfig,
    /// The scheduler's alone: others read it ([`Self::blocks`]) or reach its prefix cache
    /// ([`Self::prefix_cache`]).
    blocks: BlockManager,
    /// Measured figures that automatic preemption weighs; the engine keeps them current.
    pub costs: PreemptionCosts,
    pub stats: SchedulerStats,
    /// With a sliding window of this many tokens in every layer, blocks that left it go
    /// back to the pool as sequences progress.
    window: Option<usize>,
    /// Arrival order.
    waiting: VecDeque<SequenceGroup<D, R>>,
    running: Vec<SequenceGroup<D, R>>,
    /// Arrival order.
    swapped: VecDeque<SequenceGroup<D, R>>,
    next_seq: u64,
    /// Most tokens the next step may hold, below `max_num_batched_tokens` (a frame-time
    /// budget's cap, `pacing.rs`); see `step_budget` for its floor.
    pub step_token_limit: Option<usize>,
}

/// State of one scheduling pass.
struct Pass<D, R> {
    budget: usize,
    /// Something was preempted, or a running group waits for blocks: no swap-ins or
    /// admissions this step.
    preempted: bool,
    /// Running groups already given their share of this step.
    served: Vec<RequestId>,
    out: SchedulerOutput<D, R>,
}

impl<D, R> Scheduler<D, R> {
    /// The block manager, to read (statistics, tests).
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// The prefix cache's pins, forgotten prefixes and host tier (the engine's tiers).
    pub fn prefix_cache(&mut self) -> crate::cache::PrefixCache<'_> {
        crate::cache::PrefixCache::new(&mut self.blocks)
    }

    pub fn new(config: EngineConfig, blocks: BlockManager) -> Self {
        Scheduler {
            config,
            blocks,
            costs: PreemptionCosts::default(),
            stats: SchedulerStats::default(),
            window: None,
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            next_seq: 0,
            step_token_limit: None,
        }
    }

    /// Releases blocks that left a sliding window of `window` tokens (one every layer
    /// has) as sequences progress; `None` keeps every block.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        self.window = window;
        self
    }

    /// Plans one step: which sequences compute which tokens, the block operations that
    /// must run first, and the requests that failed because they can never run.
    pub fn schedule(&mut self) -> Result<SchedulerOutput<D, R>, CacheError> {
        self.stats.steps += 1;
        let mut pass = Pass {
            budget: self.step_budget(),
            preempted: false,
            served: Vec::new(),
            out: SchedulerOutput::default(),
        };
        self.schedule_running(&mut pass)?;
        if !pass.preempted {
            self.schedule_swapped(&mut pass)?;
        }
        // Admitting right after a preemption would only invite the next one.
        if self.swapped.is_empty() && !pass.preempted {
            self.schedule_waiting(&mut pass)?;
        }
        self.schedule_proposals(&mut pass)?;
        pass.out.tables = self.tables_of(&pass.out.scheduled)?;
        pass.out.ops = self.blocks.take_ops();
        self.record_peaks();
        Ok(pass.out)
    }

    /// The step's token budget: `max_num_batched_tokens`, under the step token limit when
    /// one is set. The limit cuts prefill chunks, not streams: it never goes below every
    /// decoding sequence's token plus [`MIN_PACED_PREFILL`] tokens of prompt (so new
    /// requests get in where even the decodes overrun the budget), nor below the widest
    /// group's sequences.
    fn step_budget(&self) -> usize {
        let cap = self.config.max_num_batched_tokens;
        let Some(limit) = self.step_token_limit else {
            return cap;
        };
        let decodes: usize = self
            .running
            .iter()
            .filter(|g| g.is_decoding(&self.blocks))
            .map(|g| g.live().count())
            .sum();
        let widest = self.groups().map(|g| g.shape.width()).max().unwrap_or(1);
        cap.min(limit.max(decodes + MIN_PACED_PREFILL).max(widest))
    }

    /// The block tables of `scheduled` in every KV cache group, as they stand once the
    /// step is planned.
    fn tables_of(&self, scheduled: &[ScheduledSeq]) -> Result<Vec<Vec<BlockTable>>, CacheError> {
        let groups = self.blocks.groups().len();
        scheduled
            .iter()
            .map(|s| {
                (0..groups)
                    .map(|g| {
                        Ok(BlockTable {
                            holes: self.blocks.released_blocks_in(s.id, g)?,
                            blocks: self.blocks.block_table_in(s.id, g)?.to_vec(),
                        })
                    })
                    .collect()
            })
            .collect()
    }

    /// Phases 1 and 2: running decodes first, oldest first, then chunks of running
    /// prefills (with `decode_first` off, all running groups strictly oldest first).
    fn schedule_running(&mut self, pass: &mut Pass<D, R>) -> Result<(), CacheError> {
        let decode_first = self.config.decode_first;
        let mut order: Vec<(bool, u64, RequestId)> = self
            .running
            .iter()
            .map(|g| {
                (
                    decode_first && !g.is_decoding(&self.blocks),
                    g.arrival,
                    g.request_id,
                )
            })
            .collect();
        order.sort_unstable();
        for (_, _, id) in order {
            if self.grow(id, pass)? {
                self.serve(id, pass);
            }
        }
        Ok(())
    }

    /// Gives every live sequence of running group `id` that needs one the slot for its
    /// newest token, preempting the newest running groups while the pool is short. False
    /// when `id` is no longer running (preempted earlier in this pass), when it was
    /// preempted or failed now (it can never grow this far), when it waits for room
    /// because it could not recover from a preemption, or when its decode does not fit
    /// what is left of the budget (in the last two cases nothing is taken, and it is tried
    /// again next step).
    fn grow(&mut self, id: RequestId, pass: &mut Pass<D, R>) -> Result<bool, CacheError> {
        let Some(g) = self.running.iter().find(|g| g.request_id == id) else {
            return Ok(false);
        };
        if g.is_decoding(&self.blocks) && g.live().count() > pass.budget {
            return Ok(false);
        }
        // Slots for this step's tokens: a decode's newest token, or a prompt's next chunk.
        let targets = growth(&self.blocks, g, pass.budget);
        if !self.blocks.can_grow(&targets) {
            if let Some(reason) = self.never_runs(g, Queue::Running)? {
                self.fail(id, reason, pass);
                return Ok(false);
            }
        }
        while !self.blocks.can_grow(&targets) {
            let victim = self.pick_victim(id, &pass.served)?;
            if victim == id && !pass.served.is_empty() && !self.recoverable_running(id)? {
                // Preempting it would doom it; older groups are progressing and will make
                // room. Nothing new is let in meanwhile.
                pass.preempted = true;
                return Ok(false);
            }
            self.preempt(victim)?;
            pass.preempted = true;
            if victim == id {
                return Ok(false);
            }
        }
        for (seq, target) in targets {
            self.blocks.grow_to(seq, target)?;
        }
        Ok(true)
    }

    /// Phase 3: swapped groups come back, oldest first, while they fit.
    fn schedule_swapped(&mut self, pass: &mut Pass<D, R>) -> Result<(), CacheError> {
        while let Some(g) = self.swapped.front() {
            let id = g.request_id;
            if let Some(reason) = self.never_runs(g, Queue::Swapped)? {
                self.fail(id, reason, pass);
                continue;
            }
            if self.never_swaps_in(g)? {
                // The pool shrank under it: recomputed, its windowed KV cache groups hold
                // no more than their windows, so it may fit that way (else it fails from
                // the waiting queue with the reason).
                if let Some(g) = self.swapped.pop_front() {
                    self.stats.recomputed_tokens += self.requeue(g);
                }
                continue;
            }
            if !self.fits_swap_in(g, pass)? {
                break;
            }
            let live: Vec<(SeqId, &[u32])> =
                g.live().map(|s| (s.id, s.tokens.as_slice())).collect();
            self.blocks.swap_in(&live)?;
            // Back with slots for this step's tokens: its newest, or a prompt swapped out
            // half computed its next chunk, as `serve` schedules them.
            for (seq, target) in growth(&self.blocks, g, pass.budget) {
                self.blocks.grow_to(seq, target)?;
            }
            self.running.extend(self.swapped.pop_front());
            self.serve(id, pass);
        }
        Ok(())
    }

    /// Whether swapped group `g` can come back now: its blocks and its first growth fit
    /// above the watermark, and the budget and the sequence slots have room for it.
    fn fits_swap_in(&self, g: &SequenceGroup<D, R>, pass: &Pass<D, R>) -> Result<bool, CacheError> {
        let ids = g.live_ids();
        let append_ids = appending(&self.blocks, g);
        let need = self.blocks.group_blocks_after_append(&ids, &append_ids)?
            + self.chunk_blocks(g, pass.budget);
        let usable = self
            .blocks
            .num_available_device_blocks()
            .saturating_sub(self.blocks.watermark_blocks());
        Ok(self.blocks.can_swap_in(&ids) == AllocStatus::Now
            && need <= usable
            && pass.budget > 0
            && self.running_slots() + g.slots() <= self.config.max_num_seqs
            && !(g.is_decoding(&self.blocks) && g.live().count() > pass.budget))
    }

    /// Whether swapped group `g` needs more blocks to come back (its host blocks and one
    /// token's growth) than one group can ever be given: a pool that shrank while it was
    /// out.
    fn never_swaps_in(&self, g: &SequenceGroup<D, R>) -> Result<bool, CacheError> {
        let need = self
            .blocks
            .group_blocks_after_append(&g.live_ids(), &appending(&self.blocks, g))?
            + self.chunk_blocks(g, 1);
        Ok(need > self.blocks.group_capacity())
    }

    /// Blocks a swapped-in group takes beyond its next token for this step's chunks (a
    /// prompt swapped out half computed), in every KV cache group.
    fn chunk_blocks(&self, g: &SequenceGroup<D, R>, budget: usize) -> usize {
        let bs = self.blocks.block_size();
        let per_group: usize = growth(&self.blocks, g, budget)
            .into_iter()
            .map(|(seq, target)| {
                let slots = self.blocks.num_tokens(seq).unwrap_or(0);
                target
                    .div_ceil(bs)
                    .saturating_sub((slots + 1).min(target).div_ceil(bs))
            })
            .sum();
        per_group * self.blocks.groups().len()
    }

    /// Phase 4: admission, first come first served.
    fn schedule_waiting(&mut self, pass: &mut Pass<D, R>) -> Result<(), CacheError> {
        while let Some(g) = self.waiting.front() {
            let id = g.request_id;
            if let Some(reason) = self.never_runs(g, Queue::Waiting)? {
                self.fail(id, reason, pass);
                continue;
            }
            if pass.budget == 0 || self.running_slots() + g.slots() > self.config.max_num_seqs {
                break;
            }
            // Blocks for the cached prefix and this step's chunk only: the rest are taken
            // chunk by chunk as the prompt is computed (`grow`).
            let bs = self.blocks.block_size();
            let live: Vec<(SeqId, &[u32])> =
                g.live().map(|s| (s.id, s.tokens.as_slice())).collect();
            let cached: Vec<usize> = live
                .iter()
                .map(|l| self.blocks.cached_prefix_blocks_keyed(g.keys, l.1) * bs)
                .collect();
            let remaining: Vec<usize> = live
                .iter()
                .zip(&cached)
                .map(|(l, c)| l.1.len() - c)
                .collect();
            let lens = plan_lens(&remaining, pass.budget);
            let with_slots: Vec<(SeqId, &[u32], usize)> = live
                .iter()
                .zip(cached.iter().zip(&lens))
                .map(|(&(id, t), (c, l))| (id, t, c + l))
                .collect();
            let prompts: Vec<(&[u32], usize)> = with_slots.iter().map(|w| (w.1, w.2)).collect();
            if self.blocks.can_allocate_group_slots_keyed(g.keys, &prompts) != AllocStatus::Now {
                break;
            }
            let cached = self
                .blocks
                .allocate_group_slots_keyed(g.keys, &with_slots)?;
            debug_assert_eq!(cached.len(), live.len());
            let Some(g) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(g);
            self.serve(id, pass);
        }
        Ok(())
    }

    /// Phase 5, speculative decoding: decoding sequences with proposals take slots for as
    /// many of them as the budget, the rows of the workspace and the pool above its
    /// watermark allow, after everything else has what it needs, so a proposal never
    /// preempts, delays or shuts out anything. A slot's first write into a shared block
    /// copies it, in this step's plan. Every other proposal is dropped.
    fn schedule_proposals(&mut self, pass: &mut Pass<D, R>) -> Result<(), CacheError> {
        let mut rows = self.config.speculative_rows();
        let Scheduler {
            running,
            blocks,
            stats,
            ..
        } = self;
        let entries: HashMap<(RequestId, usize), usize> = pass
            .out
            .scheduled
            .iter()
            .enumerate()
            .map(|(e, s)| ((s.request_id, s.seq), e))
            .collect();
        for g in running.iter_mut() {
            let max_len = g.max_len;
            // Beams are reshuffled every step, and a group about to fork its samples forks
            // from its one sequence's state before this step's tokens: neither speculates.
            let speculates = match g.shape {
                GroupShape::Samples(n) => g.forked || n <= 1,
                GroupShape::Beams(_) => false,
            };
            for (i, seq) in g.seqs.iter_mut().enumerate() {
                if seq.proposed.is_empty() {
                    continue;
                }
                let entry = entries.get(&(g.request_id, i)).copied().filter(|&e| {
                    let s = &pass.out.scheduled[e];
                    speculates && s.sample && s.len == 1 && s.id == seq.id
                });
                let Some(e) = entry else {
                    seq.proposed.clear();
                    continue;
                };
                // The sequence ends at `max_len` tokens: the newest token, the accepted
                // proposals and the token sampled after them must fit.
                let room = max_len.saturating_sub(seq.tokens.len() + 1);
                let want = seq.proposed.len().min(room).min(pass.budget).min(rows);
                let mut took = 0;
                while took < want {
                    let need = blocks.blocks_needed_to_append(&[seq.id])?;
                    if need > 0
                        && need + blocks.watermark_blocks() > blocks.num_available_device_blocks()
                    {
                        break;
                    }
                    blocks.append_slot(seq.id)?;
                    took += 1;
                }
                seq.proposed.truncate(took);
                if took > 0 {
                    let s = &mut pass.out.scheduled[e];
                    s.len += took;
                    s.proposed = took;
                    pass.budget -= took;
                    rows -= took;
                    stats.spec_drafts += 1;
                    stats.spec_proposed += took as u64;
                }
            }
        }
        Ok(())
    }

    /// Gives running group `id` its tokens of this step (see [`take_tokens`]).
    fn serve(&mut self, id: RequestId, pass: &mut Pass<D, R>) {
        let Some(g) = self.running.iter().find(|g| g.request_id == id) else {
            return;
        };
        let before = pass.out.scheduled.len();
        take_tokens(&self.blocks, g, &mut pass.budget, &mut pass.out.scheduled);
        self.stats.partial_prefills += pass.out.scheduled[before..]
            .iter()
            .filter(|s| !s.sample)
            .count() as u64;
        pass.served.push(id);
    }

    /// Forgets `id`, frees its blocks and reports it as failed with `reason`.
    fn fail(&mut self, id: RequestId, reason: String, pass: &mut Pass<D, R>) {
        tracing::warn!(request = id, "{reason}");
        if let Some(group) = self.remove(id) {
            self.stats.failed_requests += 1;
            pass.out.failed.push(FailedGroup { group, reason });
        }
    }

    fn record_peaks(&mut self) {
        let used = self.blocks.num_used_device_blocks();
        self.stats.peak_blocks_used = self.stats.peak_blocks_used.max(used);
        let seqs: usize = self.running.iter().map(|g| g.live().count()).sum();
        self.stats.peak_running_seqs = self.stats.peak_running_seqs.max(seqs);
    }
}

/// Slot targets for this step's tokens of `g`'s live sequences within `budget`, as
/// [`take_tokens`] will schedule them: computed tokens plus the planned chunk, for those
/// that do not have the slots yet.
fn growth<D, R>(
    blocks: &BlockManager,
    g: &SequenceGroup<D, R>,
    budget: usize,
) -> Vec<(SeqId, usize)> {
    let live: Vec<&crate::engine::sequence::Sequence<D>> =
        g.seqs.iter().filter(|s| !s.is_finished()).collect();
    let remaining: Vec<usize> = live.iter().map(|s| s.pending(blocks)).collect();
    let lens = plan_lens(&remaining, budget);
    live.iter()
        .zip(lens)
        .filter(|(_, len)| *len > 0)
        .map(|(s, len)| (s.id, s.num_computed(blocks) + len))
        .filter(|&(id, target)| blocks.num_tokens(id).is_ok_and(|n| n < target))
        .collect()
}

/// How many of its remaining tokens each live sequence of a group computes this step,
/// as a gang within `budget`: if every sequence's remaining tokens fit, all of them;
/// otherwise a lone sequence takes a chunk, and several take chunks that stop short of
/// their last token, so their samples still land in one step.
fn plan_lens(remaining: &[usize], budget: usize) -> Vec<usize> {
    let total: usize = remaining.iter().sum();
    let all = total <= budget;
    let mut left = budget;
    remaining
        .iter()
        .map(|&r| {
            let cap = if all || remaining.len() == 1 {
                r
            } else {
                r.saturating_sub(1)
            };
            let len = cap.min(left);
            left -= len;
            len
        })
        .collect()
}

/// Live sequences of `g` whose newest token has no slot yet.
fn appending<D, R>(blocks: &BlockManager, g: &SequenceGroup<D, R>) -> Vec<SeqId> {
    g.live()
        .filter(|s| s.tokens.len() > blocks.num_tokens(s.id).unwrap_or(usize::MAX))
        .map(|s| s.id)
        .collect()
}

/// Schedules the uncomputed tokens of `g`'s live sequences within `budget`, as a gang
/// ([`plan_lens`]); the slots for them were given by admission, `grow` or a swap-in.
fn take_tokens<D, R>(
    blocks: &BlockManager,
    g: &SequenceGroup<D, R>,
    budget: &mut usize,
    out: &mut Vec<ScheduledSeq>,
) {
    let live: Vec<(usize, usize)> = g
        .seqs
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_finished())
        .map(|(i, s)| (i, s.pending(blocks)))
        .collect();
    let remaining: Vec<usize> = live.iter().map(|l| l.1).collect();
    let lens = plan_lens(&remaining, *budget);
    for (&(i, remaining), len) in live.iter().zip(lens) {
        if len == 0 {
            continue;
        }
        *budget -= len;
        let s = &g.seqs[i];
        out.push(ScheduledSeq {
            request_id: g.request_id,
            seq: i,
            id: s.id,
            start: s.num_computed(blocks),
            len,
            sample: len == remaining,
            proposed: 0,
        });
    }
}
