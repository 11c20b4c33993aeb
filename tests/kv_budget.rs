//! The KV budget changes while the engine serves: shrinking the device pool to a quarter
//! in the middle of a loaded run (parallel samples, beams, a chunked prompt) and growing it
//! back changes no output, field by field, in every preemption mode; the pool's device
//! memory really goes down (wgpu's allocator report, where the backend has one); a budget
//! below one full-context sequence is refused with the reason, and nothing changes.

mod common;
use common::outputs::{self, assert_same, beams, greedy, prompt, sampled};
use common::{contexts, own_device, shipped_model};
use pagellm::internals::engine::{
    Engine, EngineConfig, PreemptionMode, RequestHandle, RequestOutput,
};
use pagellm::internals::pool::PoolSize;
use pagellm::internals::sampling::SamplingParams;
use pagellm::GpuContext;

fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    vec![
        (prompt(20, 1), sampled(3, 7, 24)),
        (prompt(18, 2), beams(3, 18)),
        (prompt(9, 3), greedy(30)),
        (prompt(40, 4), greedy(18)),
        (prompt(5, 5), sampled(1, 9, 20)),
        (prompt(15, 8), greedy(26)),
    ]
}

/// 64 blocks of 16 tokens and a 64-token context (a sequence needs 4 blocks).
fn config(mode: Option<PreemptionMode>) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: Some(64),
        num_cpu_blocks: Some(96),
        max_model_len: Some(64),
        max_num_batched_tokens: 32,
        preemption_mode: mode,
        ..EngineConfig::default()
    }
}

fn start(e: &mut Engine) -> Vec<RequestHandle> {
    outputs::add_all(e, &workload())
}

fn outputs(hs: &[RequestHandle]) -> Vec<RequestOutput> {
    outputs::wait_all(hs)
}

/// Bytes wgpu's allocator has handed out on `ctx`'s device, where it reports them.
fn allocated(ctx: &GpuContext) -> Option<u64> {
    ctx.device
        .generate_allocator_report()
        .map(|r| r.total_allocated_bytes)
}

#[test]
fn shrinking_to_a_quarter_and_growing_back_mid_run_changes_no_output() {
    for ctx in contexts() {
        let want = {
            let mut e =
                Engine::with_context(own_device(ctx), shipped_model(), config(None), |_, _| {})
                    .unwrap();
            let hs = start(&mut e);
            e.run_to_completion().unwrap();
            outputs(&hs)
        };
        for mode in [
            Some(PreemptionMode::Swap),
            Some(PreemptionMode::Recompute),
            None,
        ] {
            let what = format!("{} {mode:?}", ctx.describe());
            let dev = own_device(ctx);
            let mut e = Engine::with_context(dev.clone(), shipped_model(), config(mode), |_, _| {})
                .unwrap();
            let hs = start(&mut e);
            // Into the run, with more blocks in use than the smaller pool has.
            for _ in 0..40 {
                if e.stats().cache.device.used > 16 {
                    break;
                }
                e.step().unwrap();
            }
            assert!(e.stats().cache.device.used > 16, "{what}");
            let before = allocated(&dev);
            let shrunk = e.set_kv_budget(PoolSize::Blocks(16)).unwrap();
            assert_eq!(
                (shrunk.blocks_before, shrunk.blocks_after),
                (64, 16),
                "{what}"
            );
            assert_eq!(shrunk.bytes_after * 4, shrunk.bytes_before, "{what}");
            assert!(shrunk.preempted_groups > 0, "{what}: {shrunk:?}");
            eprintln!("{what}: allocator {before:?} -> {:?}", allocated(&dev));
            if let (Some(b), Some(a)) = (before, allocated(&dev)) {
                let freed = b.saturating_sub(a);
                assert!(
                    freed >= shrunk.bytes_before - shrunk.bytes_after,
                    "{what}: the allocator holds {b} then {a} bytes"
                );
            }
            assert_eq!(e.stats().kv_blocks, 16);
            for _ in 0..8 {
                e.step().unwrap();
            }
            let s = e.stats();
            assert!(s.scheduler.preemptions > 0, "{what}: {:?}", s.scheduler);
            let grown = e
                .set_kv_budget(PoolSize::Bytes(shrunk.bytes_before))
                .unwrap();
            assert_eq!(grown.blocks_after, 64, "{what}");
            e.run_to_completion().unwrap();
            assert_same(&what, &outputs(&hs), &want);
            let s = e.stats();
            assert_eq!((s.cache.device.used, s.cache.host.used), (0, 0), "{what}");
            assert_eq!(s.scheduler.failed_requests, 0, "{what}");
        }
    }
}

#[test]
fn a_budget_below_one_sequence_is_refused_and_changes_nothing() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let mut e =
        Engine::with_context(own_device(ctx), shipped_model(), config(None), |_, _| {}).unwrap();
    let hs = start(&mut e);
    e.step().unwrap();
    let err = e
        .set_kv_budget(PoolSize::Blocks(3))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs 4 blocks") && err.contains("max_model_len"),
        "{err}"
    );
    assert_eq!(e.stats().kv_blocks, 64);
    e.run_to_completion().unwrap();
    assert!(outputs(&hs)
        .iter()
        .all(|o| o.outputs.iter().all(|c| !c.token_ids.is_empty())));
}

#[test]
fn a_device_lost_during_a_resize_is_recovered_and_the_resize_done() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let want = {
        let mut e = Engine::with_context(own_device(ctx), shipped_model(), config(None), |_, _| {})
            .unwrap();
        let hs = start(&mut e);
        e.run_to_completion().unwrap();
        outputs(&hs)
    };
    let mode = Some(PreemptionMode::Swap);
    let mut e =
        Engine::with_context(own_device(ctx), shipped_model(), config(mode), |_, _| {}).unwrap();
    let hs = start(&mut e);
    for _ in 0..40 {
        if e.stats().cache.device.used > 16 {
            break;
        }
        e.step().unwrap();
    }
    e.context().device.destroy();
    let shrunk = e.set_kv_budget(PoolSize::Blocks(16)).unwrap();
    assert_eq!(shrunk.blocks_after, 16);
    assert_eq!(e.stats().device.recoveries, 1);
    e.run_to_completion().unwrap();
    assert_same("lost during a resize", &outputs(&hs), &want);
    assert_eq!(e.stats().kv_blocks, 16);
}
