//! GPU vs plain-Rust reference: embedding, RMSNorm, SiLU-and-multiply, residual add, RoPE,
//! row gather and arg-max, on every backend available.

mod common;
use common::*;
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::rope::RopeTable;
use pagellm::internals::kernels::{self, Weight, WeightDtype};
use pagellm::internals::nn::rope::{inv_freq, RopeScaling};
use pagellm::internals::reference as r;

const DTYPES: [WeightDtype; 3] = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16];

#[test]
fn embedding_gathers_rows_in_every_dtype_and_chunked() {
    for ctx in contexts() {
        let mut g = rng(1);
        let (vocab, hidden) = (37, 48);
        let table = randn(&mut g, vocab * hidden, 1.0);
        let ids: Vec<u32> = vec![0, 36, 5, 5, 17, 36, 1];
        for dtype in DTYPES {
            for limit in [u64::MAX, (dtype.gpu_row_bytes(hidden) * 8) as u64] {
                let bytes = kernels::weight::encode(&table, dtype).unwrap();
                let w = Weight::upload_with_limit(ctx, "emb", &bytes, vocab, hidden, dtype, limit)
                    .unwrap();
                let ids_b = ctx.upload("ids", &ids).unwrap();
                let out = ctx
                    .storage_buffer("out", (ids.len() * hidden * 4) as u64)
                    .unwrap();
                let mut b = Batch::new(ctx, "t");
                kernels::embedding::embedding(&mut b, &w, &ids_b, &out, ids.len()).unwrap();
                b.submit().unwrap();
                let want = r::embedding(&rounded(&table, dtype), hidden, &ids);
                let what = format!(
                    "embedding {dtype:?} chunks={} on {}",
                    w.chunks.len(),
                    backend(ctx)
                );
                assert_close(&what, &read_f32(ctx, &out, want.len()), &want, 0.0, 0.0);
            }
        }
    }
}

#[test]
fn rms_norm_matches_reference() {
    use kernels::rms_norm::{rms_norm, RmsNormKernel};
    for ctx in contexts() {
        for kernel in [RmsNormKernel::Workgroup, RmsNormKernel::Lanes] {
            let mut g = rng(2);
            // 300 is a row only the workgroup kernel takes (the lane kernel's chains need a
            // multiple of 8; refused below).
            for (tokens, hidden) in [(1, 64), (5, 300), (3, 1024), (17, 48)] {
                if !kernel.supports(hidden) {
                    continue;
                }
                let x = randn(&mut g, tokens * hidden, 3.0);
                let wv = randn(&mut g, hidden, 1.0);
                for dtype in DTYPES {
                    let w = Weight::from_f32(ctx, "w", &wv, 1, hidden, dtype).unwrap();
                    let xb = ctx.upload("x", &x).unwrap();
                    let out = ctx.storage_buffer("out", (x.len() * 4) as u64).unwrap();
                    let mut b = Batch::new(ctx, "t");
                    rms_norm(&mut b, kernel, &xb, &w, &out, tokens, 1e-5).unwrap();
                    b.submit().unwrap();
                    let want = r::rms_norm(&x, &rounded(&wv, dtype), 1e-5);
                    let what = format!(
                        "{kernel:?} rms_norm {tokens}x{hidden} {dtype:?} on {}",
                        backend(ctx)
                    );
                    assert_close(&what, &read_f32(ctx, &out, x.len()), &want, 1e-5, 1e-5);
                }
            }
            // More rows than one grid dimension holds (a per-head q/k norm of 2048 tokens
            // of 32 heads, or for the lane kernel's eight rows per workgroup more): the
            // kernel runs a 2-D grid.
            let max = ctx.limits.max_compute_workgroups_per_dimension as usize;
            let (rows, hidden) = match kernel {
                RmsNormKernel::Workgroup => (66_000, 16),
                RmsNormKernel::Lanes => (8 * max + 9, 8),
            };
            let x = randn(&mut g, rows * hidden, 3.0);
            let wv = randn(&mut g, hidden, 1.0);
            let w = Weight::from_f32(ctx, "w", &wv, 1, hidden, WeightDtype::F32).unwrap();
            let xb = ctx.upload("x", &x).unwrap();
            let out = ctx.storage_buffer("out", (x.len() * 4) as u64).unwrap();
            let mut b = Batch::new(ctx, "t");
            rms_norm(&mut b, kernel, &xb, &w, &out, rows, 1e-6).unwrap();
            b.submit().unwrap();
            let want = r::rms_norm(&x, &wv, 1e-6);
            let what = format!("{kernel:?} rms_norm of {rows} rows on {}", backend(ctx));
            assert_close(&what, &read_f32(ctx, &out, x.len()), &want, 1e-5, 1e-5);
        }
        // A row length the lane kernel cannot sum in eight chains of 16-byte words is
        // refused by name.
        for hidden in [6, 12] {
            let w = Weight::from_f32(ctx, "w", &vec![1.0; hidden], 1, hidden, WeightDtype::F32)
                .unwrap();
            let xb = ctx.upload("x", &vec![1.0f32; hidden]).unwrap();
            let mut b = Batch::new(ctx, "t");
            let err = rms_norm(&mut b, RmsNormKernel::Lanes, &xb, &w, &xb, 1, 1e-6).unwrap_err();
            assert!(
                err.to_string().contains(&format!("rows of {hidden}")),
                "{err}"
            );
        }
    }
}

#[test]
fn silu_mul_and_add_match_reference() {
    for ctx in contexts() {
        let mut g = rng(3);
        let n = 1000;
        let gate = randn(&mut g, n, 6.0);
        let up = randn(&mut g, n, 2.0);
        let gb = ctx.upload("gate", &gate).unwrap();
        let ub = ctx.upload("up", &up).unwrap();
        let out = ctx.storage_buffer("out", (n * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        kernels::silu_mul::silu_mul(&mut b, &gb, &ub, &out, n).unwrap();
        kernels::add::add(&mut b, &out, &gb, n).unwrap();
        b.submit().unwrap();
        let want: Vec<f32> = r::silu_mul(&gate, &up)
            .iter()
            .zip(&gate)
            .map(|(a, b)| a + b)
            .collect();
        let what = format!("silu_mul + add on {}", backend(ctx));
        assert_close(&what, &read_f32(ctx, &out, n), &want, 1e-5, 1e-5);
    }
}

#[test]
fn gated_activation_of_stacked_gate_up_rows_matches_reference() {
    // The stacked gate-up projection's output: each row's gate, then its up. Both
    // activations, against the plain-Rust ones applied to the separated halves, and bitwise
    // against the kernel on separate gate and up buffers.
    use pagellm::internals::nn::Activation;
    for ctx in contexts() {
        let mut g = rng(6);
        let (rows, width) = (7, 300);
        let gate = randn(&mut g, rows * width, 6.0);
        let up = randn(&mut g, rows * width, 2.0);
        let stacked: Vec<f32> = (0..rows)
            .flat_map(|r| {
                let row = r * width..(r + 1) * width;
                gate[row.clone()].iter().chain(&up[row]).copied()
            })
            .collect();
        let (gb, ub) = (
            ctx.upload("gate", &gate).unwrap(),
            ctx.upload("up", &up).unwrap(),
        );
        let gu = ctx.upload("gate up", &stacked).unwrap();
        // gpt-oss's clamped SwiGLU with a limit the inputs cross (they are N(0, 2)).
        let clamped = Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 1.5,
        };
        for act in [Activation::Silu, Activation::GeluTanh, clamped] {
            let out = ctx.storage_buffer("out", (gate.len() * 4) as u64).unwrap();
            let flat = ctx.storage_buffer("flat", (gate.len() * 4) as u64).unwrap();
            let mut b = Batch::new(ctx, "t");
            kernels::silu_mul::gated_rows(&mut b, act, &gu, &out, rows, width).unwrap();
            kernels::silu_mul::gated(&mut b, act, &gb, &ub, &flat, rows * width).unwrap();
            b.submit().unwrap();
            let want = match act {
                Activation::Silu => r::silu_mul(&gate, &up),
                Activation::GeluTanh => r::gelu_tanh_mul(&gate, &up),
                Activation::ClampedSwiglu { alpha, limit } => {
                    r::clamped_swiglu(&gate, &up, alpha, limit)
                }
            };
            let got = read_f32(ctx, &out, gate.len());
            let what = format!("{act:?} of stacked rows on {}", backend(ctx));
            assert_close(&what, &got, &want, 1e-5, 1e-5);
            let separate = read_f32(ctx, &flat, gate.len());
            assert!(
                got.iter()
                    .zip(&separate)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: differs from separate buffers"
            );
        }
        // A buffer too short for the rows is refused by name.
        let mut b = Batch::new(ctx, "t");
        let out = ctx.storage_buffer("out", (gate.len() * 4) as u64).unwrap();
        let act = Activation::Silu;
        let err = kernels::silu_mul::gated_rows(&mut b, act, &gb, &out, rows, width).unwrap_err();
        assert!(err.to_string().contains("gate up"), "{err}");
    }
}

#[test]
fn gelu_tanh_mul_and_softcap_match_reference_also_for_large_inputs() {
    for ctx in contexts() {
        let mut g = rng(5);
        let n = 1000;
        let mut gate = randn(&mut g, n, 6.0);
        // Far past where tanh saturates, where an unclamped tanh may overflow.
        gate[..6].copy_from_slice(&[40.0, -40.0, 300.0, -300.0, 1e20, -1e20]);
        let up = randn(&mut g, n, 2.0);
        let gb = ctx.upload("gate", &gate).unwrap();
        let ub = ctx.upload("up", &up).unwrap();
        let out = ctx.storage_buffer("out", (n * 4) as u64).unwrap();
        let capped = ctx.upload("capped", &gate).unwrap();
        let mut b = Batch::new(ctx, "t");
        let act = pagellm::internals::nn::Activation::GeluTanh;
        kernels::silu_mul::gated(&mut b, act, &gb, &ub, &out, n).unwrap();
        kernels::softcap::softcap(&mut b, &capped, n, 30.0).unwrap();
        b.submit().unwrap();
        let what = format!("gelu_tanh_mul on {}", backend(ctx));
        let want = r::gelu_tanh_mul(&gate, &up);
        assert_close(&what, &read_f32(ctx, &out, n), &want, 1e-5, 1e-5);
        let want: Vec<f32> = gate
            .iter()
            .map(|&x| (30.0 * (x as f64 / 30.0).tanh()) as f32)
            .collect();
        let what = format!("softcap on {}", backend(ctx));
        assert_close(&what, &read_f32(ctx, &capped, n), &want, 1e-5, 1e-5);
        let mut b = Batch::new(ctx, "t");
        let e = kernels::softcap::softcap(&mut b, &capped, n, 0.0).unwrap_err();
        assert!(e.to_string().contains("cap 0"), "{e}");
    }
}

#[test]
fn scaled_embedding_multiplies_rows() {
    for ctx in contexts() {
        let mut g = rng(6);
        let (vocab, hidden) = (11, 32);
        let table = randn(&mut g, vocab * hidden, 1.0);
        let ids: Vec<u32> = vec![3, 0, 10, 3];
        let w = Weight::from_f32(ctx, "emb", &table, vocab, hidden, WeightDtype::BF16).unwrap();
        let ids_b = ctx.upload("ids", &ids).unwrap();
        let out = ctx
            .storage_buffer("out", (ids.len() * hidden * 4) as u64)
            .unwrap();
        let scale = (hidden as f64).sqrt() as f32;
        let mut b = Batch::new(ctx, "t");
        kernels::embedding::scaled_embedding(&mut b, &w, &ids_b, &out, ids.len(), scale).unwrap();
        b.submit().unwrap();
        let want: Vec<f32> = r::embedding(&rounded(&table, WeightDtype::BF16), hidden, &ids)
            .iter()
            .map(|v| v * scale)
            .collect();
        let what = format!("scaled embedding on {}", backend(ctx));
        assert_close(&what, &read_f32(ctx, &out, want.len()), &want, 0.0, 0.0);
    }
}

#[test]
fn rope_rotates_q_and_k_like_hugging_face() {
    for ctx in contexts() {
        let mut g = rng(4);
        for (hd, nh, nkv, theta) in [(64, 4, 2, 10000.0), (128, 2, 1, 500000.0), (96, 3, 3, 1e6)] {
            let positions: Vec<u32> = vec![0, 1, 2, 17, 63, 1000, 4095];
            let t = positions.len();
            let q = randn(&mut g, t * nh * hd, 1.0);
            let k = randn(&mut g, t * nkv * hd, 1.0);
            let table = RopeTable::new(ctx, hd, theta, &RopeScaling::None, 4096).unwrap();
            let pb = ctx.upload("pos", &positions).unwrap();
            let qb = ctx.upload("q", &q).unwrap();
            let kb = ctx.upload("k", &k).unwrap();
            let mut b = Batch::new(ctx, "t");
            kernels::rope::rope(&mut b, &table, &pb, &qb, &kb, t, nh, nkv).unwrap();
            b.submit().unwrap();
            let freqs = r::inv_freq(hd, theta);
            let (mut wq, mut wk) = (q.clone(), k.clone());
            for (i, &pos) in positions.iter().enumerate() {
                for h in 0..nh {
                    let o = (i * nh + h) * hd;
                    r::rope_head(&mut wq[o..o + hd], pos as usize, &freqs);
                }
                for h in 0..nkv {
                    let o = (i * nkv + h) * hd;
                    r::rope_head(&mut wk[o..o + hd], pos as usize, &freqs);
                }
            }
            // Angles up to 4095 rad are formed in f32 as transformers does: ~2e-4 abs error.
            let what = format!("rope hd={hd} on {}", backend(ctx));
            assert_close(
                &format!("{what} q"),
                &read_f32(ctx, &qb, q.len()),
                &wq,
                2e-3,
                0.0,
            );
            assert_close(
                &format!("{what} k"),
                &read_f32(ctx, &kb, k.len()),
                &wk,
                2e-3,
                0.0,
            );
        }
    }
}

#[test]
fn rope_with_llama3_scaling_uses_scaled_frequencies() {
    for ctx in contexts() {
        let mut g = rng(5);
        let (hd, nh, nkv) = (64, 2, 1);
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let positions: Vec<u32> = vec![3, 70, 200];
        let t = positions.len();
        let q = randn(&mut g, t * nh * hd, 1.0);
        let k = randn(&mut g, t * nkv * hd, 1.0);
        let table = RopeTable::new(ctx, hd, 10000.0, &scaling, 256).unwrap();
        let pb = ctx.upload("pos", &positions).unwrap();
        let qb = ctx.upload("q", &q).unwrap();
        let kb = ctx.upload("k", &k).unwrap();
        let mut b = Batch::new(ctx, "t");
        kernels::rope::rope(&mut b, &table, &pb, &qb, &kb, t, nh, nkv).unwrap();
        b.submit().unwrap();
        let freqs: Vec<f64> = inv_freq(hd, 10000.0, &scaling)
            .iter()
            .map(|&f| f as f64)
            .collect();
        let mut wq = q.clone();
        for (i, &pos) in positions.iter().enumerate() {
            for h in 0..nh {
                let o = (i * nh + h) * hd;
                r::rope_head(&mut wq[o..o + hd], pos as usize, &freqs);
            }
        }
        let what = format!("rope llama3 on {}", backend(ctx));
        assert_close(&what, &read_f32(ctx, &qb, q.len()), &wq, 1e-4, 0.0);
    }
}

const ARGMAX_KERNELS: [kernels::logits::ArgmaxKernel; 3] = [
    kernels::logits::ArgmaxKernel::Workgroup,
    kernels::logits::ArgmaxKernel::Lanes,
    kernels::logits::ArgmaxKernel::Split,
];

/// The f64 log-softmax of `row` at `i`.
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    row[i] as f64 - lse
}

#[test]
fn the_split_arg_max_merges_slices_as_one_row() {
    // Rows of several slices of the split kernel (2048 logits each) and a ragged last one,
    // 70 rows (more than one merge workgroup): maxima tied across slices (the first must
    // win), within a slice, at a slice's first and last logit, in the ragged slice, a row
    // whose logits are all equal, and one with a slice of -inf. Every kernel against a plain-Rust arg-max and an f64
    // logprob; the split kernel without its partials buffer is refused by name.
    use kernels::logits::{argmax, argmax_logprobs, argmax_partials_len, ArgmaxKernel};
    for ctx in contexts() {
        let (rows, width) = (70, 3 * 2048 + 5);
        let mut g = rng(7);
        let mut x = randn(&mut g, rows * width, 2.0);
        let ties: [&[usize]; 6] = [
            &[100, 2048 + 100, 4096 + 7],
            &[2047, 2048],
            &[6144 + 4, 30],
            &[6144, 6148],
            &[0, 4095],
            &[9, 17],
        ];
        for (r, at) in ties.iter().enumerate() {
            for &i in *at {
                x[r * width + i] = 12.0;
            }
        }
        x[6 * width..7 * width].fill(0.5);
        // Row 7: a slice of -inf (masked logits), whose own sum is NaN in the split kernel.
        x[7 * width + 2048..7 * width + 4096].fill(f32::NEG_INFINITY);
        let xb = ctx.upload("logits", &x).unwrap();
        let words = argmax_partials_len(rows, width);
        let partials = ctx.storage_buffer("partials", (words * 4) as u64).unwrap();
        for kernel in ARGMAX_KERNELS {
            let am = ctx.storage_buffer("am", (rows * 8) as u64).unwrap();
            let mut b = Batch::new(ctx, "t");
            argmax(&mut b, kernel, &xb, &am, Some(&partials), rows, width).unwrap();
            b.submit().unwrap();
            let (ids, lps) = argmax_logprobs(&ctx.read::<u32>(&am).unwrap(), rows);
            for (r, row) in x.chunks(width).enumerate() {
                let what = format!("{kernel:?} row {r} on {}", backend(ctx));
                assert_eq!(ids[r] as usize, r::argmax(row), "{what}");
                let want = log_softmax_at(row, ids[r] as usize);
                assert!(
                    (lps[r] as f64 - want).abs() < 1e-5,
                    "{what}: logprob {} vs {want}",
                    lps[r]
                );
            }
            assert_eq!(&ids[..7], &[100, 2047, 30, 6144, 0, 9, 0]);
        }
        let am = ctx.storage_buffer("am", (rows * 8) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        let e = argmax(&mut b, ArgmaxKernel::Split, &xb, &am, None, rows, width).unwrap_err();
        assert!(e.to_string().contains("partials"), "{e}");
    }
}

#[test]
fn gather_rows_and_argmax_pick_last_positions_and_their_logprobs() {
    for ctx in contexts() {
        let mut g = rng(6);
        let (tokens, width) = (9, 1001);
        let x = randn(&mut g, tokens * width, 1.0);
        let mut x_ties = x.clone();
        // Row 8: a tie between two maxima; the first must win, as in torch.argmax.
        x_ties[8 * width + 10] = 5.0;
        x_ties[8 * width + 900] = 5.0;
        // Row 2: a tie within what one lane of the lane kernel scans (9 and 17 are 8 apart).
        x_ties[2 * width + 9] = 6.0;
        x_ties[2 * width + 17] = 6.0;
        let rows: Vec<u32> = vec![2, 8, 0];
        let xb = ctx.upload("x", &x_ties).unwrap();
        let rb = ctx.upload("rows", &rows).unwrap();
        let out = ctx
            .storage_buffer("out", (rows.len() * width * 4) as u64)
            .unwrap();
        let am = ctx.storage_buffer("am", (rows.len() * 8) as u64).unwrap();
        let words = kernels::logits::argmax_partials_len(rows.len(), width);
        let partials = ctx.storage_buffer("partials", (words * 4) as u64).unwrap();
        let mut b = Batch::new(ctx, "t");
        kernels::logits::gather_rows(&mut b, &xb, &rb, &out, tokens, rows.len(), width).unwrap();
        let n = rows.len();
        let kernel = kernels::logits::ArgmaxKernel::choose(ctx);
        kernels::logits::argmax(&mut b, kernel, &out, &am, Some(&partials), n, width).unwrap();
        b.submit().unwrap();
        // Every arg-max kernel picks the same tokens; the one `argmax` chose is checked
        // against the reference below, and so are the others.
        let mut others = Vec::new();
        for kernel in ARGMAX_KERNELS {
            let am_other = ctx.storage_buffer("am", (n * 8) as u64).unwrap();
            let mut b = Batch::new(ctx, "t");
            kernels::logits::argmax(&mut b, kernel, &out, &am_other, Some(&partials), n, width)
                .unwrap();
            b.submit().unwrap();
            others.push((format!("{kernel:?}"), ctx.read::<u32>(&am_other).unwrap()));
        }
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x_ties[r as usize * width..(r as usize + 1) * width].to_vec())
            .collect();
        assert_close(
            "gather_rows",
            &read_f32(ctx, &out, want.len()),
            &want,
            0.0,
            0.0,
        );
        let got: Vec<u32> = ctx.read(&am).unwrap();
        let want_am: Vec<u32> = want
            .chunks(width)
            .map(|row| r::argmax(row) as u32)
            .collect();
        assert_eq!((want_am[0], want_am[1]), (9, 10));
        others.push(("chosen".into(), got));
        for (kernel, got) in &others {
            let (ids, lps) = kernels::logits::argmax_logprobs(got, rows.len());
            assert_eq!(ids, want_am, "{kernel} argmax on {}", backend(ctx));
            // The chosen token's log_softmax, against a plain f64 reference.
            for (i, row) in want.chunks(width).enumerate() {
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
                let want_lp = row[want_am[i] as usize] as f64 - lse;
                assert!(
                    (lps[i] as f64 - want_lp).abs() < 1e-5,
                    "{kernel} row {i} logprob {} vs {want_lp} on {}",
                    lps[i],
                    backend(ctx)
                );
            }
        }
    }
}
