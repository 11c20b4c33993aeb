//! Sizes and switches of the block manager.

use super::error::CacheError;

/// How the KV cache is cut into blocks and how it is managed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the device pool.
    pub num_device_blocks: usize,
    /// Blocks in the host swap pool (0 disables swapping: `can_swap_out` always says no).
    pub num_host_blocks: usize,
    /// Device blocks that admitting a new sequence group (or swapping one in) must leave
    /// free, so that running sequences can still grow by a block each without an immediate
    /// preemption.
    pub watermark_blocks: usize,
    /// Reuse the computed full blocks of earlier prompts (see `prefix.rs`).
    pub enable_prefix_caching: bool,
    /// Most host blocks the host tier of the prefix cache may hold (0: no host tier). Named
    /// blocks the device pool evicts are copied there, and a later prompt that starts with
    /// them copies them back instead of recomputing. The tier lives in the host pool and
    /// yields to swapping: a swap-out evicts tier blocks when the pool has no free ones.
    pub host_tier_blocks: usize,
    /// Copy every block to the host tier as soon as it is named (computed and full), not
    /// only when the device evicts it, so that the engine can write it on to a disk tier
    /// while it is still fresh. Needs a host tier.
    pub tier_write_through: bool,
}

impl CacheConfig {
    /// A configuration with vLLM's default watermark (1% of the device pool) and prefix
    /// caching off.
    pub fn new(block_size: usize, num_device_blocks: usize, num_host_blocks: usize) -> Self {
        CacheConfig {
            block_size,
            num_device_blocks,
            num_host_blocks,
            watermark_blocks: num_device_blocks / 100,
            enable_prefix_caching: false,
            host_tier_blocks: 0,
            tier_write_through: false,
        }
    }

    pub fn with_watermark_blocks(mut self, blocks: usize) -> Self {
        self.watermark_blocks = blocks;
        self
    }

    pub fn with_prefix_caching(mut self, enable: bool) -> Self {
        self.enable_prefix_caching = enable;
        self
    }

    /// A host tier of at most `blocks` host blocks (see [`CacheConfig::host_tier_blocks`]).
    pub fn with_host_tier(mut self, blocks: usize) -> Self {
        self.host_tier_blocks = blocks;
        self
    }

    pub fn with_tier_write_through(mut self, on: bool) -> Self {
        self.tier_write_through = on;
        self
    }

    /// Whether named blocks go down to a host tier.
    pub fn has_host_tier(&self) -> bool {
        self.enable_prefix_caching && self.host_tier_blocks > 0 && self.num_host_blocks > 0
    }

    pub(crate) fn validate(&self) -> Result<(), CacheError> {
        let bad = |msg: String| Err(CacheError::InvalidConfig(msg));
        if self.block_size == 0 {
            return bad("block_size must be at least 1".into());
        }
        if self.num_device_blocks == 0 {
            return bad("the device pool needs at least one block".into());
        }
        // Block ids are u32 on the GPU side.
        for (what, n) in [
            ("device", self.num_device_blocks),
            ("host", self.num_host_blocks),
        ] {
            if u32::try_from(n).is_err() {
                return bad(format!("{n} {what} blocks do not fit 32-bit block ids"));
            }
        }
        if self
            .num_device_blocks
            .checked_mul(self.block_size)
            .is_none()
        {
            return bad("num_device_blocks * block_size overflows a slot index".into());
        }
        if self.watermark_blocks >= self.num_device_blocks {
            return bad(format!(
                "watermark of {} blocks leaves nothing of a {}-block device pool",
                self.watermark_blocks, self.num_device_blocks
            ));
        }
        if self.host_tier_blocks > self.num_host_blocks {
            return bad(format!(
                "a host tier of {} blocks does not fit a host pool of {}",
                self.host_tier_blocks, self.num_host_blocks
            ));
        }
        if self.tier_write_through && !self.has_host_tier() {
            return bad(
                "writing through to the host tier needs a host tier and prefix \
                        caching"
                    .into(),
            );
        }
        Ok(())
    }
}
