//! The host tier of the prefix cache: named blocks the device pool lets go of are copied
//! into host blocks under the same names, and a later prompt that starts with them copies
//! them back up instead of recomputing them. This is the CPU tier of LMCache and of vLLM's
//! KV offloading, laid over PagedAttention's swap pool (Kwon et al., SOSP 2023, §4.5): a
//! tier block is a host block like a swapped-out one, named and LRU-evictable like a cached
//! device block (`device.rs`).
//!
//! Copies down are planned when the step's plan is taken: for every named block the step
//! evicted (and, writing through, every block named since the last plan) whose name the
//! tier lacks, a host block is taken (free, else the tier's least recently used; past the
//! tier's budget always the latter) and a swap-out recorded. Swap-outs run first in a step,
//! so they read each block before the step writes new data into it. Nothing of a step's
//! copies down is visible to lookups before the next step, when their data is in host
//! memory; so a copy up never reads a host block whose copy down is still in flight.
//!
//! A copy up is a swap-in into a fresh device block, named at once (like a swapped-in
//! block), whose host block the plan holds until the swap-in has read it; the host block
//! stays in the tier. The tier yields to swapping: a swap-out takes tier blocks when the
//! host pool has no free ones.

use super::ids::{DeviceBlockId, HostBlockId};
use super::manager::BlockManager;
use super::prefix::{BlockHash, ExtraKeys};

/// What the host tier holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The most blocks the tier may hold.
    pub budget: usize,
    /// Named blocks in the tier now.
    pub blocks: usize,
    /// Prompt blocks found in the tier and copied up.
    pub hits: u64,
    /// Blocks copied down into the tier.
    pub saves: u64,
    /// Tier blocks reclaimed for other data (a swap-out, or a newer block).
    pub evictions: u64,
}

/// The name of a host-tier block: its chained hash, its parent's, and its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierName<'a> {
    pub hash: BlockHash,
    pub parent: Option<BlockHash>,
    pub tokens: &'a [u32],
}

impl BlockManager {
    /// Copies host-tier block `h` (held by the plan) up into a fresh device block named
    /// `hash`. The caller has counted the device block at admission.
    pub(super) fn promote(
        &mut self,
        h: HostBlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> DeviceBlockId {
        let d = self
            .device
            .allocate()
            .expect("admission counted the blocks");
        self.plan.record_swap_in(&mut self.device, h, d);
        if let Some(cache) = self.device.cache_mut() {
            cache.register(d, hash, parent, tokens);
        }
        tracing::trace!(%h, %d, "prefix block copied up from the host tier");
        d
    }

    /// Plans the copies down of the step's evicted blocks and of the blocks to write
    /// through; see the module docs.
    pub(super) fn settle_host_tier(&mut self) {
        let evicted = self.device.take_evicted();
        let to_save = std::mem::take(&mut self.to_save);
        if !self.config.has_host_tier() {
            return;
        }
        let mut down = Vec::with_capacity(evicted.len() + to_save.len());
        for (d, name) in evicted {
            down.push((d, name.hash, name.parent, name.tokens));
        }
        if let Some(cache) = self.device.cache() {
            for (d, hash) in to_save {
                // Still named so (else evicted since, and listed above, or renamed later
                // on, which cannot happen before this step's forward pass).
                if let Some(name) = cache.name(d).filter(|n| n.hash == hash) {
                    down.push((d, hash, name.parent, name.tokens.clone()));
                }
            }
        }
        for (d, hash, parent, tokens) in down {
            if self.host.cache().is_some_and(|c| c.has_name(hash)) {
                continue;
            }
            let Some(h) = self.tier_block() else {
                break; // the host pool is full of swapped-out sequences
            };
            self.plan.record_swap_out(&mut self.host, d, h);
            if let Some(cache) = self.host.cache_mut() {
                cache.register(h, hash, parent, &tokens);
            }
            // The plan's hold is now its only reference: at the end of the step it leaves
            // the block evictable, named.
            self.host.release(h);
            self.counters.host_tier_saves += 1;
        }
    }

    /// A host block for the tier, count 1: past the budget the tier's least recently used
    /// block, else any available one.
    fn tier_block(&mut self) -> Option<HostBlockId> {
        let named = self.host.cache().map_or(0, |c| c.num_named());
        if named >= self.config.host_tier_blocks {
            self.host.evict()
        } else {
            self.host.allocate()
        }
    }

    /// Puts a block with this name into the host tier, for the caller to fill with its KV
    /// bytes at once (a disk tier's record, read between steps). Returns `None` (and
    /// changes nothing) without a host tier, if the name is already cached on the device or
    /// in the tier, or if no host block can be had. The block is evictable at once, the
    /// most recently used, so fill it before the next step.
    pub fn insert_host_tier(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<HostBlockId> {
        if !self.config.has_host_tier()
            || tokens.len() != self.config.block_size
            || self.device.cache().is_some_and(|c| c.has_name(hash))
            || self.host.cache().is_some_and(|c| c.has_name(hash))
        {
            return None;
        }
        let h = self.tier_block()?;
        self.host.cache_mut()?.register(h, hash, parent, tokens);
        self.host.release(h);
        Some(h)
    }

    /// Makes the host-tier block named `hash`, if any, the tier's most recently used, so
    /// that reads for other prompts evict it last.
    pub fn touch_host_tier(&mut self, hash: BlockHash) {
        if let Some(cache) = self.host.cache_mut() {
            cache.touch(hash);
        }
    }

    /// Whether the device pool holds a block named `hash`.
    pub fn has_device_name(&self, hash: BlockHash) -> bool {
        self.device.cache().is_some_and(|c| c.has_name(hash))
    }

    /// Whether the device pool or the host tier holds a block named `hash`.
    pub fn has_cached_name(&self, hash: BlockHash) -> bool {
        self.device.cache().is_some_and(|c| c.has_name(hash))
            || self.host.cache().is_some_and(|c| c.has_name(hash))
    }

    /// The name of host block `h` if it is in the host tier.
    pub fn host_tier_name(&self, h: HostBlockId) -> Option<TierName<'_>> {
        if !self.host.contains(h) {
            return None;
        }
        let name = self.host.cache()?.name(h)?;
        Some(TierName {
            hash: name.hash,
            parent: name.parent,
            tokens: &name.tokens,
        })
    }

    /// Leading full blocks of `prompt` (of those a prefix lookup considers: all but the
    /// last token) that the device pool or the host tier holds now.
    pub fn cached_prefix_blocks(&self, prompt: &[u32]) -> usize {
        self.cached_prefix_blocks_keyed(ExtraKeys::NONE, prompt)
    }

    /// [`Self::cached_prefix_blocks`] for a request with extra keys `keys`.
    pub fn cached_prefix_blocks_keyed(&self, keys: ExtraKeys, prompt: &[u32]) -> usize {
        if prompt.is_empty() {
            return 0;
        }
        (0..self.groups.len())
            .map(|g| {
                self.prefix_hits_in(self.groups.root(g, keys), prompt)
                    .0
                    .len()
            })
            .min()
            .unwrap_or(0)
    }

    /// Whether blocks are waiting to be written through to the host tier (see
    /// [`BlockManager::take_ops`]).
    pub fn has_tier_saves(&self) -> bool {
        self.config.has_host_tier() && !self.to_save.is_empty()
    }

    pub fn tier_stats(&self) -> TierStats {
        TierStats {
            budget: if self.config.has_host_tier() {
                self.config.host_tier_blocks
            } else {
                0
            },
            blocks: self.host.cache().map_or(0, |c| c.num_named()),
            hits: self.counters.host_tier_hits,
            saves: self.counters.host_tier_saves,
            evictions: self.host.evictions(),
        }
    }
}
