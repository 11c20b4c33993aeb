//! Block-format weights on the GPU (shaders/weight_blocks.wgsl) against the plain-Rust
//! reference and llama.cpp's `gguf` package:
//!
//! - every block the fixtures hold (random payloads, zero, largest, subnormal and negative
//!   scales, negative mins) decodes on the GPU to the package's dequantized values, through
//!   the embedding gather and through every matmul kernel (a product with the identity reads
//!   each weight once, times one);
//! - matmuls over seeded quantized weights agree with the reference product of the
//!   dequantized weights, and are bitwise the f32 kernels' result on those dequantized
//!   weights, for every kernel, row count, bias, residual, fused norm and gated input, and
//!   weights split into chunks (so a quantized model computes exactly what its dequantized
//!   f32 copy computes);
//! - malformed uploads are errors.

mod common;
use common::quant_fixture::load;
use common::*;
use pagellm::internals::gpu::{Batch, GpuContext};
use pagellm::internals::kernels::matmul::{matmul, Matmul, MatmulKernel, Norm, Output};
use pagellm::internals::kernels::plan::MatmulPlan;
use pagellm::internals::kernels::{self, Weight, WeightDtype};
use pagellm::internals::nn::Activation;
use pagellm::internals::reference as r;

const KERNELS: [MatmulKernel; 4] = [
    MatmulKernel::Tiled,
    MatmulKernel::Columns,
    MatmulKernel::ColumnsVec,
    MatmulKernel::ColumnsSubgroup,
];

fn fixture_name(dtype: WeightDtype) -> String {
    dtype.name().to_lowercase()
}

/// `got` equals `want` element for element as floats (so +0 and -0 are equal: a sum that
/// starts at +0 loses a weight's negative zero), a NaN where `want` has one.
fn assert_same_values(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let same = |g: f32, w: f32| g == w || (g.is_nan() && w.is_nan());
    if let Some(i) = (0..got.len()).find(|&i| !same(got[i], want[i])) {
        panic!("{what}: element {i} is {:e}, want {:e}", got[i], want[i]);
    }
}

/// Runs `call` with `plan` and reads its `[m, n]` output.
fn run(
    ctx: &GpuContext,
    plan: &kernels::plan::MatmulPlan,
    call: &Matmul,
    y: &wgpu::Buffer,
    len: usize,
) -> Vec<f32> {
    let mut b = Batch::new(ctx, "t");
    matmul(&mut b, plan, call).unwrap();
    b.submit().unwrap();
    read_f32(ctx, y, len)
}

#[test]
fn the_gpu_decodes_every_fixture_block_as_the_gguf_package_does() {
    for ctx in contexts() {
        for dtype in WeightDtype::BLOCKS {
            let mut files = vec![format!("{}_raw.bin", fixture_name(dtype))];
            if dtype.quantize_matches_ggml() {
                files.push(format!("{}_quant.bin", fixture_name(dtype)));
            }
            for file in files {
                let case = load(&file);
                assert_eq!(case.ty, dtype, "{file}");
                // One block per row, and rows split over chunks of three rows.
                let k = dtype.block_elems();
                let n = case.expected.len() / k;
                let limit = (3 * dtype.gpu_row_bytes(k) + 16) as u64;
                let w =
                    Weight::upload_with_limit(ctx, "w", &case.bytes, n, k, dtype, limit).unwrap();
                assert!(w.chunks.len() > 1, "{file}: not chunked");
                let what = format!("{file} on {}", backend(ctx));

                let ids: Vec<u32> = (0..n as u32).rev().collect();
                let ids_b = ctx.upload("ids", &ids).unwrap();
                let out = ctx.storage_buffer("out", (n * k * 4) as u64).unwrap();
                let mut b = Batch::new(ctx, "t");
                kernels::embedding::embedding(&mut b, &w, &ids_b, &out, n).unwrap();
                b.submit().unwrap();
                let want = r::embedding(&case.expected, k, &ids);
                assert_same_values(
                    &format!("embedding of {what}"),
                    &read_f32(ctx, &out, n * k),
                    &want,
                );

                // The identity times the weight: y[r, c] = w[c, r]; a weight row holding an
                // infinity (MXFP4's largest exponent) gives NaNs in its whole column, as
                // infinity times zero is.
                let eye: Vec<f32> = (0..k * k).map(|i| f32::from(i % (k + 1) == 0)).collect();
                let x = ctx.upload("x", &eye).unwrap();
                let y = ctx.storage_buffer("y", (k * n * 4) as u64).unwrap();
                let finite_row = |c: usize| {
                    case.expected[c * k..(c + 1) * k]
                        .iter()
                        .all(|v| v.is_finite())
                };
                let want: Vec<f32> = (0..k * n)
                    .map(|i| {
                        let c = i % n;
                        if finite_row(c) {
                            case.expected[c * k + i / n]
                        } else {
                            f32::NAN
                        }
                    })
                    .collect();
                for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                    let got = run(
                        ctx,
                        &mm_only(ctx, kernel),
                        &Matmul::new(&x, &w, &y, k),
                        &y,
                        k * n,
                    );
                    assert_same_values(
                        &format!("{kernel:?} identity product of {what}"),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

/// One seeded product over a block-format weight: checked against the reference, and
/// bitwise against the same kernel on an f32 weight holding the dequantized values, for
/// every kernel.
struct Case {
    m: usize,
    n: usize,
    k: usize,
    bias: bool,
    accumulate: bool,
    chunk_rows: Option<usize>,
}

fn check_product(ctx: &GpuContext, dtype: WeightDtype, seed: u64, c: &Case) {
    let Case { m, n, k, .. } = *c;
    let mut g = rng(seed);
    let x = randn(&mut g, m * k, 1.0);
    let wv = randn(&mut g, n * k, 0.5);
    let bias = randn(&mut g, n, 1.0);
    let y0 = randn(&mut g, m * n, 1.0);
    let deq = rounded(&wv, dtype);
    let limit = c
        .chunk_rows
        .map_or(u64::MAX, |rows| (rows * dtype.gpu_row_bytes(k) + 16) as u64);
    let w = Weight::from_f32(ctx, "w", &wv, n, k, dtype).unwrap();
    let w = if c.chunk_rows.is_some() {
        let bytes = kernels::weight::encode(&wv, dtype).unwrap();
        Weight::upload_with_limit(ctx, "w", &bytes, n, k, dtype, limit).unwrap()
    } else {
        w
    };
    let w32 = Weight::from_f32(ctx, "w32", &deq, n, k, WeightDtype::F32).unwrap();
    let (xb, bb) = (
        ctx.upload("x", &x).unwrap(),
        ctx.upload("bias", &bias).unwrap(),
    );
    let out = if c.accumulate {
        Output::Accumulate
    } else {
        Output::Overwrite
    };
    let mut want = r::matmul(&x, &deq, c.bias.then_some(&bias[..]), m, n, k);
    if c.accumulate {
        want.iter_mut().zip(&y0).for_each(|(a, b)| *a += b);
    }
    let mut first: Option<Vec<f32>> = None;
    // Also with four columns an invocation (WIDE) in every pass, which CPU adapters use for
    // wide weights only.
    let plans = KERNELS
        .into_iter()
        .filter(|kern| kern.supports(ctx, k))
        .flat_map(|kernel| {
            let wide = MatmulPlan {
                wide_from: Some(1),
                wide_passes: true,
                ..mm_only(ctx, kernel)
            };
            let wide = wide.wide(kernel, m, n).then_some(wide);
            std::iter::once((kernel, mm_only(ctx, kernel))).chain(wide.map(|w| (kernel, w)))
        });
    for (kernel, plan) in plans {
        let what = format!(
            "{dtype:?} {kernel:?} wide={} m={m} n={n} k={k} bias={} acc={} chunks={} on {}",
            plan.wide(kernel, m, n),
            c.bias,
            c.accumulate,
            w.chunks.len(),
            backend(ctx)
        );
        let mut results = Vec::new();
        for weight in [&w, &w32] {
            let yb = ctx.upload("y", &y0).unwrap();
            let call = Matmul::new(&xb, weight, &yb, m)
                .bias(c.bias.then_some(&bb))
                .output(out);
            results.push(run(ctx, &plan, &call, &yb, m * n));
        }
        assert_close(&what, &results[0], &want, 1e-4 * (k as f32).sqrt(), 1e-5);
        assert_eq!(
            bits(&results[0]),
            bits(&results[1]),
            "{what}: not the f32 kernel's bits"
        );
        match &first {
            None => first = Some(results.swap_remove(0)),
            Some(f) => assert_eq!(
                bits(f),
                bits(&results[0]),
                "{what}: not the first kernel's bits"
            ),
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn block_weight_products_are_the_dequantized_weights_products_in_every_kernel() {
    let cases = [
        Case {
            m: 1,
            n: 300,
            k: 512,
            bias: false,
            accumulate: false,
            chunk_rows: None,
        },
        Case {
            m: 9,
            n: 65,
            k: 512,
            bias: true,
            accumulate: true,
            chunk_rows: Some(24),
        },
        Case {
            m: 70,
            n: 33,
            k: 768,
            bias: false,
            accumulate: true,
            chunk_rows: None,
        },
        // Rows of eleven 32-element blocks: two groups of four and a shorter one of three
        // (the formats of 256-element blocks skip it).
        Case {
            m: 3,
            n: 40,
            k: 352,
            bias: true,
            accumulate: false,
            chunk_rows: Some(7),
        },
    ];
    for ctx in contexts() {
        for (i, dtype) in WeightDtype::BLOCKS.into_iter().enumerate() {
            for (j, c) in cases.iter().enumerate() {
                if c.k % dtype.block_elems() != 0 {
                    continue;
                }
                check_product(ctx, dtype, 100 * i as u64 + j as u64, c);
            }
        }
    }
}

#[test]
fn normed_and_gated_inputs_read_block_weights_as_f32_ones() {
    // The fused RMSNorm and gated activation read x; the weight side is the same code, so
    // each block format gives bitwise what the f32 weight of its dequantized values gives.
    for ctx in contexts() {
        let (n, k) = (96, 256);
        for (i, dtype) in [WeightDtype::Q8_0, WeightDtype::Q4_K, WeightDtype::Q6_K]
            .into_iter()
            .enumerate()
        {
            let mut g = rng(500 + i as u64);
            let wv = randn(&mut g, n * k, 0.5);
            let w = Weight::from_f32(ctx, "w", &wv, n, k, dtype).unwrap();
            let w32 =
                Weight::from_f32(ctx, "w32", &rounded(&wv, dtype), n, k, WeightDtype::F32).unwrap();
            let norm_w =
                Weight::from_f32(ctx, "norm", &randn(&mut g, k, 1.0), 1, k, WeightDtype::F32)
                    .unwrap();
            for m in [1, 5, 70] {
                let x = ctx.upload("x", &randn(&mut g, 2 * m * k, 1.0)).unwrap();
                let y = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
                for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                    let plan = mm_only(ctx, kernel);
                    let norm = Norm {
                        weight: &norm_w,
                        eps: 1e-5,
                    };
                    for gated in [false, true] {
                        let got: Vec<Vec<u32>> = [&w, &w32]
                            .iter()
                            .map(|weight| {
                                let call = Matmul::new(&x, weight, &y, m);
                                let call = if gated {
                                    call.gated(Activation::Silu)
                                } else {
                                    call.normed(norm)
                                };
                                bits(&run(ctx, &plan, &call, &y, m * n))
                            })
                            .collect();
                        assert_eq!(
                            got[0],
                            got[1],
                            "{dtype:?} {kernel:?} m={m} gated={gated} on {}",
                            backend(ctx)
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn block_weights_take_their_padded_size_and_refuse_malformed_uploads() {
    // Bytes per row of 256 elements on the GPU, by hand: blocks plus padding to whole words
    // (Q6_K's to a multiple of 16 bytes); the 32-element formats as two groups of four
    // blocks, each a 16-byte header of scales (and mins), for Q5_0 and Q5_1 16 bytes of high
    // bits, and the codes (4 x 16 bytes, Q8_0's 4 x 32).
    let want = [
        (WeightDtype::Q4_0, 8 * 20),
        (WeightDtype::Q4_1, 8 * 20),
        (WeightDtype::Q5_0, 8 * 24),
        (WeightDtype::Q5_1, 8 * 24),
        (WeightDtype::Q8_0, 8 * 36),
        (WeightDtype::Q4_K, 144),
        (WeightDtype::Q5_K, 176),
        (WeightDtype::Q6_K, 224),
    ];
    for (dtype, bytes) in want {
        assert_eq!(dtype.gpu_row_bytes(256), bytes, "{dtype:?}");
        assert_eq!(dtype.gpu_row_bytes(256) % 4, 0, "{dtype:?}");
    }
    // A shorter last group: its header, high bits and only its own blocks' codes.
    assert_eq!(WeightDtype::Q4_0.gpu_row_bytes(32), 16 + 16);
    assert_eq!(WeightDtype::Q5_1.gpu_row_bytes(96), 16 + 16 + 3 * 16);
    assert_eq!(WeightDtype::Q8_0.gpu_row_bytes(160), 144 + 16 + 32);
    assert_eq!(WeightDtype::MXFP4.gpu_row_bytes(288), 2 * 80 + 16 + 16);
    for ctx in contexts() {
        let w = Weight::from_f32(ctx, "w", &vec![0.5; 3 * 256], 3, 256, WeightDtype::Q8_0).unwrap();
        assert_eq!(w.gpu_bytes(), (3 * 8 * 36) as u64);
        // A row that is not whole blocks, and byte counts that do not fit the shape.
        let err = Weight::upload(ctx, "odd", &[0u8; 34], 1, 48, WeightDtype::Q8_0).unwrap_err();
        assert!(err.to_string().contains("blocks of 32"), "{err}");
        let err = Weight::upload(ctx, "short", &[0u8; 33], 1, 32, WeightDtype::Q8_0).unwrap_err();
        assert!(err.to_string().contains("33 bytes"), "{err}");
        let err =
            Weight::from_f32(ctx, "nan", &[f32::NAN; 32], 1, 32, WeightDtype::Q4_0).unwrap_err();
        assert!(err.to_string().contains("non-finite"), "{err}");
    }
}

#[test]
fn a_stack_of_mixed_formats_computes_what_its_parts_compute_alone() {
    // q and k in Q4_K and v in Q6_K, as a Q4_K_M file keeps them, stacked into one weight
    // with three outputs: each output is bitwise the product of its part alone.
    use pagellm::internals::kernels::matmul::Outputs;
    for ctx in contexts() {
        let (k, rows) = (256, [24, 8, 8]);
        let formats = [WeightDtype::Q4_K, WeightDtype::Q4_K, WeightDtype::Q6_K];
        let mut g = rng(700);
        let parts: Vec<Vec<u8>> = rows
            .iter()
            .zip(formats)
            .map(|(&r, d)| kernels::weight::encode(&randn(&mut g, r * k, 0.5), d).unwrap())
            .collect();
        let stack: Vec<(WeightDtype, usize, &[u8])> = (0..3)
            .map(|i| (formats[i], rows[i], &parts[i][..]))
            .collect();
        let w = Weight::upload_stack(ctx, "qkv", &stack, k).unwrap();
        assert_eq!(w.rows, 40);
        assert_eq!(w.chunks.len(), 2, "one chunk per run of a format");
        assert_eq!(
            (w.chunks[1].first_row, w.chunks[1].dtype),
            (32, WeightDtype::Q6_K)
        );
        let alone: Vec<Weight> = (0..3)
            .map(|i| Weight::upload(ctx, "part", &parts[i], rows[i], k, formats[i]).unwrap())
            .collect();
        for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
            let plan = mm_only(ctx, kernel);
            for m in [1, 9, 70] {
                let x = ctx.upload("x", &randn(&mut g, m * k, 1.0)).unwrap();
                let ys: Vec<wgpu::Buffer> = rows
                    .iter()
                    .map(|r| ctx.storage_buffer("y", (m * r * 4) as u64).unwrap())
                    .collect();
                let call = Matmul::new(&x, &w, &ys[0], m)
                    .outputs(Outputs::Three([&ys[0], &ys[1], &ys[2]], [rows[0], rows[1]]));
                let mut b = Batch::new(ctx, "t");
                matmul(&mut b, &plan, &call).unwrap();
                b.submit().unwrap();
                for i in 0..3 {
                    let stacked = read_f32(ctx, &ys[i], m * rows[i]);
                    let y = ctx.storage_buffer("y", (m * rows[i] * 4) as u64).unwrap();
                    let single = run(
                        ctx,
                        &plan,
                        &Matmul::new(&x, &alone[i], &y, m),
                        &y,
                        m * rows[i],
                    );
                    assert_eq!(
                        bits(&stacked),
                        bits(&single),
                        "{kernel:?} m={m} part {i} on {}",
                        backend(ctx)
                    );
                }
            }
        }
    }
}

#[test]
fn weight_formats_parse_by_their_ggml_names_in_any_case() {
    for d in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
        .into_iter()
        .chain(WeightDtype::BLOCKS)
    {
        assert_eq!(d.name().to_lowercase().parse::<WeightDtype>(), Ok(d));
        assert_eq!(d.name().parse::<WeightDtype>(), Ok(d));
    }
    let e = "q1_k".parse::<WeightDtype>().unwrap_err();
    assert!(e.contains("\"q1_k\"") && e.contains("q4_k"), "{e}");
}
