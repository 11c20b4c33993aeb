//! `--peak`: what the adapter can do at best, measured with kernels that do nothing else,
//! side by side in one run with the projection kernels the plan picks, as bounds for their
//! figures. GFLOP/s counts a multiply and an add as two, however the compiler emits them.
//!
//! - `registers, N chains`: N independent chains `a = a * m + c` per invocation, every
//!   operand in registers (written as the projection kernels write their sums); `fma()`:
//!   the same with WGSL's fused multiply-add. The adapter's arithmetic rate.
//! - `weights, 1 row`: per step, each invocation loads 16 bytes (8 f16 weights) from an
//!   address of its own, as a column kernel reads a weight row, converts them, and does the
//!   8 multiply-adds of a one-row pass (one per weight): the rate of weight reads.
//! - `weights, 8 rows x 2 columns`: two such loads a step (two columns) and the 128
//!   multiply-adds of an 8-row pass over them (sixteen chains, each weight used eight
//!   times): the bound of the 8-row column kernels, less their reads of x.
//! - `weights and x, R rows x C columns`: a pass with x read too, summed as the column
//!   kernels sum (`acc += x * w`, each x value used by every column): x by subgroup
//!   broadcast (the subgroup kernel's way), by every lane loading the same storage words
//!   (the vector kernel's), or the same uniform-buffer words; and other row and column
//!   counts than the kernels' 8 x 2.
//!
//! Then the plan's kernel on the projections of a tiny15m layer and its LM head (f16), at
//! 16 and 128 rows, and each rate as a share of the best register rate.
//!
//! Each invocation runs `steps` steps; 512 workgroups of 64 invocations; every figure is
//! the fastest of its runs.

use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::matmul::{matmul, Matmul};
use pagellm::internals::kernels::plan::MatmulPlan;
use pagellm::internals::kernels::{Weight, WeightDtype};
use pagellm::GpuContext;
use std::time::Instant;

/// What a microkernel does each step.
#[derive(Clone, Copy)]
enum Step {
    /// `chains` chains of multiply-adds on registers, fused with `fma()` or not.
    Registers { chains: usize, fused: bool },
    /// One 16-byte weight load, 8 multiply-adds.
    OneRow,
    /// Two 16-byte weight loads, 128 multiply-adds.
    EightRows,
    /// A pass of `rows` rows (at most 8) and `cols` columns with x read as well: per step
    /// `cols` 16-byte weight loads and the rows' 8 x values each, the kernel's sums (`acc +=
    /// x * w`), each x value used by every column.
    Pass {
        rows: usize,
        cols: usize,
        read: XRead,
    },
}

/// Where `Step::Pass` reads x.
#[derive(Clone, Copy)]
enum XRead {
    /// As the subgroup column kernel: lane l of each 8 loads row l's two 16-byte words, and
    /// row r's are broadcast from lane r.
    Broadcast,
    /// Every lane loads the same words of a storage buffer (as the vector column kernel).
    Storage,
    /// Every lane loads the same words of a uniform buffer.
    Uniform,
}

impl Step {
    fn name(self) -> String {
        match self {
            Step::Registers { chains, fused } => format!(
                "registers, {chains} chains{}",
                if fused { ", fma()" } else { "" }
            ),
            Step::OneRow => "weights, 1 row".into(),
            Step::EightRows => "weights, 8 rows x 2 columns".into(),
            Step::Pass { rows, cols, read } => format!(
                "weights and x, {rows} rows x {cols} columns, x by {}",
                match read {
                    XRead::Broadcast => "subgroup broadcast",
                    XRead::Storage => "the same storage load",
                    XRead::Uniform => "the same uniform load",
                }
            ),
        }
    }

    /// (multiply-adds, weight bytes read) per step and invocation.
    fn work(self) -> (u64, u64) {
        match self {
            Step::Registers { chains, .. } => (chains as u64, 0),
            Step::OneRow => (8, 16),
            Step::EightRows => (128, 32),
            Step::Pass { rows, cols, .. } => (8 * (rows * cols) as u64, 16 * cols as u64),
        }
    }

    /// The kernel's WGSL: every chain a variable of its own and every step spelled out
    /// (arrays indexed in loops may live in memory on a CPU adapter, which would measure
    /// that instead).
    fn shader(self) -> String {
        let lines = |v: Vec<String>| v.join("\n");
        let chains = match self {
            Step::Registers { chains, .. } => chains,
            Step::Pass { rows, cols, .. } => rows * cols,
            _ => 16,
        };
        let decl = lines(
            (0..chains)
                .map(|i| format!("    var a{i} = f32(g.x + {i}u) * 1e-6;"))
                .collect(),
        );
        let sum = lines((0..chains).map(|i| format!("    sum += a{i};")).collect());
        let body = match self {
            Step::Registers { fused, .. } => lines(
                (0..chains)
                    .map(|i| match fused {
                        true => format!("        a{i} = fma(a{i}, m, c);"),
                        false => format!("        a{i} = a{i} * m + c;"),
                    })
                    .collect(),
            ),
            Step::OneRow => {
                let mut v = vec!["        let b = unpack8(w[(base + s) % len]);".to_string()];
                v.extend((0..8).map(|i| format!("        a{i} = a{i} * b[{i}] + c;")));
                lines(v)
            }
            Step::EightRows => {
                let mut v = vec![
                    "        let b = unpack8(w[(base + s) % len]);".to_string(),
                    "        let b2 = unpack8(w[(base2 + s) % len]);".to_string(),
                ];
                for k in 0..8 {
                    for r in 0..8 {
                        v.push(format!("        a{r} = a{r} * b[{k}] + c;"));
                        v.push(format!("        a{} = a{} * b2[{k}] + c;", r + 8, r + 8));
                    }
                }
                lines(v)
            }
            Step::Pass { rows, cols, read } => {
                let mut v: Vec<String> = (0..cols)
                    .map(|c| {
                        format!(
                            "        let b{c} = unpack8(w[(base + {}u + s) % len]);",
                            7 * c
                        )
                    })
                    .collect();
                // Row r's words: 2 (s % 32) and the next of a 64-word row.
                v.push("        let xi = 2u * (s % 32u);".into());
                if let XRead::Broadcast = read {
                    v.push("        let h0 = xs[(lane & 7u) * 64u + xi];".into());
                    v.push("        let h1 = xs[(lane & 7u) * 64u + xi + 1u];".into());
                }
                for r in 0..rows {
                    for (part, word) in [("a", 0), ("b", 1)] {
                        v.push(match read {
                            XRead::Broadcast => {
                                format!(
                                    "        let x{part}{r} = subgroupBroadcast(h{word}, {r}u);"
                                )
                            }
                            XRead::Storage => {
                                format!("        let x{part}{r} = xs[{r}u * 64u + xi + {word}u];")
                            }
                            XRead::Uniform => {
                                format!("        let x{part}{r} = xu[{r}u * 64u + xi + {word}u];")
                            }
                        });
                    }
                    for c in 0..cols {
                        let acc = r * cols + c;
                        for i in 0..8 {
                            let part = if i < 4 { "a" } else { "b" };
                            let comp = ["x", "y", "z", "w"][i % 4];
                            v.push(format!("        a{acc} += x{part}{r}.{comp} * b{c}[{i}];"));
                        }
                    }
                }
                lines(v)
            }
        };
        let (x_decl, lane_arg) = match self {
            Step::Pass {
                read: XRead::Uniform,
                ..
            } => (
                "@group(0) @binding(3) var<uniform> xu: array<vec4<f32>, 512>;",
                "",
            ),
            Step::Pass {
                read: XRead::Broadcast,
                ..
            } => (
                "@group(0) @binding(3) var<storage, read> xs: array<vec4<f32>>;",
                ", @builtin(subgroup_invocation_id) lane: u32",
            ),
            Step::Pass {
                read: XRead::Storage,
                ..
            } => (
                "@group(0) @binding(3) var<storage, read> xs: array<vec4<f32>>;",
                "",
            ),
            _ => ("", ""),
        };
        format!(
            r#"
struct P {{ steps: u32, stride: u32, m: f32, c: f32 }}
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> p: P;
{x_decl}

fn unpack8(v: vec4<u32>) -> array<f32, 8> {{
    let a = unpack2x16float(v.x);
    let b = unpack2x16float(v.y);
    let c = unpack2x16float(v.z);
    let d = unpack2x16float(v.w);
    return array<f32, 8>(a.x, a.y, b.x, b.y, c.x, c.y, d.x, d.y);
}}

@compute @workgroup_size(64)
fn peak(@builtin(global_invocation_id) g: vec3<u32>{lane_arg}) {{
{decl}
    let m = p.m;
    let c = p.c;
    let len = arrayLength(&w);
    let base = (g.x * p.stride) % len;
    let base2 = (g.x * p.stride + 7u) % len;
    for (var s = 0u; s < p.steps; s++) {{
{body}
    }}
    var sum = 0.0;
{sum}
    out[g.x] = sum;
}}
"#
        )
    }
}

const WORKGROUPS: u32 = 512;

/// The fastest of `runs` calls of `once` after one untimed call (which compiles), in
/// seconds: a bound is a best case, and on a shared 2-core machine the median moves by
/// up to 1.5x between runs while the fastest moves less.
fn timed(runs: usize, once: impl Fn() -> f64) -> f64 {
    once();
    (0..runs).map(|_| once()).fold(f64::INFINITY, f64::min)
}

fn pass(rows: usize, cols: usize, read: XRead) -> Step {
    Step::Pass { rows, cols, read }
}

/// Prints the microkernels' rates, then the plan's projections' against them.
pub fn peak(ctx: &GpuContext, quick: bool) {
    println!("adapter: {}", ctx.describe());
    println!("{WORKGROUPS} workgroups of 64 invocations; GFLOP/s = 2 x multiply-adds / time");
    println!();
    let runs = if quick { 3 } else { 15 };
    let dev = &ctx.device;
    // 4 MiB of f16 weights, each invocation's row 97 words from the last one's.
    let words = 1usize << 18;
    let data: Vec<u32> = (0..words * 4)
        .map(|i| u32::from(half::f16::from_f32(1.0 - (i % 13) as f32 * 1e-4).to_bits()) * 0x10001)
        .collect();
    let w = ctx.upload("w", &data).expect("w");
    let out = ctx
        .storage_buffer("out", u64::from(WORKGROUPS) * 64 * 4)
        .expect("out");
    // Eight rows of 256 x values (8 KiB), in a storage and a uniform buffer.
    let xv: Vec<f32> = (0..8 * 256).map(|i| 1.0 - (i % 7) as f32 * 1e-3).collect();
    let xs = ctx.upload("xs", &xv).expect("xs");
    let xu = {
        use wgpu::util::DeviceExt;
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("xu"),
            contents: bytemuck::cast_slice(&xv),
            usage: wgpu::BufferUsages::UNIFORM,
        })
    };
    println!(
        "| kernel | steps per invocation | multiply-adds per step | ms | GFLOP/s | weight GB/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut best: f64 = 0.0;
    for step in [
        Step::Registers {
            chains: 8,
            fused: false,
        },
        Step::Registers {
            chains: 16,
            fused: false,
        },
        Step::Registers {
            chains: 24,
            fused: false,
        },
        Step::Registers {
            chains: 32,
            fused: false,
        },
        Step::Registers {
            chains: 48,
            fused: false,
        },
        Step::Registers {
            chains: 32,
            fused: true,
        },
        Step::OneRow,
        Step::EightRows,
        pass(8, 2, XRead::Broadcast),
        pass(8, 2, XRead::Storage),
        pass(8, 2, XRead::Uniform),
        pass(8, 1, XRead::Broadcast),
        pass(4, 4, XRead::Broadcast),
        pass(8, 3, XRead::Broadcast),
        pass(8, 4, XRead::Broadcast),
    ] {
        let broadcast = matches!(
            step,
            Step::Pass {
                read: XRead::Broadcast,
                ..
            }
        );
        if broadcast && !ctx.caps.subgroups {
            continue;
        }
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("peak"),
            source: wgpu::ShaderSource::Wgsl(step.shader().into()),
        });
        let steps: u32 = match step {
            Step::Registers { .. } => 2048,
            _ => 256,
        };
        let params: [u32; 4] = [steps, 97, 1.0f32.to_bits(), 1e-7f32.to_bits()];
        let pbuf = ctx.upload("p", &params).expect("params");
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("peak"),
            layout: None,
            module: &module,
            entry_point: Some("peak"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("peak"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: w.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: out.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: pbuf.as_entire_binding(),
                },
            ]
            .into_iter()
            .chain(match step {
                Step::Pass {
                    read: XRead::Uniform,
                    ..
                } => Some(wgpu::BindGroupEntry {
                    binding: 3,
                    resource: xu.as_entire_binding(),
                }),
                Step::Pass { .. } => Some(wgpu::BindGroupEntry {
                    binding: 3,
                    resource: xs.as_entire_binding(),
                }),
                _ => None,
            })
            .collect::<Vec<_>>(),
        });
        let t = timed(runs, || {
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(WORKGROUPS, 1, 1);
            }
            let t = Instant::now();
            ctx.queue.submit([enc.finish()]);
            ctx.wait().expect("wait");
            t.elapsed().as_secs_f64()
        });
        let (madds, bytes) = step.work();
        let invocations = u64::from(WORKGROUPS) * 64 * u64::from(steps);
        let gflops = 2.0 * (invocations * madds) as f64 / t / 1e9;
        if matches!(step, Step::Registers { .. }) {
            best = best.max(gflops);
        }
        let gbs = match bytes {
            0 => "-".to_string(),
            b => format!("{:.1}", (invocations * b) as f64 / t / 1e9),
        };
        println!(
            "| {} | {steps} | {madds} | {:.2} | {gflops:.1} | {gbs} |",
            step.name(),
            t * 1e3
        );
    }
    println!();
    println!(
        "The plan's kernel on f16 weights, against the best register rate ({best:.1} GFLOP/s):"
    );
    println!();
    println!("| weight (n x k) | rows | ms | GFLOP/s | share of the register rate |");
    println!("|---|---:|---:|---:|---:|");
    let plan = MatmulPlan::choose(ctx, &[8]);
    for (name, n, k) in [
        ("q k v", 864, 288),
        ("o", 288, 288),
        ("gate up", 1536, 288),
        ("down", 288, 768),
        ("LM head", 32000, 288),
    ] {
        let wv: Vec<f32> = (0..n * k)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect();
        let w = Weight::from_f32(ctx, "w", &wv, n, k, WeightDtype::F16).expect("weight");
        let x = ctx.upload("x", &vec![0.5f32; 128 * k]).expect("x");
        let y = ctx.storage_buffer("y", (128 * n * 4) as u64).expect("y");
        for m in [16, 128] {
            let t = timed(runs, || {
                let mut b = Batch::new(ctx, "peak");
                matmul(&mut b, &plan, &Matmul::new(&x, &w, &y, m)).expect("matmul");
                let t = Instant::now();
                b.submit().expect("submit");
                ctx.wait().expect("wait");
                t.elapsed().as_secs_f64()
            });
            let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
            println!(
                "| tiny15m {name} ({n} x {k}) | {m} | {:.2} | {gflops:.1} | {:.0}% |",
                t * 1e3,
                100.0 * gflops / best
            );
        }
    }
}
