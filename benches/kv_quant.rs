//! What a quantized KV cache costs and buys, side by side in one run on one adapter:
//!
//! 1. Capacity: bytes per token and tokens per GiB of pool for each dtype, for the shipped
//!    model and for Llama-3-8B's cache shape, against f16.
//! 2. Attention: one decode step of paged attention (Llama-3-8B shapes: 32 query heads, 8 KV
//!    heads, head size 128, blocks of 16) over f16, int8 and int4 pools, at batch 8 and 32
//!    and contexts 512 and 2048; the dtypes alternate so drift hits all alike.
//! 3. Engine decode steps on the shipped model: one engine per setting (f16; int8 and int4
//!    with and without their default Hadamard rotation), all holding the same requests (N
//!    sequences of greedy decoding), stepped in turn; median step time.
//!
//! 4. The int4 scale layouts one could choose at 4.5 bits a value, compared offline on the
//!    shipped model's real keys and values (an f32 cache read back after a 256-token
//!    window): relative squared error of a symmetric scale per 32 values (what pagellm
//!    stores) and of a scale and minimum per 64, each with and without the rotation; a scale
//!    and minimum per 32 (5 bits) for reference.
//!
//! Run: `cargo bench --bench kv_quant` (`-- --quick` for fewer repetitions, `-- --section N`
//! for one section; adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`).

#[path = "common/mod.rs"]
mod common;

use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::paged_attention::{
    paged_attention, Attention, AttentionBuffers, AttentionKernel, AttentionOptions,
};
use pagellm::internals::kernels::reshape_and_cache::reshape_and_cache;
use pagellm::internals::model::step::{AttentionMetadata, SeqSlice};
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, KvRotation, PoolSize};
use pagellm::internals::sampling::SamplingParams;
use pagellm::GpuContext;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DTYPES: [KvDtype; 3] = [KvDtype::F16, KvDtype::Int8, KvDtype::Int4];
const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK: usize = 16;
const DISPATCHES_PER_SUBMIT: usize = 4;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn capacity(name: &str, layers: usize, kv_heads: usize, head_dim: usize) {
    let f16 = KvLayout {
        num_layers: layers,
        num_kv_heads: kv_heads,
        head_dim,
        block_size: BLOCK,
        dtype: KvDtype::F16,
    };
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Int8, KvDtype::Int4] {
        let l = KvLayout { dtype, ..f16 };
        let per_token = l.bytes_per_token();
        println!(
            "| {name} | {dtype} | {} | {per_token:.0} | {:.0} | {:.2}x |",
            if l.group_size() > 0 {
                l.group_size().to_string()
            } else {
                "-".into()
            },
            (1u64 << 30) as f64 / per_token,
            f16.bytes_per_token() / per_token,
        );
    }
}

struct AttnSetup {
    pool: KvPool,
    meta: AttentionBuffers,
}

fn attn_setup(ctx: &GpuContext, dtype: KvDtype, batch: usize, ctx_len: usize) -> AttnSetup {
    let per_seq = ctx_len.div_ceil(BLOCK);
    let layout = KvLayout {
        num_layers: 1,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        block_size: BLOCK,
        dtype,
    };
    let blocks = batch * per_seq;
    let pool = KvPool::new(ctx, layout, PoolSize::Blocks(blocks)).expect("pool");
    // Real values in every slot, so the quantized pools hold real scales.
    let mut g = rand::rngs::StdRng::seed_from_u64(3);
    let slots = blocks * BLOCK;
    let row = KV_HEADS * HEAD_DIM;
    let chunk = 4096;
    for start in (0..slots).step_by(chunk) {
        let n = chunk.min(slots - start);
        let k: Vec<f32> = (0..n * row).map(|_| g.random_range(-1.0..1.0)).collect();
        let map: Vec<i32> = (start as i32..(start + n) as i32).collect();
        let kb = ctx.upload("k", &k).expect("k");
        let sb = ctx.upload("slots", &map).expect("slots");
        let mut b = Batch::new(ctx, "fill");
        reshape_and_cache(&mut b, &pool, 0, &kb, &kb, &sb, n).expect("fill");
        b.submit().expect("submit");
        ctx.wait().expect("wait");
    }
    let mut ids: Vec<u32> = (0..blocks as u32).collect();
    ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let seqs: Vec<SeqSlice> = ids
        .chunks(per_seq)
        .map(|t| SeqSlice {
            query_len: 1,
            context_len: ctx_len,
            block_table: t,
        })
        .collect();
    let meta = AttentionMetadata::build(&seqs, BLOCK)
        .and_then(|m| m.upload(ctx))
        .expect("metadata");
    AttnSetup { pool, meta }
}

fn attn_once(ctx: &GpuContext, s: &AttnSetup, q: &wgpu::Buffer, out: &wgpu::Buffer) -> Duration {
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let mut b = Batch::new(ctx, "bench");
    for _ in 0..DISPATCHES_PER_SUBMIT {
        let call = Attention {
            pool: &s.pool,
            layer: 0,
            meta: &s.meta,
            q,
            out,
            num_heads: HEADS,
            opts: AttentionOptions::scaled(scale),
        };
        paged_attention(&mut b, AttentionKernel::choose(ctx, HEAD_DIM), &call).expect("dispatch");
    }
    let start = Instant::now();
    b.submit().expect("submit");
    ctx.wait().expect("wait");
    start.elapsed() / DISPATCHES_PER_SUBMIT as u32
}

fn attention(ctx: &GpuContext, quick: bool) {
    println!("| batch | context | f16 (ms) | int8 (ms) | int4 (ms) | int8 / f16 | int4 / f16 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for batch in [8, 32] {
        for ctx_len in [512, 2048] {
            let setups: Vec<AttnSetup> = DTYPES
                .iter()
                .map(|&d| attn_setup(ctx, d, batch, ctx_len))
                .collect();
            let q = ctx
                .upload("q", &vec![0.01f32; batch * HEADS * HEAD_DIM])
                .expect("q");
            let out = ctx
                .storage_buffer("out", (batch * HEADS * HEAD_DIM * 4) as u64)
                .expect("out");
            for s in &setups {
                attn_once(ctx, s, &q, &out);
            }
            let budget = Duration::from_millis(if quick { 400 } else { 2000 });
            let mut times: Vec<Vec<Duration>> = vec![Vec::new(); setups.len()];
            let start = Instant::now();
            while times[0].len() < 5 || (start.elapsed() < budget && times[0].len() < 200) {
                for (s, t) in setups.iter().zip(&mut times) {
                    t.push(attn_once(ctx, s, &q, &out));
                }
            }
            let m: Vec<Duration> = times.into_iter().map(median).collect();
            println!(
                "| {batch} | {ctx_len} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                ms(m[0]),
                ms(m[1]),
                ms(m[2]),
                m[1].as_secs_f64() / m[0].as_secs_f64(),
                m[2].as_secs_f64() / m[0].as_secs_f64(),
            );
        }
    }
}

/// The engine settings section 3 compares: f16, and the quantized caches with their default
/// Hadamard rotation of keys and without it (what the rotation's one extra dispatch a layer
/// costs).
const ENGINE_SETTINGS: [(KvDtype, KvRotation); 5] = [
    (KvDtype::F16, KvRotation::None),
    (KvDtype::Int8, KvRotation::Hadamard),
    (KvDtype::Int4, KvRotation::Hadamard),
    (KvDtype::Int8, KvRotation::None),
    (KvDtype::Int4, KvRotation::None),
];

fn engine_decode(ctx: &Arc<GpuContext>, quick: bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
    let tokens = if quick { 48 } else { 160 };
    let names: Vec<String> = ENGINE_SETTINGS
        .iter()
        .map(|(d, r)| format!("{d} {r}"))
        .collect();
    println!(
        "| sequences | context reached | {} | {} |",
        names
            .iter()
            .map(|n| format!("{n} step (ms)"))
            .collect::<Vec<_>>()
            .join(" | "),
        names[1..]
            .iter()
            .map(|n| format!("{n} / f16"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---:|---:|{}", "---:|".repeat(2 * names.len() - 1));
    for n in [1, 16] {
        let mut engines: Vec<Engine> = ENGINE_SETTINGS
            .iter()
            .map(|&(kv_dtype, rotation)| {
                let cfg = EngineConfig {
                    kv_dtype,
                    kv_rotation: Some(rotation),
                    ..EngineConfig::default()
                };
                Engine::with_context(ctx.clone(), &dir, cfg, |_, _| {}).expect("engine")
            })
            .collect();
        let prompt = "The sea at night is".to_string();
        let mut handles = Vec::new();
        for e in &mut engines {
            for i in 0..n {
                let params = SamplingParams {
                    max_tokens: tokens,
                    ignore_eos: true,
                    seed: Some(i as u64),
                    ..SamplingParams::greedy()
                };
                handles.push(
                    e.add_request(Prompt::Text(prompt.clone()), params)
                        .expect("add"),
                );
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); engines.len()];
        // The first steps prefill; time decode steps only.
        common::alternate_steps(&mut engines, 2, &mut times);
        drop(handles);
        let m: Vec<Duration> = times.into_iter().map(median).collect();
        println!(
            "| {n} | {} | {} | {} |",
            tokens + 6,
            m.iter()
                .map(|d| format!("{:.3}", ms(*d)))
                .collect::<Vec<_>>()
                .join(" | "),
            m[1..]
                .iter()
                .map(|d| format!("{:.3}", d.as_secs_f64() / m[0].as_secs_f64()))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
}

/// Quantizes `x` in groups of `g` with a scale and a minimum per group (codes 0..=15), as
/// the alternative int4 layout would, and returns the reconstruction.
fn asymmetric_int4(x: &[f32], g: usize) -> Vec<f32> {
    x.chunks(g)
        .flat_map(|group| {
            let lo = group.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = group.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let s = half::f16::from_f32((hi - lo) / 15.0).to_f32();
            let m = half::f16::from_f32(lo).to_f32();
            group
                .iter()
                .map(move |&v| {
                    let q = if s > 0.0 {
                        ((v - m) / s).round().clamp(0.0, 15.0)
                    } else {
                        0.0
                    };
                    m + q * s
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn int4_layouts(ctx: &Arc<GpuContext>) {
    use pagellm::internals::eval::Scorer;
    use pagellm::internals::pool::quant::{decode_half, round_trip};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
    let cfg = EngineConfig {
        kv_dtype: KvDtype::F32,
        ..EngineConfig::default()
    };
    let mut s = Scorer::new(ctx.clone(), &dir, &cfg, 256, 64, |_, _| {}).expect("scorer");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/heldout/fortunes.txt"),
    )
    .expect("held-out text");
    let mut tokens = s.tokenizer().encode(&text).expect("tokens");
    tokens.truncate(256);
    s.score_window(&tokens, |_, _| {}).expect("window");
    let pool = s.pool();
    let l = pool.layout;
    let half = l.block_bytes() as usize;
    let hd = l.head_dim;
    // [which (K, V)] -> rows of head_dim values, every layer, head and position.
    let mut rows: [Vec<f32>; 2] = [Vec::new(), Vec::new()];
    for block in 0..tokens.len().div_ceil(l.block_size) {
        let bytes = pool.read_block(ctx, block).expect("read");
        for layer in 0..l.num_layers {
            for (which, r) in rows.iter_mut().enumerate() {
                let at = (2 * layer + which) * half;
                r.extend(decode_half(&l, &bytes[at..at + half]).values);
            }
        }
    }
    let rel = |x: &[f32], y: &[f32]| {
        let e: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let n: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
        e / n
    };
    println!("| values | layout | bits / value | rotation | relative squared error |");
    println!("|---|---|---:|---|---:|");
    for (which, name) in [(0, "K"), (1, "V")] {
        for rotated in [false, true] {
            let mut x = rows[which].clone();
            if rotated {
                pagellm::internals::reference::rotate_rows(&mut x, hd, false);
            }
            let rot = if rotated { "hadamard" } else { "none" };
            let cases = [
                (
                    "symmetric scale / 32 (pagellm)",
                    4.5,
                    round_trip(KvDtype::Int4, hd, &x),
                ),
                ("scale + minimum / 64", 4.5, asymmetric_int4(&x, 64)),
                ("scale + minimum / 32", 5.0, asymmetric_int4(&x, 32)),
            ];
            for (layout, bits, y) in cases {
                println!(
                    "| {name} | {layout} | {bits} | {rot} | {:.5} |",
                    rel(&x, &y)
                );
            }
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `--section N` runs one section.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .iter()
        .position(|a| a == "--section")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse::<u32>().ok());
    let run = |n: u32| only.is_none_or(|o| o == n);
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    println!("# KV cache dtypes");
    println!();
    println!("adapter: {}", ctx.describe());
    println!();
    if run(1) {
        println!("## 1. Capacity (block size {BLOCK}; scales included)");
        println!();
        println!("| cache shape | dtype | values per scale | bytes per token | tokens per GiB | vs f16 |");
        println!("|---|---|---:|---:|---:|---:|");
        capacity("shipped model (4 layers, 2 KV heads x 64)", 4, 2, 64);
        capacity("Llama-3-8B (32 layers, 8 KV heads x 128)", 32, 8, 128);
        println!();
    }
    if run(2) {
        println!("## 2. Paged attention, one decode step ({HEADS} query heads, {KV_HEADS} KV heads x {HEAD_DIM})");
        println!();
        attention(&ctx, quick);
        println!();
    }
    if run(3) {
        println!("## 3. Engine decode step, shipped model, greedy");
        println!();
        engine_decode(&ctx, quick);
        println!();
    }
    if run(4) {
        println!("## 4. int4 scale layouts on the shipped model's keys and values");
        println!();
        int4_layouts(&ctx);
    }
}
