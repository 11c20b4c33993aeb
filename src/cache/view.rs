//! The prefix cache as the engine's tiers see it: pins and forgotten prefixes an
//! application asks for, and the host tier's traffic with the disk tier (names looked up,
//! blocks read in, blocks written out). A narrow view of the [`BlockManager`], whose
//! sequence bookkeeping stays the scheduler's alone.

use super::{BlockHash, BlockManager, BlockOps, CacheError, HostBlockId, PinId, TierName};

/// A borrowed view of the block manager's prefix cache (see the module docs).
pub struct PrefixCache<'a> {
    blocks: &'a mut BlockManager,
}

impl<'a> PrefixCache<'a> {
    pub fn new(blocks: &'a mut BlockManager) -> Self {
        PrefixCache { blocks }
    }

    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
    }

    /// Pins the cached device blocks of `tokens` (see [`BlockManager::pin_prefix`]) and
    /// returns the pin with how many tokens it holds, unless the pins would then leave the
    /// pool unable to hold one sequence of `max_len` tokens: then nothing is pinned, and
    /// the pin is `None`.
    pub fn pin_prefix_within(
        &mut self,
        tokens: &[u32],
        max_len: usize,
    ) -> Result<(Option<PinId>, usize), CacheError> {
        let (pin, held) = self.blocks.pin_prefix(tokens)?;
        if self.blocks.group_capacity() < self.blocks.blocks_between(0, max_len) {
            self.blocks.unpin(pin)?;
            return Ok((None, held));
        }
        Ok((Some(pin), held))
    }

    pub fn unpin(&mut self, pin: PinId) -> Result<(), CacheError> {
        self.blocks.unpin(pin)
    }

    /// See [`BlockManager::forget_prefix`].
    pub fn forget_prefix(&mut self, tokens: &[u32]) -> Vec<(BlockHash, Option<BlockHash>)> {
        self.blocks.forget_prefix(tokens)
    }

    /// The copies that write newly named blocks through to the host tier, taken now
    /// rather than with the next step; `None` when there are none.
    pub fn take_tier_saves(&mut self) -> Option<BlockOps> {
        self.blocks.has_tier_saves().then(|| self.blocks.take_ops())
    }

    /// Blocks the host tier may hold.
    pub fn tier_budget(&self) -> usize {
        self.blocks.tier_stats().budget
    }

    pub fn has_device_name(&self, hash: BlockHash) -> bool {
        self.blocks.has_device_name(hash)
    }

    pub fn has_cached_name(&self, hash: BlockHash) -> bool {
        self.blocks.has_cached_name(hash)
    }

    pub fn touch_host_tier(&mut self, hash: BlockHash) {
        self.blocks.touch_host_tier(hash);
    }

    /// See [`BlockManager::insert_host_tier`].
    pub fn insert_host_tier(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<HostBlockId> {
        self.blocks.insert_host_tier(hash, parent, tokens)
    }

    pub fn host_tier_name(&self, h: HostBlockId) -> Option<TierName<'_>> {
        self.blocks.host_tier_name(h)
    }
}
