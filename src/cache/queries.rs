//! Read-only questions about sequences and pools: block tables and slots for the GPU side,
//! progress counters for the scheduler.

use super::block_table::Location;
use super::error::CacheError;
use super::groups::{group_of, kv_id};
use super::ids::{BlockId, DeviceBlockId, HostBlockId, SeqId};
use super::manager::BlockManager;

impl BlockManager {
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// All sequences with a block table, in id order (engine sequences: with several KV
    /// cache groups, one per sequence, not one per group).
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied().filter(|&id| group_of(id) == 0)
    }

    pub fn location(&self, seq: SeqId) -> Result<Location, CacheError> {
        Ok(self.seq(seq)?.location())
    }

    /// Tokens with a slot (prompt plus appended), computed or not.
    pub fn num_tokens(&self, seq: SeqId) -> Result<usize, CacheError> {
        Ok(self.seq(seq)?.num_tokens)
    }

    /// Leading tokens whose KV is in the cache (prefix-cache hits plus `mark_computed`):
    /// the one count of them, which the engine reads.
    pub fn num_computed_tokens(&self, seq: SeqId) -> Result<usize, CacheError> {
        Ok(self.seq(seq)?.num_computed)
    }

    /// Leading prompt tokens found in the prefix cache when `seq` was allocated (0 when
    /// prefix caching is off). Never the whole prompt.
    pub fn num_cached_tokens(&self, seq: SeqId) -> Result<usize, CacheError> {
        Ok(self.seq(seq)?.num_cached)
    }

    /// The live device blocks of `seq`: logical block `released + i` lives in physical
    /// block `[i]`, where `released` ([`Self::released_blocks`]) is 0 unless blocks left a
    /// sliding window.
    pub fn block_table(&self, seq: SeqId) -> Result<&[DeviceBlockId], CacheError> {
        self.seq(seq)?
            .device_blocks()
            .ok_or(CacheError::Swapped(seq))
    }

    /// Leading logical blocks of `seq` released by [`Self::release_out_of_window`] (holes).
    pub fn released_blocks(&self, seq: SeqId) -> Result<usize, CacheError> {
        Ok(self.seq(seq)?.released)
    }

    /// [`Self::block_table`] of `seq` in KV cache group `g` (group 0's is `block_table`).
    pub fn block_table_in(&self, seq: SeqId, g: usize) -> Result<&[DeviceBlockId], CacheError> {
        self.block_table(kv_id(seq, g))
    }

    /// [`Self::host_block_table`] of `seq` in KV cache group `g`.
    pub fn host_block_table_in(&self, seq: SeqId, g: usize) -> Result<&[HostBlockId], CacheError> {
        self.host_block_table(kv_id(seq, g))
    }

    /// [`Self::slot`] of `seq` in KV cache group `g`.
    pub fn slot_in(&self, seq: SeqId, g: usize, position: usize) -> Result<usize, CacheError> {
        self.slot(kv_id(seq, g), position)
    }

    /// [`Self::released_blocks`] of `seq` in KV cache group `g`.
    pub fn released_blocks_in(&self, seq: SeqId, g: usize) -> Result<usize, CacheError> {
        self.released_blocks(kv_id(seq, g))
    }

    /// The host block table of a swapped-out `seq` (live blocks, as [`Self::block_table`]).
    pub fn host_block_table(&self, seq: SeqId) -> Result<&[HostBlockId], CacheError> {
        self.seq(seq)?
            .host_blocks()
            .ok_or(CacheError::NotSwapped(seq))
    }

    /// The slot of token `position` of `seq`: `block * block_size + position % block_size`.
    pub fn slot(&self, seq: SeqId, position: usize) -> Result<usize, CacheError> {
        let s = self.seq(seq)?;
        let table = s.device_blocks().ok_or(CacheError::Swapped(seq))?;
        if position >= s.num_tokens {
            return Err(CacheError::TokenOutOfRange {
                seq,
                value: position,
                num_tokens: s.num_tokens,
            });
        }
        let bs = self.config.block_size;
        let block = s
            .live_index(position / bs)
            .ok_or(CacheError::TokenOutOfRange {
                seq,
                value: position,
                num_tokens: s.num_tokens,
            })?;
        Ok(table[block].index() * bs + position % bs)
    }

    /// Device blocks an allocation can get now: free plus cached-but-unreferenced.
    pub fn num_available_device_blocks(&self) -> usize {
        self.device.available()
    }

    /// Device blocks referenced by a block table or held by the pending plan (what
    /// `stats().device.used` reports, without walking the tables).
    pub fn num_used_device_blocks(&self) -> usize {
        self.device.num_blocks() - self.device.num_free() - self.device.num_evictable()
    }

    pub fn num_free_host_blocks(&self) -> usize {
        self.host.num_free()
    }

    /// Host blocks a swap-out can get now: free plus host-tier blocks not in use.
    pub fn num_available_host_blocks(&self) -> usize {
        self.host.available()
    }

    pub fn watermark_blocks(&self) -> usize {
        self.config.watermark_blocks
    }

    /// Block-table entries pointing at `block` (the plan's temporary hold not counted);
    /// `None` outside the pool.
    pub fn device_refcount(&self, block: DeviceBlockId) -> Option<u32> {
        self.device
            .allocator()
            .contains(block)
            .then(|| self.table_refs(block))
    }

    /// Block-table entries pointing at host `block` (the plan's hold not counted).
    pub fn host_refcount(&self, block: HostBlockId) -> Option<u32> {
        self.host
            .contains(block)
            .then(|| self.host.refcount(block) - self.plan.host_hold(block))
    }

    /// Whether device `block` is cached for prefix reuse (named).
    pub fn is_cached(&self, block: DeviceBlockId) -> bool {
        self.device.allocator().contains(block)
            && self.device.cache().is_some_and(|c| c.is_named(block))
    }
}
