//! Pinned prefixes and forgotten ones: what an application says about its own prompts.
//!
//! A pin holds one reference to each cached device block of a prefix (a system prompt that
//! every request starts with), so the evictor never takes them however full the pool gets;
//! requests that start with the prefix hit it as usual. Pinned blocks are taken out of what
//! one request may ever be given (`group_capacity`), and a request is never counted for a
//! pinned block it hits, so a request that fits the pool less the pins is admitted, and one
//! that does not fails alone rather than waiting for blocks that never come free. At most
//! half the pool (less the watermark) may be pinned.
//!
//! Forgetting a prefix (a conversation the user deleted) drops the names of its blocks on
//! the device and in the host tier: unreferenced ones go back to the free list, ones still
//! in use lose their name and go to the free list when released.

use super::error::CacheError;
pub use super::holds::PinId;
use super::ids::DeviceBlockId;
use super::manager::BlockManager;
use super::prefix::{hash_block, BlockHash, ExtraKeys};

impl BlockManager {
    /// Pins the leading full blocks of `tokens` that are cached on the device (the whole
    /// prefix once it has been computed). Returns the pin and how many tokens it holds.
    pub fn pin_prefix(&mut self, tokens: &[u32]) -> Result<(PinId, usize), CacheError> {
        self.pin_prefix_keyed(ExtraKeys::NONE, tokens)
    }

    /// [`Self::pin_prefix`] for the blocks cached under extra keys `keys` (a cache salt).
    pub fn pin_prefix_keyed(
        &mut self,
        keys: ExtraKeys,
        tokens: &[u32],
    ) -> Result<(PinId, usize), CacheError> {
        let bs = self.config.block_size;
        // Each KV cache group's chain, cut to the fewest blocks any group has.
        let mut chains = Vec::new();
        if let Some(cache) = self.device.cache() {
            for g in 0..self.groups.len() {
                let mut chain = Vec::new();
                let mut parent = self.groups.root(g, keys);
                for chunk in tokens.chunks_exact(bs) {
                    let Some((block, hash)) = cache.lookup(parent, chunk) else {
                        break;
                    };
                    chain.push(block);
                    parent = Some(hash);
                }
                chains.push(chain);
            }
        }
        let common = chains.iter().map(Vec::len).min().unwrap_or(0);
        let blocks: Vec<DeviceBlockId> = chains
            .iter()
            .flat_map(|c| c[..common].iter().copied())
            .collect();
        if blocks.is_empty() {
            return Err(CacheError::NothingToPin);
        }
        let new = blocks
            .iter()
            .filter(|b| !self.pins.counts.contains_key(b))
            .count();
        let pinned = self.pins.counts.len() + new;
        let room = self.device.num_blocks() - self.config.watermark_blocks;
        if pinned > room / 2 {
            return Err(CacheError::PinTooLarge {
                pinned,
                left: room.saturating_sub(pinned),
            });
        }
        for &b in &blocks {
            self.device.retain(b);
            *self.pins.counts.entry(b).or_default() += 1;
        }
        let id = PinId(self.pins.next);
        self.pins.next += 1;
        let held = common * bs;
        self.pins.held.insert(id, blocks);
        Ok((id, held))
    }

    /// Lets go of a pin: its blocks become evictable (or stay in use by requests).
    pub fn unpin(&mut self, pin: PinId) -> Result<(), CacheError> {
        let blocks = self
            .pins
            .held
            .remove(&pin)
            .ok_or(CacheError::UnknownPin(pin.0))?;
        for b in blocks.into_iter().rev() {
            if let Some(n) = self.pins.counts.get_mut(&b) {
                *n -= 1;
                if *n == 0 {
                    self.pins.counts.remove(&b);
                }
            }
            self.device.release(b);
        }
        Ok(())
    }

    /// Distinct device blocks held by pins.
    pub fn num_pinned_blocks(&self) -> usize {
        self.pins.counts.len()
    }

    /// Pins holding `block`.
    pub(super) fn pin_refs(&self, block: DeviceBlockId) -> u32 {
        self.pins.counts.get(&block).copied().unwrap_or(0)
    }

    /// Forgets the cached blocks of every full block of `tokens` on the device and in the
    /// host tier, so no later prompt reuses them; returns how many names were dropped.
    /// Pins and requests keep the blocks they hold. The names of the chain are returned
    /// too, for a lower tier to drop (`hash`, `parent`): with KV cache groups one chain per
    /// group, back to back, each over the full blocks of `tokens`.
    pub fn forget_prefix(&mut self, tokens: &[u32]) -> Vec<(BlockHash, Option<BlockHash>)> {
        self.forget_prefix_keyed(ExtraKeys::NONE, tokens)
    }

    /// [`Self::forget_prefix`] for the blocks cached under extra keys `keys`.
    pub fn forget_prefix_keyed(
        &mut self,
        keys: ExtraKeys,
        tokens: &[u32],
    ) -> Vec<(BlockHash, Option<BlockHash>)> {
        let bs = self.config.block_size;
        let mut chain = Vec::new();
        for g in 0..self.groups.len() {
            let mut parent = self.groups.root(g, keys);
            for chunk in tokens.chunks_exact(bs) {
                let hash = hash_block(parent, chunk);
                chain.push((hash, parent));
                parent = Some(hash);
            }
        }
        for &(hash, _) in &chain {
            self.device.forget_name(hash);
            self.host.forget_name(hash);
        }
        chain
    }
}
