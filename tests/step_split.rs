//! The step split into submit and finish, on the GPU (lavapipe and llvmpipe): an engine
//! driven by `begin_step`, polling `step_ready` without ever waiting, and `end_step` gives
//! exactly the outputs of `step()`, field by field, for every kind of request and under swap
//! preemption; requests added while a step is in flight join the queues when it ends, and
//! aborts asked for meanwhile (of those requests too) happen then, leaving the other requests' outputs untouched.
//! A second `begin_step` while one is in flight is refused without harm. With a draft
//! model the step is begun without waiting for the draft's passes (each poll lands one
//! and submits the next), and the outputs are still those of plain decoding.

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::{contexts, golden};
use pagellm::internals::engine::{
    Engine, EngineConfig, PreemptionMode, Request, RequestHandle, SpeculativeConfig,
};
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

/// One step through the split API, polling until the step is ready; returns the tokens
/// computed and how many polls found it not ready.
fn split_step(e: &mut Engine) -> (usize, usize) {
    let mut step = e.begin_step().unwrap();
    let mut busy = 0;
    while !e.step_ready(&mut step).unwrap() {
        busy += 1;
        std::thread::yield_now();
    }
    (e.end_step(step).unwrap(), busy)
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
        // A request added and aborted while the step runs: pending until the step ends
        // (as `has_unfinished` says), then aborted before it computed anything.
        let gone = add_all(&mut e, &all[..1]);
        assert_ne!(gone[0].id, late[0].id);
        assert!(e.abort(gone[0].id));
        assert!(e.has_unfinished());
        e.end_step(step).unwrap();
        let gone = gone[0].wait().unwrap();
        assert_eq!(gone.outputs[0].finish_reason, FinishReason::Abort);
        assert!(gone.outputs[0].token_ids.is_empty());
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
        // A request added after the drop was not held by the dropped step: it runs.
        let after = add_all(&mut e, &all[..1]);
        // The next step notices: the requests it held fail with the reason, nothing is
        // held any more, and new requests run as on a fresh engine.
        let step = e.begin_step().unwrap();
        e.end_step(step).unwrap();
        for h in &hs {
            let err = h.wait().unwrap_err().to_string();
            assert!(err.contains("dropped before it ended"), "{err}");
        }
        e.run_to_completion().unwrap();
        let got = [after[0].wait().unwrap()];
        assert_same("added after the dropped step", &got, &want);
        assert_eq!(e.stats().cache.device.used, 0);
        let got = run(&mut e, &all[..1]);
        assert_same("after the dropped step", &got, &want);
    }
}

/// A draft model (the target itself, so greedy proposals are its arg-max) makes proposals
/// pass by pass as the step is polled: `begin_step` submits the draft's first pass and
/// returns (the others are submitted by the polls that land the one before), and the outputs are plain decoding's, for greedy,
/// sampled and beam requests, under swap preemption, with a request aborted while the draft
/// runs and another added meanwhile.
#[test]
fn a_draft_model_proposes_while_the_step_is_polled() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let all = work();
        let drafted = |blocks| EngineConfig {
            draft_model: Some(dir.clone()),
            speculative: Some(SpeculativeConfig {
                num_tokens: 3,
                row_cost: Some(0.0),
                ..SpeculativeConfig::default()
            }),
            ..config(blocks)
        };
        for blocks in [64, 28] {
            let want = run(&mut engine(ctx, &dir, config(blocks)), &all);
            let mut e = engine(ctx, &dir, drafted(blocks));
            let hs = add_all(&mut e, &all);
            let passes = |e: &Engine| e.stats().draft.expect("a draft model").passes;
            // Steps whose draft made several passes, and how many passes each had
            // submitted when `begin_step` returned.
            let mut begun = Vec::new();
            while e.has_unfinished() {
                let before = passes(&e);
                let mut step = e.begin_step().unwrap();
                let at_begin = passes(&e) - before;
                while !e.step_ready(&mut step).unwrap() {
                    std::thread::yield_now();
                }
                e.end_step(step).unwrap();
                if passes(&e) - before > 1 {
                    begun.push(at_begin);
                }
            }
            let got: Vec<Output> = hs.iter().map(|h| h.wait().unwrap()).collect();
            let what = format!("drafted, {blocks} blocks");
            assert_same(&what, &got, &want);
            let s = e.stats();
            let d = s.draft.expect("a draft model");
            assert!(
                d.passes > 0 && s.scheduler.spec_accepted > 0,
                "{what}: {s:?}"
            );
            assert!(
                !begun.is_empty() && begun.iter().all(|&n| n == 1),
                "{what}: passes submitted by begin_step: {begun:?}"
            );
            assert_eq!((s.cache.device.used, s.cache.host.used), (0, 0), "{what}");
            if blocks == 28 {
                assert!(s.scheduler.preempted_by_swap > 0, "{what}: no preemption");
            }
        }
        // An abort and an add while the draft is running.
        let want = run(&mut engine(ctx, &dir, config(64)), &all);
        let mut e = engine(ctx, &dir, drafted(64));
        let hs = add_all(&mut e, &all[..3]);
        split_step(&mut e); // the prompts
        let mut step = e.begin_step().unwrap();
        assert!(e.abort(hs[2].id));
        let late = add_all(&mut e, &all[3..]);
        while !e.step_ready(&mut step).unwrap() {
            std::thread::yield_now();
        }
        e.end_step(step).unwrap();
        e.run_to_completion().unwrap();
        assert!(hs[2]
            .wait()
            .unwrap()
            .outputs
            .iter()
            .all(|o| o.finish_reason == FinishReason::Abort));
        let got: Vec<Output> = [&hs[0], &hs[1], &late[0]]
            .iter()
            .map(|h| h.wait().unwrap())
            .collect();
        let kept = [want[0].clone(), want[1].clone(), want[3].clone()];
        assert_same("drafted, beside the abort", &got, &kept);
        assert_eq!(e.stats().cache.device.used, 0);
    }
}

/// Steps awaited as a browser awaits them (`step_async` under an executor that parks its
/// thread while pending), with another thread polling the device as the browser's event
/// loop does: the read-backs land there and wake the step, and the outputs are `step()`'s,
/// with swap preemption and with a draft model. (Nothing but those wakes can resume the
/// awaiting thread: a step that waited for a map nobody lands would hang, which the
/// watchdog turns into a failure.)
#[test]
fn an_awaited_step_gives_the_outputs_of_step() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let all = work();
        let drafted = EngineConfig {
            draft_model: Some(dir.clone()),
            speculative: Some(SpeculativeConfig {
                num_tokens: 3,
                row_cost: Some(0.0),
                ..SpeculativeConfig::default()
            }),
            ..config(64)
        };
        for (what, cfg) in [("swapping", config(24)), ("drafted", drafted)] {
            let want = run(&mut engine(ctx, &dir, config(64)), &all);
            // Threads of their own (not scoped), so that a hung step fails the test
            // rather than hanging it.
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let polling = stop.clone();
            std::thread::spawn(move || {
                while !polling.load(std::sync::atomic::Ordering::Relaxed) {
                    ctx.poll().unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            });
            let mut e = engine(ctx, &dir, cfg);
            let hs = add_all(&mut e, &all);
            let (done, finished) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut steps = 0;
                while e.has_unfinished() {
                    pollster::block_on(e.step_async()).unwrap();
                    steps += 1;
                }
                let _ = done.send((steps, e.stats()));
            });
            let finished = finished.recv_timeout(std::time::Duration::from_secs(300));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let (steps, stats) = finished.expect("an awaited step never resolved");
            let sc = stats.scheduler;
            match what {
                "swapping" => assert!(sc.preempted_by_swap > 0, "{what}: {sc:?}"),
                _ => assert!(sc.spec_accepted > 0, "{what}: {sc:?}"),
            }
            assert!(steps > 5, "{what}: {steps} steps");
            assert_eq!(stats.cache.device.used, 0, "{what}");
            let got: Vec<Output> = hs.iter().map(|h| h.wait().unwrap()).collect();
            assert_same(what, &got, &want);
        }
    }
}

/// A future that is pending once (waking itself), so that the other task of a `join` runs.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// `LocalEngine`, the driver of a one-thread host (the browser build's): one task steps it,
/// yielding between steps as a host's event loop does, while another task on the same
/// thread adds a request and aborts another between them; a second step while one is
/// awaited is refused. The outputs are `step()`'s, and everything is freed. Another thread
/// polls the device, as the host's event loop would.
#[test]
fn a_local_engine_takes_requests_from_other_tasks_between_its_steps() {
    use futures_util::future::join;
    use pagellm::LocalEngine;
    use std::cell::Cell;
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let all = work();
        let want = run(&mut engine(ctx, &dir, config(24)), &all);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let polling = stop.clone();
        let poller = std::thread::spawn(move || {
            while !polling.load(std::sync::atomic::Ordering::Relaxed) {
                ctx.poll().unwrap();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        let local = LocalEngine::new(engine(ctx, &dir, config(24)));
        let request = |i: usize| Request::tokens(all[i].0.clone()).with_params(all[i].1.clone());
        let first: Vec<RequestHandle> = (0..3).map(|i| local.add(request(i)).unwrap()).collect();

        // A step begun (polled once) and not yet ended: a second one is refused.
        let mut begun = std::pin::pin!(local.step());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::future::Future::poll(begun.as_mut(), &mut cx) {
            std::task::Poll::Pending => {
                let refused = pollster::block_on(local.step()).unwrap_err().to_string();
                assert!(refused.contains("already awaited"), "{refused}");
                pollster::block_on(begun).unwrap();
            }
            std::task::Poll::Ready(report) => {
                report.unwrap();
            }
        }

        let steps = Cell::new(1usize);
        let stepping = async {
            while local.has_work() {
                local.step().await.unwrap();
                steps.set(steps.get() + 1);
                YieldOnce(false).await;
            }
        };
        let meddling = async {
            while steps.get() < 3 {
                YieldOnce(false).await;
            }
            // Mid-run, as a page's click handlers would.
            assert!(local.abort(first[2].id));
            local.add(request(3)).unwrap()
        };
        let ((), late) = pollster::block_on(join(stepping, meddling));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        poller.join().unwrap();
        let aborted = first[2].wait().unwrap();
        assert!(aborted
            .outputs
            .iter()
            .all(|o| o.finish_reason == FinishReason::Abort));
        let got: Vec<Output> = [&first[0], &first[1], &late]
            .iter()
            .map(|h| h.wait().unwrap())
            .collect();
        let kept = [want[0].clone(), want[1].clone(), want[3].clone()];
        assert_same("a local engine, beside the abort", &got, &kept);
        let st = local.stats();
        assert_eq!((st.pending_requests, st.cache.device.used), (0, 0));
    }
}
