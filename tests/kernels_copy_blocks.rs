//! copy_blocks and the pool's layout: after filling every slot of every layer with distinct
//! values, a copy list (one source feeding two destinations, pairs inside one buffer and
//! across buffers) must leave each destination equal to its source in every layer's K and
//! V, and every other block untouched. Checked against a host model of the pool's bytes.

mod common;
use common::*;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::copy_blocks::copy_blocks;
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, PoolSize};

fn check_copies(ctx: &pagellm::GpuContext, pool: &KvPool, pairs: &[(u32, u32)]) {
    let before: Vec<Vec<u8>> = (0..pool.num_blocks)
        .map(|i| pool.read_block(ctx, i).unwrap())
        .collect();
    let mut want = before.clone();
    for &(s, d) in pairs {
        want[d as usize] = before[s as usize].clone();
    }
    let mut b = Batch::new(ctx, "copy");
    copy_blocks(&mut b, pool, pairs).unwrap();
    let dispatches = b.dispatch_count();
    b.submit().unwrap();
    for (i, want_i) in want.iter().enumerate() {
        let got = pool.read_block(ctx, i).unwrap();
        assert!(
            &got == want_i,
            "block {i} differs after copying {pairs:?} ({} shards, {} dispatches) on {}",
            pool.num_shards(),
            dispatches,
            backend(ctx)
        );
    }
    // Distinct contents before the copy, so an equality above is not a coincidence.
    assert_ne!(before[pairs[0].0 as usize], before[pairs[0].1 as usize]);
}

#[test]
fn one_buffer_pool_copies_every_layer_in_one_dispatch() {
    for ctx in contexts() {
        for dtype in KvDtype::ALL {
            let layout = KvLayout {
                num_layers: 3,
                num_kv_heads: 2,
                head_dim: 64,
                block_size: 8,
                dtype,
            };
            let pool = filled_pool(ctx, layout, 12, None, 0);
            assert_eq!((pool.num_shards(), pool.num_groups()), (1, 1));
            let pairs = [(2, 9), (2, 4), (7, 0), (11, 10)];
            let mut b = Batch::new(ctx, "count");
            copy_blocks(&mut b, &pool, &pairs).unwrap();
            assert_eq!(
                b.dispatch_count(),
                1,
                "all layers, K and V, in one dispatch"
            );
            drop(b);
            check_copies(ctx, &pool, &pairs);
        }
    }
}

#[test]
fn sharded_pool_copies_within_and_across_buffers() {
    for ctx in contexts() {
        let layout = KvLayout {
            num_layers: 4,
            num_kv_heads: 1,
            head_dim: 64,
            block_size: 16,
            dtype: KvDtype::F16,
        };
        // 2 KiB per block per layer for K, the same for V. A 24 KiB cap gives slabs of 6
        // blocks, one layer per buffer: 14 blocks make 3 shards x 4 layer buffers.
        let pool = filled_pool(ctx, layout, 14, Some(24 * 1024), 0);
        assert_eq!((pool.num_shards(), pool.num_groups()), (3, 4));
        // 1 -> 2 share a shard; 1 -> 13 crosses shards; 12 -> 0 crosses; 5 -> 3 shares.
        check_copies(ctx, &pool, &[(1, 2), (1, 13), (12, 0), (5, 3)]);
        // Unsharded but two layers per buffer: 14 blocks x 4 KiB = 56 KiB per layer slab.
        let pool = filled_pool(ctx, layout, 14, Some(2 * 56 * 1024), 0);
        assert_eq!((pool.num_shards(), pool.num_groups()), (1, 2));
        check_copies(ctx, &pool, &[(0, 13), (6, 7)]);
    }
}

#[test]
fn invalid_copy_lists_are_rejected() {
    for ctx in contexts() {
        let layout = KvLayout {
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 64,
            block_size: 8,
            dtype: KvDtype::F16,
        };
        let pool = KvPool::new(ctx, layout, PoolSize::Blocks(4)).unwrap();
        let mut b = Batch::new(ctx, "bad");
        for pairs in [&[(0u32, 4u32)][..], &[(0, 1), (2, 1)], &[(0, 1), (1, 2)]] {
            let e = copy_blocks(&mut b, &pool, pairs).unwrap_err().to_string();
            assert!(e.contains("copy_blocks"), "{e}");
        }
    }
}

#[test]
fn pool_sized_from_a_byte_budget() {
    for ctx in contexts() {
        let layout = KvLayout {
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 128,
            block_size: 16,
            dtype: KvDtype::F16,
        };
        // One block costs 2 layers x (K + V) x 2 heads x 16 x 128 x 2 bytes = 32 KiB.
        assert_eq!(layout.block_bytes_all_layers(), 32 * 1024);
        let pool = KvPool::new(ctx, layout, PoolSize::Bytes(10 * 32 * 1024 + 100)).unwrap();
        assert_eq!(pool.num_blocks, 10);
        assert_eq!(pool.total_bytes(), 10 * 32 * 1024);
        let e = KvPool::new(ctx, layout, PoolSize::Bytes(1000))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one KV block"), "{e}");
    }
}
