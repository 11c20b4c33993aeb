//! The projection kernels side by side, by row count: what each kernel costs and what one
//! more row in a step costs (how much batching buys on this adapter).
//!
//! One f16 weight of Llama-3.2-1B MLP shape (4096 x 1024 by default; `--n N --k K` to
//! change), `matmul` called for m = 1 .. 256 rows with every kernel the adapter supports
//! (`MatmulKernel`), alternating kernels within a row count so drift hits all of them. Each
//! figure is the median wall time of a submit of several calls, waited on. The last
//! columns follow the kernel the adapter's plan (`MatmulPlan`) picks: rows per second relative to one
//! row, and arithmetic rate (2·m·n·k flops).
//!
//! With `--gated`, a down projection's two ways of taking the MLP's gated activation, side
//! by side with the kernel the plan picks: a `silu_mul` pass into a buffer and the matmul
//! reading it, against the matmul reading the gate-up output and applying the activation
//! itself (`Input::Gated`); `--n` is then the hidden size and `--k` the intermediate size.
//!
//! With `--normed`, a projection's two ways of taking the RMSNorm of its input, side by side
//! with the kernel the plan picks: an `rms_norm` pass (the adapter's kernel) into a buffer
//! and the matmul reading it, against the matmul norming x as it reads (`Input::Normed`);
//! `--n` is the projection's output width and `--k` the hidden size.
//!
//! With `--formats`, the weight formats side by side (f16 and every block format, the
//! weight quantized from the same values), each run by the kernel the plan picks for the
//! row count: time per call, time relative to f16, and the weight's bytes on the GPU;
//! `--dtypes q4_k,q6_k` keeps f16 and those formats.
//!
//! With `--wide`, passes of several rows at four columns per invocation against two, side
//! by side, on the wide weights of tiny15m and m110 (`--dtypes f16,q4_k` picks formats).
//!
//! With `--argmax`, the greedy arg-max kernels (`ArgmaxKernel`) side by side over rows of
//! `--n` logits (the vocabulary).
//!
//! With `--peak`, the adapter's bounds instead (`matmul/peak.rs`): its multiply-add rate
//! from registers, with f16 weights read as the column kernels read them, and with x read
//! three ways and passes of other shapes, beside the plan's kernel on tiny15m's weights.
//!
//! Run: `cargo bench --bench matmul` (adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`).
//! `-- --quick` runs fewer repetitions; `-- --rows 1,8,32` picks row counts.

use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::logits::{argmax_partials_len, ArgmaxKernel};
use pagellm::internals::kernels::matmul::{matmul, Matmul, MatmulKernel, Norm};
use pagellm::internals::kernels::plan::MatmulPlan;
use pagellm::internals::kernels::rms_norm::RmsNormKernel;
use pagellm::internals::kernels::{rms_norm, silu_mul, Weight, WeightDtype};
use pagellm::internals::nn::Activation;
use pagellm::GpuContext;
use std::time::{Duration, Instant};

#[path = "matmul/peak.rs"]
mod peak;

const CALLS_PER_SUBMIT: usize = 4;
const MAX_ROWS: usize = 256;
const KERNELS: [MatmulKernel; 4] = [
    MatmulKernel::Tiled,
    MatmulKernel::Columns,
    MatmulKernel::ColumnsVec,
    MatmulKernel::ColumnsSubgroup,
];

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = arg("--n").and_then(|v| v.parse().ok()).unwrap_or(4096);
    let k = arg("--k").and_then(|v| v.parse().ok()).unwrap_or(1024);
    let rows: Vec<usize> = arg("--rows")
        .map(|v| v.split(',').filter_map(|r| r.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 4, 8, 9, 16, 32, 64, 128, 256]);
    let ctx = GpuContext::from_env().expect("GPU context");
    if std::env::args().any(|a| a == "--gated") {
        gated(&ctx, n, k, &rows, quick);
        return;
    }
    if std::env::args().any(|a| a == "--argmax") {
        argmax(&ctx, n, &rows, quick);
        return;
    }
    if std::env::args().any(|a| a == "--normed") {
        normed(&ctx, n, k, &rows, quick);
        return;
    }
    if std::env::args().any(|a| a == "--peak") {
        peak::peak(&ctx, quick);
        return;
    }
    if std::env::args().any(|a| a == "--wide") {
        wide(&ctx, &rows, quick);
        return;
    }
    if std::env::args().any(|a| a == "--formats") {
        formats(&ctx, n, k, &rows, quick);
        return;
    }
    let kernels: Vec<MatmulKernel> = KERNELS
        .into_iter()
        .filter(|kern| kern.supports(&ctx, k))
        .collect();
    println!("adapter: {}", ctx.describe());
    println!("weight: {n} x {k}, f16; {CALLS_PER_SUBMIT} calls per submit");
    println!();
    let wv: Vec<f32> = (0..n * k)
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let w = Weight::from_f32(&ctx, "w", &wv, n, k, WeightDtype::F16).expect("weight");
    let x = ctx.upload("x", &vec![0.5f32; MAX_ROWS * k]).expect("x");
    let y = ctx
        .storage_buffer("y", (MAX_ROWS * n * 4) as u64)
        .expect("y");
    let names: Vec<String> = kernels.iter().map(|k| format!("{k:?} (ms)")).collect();
    println!(
        "| rows | {} | chosen | rows/s vs 1 row | GFLOP/s |",
        names.join(" | ")
    );
    println!("|---:|{}---|---:|---:|", "---:|".repeat(kernels.len()));
    let mut base = None;
    for m in rows.into_iter().filter(|&m| (1..=MAX_ROWS).contains(&m)) {
        let plan = MatmulPlan::choose(&ctx, &[k]);
        let once = |kernel: MatmulKernel| {
            let mut b = Batch::new(&ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                let call = Matmul::new(&x, &w, &y, m);
                matmul(&mut b, &plan.only(kernel), &call).expect("matmul");
            }
            per_call(&ctx, b)
        };
        let med = alternating(quick, &kernels, once);
        let chosen = plan.kernel(m);
        let i = kernels.iter().position(|&kern| kern == chosen).unwrap();
        let rows_per_s = m as f64 / med[i];
        let base = *base.get_or_insert(rows_per_s);
        let cells: Vec<String> = med.iter().map(|t| format!("{:.2}", t * 1e3)).collect();
        println!(
            "| {m} | {} | {chosen:?} | {:.2}x | {:.2} |",
            cells.join(" | "),
            rows_per_s / base,
            2.0 * (m * n * k) as f64 / med[i] / 1e9
        );
    }
}

/// The `--wide` table: weights of tiny15m and m110 wide enough for four columns per
/// invocation, in f16 and the formats of llama.cpp's Q4_K_M and Q8_0 files, with the
/// plan's passes of several rows at four columns (`MatmulPlan::wide_passes`) and at two,
/// alternating, per row count.
fn wide(ctx: &GpuContext, rows: &[usize], quick: bool) {
    println!("adapter: {}", ctx.describe());
    let plan = MatmulPlan::choose(ctx, &[8]);
    println!(
        "{CALLS_PER_SUBMIT} calls per submit; four columns from {:?} columns",
        plan.wide_from
    );
    println!();
    println!(
        "| weight (n x k) | format | rows | two columns (ms) | four columns (ms) | speed-up |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    let shapes = [
        ("tiny15m gate up", 1536, 288),
        ("tiny15m LM head", 32000, 288),
        ("m110 q k v", 2304, 768),
        ("m110 gate up", 4096, 768),
        ("m110 LM head", 32000, 768),
    ];
    let dtypes: Vec<WeightDtype> = arg("--dtypes")
        .unwrap_or_else(|| "f16".into())
        .split(',')
        .map(|d| d.trim().parse().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    for (name, n, k) in shapes {
        let wv: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 997) as f32 - 498.0) * 1e-4)
            .collect();
        let x = ctx.upload("x", &vec![0.5f32; MAX_ROWS * k]).expect("x");
        let y = ctx
            .storage_buffer("y", (MAX_ROWS * n * 4) as u64)
            .expect("y");
        for &dtype in dtypes.iter().filter(|d| k.is_multiple_of(d.block_elems())) {
            let w = Weight::from_f32(ctx, "w", &wv, n, k, dtype).expect("weight");
            for &m in rows.iter().filter(|&&m| (2..=MAX_ROWS).contains(&m)) {
                let once = |four: bool| {
                    let plan = MatmulPlan {
                        wide_passes: four,
                        ..plan
                    };
                    let mut b = Batch::new(ctx, "bench");
                    for _ in 0..CALLS_PER_SUBMIT {
                        matmul(&mut b, &plan, &Matmul::new(&x, &w, &y, m)).expect("matmul");
                    }
                    per_call(ctx, b)
                };
                let (two, four) = side_by_side(quick, once);
                println!(
                    "| {name} ({n} x {k}) | {dtype} | {m} | {:.2} | {:.2} | {:.2}x |",
                    two * 1e3,
                    four * 1e3,
                    two / four
                );
            }
        }
    }
}

/// The `--formats` table: per row count, the median time of the plan's kernel over the same
/// weight in each format, and that time relative to f16's.
fn formats(ctx: &GpuContext, n: usize, k: usize, rows: &[usize], quick: bool) {
    println!("adapter: {}", ctx.describe());
    println!("weight: {n} x {k}; {CALLS_PER_SUBMIT} calls per submit");
    println!();
    let wv: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 997) as f32 - 498.0) * 1e-4)
        .collect();
    // `--dtypes q4_k,q6_k` keeps f16 and those.
    let only: Option<Vec<WeightDtype>> = std::env::args()
        .skip_while(|a| a != "--dtypes")
        .nth(1)
        .map(|l| {
            l.split(',')
                .map(|d| d.trim().parse().unwrap_or_else(|e| panic!("{e}")))
                .collect()
        });
    let dtypes: Vec<WeightDtype> = std::iter::once(WeightDtype::F16)
        .chain(WeightDtype::BLOCKS)
        .filter(|d| k.is_multiple_of(d.block_elems()))
        .filter(|d| *d == WeightDtype::F16 || only.as_ref().is_none_or(|o| o.contains(d)))
        .collect();
    let weights: Vec<Weight> = dtypes
        .iter()
        .map(|&d| Weight::from_f32(ctx, "w", &wv, n, k, d).expect("weight"))
        .collect();
    let x = ctx.upload("x", &vec![0.5f32; MAX_ROWS * k]).expect("x");
    let y = ctx
        .storage_buffer("y", (MAX_ROWS * n * 4) as u64)
        .expect("y");
    let mb: Vec<String> = weights
        .iter()
        .map(|w| format!("{:.2}", w.gpu_bytes() as f64 / 1e6))
        .collect();
    println!(
        "GPU MB: {}",
        dtypes
            .iter()
            .zip(&mb)
            .map(|(d, m)| format!("{d} {m}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    let names: Vec<String> = dtypes.iter().map(|d| format!("{d} (ms)")).collect();
    let ratios: Vec<String> = dtypes[1..].iter().map(|d| format!("{d} / F16")).collect();
    println!(
        "| rows | kernel | {} | {} |",
        names.join(" | "),
        ratios.join(" | ")
    );
    println!("|---:|---|{}", "---:|".repeat(2 * dtypes.len() - 1));
    let plan = MatmulPlan::choose(ctx, &[k]);
    for m in rows
        .iter()
        .copied()
        .filter(|&m| (1..=MAX_ROWS).contains(&m))
    {
        let once = |i: usize| {
            let mut b = Batch::new(ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                matmul(&mut b, &plan, &Matmul::new(&x, &weights[i], &y, m)).expect("matmul");
            }
            per_call(ctx, b)
        };
        let idx: Vec<usize> = (0..dtypes.len()).collect();
        let med = alternating(quick, &idx, once);
        let cells: Vec<String> = med.iter().map(|t| format!("{:.3}", t * 1e3)).collect();
        let rel: Vec<String> = med[1..]
            .iter()
            .map(|t| format!("{:.2}x", t / med[0]))
            .collect();
        println!(
            "| {m} | {:?} | {} | {} |",
            plan.kernel(m),
            cells.join(" | "),
            rel.join(" | ")
        );
    }
}

/// The `--gated` table: per row count, the median time of a down projection that reads a
/// separate activation pass's output and of one that applies the activation as it reads.
fn gated(ctx: &GpuContext, n: usize, k: usize, rows: &[usize], quick: bool) {
    println!("adapter: {}", ctx.describe());
    println!("down projection: weight {n} x {k}, f16, SiLU; {CALLS_PER_SUBMIT} calls per submit");
    println!();
    let wv: Vec<f32> = (0..n * k)
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let w = Weight::from_f32(ctx, "w", &wv, n, k, WeightDtype::F16).expect("weight");
    let gu = ctx
        .upload("gate up", &vec![0.5f32; 2 * MAX_ROWS * k])
        .expect("gate up");
    let act = ctx
        .storage_buffer("act", (MAX_ROWS * k * 4) as u64)
        .expect("act");
    let y = ctx
        .storage_buffer("y", (MAX_ROWS * n * 4) as u64)
        .expect("y");
    println!("| rows | kernel | silu_mul + matmul (ms) | fused (ms) | separate / fused |");
    println!("|---:|---|---:|---:|---:|");
    for &m in rows.iter().filter(|&&m| (1..=MAX_ROWS).contains(&m)) {
        let plan = MatmulPlan::choose(ctx, &[k]);
        let kernel = plan.kernel(m);
        let (s, f) = side_by_side(quick, |fused| {
            let mut b = Batch::new(ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                if fused {
                    let call = Matmul::new(&gu, &w, &y, m).gated(Activation::Silu);
                    matmul(&mut b, &plan, &call).expect("gated matmul");
                } else {
                    silu_mul::gated_rows(&mut b, Activation::Silu, &gu, &act, m, k)
                        .expect("silu_mul");
                    matmul(&mut b, &plan, &Matmul::new(&act, &w, &y, m)).expect("matmul");
                }
            }
            per_call(ctx, b)
        });
        println!(
            "| {m} | {kernel:?} | {:.3} | {:.3} | {:.2} |",
            s * 1e3,
            f * 1e3,
            s / f
        );
    }
}

/// Median seconds per call of `once(v)` for each of `variants`, measured in turns so that
/// the machine's drift hits all of them: one warm-up call each, then rounds until the time
/// budget is spent (at least 3, at most 50).
fn alternating<V: Copy>(quick: bool, variants: &[V], once: impl Fn(V) -> f64) -> Vec<f64> {
    variants.iter().for_each(|&v| {
        once(v);
    });
    let budget = Duration::from_millis(if quick { 300 } else { 3000 });
    let start = Instant::now();
    let mut times = vec![Vec::new(); variants.len()];
    while times[0].len() < 3 || (start.elapsed() < budget && times[0].len() < 50) {
        for (t, &v) in times.iter_mut().zip(variants) {
            t.push(once(v));
        }
    }
    times.into_iter().map(median).collect()
}

/// [`alternating`] of the separate (`false`) and fused (`true`) ways.
fn side_by_side(quick: bool, once: impl Fn(bool) -> f64) -> (f64, f64) {
    let med = alternating(quick, &[false, true], once);
    (med[0], med[1])
}

/// The `--normed` table: per row count, the median time of a projection that reads a
/// separate norm pass's output and of one that norms its input as it reads.
fn normed(ctx: &GpuContext, n: usize, k: usize, rows: &[usize], quick: bool) {
    println!("adapter: {}", ctx.describe());
    println!(
        "normed projection: weight {n} x {k}, f16, bf16 norm; {CALLS_PER_SUBMIT} calls per submit"
    );
    println!();
    let wv: Vec<f32> = (0..n * k)
        .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
        .collect();
    let w = Weight::from_f32(ctx, "w", &wv, n, k, WeightDtype::F16).expect("weight");
    let gv: Vec<f32> = (0..k).map(|i| 1.0 + (i % 7) as f32 * 0.1).collect();
    let nw = Weight::from_f32(ctx, "norm", &gv, 1, k, WeightDtype::BF16).expect("norm");
    let xv: Vec<f32> = (0..MAX_ROWS * k)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.1)
        .collect();
    let x = ctx.upload("x", &xv).expect("x");
    let h = ctx
        .storage_buffer("h", (MAX_ROWS * k * 4) as u64)
        .expect("h");
    let y = ctx
        .storage_buffer("y", (MAX_ROWS * n * 4) as u64)
        .expect("y");
    let norm = Norm {
        weight: &nw,
        eps: 1e-5,
    };
    println!("| rows | kernel | rms_norm + matmul (ms) | fused (ms) | separate / fused |");
    println!("|---:|---|---:|---:|---:|");
    for &m in rows.iter().filter(|&&m| (1..=MAX_ROWS).contains(&m)) {
        let plan = MatmulPlan::choose(ctx, &[k]);
        let kernel = plan.kernel(m);
        let norm_kernel = RmsNormKernel::choose(ctx, k);
        let (s, f) = side_by_side(quick, |fused| {
            let mut b = Batch::new(ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                if fused {
                    let call = Matmul::new(&x, &w, &y, m).normed(norm);
                    matmul(&mut b, &plan, &call).expect("normed matmul");
                } else {
                    rms_norm::rms_norm(&mut b, norm_kernel, &x, &nw, &h, m, 1e-5)
                        .expect("rms_norm");
                    matmul(&mut b, &plan, &Matmul::new(&h, &w, &y, m)).expect("matmul");
                }
            }
            per_call(ctx, b)
        });
        println!(
            "| {m} | {kernel:?} | {:.3} | {:.3} | {:.2} |",
            s * 1e3,
            f * 1e3,
            s / f
        );
    }
}

/// The `--argmax` table: per row count, the median time of each arg-max kernel over rows of
/// `width` logits, the kernels alternating.
fn argmax(ctx: &GpuContext, width: usize, rows: &[usize], quick: bool) {
    const KERNELS: [ArgmaxKernel; 3] = [
        ArgmaxKernel::Workgroup,
        ArgmaxKernel::Lanes,
        ArgmaxKernel::Split,
    ];
    println!("adapter: {}", ctx.describe());
    println!(
        "arg-max over rows of {width} logits; {CALLS_PER_SUBMIT} calls per submit; this adapter's \
         choice: {:?}",
        ArgmaxKernel::choose(ctx)
    );
    println!();
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let lv: Vec<f32> = (0..max_rows * width)
        .map(|i| ((i * 7919 % 10007) as f32) * 1e-3)
        .collect();
    let logits = ctx.upload("logits", &lv).expect("logits");
    let out = ctx
        .storage_buffer("out", (max_rows * 8) as u64)
        .expect("out");
    let words = argmax_partials_len(max_rows, width);
    let partials = ctx
        .storage_buffer("partials", (words * 4) as u64)
        .expect("partials");
    let cols: Vec<String> = KERNELS.iter().map(|k| format!("{k:?} (ms)")).collect();
    println!("| rows | {} |", cols.join(" | "));
    println!("|---:|{}", "---:|".repeat(KERNELS.len()));
    for &m in rows {
        let once = |kernel: ArgmaxKernel| {
            let mut b = Batch::new(ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                pagellm::internals::kernels::logits::argmax(
                    &mut b,
                    kernel,
                    &logits,
                    &out,
                    Some(&partials),
                    m,
                    width,
                )
                .expect("argmax");
            }
            per_call(ctx, b)
        };
        let cells: Vec<String> = alternating(quick, &KERNELS, once)
            .into_iter()
            .map(|t| format!("{:.3}", t * 1e3))
            .collect();
        println!("| {m} | {} |", cells.join(" | "));
    }
}

/// Seconds per call of the `CALLS_PER_SUBMIT` calls recorded in `b`: its submit and the
/// wait for the adapter.
fn per_call(ctx: &GpuContext, b: Batch<'_>) -> f64 {
    let t = Instant::now();
    b.submit().expect("submit");
    ctx.wait().expect("wait");
    t.elapsed().as_secs_f64() / CALLS_PER_SUBMIT as f64
}
