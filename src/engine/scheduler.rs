//! Continuous batching with chunked prefill (after vLLM's scheduler, Kwon et al. SOSP 2023).
//!
//! Each step, in order:
//! 1. Running groups, oldest first, get the slots their new tokens need. When the pool is
//!    short, the newest running group is preempted (recompute or swap, see
//!    [`EngineConfig::preemption_mode`]) until the group at hand fits, possibly preempting
//!    that group itself. Their tokens (1 per decoding sequence, a chunk of the prompt for a
//!    sequence still in prefill) share the step's token budget.
//! 2. If nothing was preempted this step, swapped groups come back, oldest first, while they
//!    fit.
//! 3. If nothing is swapped out, waiting groups are admitted first come, first served, while
//!    blocks (above the watermark), sequence slots and the token budget allow. A prompt that
//!    can never fit the pool is rejected.
//!
//! Sequences progress by `num_computed` against their token count; there is no separate
//! prefill phase, so a long prompt simply takes several steps.

use super::config::{EngineConfig, PreemptionMode};
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
    pub scheduled: Vec<ScheduledSeq>,
    pub ops: BlockOps,
    /// Requests that can never run (their prompt needs more blocks than the pool has).
    pub rejected: Vec<(RequestId, String)>,
}

/// Counters for `--stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub steps: u64,
    pub preemptions: u64,
    pub preempted_by_swap: u64,
    pub preempted_by_recompute: u64,
    pub recomputed_tokens: u64,
    pub peak_running_seqs: usize,
    pub peak_blocks_used: usize,
}

pub struct Scheduler {
    pub config: EngineConfig,
    pub blocks: BlockManager,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    swapped: VecDeque<RequestId>,
    pub stats: SchedulerStats,
}

type Groups = HashMap<RequestId, SequenceGroup>;

impl Scheduler {
    pub fn new(config: EngineConfig, blocks: BlockManager) -> Self {
        Scheduler {
            config,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: VecDeque::new(),
            stats: SchedulerStats::default(),
        }
    }

    pub fn add(&mut self, id: RequestId) {
        self.waiting.push_back(id);
    }

    pub fn num_running_seqs(&self, groups: &Groups) -> usize {
        self.running
            .iter()
            .filter_map(|id| groups.get(id))
            .map(|g| g.live().count())
            .sum()
    }

    /// Forgets `id` and frees every block its sequences hold (finish or abort).
    pub fn remove(&mut self, id: RequestId, groups: &Groups) {
        self.waiting.retain(|&g| g != id);
        self.running.retain(|&g| g != id);
        self.swapped.retain(|&g| g != id);
        if let Some(g) = groups.get(&id) {
            for s in &g.seqs {
                if self.blocks.contains(s.id) {
                    let _ = self.blocks.free(s.id);
                }
            }
        }
    }

    /// Frees a finished sequence's blocks (its group may continue).
    pub fn free_seq(&mut self, id: SeqId) {
        if self.blocks.contains(id) {
            let _ = self.blocks.free(id);
        }
    }

    pub fn schedule(&mut self, groups: &mut Groups) -> Result<SchedulerOutput, CacheError> {
        self.stats.steps += 1;
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted = false;

        // 1. Running groups, oldest first; preempt from the newest end when short of blocks.
        self.running
            .sort_by_key(|id| groups.get(id).map_or(u64::MAX, |g| g.arrival));
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            let needs: Vec<(SeqId, u32)> = groups[&id]
                .live()
                .filter(|s| s.tokens.len() > self.blocks.num_tokens(s.id).unwrap_or(usize::MAX))
                .map(|s| (s.id, *s.tokens.last().unwrap_or(&0)))
                .collect();
            let ids: Vec<SeqId> = needs.iter().map(|n| n.0).collect();
            let mut self_preempted = false;
            while !self.blocks.can_append_slots(&ids) {
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim, groups)?;
                preempted = true;
                if victim == id {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                continue;
            }
            for (seq, token) in needs {
                self.blocks.append_slot(seq, token)?;
            }
            budget = self.take_tokens(&groups[&id], budget, &mut out);
            i += 1;
        }

        // 2. Swapped groups come back while they fit, unless this step had to preempt.
        if !preempted {
            while let Some(&id) = self.swapped.front() {
                let ids = groups[&id].live_ids();
                if self.blocks.can_swap_in(&ids) != AllocStatus::Now
                    || self.num_running_seqs(groups) + ids.len() > self.config.max_num_seqs
                {
                    break;
                }
                self.swapped.pop_front();
                self.blocks.swap_in(&ids)?;
                if let Some(g) = groups.get_mut(&id) {
                    g.state = GroupState::Running;
                }
                self.running.push(id);
                let g = &groups[&id];
                let needs: Vec<(SeqId, u32)> = g
                    .live()
                    .filter(|s| s.tokens.len() > self.blocks.num_tokens(s.id).unwrap_or(usize::MAX))
                    .map(|s| (s.id, *s.tokens.last().unwrap_or(&0)))
                    .collect();
                let ids: Vec<SeqId> = needs.iter().map(|n| n.0).collect();
                if self.blocks.can_append_slots(&ids) {
                    for (seq, token) in needs {
                        self.blocks.append_slot(seq, token)?;
                    }
                    budget = self.take_tokens(&groups[&id], budget, &mut out);
                }
            }
        }

        // 3. Admission, first come first served, while nothing waits in the host pool.
        if self.swapped.is_empty() {
            while let Some(&id) = self.waiting.front() {
                if budget == 0 {
                    break;
                }
                let g = &groups[&id];
                let live: Vec<(SeqId, Vec<u32>)> =
                    g.live().map(|s| (s.id, s.tokens.clone())).collect();
                if self.num_running_seqs(groups) + live.len() > self.config.max_num_seqs {
                    break;
                }
                let statuses: Vec<AllocStatus> = live
                    .iter()
                    .map(|(_, t)| self.blocks.can_allocate(t))
                    .collect();
                if statuses.contains(&AllocStatus::Never) {
                    self.waiting.pop_front();
                    let need = live[0].1.len().div_ceil(self.config.block_size);
                    out.rejected.push((
                        id,
                        format!(
                            "the prompt needs {need} KV blocks but the pool has {} (less the watermark); \
                             raise --num-gpu-blocks or shorten the prompt",
                            self.blocks.config().num_device_blocks
                        ),
                    ));
                    continue;
                }
                if statuses.iter().any(|s| *s != AllocStatus::Now) {
                    break;
                }
                // Several sequences (a recomputed group) are allocated one by one; undo all
                // if a later one no longer fits.
                let mut done = Vec::new();
                let mut cached = Vec::new();
                for (seq, tokens) in &live {
                    match self.blocks.allocate(*seq, tokens) {
                        Ok(c) => {
                            done.push(*seq);
                            cached.push(c);
                        }
                        Err(_) => break,
                    }
                }
                if done.len() < live.len() {
                    for seq in done {
                        let _ = self.blocks.free(seq);
                    }
                    break;
                }
                self.waiting.pop_front();
                let g = groups.get_mut(&id).expect("waiting group exists");
                g.state = GroupState::Running;
                for (s, c) in g.seqs.iter_mut().filter(|s| !s.is_finished()).zip(cached) {
                    s.num_computed = c;
                }
                self.running.push(id);
                budget = self.take_tokens(&groups[&id], budget, &mut out);
            }
        }

        out.ops = self.blocks.take_ops();
        let st = self.blocks.stats();
        self.stats.peak_blocks_used = self.stats.peak_blocks_used.max(st.device.used);
        self.stats.peak_running_seqs = self
            .stats
            .peak_running_seqs
            .max(self.num_running_seqs(groups));
        Ok(out)
    }

    /// Schedules the uncomputed tokens of `g`'s live sequences within `budget`; returns
    /// what is left of it.
    fn take_tokens(
        &self,
        g: &SequenceGroup,
        mut budget: usize,
        out: &mut SchedulerOutput,
    ) -> usize {
        for (i, s) in g.seqs.iter().enumerate() {
            if s.is_finished() {
                continue;
            }
            let remaining = s.tokens.len() - s.num_computed;
            let len = remaining.min(budget);
            if len == 0 {
                continue;
            }
            budget -= len;
            out.scheduled.push(ScheduledSeq {
                request_id: g.request_id,
                seq: i,
                id: s.id,
                start: s.num_computed,
                len,
                sample: len == remaining,
            });
        }
        budget
    }

    fn preempt(&mut self, id: RequestId, groups: &mut Groups) -> Result<(), CacheError> {
        let g = groups.get_mut(&id).expect("running group exists");
        let ids = g.live_ids();
        let mode = self.config.preemption_mode.unwrap_or(if ids.len() > 1 {
            PreemptionMode::Swap
        } else {
            PreemptionMode::Recompute
        });
        self.stats.preemptions += 1;
        if mode == PreemptionMode::Swap && self.blocks.can_swap_out(&ids) {
            self.blocks.swap_out(&ids)?;
            g.state = GroupState::Swapped;
            self.stats.preempted_by_swap += 1;
            // Oldest first when resuming.
            let pos = self
                .swapped
                .iter()
                .position(|other| {
                    groups
                        .get(other)
                        .is_some_and(|o| o.arrival > groups[&id].arrival)
                })
                .unwrap_or(self.swapped.len());
            self.swapped.insert(pos, id);
        } else {
            for s in g.seqs.iter_mut().filter(|s| !s.is_finished()) {
                self.blocks.free(s.id)?;
                self.stats.recomputed_tokens += s.num_computed as u64;
                s.num_computed = 0;
            }
            g.state = GroupState::Waiting;
            self.stats.preempted_by_recompute += 1;
            let arrival = g.arrival;
            let pos = self
                .waiting
                .iter()
                .position(|other| groups.get(other).is_some_and(|o| o.arrival > arrival))
                .unwrap_or(self.waiting.len());
            self.waiting.insert(pos, id);
        }
        Ok(())
    }
}
