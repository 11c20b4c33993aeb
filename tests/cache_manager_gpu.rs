//! The block manager's plans carried out by the cache engine on the GPU: a copy-on-write
//! after a fork leaves the two blocks identical in every layer's K and V, and beams that share
//! blocks survive swap-out plus swap-in byte for byte, still sharing.

mod common;
use common::*;
use pagellm::internals::cache::{BlockManager, CacheConfig, SeqId};
use pagellm::internals::cache_engine::CacheEngine;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::reshape_and_cache::reshape_and_cache;
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, PoolSize};

const LAYOUT: KvLayout = KvLayout {
    num_layers: 3,
    num_kv_heads: 2,
    head_dim: 64,
    block_size: 8,
    dtype: KvDtype::F16,
};

/// Writes random K/V for positions `from..to` of `seq` in every layer, at the slots the
/// manager assigns.
fn write_tokens(
    ctx: &pagellm::GpuContext,
    m: &BlockManager,
    pool: &KvPool,
    seq: SeqId,
    from: usize,
    to: usize,
    seed: u64,
) {
    let mut g = rng(seed);
    let slots: Vec<i32> = (from..to).map(|p| m.slot(seq, p).unwrap() as i32).collect();
    let row = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    let sb = ctx.upload("slots", &slots).unwrap();
    let mut b = Batch::new(ctx, "write");
    let mut keep = Vec::new();
    for layer in 0..LAYOUT.num_layers {
        let k = ctx
            .upload("k", &randn(&mut g, slots.len() * row, 1.0))
            .unwrap();
        let v = ctx
            .upload("v", &randn(&mut g, slots.len() * row, 1.0))
            .unwrap();
        reshape_and_cache(&mut b, pool, layer, &k, &v, &sb, slots.len()).unwrap();
        keep.push((k, v));
    }
    b.submit().unwrap();
}

fn blocks_of(
    ctx: &pagellm::GpuContext,
    m: &BlockManager,
    pool: &KvPool,
    seq: SeqId,
) -> Vec<Vec<u8>> {
    m.block_table(seq)
        .unwrap()
        .iter()
        .map(|b| pool.read_block(ctx, b.0 as usize).unwrap())
        .collect()
}

#[test]
fn fork_then_append_copies_the_shared_partial_block_in_every_layer() {
    for ctx in contexts() {
        let mut m = BlockManager::new(CacheConfig::new(8, 16, 8).with_watermark_blocks(0)).unwrap();
        let mut engine =
            CacheEngine::new(KvPool::new(ctx, LAYOUT, PoolSize::Blocks(16)).unwrap(), 8);
        let (parent, child) = (SeqId(1), SeqId(2));
        let prompt: Vec<u32> = (0..12).collect();
        m.allocate(parent, &prompt).unwrap();
        write_tokens(ctx, &m, &engine.device, parent, 0, 12, 1);
        m.fork(parent, child).unwrap();
        m.append_slot(child).unwrap();
        let ops = m.take_ops();
        assert_eq!(
            ops.copies.len(),
            1,
            "one copy, of the partly filled last block: {ops:?}"
        );
        let (src, dst) = ops.copies[0];
        assert_eq!(m.block_table(parent).unwrap()[1], src);
        assert_eq!(m.block_table(child).unwrap()[1], dst);
        engine.execute(ctx, &ops).unwrap();
        let a = engine.device.read_block(ctx, src.0 as usize).unwrap();
        let b = engine.device.read_block(ctx, dst.0 as usize).unwrap();
        assert!(a == b, "copy differs from its source on {}", backend(ctx));
        assert!(a.iter().any(|&x| x != 0), "the source held data");
        // The child's new token goes into its own copy; the parent's block is untouched.
        write_tokens(ctx, &m, &engine.device, child, 12, 13, 2);
        assert!(engine.device.read_block(ctx, src.0 as usize).unwrap() == a);
        assert!(engine.device.read_block(ctx, dst.0 as usize).unwrap() != a);
    }
}

#[test]
fn beams_sharing_blocks_survive_swap_out_and_in() {
    for ctx in contexts() {
        let mut m = BlockManager::new(CacheConfig::new(8, 10, 8).with_watermark_blocks(0)).unwrap();
        let mut engine =
            CacheEngine::new(KvPool::new(ctx, LAYOUT, PoolSize::Blocks(10)).unwrap(), 8);
        let beams = [SeqId(1), SeqId(2), SeqId(3)];
        let prompt: Vec<u32> = (0..20).collect();
        m.allocate(beams[0], &prompt).unwrap();
        write_tokens(ctx, &m, &engine.device, beams[0], 0, 20, 3);
        m.fork(beams[0], beams[1]).unwrap();
        m.fork(beams[0], beams[2]).unwrap();
        engine.execute(ctx, &m.take_ops()).unwrap();
        let before = blocks_of(ctx, &m, &engine.device, beams[0]);

        let out = m.swap_out(&beams).unwrap();
        assert_eq!(out.len(), 3, "three shared blocks move once each: {out:?}");
        engine.execute(ctx, &m.take_ops()).unwrap();
        for (i, &(_, h)) in out.iter().enumerate() {
            assert!(
                engine.host.block(h.0 as usize).unwrap() == before[i],
                "host copy of block {i}"
            );
            assert_eq!(m.host_refcount(h), Some(3), "sharing kept on the host");
        }
        // Another request takes the freed device blocks and overwrites them.
        let other = SeqId(9);
        m.allocate(other, &(0..40).collect::<Vec<u32>>()).unwrap();
        write_tokens(ctx, &m, &engine.device, other, 0, 40, 4);
        m.free(other).unwrap();

        let group: Vec<(SeqId, &[u32])> = beams.iter().map(|&b| (b, &prompt[..])).collect();
        m.swap_in(&group).unwrap();
        engine.execute(ctx, &m.take_ops()).unwrap();
        let table = m.block_table(beams[0]).unwrap().to_vec();
        for b in &beams[1..] {
            assert_eq!(
                m.block_table(*b).unwrap(),
                &table[..],
                "beams share blocks again"
            );
        }
        let after = blocks_of(ctx, &m, &engine.device, beams[0]);
        assert!(
            after == before,
            "K/V changed across swap-out and swap-in on {}",
            backend(ctx)
        );
        m.check_invariants().unwrap();
    }
}
