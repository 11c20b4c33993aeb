//! A lost device, as the scheduler sees it: a preemption of every group at once. Every
//! KV block on the device is gone, so each running group is requeued to be recomputed
//! from its tokens (as a preemption by recomputation does, in arrival order, so the oldest
//! comes back first); a swapped group keeps its blocks in host memory unless one of them
//! was still on its way down from the device, in which case it is recomputed too; and the
//! prefix cache forgets every device block's name. Nothing a sequence produced is lost:
//! its tokens, sampler state and constraint live on the host, so a greedy or seeded
//! request continues exactly as it would have.

use super::preempt::insert_by_arrival;
use super::Scheduler;
use crate::cache::HostBlockId;
use crate::engine::sequence::SequenceGroup;
use std::collections::HashSet;

/// What a lost device did to the scheduler's groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceLoss {
    /// Groups requeued to be recomputed (every running group, and swapped groups whose
    /// host blocks had not all arrived).
    pub recomputed_groups: usize,
    /// Swapped groups that keep their host blocks and come back by swapping in.
    pub kept_swapped: usize,
    /// Tokens whose KV must be computed again.
    pub recomputed_tokens: u64,
}

impl<D, R> Scheduler<D, R> {
    /// Requeues every group after the device's memory was lost (see the module docs).
    /// `unlanded` are the host blocks whose copies down from the device never arrived.
    pub fn device_lost(&mut self, unlanded: &[HostBlockId]) -> DeviceLoss {
        let broken: HashSet<HostBlockId> = unlanded.iter().copied().collect();
        let mut loss = DeviceLoss::default();
        for g in std::mem::take(&mut self.running) {
            loss.recomputed_tokens += self.requeue(g);
            loss.recomputed_groups += 1;
        }
        for g in std::mem::take(&mut self.swapped) {
            if self.holds_any(&g, &broken) {
                loss.recomputed_tokens += self.requeue(g);
                loss.recomputed_groups += 1;
            } else {
                self.swapped.push_back(g);
                loss.kept_swapped += 1;
            }
        }
        self.blocks.lose_device_contents(unlanded);
        self.stats.recomputed_tokens += loss.recomputed_tokens;
        loss
    }

    /// Frees `g`'s blocks and puts it in the waiting queue to be recomputed; returns the
    /// tokens it had computed.
    pub(super) fn requeue(&mut self, mut g: SequenceGroup<D, R>) -> u64 {
        g.seqs.iter_mut().for_each(|s| s.proposed.clear());
        let mut tokens = 0;
        for s in g.live() {
            tokens += s.num_computed(&self.blocks) as u64;
        }
        for id in g.live_ids() {
            self.free_seq(id);
        }
        insert_by_arrival(&mut self.waiting, g);
        tokens
    }

    /// Whether a live sequence of swapped group `g` has a host block in `set`.
    fn holds_any(&self, g: &SequenceGroup<D, R>, set: &HashSet<HostBlockId>) -> bool {
        if set.is_empty() {
            return false;
        }
        let groups = self.blocks.groups().len();
        g.live_ids().into_iter().any(|id| {
            (0..groups).any(|kv| {
                self.blocks
                    .host_block_table_in(id, kv)
                    .is_ok_and(|t| t.iter().any(|h| set.contains(h)))
            })
        })
    }
}
