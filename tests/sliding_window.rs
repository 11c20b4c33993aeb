//! Sliding-window models in the engine (phi3-longrope-window: every layer has an 8-token
//! window). A long generation holds a number of KV blocks bounded by the window, and its
//! tokens equal transformers' (the fixture's 16 greedy steps) and the plain-Rust reference
//! (every step). Samples, beams, prefix-cache hits, chunked prefill and every preemption
//! mode on a tiny pool give exactly what a run that keeps every block gives.

mod common;
use common::{arc, contexts, golden};
use pagellm::internals::engine::{Engine, EngineConfig, PreemptionMode, Prompt, RequestOutput};
use pagellm::internals::model::reference::ReferenceModel;
use pagellm::internals::pool::KvDtype;
use pagellm::internals::sampling::SamplingParams;
use std::path::Path;

const FIXTURE: &str = "phi3-longrope-window";

fn engine(ctx: &pagellm::GpuContext, dir: &Path, cfg: EngineConfig) -> Engine {
    Engine::with_context(arc(ctx), dir, cfg, |_, _| {}).unwrap()
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 2 + (i * 37 + salt * 11) % 500)
        .collect()
}

/// Runs one greedy request step by step; returns its tokens and the most device blocks
/// in use after any step that followed the prompt's prefill.
fn generate(e: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, usize) {
    let h = e
        .add_request(Prompt::Tokens(prompt.to_vec()), greedy(n))
        .unwrap();
    e.step().unwrap(); // the whole prompt fits one step's token budget
    let mut most = 0;
    while e.has_unfinished() {
        e.step().unwrap();
        most = most.max(e.stats().cache.device.used);
    }
    (h.wait().unwrap().outputs[0].token_ids.clone(), most)
}

#[test]
fn a_long_generation_holds_blocks_bounded_by_the_window_and_equals_the_reference() {
    let f = golden::load(FIXTURE);
    let window = f
        .files
        .config
        .recipe
        .common_window()
        .expect("every layer slides");
    let reference = ReferenceModel::new(&f.files).unwrap();
    let case = &f.cases[2];
    let block_size = 4;
    let max_len = f.files.config.default_context();
    let n = max_len - case.prompt_ids.len();
    assert!(
        n >= 8 * window,
        "the generation must cross the window many times"
    );
    let want = reference.greedy(&case.prompt_ids, n);
    assert_eq!(
        want[..16],
        case.greedy_ids[..],
        "the reference equals transformers"
    );
    for ctx in contexts() {
        let mut results = Vec::new();
        for free in [true, false] {
            let cfg = EngineConfig {
                block_size,
                kv_dtype: KvDtype::F32,
                free_out_of_window_blocks: free,
                ..EngineConfig::default()
            };
            let mut e = engine(ctx, &f.dir, cfg);
            let (got, most) = generate(&mut e, &case.prompt_ids, n);
            let what = format!("free {free} on {}", common::backend(ctx));
            assert_eq!(got, want, "{what}");
            let s = e.stats();
            assert_eq!(s.cache.device.used, 0, "{what}: blocks leaked");
            results.push((most, s.cache.window_released_blocks));
        }
        let (with, released) = results[0];
        let (without, none) = results[1];
        // The window's tokens span at most ceil(window / block_size) + 1 blocks, and the
        // next token may open one more.
        let bound = window.div_ceil(block_size) + 2;
        assert!(
            with <= bound,
            "{with} blocks in use with freeing (bound {bound})"
        );
        assert_eq!(without, max_len.div_ceil(block_size), "every block kept");
        assert!(released as usize >= max_len / block_size - bound);
        assert_eq!(none, 0);
        eprintln!(
            "{FIXTURE} on {}: {} tokens, peak {with} blocks with freeing, {without} without",
            common::backend(ctx),
            max_len
        );
    }
}

fn run(e: &mut Engine, work: &[(Vec<u32>, SamplingParams)]) -> Vec<RequestOutput> {
    let hs: Vec<_> = work
        .iter()
        .map(|(p, s)| e.add_request(Prompt::Tokens(p.clone()), s.clone()).unwrap())
        .collect();
    e.run_to_completion().unwrap();
    hs.iter().map(|h| h.wait().unwrap()).collect()
}

fn same(what: &str, got: &[RequestOutput], want: &[RequestOutput]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.outputs.len(), w.outputs.len(), "{what}: request {i}");
        for (a, b) in g.outputs.iter().zip(&w.outputs) {
            assert_eq!(
                a.token_ids, b.token_ids,
                "{what}: request {i} sample {}",
                a.index
            );
            assert_eq!(a.logprobs, b.logprobs, "{what}: request {i} logprobs");
            assert_eq!(
                a.cumulative_logprob, b.cumulative_logprob,
                "{what}: request {i}"
            );
        }
    }
}

#[test]
fn samples_beams_prefix_hits_and_preemption_with_holes_equal_a_run_that_keeps_every_block() {
    let dir = golden::fixture_dir(FIXTURE);
    let sampled = |n, seed| SamplingParams {
        n,
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: 40,
        logprobs: Some(2),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let beams = SamplingParams {
        n: 2,
        beam_width: Some(3),
        temperature: 0.0,
        max_tokens: 30,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let shared = prompt(40, 4);
    let work = vec![
        (prompt(20, 1), sampled(4, 7)),
        (prompt(18, 2), beams),
        (shared.clone(), greedy(50)),
        (prompt(9, 3), greedy(60)),
        // The same 40-token prompt again: prefix-cache hits on blocks the first copy may
        // already have released.
        (shared, sampled(2, 9)),
    ];
    for ctx in contexts() {
        let keep = EngineConfig {
            max_model_len: Some(96),
            free_out_of_window_blocks: false,
            ..EngineConfig::default()
        };
        let want = run(&mut engine(ctx, &dir, keep), &work);
        for mode in [
            Some(PreemptionMode::Swap),
            Some(PreemptionMode::Recompute),
            None,
        ] {
            let tight = EngineConfig {
                block_size: 8,
                num_gpu_blocks: Some(14),
                num_cpu_blocks: Some(64),
                max_model_len: Some(96),
                max_num_batched_tokens: 24,
                preemption_mode: mode,
                ..EngineConfig::default()
            };
            let mut e = engine(ctx, &dir, tight);
            let got = run(&mut e, &work);
            let what = format!("{mode:?} on {}", common::backend(ctx));
            same(&what, &got, &want);
            let s = e.stats();
            let sc = &s.scheduler;
            assert!(s.cache.window_released_blocks > 0, "{what}: {:?}", s.cache);
            assert!(
                sc.partial_prefills > 0,
                "{what}: no chunked prefill: {sc:?}"
            );
            match mode {
                Some(PreemptionMode::Swap) => assert!(sc.preempted_by_swap > 0, "{what}: {sc:?}"),
                Some(PreemptionMode::Recompute) => {
                    assert!(sc.preempted_by_recompute > 0, "{what}: {sc:?}")
                }
                _ => {}
            }
            assert_eq!(sc.failed_requests, 0, "{what}");
            assert_eq!(s.cache.device.used, 0, "{what}: {:?}", s.cache);
            assert_eq!(s.cache.host.used, 0, "{what}: {:?}", s.cache);
            eprintln!(
                "{what}: {} preemptions, {} blocks released, prefix hits {}, peak {} blocks",
                sc.preemptions,
                s.cache.window_released_blocks,
                s.cache.prefix_hits,
                sc.peak_blocks_used
            );
        }
    }
}

#[test]
fn a_prompt_seen_before_reuses_blocks_its_first_run_released() {
    let dir = golden::fixture_dir(FIXTURE);
    let p = prompt(40, 6);
    for ctx in contexts() {
        let cfg = EngineConfig {
            block_size: 8,
            ..EngineConfig::default()
        };
        let mut e = engine(ctx, &dir, cfg);
        let first = run(&mut e, &[(p.clone(), greedy(30))]);
        let released = e.stats().cache.window_released_blocks;
        assert!(released >= 4, "{released} blocks released");
        let again = run(&mut e, &[(p.clone(), greedy(30))]);
        let s = e.stats().cache;
        // The prompt's first four full blocks (the fifth holds the last prompt token, which
        // is always computed again) come from the prefix cache.
        assert_eq!(s.prefix_hits, 4, "{s:?}");
        same(&format!("on {}", common::backend(ctx)), &again, &first);
        assert_eq!(s.device.used, 0);
    }
}

/// The fixture's sequence of 150 tokens, past the 128 original positions: transformers
/// computes it with LongRoPE's long factors, and so does pagellm once its context is
/// longer than the original one.
#[test]
fn longrope_long_factors_beyond_the_original_context_equal_transformers() {
    let f = golden::load(FIXTURE);
    let text = std::fs::read_to_string(f.dir.join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let case = &v["long_cases"][0];
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        (x.as_array().unwrap().iter())
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let prompt = ids(&case["prompt_ids"]);
    let greedy_want = ids(&case["greedy_ids"]);
    let top5: Vec<Vec<(u32, f64)>> = (case["top5"].as_array().unwrap().iter())
        .map(|s| {
            (s.as_array().unwrap().iter())
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
                .collect()
        })
        .collect();
    let last: Vec<f32> = (case["last_logits"].as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    let c = &f.files.config;
    assert_eq!(c.default_context(), 128);
    let context = 256;
    assert!(prompt.len() > 128 && prompt.len() + greedy_want.len() <= context);

    // The reference at a 256-token context, against transformers' logits.
    let reference = ReferenceModel::for_context(&f.files, context).unwrap();
    let got = reference.forward(&prompt).pop().unwrap();
    let worst = got
        .iter()
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        worst < 1e-3,
        "reference logits differ from transformers by {worst}"
    );
    // With the short factors (the default context) they would not match.
    let short = ReferenceModel::new(&f.files)
        .unwrap()
        .forward(&prompt)
        .pop()
        .unwrap();
    let off = short
        .iter()
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(off > 0.5, "the short factors give the same logits ({off})");

    for ctx in contexts() {
        // The default context refuses the sequence, naming the limit.
        let mut e = engine(ctx, &f.dir, EngineConfig::default());
        let err = e
            .add_request(Prompt::Tokens(prompt.clone()), greedy(8))
            .unwrap_err()
            .to_string();
        assert!(err.contains("128"), "{err}");
        let cfg = EngineConfig {
            max_model_len: Some(context),
            kv_dtype: KvDtype::F32,
            ..EngineConfig::default()
        };
        let mut e = engine(ctx, &f.dir, cfg);
        let params = SamplingParams {
            logprobs: Some(5),
            ..greedy(greedy_want.len())
        };
        let out = run(&mut e, &[(prompt.clone(), params)]);
        let o = &out[0].outputs[0];
        assert_eq!(o.token_ids, greedy_want, "on {}", common::backend(ctx));
        for (step, (lp, want)) in o.logprobs.iter().zip(&top5).enumerate() {
            for &(id, w) in want {
                let got = lp.top.iter().find(|t| t.0 == id).map(|t| t.1);
                let got = got.unwrap_or_else(|| panic!("step {step}: token {id} not in the top 5"));
                assert!(
                    (got - w).abs() < 1e-3,
                    "step {step} token {id}: {got} vs {w}"
                );
            }
        }
    }
}

/// When every layer slides, the pool needs to hold one sequence's window and one step's
/// chunk, not its whole context: a 10-block pool (40 tokens) runs a 120-token generation
/// of a 128-token context, with the tokens of an ample pool that keeps every block; a pool
/// below that (8 + 16 tokens span at most 7 blocks of 4) is refused, naming the numbers.
#[test]
fn a_pool_smaller_than_the_context_serves_a_windowed_model() {
    let dir = golden::fixture_dir(FIXTURE);
    let cfg = |blocks, free| EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(blocks),
        max_model_len: Some(128),
        max_num_batched_tokens: 16,
        free_out_of_window_blocks: free,
        ..EngineConfig::default()
    };
    let work = [(prompt(40, 8), greedy(80))];
    for ctx in contexts() {
        let want = run(&mut engine(ctx, &dir, cfg(64, false)), &work);
        let mut e = engine(ctx, &dir, cfg(10, true));
        let got = run(&mut e, &work);
        same(
            &format!("10 blocks on {}", common::backend(ctx)),
            &got,
            &want,
        );
        let s = e.stats();
        assert_eq!(s.kv_groups, vec![Some(8)]);
        assert!(s.scheduler.peak_blocks_used <= 7, "{:?}", s.scheduler);
        match Engine::with_context(arc(ctx), &dir, cfg(6, true), |_, _| {}) {
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("6 blocks") && msg.contains("7 blocks"),
                    "{msg}"
                );
            }
            Ok(_) => panic!("a 6-block pool was accepted"),
        }
    }
}
