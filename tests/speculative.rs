//! Speculative decoding by prompt lookup (and with a draft model) on the GPU: every output field (tokens, text,
//! finish reason, logprobs, cumulative logprob) is the same with speculation as without,
//! for greedy and seeded requests, parallel samples, beams beside them, alone and batched,
//! under forced preemption in every mode, with stop strings and token limits that fall on
//! accepted proposals, with a sliding window and a quantized cache, with a regex constraint;
//! and speculation really happened (proposals were accepted and rejected), streamed tokens
//! add up to the final text, and every block comes back.

mod common;
use common::outputs::{assert_same, engine, greedy, run};
use common::{contexts, golden};
use pagellm::internals::constrain::StructuredOutput;
use pagellm::internals::engine::{
    Engine, EngineConfig, PreemptionMode, Prompt, RequestEvent, RequestOutput, SpeculativeConfig,
};
use pagellm::internals::pool::KvDtype;
use pagellm::internals::sampling::SamplingParams;
use std::path::Path;

fn speculating(cfg: EngineConfig, k: usize) -> EngineConfig {
    EngineConfig {
        speculative: Some(SpeculativeConfig {
            num_tokens: k,
            // Always speculate, so that every path runs (the adaptive k would switch off on
            // a poor acceptance rate).
            row_cost: Some(0.0),
            ..SpeculativeConfig::default()
        }),
        ..cfg
    }
}

/// A prompt that quotes a passage twice, so its continuation tends to repeat it.
fn repetitive(len: usize, salt: u32) -> Vec<u32> {
    let passage: Vec<u32> = (0..len as u32 / 2)
        .map(|i| 2 + (i * 37 + salt * 11) % 500)
        .collect();
    [&passage[..], &passage[..]].concat()
}

fn sampled(n: usize, seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        n,
        temperature: 0.8,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens,
        logprobs: Some(2),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Greedy with and without logprobs and penalties, seeded samples (n = 1 and 3), and a
/// beam search, which does not speculate but shares the steps.
fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut with_logprobs = greedy(28);
    with_logprobs.logprobs = Some(3);
    let mut penalised = greedy(24);
    penalised.repetition_penalty = 1.3;
    let beams = SamplingParams {
        n: 2,
        beam_width: Some(3),
        temperature: 0.0,
        max_tokens: 12,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    vec![
        (repetitive(24, 1), greedy(32)),
        (repetitive(30, 2), with_logprobs),
        (repetitive(16, 3), sampled(3, 5, 20)),
        (repetitive(20, 4), penalised),
        (repetitive(18, 5), beams),
        (repetitive(12, 6), sampled(1, 9, 26)),
    ]
}

fn run_alone(e: &mut Engine, work: &[(Vec<u32>, SamplingParams)]) -> Vec<RequestOutput> {
    work.iter()
        .map(|w| run(e, std::slice::from_ref(w)).remove(0))
        .collect()
}

/// Proposals were verified, some accepted and some rejected, and the pools are empty.
#[track_caller]
fn assert_speculated(what: &str, e: &Engine) {
    let s = e.stats();
    let sc = s.scheduler;
    assert!(
        sc.spec_accepted > 0 && sc.spec_accepted < sc.spec_proposed,
        "{what}: {sc:?}"
    );
    assert_eq!(s.cache.device.used, 0, "{what}: {:?}", s.cache);
    assert_eq!(s.cache.host.used, 0, "{what}: {:?}", s.cache);
    assert_eq!(sc.failed_requests, 0, "{what}");
}

#[test]
fn speculation_keeps_every_output_field_alone_and_batched() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let work = workload();
        let base = EngineConfig {
            max_model_len: Some(128),
            ..EngineConfig::default()
        };
        let want = run_alone(&mut engine(ctx, &dir, base.clone()), &work);
        for k in [1, 3, 6] {
            let mut e = engine(ctx, &dir, speculating(base.clone(), k));
            assert_same(&format!("k={k} alone"), &run_alone(&mut e, &work), &want);
            assert_same(&format!("k={k} batched"), &run(&mut e, &work), &want);
            assert_speculated(&format!("k={k}"), &e);
        }
    }
}

#[test]
fn speculation_under_forced_preemption_keeps_every_output_field() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let work = workload();
        let ample = EngineConfig {
            max_model_len: Some(64),
            ..EngineConfig::default()
        };
        let want = run(&mut engine(ctx, &dir, ample), &work);
        for mode in [
            Some(PreemptionMode::Swap),
            Some(PreemptionMode::Recompute),
            None,
        ] {
            // 28 blocks of 4 tokens for 6 requests of up to 3 sequences, chunked in 24-token
            // steps.
            let small = EngineConfig {
                num_gpu_blocks: Some(28),
                num_cpu_blocks: Some(64),
                max_model_len: Some(64),
                max_num_batched_tokens: 24,
                block_size: 4,
                preemption_mode: mode,
                ..EngineConfig::default()
            };
            let mut e = engine(ctx, &dir, speculating(small, 4));
            assert_same(&format!("{mode:?}"), &run(&mut e, &work), &want);
            assert_speculated(&format!("{mode:?}"), &e);
            assert!(
                e.stats().scheduler.preemptions > 0,
                "{mode:?}: no preemption"
            );
        }
    }
}

#[test]
fn stop_strings_and_token_limits_end_inside_accepted_proposals() {
    for ctx in contexts() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
        let base = EngineConfig::default();
        let text = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The";
        let stop = SamplingParams {
            max_tokens: 40,
            stop: vec!["mat. The cat".into()],
            ..SamplingParams::greedy()
        };
        let work: Vec<(String, SamplingParams)> = (1..12)
            .map(|n| (text.to_string(), greedy(n)))
            .chain([(text.to_string(), stop)])
            .collect();
        let go = |e: &mut Engine| -> Vec<RequestOutput> {
            work.iter()
                .map(|(p, s)| {
                    let h = e.add_request(Prompt::Text(p.clone()), s.clone()).unwrap();
                    e.run_to_completion().unwrap();
                    // Streamed text adds up to the final text, one event per token.
                    let (mut text, mut tokens, mut out) = (String::new(), 0, None);
                    for ev in h.events.try_iter() {
                        match ev {
                            RequestEvent::Token { text: t, .. } => {
                                text.push_str(&t);
                                tokens += 1;
                            }
                            RequestEvent::Finished(o) => out = Some(o),
                            RequestEvent::Failed(m) => panic!("{m}"),
                        }
                    }
                    let out = out.unwrap();
                    assert_eq!(out.outputs[0].text, text);
                    assert_eq!(out.outputs[0].token_ids.len(), tokens);
                    out
                })
                .collect()
        };
        let want = go(&mut engine(ctx, &dir, base.clone()));
        for (i, o) in want.iter().take(11).enumerate() {
            assert_eq!(o.outputs[0].token_ids.len(), i + 1);
        }
        let mut e = engine(ctx, &dir, speculating(base, 5));
        assert_same("stops", &go(&mut e), &want);
        let sc = e.stats().scheduler;
        assert!(sc.spec_accepted > 0, "{sc:?}");
    }
}

#[test]
fn speculation_with_a_sliding_window_and_an_int8_cache_keeps_outputs() {
    for ctx in contexts() {
        // Every layer slides over an 8-token window, so blocks leave it as sequences grow.
        let dir = golden::fixture_dir("phi3-longrope-window");
        let work: Vec<(Vec<u32>, SamplingParams)> = workload()
            .into_iter()
            .map(|(p, s)| {
                (
                    p,
                    SamplingParams {
                        max_tokens: 40,
                        ..s
                    },
                )
            })
            .collect();
        for kv_dtype in [KvDtype::F16, KvDtype::Int8] {
            let base = EngineConfig {
                kv_dtype,
                block_size: 4,
                max_model_len: Some(128),
                ..EngineConfig::default()
            };
            let want = run(&mut engine(ctx, &dir, base.clone()), &work);
            let mut e = engine(ctx, &dir, speculating(base, 4));
            assert_same(&format!("{kv_dtype}"), &run(&mut e, &work), &want);
            assert_speculated(&format!("{kv_dtype}"), &e);
            assert!(e.stats().cache.window_released_blocks > 0);
        }
    }
}

#[test]
fn constrained_requests_speculate_and_keep_their_outputs() {
    for ctx in contexts() {
        // The shipped model's byte-level vocabulary spells any text; each row's mask follows
        // the tokens accepted before it, as plain decoding's would.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
        let regex = "(the (cat|dog) sat on the mat\\. ){2,6}";
        let work: Vec<(String, SamplingParams)> = (0..3)
            .map(|seed| {
                let params = SamplingParams {
                    temperature: if seed == 0 { 0.0 } else { 1.0 },
                    seed: Some(seed),
                    max_tokens: 64,
                    logprobs: Some(1),
                    structured_output: Some(StructuredOutput::Regex(regex.into())),
                    ..SamplingParams::default()
                };
                (
                    "Repeat: the cat sat on the mat. the dog sat on the mat.".into(),
                    params,
                )
            })
            .collect();
        let go = |e: &mut Engine| -> Vec<RequestOutput> {
            let hs: Vec<_> = work
                .iter()
                .map(|(p, s)| e.add_request(Prompt::Text(p.clone()), s.clone()).unwrap())
                .collect();
            e.run_to_completion().unwrap();
            hs.iter().map(|h| h.wait().unwrap()).collect()
        };
        let want = go(&mut engine(ctx, &dir, EngineConfig::default()));
        let re = regex::Regex::new(&format!("^(?:{regex})$")).unwrap();
        for o in &want {
            assert!(re.is_match(&o.outputs[0].text), "{:?}", o.outputs[0].text);
        }
        let mut e = engine(ctx, &dir, speculating(EngineConfig::default(), 4));
        assert_same("constrained", &go(&mut e), &want);
        assert_speculated("constrained", &e);
    }
}

/// A draft model proposes instead of the n-gram lookup. With the target itself as its draft
/// every greedy proposal is the target's arg-max, so nearly all are accepted; with another
/// model of the same vocabulary most are rejected, and the draft gives back their cache
/// entries and follows the target's tokens. Either way every output field equals plain
/// decoding's, alone, batched, under forced swap and recompute preemption (the draft
/// recomputes what it lost, and its own pool runs short), and with an int8 cache; a draft
/// of another vocabulary is refused.
#[test]
fn a_draft_model_keeps_every_output_field() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let other = golden::fixture_dir("llama-odd-heads");
        let work = workload();
        let base = EngineConfig {
            max_model_len: Some(64),
            ..EngineConfig::default()
        };
        let want = run_alone(&mut engine(ctx, &dir, base.clone()), &work);
        let drafted = |draft: &Path, cfg: EngineConfig| EngineConfig {
            draft_model: Some(draft.to_path_buf()),
            ..speculating(cfg, 3)
        };
        // Itself as the draft: the greedy requests' proposals are the target's own
        // arg-max, so every one is accepted (the kernels give a row the same result in
        // any batch); sampled and penalised requests accept what their sampler agrees on.
        let mut e = engine(ctx, &dir, drafted(&dir, base.clone()));
        assert_same("self-draft greedy", &run(&mut e, &work[..2]), &want[..2]);
        let s = e.stats();
        let sc = s.scheduler;
        assert!(
            sc.spec_proposed > 0 && sc.spec_accepted == sc.spec_proposed,
            "self-draft: {sc:?}"
        );
        // The draft keeps its cache between steps: it computes each prompt once and each
        // token after it about once, not the whole context every step (54 prompt tokens,
        // 60 generated, proposals computed at most once more each).
        let d = s.draft.expect("a draft model");
        assert!(d.tokens <= 54 + 60 + sc.spec_proposed, "{d:?} {sc:?}");
        assert_eq!(d.dropped, 0);
        // Sampled requests (n = 3 after their fork, and n = 1, with top-p, logprobs and a
        // penalty and bias added): the draft draws each proposal with a copy of the
        // sequence's sampler, the random number the target's draws for that row, from the
        // same logits, so every proposal is accepted too; arg-max proposals would match
        // only where the sample happens to be the arg-max.
        let mut biased = work[5].1.clone();
        biased.presence_penalty = 0.4;
        biased.logit_bias = vec![(7, 1.5), (11, -2.0)];
        let sampled_work = [
            work[2].clone(),
            work[5].clone(),
            (work[5].0.clone(), biased),
        ];
        let want_sampled = run(&mut engine(ctx, &dir, base.clone()), &sampled_work);
        let mut e = engine(ctx, &dir, drafted(&dir, base.clone()));
        assert_same(
            "self-draft sampled",
            &run(&mut e, &sampled_work),
            &want_sampled,
        );
        let sc = e.stats().scheduler;
        assert!(
            sc.spec_proposed > 40 && sc.spec_accepted == sc.spec_proposed,
            "self-draft sampled: {sc:?}"
        );
        assert_same("self-draft batched", &run(&mut e, &work), &want);
        assert_speculated("self-draft", &e);
        // A request that fills the 64-token context: no proposal goes past it.
        let full = [(repetitive(40, 7), greedy(24))];
        let plain_full = run(&mut engine(ctx, &dir, base.clone()), &full);
        assert_same(
            "self-draft to the context",
            &run(&mut e, &full),
            &plain_full,
        );
        // Another model as the draft: the random fixtures never agree, so every proposal
        // is rejected and given back.
        let mut e = engine(ctx, &dir, drafted(&other, base.clone()));
        assert_same("other draft alone", &run_alone(&mut e, &work), &want);
        assert_same("other draft batched", &run(&mut e, &work), &want);
        let s = e.stats();
        assert!(s.scheduler.spec_proposed > 0, "{:?}", s.scheduler);
        assert_eq!((s.cache.device.used, s.cache.host.used), (0, 0));
        // Under pressure, proposals both accepted and rejected.
        for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
            let small = EngineConfig {
                num_gpu_blocks: Some(28),
                num_cpu_blocks: Some(64),
                max_num_batched_tokens: 24,
                block_size: 4,
                preemption_mode: Some(mode),
                ..base.clone()
            };
            let mut e = engine(ctx, &dir, drafted(&dir, small));
            let what = format!("self-draft, {mode:?}");
            assert_same(&what, &run(&mut e, &work), &want);
            let s = e.stats();
            assert!(s.scheduler.preemptions > 0, "{what}: nothing preempted");
            // The draft's pool has the bytes of the target's 28 blocks (the same model: 28
            // blocks); sequences it cannot hold beside the others propose nothing that step,
            // and nothing else changes.
            let d = s.draft.expect("a draft model");
            assert!(
                d.dropped > 0,
                "{what}: the draft pool never ran short: {d:?}"
            );
            assert_speculated(&what, &e);
        }
        // A quantized cache, in the draft too: the outputs of plain decoding with it.
        let int8 = EngineConfig {
            kv_dtype: KvDtype::Int8,
            ..base.clone()
        };
        let want8 = run(&mut engine(ctx, &dir, int8.clone()), &work);
        let mut e = engine(ctx, &dir, drafted(&dir, int8));
        assert_same("self-draft, int8 cache", &run(&mut e, &work), &want8);
        assert_speculated("self-draft, int8 cache", &e);
        // A draft with another vocabulary is a clear error.
        let wrong = drafted(&golden::fixture_dir("llama-bias-mha"), base.clone());
        let err = Engine::with_context(common::arc(ctx), &dir, wrong, |_, _| {})
            .err()
            .expect("a draft of another vocabulary was accepted")
            .to_string();
        assert!(err.contains("vocabulary") && err.contains("520"), "{err}");
        // A draft without speculation turned on is a configuration error.
        let orphan = EngineConfig {
            draft_model: Some(dir.clone()),
            ..base.clone()
        };
        let err = Engine::with_context(common::arc(ctx), &dir, orphan, |_, _| {})
            .err()
            .expect("a draft without speculation was accepted")
            .to_string();
        assert!(err.contains("speculative"), "{err}");
    }
}
