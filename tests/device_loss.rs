//! A lost device is a preemption: destroying the device in the middle of a mixed workload
//! (parallel samples, beams, a constrained request, greedy and seeded requests, a chunked
//! prompt, and groups swapped to host memory at the moment of the loss) leaves every
//! output exactly as an uninterrupted run makes it, on the engine's own device (re-created
//! by the engine) and on an application's (replaced through its callback). Losses while the
//! weights load and while they load again are retried; losses in a row are bounded and
//! then fail the requests with the reason; an application's device without a callback
//! fails them with a message that says what to register.

mod common;
use common::outputs::{self, assert_same, beams, greedy, prompt, sampled};
use common::{app_device, contexts, own_device, shipped_model};
use pagellm::internals::constrain::StructuredOutput;
use pagellm::internals::engine::{
    Engine, EngineConfig, PreemptionMode, Prompt, RequestEvent, RequestHandle, RequestOutput,
};
use pagellm::internals::sampling::SamplingParams;
use pagellm::{DeviceLossInjection, GpuContext};
use std::sync::Arc;

/// Eight requests: n = 2 and n = 3 seeded samples, a 3-beam search, a regex-constrained
/// request, greedy ones with and without logprobs, a prompt long enough to be chunked.
fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut with_logprobs = greedy(18);
    with_logprobs.logprobs = Some(3);
    let constrained = SamplingParams {
        structured_output: Some(StructuredOutput::Regex(
            r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}".into(),
        )),
        max_tokens: 24,
        ..SamplingParams::greedy()
    };
    vec![
        (prompt(20, 1), sampled(2, 7, 24)),
        (prompt(18, 2), beams(3, 18)),
        (prompt(9, 3), greedy(30)),
        (prompt(40, 4), with_logprobs),
        (prompt(5, 5), sampled(1, 9, 20)),
        (prompt(12, 6), constrained),
        (prompt(7, 7), sampled(3, 11, 16)),
        (prompt(15, 8), greedy(26)),
    ]
}

/// A pool of 16 blocks and a 64-token context: groups are swapped out all the time.
fn tight(inject: &[u64]) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: Some(16),
        num_cpu_blocks: Some(96),
        max_model_len: Some(64),
        max_num_batched_tokens: 24,
        preemption_mode: Some(PreemptionMode::Swap),
        enable_prefix_caching: false,
        inject_device_loss: Some(DeviceLossInjection {
            steps: inject.to_vec(),
            ..Default::default()
        }),
        ..EngineConfig::default()
    }
}

fn add_all(e: &mut Engine) -> Vec<RequestHandle> {
    outputs::add_all(e, &workload())
}

fn outputs(hs: &[RequestHandle]) -> Vec<RequestOutput> {
    outputs::wait_all(hs)
}

/// The uninterrupted run's outputs, and the steps (from 1) that began with a group in
/// host memory.
fn baseline(ctx: &GpuContext) -> (Vec<RequestOutput>, Vec<u64>) {
    let mut e =
        Engine::with_context(own_device(ctx), shipped_model(), tight(&[]), |_, _| {}).unwrap();
    let hs = add_all(&mut e);
    let (mut step, mut swapped_at) = (0, Vec::new());
    while e.has_unfinished() {
        step += 1;
        if e.stats().num_swapped > 0 {
            swapped_at.push(step);
        }
        e.step().unwrap();
    }
    assert!(e.stats().scheduler.preempted_by_swap > 0);
    (outputs(&hs), swapped_at)
}

#[test]
fn a_lost_own_device_is_recreated_and_every_output_is_unchanged() {
    for ctx in contexts() {
        let (want, swapped_at) = baseline(ctx);
        // The first loss comes with a group swapped out; later ones where they fall.
        let first = *swapped_at
            .first()
            .expect("no step began with a swapped group");
        let inject = [first, first + 4, first + 11];
        let own = own_device(ctx);
        let mut e = Engine::with_context(own, shipped_model(), tight(&inject), |_, _| {}).unwrap();
        let hs = add_all(&mut e);
        e.run_to_completion().unwrap();
        assert_same(
            &format!("{} own device", ctx.describe()),
            &outputs(&hs),
            &want,
        );
        let d = e.stats().device;
        assert_eq!((d.losses, d.recoveries, d.gave_up), (3, 3, 0), "{d:?}");
        assert!(d.kept_swapped > 0, "no swapped group came through: {d:?}");
        assert!(d.recomputed_groups > 0 && d.recomputed_tokens > 0, "{d:?}");
        let s = e.stats();
        assert_eq!(
            (s.cache.device.used, s.cache.host.used),
            (0, 0),
            "{:?}",
            s.cache
        );
    }
}

#[test]
fn a_lost_application_device_is_replaced_through_its_callback() {
    for ctx in contexts() {
        let (want, _) = baseline(ctx);
        let like = ctx.adapter.clone();
        let mut e =
            Engine::with_context(app_device(ctx), shipped_model(), tight(&[]), |_, _| {}).unwrap();
        let given = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = given.clone();
        let main = ctx.adapter.get_info();
        e.on_device_lost(move |why| {
            assert!(
                why.contains("Destroyed"),
                "the application's callback was not heard: {why}"
            );
            assert_eq!(like.get_info().name, main.name);
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(app_device(ctx))
        });
        let hs = add_all(&mut e);
        let mut step = 0;
        while e.has_unfinished() {
            step += 1;
            let mut s = e.begin_step().unwrap();
            // The application's device goes while the step runs on it.
            if step == 4 || step == 13 {
                e.context().device.destroy();
            }
            e.wait_step(&mut s).unwrap();
            e.end_step(s).unwrap();
        }
        assert_same(
            &format!("{} application device", ctx.describe()),
            &outputs(&hs),
            &want,
        );
        assert_eq!(given.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(e.stats().device.recoveries, 2);
    }
}

/// Prompts sharing a 32-token prefix, then others that push them out of a 24-block pool of
/// 4-token blocks, then the first ones again: the prefix cache's device, host and disk
/// tiers all hold blocks when the device goes.
fn tiered_workload() -> Vec<Vec<(Vec<u32>, SamplingParams)>> {
    let shared = |salt| [&prompt(41, 1)[..32], &prompt(6, salt)[..]].concat();
    let first = vec![(prompt(41, 1), greedy(8)), (shared(9), sampled(2, 5, 8))];
    let flood = (2..5).map(|salt| (prompt(44, salt), greedy(4))).collect();
    let again = vec![(shared(10), greedy(8)), (prompt(41, 1), sampled(1, 3, 8))];
    vec![first, flood, again]
}

/// The tiered workload, batch after batch, with the device lost at `inject`.
fn run_tiered(ctx: &GpuContext, inject: &[u64]) -> (Vec<RequestOutput>, pagellm::EngineStats) {
    let disk = tempfile::TempDir::new().unwrap();
    let cfg = EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(24),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        host_tier_blocks: Some(48),
        kv_cache_dir: Some(disk.path().to_path_buf()),
        // The model drafts for itself: its runner is rebuilt too.
        draft_model: Some(shipped_model().into()),
        speculative: Some(pagellm::SpeculativeConfig {
            num_tokens: 3,
            row_cost: Some(0.0),
            ..Default::default()
        }),
        inject_device_loss: Some(DeviceLossInjection {
            steps: inject.to_vec(),
            ..Default::default()
        }),
        ..EngineConfig::default()
    };
    let mut e = Engine::with_context(own_device(ctx), shipped_model(), cfg, |_, _| {}).unwrap();
    let mut out = Vec::new();
    for batch in tiered_workload() {
        let hs: Vec<_> = batch
            .into_iter()
            .map(|(p, s)| e.add_request(Prompt::Tokens(p), s).unwrap())
            .collect();
        e.run_to_completion().unwrap();
        out.extend(outputs(&hs));
    }
    (out, e.stats())
}

#[test]
fn prefix_tiers_and_a_draft_model_come_through_losses() {
    for ctx in contexts() {
        let (want, calm) = run_tiered(ctx, &[]);
        assert!(calm.cache.host_tier.hits > 0, "{:?}", calm.cache.host_tier);
        let (got, s) = run_tiered(ctx, &[2, 5, 9, 14]);
        assert_same(&format!("{} tiers and draft", ctx.describe()), &got, &want);
        assert_eq!(s.device.recoveries, 4, "{:?}", s.device);
        // Host memory came through: the last batch still found its prefix there.
        let tiers = (s.cache.host_tier.hits, s.disk.map_or(0, |d| d.hits));
        assert!(tiers.0 + tiers.1 > 0, "{tiers:?}");
        assert!(s.draft.is_some_and(|d| d.passes > 0));
    }
}

#[test]
fn losses_while_loading_and_reloading_are_retried() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let (want, _) = baseline(ctx);
    let mut cfg = tight(&[3]);
    cfg.inject_device_loss = Some(DeviceLossInjection::parse("load,3,reload").unwrap());
    let mut e =
        Engine::with_context(own_device(ctx), shipped_model(), cfg.clone(), |_, _| {}).unwrap();
    let hs = add_all(&mut e);
    e.run_to_completion().unwrap();
    assert_same("load, reload", &outputs(&hs), &want);
    let d = e.stats().device;
    assert_eq!((d.losses, d.recoveries), (1, 1), "{d:?}");
    // The same loss at load on an application's device without a callback: a clear error.
    let err = Engine::with_context(app_device(ctx), shipped_model(), cfg, |_, _| {})
        .err()
        .expect("the load survived a destroyed application device without a callback");
    let msg = err.to_string();
    assert!(msg.contains("on_device_lost"), "{msg}");
}

#[test]
fn losses_in_a_row_are_bounded_then_fail_the_requests_with_the_reason() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let (want, _) = baseline(ctx);
    let cfg = tight(&[3, 4, 5, 6]);
    let mut e = Engine::with_context(own_device(ctx), shipped_model(), cfg, |_, _| {}).unwrap();
    let hs = add_all(&mut e);
    let mut failed_steps = 0;
    for _ in 0..40 {
        if !e.has_unfinished() {
            break;
        }
        if e.step().is_err() {
            failed_steps += 1;
        }
    }
    assert_eq!(failed_steps, 1, "the fourth loss in a row fails one step");
    assert!(!e.has_unfinished());
    for h in &hs {
        let last = h.events.try_iter().last();
        assert!(
            matches!(&last, Some(RequestEvent::Failed(m)) if m.contains("in a row")),
            "{last:?}"
        );
    }
    let d = e.stats().device;
    assert_eq!((d.recoveries, d.gave_up), (3, 1), "{d:?}");
    // The engine takes requests again and recovers at the next step.
    let hs = add_all(&mut e);
    e.run_to_completion().unwrap();
    assert_same("after giving up", &outputs(&hs), &want);
    assert_eq!(e.stats().device.recoveries, 4);
}

#[test]
fn an_application_device_without_a_callback_fails_the_requests_saying_so() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let app = app_device(ctx);
    let mut e = Engine::with_context(app.clone(), shipped_model(), tight(&[]), |_, _| {}).unwrap();
    let hs: Vec<_> = (0..3)
        .map(|i| {
            e.add_request(Prompt::Tokens(prompt(10, i)), greedy(20))
                .unwrap()
        })
        .collect();
    e.step().unwrap();
    app.device.destroy();
    let err = (0..3).find_map(|_| e.step().err()).expect("no step failed");
    assert!(err.to_string().contains("on_device_lost"), "{err}");
    assert!(!e.has_unfinished(), "requests are left pending");
    for h in &hs {
        let last = h.events.try_iter().last();
        assert!(
            matches!(&last, Some(RequestEvent::Failed(m)) if m.contains("on_device_lost")),
            "{last:?}"
        );
    }
}

#[test]
fn a_smaller_replacement_device_gets_a_smaller_pool_and_outputs_stay() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let (want, _) = baseline(ctx);
    // 96 blocks of 32 KiB in one 3 MiB buffer; the replacement refuses buffers over 1 MiB.
    let cfg = EngineConfig {
        num_gpu_blocks: Some(96),
        ..tight(&[5])
    };
    let mut e = Engine::with_context(app_device(ctx), shipped_model(), cfg, |_, _| {}).unwrap();
    e.on_device_lost(move |_| {
        let small = app_device(ctx);
        Some(Arc::new(
            Arc::try_unwrap(small)
                .ok()?
                .with_allocation_limit(Some(1 << 20)),
        ))
    });
    let hs = add_all(&mut e);
    e.run_to_completion().unwrap();
    assert_same("smaller replacement", &outputs(&hs), &want);
    let s = e.stats();
    assert_eq!(s.device.recoveries, 1);
    assert!(s.kv_blocks < 96 && s.kv_blocks >= 4, "{}", s.kv_blocks);
}
