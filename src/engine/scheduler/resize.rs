//! The device pool changes size while the scheduler runs (`cache/resize.rs`). To shrink
//! to `n` blocks, the least valuable blocks go first: cached prefix blocks at or above `n`
//! are evicted (copied down to the host tier, where there is one); then every running
//! group holding a block there is preempted, newest first, by swap or recomputation as any preemption is (`preempt.rs`); the swap-outs that
//! records are the caller's to carry out on the old pool before it goes. Groups come back
//! through the usual queues, into the blocks left, so nothing they produce changes; one
//! that can never fit the smaller pool fails alone at the next scheduling pass.

use super::Scheduler;
use crate::cache::{BlockOps, CacheError};
use crate::engine::output::RequestId;
use std::collections::HashSet;

impl<D, R> Scheduler<D, R> {
    /// Evicts the cached blocks at or above `limit` (to the host tier, if there is one),
    /// then preempts the running groups that hold a device block there, newest first;
    /// returns how many groups. The copies and swap-outs are in [`Self::take_block_ops`].
    pub fn vacate_above(&mut self, limit: usize) -> Result<usize, CacheError> {
        self.blocks.evict_cached_above(limit);
        let holders: HashSet<_> = self.blocks.sequences_above(limit).into_iter().collect();
        let mut victims: Vec<(u64, RequestId)> = self
            .running
            .iter()
            .filter(|g| g.live_ids().iter().any(|id| holders.contains(id)))
            .map(|g| (g.arrival, g.request_id))
            .collect();
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, id) in &victims {
            self.preempt(id)?;
        }
        Ok(victims.len())
    }

    /// The block operations recorded outside a scheduling pass (a resize's swap-outs), to
    /// be carried out now.
    pub fn take_block_ops(&mut self) -> BlockOps {
        self.blocks.take_ops()
    }

    /// Resizes the device pool to `num_blocks` with `watermark` (every block at or above it
    /// free, see [`Self::vacate_above`]).
    pub fn resize_pool(&mut self, num_blocks: usize, watermark: usize) -> Result<(), CacheError> {
        self.blocks.resize_device(num_blocks, watermark)
    }
}
