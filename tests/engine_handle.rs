//! `EngineHandle`, the one engine loop, on the GPU (lavapipe and llvmpipe, each on a device
//! the test shares with the engine as an application would): requests submitted together
//! or from several threads give exactly the outputs of an engine stepped by hand, field by
//! field; streams read blocking, awaited or as an async stream agree; abort and a dropped
//! stream free what the request held; invalid requests, a closed engine and a model that
//! does not load are refused with errors that say why; notices and statistics report what
//! happened.

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::{arc, contexts, golden};
use futures_util::StreamExt;
use pagellm::internals::engine::{EngineConfig, EngineError, FinishReason, Request, RequestEvent};
use pagellm::internals::sampling::SamplingParams;
use pagellm::{EngineBuilder, EngineHandle, EngineState, Notice};
use std::sync::{Arc, Mutex};

/// A 64-token context in blocks of 4 over a 32-block device pool.
fn config() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(32),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        ..EngineConfig::default()
    }
}

/// Greedy with logprobs, n = 2 samples, and 3 beams: every kind of group.
fn work() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut g = greedy(10);
    g.logprobs = Some(2);
    vec![
        (prompt(21, 1), g),
        (prompt(13, 2), sampled(2, 7, 9)),
        (prompt(9, 3), beams(3, 6)),
    ]
}

fn request((p, s): &(Vec<u32>, SamplingParams)) -> Request {
    Request::tokens(p.clone()).with_params(s.clone())
}

fn handle(ctx: &pagellm::GpuContext) -> EngineHandle {
    EngineBuilder::new(golden::fixture_dir("llama-gqa"))
        .config(config())
        .context(arc(ctx))
        .load()
        .unwrap()
}

#[test]
fn submitted_requests_give_the_outputs_of_an_engine_stepped_by_hand() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let want = run(&mut engine(ctx, &dir, config()), &work());
        let h = handle(ctx);
        // Together, in one submission.
        let streams: Vec<_> = h
            .submit_all(work().iter().map(request))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let got: Vec<_> = streams.into_iter().map(|s| s.wait().unwrap()).collect();
        assert_same("together", &got, &want);
        // From a thread each, arriving as they may.
        let h = Arc::new(h);
        let threads: Vec<_> = work()
            .into_iter()
            .map(|w| {
                let h = h.clone();
                std::thread::spawn(move || h.submit(request(&w)).unwrap().wait().unwrap())
            })
            .collect();
        let got: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_same("from threads", &got, &want);
        let s = h.stats_now().unwrap();
        assert_eq!(s.engine.pending_requests, 0);
        assert_eq!(s.engine.cache.device.used, 0);
        assert!(s.steps > 0 && s.tokens_computed > 0, "{s:?}");
    }
}

#[test]
fn streams_read_blocking_awaited_or_as_async_streams_agree() {
    for ctx in contexts() {
        let h = handle(ctx);
        let w = &work()[0];
        let want = h.submit(request(w)).unwrap().wait().unwrap();
        // Token by token, blocking: the tokens, then one final event, then the end.
        let blocking: Vec<RequestEvent> = h.submit(request(w)).unwrap().collect();
        let tokens: Vec<u32> = blocking
            .iter()
            .filter_map(|e| match e {
                RequestEvent::Token { token_id, .. } => Some(*token_id),
                _ => None,
            })
            .collect();
        assert_eq!(tokens, want.outputs[0].token_ids);
        assert!(
            matches!(blocking.last(), Some(RequestEvent::Finished(o)) if o.outputs == want.outputs)
        );
        // Awaited one by one, and as a `Stream`, with no runtime but a plain executor.
        let s = h.submit(request(w)).unwrap();
        let awaited = pollster::block_on(async {
            let mut v = Vec::new();
            while let Some(e) = s.recv_async().await {
                v.push(e);
            }
            v
        });
        assert_eq!(without_ids(awaited), without_ids(blocking.clone()));
        let streamed: Vec<RequestEvent> =
            pollster::block_on(h.submit(request(w)).unwrap().into_stream().collect());
        assert_eq!(without_ids(streamed), without_ids(blocking));
    }
}

/// Events with the request id (each submission's own) cleared.
fn without_ids(mut events: Vec<RequestEvent>) -> Vec<RequestEvent> {
    for e in &mut events {
        if let RequestEvent::Finished(o) = e {
            o.request_id = 0;
        }
    }
    events
}

#[test]
fn abort_and_a_dropped_stream_free_what_the_request_held() {
    for ctx in contexts() {
        let h = handle(ctx);
        let long = Request::tokens(prompt(9, 4)).with_params(greedy(50));
        let s = h.submit(long.clone()).unwrap();
        assert!(matches!(s.recv(), Some(RequestEvent::Token { .. })));
        s.abort();
        let out = s.wait().unwrap();
        assert_eq!(out.outputs[0].finish_reason, FinishReason::Abort);
        assert!(out.outputs[0].token_ids.len() < 50);
        // A stream dropped after its first token: the engine aborts it at its next step.
        let s = h.submit(long.clone()).unwrap();
        assert!(matches!(s.recv(), Some(RequestEvent::Token { .. })));
        drop(s);
        // Abort by id, through the handle.
        let s = h.submit(long).unwrap();
        h.abort(s.id());
        assert_eq!(
            s.wait().unwrap().outputs[0].finish_reason,
            FinishReason::Abort
        );
        // The dropped one goes at the engine's next step.
        let start = std::time::Instant::now();
        let st = loop {
            let st = h.stats_now().unwrap().engine;
            if st.pending_requests == 0 {
                break st;
            }
            assert!(start.elapsed().as_secs() < 10, "{st:?}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(st.abandoned_requests, 1);
        assert_eq!(st.cache.device.used, 0);
    }
}

#[test]
fn refusals_say_why() {
    for ctx in contexts() {
        let h = handle(ctx);
        // Longer than the context: refused at once, on the caller's thread.
        let err = h
            .submit(Request::tokens(prompt(60, 1)).with_params(greedy(10)))
            .unwrap_err();
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
        let bad = SamplingParams {
            top_p: 1.5,
            ..greedy(4)
        };
        let err = h.submit(Request::tokens(prompt(8, 1)).with_params(bad));
        assert!(err.unwrap_err().to_string().contains("top_p"));
        // One bad request of a batch fails alone.
        let batch = h.submit_all([
            Request::tokens(vec![u32::MAX]),
            Request::tokens(prompt(8, 1)).with_params(greedy(3)),
        ]);
        assert!(batch[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("vocabulary"));
        let ok = batch.into_iter().nth(1).unwrap().unwrap().wait().unwrap();
        assert_eq!(ok.outputs[0].token_ids.len(), 3);
        // Closed: no new requests.
        h.close();
        let err = h.submit(Request::tokens(prompt(8, 1))).unwrap_err();
        assert!(matches!(err, EngineError::Closed), "{err}");
        assert_eq!(h.shutdown(), None);
        assert_eq!(h.state(), EngineState::Stopped);
    }
    // A model that does not load: the error names it; requests are refused with it.
    let missing = std::env::temp_dir().join("pagellm-no-such-model");
    let h = EngineBuilder::new(&missing).spawn().unwrap();
    let err = h.wait_ready().unwrap_err().to_string();
    assert!(err.contains("pagellm-no-such-model"), "{err}");
    let err = h.submit(Request::text("hello")).unwrap_err().to_string();
    assert!(err.contains("pagellm-no-such-model"), "{err}");
}

#[test]
fn a_lost_shared_device_is_replaced_through_the_builders_callback_and_noticed() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let want = run(&mut engine(ctx, &dir, config()), &work());
        let recovered = Arc::new(Mutex::new(Vec::new()));
        let log = recovered.clone();
        let lossy = EngineConfig {
            inject_device_loss: Some(pagellm::DeviceLossInjection {
                steps: vec![2, 6],
                ..Default::default()
            }),
            ..config()
        };
        let h = EngineBuilder::new(&dir)
            .config(lossy)
            .context(common::app_device(ctx))
            .on_device_lost(move |_| Some(common::app_device(ctx)))
            .on_notice(move |n| {
                if let Notice::Recovered { adapter, .. } = n {
                    log.lock().unwrap().push(adapter);
                }
            })
            .load()
            .unwrap();
        let streams: Vec<_> = h.submit_all(work().iter().map(request));
        let got: Vec<_> = streams
            .into_iter()
            .map(|s| s.unwrap().wait().unwrap())
            .collect();
        assert_same("across losses", &got, &want);
        assert_eq!(*recovered.lock().unwrap(), vec![ctx.describe(); 2]);
        let s = h.stats_now().unwrap();
        assert_eq!((s.engine.device.losses, s.engine.device.recoveries), (2, 2));
        assert_eq!(h.state(), EngineState::Ready);
    }
}

#[test]
fn notices_tell_the_load_and_every_step() {
    for ctx in contexts() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let h = EngineBuilder::new(golden::fixture_dir("llama-gqa"))
            .config(config())
            .context(arc(ctx))
            .on_notice(move |n| log.lock().unwrap().push(n))
            .load()
            .unwrap();
        let info = h.info().unwrap().clone();
        assert_eq!(info.max_model_len, 64);
        assert_eq!(info.adapter, ctx.describe());
        let out = h
            .submit(Request::tokens(prompt(9, 5)).with_params(greedy(5)))
            .unwrap()
            .wait()
            .unwrap();
        drop(h);
        let seen = seen.lock().unwrap();
        assert!(seen.contains(&Notice::Ready(info)), "{seen:?}");
        let tokens: usize = seen
            .iter()
            .map(|n| match n {
                Notice::Stepped { tokens, error, .. } => {
                    assert!(error.is_none());
                    *tokens
                }
                _ => 0,
            })
            .sum();
        // The prompt, then one token per step after the first sampled one.
        assert_eq!(tokens, 9 + out.outputs[0].token_ids.len() - 1);
    }
}

#[test]
fn a_resize_is_in_the_published_statistics_when_it_returns() {
    for ctx in contexts() {
        let h = handle(ctx);
        // `stats` reads what the engine thread last published, without waiting for it: a
        // caller (the server's /metrics) that reads it right after a resize must see the new
        // pool, in every round, whatever the thread does next.
        for blocks in [16, 32, 24, 32] {
            let r = h.set_kv_budget(pagellm::PoolSize::Blocks(blocks)).unwrap();
            assert_eq!(r.blocks_after, blocks);
            let s = h.stats().unwrap();
            assert_eq!(s.engine.kv_blocks, blocks);
            assert_eq!(s.engine.kv_pool_tokens(), blocks * 4);
        }
    }
}
