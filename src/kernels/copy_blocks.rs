//! Launcher for `shaders/copy_blocks.wgsl`: the copies that copy-on-write plans, for every
//! layer's K and V at once.

use super::{groups, params, COPY_BLOCKS};
use crate::error::{GpuError, Result};
use crate::gpu::Batch;
use crate::pool::KvPool;
use std::collections::HashSet;

params!(CopyBlocksParams for COPY_BLOCKS {
    num_pairs: u32,
    block_words: u32,
    slab_blocks: u32,
    num_slabs: u32,
});

/// Copies block `src` onto block `dst` for each `(src, dst)` in every layer, K and V.
///
/// Pairs whose blocks share a shard are copied by one compute dispatch per arena (so a pool
/// in one buffer takes exactly one dispatch); pairs crossing shards live in different
/// buffers and use buffer-to-buffer copies. Destinations must be distinct and must not also
/// be sources, so the result does not depend on execution order; one source may feed any
/// number of destinations.
pub fn copy_blocks(batch: &mut Batch, pool: &KvPool, pairs: &[(u32, u32)]) -> Result<()> {
    const K: &str = "copy_blocks";
    let sources: HashSet<u32> = pairs.iter().map(|p| p.0).collect();
    let mut dests = HashSet::new();
    for &(src, dst) in pairs {
        for b in [src, dst] {
            if b as usize >= pool.num_blocks {
                return Err(GpuError::invalid(
                    K,
                    format!("block {b} outside a pool of {} blocks", pool.num_blocks),
                ));
            }
        }
        if !dests.insert(dst) || sources.contains(&dst) {
            return Err(GpuError::invalid(
                K,
                format!("block {dst} is written twice or is both a source and a destination"),
            ));
        }
    }
    let l = pool.layout;
    let mut same_shard: Vec<Vec<[u32; 2]>> = vec![Vec::new(); pool.num_shards()];
    for &(src, dst) in pairs {
        let (s_shard, s_local) = pool.locate(src as usize);
        let (d_shard, d_local) = pool.locate(dst as usize);
        if s_shard == d_shard {
            same_shard[s_shard].push([s_local as u32, d_local as u32]);
        } else {
            for layer in 0..l.num_layers {
                let (sb, sk, sv) = pool.block_location(layer, src as usize);
                let (db, dk, dv) = pool.block_location(layer, dst as usize);
                batch.copy(sb, sk, db, dk, l.block_bytes());
                batch.copy(sb, sv, db, dv, l.block_bytes());
            }
        }
    }
    let block_words = (l.block_bytes() / 4) as usize;
    let max_dim = batch.ctx().limits.max_compute_workgroups_per_dimension as usize;
    for (shard, list) in same_shard.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let pairs_buf = batch.ctx().upload("copy_blocks pairs", list)?;
        for group in 0..pool.num_groups() {
            for chunk_start in (0..list.len()).step_by(max_dim) {
                let n = (list.len() - chunk_start).min(max_dim);
                let num_slabs = 2 * pool.group_layers(group).len();
                let p = CopyBlocksParams {
                    num_pairs: n as u32,
                    block_words: block_words as u32,
                    slab_blocks: pool.shard_range(shard).1 as u32,
                    num_slabs: num_slabs as u32,
                };
                let pairs_bind = crate::gpu::Bind::Range {
                    buffer: &pairs_buf,
                    offset: (chunk_start * 8) as u64,
                    size: (n * 8) as u64,
                };
                batch.dispatch(
                    COPY_BLOCKS,
                    &[],
                    &p,
                    &[pairs_bind, pool.arena(shard, group).into()],
                    [groups(block_words, 64), n as u32, num_slabs as u32],
                )?;
            }
        }
    }
    Ok(())
}
