//! The cache engine on the GPU: swapped-out blocks reach host memory byte for byte and come
//! back byte for byte (to other device blocks), also when the pool spans several buffers and
//! when a block freed by a swap-out is refilled by a swap-in of the same step; copy-on-write
//! copies leave both blocks identical in every layer.

mod common;
use common::*;
use pagellm::internals::cache::{BlockOps, DeviceBlockId as D, HostBlockId as H};
use pagellm::internals::cache_engine::CacheEngine;
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool};

fn layout(dtype: KvDtype) -> KvLayout {
    KvLayout {
        num_layers: 3,
        num_kv_heads: 2,
        head_dim: 64,
        block_size: 8,
        dtype,
    }
}

fn snapshot(ctx: &pagellm::GpuContext, pool: &KvPool) -> Vec<Vec<u8>> {
    (0..pool.num_blocks)
        .map(|b| pool.read_block(ctx, b).unwrap())
        .collect()
}

fn swap_round_trip(ctx: &pagellm::GpuContext, pool: KvPool) {
    let before = snapshot(ctx, &pool);
    let mut engine = CacheEngine::new(pool, 6);
    // Out: device 1, 4, 9 -> host 5, 0, 2.
    let out = BlockOps {
        swap_out: vec![(D(1), H(5)), (D(4), H(0)), (D(9), H(2))],
        ..Default::default()
    };
    engine.execute(ctx, &out).unwrap();
    for &(D(d), H(h)) in &out.swap_out {
        assert!(
            engine.host.block(h as usize).unwrap() == before[d as usize],
            "host block {h} != device block {d} on {}",
            backend(ctx)
        );
    }
    // Overwrite the whole device pool, then bring the blocks back to other device blocks.
    let l = engine.device.layout;
    let refill = filled_pool(ctx, l, engine.device.num_blocks, None, 333);
    engine.device = refill;
    let fresh = snapshot(ctx, &engine.device);
    assert_ne!(fresh[0], before[4], "refill must change the data");
    let back = BlockOps {
        swap_in: vec![(H(5), D(7)), (H(0), D(0)), (H(2), D(11))],
        ..Default::default()
    };
    engine.execute(ctx, &back).unwrap();
    let after = snapshot(ctx, &engine.device);
    for (&(H(h), D(d)), &(D(orig), _)) in back.swap_in.iter().zip(&out.swap_out) {
        assert!(
            after[d as usize] == before[orig as usize],
            "device block {d} (from host {h}) != original block {orig} on {}",
            backend(ctx)
        );
    }
    for b in [1, 2, 3, 4, 5, 6, 8, 9, 10] {
        assert!(after[b] == fresh[b], "untouched block {b} changed");
    }
}

#[test]
fn swap_out_and_in_preserves_every_byte() {
    for ctx in contexts() {
        for dtype in KvDtype::ALL {
            swap_round_trip(ctx, filled_pool(ctx, layout(dtype), 12, None, 0));
        }
    }
}

#[test]
fn swap_round_trip_on_a_pool_split_over_buffers() {
    for ctx in contexts() {
        // 2 KiB per block per layer (K): a 16 KiB cap makes slabs of 4 blocks.
        let pool = filled_pool(ctx, layout(KvDtype::F16), 12, Some(16 * 1024), 0);
        assert!(pool.num_shards() == 3, "{}", pool.num_shards());
        swap_round_trip(ctx, pool);
    }
}

#[test]
fn one_step_swaps_out_a_block_and_refills_it() {
    for ctx in contexts() {
        let pool = filled_pool(ctx, layout(KvDtype::F16), 8, None, 0);
        let before = snapshot(ctx, &pool);
        let mut engine = CacheEngine::new(pool, 4);
        engine
            .execute(
                ctx,
                &BlockOps {
                    swap_out: vec![(D(3), H(1))],
                    ..Default::default()
                },
            )
            .unwrap();
        // Next step, all at once: device block 6 goes out to host 2, host 1 (block 3's old
        // data) comes back into that same block 6, and block 5 is copied onto block 3.
        let ops = BlockOps {
            swap_out: vec![(D(6), H(2))],
            swap_in: vec![(H(1), D(6))],
            copies: vec![(D(5), D(3))],
        };
        engine.execute(ctx, &ops).unwrap();
        let after = snapshot(ctx, &engine.device);
        assert!(
            engine.host.block(2).unwrap() == before[6],
            "swap-out read before the swap-in wrote"
        );
        assert!(after[6] == before[3], "swap-in landed");
        assert!(
            after[3] == before[5] && after[5] == before[5],
            "copy-on-write copy is identical"
        );
    }
}

#[test]
fn out_of_range_ids_are_rejected() {
    for ctx in contexts() {
        let pool = filled_pool(ctx, layout(KvDtype::F16), 4, None, 0);
        let mut engine = CacheEngine::new(pool, 2);
        let e = engine
            .execute(
                ctx,
                &BlockOps {
                    swap_out: vec![(D(0), H(2))],
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("host block 2"), "{e}");
    }
}
