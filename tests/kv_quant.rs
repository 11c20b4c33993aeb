//! Quantized KV pools on the GPU against the plain-Rust format of `pagellm::internals::pool::quant`:
//! reshape_and_cache stores the scales the reference computes, bit for bit, and the codes the
//! reference computes, except where `x / scale` lies so close to a rounding midpoint that the
//! device's reciprocal may land on the other side (counted and bounded); tokens of one block
//! written in one dispatch, in any order, do not clobber each other's scales; copy-on-write
//! and swapping move quantized blocks byte for byte (tests/kernels_copy_blocks.rs and
//! tests/cache_engine.rs run every dtype).

mod common;
use common::*;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::reshape_and_cache::reshape_and_cache;
use pagellm::internals::pool::quant::{decode_half, quantize_group};
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, PoolSize};
use rand::seq::SliceRandom;
use rand::Rng;

/// Fills every slot of a `num_blocks` pool (one dispatch per half of the slots, each in
/// shuffled order, with a padding token) and checks each stored group against the reference.
fn check_pool(
    ctx: &pagellm::GpuContext,
    layout: KvLayout,
    num_blocks: usize,
    arena: Option<u64>,
    seed: u64,
) {
    let mut g = rng(seed);
    let pool = match arena {
        Some(a) => KvPool::with_arena_limit(ctx, layout, PoolSize::Blocks(num_blocks), a),
        None => KvPool::new(ctx, layout, PoolSize::Blocks(num_blocks)),
    }
    .unwrap();
    let (hd, nkv, bs) = (layout.head_dim, layout.num_kv_heads, layout.block_size);
    let row = nkv * hd;
    let slots_n = num_blocks * bs;
    // Rows with an outlier channel now and then, and an all-zero row.
    let mut rows = |n: usize| -> Vec<f32> {
        let mut v = randn(&mut g, n * row, 1.0);
        for x in v.iter_mut() {
            if g.random_range(0..50) == 0 {
                *x *= 30.0;
            }
        }
        v[..hd].fill(0.0);
        v
    };
    let k = rows(slots_n);
    let v = rows(slots_n);
    let mut order: Vec<usize> = (0..slots_n).collect();
    order.shuffle(&mut rng(seed + 1));
    let layer = layout.num_layers - 1;
    let mut b = Batch::new(ctx, "quantize");
    let mut keep = Vec::new();
    for part in order.chunks(slots_n.div_ceil(2)) {
        let mut slot_map: Vec<i32> = part.iter().map(|&s| s as i32).collect();
        let mut pk: Vec<f32> = part
            .iter()
            .flat_map(|&s| k[s * row..(s + 1) * row].to_vec())
            .collect();
        let mut pv: Vec<f32> = part
            .iter()
            .flat_map(|&s| v[s * row..(s + 1) * row].to_vec())
            .collect();
        slot_map.insert(1, -1); // padding: skipped
        pk.splice(row..row, vec![1e4; row]);
        pv.splice(row..row, vec![1e4; row]);
        let kb = ctx.upload("k", &pk).unwrap();
        let vb = ctx.upload("v", &pv).unwrap();
        let sb = ctx.upload("slots", &slot_map).unwrap();
        reshape_and_cache(&mut b, &pool, layer, &kb, &vb, &sb, slot_map.len()).unwrap();
        keep.push((kb, vb, sb));
    }
    b.submit().unwrap();

    let gs = layout.group_size();
    let half = layout.block_bytes() as usize;
    let (mut values, mut near_ties) = (0usize, 0usize);
    for block in 0..num_blocks {
        let bytes = pool.read_block(ctx, block).unwrap();
        let at = layer * 2 * half;
        for (which, src, got) in [
            ("K", &k, decode_half(&layout, &bytes[at..at + half])),
            (
                "V",
                &v,
                decode_half(&layout, &bytes[at + half..at + 2 * half]),
            ),
        ] {
            for h in 0..nkv {
                for off in 0..bs {
                    let slot = block * bs + off;
                    let x = &src[slot * row + h * hd..][..hd];
                    for gi in 0..hd / gs {
                        let group = &x[gi * gs..(gi + 1) * gs];
                        let (scale, codes) = quantize_group(layout.dtype, group);
                        let si = (h * bs + off) * (hd / gs) + gi;
                        let what = format!(
                            "{:?} hd={hd} bs={bs} {which} block {block} head {h} row {off} group {gi} on {}",
                            layout.dtype,
                            backend(ctx)
                        );
                        assert_eq!(got.scales[si].to_bits(), scale.to_bits(), "{what}: scale");
                        let ci = (h * bs + off) * hd + gi * gs;
                        for (j, (&want, &have)) in
                            codes.iter().zip(&got.codes[ci..ci + gs]).enumerate()
                        {
                            values += 1;
                            if want == have {
                                continue;
                            }
                            // Allowed only one step apart, at a rounding midpoint.
                            let t = group[j] as f64 / scale.to_f64();
                            let frac = t.abs().fract();
                            assert!(
                                (want as i32 - have as i32).abs() == 1 && (frac - 0.5).abs() < 1e-4,
                                "{what}: value {j} = {} (x / scale = {t}) coded {have}, reference {want}",
                                group[j]
                            );
                            near_ties += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(
        near_ties * 10_000 <= values,
        "{near_ties} near-tie differences in {values} values"
    );
}

#[test]
fn reshape_and_cache_quantizes_as_the_reference_does() {
    for ctx in contexts() {
        for dtype in [KvDtype::Int8, KvDtype::Int4] {
            for (i, (hd, nkv, bs)) in [
                (64, 2, 16),
                (128, 1, 8),
                (80, 3, 4),
                (96, 2, 32),
                (16, 4, 5),
            ]
            .into_iter()
            .enumerate()
            {
                let layout = KvLayout {
                    num_layers: 2,
                    num_kv_heads: nkv,
                    head_dim: hd,
                    block_size: bs,
                    dtype,
                };
                check_pool(ctx, layout, 6, None, 10 + i as u64);
            }
        }
    }
}

#[test]
fn quantized_pool_split_over_several_buffers() {
    for ctx in contexts() {
        for dtype in [KvDtype::Int8, KvDtype::Int4] {
            let layout = KvLayout {
                num_layers: 3,
                num_kv_heads: 2,
                head_dim: 64,
                block_size: 16,
                dtype,
            };
            let arena = 3 * 2 * layout.block_bytes();
            check_pool(ctx, layout, 10, Some(arena), 40);
        }
    }
}

#[test]
fn head_sizes_a_quantized_pool_cannot_hold_are_refused() {
    let layout = KvLayout {
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 20,
        block_size: 16,
        dtype: KvDtype::Int4,
    };
    let e = layout.validate().unwrap_err().to_string();
    assert!(
        e.contains("int4") && e.contains("head_dim divisible by 8") && e.contains("20"),
        "{e}"
    );
    let f16 = KvLayout {
        dtype: KvDtype::F16,
        ..layout
    };
    f16.validate().unwrap();
}

#[test]
fn rotate_rows_matches_the_reference_and_inverts() {
    use pagellm::internals::kernels::rotate::rotate_rows;
    use pagellm::internals::reference as r;
    for ctx in contexts() {
        for (i, hd) in [64usize, 128, 256, 80, 96, 24, 2].into_iter().enumerate() {
            let rows = 37;
            let x = randn(&mut rng(70 + i as u64), rows * hd, 1.0);
            let buf = ctx.upload("x", &x).unwrap();
            let mut b = Batch::new(ctx, "rotate");
            rotate_rows(&mut b, &buf, rows, hd, false).unwrap();
            b.submit().unwrap();
            let got = read_f32(ctx, &buf, x.len());
            let mut want = x.clone();
            r::rotate_rows(&mut want, hd, false);
            let what = format!("rotate hd={hd} on {}", backend(ctx));
            assert_close(&what, &got, &want, 1e-5, 1e-5);
            // Orthogonal: norms are kept, and the inverse brings the rows back.
            let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((norm(&got[..hd]) - norm(&x[..hd])).abs() < 1e-3 * norm(&x[..hd]));
            let mut b = Batch::new(ctx, "rotate back");
            rotate_rows(&mut b, &buf, rows, hd, true).unwrap();
            b.submit().unwrap();
            assert_close(
                &format!("{what} and back"),
                &read_f32(ctx, &buf, x.len()),
                &x,
                1e-5,
                1e-5,
            );
        }
    }
}

#[test]
fn rotate_qk_rotates_two_buffers_in_one_dispatch() {
    use pagellm::internals::kernels::rotate::rotate_qk;
    use pagellm::internals::reference as r;
    for ctx in contexts() {
        // head_dim 80: three rows a workgroup, so workgroups straddle q and k.
        let (hd, rq, rk) = (80, 70, 9);
        let mut g = rng(90);
        let (q, k) = (randn(&mut g, rq * hd, 1.0), randn(&mut g, rk * hd, 1.0));
        let (qb, kb) = (ctx.upload("q", &q).unwrap(), ctx.upload("k", &k).unwrap());
        let mut b = Batch::new(ctx, "rotate qk");
        rotate_qk(&mut b, &qb, &kb, rq, rk, hd).unwrap();
        assert_eq!(b.dispatch_count(), 1);
        b.submit().unwrap();
        for (name, x, buf) in [("q", &q, &qb), ("k", &k, &kb)] {
            let mut want = x.clone();
            r::rotate_rows(&mut want, hd, false);
            let what = format!("rotate_qk {name} on {}", backend(ctx));
            assert_close(&what, &read_f32(ctx, buf, x.len()), &want, 1e-5, 1e-5);
        }
    }
}

/// Hand-computed: the 4-point transform of a row after D's signs for elements 0..4.
#[test]
fn rotation_by_hand() {
    use pagellm::internals::reference as r;
    let signs: Vec<f32> = (0..4).map(r::rotation_sign).collect();
    let mut x = vec![1.0, 2.0, 3.0, 4.0];
    r::rotate_rows(&mut x, 4, false);
    let d: Vec<f32> = [1.0, 2.0, 3.0, 4.0]
        .iter()
        .zip(&signs)
        .map(|(a, s)| a * s)
        .collect();
    let want = [
        (d[0] + d[1] + d[2] + d[3]) / 2.0,
        (d[0] - d[1] + d[2] - d[3]) / 2.0,
        (d[0] + d[1] - d[2] - d[3]) / 2.0,
        (d[0] - d[1] - d[2] + d[3]) / 2.0,
    ];
    for (a, b) in x.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{x:?} vs {want:?}");
    }
    assert_eq!(r::rotation_blocks(80), vec![(0, 64), (64, 16)]);
    assert_eq!(r::rotation_blocks(24), vec![(0, 16), (16, 8)]);
    // Not all signs alike, or D would do nothing.
    let flips = (0..128).filter(|&i| r::rotation_sign(i) < 0.0).count();
    assert!((40..=88).contains(&flips), "{flips} of 128 signs flipped");
}
