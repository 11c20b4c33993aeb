//! The engine on the GPU under the hard paths: parallel sampling and beam search under
//! forced preemption in every mode give exactly the outputs of an unpressured run, field by
//! field; a request's output never depends on what else is in its steps (both with f16,
//! int8 and int4 caches); a request whose
//! caller went away is aborted and freed; a request that can never fit fails alone;
//! `max_model_len` lets a small pool serve. (A step that fails for everyone, and a lost
//! device, which is recovered from instead: `device_loss.rs`.)

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::{arc, contexts, golden};
use pagellm::internals::engine::scheduler::MIN_PACED_PREFILL;
use pagellm::internals::engine::{
    Engine, EngineConfig, EngineError, PreemptionMode, Prompt, RequestOutput,
};
use pagellm::internals::pool::KvDtype;
use pagellm::internals::sampling::SamplingParams;

/// The mixed workload: n = 4 samples, a 4-beam search, greedy requests with and without
/// logprobs, and a prompt long enough to be chunked.
fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut with_logprobs = greedy(18);
    with_logprobs.logprobs = Some(3);
    vec![
        (prompt(20, 1), sampled(4, 7, 24)),
        (prompt(18, 2), beams(4, 20)),
        (prompt(9, 3), greedy(30)),
        (prompt(40, 4), with_logprobs),
        (prompt(5, 5), sampled(1, 9, 20)),
    ]
}

/// 64-token context, so that a 16-block pool is a valid configuration.
fn small(mode: Option<PreemptionMode>) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: Some(16),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        max_num_batched_tokens: 24,
        preemption_mode: mode,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    }
}

#[test]
fn samples_and_beams_under_forced_preemption_equal_an_unpressured_run() {
    preemption_invariance(KvDtype::F16);
}

#[test]
fn preemption_invariance_with_an_int8_cache() {
    preemption_invariance(KvDtype::Int8);
}

#[test]
fn preemption_invariance_with_an_int4_cache() {
    preemption_invariance(KvDtype::Int4);
}

fn preemption_invariance(kv_dtype: KvDtype) {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let work = workload();
        let ample = EngineConfig {
            max_model_len: Some(64),
            kv_dtype,
            ..EngineConfig::default()
        };
        let want = run(&mut engine(ctx, &dir, ample), &work);
        for mode in [
            Some(PreemptionMode::Swap),
            Some(PreemptionMode::Recompute),
            None,
        ] {
            let mode_cfg = EngineConfig {
                kv_dtype,
                ..small(mode)
            };
            let mut e = engine(ctx, &dir, mode_cfg);
            let got = run(&mut e, &work);
            assert_same(&format!("{kv_dtype} {mode:?}"), &got, &want);
            let s = e.stats();
            let sc = s.scheduler;
            assert!(sc.preemptions > 0, "{mode:?}: no preemption: {sc:?}");
            match mode {
                Some(PreemptionMode::Swap) => assert!(sc.preempted_by_swap > 0, "{sc:?}"),
                Some(PreemptionMode::Recompute) => {
                    assert!(
                        sc.preempted_by_recompute > 0 && sc.preempted_by_swap == 0,
                        "{sc:?}"
                    )
                }
                // Which victims come up depends on the tokens generated; with the f16 cache's
                // tokens some victim is one whose mode the costs decide.
                None if kv_dtype == KvDtype::F16 => assert!(
                    sc.chosen_by_cost > 0,
                    "automatic mode never used its costs: {sc:?}"
                ),
                None => {}
            }
            // The 40-token prompt cannot go in one 24-token step: it was chunked.
            assert!(
                sc.partial_prefills > 0,
                "{mode:?}: no chunked prefill: {sc:?}"
            );
            assert_eq!(sc.failed_requests, 0);
            assert_eq!(s.cache.device.used, 0, "{mode:?}: {:?}", s.cache);
            assert_eq!(s.cache.host.used, 0, "{mode:?}: {:?}", s.cache);
        }
    }
}

#[test]
fn every_output_field_is_the_same_alone_and_in_any_batch() {
    batching_invariance(KvDtype::F16);
}

#[test]
fn batching_invariance_with_quantized_caches() {
    batching_invariance(KvDtype::Int8);
    batching_invariance(KvDtype::Int4);
}

fn batching_invariance(kv_dtype: KvDtype) {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let work = workload();
        let cfg = EngineConfig {
            kv_dtype,
            ..EngineConfig::default()
        };
        let mut e = engine(ctx, &dir, cfg);
        let alone: Vec<RequestOutput> = work
            .iter()
            .map(|w| run(&mut e, std::slice::from_ref(w)).remove(0))
            .collect();
        // A greedy request alone runs on the GPU's arg-max path, with the chosen token's
        // logprob from the same kernel; its cumulative logprob is real, not zero.
        let greedy_alone = &alone[2].outputs[0];
        assert!(
            greedy_alone.cumulative_logprob < 0.0,
            "{}",
            greedy_alone.cumulative_logprob
        );
        let together = run(&mut e, &work);
        assert_same(&format!("{kv_dtype} batched"), &together, &alone);
        // The GPU's logprob agrees with the sampler's log_softmax of the read-back logits.
        let mut with_lp = greedy(30);
        with_lp.logprobs = Some(0);
        let cpu = run(&mut e, &[(prompt(9, 3), with_lp)]).remove(0);
        let cpu = &cpu.outputs[0];
        assert_eq!(cpu.token_ids, greedy_alone.token_ids);
        let sum: f64 = cpu.logprobs.iter().map(|l| l.logprob).sum();
        assert!(
            (sum - greedy_alone.cumulative_logprob).abs() < 1e-3,
            "CPU {sum} vs GPU {}",
            greedy_alone.cumulative_logprob
        );
    }
}

#[test]
fn dropping_the_receiver_aborts_the_request_and_frees_its_blocks() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let dir = golden::fixture_dir("llama-gqa");
    let mut e = engine(ctx, &dir, small(None));
    let keep_alone = run(&mut e, &[(prompt(9, 3), greedy(30))]).remove(0);
    let keep = e
        .add_request(Prompt::Tokens(prompt(9, 3)), greedy(30))
        .unwrap();
    let gone = e
        .add_request(Prompt::Tokens(prompt(30, 8)), sampled(4, 3, 30))
        .unwrap();
    for _ in 0..3 {
        e.step().unwrap();
    }
    let before = e.stats().cache.device.used;
    drop(gone);
    e.step().unwrap();
    let s = e.stats();
    assert_eq!(s.abandoned_requests, 1);
    assert_eq!(s.pending_requests, 1);
    assert!(
        s.cache.device.used + 4 <= before,
        "{before} -> {:?}",
        s.cache
    );
    e.run_to_completion().unwrap();
    assert_same("kept", &[keep.wait().unwrap()], &[keep_alone]);
    let c = e.stats().cache;
    assert_eq!((c.device.used, c.host.used), (0, 0), "{c:?}");
}

#[test]
fn a_request_that_can_never_fit_fails_alone() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let dir = golden::fixture_dir("llama-gqa");
    for mode in [None, Some(PreemptionMode::Recompute)] {
        let mut e = engine(ctx, &dir, small(mode));
        let fine_alone = run(&mut e, &[(prompt(9, 3), greedy(30))]).remove(0);
        // Eight samples of 50 tokens need about 8 * 3 blocks: more than 16.
        let doomed = e
            .add_request(Prompt::Tokens(prompt(20, 6)), sampled(8, 1, 30))
            .unwrap();
        let fine = e
            .add_request(Prompt::Tokens(prompt(9, 3)), greedy(30))
            .unwrap();
        e.run_to_completion().unwrap();
        let msg = match doomed.wait() {
            Err(EngineError::RequestFailed(m)) => m,
            other => panic!("{mode:?}: expected a failure, got {other:?}"),
        };
        assert!(
            msg.contains("KV blocks together") && msg.contains("--num-gpu-blocks"),
            "{msg}"
        );
        assert_same("fine", &[fine.wait().unwrap()], &[fine_alone]);
        let s = e.stats();
        assert_eq!(s.scheduler.failed_requests, 1);
        assert!(s.scheduler.preemptions < 20, "{:?}", s.scheduler);
        assert_eq!((s.cache.device.used, s.cache.host.used), (0, 0));
    }
}

#[test]
fn max_model_len_lets_a_small_pool_serve() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let dir = golden::fixture_dir("llama-gqa");
    let tiny = |max_model_len| EngineConfig {
        num_gpu_blocks: Some(6),
        max_model_len,
        ..EngineConfig::default()
    };
    // The fixture's context is 256 tokens: 16 blocks; 6 blocks are refused...
    let msg = match Engine::with_context(arc(ctx), &dir, tiny(None), |_, _| {}) {
        Err(e @ EngineError::Config(_)) => e.to_string(),
        other => panic!("expected a configuration error, got {:?}", other.err()),
    };
    assert!(msg.contains("--max-model-len"), "{msg}");
    // ...unless the context is capped.
    let mut e = engine(ctx, &dir, tiny(Some(80)));
    assert_eq!(e.max_model_len(), 80);
    let err = e
        .add_request(Prompt::Tokens(prompt(70, 1)), greedy(11))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the prompt has 70 tokens and max_tokens is 11"),
        "{err}"
    );
    let out = run(&mut e, &[(prompt(70, 1), greedy(10))]).remove(0);
    assert_eq!(out.outputs[0].token_ids.len(), 10);
    // A cap above the model's own context is a configuration error.
    let msg = match Engine::with_context(arc(ctx), &dir, tiny(Some(1000)), |_, _| {}) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a 1000-token cap on a 256-token model was accepted"),
    };
    assert!(msg.contains("exceeds the model's context of 256"), "{msg}");
}

#[test]
fn forked_samples_never_exceed_max_num_seqs() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let dir = golden::fixture_dir("llama-gqa");
    let work = [
        (prompt(9, 3), sampled(3, 1, 10)),
        (prompt(9, 4), sampled(3, 2, 10)),
        (prompt(7, 5), beams(3, 8)),
    ];
    let mut e = engine(ctx, &dir, EngineConfig::default());
    let alone: Vec<RequestOutput> = work
        .iter()
        .map(|w| run(&mut e, std::slice::from_ref(w)).remove(0))
        .collect();
    // Five slots: each request reserves three when admitted, so they run one at a time.
    let cfg = EngineConfig {
        max_num_seqs: 5,
        ..EngineConfig::default()
    };
    let mut e = engine(ctx, &dir, cfg);
    let got = run(&mut e, &work);
    assert_same("max_num_seqs 5", &got, &alone);
    assert!(e.stats().scheduler.peak_running_seqs <= 5);
}

#[test]
fn a_frame_time_budget_cuts_steps_and_changes_no_output() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let work = workload();
        let unpaced = EngineConfig {
            max_model_len: Some(64),
            max_num_batched_tokens: 64,
            ..EngineConfig::default()
        };
        let mut e = engine(ctx, &dir, unpaced.clone());
        let want = run(&mut e, &work);
        let chunks_unpaced = e.stats().scheduler.partial_prefills;
        // A budget no step meets: every step is cut to what the last one shows would fit,
        // down to the decoding sequences' tokens and 16 of prompt when nothing does.
        let paced = EngineConfig {
            max_step_ms: Some(0.01),
            ..unpaced
        };
        let mut e = engine(ctx, &dir, paced);
        let hs: Vec<_> = work
            .iter()
            .map(|(p, s)| e.add_request(Prompt::Tokens(p.clone()), s.clone()).unwrap())
            .collect();
        let mut steps = 0;
        while e.has_unfinished() {
            let cap = e.stats().pacing.expect("pacing").token_limit;
            let tokens = e.step().unwrap();
            // The cap, or the workload's 11 sequences decoding and 16 tokens of prompt.
            let floor = 11 + MIN_PACED_PREFILL;
            assert!(
                tokens <= cap.max(floor),
                "step {steps}: {tokens} tokens over a cap of {cap}"
            );
            steps += 1;
        }
        let got: Vec<RequestOutput> = hs.iter().map(|h| h.wait().unwrap()).collect();
        assert_same("paced", &got, &want);
        let s = e.stats();
        let p = s.pacing.unwrap();
        assert!(p.over_budget > 0 && p.token_limit < 16, "{p:?}");
        assert!(
            s.scheduler.partial_prefills > chunks_unpaced,
            "no prompt was cut further: {} against {chunks_unpaced}",
            s.scheduler.partial_prefills
        );
    }
}

#[test]
fn an_impossible_frame_time_budget_is_refused() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    for ms in [0.0, -1.0, f64::NAN] {
        let cfg = EngineConfig {
            max_step_ms: Some(ms),
            ..EngineConfig::default()
        };
        let err = Engine::with_context(arc(ctx), golden::fixture_dir("llama-gqa"), cfg, |_, _| {})
            .err()
            .expect("accepted")
            .to_string();
        assert!(err.contains("max_step_ms"), "{err}");
    }
}
