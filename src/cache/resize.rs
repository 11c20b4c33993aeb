//! Resizing the device pool while it serves: the KV budget given back to (or taken again
//! from) the applications that share the GPU. Growing only adds free blocks. Shrinking to
//! `n` blocks needs every block at or above `n` free first: cached blocks there are
//! evicted (copied down to the host tier, where there is one, by the next plan), and the
//! scheduler preempts the running groups that hold any (swapping
//! their blocks to host memory or dropping them for recomputation), whose swap-outs the
//! engine carries out on the old pool before it copies blocks `0..n` into a smaller one.

use super::error::CacheError;
use super::groups::{engine_id, group_of};
use super::ids::{DeviceBlockId, SeqId};
use super::manager::BlockManager;

impl BlockManager {
    /// Blocks in the device pool now.
    pub fn num_device_blocks(&self) -> usize {
        self.device.num_blocks()
    }

    /// The engine sequences whose block tables hold a device block at or above `limit`.
    pub fn sequences_above(&self, limit: usize) -> Vec<SeqId> {
        let mut out: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| {
                s.device_blocks()
                    .is_some_and(|t| t.iter().any(|b| b.0 as usize >= limit))
            })
            .map(|(&id, _)| engine_id(id))
            .collect();
        out.sort_unstable();
        out.dedup();
        debug_assert!(out.iter().all(|&id| group_of(id) == 0));
        out
    }

    /// Evicts the cached, unreferenced device blocks at or above `limit`: with a host tier,
    /// the next plan copies them down to it (before the pool shrinks). Returns how many.
    pub fn evict_cached_above(&mut self, limit: usize) -> usize {
        // The highest first: a prompt's deeper blocks were mostly allocated after its
        // first ones, and the tier should let them go before the blocks they extend.
        (limit..self.device.num_blocks())
            .rev()
            .filter(|&i| self.device.evict_block(DeviceBlockId(i as u32)))
            .count()
    }

    /// Pinned device blocks at or above `limit`.
    pub fn pinned_above(&self, limit: usize) -> usize {
        self.pins
            .counts
            .keys()
            .filter(|b| b.0 as usize >= limit)
            .count()
    }

    /// Resizes the device pool to `num_blocks` with a watermark of `watermark` blocks.
    /// Blocks cut off must be free or merely cached (their names are forgotten); a block a
    /// sequence or a pin still holds is an error and nothing changes.
    pub fn resize_device(&mut self, num_blocks: usize, watermark: usize) -> Result<(), CacheError> {
        let mut config = self.config;
        config.num_device_blocks = num_blocks;
        config.watermark_blocks = watermark;
        config.validate()?;
        self.device
            .resize(num_blocks)
            .map_err(|b: DeviceBlockId| CacheError::BlockInUse(b))?;
        self.config = config;
        Ok(())
    }
}
