//! The step split into submit and finish, on the GPU (lavapipe and llvmpipe): an engine
//! driven by `begin_step`, polling `step_ready` without ever waiting, and `end_step` gives
//! exactly the outputs of `step()`, field by field, for every kind of request and under swap
//! preemption; requests added while a step is in flight join later steps, and aborts asked
//! for meanwhile happen when the step ends, leaving the other requests' outputs untouched.
//! A second `begin_step` while one is in flight is refused without harm.

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::{contexts, golden};
use pagellm::internals::engine::{Engine, EngineConfig, PreemptionMode, Request, RequestHandle};
use pagellm::internals::sampling::SamplingParams;
use pagellm::{FinishReason, Output};

/// A 64-token context in blocks of 4; `blocks` device blocks.
fn config(blocks: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(blocks),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        preemption_mode: Some(PreemptionMode::Swap),
        ..EngineConfig::default()
    }
}

fn work() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut g = greedy(12);
    g.logprobs = Some(2);
    vec![
        (prompt(21, 1), g),
        (prompt(13, 2), sampled(2, 7, 12)),
        (prompt(9, 3), beams(3, 8)),
        (prompt(30, 4), greedy(20)),
    ]
}

/// One step through the split API, polling until the step is ready.
fn split_step(e: &mut Engine) -> usize {
    let step = e.begin_step().unwrap();
    while !e.step_ready(&step).unwrap() {
        std::thread::yield_now();
    }
    e.end_step(step).unwrap()
}

fn add_all(e: &mut Engine, work: &[(Vec<u32>, SamplingParams)]) -> Vec<RequestHandle> {
    work.iter()
        .map(|(p, s)| {
            e.add(Request::tokens(p.clone()).with_params(s.clone()))
                .unwrap()
        })
        .collect()
}

#[test]
fn a_polled_split_step_gives_the_outputs_of_step() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        // A pool small enough that the four requests preempt one another by swapping.
        for blocks in [64, 24] {
            let want = run(&mut engine(ctx, &dir, config(blocks)), &work());
            let mut e = engine(ctx, &dir, config(blocks));
            let hs = add_all(&mut e, &work());
            while e.has_unfinished() {
                split_step(&mut e);
            }
            let got: Vec<Output> = hs.iter().map(|h| h.wait().unwrap()).collect();
            assert_same(&format!("{blocks} blocks"), &got, &want);
            if blocks == 24 {
                assert!(e.stats().scheduler.preempted_by_swap > 0);
            }
            assert_eq!(e.stats().cache.device.used, 0);
        }
    }
}

#[test]
fn adds_and_aborts_during_a_step_wait_for_its_end() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let all = work();
        let want = run(&mut engine(ctx, &dir, config(64)), &all);
        let mut e = engine(ctx, &dir, config(64));
        let hs = add_all(&mut e, &all[..3]);
        let step = e.begin_step().unwrap();
        // Refused while in flight, and nothing changes.
        let err = e.begin_step().err().unwrap().to_string();
        assert!(err.contains("in flight"), "{err}");
        // The beam search is aborted mid-step: it ends when the step does.
        assert!(e.abort(hs[2].id));
        assert!(hs[2].events.try_recv().is_err());
        let late = add_all(&mut e, &all[3..]);
        assert!(!e.abort(12345));
        e.end_step(step).unwrap();
        let aborted = hs[2].wait().unwrap();
        assert!(aborted
            .outputs
            .iter()
            .all(|o| o.finish_reason == FinishReason::Abort));
        e.run_to_completion().unwrap();
        let got: Vec<Output> = [&hs[0], &hs[1], &late[0]]
            .iter()
            .map(|h| h.wait().unwrap())
            .collect();
        let kept = [want[0].clone(), want[1].clone(), want[3].clone()];
        assert_same("beside the abort", &got, &kept);
        let st = e.stats();
        assert_eq!((st.pending_requests, st.cache.device.used), (0, 0));
    }
}

#[test]
fn a_step_dropped_unfinished_fails_its_requests_and_the_engine_goes_on() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let all = work();
        let want = run(&mut engine(ctx, &dir, config(64)), &all[..1]);
        let mut e = engine(ctx, &dir, config(64));
        let hs = add_all(&mut e, &all[1..3]);
        drop(e.begin_step().unwrap());
        // The next step notices: the requests it held fail with the reason, nothing is
        // held any more, and new requests run as on a fresh engine.
        let step = e.begin_step().unwrap();
        e.end_step(step).unwrap();
        for h in &hs {
            let err = h.wait().unwrap_err().to_string();
            assert!(err.contains("dropped before it ended"), "{err}");
        }
        assert_eq!(e.stats().cache.device.used, 0);
        let got = run(&mut e, &all[..1]);
        assert_same("after the dropped step", &got, &want);
    }
}
