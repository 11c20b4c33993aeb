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

use super::super::sequence::SequenceGroup;
use super::cost::{choose_mode, Victim};
use super::Scheduler;
use crate::cache::CacheError;
use crate::config::PreemptionMode;
use crate::engine::output::RequestId;
use std::collections::VecDeque;

impl<D, R> Scheduler<D, R> {
    /// Moves running group `id` to the swapped queue (its blocks to the host pool) or to
    /// the waiting queue (its blocks freed, to be recomputed).
    pub(super) fn preempt(&mut self, id: RequestId) -> Result<(), CacheError> {
        let i = self
            .running
            .iter()
            .position(|g| g.request_id == id)
            .ok_or(CacheError::UnknownGroup(id))?;
        let victim = self.victim(&self.running[i])?;
        let (mode, estimate) = choose_mode(self.config.preemption_mode, &self.costs, &victim);
        if estimate.is_some() {
            self.stats.chosen_by_cost += 1;
            self.stats.last_estimate = estimate;
        }
        let ids = self.running[i].live_ids();
        // Proposals belong to the step that decodes; a preempted group does not.
        self.running[i]
            .seqs
            .iter_mut()
            .for_each(|s| s.proposed.clear());
        if mode == PreemptionMode::Swap {
            // The blocks move first: should that fail, the group is still running.
            self.blocks.swap_out(&ids)?;
            let g = self.running.remove(i);
            insert_by_arrival(&mut self.swapped, g);
            self.stats.preempted_by_swap += 1;
        } else {
            let g = self.running.remove(i);
            for s in g.live() {
                self.stats.recomputed_tokens += s.num_computed(&self.blocks) as u64;
                if self.blocks.contains(s.id) {
                    self.blocks.free(s.id)?;
                }
            }
            insert_by_arrival(&mut self.waiting, g);
            self.stats.preempted_by_recompute += 1;
        }
        self.stats.preemptions += 1;
        tracing::debug!(request = id, ?mode, ?estimate, "preempted");
        Ok(())
    }

    /// The group to preempt so that `id` can grow: the newest running group not yet served
    /// this step whose preemption it can recover from, else `id` itself.
    pub(super) fn pick_victim(
        &self,
        id: RequestId,
        served: &[RequestId],
    ) -> Result<RequestId, CacheError> {
        let mut candidates: Vec<&SequenceGroup<D, R>> = self
            .running
            .iter()
            .filter(|g| g.request_id != id && !served.contains(&g.request_id))
            .collect();
        candidates.sort_unstable_by_key(|g| std::cmp::Reverse(g.arrival));
        for g in candidates {
            if self.recoverable(g)? {
                return Ok(g.request_id);
            }
        }
        Ok(id)
    }

    /// [`Self::recoverable`] for running group `id`.
    pub(super) fn recoverable_running(&self, id: RequestId) -> Result<bool, CacheError> {
        let g = self
            .running
            .iter()
            .find(|g| g.request_id == id)
            .ok_or(CacheError::UnknownGroup(id))?;
        self.recoverable(g)
    }

    /// Whether `g` can come back after a preemption: it swaps, or it fits the pool
    /// recomputed (without its shared blocks).
    fn recoverable(&self, g: &SequenceGroup<D, R>) -> Result<bool, CacheError> {
        let v = self.victim(g)?;
        let swaps =
            v.host_has_room && self.config.preemption_mode != Some(PreemptionMode::Recompute);
        Ok(v.recompute_fits || swaps)
    }

    fn victim(&self, g: &SequenceGroup<D, R>) -> Result<Victim, CacheError> {
        let ids = g.live_ids();
        // Recomputed sequences no longer share blocks, at any length up to their last.
        let unshared = g.live().count() * self.blocks.blocks_between(0, g.max_len);
        Ok(Victim {
            blocks: self.blocks.group_blocks_after_append(&ids, &[])?,
            tokens: g.live().map(|s| s.num_computed(&self.blocks)).sum(),
            seqs: ids.len(),
            host_has_room: self.blocks.can_swap_out(&ids),
            recompute_fits: unshared <= self.blocks.group_capacity(),
        })
    }
}

/// Puts `g` before the first group of `queue` that arrived after it.
pub(super) fn insert_by_arrival<D, R>(
    queue: &mut VecDeque<SequenceGroup<D, R>>,
    g: SequenceGroup<D, R>,
) {
    let pos = queue
        .iter()
        .position(|other| other.arrival > g.arrival)
        .unwrap_or(queue.len());
    queue.insert(pos, g);
}
