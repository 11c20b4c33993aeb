//! A pool of another size with the same blocks: a new grid of arenas of `n` blocks (same
//! layout, rotation, layer slots and arena cap), into which blocks `0..min(old, n)` of
//! every layer are copied on the GPU in runs that stay inside one shard of both pools, so
//! a resize is a few buffer copies per layer however many blocks move. The block manager
//! has made sure nothing lives at or above `n` when the pool shrinks; the old pool's
//! memory goes back to the device when the caller drops it.

use super::KvPool;
use crate::error::Result;
use crate::gpu::{Batch, GpuContext};

impl KvPool {
    /// This pool's first `num_blocks` blocks (all of them, then free ones, when it grows)
    /// in new buffers; waits for the copies.
    pub fn resized(&self, ctx: &GpuContext, num_blocks: usize) -> Result<KvPool> {
        let size = super::PoolSize::Blocks(num_blocks);
        let new = KvPool::with_arena_limit(ctx, self.layout, size, self.arena_limit)?
            .with_rotation(self.rotation)
            .with_layer_slots(self.layer_slots.clone())?;
        let kept = self.num_blocks.min(num_blocks);
        let runs = copy_runs(kept, self.blocks_per_shard, new.blocks_per_shard);
        let bb = self.layout.block_bytes();
        let mut batch = Batch::new(ctx, "kv pool resize");
        for layer in 0..self.layout.num_layers {
            for &(start, end) in &runs {
                let (src, sk, sv) = self.block_location(layer, start);
                let (dst, dk, dv) = new.block_location(layer, start);
                let bytes = (end - start) as u64 * bb;
                batch.copy(src, sk, dst, dk, bytes);
                batch.copy(src, sv, dst, dv, bytes);
            }
        }
        batch.submit()?;
        ctx.wait()?;
        Ok(new)
    }
}

/// Runs `[start, end)` covering blocks `0..kept`, each inside one shard of a pool of
/// `old_shard` blocks per shard and one of a pool of `new_shard`.
fn copy_runs(kept: usize, old_shard: usize, new_shard: usize) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < kept {
        let next = |per: usize| (start / per + 1) * per;
        let end = next(old_shard).min(next(new_shard)).min(kept);
        runs.push((start, end));
        start = end;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::copy_runs;

    #[test]
    fn runs_cover_the_kept_blocks_and_stay_inside_both_pools_shards() {
        assert_eq!(copy_runs(10, 16, 16), vec![(0, 10)]);
        assert_eq!(copy_runs(0, 4, 4), vec![]);
        assert_eq!(copy_runs(10, 4, 6), vec![(0, 4), (4, 6), (6, 8), (8, 10)]);
        for (kept, a, b) in [(37, 5, 7), (64, 8, 64), (9, 1, 3)] {
            let runs = copy_runs(kept, a, b);
            assert_eq!(runs.first().map(|r| r.0), Some(0));
            assert_eq!(runs.last().map(|r| r.1), Some(kept));
            for w in runs.windows(2) {
                assert_eq!(w[0].1, w[1].0);
            }
            for &(s, e) in &runs {
                assert!(
                    s < e && s / a == (e - 1) / a && s / b == (e - 1) / b,
                    "{s}..{e}"
                );
            }
        }
    }
}
