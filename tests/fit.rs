//! Fitting the device's memory, with allocations refused on purpose
//! (`GpuContext::with_allocation_limit`, as `PAGELLM_INJECT_ALLOCATION_LIMIT` does): a KV
//! pool the device refuses is retried at half the size until it fits, and the engine
//! serves with it; a growing live budget takes what the device gives; weights or a minimal
//! pool the device refuses fail the load with what they need and the options that would
//! make them fit. A pool given no size takes a share of the free memory the device
//! reports (`GpuContext::with_memory_report`, as `PAGELLM_INJECT_DEVICE_MEMORY` does), and a
//! context that does not fit it is shortened.

mod common;
use common::outputs::greedy;
use common::{arc, contexts, shipped_model};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::gpu::DeviceMemory;
use pagellm::internals::pool::{KvDtype, PoolSize};
use pagellm::{AdapterRequest, GpuContext};
use std::sync::Arc;

/// A device of its own on `like`'s backend.
fn own(like: &GpuContext) -> GpuContext {
    let req = AdapterRequest {
        backends: wgpu::Backends::from(like.info.backend),
        ..Default::default()
    };
    GpuContext::new(&req).unwrap()
}

/// A device of its own on `like`'s backend refusing buffers over `limit` bytes.
fn short_of_memory(like: &GpuContext, limit: u64) -> Arc<GpuContext> {
    Arc::new(own(like).with_allocation_limit(Some(limit)))
}

#[test]
fn a_refused_pool_is_retried_smaller_and_serves() {
    for ctx in contexts() {
        // 256 MiB asked (8192 blocks of 32 KiB); buffers over 40 MiB are refused.
        let dev = short_of_memory(ctx, 40 << 20);
        let config = EngineConfig {
            kv_cache_bytes: Some(256 << 20),
            ..EngineConfig::default()
        };
        let mut e = Engine::with_context(dev, shipped_model(), config, |_, _| {}).unwrap();
        let s = e.stats();
        assert!(s.kv_blocks < 8192 && s.kv_blocks >= 32, "{}", s.kv_blocks);
        assert!(s.kv_pool_bytes <= 4 * (40 << 20), "{}", s.kv_pool_bytes);
        let h = e
            .add_request(Prompt::Tokens(vec![5, 6, 7]), greedy(8))
            .unwrap();
        e.run_to_completion().unwrap();
        assert_eq!(h.wait().unwrap().outputs[0].token_ids.len(), 8);
        // Asked to grow back to 256 MiB, the pool takes what the device gives.
        let before = s.kv_blocks;
        let grown = e.set_kv_budget(PoolSize::Bytes(256 << 20)).unwrap();
        assert!(
            grown.blocks_after >= before && grown.blocks_after < 8192,
            "{grown:?}"
        );
    }
}

/// The error loading the shipped model with `config` on a device refusing buffers over
/// `limit` bytes.
fn load_error(ctx: &GpuContext, limit: u64, config: EngineConfig) -> String {
    Engine::with_context(
        short_of_memory(ctx, limit),
        shipped_model(),
        config,
        |_, _| {},
    )
    .err()
    .expect("loaded")
    .to_string()
}

#[test]
fn weights_or_a_minimal_pool_that_do_not_fit_say_what_they_need() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    // Buffers over 64 KiB refused: not even the weights fit.
    let err = load_error(ctx, 64 << 10, EngineConfig::default());
    assert!(
        err.contains("weights (6.5 MiB in the checkpoint") && err.contains("--weight-dtype q4_k"),
        "{err}"
    );
    // Buffers over 1.5 MiB refused: the weights fit, but not the working buffers of 512
    // tokens a step (the MLP's 2.7 MiB)...
    let err = load_error(ctx, 3 << 19, EngineConfig::default());
    assert!(
        err.contains("working buffers for 512 tokens") && err.contains("--max-batched-tokens"),
        "{err}"
    );
    // ...and with 128 tokens a step, an f32 pool of the 32 blocks one 512-token sequence
    // needs (2 MiB) does not.
    let f32_pool = EngineConfig {
        kv_dtype: KvDtype::F32,
        max_num_batched_tokens: 128,
        ..EngineConfig::default()
    };
    let err = load_error(ctx, 3 << 19, f32_pool);
    assert!(
        err.contains("needs at least 32 blocks") && err.contains("--kv-dtype int8"),
        "{err}"
    );
}

/// A device of its own on `like`'s backend whose driver reports `memory`.
fn reporting(like: &GpuContext, memory: DeviceMemory) -> Arc<GpuContext> {
    Arc::new(own(like).with_memory_report(Some(memory)))
}

/// What the shipped model's weights take on a device.
fn weight_bytes(ctx: &GpuContext) -> u64 {
    let config = EngineConfig {
        num_gpu_blocks: Some(32),
        ..EngineConfig::default()
    };
    engine(arc(ctx), config).stats().weights.total
}

fn engine(ctx: Arc<GpuContext>, config: EngineConfig) -> Engine {
    Engine::with_context(ctx, shipped_model(), config, |_, _| {}).unwrap()
}

#[test]
fn a_pool_given_no_size_takes_its_share_of_the_reported_free_memory() {
    for ctx in contexts() {
        let weights = weight_bytes(ctx);
        // 10 MiB free once the weights are on: 0.8 x 10 MiB is 256 blocks of 32 KiB.
        let dev = reporting(ctx, DeviceMemory::injected(weights + (10 << 20)));
        let mut e = engine(dev, EngineConfig::default());
        assert_eq!(e.stats().kv_blocks, 256);
        let h = e
            .add_request(Prompt::Tokens(vec![5, 6, 7]), greedy(8))
            .unwrap();
        e.run_to_completion().unwrap();
        assert_eq!(h.wait().unwrap().outputs[0].token_ids.len(), 8);
        // Half of it, when asked for half.
        let half = EngineConfig {
            kv_memory_fraction: 0.4,
            ..EngineConfig::default()
        };
        let dev = reporting(ctx, DeviceMemory::injected(weights + (10 << 20)));
        assert_eq!(engine(dev, half).stats().kv_blocks, 128);
        // Plenty free: every sequence (64) at the full context (32 blocks), no more.
        let dev = reporting(ctx, DeviceMemory::injected(8 << 30));
        assert_eq!(
            engine(dev, EngineConfig::default()).stats().kv_blocks,
            64 * 32
        );
        // The host's memory: 256 MiB at most (8192 blocks), though 512 sequences at the
        // full context would take 16384.
        let host = DeviceMemory {
            host_memory: true,
            ..DeviceMemory::injected(8 << 30)
        };
        let many = EngineConfig {
            max_num_seqs: 512,
            ..EngineConfig::default()
        };
        assert_eq!(engine(reporting(ctx, host), many).stats().kv_blocks, 8192);
        // These software adapters report nothing: 256 MiB at most, so every sequence.
        if ctx.memory().is_none() {
            let e = engine(arc(ctx), EngineConfig::default());
            assert_eq!(e.stats().kv_blocks, 64 * 32);
        }
    }
}

#[test]
fn a_context_the_free_memory_cannot_hold_is_shortened() {
    for ctx in contexts() {
        let weights = weight_bytes(ctx);
        // 0.8 x 500 KiB = 400 KiB once the weights are on: 12 blocks of 32 KiB, so one
        // sequence of 192 tokens where the model has 512.
        let small = DeviceMemory::injected(weights + (500 << 10));
        let mut e = engine(reporting(ctx, small), EngineConfig::default());
        assert_eq!((e.max_model_len(), e.stats().kv_blocks), (192, 12));
        let long = e
            .add_request(Prompt::Tokens(vec![7; 200]), greedy(4))
            .expect_err("a 200-token prompt in a 192-token context")
            .to_string();
        assert!(long.contains("192"), "{long}");
        let h = e
            .add_request(Prompt::Tokens(vec![5, 6, 7]), greedy(8))
            .unwrap();
        e.run_to_completion().unwrap();
        assert_eq!(h.wait().unwrap().outputs[0].token_ids.len(), 8);
        // A context given is kept: the pool is raised to one sequence of it, which this
        // device gives.
        let told = EngineConfig {
            max_model_len: Some(512),
            ..EngineConfig::default()
        };
        let e = engine(reporting(ctx, small), told);
        assert_eq!((e.max_model_len(), e.stats().kv_blocks), (512, 32));
    }
}

#[test]
fn a_share_outside_zero_to_one_is_refused() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    for f in [0.0, -0.5, 1.5, f64::NAN] {
        let config = EngineConfig {
            kv_memory_fraction: f,
            ..EngineConfig::default()
        };
        let err = Engine::with_context(arc(ctx), shipped_model(), config, |_, _| {})
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("kv_memory_fraction"), "{f}: {err}");
    }
}
