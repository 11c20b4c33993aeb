//! A block pool with an optional cache of named blocks: a reference-counted allocator plus,
//! when prefix caching is on, the names of computed blocks. The device pool is one; the host
//! pool is the other, where the named blocks form the host tier of the prefix cache (blocks
//! the device evicted, kept in host memory until the host needs the room). Every block is
//! in exactly one of three states:
//!
//! - free: count 0, on the free list, unnamed;
//! - evictable: count 0, named, waiting in the prefix cache's LRU evictor with its content
//!   intact (not on the free list, but reclaimable, so it counts as available);
//! - in use: count > 0, named or not, on neither list.
//!
//! Allocation prefers the free list and evicts only when it is empty, so cached content
//! lives as long as memory allows. An evicted block's name is forgotten here; the device
//! pool can keep the (block, name) pairs it evicted during a step, so that the block manager
//! copies their content to the host tier before the step overwrites it.

use super::allocator::BlockAllocator;
use super::ids::{BlockId, DeviceBlockId, HostBlockId};
use super::prefix::{NamedBlock, PrefixCache};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CachedPool<Id> {
    alloc: BlockAllocator<Id>,
    cache: Option<PrefixCache<Id>>,
    evictions: u64,
    /// Blocks evicted since the last `take_evicted`, with their names (kept only when
    /// `keep_evicted`).
    evicted: Vec<(Id, NamedBlock)>,
    keep_evicted: bool,
}

/// The device pool.
pub(crate) type DevicePool = CachedPool<DeviceBlockId>;
/// The host pool: swapped-out sequences, and the host tier of the prefix cache.
pub(crate) type HostPool = CachedPool<HostBlockId>;

impl<Id: BlockId> CachedPool<Id> {
    pub fn new(num_blocks: u32, prefix_caching: bool) -> Self {
        CachedPool {
            alloc: BlockAllocator::new(num_blocks),
            cache: prefix_caching.then(|| PrefixCache::new(num_blocks as usize)),
            evictions: 0,
            evicted: Vec::new(),
            keep_evicted: false,
        }
    }

    /// Remember what is evicted, for a lower tier (see `take_evicted`).
    pub fn keep_evicted(mut self, keep: bool) -> Self {
        self.keep_evicted = keep && self.cache.is_some();
        self
    }

    pub fn allocator(&self) -> &BlockAllocator<Id> {
        &self.alloc
    }

    pub fn cache(&self) -> Option<&PrefixCache<Id>> {
        self.cache.as_ref()
    }

    pub fn cache_mut(&mut self) -> Option<&mut PrefixCache<Id>> {
        self.cache.as_mut()
    }

    pub fn num_blocks(&self) -> usize {
        self.alloc.num_blocks()
    }

    pub fn contains(&self, block: Id) -> bool {
        self.alloc.contains(block)
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

    pub fn refcount(&self, block: Id) -> u32 {
        self.alloc.refcount(block)
    }

    /// A block for new data, with count 1: a free one, else the least recently released
    /// cached one (its name is forgotten).
    pub fn allocate(&mut self) -> Option<Id> {
        if let Some(block) = self.alloc.pop_free() {
            return Some(block);
        }
        self.evict()
    }

    /// The least recently released cached block for new data, with count 1, even when free
    /// blocks exist (a tier at its budget makes room within itself).
    pub fn evict(&mut self) -> Option<Id> {
        let (block, name) = self.cache.as_mut()?.evict_lru()?;
        self.evictions += 1;
        tracing::trace!(%block, "evicted cached KV block");
        if self.keep_evicted {
            self.evicted.push((block, name));
        }
        self.alloc.incr(block);
        Some(block)
    }

    /// The (block, name) pairs evicted since the last call, oldest first.
    pub fn take_evicted(&mut self) -> Vec<(Id, NamedBlock)> {
        std::mem::take(&mut self.evicted)
    }

    /// Forgets every cached name: evictable blocks go back to the free list, blocks in use
    /// stay in use, unnamed. Also forgets what was evicted.
    pub fn forget_names(&mut self) {
        self.evicted.clear();
        if let Some(cache) = self.cache.as_mut() {
            for block in cache.clear() {
                self.alloc.push_free(block);
            }
        }
    }

    /// Forgets the name `hash` if a block here has it: an evictable block goes back to the
    /// free list, one in use stays in use, unnamed.
    pub fn forget_name(&mut self, hash: super::prefix::BlockHash) {
        if let Some((block, true)) = self.cache.as_mut().and_then(|c| c.forget(hash)) {
            self.alloc.push_free(block);
        }
    }

    /// Grows or shrinks the pool to `num_blocks`: blocks cut off must be free (a cached
    /// one's name is forgotten first), else nothing changes and the first one still in use
    /// is returned.
    pub fn resize(&mut self, num_blocks: usize) -> Result<(), Id> {
        for i in num_blocks..self.alloc.num_blocks() {
            let block = Id::from_index(i as u32);
            if self.alloc.refcount(block) > 0 {
                return Err(block);
            }
            self.forget_block_name(block);
        }
        self.alloc.resize(num_blocks)?;
        if let Some(cache) = self.cache.as_mut() {
            cache.resize(num_blocks);
        }
        Ok(())
    }

    /// Evicts `block` if it is cached and unreferenced: it goes back to the free list, and
    /// its name to the evicted list (for the host tier to copy it down). Returns whether
    /// it was evicted.
    pub fn evict_block(&mut self, block: Id) -> bool {
        if self.alloc.refcount(block) > 0 {
            return false;
        }
        let Some(cache) = self.cache.as_mut() else {
            return false;
        };
        let Some(name) = cache.name(block).cloned() else {
            return false;
        };
        if !matches!(cache.forget(name.hash), Some((_, true))) {
            return false;
        }
        self.alloc.push_free(block);
        self.evictions += 1;
        if self.keep_evicted {
            self.evicted.push((block, name));
        }
        true
    }

    /// Forgets `block`'s name, if it has one (see [`Self::forget_name`]).
    pub fn forget_block_name(&mut self, block: Id) {
        if let Some(hash) = self.cache.as_ref().and_then(|c| c.name_of(block)) {
            self.forget_name(hash);
        }
    }

    /// One more reference to a block that is in use or evictable (a prefix hit).
    pub fn retain(&mut self, block: Id) {
        if self.alloc.refcount(block) == 0 {
            if let Some(cache) = self.cache.as_mut() {
                cache.reclaim(block);
            }
        }
        self.alloc.incr(block);
    }

    /// One reference fewer; at zero a named block becomes evictable, any other block free.
    pub fn release(&mut self, block: Id) {
        if self.alloc.decr(block) > 0 {
            return;
        }
        match self.cache.as_mut() {
            Some(cache) if cache.is_named(block) => cache.make_evictable(block),
            _ => self.alloc.push_free(block),
        }
    }
}
