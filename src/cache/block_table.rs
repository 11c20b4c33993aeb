//! Per-sequence state: the block table (PagedAttention's page table, Kwon et al., SOSP
//! 2023, §4.2) mapping logical block `i` (tokens `i * block_size ..`) to a physical block,
//! plus what the manager needs to name blocks for the prefix cache. It counts a sequence's
//! slots and computed tokens; the token ids are the engine's, passed in where blocks are
//! named (`mark_computed`, `swap_in`), so there is one record of them.
//!
//! A sequence's blocks live either all on the device or all in the host swap pool; the enum
//! makes a half-swapped sequence unrepresentable.
//!
//! With sliding-window attention the leading blocks whose tokens every future query's
//! window has left are released ([`super::BlockManager::release_out_of_window`]): they
//! become holes. Holes only ever form a prefix of the table, so the table keeps the live
//! blocks and a count of the holes before them.

use super::ids::{DeviceBlockId, HostBlockId};
use super::prefix::BlockHash;

/// Where a sequence's KV blocks are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Device,
    Host,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Blocks {
    Device(Vec<DeviceBlockId>),
    Host(Vec<HostBlockId>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sequence {
    /// Tokens with a slot, computed or not; never 0. The tokens themselves belong to the
    /// caller (the engine's sequence); the manager is handed them where it names blocks.
    pub num_tokens: usize,
    /// The live blocks: entry `i` is logical block `released + i`; exactly
    /// `blocks_for(num_tokens) - released` entries.
    pub blocks: Blocks,
    /// Leading logical blocks released because no query can attend to them any more.
    pub released: usize,
    /// Names of the leading full blocks whose KV is computed, chained (prefix caching only):
    /// `hashes.len() == num_computed / block_size` when prefix caching is on, else empty.
    pub hashes: Vec<BlockHash>,
    /// The name the chain of `hashes` starts from: its KV cache group's root for the
    /// request's extra keys ([`super::KvGroups::root`]).
    pub root: Option<BlockHash>,
    /// Leading tokens whose KV is in the cache.
    pub num_computed: usize,
    /// Leading tokens found in the prefix cache when the sequence was allocated.
    pub num_cached: usize,
}

impl Sequence {
    pub fn location(&self) -> Location {
        match self.blocks {
            Blocks::Device(_) => Location::Device,
            Blocks::Host(_) => Location::Host,
        }
    }

    pub fn device_blocks(&self) -> Option<&[DeviceBlockId]> {
        match &self.blocks {
            Blocks::Device(t) => Some(t),
            Blocks::Host(_) => None,
        }
    }

    pub fn host_blocks(&self) -> Option<&[HostBlockId]> {
        match &self.blocks {
            Blocks::Host(t) => Some(t),
            Blocks::Device(_) => None,
        }
    }

    /// The parent name of logical block `i` (which must be named or next to be).
    pub fn parent(&self, i: usize) -> Option<BlockHash> {
        match i {
            0 => self.root,
            _ => Some(self.hashes[i - 1]),
        }
    }

    /// Live blocks (holes not counted).
    pub fn num_blocks(&self) -> usize {
        match &self.blocks {
            Blocks::Device(t) => t.len(),
            Blocks::Host(t) => t.len(),
        }
    }

    /// Index into the live table of logical block `i`, `None` for a hole.
    pub fn live_index(&self, i: usize) -> Option<usize> {
        i.checked_sub(self.released)
    }

    /// Slots filled in logical block `i` (fewer than a block only for the last one).
    pub fn block_len(&self, i: usize, block_size: usize) -> usize {
        let start = (i * block_size).min(self.num_tokens);
        ((i + 1) * block_size).min(self.num_tokens) - start
    }
}

/// Blocks needed to hold `num_tokens` tokens.
pub(crate) fn blocks_for(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.div_ceil(block_size)
}
