//! The projection kernels side by side, by row count: what each kernel costs and what one
//! more row in a step costs (how much batching buys on this adapter).
//!
//! One f16 weight of Llama-3.2-1B MLP shape (4096 x 1024 by default; `--n N --k K` to
//! change), `matmul_with` called for m = 1 .. 256 rows with every kernel the adapter supports
//! (`MatmulKernel`), alternating kernels within a row count so drift hits all of them. Each
//! figure is the median wall time of a submit of several calls, waited on. The last
//! columns follow the kernel `matmul` picks on this adapter: rows per second relative to one
//! row, and arithmetic rate (2·m·n·k flops).
//!
//! With `--gated`, a down projection's two ways of taking the MLP's gated activation, side
//! by side with the kernel `matmul` picks: a `silu_mul` pass into a buffer and the matmul
//! reading it, against the matmul reading the gate-up output and applying the activation
//! itself (`matmul_gated`); `--n` is then the hidden size and `--k` the intermediate size.
//!
//! Run: `cargo bench --bench matmul` (adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`).
//! `-- --quick` runs fewer repetitions; `-- --rows 1,8,32` picks row counts.

use pagellm::gpu::Batch;
use pagellm::kernels::matmul::{matmul_gated_with, matmul_with, MatmulKernel, Output};
use pagellm::kernels::{silu_mul, Weight, WeightDtype};
use pagellm::model::arch::Activation;
use pagellm::GpuContext;
use std::time::{Duration, Instant};

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
        let once = |kernel: MatmulKernel| {
            let mut b = Batch::new(&ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                matmul_with(&mut b, kernel, &x, &w, None, &y, m, Output::Overwrite)
                    .expect("matmul");
            }
            let t = Instant::now();
            b.submit().expect("submit");
            ctx.wait().expect("wait");
            t.elapsed().as_secs_f64() / CALLS_PER_SUBMIT as f64
        };
        kernels.iter().for_each(|&kern| {
            once(kern);
        });
        let budget = Duration::from_millis(if quick { 300 } else { 3000 });
        let start = Instant::now();
        let mut times = vec![Vec::new(); kernels.len()];
        while times[0].len() < 3 || (start.elapsed() < budget && times[0].len() < 50) {
            for (t, &kern) in times.iter_mut().zip(&kernels) {
                t.push(once(kern));
            }
        }
        let med: Vec<f64> = times.into_iter().map(median).collect();
        let chosen = MatmulKernel::choose(&ctx, m, k);
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
        let kernel = MatmulKernel::choose(ctx, m, k);
        let once = |fused: bool| {
            let mut b = Batch::new(ctx, "bench");
            for _ in 0..CALLS_PER_SUBMIT {
                let out = Output::Overwrite;
                if fused {
                    matmul_gated_with(&mut b, kernel, &gu, Activation::Silu, &w, None, &y, m, out)
                        .expect("gated matmul");
                } else {
                    silu_mul::gated_rows(&mut b, Activation::Silu, &gu, &act, m, k)
                        .expect("silu_mul");
                    matmul_with(&mut b, kernel, &act, &w, None, &y, m, out).expect("matmul");
                }
            }
            let t = Instant::now();
            b.submit().expect("submit");
            ctx.wait().expect("wait");
            t.elapsed().as_secs_f64() / CALLS_PER_SUBMIT as f64
        };
        once(false);
        once(true);
        let budget = Duration::from_millis(if quick { 300 } else { 3000 });
        let start = Instant::now();
        let (mut sep, mut fus) = (Vec::new(), Vec::new());
        while sep.len() < 3 || (start.elapsed() < budget && sep.len() < 50) {
            sep.push(once(false));
            fus.push(once(true));
        }
        let (s, f) = (median(sep), median(fus));
        println!(
            "| {m} | {kernel:?} | {:.3} | {:.3} | {:.2} |",
            s * 1e3,
            f * 1e3,
            s / f
        );
    }
}
