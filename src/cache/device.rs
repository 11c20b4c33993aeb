//! The device block pool: a reference-counted allocator plus, when prefix caching is on,
//! the cache of named blocks. Every device block is in exactly one of three states:
//!
//! - free: count 0, on the free list, unnamed;
//! - evictable: count 0, named, waiting in the prefix cache's LRU evictor with its content
//!   intact (not on the free list, but reclaimable, so it counts as available);
//! - in use: count > 0, named or not, on neither list.
//!
//! Allocation prefers the free list and evicts only when it is empty, so cached content
//! lives as long as memory allows.

use super::allocator::BlockAllocator;
use super::ids::DeviceBlockId;
use super::prefix::PrefixCache;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DevicePool {
    alloc: BlockAllocator<DeviceBlockId>,
    cache: Option<PrefixCache>,
    evictions: u64,
}

impl DevicePool {
    pub fn new(num_blocks: u32, prefix_caching: bool) -> Self {
        DevicePool {
            alloc: BlockAllocator::new(num_blocks),
            cache: prefix_caching.then(|| PrefixCache::new(num_blocks as usize)),
            evictions: 0,
        }
    }

    pub fn allocator(&self) -> &BlockAllocator<DeviceBlockId> {
        &self.alloc
    }

    pub fn cache(&self) -> Option<&PrefixCache> {
        self.cache.as_ref()
    }

    pub fn cache_mut(&mut self) -> Option<&mut PrefixCache> {
        self.cache.as_mut()
    }

    pub fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    pub fn num_free(&self) -> usize {
        self.alloc.num_free()
    }

    pub fn num_evictable(&self) -> usize {
        self.cache.as_ref().map_or(0, PrefixCache::num_evictable)
    }

    /// Blocks an allocation can get: free plus evictable.
    pub fn available(&self) -> usize {
        self.num_free() + self.num_evictable()
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    pub fn refcount(&self, block: DeviceBlockId) -> u32 {
        self.alloc.refcount(block)
    }

    /// A block for new data, with count 1: a free one, else the least recently released
    /// cached one (its name is forgotten).
    pub fn allocate(&mut self) -> Option<DeviceBlockId> {
        if let Some(block) = self.alloc.pop_free() {
            return Some(block);
        }
        let block = self.cache.as_mut()?.evict_lru()?;
        self.evictions += 1;
        tracing::trace!(%block, "evicted cached KV block");
        self.alloc.incr(block);
        Some(block)
    }

    /// One more reference to a block that is in use or evictable (a prefix hit).
    pub fn retain(&mut self, block: DeviceBlockId) {
        if self.alloc.refcount(block) == 0 {
            if let Some(cache) = self.cache.as_mut() {
                cache.reclaim(block);
            }
        }
        self.alloc.incr(block);
    }

    /// One reference fewer; at zero a named block becomes evictable, any other block free.
    pub fn release(&mut self, block: DeviceBlockId) {
        if self.alloc.decr(block) > 0 {
            return;
        }
        match self.cache.as_mut() {
            Some(cache) if cache.is_named(block) => cache.make_evictable(block),
            _ => self.alloc.push_free(block),
        }
    }
}
