//! The engine within what browsers grant: on devices opened with WebGPU's default limits and
//! no optional features (what every WebGPU implementation must offer: 8 storage buffers per
//! stage, 128 MiB bindings, 256 MiB buffers, 256 invocations per workgroup, 16 KiB of
//! workgroup memory, offsets aligned to 256 bytes), and with the limits headless Chromium's
//! SwiftShader adapter reports (10 storage buffers, 1 GiB bindings, subgroups, no f16), the
//! shipped model gives transformers' greedy tokens, and every request kind (greedy, seeded
//! samples, beams) under swap preemption gives the full device's tokens. Logprobs are
//! compared within a tolerance: the two devices run different kernel variants (no f16, no
//! subgroups, bindings split where the full device needs none).

mod common;
use common::contexts;
use common::outputs::{beams, greedy, prompt, run, sampled};
use pagellm::internals::engine::{Engine, EngineConfig, PreemptionMode, Prompt};
use pagellm::{wgpu, GpuContext};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// A device on `ctx`'s adapter within `limits` (the limits compute work meets: buffers,
/// bindings, workgroups, alignments; the adapter's own where it offers less) and with only the
/// optional `features`.
fn device_within(
    ctx: &GpuContext,
    limits: wgpu::Limits,
    features: wgpu::Features,
) -> Arc<GpuContext> {
    let adapter = ctx.adapter.clone();
    let mut l = adapter.limits();
    // Each limit as `limits` has it, or the adapter's where that is stricter.
    macro_rules! at_most {
        ($($field:ident),*) => { $(l.$field = l.$field.min(limits.$field);)* };
    }
    macro_rules! at_least {
        ($($field:ident),*) => { $(l.$field = l.$field.max(limits.$field);)* };
    }
    at_most!(
        max_bind_groups,
        max_storage_buffers_per_shader_stage,
        max_storage_buffer_binding_size,
        max_buffer_size,
        max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup,
        max_compute_workgroup_size_x,
        max_compute_workgroup_size_y,
        max_compute_workgroup_size_z,
        max_compute_workgroups_per_dimension
    );
    at_least!(
        min_storage_buffer_offset_alignment,
        min_uniform_buffer_offset_alignment
    );
    let desc = wgpu::DeviceDescriptor {
        label: Some("browser limits"),
        required_features: features & adapter.features(),
        required_limits: l,
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&desc)).unwrap();
    Arc::new(GpuContext::from_existing(adapter, device, queue))
}

/// WebGPU's default limits, as wgpu spells them.
fn webgpu_defaults() -> wgpu::Limits {
    wgpu::Limits::default()
}

/// What headless Chromium 156's SwiftShader adapter reported (navigator.gpu).
fn chromium_swiftshader() -> wgpu::Limits {
    wgpu::Limits {
        max_bind_groups: 4,
        max_storage_buffers_per_shader_stage: 10,
        max_storage_buffer_binding_size: 1 << 30,
        max_buffer_size: 1 << 30,
        max_compute_workgroup_storage_size: 32768,
        max_compute_invocations_per_workgroup: 256,
        max_compute_workgroup_size_x: 256,
        max_compute_workgroup_size_y: 256,
        max_compute_workgroup_size_z: 64,
        min_storage_buffer_offset_alignment: 256,
        min_uniform_buffer_offset_alignment: 256,
        ..wgpu::Limits::default()
    }
}

fn shipped() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama")
}

fn transformers_greedy_tokens(ctx: Arc<GpuContext>, config: EngineConfig, what: &str) {
    let dir = shipped();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let mut e = Engine::with_context(ctx, &dir, config, |_, _| {}).unwrap();
    let ids = common::json_ids;
    for case in expected["cases"].as_array().unwrap() {
        let mut params = greedy(16);
        params.ignore_eos = true;
        let prompt = Prompt::Text(case["prompt"].as_str().unwrap().to_string());
        let h = e.add_request(prompt, params).unwrap();
        e.run_to_completion().unwrap();
        assert_eq!(
            h.wait().unwrap().outputs[0].token_ids,
            ids(&case["greedy_ids"]),
            "{what}: {}",
            case["prompt"]
        );
    }
}

#[test]
fn the_shipped_model_runs_within_browser_limits() {
    for ctx in contexts() {
        for (name, limits, features) in [
            (
                "WebGPU defaults",
                webgpu_defaults(),
                wgpu::Features::empty(),
            ),
            (
                "Chromium SwiftShader",
                chromium_swiftshader(),
                wgpu::Features::SUBGROUP,
            ),
        ] {
            let what = format!("{} with {name}", ctx.describe());
            let small = device_within(ctx, limits, features);
            transformers_greedy_tokens(small, EngineConfig::default(), &what);
        }
    }
}

/// A KV pool larger than WebGPU's default largest buffer (256 MiB) and binding (128 MiB)
/// is split into arenas within them, and still gives transformers' tokens.
#[test]
fn a_pool_larger_than_a_browser_buffer_splits_within_the_limits() {
    for ctx in contexts() {
        let small = device_within(ctx, webgpu_defaults(), wgpu::Features::empty());
        let config = EngineConfig {
            kv_cache_bytes: Some(384 << 20),
            ..EngineConfig::default()
        };
        let e = Engine::with_context(small.clone(), shipped(), config.clone(), |_, _| {}).unwrap();
        let st = e.stats();
        assert!(st.kv_pool_bytes > 256 << 20, "{} bytes", st.kv_pool_bytes);
        drop(e);
        transformers_greedy_tokens(small, config, &format!("{}, 384 MiB pool", ctx.describe()));
    }
}

#[test]
fn every_request_kind_matches_the_full_device_within_webgpu_defaults() {
    let work = vec![
        (prompt(21, 1), greedy(12)),
        (prompt(13, 2), sampled(2, 7, 12)),
        (prompt(9, 3), beams(3, 8)),
        (prompt(30, 4), greedy(20)),
    ];
    let config = || EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(24),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        preemption_mode: Some(PreemptionMode::Swap),
        ..EngineConfig::default()
    };
    for ctx in contexts() {
        let small = device_within(ctx, webgpu_defaults(), wgpu::Features::empty());
        let full = Arc::new(GpuContext::from_existing(
            ctx.adapter.clone(),
            ctx.device.clone(),
            ctx.queue.clone(),
        ));
        let dir = common::golden::fixture_dir("llama-gqa");
        let want = run(
            &mut Engine::with_context(full, &dir, config(), |_, _| {}).unwrap(),
            &work,
        );
        let mut e = Engine::with_context(small, &dir, config(), |_, _| {}).unwrap();
        let got = run(&mut e, &work);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            for (a, b) in g.outputs.iter().zip(&w.outputs) {
                let what = format!("{}: request {i} sample {}", ctx.describe(), a.index);
                assert_eq!(a.token_ids, b.token_ids, "{what}");
                assert_eq!(a.finish_reason, b.finish_reason, "{what}");
                let gap = (a.cumulative_logprob - b.cumulative_logprob).abs();
                assert!(gap < 1e-3, "{what}: cumulative logprob {gap} apart");
            }
            assert_eq!(g.outputs.len(), w.outputs.len());
        }
        assert!(e.stats().scheduler.preempted_by_swap > 0);
    }
}
