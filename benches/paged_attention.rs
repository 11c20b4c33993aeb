//! Paged vs contiguous attention, side by side on one adapter in one run.
//!
//! The paged variant reads K/V through block tables whose physical blocks (16 tokens each)
//! are shuffled across the pool; the contiguous variant is the same kernel compiled with
//! `CONTIGUOUS = true`: each sequence's history is one contiguous region and no block table is
//! read. Decode steps (one query token per sequence) at batch sizes 1, 8, 32 and context
//! lengths 128, 512, 2048, with Llama-3-8B attention shapes (32 query heads, 8 KV heads, head
//! size 128, f16 cache). Measurements alternate between the variants so drift hits both;
//! each figure is the median wall time of a submit of several dispatches.
//!
//! A second table times every attention kernel the adapter runs, side by side, on a small
//! model's shape (the stories15M shape of the engine benchmark's `tiny15m`: 6 heads of 48,
//! f16 cache), in the three kinds of step the engine runs: decode at 1 and 16 sequences and
//! one 128-token prefill.
//!
//! Run: `cargo bench --bench paged_attention` (adapter chosen as usual, e.g.
//! `PAGELLM_BACKEND=gl`). `-- --quick` runs fewer repetitions; `-- --small` runs only the
//! second table.

use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::paged_attention::{
    contiguous_attention, paged_attention, Attention, AttentionBuffers, AttentionKernel,
    AttentionOptions,
};
use pagellm::internals::model::step::{AttentionMetadata, SeqSlice};
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, PoolSize};
use pagellm::GpuContext;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};

const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK: usize = 16;
const DISPATCHES_PER_SUBMIT: usize = 4;

struct Setup {
    pool: KvPool,
    meta: AttentionBuffers,
    heads: usize,
    head_dim: usize,
}

impl Setup {
    /// The attention of layer 0 over this setup's pool and metadata, scaled by 1/sqrt(head_dim).
    fn call<'a>(&'a self, q: &'a wgpu::Buffer, out: &'a wgpu::Buffer) -> Attention<'a> {
        Attention {
            pool: &self.pool,
            layer: 0,
            meta: &self.meta,
            q,
            out,
            num_heads: self.heads,
            opts: AttentionOptions::scaled(1.0 / (self.head_dim as f32).sqrt()),
        }
    }
}

/// Attention shape: (query heads, KV heads, head size).
type Shape = (usize, usize, usize);

fn setup(ctx: &GpuContext, batch: usize, ctx_len: usize, paged: bool) -> Setup {
    setup_shaped(ctx, (HEADS, KV_HEADS, HEAD_DIM), batch, ctx_len, 1, paged)
}

/// `batch` sequences of `ctx_len` positions, the last `query_len` of each queried, K and V
/// random.
fn setup_shaped(
    ctx: &GpuContext,
    (heads, kv_heads, head_dim): Shape,
    batch: usize,
    ctx_len: usize,
    query_len: usize,
    paged: bool,
) -> Setup {
    let block_size = if paged { BLOCK } else { ctx_len };
    let blocks_per_seq = ctx_len.div_ceil(block_size);
    let layout = KvLayout {
        num_layers: 1,
        num_kv_heads: kv_heads,
        head_dim,
        block_size,
        dtype: KvDtype::F16,
    };
    let pool = KvPool::new(ctx, layout, PoolSize::Blocks(batch * blocks_per_seq)).expect("pool");
    let mut ids: Vec<u32> = (0..(batch * blocks_per_seq) as u32).collect();
    if paged {
        ids.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    }
    let tables: Vec<&[u32]> = ids.chunks(blocks_per_seq).collect();
    let seqs: Vec<SeqSlice> = tables
        .iter()
        .map(|t| SeqSlice {
            query_len,
            context_len: ctx_len,
            block_table: t,
        })
        .collect();
    let meta = AttentionMetadata::build(&seqs, block_size)
        .and_then(|m| m.upload(ctx))
        .expect("metadata");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let halves = pool.layout.block_bytes() as usize / 2;
    for block in 0..batch * blocks_per_seq {
        let (buffer, k, v) = pool.block_location(0, block);
        for offset in [k, v] {
            let values: Vec<u16> = (0..halves)
                .map(|_| half::f16::from_f32(rng.random_range(-1.0..1.0)).to_bits())
                .collect();
            ctx.queue
                .write_buffer(buffer, offset, bytemuck::cast_slice(&values));
        }
    }
    Setup {
        pool,
        meta,
        heads,
        head_dim,
    }
}

/// The median-ready time of one dispatch: `record` records one into the batch,
/// [`DISPATCHES_PER_SUBMIT`] of them go in one submit, waited on.
fn time_dispatches(ctx: &GpuContext, record: impl Fn(&mut Batch)) -> Duration {
    let mut b = Batch::new(ctx, "bench");
    for _ in 0..DISPATCHES_PER_SUBMIT {
        record(&mut b);
    }
    let start = Instant::now();
    b.submit().expect("submit");
    ctx.wait().expect("wait");
    start.elapsed() / DISPATCHES_PER_SUBMIT as u32
}

fn time_once(
    ctx: &GpuContext,
    s: &Setup,
    q: &wgpu::Buffer,
    out: &wgpu::Buffer,
    paged: bool,
) -> Duration {
    let call = s.call(q, out);
    let kernel = AttentionKernel::choose(ctx, s.head_dim);
    time_dispatches(ctx, |b| {
        if paged {
            paged_attention(b, kernel, &call)
        } else {
            contiguous_attention(b, kernel, &call)
        }
        .expect("dispatch")
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One paged dispatch of `kernel`, as [`time_once`] times the chosen one.
fn time_kernel(
    ctx: &GpuContext,
    s: &Setup,
    q: &wgpu::Buffer,
    out: &wgpu::Buffer,
    kernel: AttentionKernel,
) -> Duration {
    let call = s.call(q, out);
    time_dispatches(ctx, |b| {
        paged_attention(b, kernel, &call).expect("dispatch")
    })
}

/// The small-model table: the median time of one attention dispatch per kind of step, for
/// every kernel the adapter runs (measurements alternate between them), and which one the
/// engine chooses.
fn small_model(ctx: &GpuContext, quick: bool) {
    const SMALL: Shape = (6, 6, 48);
    let kernels: Vec<AttentionKernel> = [
        AttentionKernel::Plain,
        AttentionKernel::Subgroup,
        AttentionKernel::Lanes,
        AttentionKernel::Tiles,
    ]
    .into_iter()
    .filter(|k| k.supports(ctx, SMALL.2))
    .collect();
    println!(
        "small model: 6 query heads, 6 KV heads, head size 48, f16 cache, paged block size {BLOCK}; the engine chooses {:?}",
        AttentionKernel::choose(ctx, SMALL.2)
    );
    println!();
    let names: Vec<String> = kernels.iter().map(|k| format!("{k:?} (ms)")).collect();
    println!("| step | query tokens | context | {} |", names.join(" | "));
    println!("|---|---:|---:|{}", "---:|".repeat(kernels.len()));
    // (label, sequences, context, query tokens per sequence)
    let cases = [
        ("decode, 1 sequence", 1, 160, 1),
        ("decode, 16 sequences", 16, 160, 1),
        ("prefill, 1 x 128 tokens", 1, 128, 128),
    ];
    for (label, seqs, ctx_len, query_len) in cases {
        let s = setup_shaped(ctx, SMALL, seqs, ctx_len, query_len, true);
        let n = seqs * query_len * SMALL.0 * SMALL.2;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let qv: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let q = ctx.upload("q", &qv).expect("q");
        let out = ctx.storage_buffer("out", (n * 4) as u64).expect("out");
        for &k in &kernels {
            time_kernel(ctx, &s, &q, &out, k);
        }
        let budget = Duration::from_millis(if quick { 300 } else { 1500 });
        let mut times = vec![Vec::new(); kernels.len()];
        let start = Instant::now();
        while times[0].len() < 5 || (start.elapsed() < budget && times[0].len() < 200) {
            for (i, &k) in kernels.iter().enumerate() {
                times[i].push(time_kernel(ctx, &s, &q, &out, k));
            }
        }
        let cells: Vec<String> = times
            .into_iter()
            .map(|t| format!("{:.3}", median(t).as_secs_f64() * 1e3))
            .collect();
        println!(
            "| {label} | {} | {ctx_len} | {} |",
            seqs * query_len,
            cells.join(" | ")
        );
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let ctx = GpuContext::from_env().expect("GPU context");
    println!("adapter: {}", ctx.describe());
    if std::env::args().any(|a| a == "--small") {
        small_model(&ctx, quick);
        return;
    }
    println!();
    println!(
        "shape: {HEADS} query heads, {KV_HEADS} KV heads, head size {HEAD_DIM}, f16 cache, paged block size {BLOCK}"
    );
    println!();
    println!("| batch | context | paged (ms) | contiguous (ms) | paged / contiguous | pool buffers (paged, contiguous) |");
    println!("|---:|---:|---:|---:|---:|---|");
    for batch in [1, 8, 32] {
        for ctx_len in [128, 512, 2048] {
            let paged = setup(&ctx, batch, ctx_len, true);
            let contig = setup(&ctx, batch, ctx_len, false);
            let q = ctx
                .upload("q", &vec![0.01f32; batch * HEADS * HEAD_DIM])
                .expect("q");
            let out = ctx
                .storage_buffer("out", (batch * HEADS * HEAD_DIM * 4) as u64)
                .expect("out");
            // Warm up: pipeline compilation and first-touch of the pool.
            time_once(&ctx, &paged, &q, &out, true);
            time_once(&ctx, &contig, &q, &out, false);
            let budget = Duration::from_millis(if quick { 300 } else { 1500 });
            let (mut tp, mut tc) = (Vec::new(), Vec::new());
            let start = Instant::now();
            while tp.len() < 5 || (start.elapsed() < budget && tp.len() < 200) {
                tp.push(time_once(&ctx, &paged, &q, &out, true));
                tc.push(time_once(&ctx, &contig, &q, &out, false));
            }
            let (mp, mc) = (median(tp), median(tc));
            println!(
                "| {batch} | {ctx_len} | {:.3} | {:.3} | {:.3} | {}, {} |",
                mp.as_secs_f64() * 1e3,
                mc.as_secs_f64() * 1e3,
                mp.as_secs_f64() / mc.as_secs_f64(),
                paged.pool.num_shards(),
                contig.pool.num_shards(),
            );
        }
    }
    println!();
    small_model(&ctx, quick);
}
