//! GPU vs plain-Rust reference for reshape_and_cache + paged_attention: the reference
//! attends over each sequence's contiguous history; the GPU reads the same K/V through
//! shuffled block tables of the paged pool. Covers the edge cases of DESIGN.md: context
//! lengths 1, block_size - 1, block_size, block_size + 1; GQA 4:1 and MQA; out-of-order
//! physical blocks; several sequences of different lengths in one batch mixing prefill
//! chunks and decode tokens; head sizes 64/96/128/256 (and 80 for quantized pools); block sizes
//! 8/16/32; f16, f32, int8 and int4 pools; a pool split over several buffers.

mod common;
use common::*;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::paged_attention::{
    paged_attention, Attention, AttentionKernel, AttentionOptions, NO_BLOCK,
};
use pagellm::internals::kernels::reshape_and_cache::reshape_and_cache;
use pagellm::internals::model::step::{AttentionMetadata, SeqSlice};
use pagellm::internals::pool::{quant, KvDtype, KvLayout, KvPool, PoolSize};
use pagellm::internals::reference as r;
use rand::seq::SliceRandom;

struct Case {
    head_dim: usize,
    block_size: usize,
    num_heads: usize,
    num_kv_heads: usize,
    dtype: KvDtype,
    /// (context_len, query_len) per sequence.
    seqs: Vec<(usize, usize)>,
    /// Cap on one pool buffer, to force sharding.
    arena_limit: Option<u64>,
    /// Sliding window; the metadata's block tables then get holes ([`NO_BLOCK`]) where
    /// every block's tokens are outside every query's window, as the block manager leaves
    /// them once it frees such blocks.
    window: Option<usize>,
    softcap: Option<f32>,
    /// Each query head's sink logit (gpt-oss).
    sinks: Option<Vec<f32>>,
}

fn run(ctx: &pagellm::GpuContext, seed: u64, c: &Case) {
    let mut g = rng(seed);
    let (hd, bs, nh, nkv) = (c.head_dim, c.block_size, c.num_heads, c.num_kv_heads);
    let layout = KvLayout {
        num_layers: 2,
        num_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        dtype: c.dtype,
    };
    let needed: usize = c.seqs.iter().map(|s| s.0.div_ceil(bs)).sum();
    let num_blocks = needed + 5;
    let pool = match c.arena_limit {
        Some(limit) => KvPool::with_arena_limit(ctx, layout, PoolSize::Blocks(num_blocks), limit),
        None => KvPool::new(ctx, layout, PoolSize::Blocks(num_blocks)),
    }
    .unwrap();
    if c.arena_limit.is_some() {
        assert!(pool.num_shards() > 1, "the case must shard the pool");
    }
    // Out-of-order physical blocks: a shuffled permutation dealt out to the sequences.
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut g);
    let mut next = 0;
    let tables: Vec<Vec<u32>> = c
        .seqs
        .iter()
        .map(|&(ctx_len, _)| {
            let n = ctx_len.div_ceil(bs);
            next += n;
            ids[next - n..next].to_vec()
        })
        .collect();
    let k_hist: Vec<Vec<f32>> = c
        .seqs
        .iter()
        .map(|s| randn(&mut g, s.0 * nkv * hd, 1.0))
        .collect();
    let v_hist: Vec<Vec<f32>> = c
        .seqs
        .iter()
        .map(|s| randn(&mut g, s.0 * nkv * hd, 1.0))
        .collect();
    let q: Vec<Vec<f32>> = c
        .seqs
        .iter()
        .map(|s| randn(&mut g, s.1 * nh * hd, 1.0))
        .collect();
    let layer = 1;

    // Step 1: the cached history (positions before each query) through reshape_and_cache.
    let row = nkv * hd;
    let (mut hk, mut hv, mut hslots) = (Vec::new(), Vec::new(), Vec::<i32>::new());
    for (i, &(ctx_len, q_len)) in c.seqs.iter().enumerate() {
        for pos in 0..ctx_len - q_len {
            hk.extend_from_slice(&k_hist[i][pos * row..(pos + 1) * row]);
            hv.extend_from_slice(&v_hist[i][pos * row..(pos + 1) * row]);
            hslots.push((tables[i][pos / bs] as usize * bs + pos % bs) as i32);
        }
    }
    hslots.push(-1); // a padding token must be skipped
    hk.extend(vec![9.0; row]);
    hv.extend(vec![9.0; row]);
    // Holes below the window: NO_BLOCK as the block manager leaves them (even seeds), or
    // (odd seeds) a spare block full of large keys and values, which would dominate any
    // output whose query read it: the kernel must not read table entries below a window.
    let filler = if seed % 2 == 1 && c.window.is_some() {
        let spare = ids[next];
        for off in 0..bs {
            hk.extend(vec![30.0; row]);
            hv.extend(vec![1e4; row]);
            hslots.push((spare as usize * bs + off) as i32);
        }
        spare
    } else {
        NO_BLOCK
    };
    // Step 2: this step's query tokens, laid out by AttentionMetadata.
    let holed: Vec<Vec<u32>> = c
        .seqs
        .iter()
        .zip(&tables)
        .map(|(&(ctx_len, q_len), t)| {
            let first_query = ctx_len - q_len;
            let seen_from = c.window.map_or(0, |w| (first_query + 1).saturating_sub(w));
            let mut t = t.clone();
            for (b, id) in t.iter_mut().enumerate() {
                if (b + 1) * bs <= seen_from {
                    *id = filler;
                }
            }
            t
        })
        .collect();
    if c.window.is_some() {
        assert!(
            holed.iter().flatten().any(|&b| b == filler),
            "the case must punch holes"
        );
    }
    let slices: Vec<SeqSlice> = c
        .seqs
        .iter()
        .zip(&holed)
        .map(|(&(context_len, query_len), t)| SeqSlice {
            query_len,
            context_len,
            block_table: t,
        })
        .collect();
    let meta = AttentionMetadata::build(&slices, bs).unwrap();
    let (mut nk, mut nv, mut nq) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &(ctx_len, q_len)) in c.seqs.iter().enumerate() {
        for pos in ctx_len - q_len..ctx_len {
            nk.extend_from_slice(&k_hist[i][pos * row..(pos + 1) * row]);
            nv.extend_from_slice(&v_hist[i][pos * row..(pos + 1) * row]);
        }
        nq.extend_from_slice(&q[i]);
    }
    let bufs = meta.upload(ctx).unwrap();
    let t = meta.num_tokens;
    let hkb = ctx.upload("hk", &hk).unwrap();
    let hvb = ctx.upload("hv", &hv).unwrap();
    let hsb = ctx.upload("hs", &hslots).unwrap();
    let nkb = ctx.upload("nk", &nk).unwrap();
    let nvb = ctx.upload("nv", &nv).unwrap();
    let qb = ctx.upload("q", &nq).unwrap();
    let scale = 1.0 / (hd as f32).sqrt();
    let sinks = c.sinks.as_ref().map(|v| ctx.upload("sinks", v).unwrap());
    let mut b = Batch::new(ctx, "attention test");
    reshape_and_cache(&mut b, &pool, layer, &hkb, &hvb, &hsb, hslots.len()).unwrap();
    reshape_and_cache(&mut b, &pool, layer, &nkb, &nvb, bufs.slot_mapping(), t).unwrap();
    b.submit().unwrap();

    // The reference attends over what the pool holds. Float pools: the values rounded to
    // the pool's dtype. Quantized pools: the pool's own codes and scales, read back and
    // decoded in plain Rust; tests/kv_quant.rs checks those codes against the plain-Rust
    // quantizer (here a near-tie rounding difference would blur the comparison).
    let mut want = Vec::new();
    for i in 0..c.seqs.len() {
        let (k, v) = if c.dtype.is_quantized() {
            let slots: Vec<usize> = (0..c.seqs[i].0)
                .map(|pos| tables[i][pos / bs] as usize * bs + pos % bs)
                .collect();
            read_rows(ctx, &pool, layer, &slots)
        } else {
            (
                quant::round_trip(c.dtype, hd, &k_hist[i]),
                quant::round_trip(c.dtype, hd, &v_hist[i]),
            )
        };
        let heads = (nh, nkv, hd);
        let extras = r::AttentionExtras {
            window: c.window,
            softcap: c.softcap,
            sinks: c.sinks.as_deref(),
        };
        want.extend(r::windowed_attention(&q[i], &k, &v, heads, scale, extras));
    }
    // Every kernel the adapter supports, each against the reference; the two add the same
    // terms in the same order, so they must also agree bit for bit.
    let mut first: Option<Vec<f32>> = None;
    for kernel in [
        AttentionKernel::Plain,
        AttentionKernel::Subgroup,
        AttentionKernel::Lanes,
        AttentionKernel::Tiles,
    ] {
        if !kernel.supports(ctx, hd) {
            continue;
        }
        let out = ctx.storage_buffer("out", (t * nh * hd * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "attention test");
        let opts = AttentionOptions {
            scale,
            window: c.window,
            softcap: c.softcap,
            sinks: sinks.as_ref(),
        };
        let call = Attention {
            pool: &pool,
            layer,
            meta: &bufs,
            q: &qb,
            out: &out,
            num_heads: nh,
            opts,
        };
        paged_attention(&mut b, kernel, &call).unwrap();
        b.submit().unwrap();
        let what = format!(
            "{kernel:?} paged_attention hd={hd} bs={bs} heads={nh}:{nkv} {:?} seqs={:?} window={:?} softcap={:?} shards={} on {}",
            c.dtype,
            c.seqs,
            c.window,
            c.softcap,
            pool.num_shards(),
            backend(ctx)
        );
        let got = read_f32(ctx, &out, want.len());
        assert_close(&what, &got, &want, 2e-4, 1e-4);
        match &first {
            None => first = Some(got),
            Some(f) => assert!(
                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: differs from the plain kernel"
            ),
        }
    }
}

#[test]
fn decode_at_block_boundaries() {
    for ctx in contexts() {
        for bs in [8, 16, 32] {
            let seqs = vec![(1, 1), (bs - 1, 1), (bs, 1), (bs + 1, 1), (3 * bs + 5, 1)];
            let case = Case {
                head_dim: 64,
                block_size: bs,
                num_heads: 4,
                num_kv_heads: 4,
                dtype: KvDtype::F16,
                seqs,
                arena_limit: None,
                window: None,
                softcap: None,
                sinks: None,
            };
            run(ctx, bs as u64, &case);
        }
    }
}

#[test]
fn mixed_prefill_chunks_and_decodes_with_gqa_and_mqa() {
    for ctx in contexts() {
        for (i, (hd, nh, nkv)) in [
            (64, 8, 2),
            (96, 4, 1),
            (128, 4, 1),
            (128, 8, 2),
            (256, 2, 1),
        ]
        .into_iter()
        .enumerate()
        {
            let case = Case {
                head_dim: hd,
                block_size: 16,
                num_heads: nh,
                num_kv_heads: nkv,
                dtype: KvDtype::F16,
                // Whole-prompt prefill, a chunk in the middle of a prompt, decodes, and a
                // context longer than one 64-position tile.
                seqs: vec![(37, 37), (50, 20), (1, 1), (17, 1), (150, 3), (16, 16)],
                arena_limit: None,
                window: None,
                softcap: None,
                sinks: None,
            };
            run(ctx, 100 + i as u64, &case);
        }
    }
}

#[test]
fn sliding_window_with_holes_and_soft_capping() {
    for ctx in contexts() {
        // Windows shorter than a block, between blocks, longer than a 64-position tile; a
        // window longer than a context sees it all. Prefill chunks cross the window's start.
        for (i, (window, softcap)) in [(5, None), (20, Some(2.0)), (70, None), (24, Some(50.0))]
            .into_iter()
            .enumerate()
        {
            for dtype in [KvDtype::F16, KvDtype::Int8] {
                let case = Case {
                    head_dim: 64,
                    block_size: 8,
                    num_heads: 4,
                    num_kv_heads: 2,
                    dtype,
                    seqs: vec![(150, 1), (90, 30), (3, 3), (41, 1), (200, 70)],
                    arena_limit: None,
                    window: Some(window),
                    softcap,
                    sinks: None,
                };
                run(ctx, 700 + i as u64, &case);
            }
        }
        // Soft-capping alone, on a sharded pool.
        let case = Case {
            head_dim: 64,
            block_size: 16,
            num_heads: 4,
            num_kv_heads: 2,
            dtype: KvDtype::F32,
            seqs: vec![(100, 1), (60, 30), (5, 5)],
            arena_limit: Some(4 * 2 * 2 * 16 * 64 * 4),
            window: None,
            softcap: Some(3.0),
            sinks: None,
        };
        run(ctx, 710, &case);
    }
}

/// The query-tiled kernel takes a block of 8 flat-batch tokens as tiles only when they are
/// 8 consecutive queries of one sequence; everything else runs per query. Chunks of 7, 8, 9,
/// 15, 16, 17 and 70 tokens start at every offset modulo 8 of the flat batch, between
/// decode tokens, some crossing a 64-position tile, with and without a window that starts
/// inside a block of 8 queries, on a whole and on a split pool. `run` checks every kernel
/// against the reference and against each other bit for bit.
#[test]
fn query_tiles_at_every_alignment() {
    for ctx in contexts() {
        if backend(ctx).starts_with("Vulkan") && ctx.info.device_type == wgpu::DeviceType::Cpu {
            assert!(
                AttentionKernel::Tiles.supports(ctx, 64),
                "the query-tiled kernel must run on {}",
                backend(ctx)
            );
        }
        let seqs = vec![
            (7, 7),
            (30, 8),
            (1, 1),
            (9, 9),
            (80, 15),
            (16, 16),
            (2, 1),
            (17, 17),
            (140, 70),
            (5, 1),
        ];
        for (i, (window, arena_limit)) in [
            (None, None),
            (Some(12), None),
            (Some(45), None),
            (None, Some(2 * 4 * 2 * 8 * 64 * 2)),
        ]
        .into_iter()
        .enumerate()
        {
            let case = Case {
                head_dim: 64,
                block_size: 8,
                num_heads: 4,
                num_kv_heads: 2,
                dtype: KvDtype::F16,
                seqs: seqs.clone(),
                arena_limit,
                window,
                softcap: None,
                sinks: None,
            };
            run(ctx, 900 + i as u64, &case);
        }
    }
}

#[test]
fn f32_pool() {
    for ctx in contexts() {
        let case = Case {
            head_dim: 64,
            block_size: 8,
            num_heads: 8,
            num_kv_heads: 2,
            dtype: KvDtype::F32,
            seqs: vec![(9, 9), (70, 1), (8, 2)],
            arena_limit: None,
            window: None,
            softcap: None,
            sinks: None,
        };
        run(ctx, 200, &case);
    }
}

#[test]
fn pool_split_over_several_buffers_merges_partials() {
    for ctx in contexts() {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            // One block of one layer (K and V) is 2 * 2 * 16 * 64 * bytes; cap each buffer at
            // four blocks' worth so the ~20 blocks spread over ~5 shards.
            let block = (2 * 16 * 64 * dtype_bytes(dtype)) as u64;
            let case = Case {
                head_dim: 64,
                block_size: 16,
                num_heads: 4,
                num_kv_heads: 2,
                dtype,
                seqs: vec![(100, 1), (60, 30), (5, 5), (33, 1)],
                arena_limit: Some(4 * 2 * block),
                window: None,
                softcap: None,
                sinks: None,
            };
            run(ctx, 300, &case);
        }
    }
}

fn dtype_bytes(d: KvDtype) -> usize {
    d.bits() / 8
}

#[test]
fn quantized_pools_with_gqa_mqa_and_odd_head_sizes() {
    for ctx in contexts() {
        for dtype in [KvDtype::Int8, KvDtype::Int4] {
            for (i, (hd, nh, nkv, bs)) in [
                (64, 4, 4, 16),
                (128, 8, 2, 16),
                (80, 4, 1, 8),
                (96, 6, 3, 32),
            ]
            .into_iter()
            .enumerate()
            {
                let case = Case {
                    head_dim: hd,
                    block_size: bs,
                    num_heads: nh,
                    num_kv_heads: nkv,
                    dtype,
                    seqs: vec![(37, 37), (50, 20), (1, 1), (bs + 1, 1), (150, 3)],
                    arena_limit: None,
                    window: None,
                    softcap: None,
                    sinks: None,
                };
                run(ctx, 500 + i as u64, &case);
            }
        }
    }
}

#[test]
fn quantized_pool_split_over_several_buffers() {
    for ctx in contexts() {
        for dtype in [KvDtype::Int8, KvDtype::Int4] {
            let layout = KvLayout {
                num_layers: 2,
                num_kv_heads: 2,
                head_dim: 64,
                block_size: 16,
                dtype,
            };
            let case = Case {
                head_dim: 64,
                block_size: 16,
                num_heads: 4,
                num_kv_heads: 2,
                dtype,
                seqs: vec![(100, 1), (60, 30), (5, 5), (33, 1)],
                arena_limit: Some(4 * 2 * layout.block_bytes()),
                window: None,
                softcap: None,
                sinks: None,
            };
            run(ctx, 600, &case);
        }
    }
}

#[test]
fn metadata_rejects_inconsistent_sequences() {
    let table = [3u32, 1];
    let too_long = SeqSlice {
        query_len: 5,
        context_len: 4,
        block_table: &table,
    };
    let e = AttentionMetadata::build(&[too_long], 16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("query of 5 tokens"), "{e}");
    let short_table = SeqSlice {
        query_len: 1,
        context_len: 33,
        block_table: &table,
    };
    let e = AttentionMetadata::build(&[short_table], 16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 blocks for 33 tokens"), "{e}");
}

#[test]
fn metadata_by_hand() {
    // Block size 4; sequence 0 decodes its 6th token (position 5, block table [7, 2]);
    // sequence 1 prefills 3 tokens (block table [4]).
    let (t0, t1) = ([7u32, 2], [4u32]);
    let m = AttentionMetadata::build(
        &[
            SeqSlice {
                query_len: 1,
                context_len: 6,
                block_table: &t0,
            },
            SeqSlice {
                query_len: 3,
                context_len: 3,
                block_table: &t1,
            },
        ],
        4,
    )
    .unwrap();
    assert_eq!(m.num_tokens, 4);
    assert_eq!(m.query_start, vec![0, 1, 4]);
    assert_eq!(m.token_pos, vec![[0, 5], [1, 0], [1, 1], [1, 2]]);
    assert_eq!(m.slot_mapping, vec![2 * 4 + 1, 16, 17, 18]);
    assert_eq!(m.block_tables, vec![7, 2, 4, 0]);
    assert_eq!(m.positions, vec![5, 0, 1, 2]);
}

#[test]
fn contiguous_baseline_matches_reference() {
    // The benchmark's baseline must compute the same attention: sequence s's history lives
    // in "block" s of size max_len, read without a block table.
    for ctx in contexts() {
        let mut g = rng(400);
        let (hd, nh, nkv, max_len) = (64, 4, 2, 40);
        let lens = [40usize, 7, 1];
        let layout = KvLayout {
            num_layers: 1,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: max_len,
            dtype: KvDtype::F16,
        };
        let pool = KvPool::new(ctx, layout, PoolSize::Blocks(lens.len())).unwrap();
        let tables: Vec<[u32; 1]> = (0..lens.len() as u32).map(|s| [s]).collect();
        let slices: Vec<SeqSlice> = lens
            .iter()
            .zip(&tables)
            .map(|(&n, t)| SeqSlice {
                query_len: n,
                context_len: n,
                block_table: t,
            })
            .collect();
        let meta = AttentionMetadata::build(&slices, max_len).unwrap();
        let bufs = meta.upload(ctx).unwrap();
        let t = meta.num_tokens;
        let k = randn(&mut g, t * nkv * hd, 1.0);
        let v = randn(&mut g, t * nkv * hd, 1.0);
        let q = randn(&mut g, t * nh * hd, 1.0);
        let (kb, vb, qb) = (
            ctx.upload("k", &k).unwrap(),
            ctx.upload("v", &v).unwrap(),
            ctx.upload("q", &q).unwrap(),
        );
        let out = ctx.storage_buffer("out", (t * nh * hd * 4) as u64).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut b = Batch::new(ctx, "contiguous");
        reshape_and_cache(&mut b, &pool, 0, &kb, &vb, bufs.slot_mapping(), t).unwrap();
        let call = Attention {
            pool: &pool,
            layer: 0,
            meta: &bufs,
            q: &qb,
            out: &out,
            num_heads: nh,
            opts: AttentionOptions::scaled(scale),
        };
        let kernel = AttentionKernel::choose(ctx, hd);
        pagellm::internals::kernels::paged_attention::contiguous_attention(&mut b, kernel, &call)
            .unwrap();
        b.submit().unwrap();
        let mut want = Vec::new();
        let mut start = 0;
        for &n in &lens {
            let (k_s, v_s) = (
                &k[start * nkv * hd..(start + n) * nkv * hd],
                &v[start * nkv * hd..(start + n) * nkv * hd],
            );
            let q_s = &q[start * nh * hd..(start + n) * nh * hd];
            want.extend(r::causal_attention(
                q_s,
                &r::round_f16(k_s),
                &r::round_f16(v_s),
                nh,
                nkv,
                hd,
                scale,
            ));
            start += n;
        }
        let what = format!("contiguous_attention on {}", backend(ctx));
        assert_close(&what, &read_f32(ctx, &out, want.len()), &want, 2e-4, 1e-4);
    }
}

#[test]
fn metadata_refuses_a_query_in_a_released_block() {
    let table = [NO_BLOCK, 3];
    let hole = SeqSlice {
        query_len: 5,
        context_len: 6,
        block_table: &table,
    };
    let e = AttentionMetadata::build(&[hole], 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("position 1 is in a released block"), "{e}");
    let fine = SeqSlice {
        query_len: 2,
        context_len: 6,
        block_table: &table,
    };
    let m = AttentionMetadata::build(&[fine], 4).unwrap();
    assert_eq!(m.slot_mapping, vec![3 * 4, 3 * 4 + 1]);
}

#[test]
fn lane_kernel_grid_takes_a_second_dimension() {
    // More (token, head) pairs than eight per workgroup times one grid dimension: the lane
    // kernel's grid takes a second dimension. Each of 4,100 one-token sequences attends to
    // its own single position, so every output row is exactly that position's value row as
    // the pool stores it (the softmax of one score is 1).
    for ctx in contexts() {
        let (hd, nh, bs, seqs) = (8, 128, 16, 4100);
        let max = ctx.limits.max_compute_workgroups_per_dimension as usize;
        assert!(
            seqs * nh > 8 * max,
            "the case must exceed one grid dimension"
        );
        let layout = KvLayout {
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: hd,
            block_size: bs,
            dtype: KvDtype::F16,
        };
        let pool = KvPool::new(ctx, layout, PoolSize::Blocks(seqs)).unwrap();
        let tables: Vec<[u32; 1]> = (0..seqs as u32).map(|b| [b]).collect();
        let slices: Vec<SeqSlice> = tables
            .iter()
            .map(|t| SeqSlice {
                query_len: 1,
                context_len: 1,
                block_table: t,
            })
            .collect();
        let meta = AttentionMetadata::build(&slices, bs).unwrap();
        let bufs = meta.upload(ctx).unwrap();
        let mut g = rng(4100);
        let (k, v) = (randn(&mut g, seqs * hd, 1.0), randn(&mut g, seqs * hd, 1.0));
        let q = randn(&mut g, seqs * nh * hd, 1.0);
        let (kb, vb, qb) = (
            ctx.upload("k", &k).unwrap(),
            ctx.upload("v", &v).unwrap(),
            ctx.upload("q", &q).unwrap(),
        );
        let out = ctx.storage_buffer("out", (q.len() * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "attention test");
        reshape_and_cache(&mut b, &pool, 0, &kb, &vb, bufs.slot_mapping(), seqs).unwrap();
        let opts = AttentionOptions::scaled(1.0 / (hd as f32).sqrt());
        let kernel = AttentionKernel::Lanes;
        let call = Attention {
            pool: &pool,
            layer: 0,
            meta: &bufs,
            q: &qb,
            out: &out,
            num_heads: nh,
            opts,
        };
        paged_attention(&mut b, kernel, &call).unwrap();
        b.submit().unwrap();
        let stored = quant::round_trip(KvDtype::F16, hd, &v);
        let got = read_f32(ctx, &out, q.len());
        for (t, row) in got.chunks(nh * hd).enumerate() {
            let want = &stored[t * hd..(t + 1) * hd];
            for (h, head) in row.chunks(hd).enumerate() {
                assert_eq!(head, want, "token {t} head {h} on {}", backend(ctx));
            }
        }
    }
}

#[test]
fn attention_sinks_join_every_kernels_softmax_once_per_query() {
    // Sinks of every size: one far above the scores (most of each softmax's mass), one far
    // below (no effect), moderate ones; windows, prefill chunks and decode rows; a sharded
    // pool, whose partials must count each sink once.
    let sinks = vec![6.0, -20.0, 0.5, -1.5];
    for ctx in contexts() {
        for (i, (window, arena_limit, dtype)) in [
            (None, None, KvDtype::F32),
            (Some(20), None, KvDtype::F16),
            (None, Some(4 * 2 * 2 * 16 * 64 * 4), KvDtype::F32),
            (Some(70), None, KvDtype::Int8),
        ]
        .into_iter()
        .enumerate()
        {
            let case = Case {
                head_dim: 64,
                block_size: 16,
                num_heads: 4,
                num_kv_heads: 2,
                dtype,
                seqs: vec![(100, 1), (60, 30), (5, 5), (130, 70)],
                arena_limit,
                window,
                softcap: None,
                sinks: Some(sinks.clone()),
            };
            run(ctx, 800 + i as u64, &case);
        }
    }
}
