//! Mixtures of experts. The kernels against plain-Rust references: the routing (each
//! token's experts and weights, the slots grouped by expert), one projection of every expert
//! over its slots in every weight format with the experts split over several buffers, and
//! the weighted sum into the residual stream. Then the two transformers-written MoE
//! fixtures through the engine's hard paths: seeded samples (n > 1), beams, chunked prefill,
//! prefix-cache hits, preemption by swap and by recompute on a tiny pool, speculative
//! decoding and an int8 cache, each giving exactly what a plain run gives.

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::*;
use pagellm::internals::engine::{EngineConfig, PreemptionMode, SpeculativeConfig};
use pagellm::internals::gpu::Batch;
use pagellm::internals::kernels::matmul::MatmulKernel;
use pagellm::internals::kernels::moe::{self, ExpertMatmul, Mixture, Routes};
use pagellm::internals::kernels::{self, Weight, WeightDtype};
use pagellm::internals::model::arch::Routing;
use pagellm::internals::pool::KvDtype;
use pagellm::internals::reference as r;
use pagellm::internals::sampling::SamplingParams;
use pagellm::GpuContext;

/// The routing's buffers for `slots` slots of `experts` experts.
struct RouteBufs {
    expert: wgpu::Buffer,
    weight: wgpu::Buffer,
    offsets: wgpu::Buffer,
    list: wgpu::Buffer,
}

impl RouteBufs {
    fn new(ctx: &GpuContext, slots: usize, experts: usize) -> Self {
        let f = |label: &str, n: usize| ctx.storage_buffer(label, (n * 4) as u64).unwrap();
        RouteBufs {
            expert: f("expert", slots),
            weight: f("weight", slots),
            offsets: f("offsets", experts + 1),
            list: f("list", slots),
        }
    }

    fn routes(&self) -> Routes<'_> {
        Routes {
            expert: &self.expert,
            weight: &self.weight,
            offsets: &self.offsets,
            list: &self.list,
        }
    }
}

/// The slots of each expert in increasing slot order, as offsets into one list.
fn grouped(slot_expert: &[u32], experts: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32];
    let mut list = Vec::new();
    for e in 0..experts as u32 {
        list.extend((0..slot_expert.len() as u32).filter(|&s| slot_expert[s as usize] == e));
        offsets.push(list.len() as u32);
    }
    (offsets, list)
}

#[test]
fn routing_picks_the_references_experts_and_weights_and_groups_slots_by_expert() {
    // Logits on a grid of quarters, so that many tokens have tied logits (the lower expert
    // index ranks first), and shapes up to the kernel's limits.
    for ctx in contexts() {
        for (seed, tokens, experts, top_k) in [
            (1, 37, 8, 2),
            (2, 5, 4, 4),
            (3, 300, 128, 8),
            (4, 3, 256, 16),
            (5, 1, 3, 1),
        ] {
            for routing in [
                Routing::SoftmaxTopK { renormalize: true },
                Routing::SoftmaxTopK { renormalize: false },
                Routing::TopKSoftmax,
            ] {
                let mut g = rng(seed);
                let logits: Vec<f32> = randn(&mut g, tokens * experts, 2.0)
                    .into_iter()
                    .map(|x| (x * 4.0).round() / 4.0)
                    .collect();
                let lb = ctx.upload("logits", &logits).unwrap();
                let out = RouteBufs::new(ctx, tokens * top_k, experts);
                let mix = Mixture {
                    experts,
                    top_k,
                    routing,
                };
                let mut b = Batch::new(ctx, "route");
                moe::route(&mut b, mix, &lb, tokens, out.routes()).unwrap();
                b.submit().unwrap();
                let what = format!(
                    "{tokens} tokens, {experts} experts, top {top_k}, {routing:?} on {}",
                    backend(ctx)
                );
                let slots = tokens * top_k;
                let got_e: Vec<u32> = ctx.read(&out.expert).unwrap()[..slots].to_vec();
                let got_w = read_f32(ctx, &out.weight, slots);
                let mut want_w = Vec::new();
                let mut want_e = Vec::new();
                for row in logits.chunks(experts) {
                    for (e, w) in r::route(row, top_k, routing) {
                        want_e.push(e as u32);
                        want_w.push(w);
                    }
                }
                assert_eq!(got_e, want_e, "{what}: experts");
                assert_close(&what, &got_w, &want_w, 1e-6, 1e-5);
                let (offsets, list) = grouped(&want_e, experts);
                let got_o: Vec<u32> = ctx.read(&out.offsets).unwrap();
                let got_l: Vec<u32> = ctx.read(&out.list).unwrap();
                assert_eq!(got_o[..=experts], offsets[..], "{what}: offsets");
                assert_eq!(got_l[..slots], list[..], "{what}: lists");
            }
        }
    }
}

#[test]
fn routing_rejects_shapes_beyond_its_limits() {
    for ctx in contexts() {
        let lb = ctx.upload("logits", &[0.0f32; 600]).unwrap();
        let out = RouteBufs::new(ctx, 64, 300);
        for (experts, top_k) in [(300, 2), (8, 9), (32, 17), (0, 0)] {
            let mix = Mixture {
                experts,
                top_k,
                routing: Routing::SoftmaxTopK { renormalize: true },
            };
            let mut b = Batch::new(ctx, "route");
            let err = moe::route(&mut b, mix, &lb, 2, out.routes()).unwrap_err();
            assert!(err.to_string().contains("experts"), "{err}");
        }
    }
}

/// One projection of `experts` experts `[n, k]` over `tokens` tokens routed `top_k` ways,
/// in `dtype`, the experts split over buffers of `per_buffer` experts: every slot's output
/// equals the reference product of its token's row (or its own row, `per_slot`) and its
/// expert's weights as stored, plus its expert's bias where `biased`.
#[allow(clippy::too_many_arguments)]
fn check_expert_matmul(
    ctx: &GpuContext,
    seed: u64,
    dtype: WeightDtype,
    (experts, n, k): (usize, usize, usize),
    (tokens, top_k): (usize, usize),
    per_buffer: usize,
    (per_slot, biased): (bool, bool),
) {
    let mut g = rng(seed);
    let slots = tokens * top_k;
    let rows_in = if per_slot { slots } else { tokens };
    let x = randn(&mut g, rows_in * k, 1.0);
    let ws: Vec<Vec<f32>> = (0..experts).map(|_| randn(&mut g, n * k, 0.5)).collect();
    let bias = randn(&mut g, experts * n, 1.0);
    let bias_buf = ctx.upload("bias", &bias).unwrap();
    // Each token's experts: distinct, some experts unused when there are enough of them.
    let slot_expert: Vec<u32> = (0..tokens)
        .flat_map(|t| (0..top_k).map(move |j| ((t * 3 + j * 2) % experts.max(1)) as u32))
        .collect();
    let (offsets, list) = grouped(&slot_expert, experts);
    let bytes: Vec<Vec<u8>> = ws
        .iter()
        .map(|w| kernels::weight::encode(w, dtype).unwrap())
        .collect();
    let parts: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
    let pad = if dtype.is_block() { 16 } else { 0 };
    let limit = (per_buffer * n * dtype.gpu_row_bytes(k) + pad) as u64;
    let w = Weight::upload_experts_with_limit(ctx, "experts", &parts, n, k, dtype, limit).unwrap();
    assert_eq!(w.chunks.len(), experts.div_ceil(per_buffer));
    // Output columns n_offset.. of rows of ldy, the rest left as they were.
    let (ldy, n_offset) = (n + 3, 2);
    let y0 = randn(&mut g, slots * ldy, 1.0);
    let xb = ctx.upload("x", &x).unwrap();
    let yb = ctx.upload("y", &y0).unwrap();
    let out = RouteBufs::new(ctx, slots, experts);
    let ob = ctx.upload("offsets", &offsets).unwrap();
    let lb = ctx.upload("list", &list).unwrap();
    let routes = Routes {
        offsets: &ob,
        list: &lb,
        ..out.routes()
    };
    let call = ExpertMatmul {
        x: &xb,
        weight: &w,
        n,
        routes,
        y: &yb,
        ldy,
        n_offset,
        bias: biased.then_some(&bias_buf),
        in_div: if per_slot { 1 } else { top_k },
        slots,
        subgroups: false,
    };
    let mut b = Batch::new(ctx, "experts");
    moe::expert_matmul(&mut b, &call).unwrap();
    b.submit().unwrap();
    let got = read_f32(ctx, &yb, slots * ldy);
    // The subgroup kernel, where the adapter has it, gives the same bits.
    if MatmulKernel::ColumnsSubgroup.supports(ctx, 8) {
        let yb2 = ctx.upload("y", &y0).unwrap();
        let sg = ExpertMatmul {
            y: &yb2,
            subgroups: true,
            ..call
        };
        let mut b = Batch::new(ctx, "experts sg");
        moe::expert_matmul(&mut b, &sg).unwrap();
        b.submit().unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let got_sg = read_f32(ctx, &yb2, slots * ldy);
        assert_eq!(
            bits(&got_sg),
            bits(&got),
            "the subgroup kernel on {}",
            backend(ctx)
        );
    }
    let stored: Vec<Vec<f32>> = ws.iter().map(|w| rounded(w, dtype)).collect();
    let mut want = y0.clone();
    for s in 0..slots {
        let row = if per_slot { s } else { s / top_k };
        let e = slot_expert[s] as usize;
        let b = biased.then(|| &bias[e * n..][..n]);
        let yr = r::matmul(&x[row * k..][..k], &stored[e], b, 1, n, k);
        want[s * ldy + n_offset..][..n].copy_from_slice(&yr);
    }
    let what = format!(
        "{experts} experts of {n} x {k} {dtype:?}, {tokens} tokens x {top_k}, {} buffers, \
         per slot {per_slot}, bias {biased} on {}",
        w.chunks.len(),
        backend(ctx)
    );
    assert_close(&what, &got, &want, 1e-4 * (k as f32).sqrt(), 1e-4);
}

#[test]
fn expert_projections_equal_the_reference_in_every_weight_format_across_buffers() {
    let formats = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16]
        .into_iter()
        .chain(WeightDtype::BLOCKS);
    for ctx in contexts() {
        for (i, dtype) in formats.clone().enumerate() {
            let seed = 100 + i as u64;
            // Rows of 256: whole blocks of every format. 13 tokens x 2: more than 8 slots
            // for some experts (the kernel's row groups), none for others.
            check_expert_matmul(ctx, seed, dtype, (6, 24, 256), (13, 2), 4, (false, true));
            check_expert_matmul(ctx, seed, dtype, (5, 40, 256), (3, 3), 2, (true, true));
        }
        // Odd expert heights (column tails in the kernel's 128-column workgroups), one
        // expert per buffer, and all eight-slot groups full.
        check_expert_matmul(
            ctx,
            7,
            WeightDtype::F32,
            (3, 17, 40),
            (4, 2),
            1,
            (false, false),
        );
        check_expert_matmul(
            ctx,
            8,
            WeightDtype::F16,
            (3, 193, 24),
            (9, 3),
            1,
            (true, true),
        );
        check_expert_matmul(
            ctx,
            9,
            WeightDtype::BF16,
            (2, 130, 64),
            (16, 1),
            2,
            (false, true),
        );
        // No more slots than experts: one-slot groups, four columns per invocation (an
        // expert with two slots among them, and a column tail past 256).
        check_expert_matmul(
            ctx,
            10,
            WeightDtype::F16,
            (5, 40, 64),
            (2, 2),
            5,
            (false, false),
        );
        check_expert_matmul(
            ctx,
            11,
            WeightDtype::Q4_K,
            (8, 300, 256),
            (1, 3),
            3,
            (false, true),
        );
        check_expert_matmul(
            ctx,
            12,
            WeightDtype::F32,
            (8, 72, 40),
            (1, 3),
            8,
            (true, true),
        );
    }
}

#[test]
fn expert_rows_that_are_no_multiple_of_eight_are_refused() {
    for ctx in contexts() {
        let bytes = kernels::weight::encode(&[0.5f32; 2 * 33], WeightDtype::F32).unwrap();
        let w = Weight::upload_experts(ctx, "experts", &[&bytes, &bytes], 2, 33, WeightDtype::F32)
            .unwrap();
        let out = RouteBufs::new(ctx, 2, 2);
        let x = ctx.upload("x", &[0.0f32; 66]).unwrap();
        let y = ctx.upload("y", &[0.0f32; 4]).unwrap();
        let call = ExpertMatmul {
            x: &x,
            weight: &w,
            n: 2,
            routes: out.routes(),
            y: &y,
            ldy: 2,
            n_offset: 0,
            bias: None,
            in_div: 1,
            slots: 2,
            subgroups: false,
        };
        let mut b = Batch::new(ctx, "experts");
        let err = moe::expert_matmul(&mut b, &call).unwrap_err().to_string();
        assert!(err.contains("rows of 33"), "{err}");
    }
}

#[test]
fn combining_adds_each_tokens_weighted_experts_to_the_residual() {
    for ctx in contexts() {
        let (tokens, top_k, width) = (7, 3, 300);
        let mut g = rng(11);
        let y = randn(&mut g, tokens * top_k * width, 1.0);
        let w = randn(&mut g, tokens * top_k, 0.5);
        let x0 = randn(&mut g, tokens * width, 1.0);
        let (yb, wb, xb) = (
            ctx.upload("y", &y).unwrap(),
            ctx.upload("w", &w).unwrap(),
            ctx.upload("x", &x0).unwrap(),
        );
        let mut b = Batch::new(ctx, "combine");
        moe::combine(&mut b, &yb, &wb, &xb, tokens, width, top_k).unwrap();
        b.submit().unwrap();
        let mut want = x0.clone();
        for t in 0..tokens {
            for c in 0..width {
                let sum: f64 = (0..top_k)
                    .map(|j| w[t * top_k + j] as f64 * y[(t * top_k + j) * width + c] as f64)
                    .sum();
                want[t * width + c] += sum as f32;
            }
        }
        let got = read_f32(ctx, &xb, tokens * width);
        assert_close(
            &format!("combine on {}", backend(ctx)),
            &got,
            &want,
            1e-5,
            1e-5,
        );
    }
}

/// Greedy with logprobs, ignoring EOS.
fn greedy_logprobs(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        logprobs: Some(2),
        ..greedy(max_tokens)
    }
}

/// Seeded samples, beams, greedy requests and a prompt repeated for prefix hits.
fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    let shared = prompt(40, 4);
    vec![
        (prompt(20, 1), sampled(4, 7, 30)),
        (prompt(18, 2), beams(3, 24)),
        (shared.clone(), greedy_logprobs(40)),
        (prompt(9, 3), greedy_logprobs(50)),
        (shared, sampled(2, 9, 30)),
    ]
}

#[test]
fn moe_models_keep_their_outputs_through_every_hard_path() {
    let work = workload();
    for name in golden::MOE {
        let dir = golden::fixture_dir(name);
        for ctx in contexts() {
            for kv_dtype in [KvDtype::F16, KvDtype::Int8] {
                let plain = EngineConfig {
                    kv_dtype,
                    max_model_len: Some(96),
                    ..EngineConfig::default()
                };
                let want = run(&mut engine(ctx, &dir, plain.clone()), &work);
                let modes = [Some(PreemptionMode::Swap), Some(PreemptionMode::Recompute)];
                // gpt-oss's windowed and global layers are two KV cache groups, each taking
                // blocks: twice the pool for the same pressure.
                let blocks = if name.starts_with("gpt-oss") { 48 } else { 24 };
                for mode in modes {
                    let tight = EngineConfig {
                        block_size: 8,
                        num_gpu_blocks: Some(blocks),
                        num_cpu_blocks: Some(64),
                        max_num_batched_tokens: 24,
                        preemption_mode: mode,
                        ..plain.clone()
                    };
                    let mut e = engine(ctx, &dir, tight);
                    let got = run(&mut e, &work);
                    let what = format!("{name} {kv_dtype:?} {mode:?} on {}", backend(ctx));
                    assert_same(&what, &got, &want);
                    let s = e.stats();
                    let sc = &s.scheduler;
                    assert!(sc.partial_prefills > 0, "{what}: no chunked prefill");
                    assert!(s.cache.prefix_hits > 0, "{what}: no prefix hit");
                    match mode {
                        Some(PreemptionMode::Swap) => {
                            assert!(sc.preempted_by_swap > 0, "{what}: {sc:?}")
                        }
                        _ => assert!(sc.preempted_by_recompute > 0, "{what}: {sc:?}"),
                    }
                    assert_eq!(sc.failed_requests, 0, "{what}");
                    assert_eq!(s.cache.device.used, 0, "{what}: {:?}", s.cache);
                    assert_eq!(s.cache.host.used, 0, "{what}: {:?}", s.cache);
                }
                // Speculative decoding by prompt lookup, every step speculating.
                let speculating = EngineConfig {
                    speculative: Some(SpeculativeConfig {
                        num_tokens: 3,
                        row_cost: Some(0.0),
                        ..SpeculativeConfig::default()
                    }),
                    ..plain.clone()
                };
                let mut e = engine(ctx, &dir, speculating);
                let got = run(&mut e, &work);
                let what = format!("{name} {kv_dtype:?} speculative on {}", backend(ctx));
                assert_same(&what, &got, &want);
                let sc = e.stats().scheduler;
                assert!(sc.spec_proposed > 0, "{what}: {sc:?}");
            }
        }
    }
}
