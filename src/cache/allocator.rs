//! A pool of fixed-size blocks with a free list and a reference count per block, the
//! physical-memory side of PagedAttention (Kwon et al., SOSP 2023, §4.2): a block is
//! shared by every block-table entry that points at it and returns to the pool only when
//! the last one lets go. Generic over the id type so that the device and the host pool are
//! the same code with ids that cannot be mixed up.
//!
//! The allocator only counts; what a count of zero means (free, or cached and evictable) is
//! decided by its owner, which is why `decr` does not push to the free list by itself.

use super::ids::BlockId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockAllocator<Id> {
    refcounts: Vec<u32>,
    /// Blocks with count 0 that hold nothing worth keeping. Popped from the end, so block 0
    /// goes first in a fresh pool.
    free: Vec<Id>,
}

impl<Id: BlockId> BlockAllocator<Id> {
    /// A pool of `num_blocks` free blocks. The caller has checked that the ids fit `u32`.
    pub fn new(num_blocks: u32) -> Self {
        BlockAllocator {
            refcounts: vec![0; num_blocks as usize],
            free: (0..num_blocks).rev().map(Id::from_index).collect(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.refcounts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn contains(&self, id: Id) -> bool {
        id.index() < self.refcounts.len()
    }

    pub fn refcount(&self, id: Id) -> u32 {
        self.refcounts[id.index()]
    }

    /// Grows or shrinks the pool to `num_blocks`. New blocks are free (and handed out after
    /// the blocks already free); blocks cut off must be free (count 0, on the free list),
    /// else nothing changes and the first one in use is returned.
    pub fn resize(&mut self, num_blocks: usize) -> Result<(), Id> {
        let old = self.refcounts.len();
        if num_blocks < old {
            if let Some(i) = (num_blocks..old).find(|&i| self.refcounts[i] > 0) {
                return Err(Id::from_index(i as u32));
            }
            self.free.retain(|id| id.index() < num_blocks);
        } else {
            let new = (old..num_blocks).rev().map(|i| Id::from_index(i as u32));
            self.free.splice(0..0, new);
        }
        self.refcounts.resize(num_blocks, 0);
        Ok(())
    }

    /// Takes a block off the free list with a count of 1.
    pub fn pop_free(&mut self) -> Option<Id> {
        let id = self.free.pop()?;
        debug_assert_eq!(
            self.refcounts[id.index()],
            0,
            "{id} on the free list in use"
        );
        self.refcounts[id.index()] = 1;
        Some(id)
    }

    /// One more reference. Also revives a count-0 block that is not on the free list (an
    /// evictable cached block).
    pub fn incr(&mut self, id: Id) {
        self.refcounts[id.index()] += 1;
    }

    /// One reference fewer; returns the remaining count.
    pub fn decr(&mut self, id: Id) -> u32 {
        let count = &mut self.refcounts[id.index()];
        debug_assert!(*count > 0, "{id} released more often than taken");
        *count = count.saturating_sub(1);
        *count
    }

    /// Returns a count-0 block to the free list.
    pub fn push_free(&mut self, id: Id) {
        debug_assert_eq!(self.refcounts[id.index()], 0, "{id} freed while in use");
        self.free.push(id);
    }

    /// The pool's own consistency: free-list entries are in range, distinct and unreferenced.
    /// Returns, per block, whether it is on the free list.
    pub fn check(&self, pool: &str) -> Result<Vec<bool>, String> {
        let mut on_free_list = vec![false; self.refcounts.len()];
        for &id in &self.free {
            if !self.contains(id) {
                return Err(format!("{pool}: free list holds {id}, outside the pool"));
            }
            if std::mem::replace(&mut on_free_list[id.index()], true) {
                return Err(format!("{pool}: {id} is on the free list twice"));
            }
            if self.refcount(id) != 0 {
                return Err(format!(
                    "{pool}: {id} is on the free list with count {}",
                    self.refcount(id)
                ));
            }
        }
        Ok(on_free_list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ids::HostBlockId;

    #[test]
    fn counts_and_free_list() {
        let mut a = BlockAllocator::<HostBlockId>::new(2);
        let b0 = a.pop_free().unwrap();
        assert_eq!(b0, HostBlockId(0));
        a.incr(b0);
        assert_eq!(a.decr(b0), 1);
        assert_eq!((a.refcount(b0), a.num_free()), (1, 1));
        assert_eq!(a.decr(b0), 0);
        a.push_free(b0);
        assert_eq!((a.refcount(b0), a.num_free()), (0, 2));
        assert!(a.check("host").is_ok());
        assert!(a.pop_free().is_some() && a.pop_free().is_some() && a.pop_free().is_none());
    }
}
