//! Usage statistics of the KV cache, computed on demand from the manager's state (pool
//! occupancy, how full the used blocks are) and from running counters (copies, swaps,
//! prefix-cache hits). Utilization is PagedAttention's measure of internal fragmentation
//! (Kwon et al., SOSP 2023, §6): with paging, only the last block of each sequence can be
//! partly empty.

use super::block_table::Blocks;
use super::ids::BlockId;
use super::manager::BlockManager;

/// Occupancy of one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Referenced by a block table (or held by the pending plan).
    pub used: usize,
    /// On the free list.
    pub free: usize,
    /// Unreferenced but cached for prefix reuse: evictable, so available like free ones.
    pub cached: usize,
}

/// What the block manager holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Tokens per block.
    pub block_size: usize,
    /// The device pool.
    pub device: PoolStats,
    /// The host pool (swapped blocks and the host tier).
    pub host: PoolStats,
    /// Sequences whose blocks are on the device.
    pub device_sequences: usize,
    /// Sequences whose blocks are in host memory.
    pub swapped_sequences: usize,
    /// Tokens held in used device blocks, a shared block counted once.
    pub stored_tokens: usize,
    /// Tokens of device sequences, shared ones counted once per sequence.
    pub logical_tokens: usize,
    /// Blocks copied because a sequence wrote into a block it shared.
    pub cow_copies: u64,
    /// Blocks moved to host memory by preemption.
    pub swapped_out_blocks: u64,
    /// Blocks brought back from host memory.
    pub swapped_in_blocks: u64,
    /// Prompt blocks found in the prefix cache (with KV cache groups, once per position
    /// of a prompt, found in every group).
    pub prefix_hits: u64,
    /// Prompt blocks looked up and not found (counted as `prefix_hits`).
    pub prefix_misses: u64,
    /// Cached blocks reclaimed for new data.
    pub evictions: u64,
    /// Block-table entries released because their tokens left the sliding window (in
    /// every windowed KV cache group).
    pub window_released_blocks: u64,
    /// The host tier of the prefix cache.
    pub host_tier: super::tier::TierStats,
    /// Device blocks held by pinned prefixes.
    pub pinned_blocks: usize,
}

impl CacheStats {
    /// Stored tokens over the slots of used device blocks (1.0 when nothing is used).
    pub fn utilization(&self) -> f64 {
        let slots = self.device.used * self.block_size;
        if slots == 0 {
            1.0
        } else {
            self.stored_tokens as f64 / slots as f64
        }
    }

    /// Prefix-cache hits over lookups (0.0 before any lookup).
    pub fn prefix_hit_rate(&self) -> f64 {
        let lookups = self.prefix_hits + self.prefix_misses;
        if lookups == 0 {
            0.0
        } else {
            self.prefix_hits as f64 / lookups as f64
        }
    }
}

impl BlockManager {
    /// The statistics as they are now (this walks every block table).
    pub fn stats(&self) -> CacheStats {
        let bs = self.config.block_size;
        let mut filled = vec![0usize; self.device.num_blocks()];
        let (mut device_sequences, mut swapped_sequences, mut logical_tokens) = (0, 0, 0);
        for (&id, s) in &self.seqs {
            // Sequences and their tokens are counted once, in KV cache group 0.
            let first = super::groups::group_of(id) == 0;
            match &s.blocks {
                Blocks::Device(table) => {
                    device_sequences += first as usize;
                    logical_tokens += if first { s.num_tokens } else { 0 };
                    for (j, b) in table.iter().enumerate() {
                        let f = &mut filled[b.index()];
                        *f = (*f).max(s.block_len(s.released + j, bs));
                    }
                }
                Blocks::Host(_) => swapped_sequences += first as usize,
            }
        }
        let (dev_total, dev_free, dev_cached) = (
            self.device.num_blocks(),
            self.device.num_free(),
            self.device.num_evictable(),
        );
        let (host_total, host_free, host_cached) = (
            self.host.num_blocks(),
            self.host.num_free(),
            self.host.num_evictable(),
        );
        let c = &self.counters;
        CacheStats {
            block_size: bs,
            device: PoolStats {
                total: dev_total,
                used: dev_total - dev_free - dev_cached,
                free: dev_free,
                cached: dev_cached,
            },
            host: PoolStats {
                total: host_total,
                used: host_total - host_free - host_cached,
                free: host_free,
                cached: host_cached,
            },
            device_sequences,
            swapped_sequences,
            stored_tokens: filled.iter().sum(),
            logical_tokens,
            cow_copies: c.cow_copies,
            swapped_out_blocks: c.swapped_out_blocks,
            swapped_in_blocks: c.swapped_in_blocks,
            prefix_hits: c.prefix_hits,
            prefix_misses: c.prefix_misses,
            evictions: self.device.evictions(),
            window_released_blocks: c.window_released_blocks,
            host_tier: self.tier_stats(),
            pinned_blocks: self.num_pinned_blocks(),
        }
    }
}
