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
        Ok(())
    }
}
