//! CPU-side bookkeeping of the paged KV cache: which physical block holds which tokens.
//!
//! This is the virtual-memory half of PagedAttention (Kwon et al., "Efficient Memory
//! Management for Large Language Model Serving with PagedAttention", SOSP 2023): KV blocks
//! are reference counted, each sequence maps its logical blocks to physical ones through a
//! block table, sequences share blocks after a fork or a prefix-cache hit and copy a shared
//! block on their first write into it, and whole sequence groups move to host memory and
//! back when the scheduler preempts them.
//!
//! Nothing here touches the GPU: [`BlockManager`] decides, and hands the cache engine a
//! plan per step ([`BlockOps`]: copies, swap-outs, swap-ins) to execute before the forward
//! pass. The files, bottom up: `ids` (typed ids), `allocator` (ref-counted free list),
//! `prefix` (content names and the LRU evictor), `device` (the device pool: allocator plus
//! prefix cache), `block_table` (per-sequence state), `ops` and `plan` (the step's plan and
//! what keeps it valid), `manager` (allocate, append, fork, free), `group` (a sequence
//! group as a whole), `groups` (KV cache groups: a block table per group of layers), `swap`, `tier` (the host tier of the prefix cache), `pins` (pinned and forgotten
//! prefixes), `view` (the prefix cache as the engine's tiers see it), `queries`, `stats`,
//! `invariants`.

mod allocator;
mod block_table;
mod config;
mod device;
mod error;
mod group;
mod groups;
mod holds;
mod ids;
mod invariants;
mod manager;
mod ops;
mod pins;
mod plan;
mod prefix;
mod queries;
mod resize;
mod stats;
mod swap;
mod tier;
mod view;

#[cfg(test)]
mod tests;

pub use block_table::Location;
pub use config::CacheConfig;
pub use error::CacheError;
pub use groups::{KvGroups, LayerGroups, MAX_GROUPED_SEQ_ID};
pub use ids::{DeviceBlockId, HostBlockId, SeqId};
pub use manager::{AllocStatus, AppendOutcome, BlockManager};
pub use ops::BlockOps;
pub use pins::PinId;
pub use prefix::{hash_block, BlockHash, ExtraKeys};
pub use stats::{CacheStats, PoolStats};
pub use tier::{TierName, TierStats};
pub use view::PrefixCache;
