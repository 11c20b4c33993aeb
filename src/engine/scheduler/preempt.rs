//! Preemption: the newest running group gives its blocks up, either by moving them to the
//! host pool (swap) or by dropping them to be recomputed from its tokens later; which one
//! is `cost.rs`'s decision. Either way the group returns to its queue in arrival order, so
//! the oldest preempted group comes back first.
//!
//! A group of several sequences that can neither swap (no host room, or recompute forced)
//! nor fit the pool once recomputed without its shared blocks would be doomed by a
//! preemption; the next-newest group is preempted instead, and the group at hand itself
//! only as the last resort. Groups already served this step are never victims (their
//! blocks are being written).

use super::super::config::PreemptionMode;
use super::super::sequence::{GroupState, SequenceGroup};
use super::cost::{choose_mode, Victim};
use super::{Groups, Scheduler};
use crate::cache::CacheError;
use crate::engine::output::RequestId;
use std::collections::VecDeque;

impl Scheduler {
    pub(super) fn preempt<D, R>(
        &mut self,
        id: RequestId,
        groups: &mut Groups<D, R>,
    ) -> Result<(), CacheError> {
        self.running.retain(|&r| r != id);
        let victim = self.victim(&groups[&id])?;
        let (mode, estimate) = choose_mode(self.config.preemption_mode, &self.costs, &victim);
        if estimate.is_some() {
            self.stats.chosen_by_cost += 1;
            self.stats.last_estimate = estimate;
        }
        self.stats.preemptions += 1;
        let g = groups.get_mut(&id).expect("running group exists");
        let ids = g.live_ids();
        let arrival = g.arrival;
        if mode == PreemptionMode::Swap {
            self.blocks.swap_out(&ids)?;
            g.state = GroupState::Swapped;
            self.stats.preempted_by_swap += 1;
            insert_by_arrival(&mut self.swapped, id, arrival, groups);
        } else {
            for s in g.seqs.iter_mut().filter(|s| !s.is_finished()) {
                self.blocks.free(s.id)?;
                self.stats.recomputed_tokens += s.num_computed as u64;
                s.num_computed = 0;
            }
            g.state = GroupState::Waiting;
            self.stats.preempted_by_recompute += 1;
            insert_by_arrival(&mut self.waiting, id, arrival, groups);
        }
        tracing::debug!(request = id, ?mode, ?estimate, "preempted");
        Ok(())
    }

    /// The group to preempt so that `id` can grow: the newest running group not yet served
    /// this step whose preemption it can recover from, else `id` itself.
    pub(super) fn pick_victim<D, R>(
        &self,
        id: RequestId,
        served: &[RequestId],
        groups: &Groups<D, R>,
    ) -> Result<RequestId, CacheError> {
        let mut candidates: Vec<(u64, RequestId)> = self
            .running
            .iter()
            .filter(|&&r| r != id && !served.contains(&r))
            .map(|&r| (groups[&r].arrival, r))
            .collect();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        for (_, r) in candidates {
            if self.recoverable(&groups[&r])? {
                return Ok(r);
            }
        }
        Ok(id)
    }

    /// Whether `g` can come back after a preemption: it swaps, or it fits the pool
    /// recomputed (without its shared blocks).
    pub(super) fn recoverable<D, R>(&self, g: &SequenceGroup<D, R>) -> Result<bool, CacheError> {
        let v = self.victim(g)?;
        let swaps =
            v.host_has_room && self.config.preemption_mode != Some(PreemptionMode::Recompute);
        Ok(v.recompute_fits || swaps)
    }

    fn victim<D, R>(&self, g: &SequenceGroup<D, R>) -> Result<Victim, CacheError> {
        let ids = g.live_ids();
        let bs = self.blocks.block_size();
        // Recomputed sequences no longer share blocks, at any length up to their last.
        let unshared = g.live().count() * g.max_len.div_ceil(bs);
        Ok(Victim {
            blocks: self.blocks.group_blocks_after_append(&ids, &[])?,
            tokens: g.live().map(|s| s.num_computed).sum(),
            seqs: ids.len(),
            host_has_room: self.blocks.can_swap_out(&ids),
            recompute_fits: unshared <= self.blocks.group_capacity(),
        })
    }
}

/// Puts `id` before the first group of `queue` that arrived after it.
fn insert_by_arrival<D, R>(
    queue: &mut VecDeque<RequestId>,
    id: RequestId,
    arrival: u64,
    groups: &Groups<D, R>,
) {
    let pos = queue
        .iter()
        .position(|other| groups.get(other).is_some_and(|o| o.arrival > arrival))
        .unwrap_or(queue.len());
    queue.insert(pos, id);
}
