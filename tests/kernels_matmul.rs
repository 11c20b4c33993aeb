//! GPU vs plain-Rust reference: the projections, in f32, f16 and bf16 weights, with and without bias, accumulating into the residual, and with the
//! weight split into row chunks; plus the LM head path (gather, logits, arg-max).

mod common;
use common::*;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::matmul::{matmul, Matmul, MatmulKernel, Output};
use pagellm::internals::kernels::{self, Weight, WeightDtype};
use pagellm::internals::reference as r;

#[allow(clippy::too_many_arguments)]
fn check(
    ctx: &pagellm::GpuContext,
    seed: u64,
    m: usize,
    n: usize,
    k: usize,
    dtype: WeightDtype,
    with_bias: bool,
    accumulate: bool,
    chunk_rows: Option<usize>,
) {
    let mut g = rng(seed);
    let x = randn(&mut g, m * k, 1.0);
    let wv = randn(&mut g, n * k, 0.5);
    let bias = randn(&mut g, n, 1.0);
    let y0 = randn(&mut g, m * n, 1.0);
    let limit = chunk_rows.map_or(u64::MAX, |rows| (rows * dtype.gpu_row_bytes(k)) as u64);
    let bytes = kernels::weight::encode(&wv, dtype).unwrap();
    let w = Weight::upload_with_limit(ctx, "w", &bytes, n, k, dtype, limit).unwrap();
    let xb = ctx.upload("x", &x).unwrap();
    let bb = ctx.upload("bias", &bias).unwrap();
    let yb = ctx.upload("y", &y0).unwrap();
    let mut b = Batch::new(ctx, "t");
    let out = if accumulate {
        Output::Accumulate
    } else {
        Output::Overwrite
    };
    let call = Matmul::new(&xb, &w, &yb, m).bias(with_bias.then_some(&bb));
    matmul(&mut b, &mm_plan(ctx, k), &call.output(out)).unwrap();
    b.submit().unwrap();
    let mut want = r::matmul(
        &x,
        &rounded(&wv, dtype),
        with_bias.then_some(&bias[..]),
        m,
        n,
        k,
    );
    if accumulate {
        want.iter_mut().zip(&y0).for_each(|(a, b)| *a += b);
    }
    let what = format!(
        "matmul m={m} n={n} k={k} {dtype:?} bias={with_bias} acc={accumulate} chunks={} on {}",
        w.chunks.len(),
        backend(ctx)
    );
    // f32 accumulation over k terms of size ~0.5: error grows like sqrt(k) * eps.
    assert_close(
        &what,
        &read_f32(ctx, &yb, m * n),
        &want,
        1e-4 * (k as f32).sqrt(),
        1e-5,
    );
}

#[test]
fn tiled_matmul_all_dtypes_and_ragged_shapes() {
    for ctx in contexts() {
        for (i, dtype) in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
            .into_iter()
            .enumerate()
        {
            check(ctx, 10 + i as u64, 70, 130, 96, dtype, false, false, None);
            check(ctx, 20 + i as u64, 9, 64, 34, dtype, true, false, None);
            check(ctx, 30 + i as u64, 65, 3, 200, dtype, true, true, None);
        }
    }
}

#[test]
fn few_rows_as_in_decode_all_dtypes() {
    for ctx in contexts() {
        for (i, dtype) in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
            .into_iter()
            .enumerate()
        {
            check(ctx, 40 + i as u64, 1, 257, 128, dtype, false, false, None);
            check(ctx, 50 + i as u64, 8, 100, 62, dtype, true, true, None);
            check(ctx, 60 + i as u64, 3, 33, 1030, dtype, true, false, None);
        }
    }
}

#[test]
fn a_stacked_weight_fills_three_outputs_as_three_matmuls_would() {
    // q, k and v stacked in one weight and computed in one call per chunk, each output to
    // its own buffer: bitwise the three projections computed alone, by every kernel, with
    // bias, for 1, 9 and 70 rows, and with chunk boundaries inside and between the parts.
    use pagellm::internals::kernels::matmul::Outputs;
    for ctx in contexts() {
        let (n0, n1, n2, k) = (24, 8, 8, 64);
        let n = n0 + n1 + n2;
        let dtype = WeightDtype::F16;
        let mut g = rng(81);
        let wv = randn(&mut g, n * k, 0.5);
        let bias = randn(&mut g, n, 1.0);
        let bytes = kernels::weight::encode(&wv, dtype).unwrap();
        let rb = dtype.gpu_row_bytes(k);
        let parts = [
            &bytes[..n0 * rb],
            &bytes[n0 * rb..(n0 + n1) * rb],
            &bytes[(n0 + n1) * rb..],
        ];
        let alone: Vec<(Weight, wgpu::Buffer)> = [(0, n0), (n0, n1), (n0 + n1, n2)]
            .iter()
            .map(|&(first, rows)| {
                let w = Weight::upload(
                    ctx,
                    "part",
                    &bytes[first * rb..(first + rows) * rb],
                    rows,
                    k,
                    dtype,
                )
                .unwrap();
                (w, ctx.upload("bias", &bias[first..first + rows]).unwrap())
            })
            .collect();
        let bb = ctx.upload("bias", &bias).unwrap();
        for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
            for chunk_rows in [n, 10, 24, 5] {
                let limit = (chunk_rows * rb) as u64;
                let w = Weight::upload_parts_with_limit(ctx, "qkv", &parts, n, k, dtype, limit)
                    .unwrap();
                for m in [1, 9, 70] {
                    let x = ctx.upload("x", &randn(&mut g, m * k, 1.0)).unwrap();
                    let out = |cols: usize| ctx.storage_buffer("y", (m * cols * 4) as u64).unwrap();
                    let ys = [out(n0), out(n1), out(n2)];
                    let want = [out(n0), out(n1), out(n2)];
                    let mut b = Batch::new(ctx, "t");
                    let outputs = Outputs::Three([&ys[0], &ys[1], &ys[2]], [n0, n1]);
                    let plan = mm_only(ctx, kernel);
                    let call = Matmul::new(&x, &w, &ys[0], m).bias(Some(&bb));
                    matmul(&mut b, &plan, &call.outputs(outputs)).unwrap();
                    for ((wa, ba), y) in alone.iter().zip(&want) {
                        let call = Matmul::new(&x, wa, y, m).bias(Some(ba));
                        matmul(&mut b, &plan, &call).unwrap();
                    }
                    b.submit().unwrap();
                    for (i, (got, want)) in ys.iter().zip(&want).enumerate() {
                        let cols = [n0, n1, n2][i];
                        let (got, want) =
                            (read_f32(ctx, got, m * cols), read_f32(ctx, want, m * cols));
                        assert!(
                            got.iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kernel:?} output {i}, {m} rows, chunks of {chunk_rows} on {}",
                            backend(ctx)
                        );
                    }
                }
            }
        }
        // Widths that leave no third output are refused by name.
        let w = Weight::upload_parts(ctx, "qkv", &parts, n, k, dtype).unwrap();
        let x = ctx.upload("x", &randn(&mut g, k, 1.0)).unwrap();
        let y = ctx.storage_buffer("y", (n * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        let outputs = Outputs::Three([&y, &y, &y], [n0, n1 + n2]);
        let plan = mm_only(ctx, MatmulKernel::Columns);
        let call = Matmul::new(&x, &w, &y, 1).outputs(outputs);
        let e = matmul(&mut b, &plan, &call).unwrap_err();
        assert!(e.to_string().contains("the rest of 40 columns"), "{e}");
    }
}

#[test]
fn a_weight_uploaded_in_parts_is_the_weight_of_their_stack() {
    // Two projections stacked without joining them on the host (gate and up), with chunk
    // limits that put a chunk boundary before, at and across the parts' seam: the product
    // is bitwise the one of the weight uploaded whole.
    for ctx in contexts() {
        let (m, n, k) = (3, 20, 64);
        let mut g = rng(77);
        let wv = randn(&mut g, n * k, 0.5);
        let x = ctx.upload("x", &randn(&mut g, m * k, 1.0)).unwrap();
        let dtype = WeightDtype::BF16;
        let bytes = kernels::weight::encode(&wv, dtype).unwrap();
        let seam = 12 * dtype.gpu_row_bytes(k);
        let product = |w: &Weight| {
            let y = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
            let mut b = Batch::new(ctx, "t");
            matmul(&mut b, &mm_plan(ctx, k), &Matmul::new(&x, w, &y, m)).unwrap();
            b.submit().unwrap();
            read_f32(ctx, &y, m * n)
        };
        let whole = product(&Weight::upload(ctx, "w", &bytes, n, k, dtype).unwrap());
        for chunk_rows in [5, 12, 20] {
            let limit = (chunk_rows * dtype.gpu_row_bytes(k)) as u64;
            let parts = [&bytes[..seam], &bytes[seam..]];
            let w = Weight::upload_parts_with_limit(ctx, "w", &parts, n, k, dtype, limit).unwrap();
            assert_eq!(w.chunks.len(), n.div_ceil(chunk_rows));
            let got = product(&w);
            assert!(
                got.iter()
                    .zip(&whole)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "chunks of {chunk_rows} rows on {}",
                backend(ctx)
            );
        }
        // A part that is not whole rows is refused by name.
        let parts = [&bytes[..seam + 2], &bytes[seam + 2..]];
        let e = Weight::upload_parts(ctx, "w", &parts, n, k, dtype).unwrap_err();
        assert!(e.to_string().contains("whole rows"), "{e}");
    }
}

const KERNELS: [MatmulKernel; 4] = [
    MatmulKernel::Tiled,
    MatmulKernel::Columns,
    MatmulKernel::ColumnsVec,
    MatmulKernel::ColumnsSubgroup,
];

#[test]
fn a_rows_result_does_not_depend_on_the_other_rows_or_the_kernel() {
    // Batch invariance: row 0 computed alone and inside 1, 3, 7, 8, 9, 70 and 130-row
    // batches, by every kernel the adapter supports (the column kernels in passes of 1, 2,
    // 4 and 8 rows), must be bitwise identical in every storage format, with bias and
    // accumulation. k = 200 and 48 admit the vectorised column kernels, 34 does not.
    for ctx in contexts() {
        for (i, dtype) in [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
            .into_iter()
            .enumerate()
        {
            for k in [200, 48, 34] {
                let mut g = rng(90 + i as u64);
                let n = 96;
                let w =
                    Weight::from_f32(ctx, "w", &randn(&mut g, n * k, 0.5), n, k, dtype).unwrap();
                let x = randn(&mut g, 130 * k, 1.0);
                let bias = ctx.upload("bias", &randn(&mut g, n, 1.0)).unwrap();
                let y0 = randn(&mut g, 130 * n, 1.0);
                let mut first: Option<Vec<f32>> = None;
                let mut kernels_run = 0;
                for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                    kernels_run += 1;
                    for m in [1, 3, 7, 8, 9, 70, 130] {
                        let xb = ctx.upload("x", &x[..m * k]).unwrap();
                        let yb = ctx.upload("y", &y0[..m * n]).unwrap();
                        let mut b = Batch::new(ctx, "t");
                        let out = Output::Accumulate;
                        let call = Matmul::new(&xb, &w, &yb, m).bias(Some(&bias)).output(out);
                        matmul(&mut b, &mm_only(ctx, kernel), &call).unwrap();
                        b.submit().unwrap();
                        let row0 = read_f32(ctx, &yb, n);
                        match &first {
                            None => first = Some(row0),
                            Some(f) => assert!(
                                f.iter().zip(&row0).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{dtype:?} k={k}: row 0 differs with {m} rows by {kernel:?} on {}",
                                backend(ctx)
                            ),
                        }
                    }
                }
                let want = if k % 8 == 0 { 3 } else { 2 };
                assert!(kernels_run >= want, "k={k}: only {kernels_run} kernels ran");
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_product() {
    // Each kernel on its own (the automatic choice depends on the adapter type), against
    // the plain-Rust product, including the last rows of a partial 8-row pass.
    for ctx in contexts() {
        for kernel in KERNELS {
            for (m, n, k, dtype) in [
                (5, 70, 64, WeightDtype::F16),
                (11, 65, 24, WeightDtype::F32),
                (19, 33, 16, WeightDtype::BF16),
            ] {
                if !kernel.supports(ctx, k) {
                    continue;
                }
                let mut g = rng(m as u64);
                let (x, wv, bias) = (
                    randn(&mut g, m * k, 1.0),
                    randn(&mut g, n * k, 0.5),
                    randn(&mut g, n, 1.0),
                );
                let w = Weight::from_f32(ctx, "w", &wv, n, k, dtype).unwrap();
                let (xb, bb) = (
                    ctx.upload("x", &x).unwrap(),
                    ctx.upload("b", &bias).unwrap(),
                );
                let yb = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
                let mut b = Batch::new(ctx, "t");
                let call = Matmul::new(&xb, &w, &yb, m).bias(Some(&bb));
                matmul(&mut b, &mm_only(ctx, kernel), &call).unwrap();
                b.submit().unwrap();
                let want = r::matmul(&x, &rounded(&wv, dtype), Some(&bias[..]), m, n, k);
                assert_close(
                    &format!("{kernel:?} m={m} n={n} k={k} {dtype:?} on {}", backend(ctx)),
                    &read_f32(ctx, &yb, m * n),
                    &want,
                    1e-4 * (k as f32).sqrt(),
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn weights_split_into_row_chunks_give_the_same_product() {
    for ctx in contexts() {
        check(ctx, 70, 2, 100, 64, WeightDtype::F16, true, false, Some(30));
        check(ctx, 71, 40, 100, 64, WeightDtype::BF16, true, true, Some(7));
        check(ctx, 72, 40, 50, 16, WeightDtype::F32, false, false, Some(1));
    }
}

#[test]
fn lm_head_returns_logits_and_greedy_tokens_of_chosen_rows() {
    for ctx in contexts() {
        let mut g = rng(80);
        let (tokens, hidden, vocab) = (6, 64, 500);
        let h = randn(&mut g, tokens * hidden, 1.0);
        let head = randn(&mut g, vocab * hidden, 1.0);
        let rows: Vec<u32> = vec![5, 1];
        let w = Weight::from_f32(ctx, "lm_head", &head, vocab, hidden, WeightDtype::BF16).unwrap();
        let hb = ctx.upload("h", &h).unwrap();
        let rb = ctx.upload("rows", &rows).unwrap();
        let gathered = ctx
            .storage_buffer("g", (rows.len() * hidden * 4) as u64)
            .unwrap();
        let logits = ctx
            .storage_buffer("l", (rows.len() * vocab * 4) as u64)
            .unwrap();
        let am = ctx.storage_buffer("am", (rows.len() * 8) as u64).unwrap();
        let words = kernels::logits::argmax_partials_len(rows.len(), vocab);
        let partials = ctx.storage_buffer("partials", (words * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        let out = kernels::logits::LogitsBuffers {
            gathered: &gathered,
            logits: &logits,
            argmax: Some(&am),
            argmax_partials: Some(&partials),
            softcap: None,
            norm: None,
        };
        let plan = plan_for(ctx, hidden);
        kernels::logits::lm_head(&mut b, &plan, &hb, tokens, &rb, rows.len(), &w, out).unwrap();
        b.submit().unwrap();
        let sel: Vec<f32> = rows
            .iter()
            .flat_map(|&r| h[r as usize * hidden..(r as usize + 1) * hidden].to_vec())
            .collect();
        let want = r::matmul(&sel, &r::round_bf16(&head), None, rows.len(), vocab, hidden);
        let what = format!("lm_head on {}", backend(ctx));
        assert_close(
            &what,
            &read_f32(ctx, &logits, want.len()),
            &want,
            1e-3,
            1e-5,
        );
        let got: Vec<u32> = ctx.read(&am).unwrap();
        let want_am: Vec<u32> = want
            .chunks(vocab)
            .map(|row| r::argmax(row) as u32)
            .collect();
        assert_eq!(&got[..2], &want_am[..], "{what} argmax");
    }
}

#[test]
fn gated_input_is_the_activation_of_gate_times_up() {
    // The down projection reading the stacked gate-up output ([m, 2k]: each row's gate,
    // then its up) and applying the gated activation as it reads: against the plain-Rust
    // activation and product, for both activations, every kernel the adapter runs and 1, 9
    // and 70 rows (the column kernels' 8-row passes and the passes of the rest), with bias
    // and accumulation; and row 0 bitwise the same for every kernel and row count (batch
    // invariance). k = 48 admits the vectorised column kernels, 34 does not.
    use pagellm::internals::nn::Activation;
    for ctx in contexts() {
        for k in [48, 34] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                let mut g = rng(300 + k as u64);
                let (m_max, n) = (70, 40);
                let gate = randn(&mut g, m_max * k, 3.0);
                let up = randn(&mut g, m_max * k, 1.0);
                let stacked: Vec<f32> = (0..m_max)
                    .flat_map(|r| {
                        let row = r * k..(r + 1) * k;
                        gate[row.clone()].iter().chain(&up[row]).copied()
                    })
                    .collect();
                let wv = randn(&mut g, n * k, 0.5);
                let bias = randn(&mut g, n, 1.0);
                let y0 = randn(&mut g, m_max * n, 1.0);
                let w = Weight::from_f32(ctx, "w", &wv, n, k, WeightDtype::F16).unwrap();
                let bb = ctx.upload("bias", &bias).unwrap();
                let x = match act {
                    Activation::Silu => r::silu_mul(&gate, &up),
                    Activation::GeluTanh => r::gelu_tanh_mul(&gate, &up),
                    // Never fused (gpt-oss's experts run their own activation pass).
                    Activation::ClampedSwiglu { .. } => unreachable!("not in the list"),
                };
                let wr = rounded(&wv, WeightDtype::F16);
                let mut first: Option<Vec<f32>> = None;
                for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                    for m in [1, 9, 70] {
                        let gu = ctx.upload("gate up", &stacked[..2 * m * k]).unwrap();
                        let yb = ctx.upload("y", &y0[..m * n]).unwrap();
                        let mut b = Batch::new(ctx, "t");
                        let out = Output::Accumulate;
                        let call = Matmul::new(&gu, &w, &yb, m).bias(Some(&bb)).output(out);
                        matmul(&mut b, &mm_only(ctx, kernel), &call.gated(act)).unwrap();
                        b.submit().unwrap();
                        let got = read_f32(ctx, &yb, m * n);
                        let mut want = r::matmul(&x[..m * k], &wr, Some(&bias[..]), m, n, k);
                        want.iter_mut().zip(&y0).for_each(|(a, b)| *a += b);
                        let what =
                            format!("{kernel:?} {act:?} m={m} k={k} gated on {}", backend(ctx));
                        assert_close(&what, &got, &want, 1e-4 * (k as f32).sqrt(), 1e-4);
                        match &first {
                            None => first = Some(got[..n].to_vec()),
                            Some(f) => assert!(
                                f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{what}: row 0 differs from the first kernel's"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_gated_input_must_hold_gate_and_up() {
    use pagellm::internals::nn::Activation;
    for ctx in contexts() {
        let (m, n, k) = (4, 8, 64);
        let w = Weight::from_f32(ctx, "w", &vec![0.5; n * k], n, k, WeightDtype::F16).unwrap();
        // [m, k] is the ungated input's size: half of what a gated one needs.
        let x = ctx.upload("x", &vec![1.0f32; m * k]).unwrap();
        let y = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        let call = Matmul::new(&x, &w, &y, m).gated(Activation::Silu);
        let e = matmul(&mut b, &mm_plan(ctx, k), &call).unwrap_err();
        assert!(e.to_string().contains("gate up"), "{e}");
    }
}

#[test]
fn wide_passes_give_the_same_bits() {
    // On CPU adapters passes over weights of 512 columns per host core or more give each
    // invocation four columns (WIDE in matmul_columns_vec.wgsl: one_row_body, and
    // columns_body4 for passes of several rows). That many columns and 76 more (a partial
    // last workgroup of 256), k = 48 and 8: every kernel at 1, 2, 9 (an 8-row pass, then a
    // one-row pass) and 12 rows (an 8-row pass, then a 4-row one) against the reference,
    // and every row bitwise the same as the tiled kernel's.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    for ctx in contexts() {
        for k in [48, 8] {
            let (n, m_max) = (512 * cores + 76, 12);
            let mut g = rng(400 + k as u64);
            let wv = randn(&mut g, n * k, 0.5);
            let w = Weight::from_f32(ctx, "w", &wv, n, k, WeightDtype::F16).unwrap();
            let x = randn(&mut g, m_max * k, 1.0);
            let wr = rounded(&wv, WeightDtype::F16);
            for m in [1, 2, 9, 12] {
                let want = r::matmul(&x[..m * k], &wr, None, m, n, k);
                let mut first: Option<Vec<f32>> = None;
                for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                    let xb = ctx.upload("x", &x[..m * k]).unwrap();
                    let yb = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
                    let mut b = Batch::new(ctx, "t");
                    let call = Matmul::new(&xb, &w, &yb, m);
                    matmul(&mut b, &mm_only(ctx, kernel), &call).unwrap();
                    b.submit().unwrap();
                    let got = read_f32(ctx, &yb, m * n);
                    let what = format!("{kernel:?} m={m} n={n} k={k} on {}", backend(ctx));
                    assert_close(&what, &got, &want, 1e-4 * (k as f32).sqrt(), 1e-5);
                    match &first {
                        None => first = Some(got),
                        Some(f) => assert!(
                            f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{what}: differs from the tiled kernel"
                        ),
                    }
                }
            }
        }
    }
}

#[test]
fn a_normed_input_is_the_lane_norm_kernels_output_to_the_bit() {
    // The RMSNorm before a projection, computed by the projection as it reads x: against the
    // plain-Rust norm and product (f64), and bitwise against rms_norm_lanes followed by the
    // same kernel's plain matmul, for every kernel the adapter runs, 1, 2, 3, 9 and 70 rows
    // (one-row, two- and four-row and 8-row passes; the tiled kernel's partial tile), rows of
    // very different magnitudes, f32, f16 and bf16 norms and weights, with a bias; a weight
    // wide enough for the one-row passes of four columns (WIDE) on a CPU adapter; and the
    // stacked q k v outputs. Row 0 is the same bits for every kernel and row count (batch
    // invariance).
    use pagellm::internals::kernels::matmul::{Norm, Outputs};
    use pagellm::internals::kernels::rms_norm::{rms_norm, RmsNormKernel};
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    for ctx in contexts() {
        for (k, n, norm_dtype, dtype) in [
            (48, 40, WeightDtype::BF16, WeightDtype::BF16),
            (64, 512 * cores + 8, WeightDtype::F32, WeightDtype::F16),
            (8, 24, WeightDtype::F16, WeightDtype::F32),
        ] {
            let (m_max, eps) = (70, 1e-5);
            let mut g = rng(500 + k as u64);
            let mut x = randn(&mut g, m_max * k, 1.0);
            for (r, row) in x.chunks_mut(k).enumerate() {
                let scale = [0.01, 1.0, 30.0][r % 3];
                row.iter_mut().for_each(|v| *v *= scale);
            }
            let gv = randn(&mut g, k, 1.0);
            let wv = randn(&mut g, n * k, 0.5);
            let bias = randn(&mut g, n, 1.0);
            let nw = Weight::from_f32(ctx, "norm", &gv, 1, k, norm_dtype).unwrap();
            let w = Weight::from_f32(ctx, "w", &wv, n, k, dtype).unwrap();
            let bb = ctx.upload("bias", &bias).unwrap();
            let normed = r::rms_norm(&x, &rounded(&gv, norm_dtype), eps);
            let wr = rounded(&wv, dtype);
            let norm = Norm { weight: &nw, eps };
            let mut first: Option<Vec<f32>> = None;
            for kernel in KERNELS.into_iter().filter(|kern| kern.supports(ctx, k)) {
                for m in [1, 2, 3, 9, 70] {
                    let xb = ctx.upload("x", &x[..m * k]).unwrap();
                    let hb = ctx.storage_buffer("h", (m * k * 4) as u64).unwrap();
                    let yb = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
                    let y2 = ctx.storage_buffer("y2", (m * n * 4) as u64).unwrap();
                    let mut b = Batch::new(ctx, "t");
                    let over = Output::Overwrite;
                    let plan = mm_only(ctx, kernel);
                    let call = Matmul::new(&xb, &w, &yb, m).bias(Some(&bb)).output(over);
                    matmul(&mut b, &plan, &call.normed(norm)).unwrap();
                    rms_norm(&mut b, RmsNormKernel::Lanes, &xb, &nw, &hb, m, eps).unwrap();
                    let call = Matmul::new(&hb, &w, &y2, m).bias(Some(&bb)).output(over);
                    matmul(&mut b, &plan, &call).unwrap();
                    b.submit().unwrap();
                    let got = read_f32(ctx, &yb, m * n);
                    let want = r::matmul(&normed[..m * k], &wr, Some(&bias[..]), m, n, k);
                    let what = format!(
                        "{kernel:?} m={m} n={n} k={k} {dtype:?} norm {norm_dtype:?} on {}",
                        backend(ctx)
                    );
                    assert_close(&what, &got, &want, 1e-4 * (k as f32).sqrt(), 1e-4);
                    let separate = read_f32(ctx, &y2, m * n);
                    assert!(
                        got.iter()
                            .zip(&separate)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: differs from rms_norm_lanes then the matmul"
                    );
                    match &first {
                        None => first = Some(got[..n].to_vec()),
                        Some(f) => assert!(
                            f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{what}: row 0 differs from the first kernel's"
                        ),
                    }
                    // The stacked q k v form: three outputs, each bitwise its columns of
                    // the single output.
                    if n == 40 {
                        let widths = [16, 8];
                        let ys: Vec<_> = [16, 8, 16]
                            .iter()
                            .map(|w| ctx.storage_buffer("part", (m * w * 4) as u64).unwrap())
                            .collect();
                        let three = Outputs::Three([&ys[0], &ys[1], &ys[2]], widths);
                        let mut b = Batch::new(ctx, "t");
                        let call = Matmul::new(&xb, &w, &y2, m).outputs(three).normed(norm);
                        matmul(&mut b, &plan, &call).unwrap();
                        matmul(&mut b, &plan, &Matmul::new(&hb, &w, &y2, m)).unwrap();
                        b.submit().unwrap();
                        let whole = read_f32(ctx, &y2, m * n);
                        let parts: Vec<Vec<f32>> = ys
                            .iter()
                            .zip([16, 8, 16])
                            .map(|(y, w)| read_f32(ctx, y, m * w))
                            .collect();
                        for r in 0..m {
                            let row: Vec<f32> = [(0, 16), (1, 8), (2, 16)]
                                .iter()
                                .flat_map(|&(i, w)| parts[i][r * w..(r + 1) * w].to_vec())
                                .collect();
                            assert!(
                                row.iter()
                                    .zip(&whole[r * n..(r + 1) * n])
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{what}: q k v row {r} differs"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_normed_input_needs_a_norm_of_its_width() {
    use pagellm::internals::kernels::matmul::Norm;
    for ctx in contexts() {
        let (m, n) = (2, 8);
        let y = ctx.storage_buffer("y", (m * n * 4) as u64).unwrap();
        // (k, norm width, what the error names)
        for (k, width, names) in [(64, 32, "norm of 1 x 32"), (12, 12, "k % 8")] {
            let w = Weight::from_f32(ctx, "w", &vec![0.5; n * k], n, k, WeightDtype::F16).unwrap();
            let nw =
                Weight::from_f32(ctx, "n", &vec![1.0; width], 1, width, WeightDtype::F32).unwrap();
            let x = ctx.upload("x", &vec![1.0f32; m * k]).unwrap();
            let mut b = Batch::new(ctx, "t");
            let norm = Norm {
                weight: &nw,
                eps: 1e-6,
            };
            let call = Matmul::new(&x, &w, &y, m).normed(norm);
            let e = matmul(&mut b, &mm_plan(ctx, k), &call).unwrap_err();
            assert!(e.to_string().contains(names), "{e}");
        }
    }
}
