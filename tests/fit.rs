//! Fitting the device's memory, with allocations refused on purpose
//! (`GpuContext::with_allocation_limit`, as `PAGELLM_INJECT_ALLOCATION_LIMIT` does): a KV
//! pool the device refuses is retried at half the size until it fits, and the engine
//! serves with it; a growing live budget takes what the device gives; weights or a minimal
//! pool the device refuses fail the load with what they need and the options that would
//! make them fit.

mod common;
use common::outputs::greedy;
use common::{contexts, shipped_model};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::pool::{KvDtype, PoolSize};
use pagellm::{AdapterRequest, GpuContext};
use std::sync::Arc;

/// A device of its own on `like`'s backend refusing buffers over `limit` bytes.
fn short_of_memory(like: &GpuContext, limit: u64) -> Arc<GpuContext> {
    let req = AdapterRequest {
        backends: wgpu::Backends::from(like.info.backend),
        ..Default::default()
    };
    Arc::new(
        GpuContext::new(&req)
            .unwrap()
            .with_allocation_limit(Some(limit)),
    )
}

#[test]
fn a_refused_pool_is_retried_smaller_and_serves() {
    for ctx in contexts() {
        // 256 MiB asked (8192 blocks of 32 KiB); buffers over 40 MiB are refused.
        let dev = short_of_memory(ctx, 40 << 20);
        let mut e =
            Engine::with_context(dev, shipped_model(), EngineConfig::default(), |_, _| {}).unwrap();
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

#[test]
fn weights_or_a_minimal_pool_that_do_not_fit_say_what_they_need() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    // Buffers over 64 KiB refused: not even the weights fit.
    let err = Engine::with_context(
        short_of_memory(ctx, 64 << 10),
        shipped_model(),
        EngineConfig::default(),
        |_, _| {},
    )
    .err()
    .expect("loaded")
    .to_string();
    assert!(
        err.contains("weights (6.5 MiB in the checkpoint") && err.contains("--weight-dtype q4_k"),
        "{err}"
    );
    // Buffers over 1.5 MiB refused: the weights fit, but an f32 pool of the 32 blocks one
    // 512-token sequence needs (2 MiB) does not.
    let f32_pool = EngineConfig {
        kv_dtype: KvDtype::F32,
        ..EngineConfig::default()
    };
    let err = Engine::with_context(
        short_of_memory(ctx, 3 << 19),
        shipped_model(),
        f32_pool,
        |_, _| {},
    )
    .err()
    .expect("loaded")
    .to_string();
    assert!(
        err.contains("needs at least 32 blocks") && err.contains("--kv-dtype int8"),
        "{err}"
    );
}
