//! The scheduler's queues, the one place that says where a group is: waiting for admission
//! (new, or preempted to be recomputed), running (its blocks on the device), or swapped
//! (its blocks in host memory). Groups enter with [`Scheduler::add`] and leave with
//! [`Scheduler::remove`], which frees whatever blocks they hold; everything else asks by
//! request id and gets `None` for a group that is not here.

use super::super::output::RequestId;
use super::super::sequence::{Sequence, SequenceGroup};
use super::{ScheduledSeq, Scheduler};
use crate::cache::SeqId;

/// Which queue a group is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    Waiting,
    Running,
    Swapped,
}

impl<D, R> Scheduler<D, R> {
    /// Queues a new group for admission, after the groups already waiting.
    pub fn add(&mut self, group: SequenceGroup<D, R>) {
        self.waiting.push_back(group);
    }

    /// A sequence id no sequence has had before (for a new group's first sequence; forks
    /// get theirs in [`Scheduler::commit`]).
    pub fn new_seq_id(&mut self) -> SeqId {
        self.next_seq += 1;
        SeqId(self.next_seq)
    }

    /// Where group `id` is, `None` when the scheduler does not hold it.
    pub fn queue_of(&self, id: RequestId) -> Option<Queue> {
        let has = |g: &SequenceGroup<D, R>| g.request_id == id;
        if self.running.iter().any(has) {
            Some(Queue::Running)
        } else if self.waiting.iter().any(has) {
            Some(Queue::Waiting)
        } else if self.swapped.iter().any(has) {
            Some(Queue::Swapped)
        } else {
            None
        }
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.queue_of(id).is_some()
    }

    pub fn get(&self, id: RequestId) -> Option<&SequenceGroup<D, R>> {
        self.groups().find(|g| g.request_id == id)
    }

    /// The group, for the caller's own data (`data` of the group and of its sequences).
    /// Tokens, progress, finish reasons and the sequence list change only through
    /// [`Scheduler::commit`], which keeps the block manager in step with them.
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut SequenceGroup<D, R>> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .chain(self.swapped.iter_mut())
            .find(|g| g.request_id == id)
    }

    /// The sequence a step scheduled, if its group is still running.
    pub fn scheduled_seq(&self, s: &ScheduledSeq) -> Option<&Sequence<D>> {
        self.running
            .iter()
            .find(|g| g.request_id == s.request_id)
            .and_then(|g| g.seqs.get(s.seq))
            .filter(|seq| seq.id == s.id)
    }

    /// Every group held: running first, then waiting, then swapped.
    pub fn groups(&self) -> impl Iterator<Item = &SequenceGroup<D, R>> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .chain(self.swapped.iter())
    }

    /// The waiting groups, in the order they will be admitted.
    pub fn waiting(&self) -> impl Iterator<Item = &SequenceGroup<D, R>> {
        self.waiting.iter()
    }

    /// The running groups, in the order they were admitted or came back.
    pub fn running(&self) -> &[SequenceGroup<D, R>] {
        &self.running
    }

    /// The running groups, to set their sequences' proposals before a step (their tokens
    /// and shape are the scheduler's to change, not the caller's).
    pub fn running_mut(&mut self) -> &mut [SequenceGroup<D, R>] {
        &mut self.running
    }

    pub fn num_groups(&self) -> usize {
        self.waiting.len() + self.running.len() + self.swapped.len()
    }

    pub fn is_empty(&self) -> bool {
        self.num_groups() == 0
    }

    /// Leading tokens of sequence `seq` whose K/V are in the cache (0 without a table).
    pub fn num_computed(&self, seq: crate::cache::SeqId) -> usize {
        self.blocks.num_computed_tokens(seq).unwrap_or(0)
    }

    /// The block manager's statistics (this walks every block table).
    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.blocks.stats()
    }

    /// The KV cache groups the block manager keeps a table per.
    pub fn kv_groups(&self) -> &crate::cache::KvGroups {
        self.blocks.groups()
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

    /// Sequence slots the running groups hold (see [`SequenceGroup::slots`]).
    pub fn running_slots(&self) -> usize {
        self.running.iter().map(SequenceGroup::slots).sum()
    }

    /// Takes group `id` out of its queue and frees every block its sequences hold
    /// (finish, abort or failure); `None` when the scheduler does not hold it.
    pub fn remove(&mut self, id: RequestId) -> Option<SequenceGroup<D, R>> {
        let has = |g: &SequenceGroup<D, R>| g.request_id == id;
        let g = if let Some(i) = self.running.iter().position(has) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(has) {
            self.waiting.remove(i)?
        } else {
            let i = self.swapped.iter().position(has)?;
            self.swapped.remove(i)?
        };
        for s in &g.seqs {
            self.free_seq(s.id);
        }
        Some(g)
    }

    /// Takes every group out, freeing their blocks, and voids the step's pending plan.
    pub fn remove_all(&mut self) -> Vec<SequenceGroup<D, R>> {
        let ids: Vec<RequestId> = self.groups().map(|g| g.request_id).collect();
        let all = ids.into_iter().filter_map(|id| self.remove(id)).collect();
        // A plan recorded before now is void: its blocks are free again, and no cached name
        // is trusted after a fault.
        self.blocks.void_ops();
        all
    }

    /// Frees a sequence's blocks, if it holds any.
    pub(super) fn free_seq(&mut self, id: SeqId) {
        if self.blocks.contains(id) {
            let _ = self.blocks.free(id);
        }
    }
}
