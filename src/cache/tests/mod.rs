//! Scenario tests of the block manager, one file per theme.

mod admission;
mod extra_keys;
mod group;
mod kv_groups;
mod pins;
mod prefix;
mod resize;
mod sharing;
mod speculation;
mod swap;
mod tier;
mod window;

use super::{BlockManager, CacheConfig, SeqId};

fn manager(block_size: usize, device: usize, host: usize) -> BlockManager {
    let config = CacheConfig::new(block_size, device, host).with_watermark_blocks(0);
    BlockManager::new(config).unwrap()
}

fn prefix_manager(block_size: usize, device: usize) -> BlockManager {
    let config = CacheConfig::new(block_size, device, 0)
        .with_watermark_blocks(0)
        .with_prefix_caching(true);
    BlockManager::new(config).unwrap()
}

/// Tokens `start, start + 1, ...`: distinct content per block.
fn tokens(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

const A: SeqId = SeqId(1);
const B: SeqId = SeqId(2);
const C: SeqId = SeqId(3);
const D: SeqId = SeqId(4);

/// Token ids for a manager without prefix caching, which reads only how many there are.
static FILLER: [u32; 256] = [0; 256];

/// `seqs` with [`FILLER`] tokens, for `swap_in` on a manager without prefix caching.
fn unnamed(seqs: &[SeqId]) -> Vec<(SeqId, &'static [u32])> {
    seqs.iter().map(|&s| (s, &FILLER[..])).collect()
}
