//! Presence, frequency and repetition penalties: the sampler's fast path against a plain
//! per-token reference and a hand-computed row, validation, raw logprobs, and the engine's
//! greedy decoding with penalties against a reference decode over the reference forward
//! pass.

mod common;
use common::{arc, contexts, golden, rng};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::model::reference::ReferenceModel;
use pagellm::internals::sampling::{apply_penalties, Sampler, SamplingParams};
use rand::Rng;

fn penalized(presence: f32, frequency: f32, repetition: f32) -> SamplingParams {
    SamplingParams {
        presence_penalty: presence,
        frequency_penalty: frequency,
        repetition_penalty: repetition,
        ..SamplingParams::greedy()
    }
}

/// Token by token, straight from the definitions.
fn reference(logits: &[f32], p: &SamplingParams, prompt: &[u32], output: &[u32]) -> Vec<f32> {
    (0..logits.len())
        .map(|i| {
            let t = i as u32;
            let mut l = logits[i];
            let seen = prompt.contains(&t) || output.contains(&t);
            if seen && p.repetition_penalty != 1.0 {
                l = if l > 0.0 {
                    l / p.repetition_penalty
                } else {
                    l * p.repetition_penalty
                };
            }
            let count = output.iter().filter(|&&o| o == t).count();
            if count > 0 {
                l -= p.frequency_penalty * count as f32 + p.presence_penalty;
            }
            l
        })
        .collect()
}

#[test]
fn a_hand_computed_row() {
    let mut row = vec![2.0, -2.0, 1.0, 0.5];
    apply_penalties(&mut row, &penalized(0.25, 0.5, 2.0), &[0], &[1, 1, 2]);
    // 0: in the prompt, 2 / 2. 1: -2 * 2 - (2 * 0.5 + 0.25). 2: 1 / 2 - (0.5 + 0.25).
    assert_eq!(row, vec![1.0, -5.25, -0.25, 0.5]);
}

#[test]
fn penalties_match_the_reference_on_random_rows() {
    let mut g = rng(11);
    for case in 0..300 {
        let vocab = g.random_range(1..80);
        let logits: Vec<f32> = (0..vocab).map(|_| g.random_range(-5.0..5.0)).collect();
        let history = |g: &mut rand::rngs::StdRng, n| -> Vec<u32> {
            (0..n)
                .map(|_| g.random_range(0..vocab as u32 + 3))
                .collect()
        };
        let (np, no) = (g.random_range(0..20), g.random_range(0..20));
        let (prompt, output) = (history(&mut g, np), history(&mut g, no));
        let p = penalized(
            g.random_range(-2.0..2.0),
            g.random_range(-2.0..2.0),
            [1.0, g.random_range(0.1..3.0)][g.random_range(0..2)],
        );
        let mut got = logits.clone();
        apply_penalties(&mut got, &p, &prompt, &output);
        let want = reference(&logits, &p, &prompt, &output);
        assert_eq!(
            got, want,
            "case {case}: {p:?} prompt {prompt:?} output {output:?}"
        );
    }
}

#[test]
fn the_choice_is_penalized_and_the_logprob_stays_raw() {
    let logits = [3.0f32, 2.9, 0.0];
    let mut s = Sampler::new(penalized(0.0, 1.0, 1.0), 0);
    // Token 0 was generated once: 3.0 - 1.0 < 2.9, so token 1 wins.
    let out = s.sample_after(&logits, &[], &[0]).unwrap();
    assert_eq!(out.token, 1);
    let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
    assert!(
        (out.logprob - (2.9f64 - lse)).abs() < 1e-6,
        "{}",
        out.logprob
    );
    // Without history nothing changes.
    assert_eq!(s.sample_after(&logits, &[], &[]).unwrap().token, 0);
}

#[test]
fn impossible_penalties_are_rejected() {
    for (p, param) in [
        (penalized(2.5, 0.0, 1.0), "presence_penalty"),
        (penalized(0.0, -2.01, 1.0), "frequency_penalty"),
        (penalized(0.0, f32::NAN, 1.0), "frequency_penalty"),
        (penalized(0.0, 0.0, 0.0), "repetition_penalty"),
        (penalized(0.0, 0.0, f32::INFINITY), "repetition_penalty"),
    ] {
        let msg = p.validate(100).unwrap_err().to_string();
        assert!(msg.contains(param), "{msg}");
    }
    let beams = SamplingParams {
        beam_width: Some(2),
        ..penalized(0.5, 0.0, 1.0)
    };
    assert!(beams
        .validate(100)
        .unwrap_err()
        .to_string()
        .contains("beam search"));
}

#[test]
fn greedy_decoding_with_penalties_equals_a_reference_decode() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let f = golden::load("llama-gqa");
    let model = ReferenceModel::new(&f.files).unwrap();
    let mut e = Engine::with_context(arc(ctx), &f.dir, EngineConfig::default(), |_, _| {}).unwrap();
    for p in [
        penalized(0.0, 0.0, 1.5),
        penalized(1.0, 0.5, 1.0),
        penalized(0.3, 0.3, 1.2),
    ] {
        let p = SamplingParams {
            max_tokens: 12,
            ignore_eos: true,
            ..p
        };
        for case in &f.cases[..2] {
            let prompt = &case.prompt_ids;
            let mut out: Vec<u32> = Vec::new();
            for _ in 0..p.max_tokens {
                let seq: Vec<u32> = prompt.iter().chain(&out).copied().collect();
                let mut row = model.forward(&seq).pop().unwrap();
                apply_penalties(&mut row, &p, prompt, &out);
                out.push(pagellm::internals::reference::argmax(&row) as u32);
            }
            let h = e
                .add_request(Prompt::Tokens(prompt.clone()), p.clone())
                .unwrap();
            e.run_to_completion().unwrap();
            let got = h.wait().unwrap().outputs.remove(0).token_ids;
            assert_eq!(got, out, "{p:?} on {:?}", case.prompt);
        }
    }
    // The penalties did something: plain greedy differs for at least one prompt.
    let plain: Vec<Vec<u32>> = f.cases[..2]
        .iter()
        .map(|c| model.greedy(&c.prompt_ids, 12))
        .collect();
    let p = SamplingParams {
        max_tokens: 12,
        ignore_eos: true,
        ..penalized(0.0, 0.0, 1.5)
    };
    let with: Vec<Vec<u32>> = f.cases[..2]
        .iter()
        .map(|c| {
            let h = e
                .add_request(Prompt::Tokens(c.prompt_ids.clone()), p.clone())
                .unwrap();
            e.run_to_completion().unwrap();
            h.wait().unwrap().outputs.remove(0).token_ids
        })
        .collect();
    assert_ne!(plain, with, "repetition_penalty 1.5 changed nothing");
}

#[test]
fn every_penalty_validation_accepts_keeps_a_finite_row_finite() {
    // The extremes of every accepted range (a repetition penalty as small as the smallest
    // f32 or as large as the largest), on rows holding f32's extremes, tokens seen up to a
    // thousand times: the penalized row stays finite (saturating where the exact result
    // would not be) and a token can be sampled from it.
    let row = [
        f32::MAX,
        -f32::MAX,
        3e38,
        -3e38,
        1e30,
        -1e30,
        5.0,
        -5.0,
        0.0,
        1e-40,
    ];
    let output: Vec<u32> = (0..1000).map(|i| (i % row.len()) as u32).collect();
    for rp in [f32::from_bits(1), 1e-30, 0.5, 1.0, 2.0, 1e30, f32::MAX] {
        for (presence, frequency) in [(-2.0, -2.0), (2.0, 2.0), (-2.0, 2.0), (0.0, 0.0)] {
            let p = penalized(presence, frequency, rp);
            p.validate(row.len()).unwrap();
            let mut got = row;
            apply_penalties(&mut got, &p, &[0, 1], &output);
            assert!(
                got.iter().all(|l| l.is_finite()),
                "rp {rp:e} {presence}/{frequency}: {got:?}"
            );
            // Saturation keeps the order the exact arithmetic gives where it is finite.
            let exact = reference(&row, &p, &[0, 1], &output);
            for (g, e) in got.iter().zip(&exact) {
                assert!(!e.is_finite() || g == e, "rp {rp:e}: {g} vs {e}");
            }
            let mut s = Sampler::new(p, 7);
            let out = s.sample_after(&row, &[0, 1], &output);
            assert!(out.is_ok(), "rp {rp:e} {presence}/{frequency}: {out:?}");
        }
    }
}
