//! Host cost of recording a dispatch: what every kernel launch costs the CPU before the GPU
//! sees it (pipeline lookup, parameter block, bind group, its commands in the batch's
//! shared compute pass). An engine step of an L-layer model records about 13·L + 5
//! dispatches, so on a fast GPU this bounds how small a step can get.
//!
//! 1000 dispatches of the `add` kernel on 1024 floats are recorded into one batch and
//! submitted; reported per dispatch: the recording time, and submit + wait (the adapter's
//! own per-dispatch cost plus the work). Median of 9 repetitions after a warm-up.
//!
//! Run: `cargo bench --bench dispatch` (adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`).

use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::add::add;
use pagellm::GpuContext;
use std::time::Instant;

const DISPATCHES: usize = 1000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ctx = GpuContext::from_env().expect("GPU context");
    println!("adapter: {}", ctx.describe());
    let a = ctx.upload("a", &vec![1.0f32; 1024]).expect("a");
    let b = ctx.upload("b", &vec![1.0f32; 1024]).expect("b");
    let (mut record, mut run) = (Vec::new(), Vec::new());
    for rep in 0..10 {
        let t = Instant::now();
        let mut batch = Batch::new(&ctx, "dispatch bench");
        for _ in 0..DISPATCHES {
            add(&mut batch, &a, &b, 1024).expect("add");
        }
        let recorded = t.elapsed().as_secs_f64();
        batch.submit().expect("submit");
        ctx.wait().expect("wait");
        let total = t.elapsed().as_secs_f64();
        if rep > 0 {
            record.push(recorded / DISPATCHES as f64);
            run.push((total - recorded) / DISPATCHES as f64);
        }
    }
    println!();
    println!("| per dispatch | µs |");
    println!("|---|---:|");
    println!("| recording (host) | {:.2} |", median(record) * 1e6);
    println!("| submit + wait (adapter) | {:.2} |", median(run) * 1e6);
}
