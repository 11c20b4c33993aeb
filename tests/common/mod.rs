//! Shared helpers of the GPU tests: one context per software-reachable backend, seeded
//! random data, and tolerant comparison that names the first failing index.
//!
//! This folder holds every test helper, each included by the tests that need it: this
//! module (and `quant_fixture.rs`, the block-format fixtures), `golden.rs` (transformers fixtures), `http.rs` (a `pagellm serve` child and a
//! client), `sched_driver.rs` (the GPU-free engine stand-in around the real scheduler) and
//! `outputs.rs` (running requests through an engine, comparing outputs field by field).
#![allow(dead_code)]

pub mod converted;
pub mod outputs;
pub mod quant_fixture;

use pagellm::internals::gpu::{AdapterRequest, Batch, GpuContext};
use pagellm::internals::kernels::reshape_and_cache::reshape_and_cache;
use pagellm::internals::pool::{KvLayout, KvPool, PoolSize};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::OnceLock;

/// The repository's root (the models and the fixtures), from the library's tests or from
/// the command line's (`cli/`).
pub fn repo_root() -> &'static std::path::Path {
    static ROOT: OnceLock<std::path::PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        here.ancestors()
            .find(|p| p.join("models/fortunes-llama").is_dir())
            .unwrap_or(here)
            .to_path_buf()
    })
}

/// The small model shipped in the repository, as a command-line argument.
pub fn shipped_model() -> String {
    repo_root()
        .join("models/fortunes-llama")
        .to_string_lossy()
        .into_owned()
}

/// Backends the GPU tests run on. Set `PAGELLM_TEST_BACKENDS=vulkan,gl` (CI does) to make a
/// missing backend a failure instead of a skip.
const BACKENDS: [(&str, wgpu::Backends); 2] = [
    ("vulkan", wgpu::Backends::VULKAN),
    ("gl", wgpu::Backends::GL),
];

fn required() -> Vec<String> {
    std::env::var("PAGELLM_TEST_BACKENDS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

fn context(i: usize) -> Option<&'static GpuContext> {
    static CTX: [OnceLock<Option<GpuContext>>; 2] = [OnceLock::new(), OnceLock::new()];
    CTX[i]
        .get_or_init(|| {
            let (name, backends) = BACKENDS[i];
            let req = AdapterRequest {
                backends,
                ..Default::default()
            };
            match GpuContext::new(&req) {
                Ok(c) => Some(c),
                Err(e) => {
                    if required().iter().any(|r| r == name) {
                        panic!("backend {name} is required by PAGELLM_TEST_BACKENDS but: {e}");
                    }
                    eprintln!("note: no {name} adapter: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Every backend with an adapter. Prints a loud notice and returns nothing when there is no
/// adapter at all (the only case in which a GPU test may skip).
pub fn contexts() -> Vec<&'static GpuContext> {
    let v: Vec<_> = (0..BACKENDS.len()).filter_map(context).collect();
    static ANNOUNCED: OnceLock<()> = OnceLock::new();
    ANNOUNCED.get_or_init(|| {
        let names: Vec<String> = v.iter().map(|c| c.describe()).collect();
        eprintln!("GPU tests run on: {}", names.join(", "));
    });
    if v.is_empty() {
        eprintln!(
            "\n*** SKIPPED: no GPU adapter on any backend (install mesa-vulkan-drivers) ***\n"
        );
    }
    v
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub fn randn(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale)
        .collect()
}

/// Asserts |got - want| <= atol + rtol * |want| everywhere, naming the first bad index.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length {} vs {}",
        got.len(),
        want.len()
    );
    let mut worst = 0.0f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        worst = worst.max(err);
        // Written so that NaN fails too.
        if err.is_nan() || err > atol + rtol * w.abs() {
            panic!(
                "{what}: first mismatch at index {i}: got {g}, want {w} (|diff| {err}, atol {atol}, rtol {rtol})"
            );
        }
    }
}

/// Reads a buffer back as f32.
pub fn read_f32(ctx: &GpuContext, b: &wgpu::Buffer, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = ctx.read(b).expect("read back");
    v.truncate(n);
    v
}

pub fn backend(ctx: &GpuContext) -> String {
    format!("{:?}", ctx.info.backend)
}

/// A pool whose every slot of every layer holds distinct f16-exact values (K and V differ,
/// layers differ), written through reshape_and_cache. `seed` shifts the values.
pub fn filled_pool(
    ctx: &pagellm::GpuContext,
    layout: KvLayout,
    blocks: usize,
    arena: Option<u64>,
    seed: u32,
) -> KvPool {
    let pool = match arena {
        Some(a) => KvPool::with_arena_limit(ctx, layout, PoolSize::Blocks(blocks), a),
        None => KvPool::new(ctx, layout, PoolSize::Blocks(blocks)),
    }
    .unwrap();
    let slots = blocks * layout.block_size;
    let row = layout.num_kv_heads * layout.head_dim;
    let slot_map: Vec<i32> = (0..slots as i32).collect();
    let sb = ctx.upload("slots", &slot_map).unwrap();
    let mut b = Batch::new(ctx, "fill");
    let mut keep = Vec::new();
    for layer in 0..layout.num_layers {
        // Distinct, f16-exact values: small integers tagged by layer and K/V.
        let k: Vec<f32> = (0..slots * row)
            .map(|i| ((i as u32 + seed) % 1000) as f32 + layer as f32 * 0.25)
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x - 0.5).collect();
        let kb = ctx.upload("k", &k).unwrap();
        let vb = ctx.upload("v", &v).unwrap();
        reshape_and_cache(&mut b, &pool, layer, &kb, &vb, &sb, slots).unwrap();
        keep.push((kb, vb));
    }
    b.submit().unwrap();
    pool
}
pub mod golden;

/// An owned handle on a test context, for APIs that keep an `Arc<GpuContext>`.
/// A JSON array of token ids (the fixtures' expected.json files), as ids.
#[allow(dead_code)]
pub fn json_ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

/// A device of pagellm's own on `like`'s backend (destroying it leaves the shared test
/// contexts alone).
pub fn own_device(like: &GpuContext) -> std::sync::Arc<GpuContext> {
    let req = pagellm::AdapterRequest {
        backends: wgpu::Backends::from(like.info.backend),
        ..Default::default()
    };
    std::sync::Arc::new(GpuContext::new(&req).unwrap())
}

/// A device of an "application's" own on `like`'s adapter, wrapped as an application shares
/// it: its lost callback (the application's) forwards to the context, and its uncaptured
/// errors are logged, not fatal.
pub fn app_device(like: &GpuContext) -> std::sync::Arc<GpuContext> {
    use std::sync::Arc;
    let adapter = like.adapter.clone();
    let desc = GpuContext::device_descriptor(&adapter);
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    device.on_uncaptured_error(Arc::new(|e: wgpu::Error| eprintln!("app: GPU error: {e}")));
    let ctx = Arc::new(GpuContext::from_existing(adapter, device.clone(), queue));
    let weak = Arc::downgrade(&ctx);
    device.set_device_lost_callback(move |reason, msg| {
        if let Some(ctx) = weak.upgrade() {
            ctx.report_device_lost(format!("{reason:?}: {msg}"));
        }
    });
    ctx
}

pub fn arc(ctx: &GpuContext) -> std::sync::Arc<GpuContext> {
    std::sync::Arc::new(GpuContext::from_existing(
        ctx.adapter.clone(),
        ctx.device.clone(),
        ctx.queue.clone(),
    ))
}

/// Values as a weight of `dtype` stores them (round to nearest even; block formats
/// quantized and dequantized by the reference).
pub fn rounded(v: &[f32], dtype: pagellm::internals::kernels::WeightDtype) -> Vec<f32> {
    use pagellm::internals::gguf::quant;
    use pagellm::internals::kernels::WeightDtype;
    match dtype {
        WeightDtype::F32 => v.to_vec(),
        WeightDtype::F16 => pagellm::internals::reference::round_f16(v),
        WeightDtype::BF16 => pagellm::internals::reference::round_bf16(v),
        block => {
            let bytes = quant::quantize(block, v).unwrap();
            quant::dequantize(block, &bytes, v.len()).unwrap()
        }
    }
}

/// The K and V rows (`[slots.len(), num_kv_heads, head_dim]` each) that layer `layer` of the
/// pool holds at `slots`, decoded from the pool's bytes by the plain-Rust format.
pub fn read_rows(
    ctx: &GpuContext,
    pool: &KvPool,
    layer: usize,
    slots: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    use pagellm::internals::pool::quant::decode_half;
    let l = pool.layout;
    let half = l.block_bytes() as usize;
    let (hd, bs) = (l.head_dim, l.block_size);
    let mut cache = std::collections::HashMap::new();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for &slot in slots {
        let (block, off) = (slot / bs, slot % bs);
        let (dk, dv) = cache.entry(block).or_insert_with(|| {
            let bytes = pool.read_block(ctx, block).unwrap();
            let at = layer * 2 * half;
            (
                decode_half(&l, &bytes[at..at + half]).values,
                decode_half(&l, &bytes[at + half..at + 2 * half]).values,
            )
        });
        for h in 0..l.num_kv_heads {
            let r = (h * bs + off) * hd;
            k.extend_from_slice(&dk[r..r + hd]);
            v.extend_from_slice(&dv[r..r + hd]);
        }
    }
    (k, v)
}

/// `ctx`'s default matmul plan for products of inner dimension `k`.
pub fn mm_plan(ctx: &GpuContext, k: usize) -> pagellm::internals::kernels::plan::MatmulPlan {
    pagellm::internals::kernels::plan::MatmulPlan::choose(ctx, &[k])
}

/// `ctx`'s matmul plan with every step run by `kernel` (kernels compared side by side).
pub fn mm_only(
    ctx: &GpuContext,
    kernel: pagellm::internals::kernels::matmul::MatmulKernel,
) -> pagellm::internals::kernels::plan::MatmulPlan {
    mm_plan(ctx, 8).only(kernel)
}

/// `ctx`'s default kernel plan for a model whose every width is `width`.
pub fn plan_for(ctx: &GpuContext, width: usize) -> pagellm::internals::kernels::KernelPlan {
    let dims = pagellm::internals::kernels::ModelDims {
        hidden: width,
        head_dim: width,
        q_width: width,
        intermediate: width,
    };
    pagellm::internals::kernels::KernelPlan::choose(ctx, &dims)
}

/// The logits and arg-max of one [`step`]'s rows.
pub struct Step {
    pub logits: Vec<Vec<f32>>,
    pub argmax: Vec<u32>,
}

/// One forward step of `tokens` (positions `context_len - tokens.len()` onwards) of the
/// sequence whose KV blocks are `table`, with the logits and GPU arg-max of `rows` (indices
/// into `tokens`) read back.
#[allow(clippy::too_many_arguments)]
pub fn step(
    ctx: &pagellm::GpuContext,
    model: &pagellm::internals::model::gpu::GpuModel,
    pool: &KvPool,
    ws: &pagellm::internals::model::forward::Workspace,
    tokens: &[u32],
    context_len: usize,
    table: &[u32],
    rows: &[u32],
) -> Step {
    let slice = pagellm::internals::model::step::SeqSlice {
        query_len: tokens.len(),
        context_len,
        block_table: table,
    };
    let meta =
        pagellm::internals::model::step::AttentionMetadata::build(&[slice], pool.layout.block_size)
            .unwrap();
    // Token ids and rows ride in the metadata buffer, as in the engine.
    let bufs = meta.upload_with(ctx, &[tokens, rows]).unwrap();
    let mut b = Batch::new(ctx, "step");
    let input = pagellm::internals::model::forward::StepInput {
        tokens: bufs.extra(0).unwrap(),
        meta: &bufs,
        rows: bufs.extra(1).unwrap(),
        num_rows: rows.len(),
        argmax: true,
    };
    pagellm::internals::model::forward::forward(&mut b, model, pool, ws, &input).unwrap();
    b.submit().unwrap();
    let v = model.config.vocab_size;
    let logits: Vec<f32> = ctx.read(&ws.logits).unwrap();
    let argmax: Vec<u32> = ctx.read(&ws.argmax).unwrap();
    Step {
        logits: logits[..rows.len() * v]
            .chunks(v)
            .map(<[f32]>::to_vec)
            .collect(),
        argmax: argmax[..rows.len()].to_vec(),
    }
}
