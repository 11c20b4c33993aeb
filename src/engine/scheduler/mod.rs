//! Continuous batching with chunked prefill (after vLLM's scheduler, Kwon et al. SOSP 2023,
//! and its chunked-prefill policy, Agrawal et al., "Sarathi-Serve", OSDI 2024).
//!
//! Each step, in order (`schedule`):
//! 1. **Running decodes** (every live sequence has only its newest token to compute), oldest
//!    first, get the slots their new tokens need. When the pool is short, the newest running
//!    group is preempted (swap or recompute, see `preempt.rs`) until the group at hand fits,
//!    possibly preempting that group itself.
//! 2. **Running prefills** get chunks of their prompts from what is left of the token budget.
//! 3. If nothing was preempted this step, **swapped groups** come back, oldest first, while
//!    they fit.
//! 4. If nothing was preempted and nothing is left in host memory, **waiting groups** are
//!    admitted first come, first served, while blocks (above the watermark), sequence slots
//!    and the budget allow.
//!
//! A group is scheduled as a unit (gang scheduling): all its live sequences compute their
//! next token in the same step or none do, and a group reserves its full width of sequence
//! slots from admission on, so a later fork never exceeds `max_num_seqs`. A group that can
//! never run (`limits.rs`) fails alone, with a reason, the moment that is known; what every
//! other group produces is unchanged.
//!
//! Sequences progress by `num_computed` against their token count; there is no separate
//! prefill phase. The scheduler and the block manager are plain Rust: groups carry the
//! engine's own data as type parameters (see `sequence.rs`), so both run without a GPU.

mod cost;
mod groups;
mod limits;
mod preempt;

pub use cost::{choose_mode, CostEstimate, PreemptionCosts, Victim};

use super::config::EngineConfig;
use super::output::RequestId;
use super::sequence::{GroupState, SequenceGroup};
use crate::cache::{AllocStatus, BlockManager, BlockOps, CacheError, SeqId};
use std::collections::{HashMap, VecDeque};

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub request_id: RequestId,
    /// Index into the group's `seqs`.
    pub seq: usize,
    pub id: SeqId,
    /// First token computed this step (= the sequence's `num_computed`).
    pub start: usize,
    pub len: usize,
    /// The step reaches the sequence's last token, so a new token is sampled.
    pub sample: bool,
}

#[derive(Debug, Default)]
pub struct SchedulerOutput {
    /// Sequences of one group are next to each other.
    pub scheduled: Vec<ScheduledSeq>,
    pub ops: BlockOps,
    /// Requests that can never run, with the reason. The scheduler has already forgotten
    /// them and freed their blocks; the caller reports them and drops their groups.
    pub failed: Vec<(RequestId, String)>,
}

/// Counters for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    pub steps: u64,
    pub preemptions: u64,
    pub preempted_by_swap: u64,
    pub preempted_by_recompute: u64,
    /// Automatic choices that rested on measured costs (the rest followed a hard
    /// constraint or the static rule).
    pub chosen_by_cost: u64,
    /// The estimate behind the latest cost-based choice.
    pub last_estimate: Option<CostEstimate>,
    pub recomputed_tokens: u64,
    /// Prefill chunks that stopped short of the sequence's end (chunked prefill at work).
    pub partial_prefills: u64,
    /// Requests failed because they could never run.
    pub failed_requests: u64,
    pub peak_running_seqs: usize,
    pub peak_blocks_used: usize,
}

pub type Groups<D, R> = HashMap<RequestId, SequenceGroup<D, R>>;

pub struct Scheduler {
    pub config: EngineConfig,
    pub blocks: BlockManager,
    /// Measured figures that automatic preemption weighs; the engine keeps them current.
    pub costs: PreemptionCosts,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    swapped: VecDeque<RequestId>,
    pub stats: SchedulerStats,
}

/// State of one scheduling pass.
#[derive(Default)]
struct Pass {
    budget: usize,
    /// Something was preempted, or a running group waits for blocks: no swap-ins or
    /// admissions this step.
    preempted: bool,
    /// Running groups already given their share of this step.
    served: Vec<RequestId>,
    out: SchedulerOutput,
}

impl Scheduler {
    pub fn new(config: EngineConfig, blocks: BlockManager) -> Self {
        Scheduler {
            config,
            blocks,
            costs: PreemptionCosts::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            stats: SchedulerStats::default(),
        }
    }

    /// Queues a new group (its state must be `Waiting`).
    pub fn add(&mut self, id: RequestId) {
        self.waiting.push_back(id);
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// Whether the scheduler still tracks `id` in any queue.
    pub fn contains(&self, id: RequestId) -> bool {
        self.waiting.contains(&id) || self.running.contains(&id) || self.swapped.contains(&id)
    }

    /// Sequence slots the running groups hold (see [`SequenceGroup::slots`]).
    pub fn running_slots<D, R>(&self, groups: &Groups<D, R>) -> usize {
        self.running
            .iter()
            .filter_map(|id| groups.get(id))
            .map(SequenceGroup::slots)
            .sum()
    }

    /// Plans one step: which sequences compute which tokens, the block operations that
    /// must run first, and the requests that failed because they can never run.
    pub fn schedule<D, R>(
        &mut self,
        groups: &mut Groups<D, R>,
    ) -> Result<SchedulerOutput, CacheError> {
        self.stats.steps += 1;
        let mut pass = Pass {
            budget: self.config.max_num_batched_tokens,
            ..Pass::default()
        };
        self.schedule_running(groups, &mut pass)?;
        if !pass.preempted {
            self.schedule_swapped(groups, &mut pass)?;
        }
        // Admitting right after a preemption would only invite the next one.
        if self.swapped.is_empty() && !pass.preempted {
            self.schedule_waiting(groups, &mut pass)?;
        }
        pass.out.ops = self.blocks.take_ops();
        self.record_peaks(groups);
        Ok(pass.out)
    }

    /// Phases 1 and 2: running decodes first, oldest first, then chunks of running
    /// prefills (with `decode_first` off, all running groups strictly oldest first).
    fn schedule_running<D, R>(
        &mut self,
        groups: &mut Groups<D, R>,
        pass: &mut Pass,
    ) -> Result<(), CacheError> {
        let decode_first = self.config.decode_first;
        let mut order: Vec<(bool, u64, RequestId)> = self
            .running
            .iter()
            .map(|id| {
                let g = &groups[id];
                (decode_first && !g.is_decoding(), g.arrival, *id)
            })
            .collect();
        order.sort_unstable();
        for (_, _, id) in order {
            // Preempted earlier in this pass.
            if !self.running.contains(&id) {
                continue;
            }
            if !self.grow(id, groups, pass)? {
                continue;
            }
            self.take_tokens(&groups[&id], pass);
            pass.served.push(id);
        }
        Ok(())
    }

    /// Gives every live sequence of `id` that needs one the slot for its newest token,
    /// preempting the newest running groups while the pool is short. False when `id`
    /// itself was preempted or failed (it can never grow this far), when it waits for room
    /// because it could not recover from a preemption, or when its decode does not fit
    /// what is left of the budget (in the last two cases nothing is taken, and it is tried
    /// again next step).
    fn grow<D, R>(
        &mut self,
        id: RequestId,
        groups: &mut Groups<D, R>,
        pass: &mut Pass,
    ) -> Result<bool, CacheError> {
        let g = &groups[&id];
        if g.is_decoding() && g.live().count() > pass.budget {
            return Ok(false);
        }
        let appending = self.appending(g);
        let ids: Vec<SeqId> = appending.iter().map(|a| a.0).collect();
        if !self.blocks.can_append_slots(&ids) {
            if let Some(reason) = self.never_runs(g)? {
                self.fail(id, reason, groups, pass);
                return Ok(false);
            }
        }
        while !self.blocks.can_append_slots(&ids) {
            let victim = self.pick_victim(id, &pass.served, groups)?;
            if victim == id && !pass.served.is_empty() && !self.recoverable(&groups[&id])? {
                // Preempting it would doom it; older groups are progressing and will make
                // room. Nothing new is let in meanwhile.
                pass.preempted = true;
                return Ok(false);
            }
            self.preempt(victim, groups)?;
            pass.preempted = true;
            if victim == id {
                return Ok(false);
            }
        }
        for (seq, token) in appending {
            self.blocks.append_slot(seq, token)?;
        }
        Ok(true)
    }

    /// Phase 3: swapped groups come back, oldest first, while they fit.
    fn schedule_swapped<D, R>(
        &mut self,
        groups: &mut Groups<D, R>,
        pass: &mut Pass,
    ) -> Result<(), CacheError> {
        while let Some(&id) = self.swapped.front() {
            let g = &groups[&id];
            if let Some(reason) = self.never_runs(g)? {
                self.fail(id, reason, groups, pass);
                continue;
            }
            let ids = g.live_ids();
            let appending = self.appending(g);
            let append_ids: Vec<SeqId> = appending.iter().map(|a| a.0).collect();
            let need = self.blocks.group_blocks_after_append(&ids, &append_ids)?;
            let usable = self
                .blocks
                .num_available_device_blocks()
                .saturating_sub(self.blocks.watermark_blocks());
            if self.blocks.can_swap_in(&ids) != AllocStatus::Now
                || need > usable
                || pass.budget == 0
                || self.running_slots(groups) + g.slots() > self.config.max_num_seqs
                || (g.is_decoding() && g.live().count() > pass.budget)
            {
                break;
            }
            self.swapped.pop_front();
            self.blocks.swap_in(&ids)?;
            for (seq, token) in appending {
                self.blocks.append_slot(seq, token)?;
            }
            groups.get_mut(&id).expect("swapped group exists").state = GroupState::Running;
            self.running.push(id);
            self.take_tokens(&groups[&id], pass);
            pass.served.push(id);
        }
        Ok(())
    }

    /// Phase 4: admission, first come first served.
    fn schedule_waiting<D, R>(
        &mut self,
        groups: &mut Groups<D, R>,
        pass: &mut Pass,
    ) -> Result<(), CacheError> {
        while let Some(&id) = self.waiting.front() {
            let g = &groups[&id];
            if let Some(reason) = self.never_runs(g)? {
                self.fail(id, reason, groups, pass);
                continue;
            }
            if pass.budget == 0 || self.running_slots(groups) + g.slots() > self.config.max_num_seqs
            {
                break;
            }
            let live: Vec<(SeqId, &[u32])> =
                g.live().map(|s| (s.id, s.tokens.as_slice())).collect();
            let prompts: Vec<&[u32]> = live.iter().map(|l| l.1).collect();
            if self.blocks.can_allocate_group(&prompts) != AllocStatus::Now {
                break;
            }
            let cached = self.blocks.allocate_group(&live)?;
            self.waiting.pop_front();
            let g = groups.get_mut(&id).expect("waiting group exists");
            g.state = GroupState::Running;
            for (s, c) in g.seqs.iter_mut().filter(|s| !s.is_finished()).zip(cached) {
                s.num_computed = c;
            }
            self.running.push(id);
            self.take_tokens(&groups[&id], pass);
            pass.served.push(id);
        }
        Ok(())
    }

    /// Live sequences of `g` whose newest token has no slot yet, with that token.
    fn appending<D, R>(&self, g: &SequenceGroup<D, R>) -> Vec<(SeqId, u32)> {
        g.live()
            .filter(|s| s.tokens.len() > self.blocks.num_tokens(s.id).unwrap_or(usize::MAX))
            .map(|s| (s.id, *s.tokens.last().expect("sequences are never empty")))
            .collect()
    }

    /// Schedules the uncomputed tokens of `g`'s live sequences within the budget, as a
    /// gang: if every sequence's remaining tokens fit, all of them run and all sample;
    /// otherwise a lone sequence takes a chunk, and several take chunks that stop short of
    /// their last token, so their samples still land in one step.
    fn take_tokens<D, R>(&mut self, g: &SequenceGroup<D, R>, pass: &mut Pass) {
        let live: Vec<(usize, usize)> = g
            .seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_finished())
            .map(|(i, s)| (i, s.pending()))
            .collect();
        let total: usize = live.iter().map(|l| l.1).sum();
        let all = total <= pass.budget;
        for &(i, remaining) in &live {
            let cap = if all || live.len() == 1 {
                remaining
            } else {
                remaining - 1
            };
            let len = cap.min(pass.budget);
            if len == 0 {
                continue;
            }
            pass.budget -= len;
            self.stats.partial_prefills += (len < remaining) as u64;
            let s = &g.seqs[i];
            pass.out.scheduled.push(ScheduledSeq {
                request_id: g.request_id,
                seq: i,
                id: s.id,
                start: s.num_computed,
                len,
                sample: len == remaining,
            });
        }
    }

    /// Forgets `id`, frees its blocks and reports it as failed with `reason`.
    fn fail<D, R>(
        &mut self,
        id: RequestId,
        reason: String,
        groups: &Groups<D, R>,
        pass: &mut Pass,
    ) {
        tracing::warn!(request = id, "{reason}");
        self.remove(id, groups);
        self.stats.failed_requests += 1;
        pass.out.failed.push((id, reason));
    }

    fn record_peaks<D, R>(&mut self, groups: &Groups<D, R>) {
        let used = self.blocks.num_used_device_blocks();
        self.stats.peak_blocks_used = self.stats.peak_blocks_used.max(used);
        let seqs: usize = self
            .running
            .iter()
            .filter_map(|id| groups.get(id))
            .map(|g| g.live().count())
            .sum();
        self.stats.peak_running_seqs = self.stats.peak_running_seqs.max(seqs);
    }
}
