//! The sampler on hand-computed distributions: greedy arg-max, the candidate sets kept by
//! temperature / top-k / top-p / min-p, empirical frequencies of seeded draws, reproducibility
//! per (seed, sample index), and log-probabilities against a hand computation and against
//! transformers' own numbers in the fixtures.

mod common;
use pagellm::internals::sampling::{
    argmax, filtered_distribution, log_softmax, logsumexp, sample, sequence_rng, top_logprobs,
    Sampler, SamplingError, SamplingParams,
};
use rand::{Rng, SeedableRng};
use std::path::Path;

/// Logits whose softmax is exactly 0.5 / 0.3 / 0.15 / 0.05.
fn four() -> Vec<f32> {
    [0.5f64, 0.3, 0.15, 0.05]
        .iter()
        .map(|p| p.ln() as f32)
        .collect()
}

fn kept(logits: &[f32], t: f32, top_k: Option<usize>, top_p: f32, min_p: f32) -> Vec<u32> {
    filtered_distribution(logits, t, top_k, top_p, min_p)
        .unwrap()
        .ids()
}

#[test]
fn greedy_takes_the_first_arg_max() {
    assert_eq!(argmax(&[0.1, 2.0, -1.0, 2.0]).unwrap(), 1);
    assert_eq!(argmax(&[f32::NEG_INFINITY, -5.0]).unwrap(), 1);
    let p = SamplingParams::greedy();
    let mut rng = sequence_rng(Some(1), 0);
    let out = sample(&[0.0, 3.0, 3.0, 1.0], &p, &mut rng).unwrap();
    assert_eq!(out.token, 1);
    // Greedy consumes no randomness: the stream is where a fresh one starts.
    let mut fresh = sequence_rng(Some(1), 0);
    assert_eq!(rng.random::<u64>(), fresh.random::<u64>());
}

#[test]
fn unusable_rows_are_errors() {
    let p = SamplingParams::default();
    let mut rng = sequence_rng(Some(0), 0);
    assert_eq!(argmax(&[]), Err(SamplingError::EmptyLogits));
    let err = argmax(&[0.0, f32::NAN]).unwrap_err();
    assert!(
        matches!(err, SamplingError::NonFiniteLogit { index: 1, value } if value.is_nan()),
        "{err:?}"
    );
    let err = sample(&[0.0, f32::INFINITY], &p, &mut rng).unwrap_err();
    assert_eq!(
        err.to_string(),
        "logit 1 is inf: the row must hold finite values or -inf"
    );
    let err = sample(&[f32::NEG_INFINITY; 3], &p, &mut rng).unwrap_err();
    assert_eq!(err, SamplingError::NoCandidates);
    assert_eq!(
        argmax(&[f32::NEG_INFINITY; 2]).unwrap_err().to_string(),
        "every logit is -inf: no token can be chosen"
    );
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    let l = four();
    assert_eq!(kept(&l, 1.0, None, 0.8, 0.0), [0, 1]); // 0.5 + 0.3 reaches 0.8 exactly
    assert_eq!(kept(&l, 1.0, None, 0.81, 0.0), [0, 1, 2]);
    assert_eq!(kept(&l, 1.0, None, 0.5, 0.0), [0]);
    assert_eq!(kept(&l, 1.0, None, 0.3, 0.0), [0]); // the top token always stays
    assert_eq!(kept(&l, 1.0, None, 0.95, 0.0), [0, 1, 2]);
    assert_eq!(kept(&l, 1.0, None, 0.96, 0.0), [0, 1, 2, 3]);
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.0), [0, 1, 2, 3]);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_top() {
    let l = four();
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.4), [0, 1]); // threshold 0.2: 0.3 stays
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.3), [0, 1, 2]); // threshold 0.15, on the boundary
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.6), [0, 1]); // threshold 0.3, on the boundary
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.61), [0]);
    assert_eq!(kept(&l, 1.0, None, 1.0, 1.0), [0]);
    assert_eq!(kept(&l, 1.0, None, 1.0, 0.1), [0, 1, 2, 3]); // 0.05 >= 0.05
}

#[test]
fn top_k_keeps_the_k_largest_and_boundary_ties() {
    let l = four();
    assert_eq!(kept(&l, 1.0, Some(2), 1.0, 0.0), [0, 1]);
    assert_eq!(kept(&l, 1.0, Some(1), 1.0, 0.0), [0]);
    assert_eq!(kept(&l, 1.0, Some(4), 1.0, 0.0), [0, 1, 2, 3]);
    assert_eq!(kept(&l, 1.0, Some(0), 1.0, 0.0), [0, 1, 2, 3]);
    assert_eq!(kept(&[1.0, 2.0, 2.0, 0.0], 1.0, Some(1), 1.0, 0.0), [1, 2]);
    // -inf logits are never candidates.
    assert_eq!(
        kept(&[0.0, f32::NEG_INFINITY, 0.0], 1.0, None, 1.0, 0.0),
        [0, 2]
    );
}

#[test]
fn top_k_follows_the_logits_at_any_temperature() {
    // At T = 1e30 every exp((x - max) / T) rounds to 1; the top k are still the k largest
    // logits, so top_k 1 is the arg-max and top_k 2 its runner-up too, for every seed.
    let l = four();
    for t in [1e30f32, 1e38, f32::MAX] {
        assert_eq!(kept(&l, t, Some(1), 1.0, 0.0), [0], "T = {t}");
        assert_eq!(kept(&l, t, Some(2), 1.0, 0.0), [0, 1], "T = {t}");
        let d = filtered_distribution(&l, t, Some(2), 1.0, 0.0).unwrap();
        assert_eq!(
            (d.prob(0), d.prob(1)),
            (0.5, 0.5),
            "T = {t}: uniform over the two"
        );
        let params = SamplingParams {
            temperature: t,
            top_k: Some(1),
            ..SamplingParams::default()
        };
        for seed in 0..50 {
            let mut s = Sampler::new(
                SamplingParams {
                    seed: Some(seed),
                    ..params.clone()
                },
                0,
            );
            assert_eq!(s.sample(&l).unwrap().token, 0, "T = {t}, seed {seed}");
        }
    }
}

#[test]
fn filters_apply_in_order_on_renormalised_mass() {
    let l = four();
    // After top-k 3 the mass is 0.95: 0.5/0.95 + 0.3/0.95 = 0.842 reaches 0.82 ...
    assert_eq!(kept(&l, 1.0, Some(3), 0.82, 0.0), [0, 1]);
    // ... while over the full distribution 0.8 does not.
    assert_eq!(kept(&l, 1.0, None, 0.82, 0.0), [0, 1, 2]);
    let d = filtered_distribution(&l, 1.0, Some(3), 1.0, 0.0).unwrap();
    for (id, p) in [(0, 0.5 / 0.95), (1, 0.3 / 0.95), (2, 0.15 / 0.95), (3, 0.0)] {
        assert!((d.prob(id) - p).abs() < 1e-6, "{id}: {}", d.prob(id));
    }
}

#[test]
fn temperature_reshapes_before_filtering() {
    let l = four();
    // T = 2: p^(1/2) renormalised = 0.379 / 0.294 / 0.208 / 0.120.
    let d = filtered_distribution(&l, 2.0, None, 1.0, 0.0).unwrap();
    let want = [0.378996, 0.293569, 0.207585, 0.119849];
    for (id, p) in want.iter().enumerate() {
        assert!((d.prob(id as u32) - p).abs() < 1e-6);
    }
    assert_eq!(kept(&l, 2.0, None, 0.8, 0.0), [0, 1, 2]);
    // T = 0.5: p^2 renormalised = 0.685 / 0.247 / 0.062 / 0.007.
    assert_eq!(kept(&l, 0.5, None, 0.8, 0.0), [0, 1]);
    assert_eq!(kept(&l, 0.5, None, 1.0, 0.1), [0, 1]); // threshold 0.0685 drops 0.0616
}

/// Straightforward reference of the filter chain: full softmax, full sorts.
fn reference_kept(logits: &[f32], t: f64, top_k: usize, top_p: f64, min_p: f64) -> Vec<u32> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let w: Vec<f64> = logits
        .iter()
        .map(|&x| ((x as f64 - max) / t).exp())
        .collect();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| w[b].partial_cmp(&w[a]).unwrap().then(a.cmp(&b)));
    if top_k > 0 && top_k < order.len() {
        let kth = w[order[top_k - 1]];
        order.retain(|&i| w[i] >= kth);
    }
    if top_p < 1.0 {
        let total: f64 = order.iter().map(|&i| w[i]).sum();
        let mut cum = 0.0;
        let mut keep = 0;
        for &i in &order {
            keep += 1;
            cum += w[i];
            if cum >= top_p * total * (1.0 - 1e-6) {
                break;
            }
        }
        order.truncate(keep);
    }
    let top = w[order[0]];
    order.retain(|&i| w[i] >= min_p * top * (1.0 - 1e-6));
    let mut ids: Vec<u32> = order.into_iter().map(|i| i as u32).collect();
    ids.sort_unstable();
    ids
}

#[test]
fn filters_agree_with_a_full_sort_reference_on_large_rows() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let mut large_nuclei = 0;
    for case in 0..200 {
        let n = rng.random_range(1..3000);
        // Mostly flat rows so that nuclei of hundreds of tokens occur.
        let spread = [0.1f32, 1.0, 5.0][case % 3];
        let logits: Vec<f32> = (0..n).map(|_| rng.random_range(-spread..spread)).collect();
        let t = [0.5, 1.0, 1.7][(case / 64) % 3];
        let top_k = [0, 1, 40, n / 2][case % 4];
        let top_p = [1.0, 0.9, 0.5, 0.05][(case / 4) % 4];
        let min_p = [0.0, 0.0, 0.3, 0.9][(case / 16) % 4];
        let got = kept(&logits, t as f32, Some(top_k), top_p as f32, min_p as f32);
        let want = reference_kept(
            &logits,
            f64::from(t as f32),
            top_k,
            f64::from(top_p as f32),
            f64::from(min_p as f32),
        );
        assert!(
            got == want,
            "case {case}: n {n}, t {t}, k {top_k}, p {top_p}, min_p {min_p}: kept {} tokens, \
             reference {}",
            got.len(),
            want.len()
        );
        if top_p < 1.0 && got.len() > 64 {
            large_nuclei += 1;
        }
    }
    // The nucleus search widens its selection beyond 64 tokens: make sure that ran.
    assert!(large_nuclei > 10, "{large_nuclei}");
}

/// Draws `n` tokens with a seeded sampler; returns the frequency of each id.
fn frequencies(logits: &[f32], params: SamplingParams, n: usize) -> Vec<f64> {
    let mut s = Sampler::new(params, 0);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits).unwrap().token as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

#[test]
fn seeded_draws_follow_the_renormalised_distribution() {
    const N: usize = 40_000;
    // Standard error is at most sqrt(0.25 / N) = 0.0025; allow five of them.
    const TOL: f64 = 0.0125;
    let cases = [
        (SamplingParams::default(), vec![0.5, 0.3, 0.15, 0.05]),
        (
            SamplingParams {
                top_p: 0.95,
                ..Default::default()
            },
            vec![0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0],
        ),
        (
            SamplingParams {
                top_k: Some(2),
                ..Default::default()
            },
            vec![0.625, 0.375, 0.0, 0.0],
        ),
        (
            SamplingParams {
                temperature: 2.0,
                ..Default::default()
            },
            vec![0.378996, 0.293569, 0.207585, 0.119849],
        ),
    ];
    for (mut params, want) in cases {
        params.seed = Some(2024);
        let got = frequencies(&four(), params.clone(), N);
        for (id, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < TOL,
                "{params:?}: token {id} drawn {g:.4}, expected {w:.4}"
            );
        }
    }
}

fn draw(seed: Option<u64>, index: u64, steps: usize) -> Vec<u32> {
    let params = SamplingParams {
        seed,
        ..Default::default()
    };
    let logits = vec![0.0f32; 16];
    let mut s = Sampler::new(params, index);
    (0..steps)
        .map(|_| s.sample(&logits).unwrap().token)
        .collect()
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    assert_eq!(draw(Some(7), 0, 64), draw(Some(7), 0, 64));
    assert_ne!(draw(Some(7), 0, 64), draw(Some(8), 0, 64));
    // The samples of one request (n > 1) use different streams of the same seed.
    assert_ne!(draw(Some(7), 0, 64), draw(Some(7), 1, 64));
    // Without a seed, two sequences are independent.
    assert_ne!(draw(None, 0, 64), draw(None, 0, 64));
}

#[test]
fn tokens_do_not_depend_on_batch_composition() {
    // Alone vs interleaved with other sequences (as in a batch that changes every step).
    let alone = draw(Some(99), 3, 32);
    let params = SamplingParams {
        seed: Some(99),
        ..Default::default()
    };
    let logits = vec![0.0f32; 16];
    let mut ours = Sampler::new(params.clone(), 3);
    let mut others: Vec<Sampler> = (0..3).map(|i| Sampler::new(params.clone(), i)).collect();
    let mut interleaved = Vec::new();
    for step in 0..32 {
        for other in others.iter_mut().take(step % 4) {
            other.sample(&logits).unwrap();
        }
        interleaved.push(ours.sample(&logits).unwrap().token);
    }
    assert_eq!(alone, interleaved);
}

#[test]
fn logprobs_are_log_softmax_of_raw_logits() {
    let logits = [1.0f32, 2.0, 3.0, 0.5];
    // ln(e + e^2 + e^3 + e^0.5) = 3.460773489156851, by hand.
    let want = [
        -2.460773489156851,
        -1.460773489156851,
        -0.460773489156851,
        -2.960773489156851,
    ];
    assert!((logsumexp(&logits).unwrap() - 3.460773489156851).abs() < 1e-12);
    for (g, w) in log_softmax(&logits).unwrap().iter().zip(want) {
        assert!((g - w).abs() < 1e-12);
    }
    let top = top_logprobs(&logits, 3).unwrap();
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [2, 1, 0]);
    assert!((top[0].1 - want[2]).abs() < 1e-12);

    // The chosen token's logprob ignores temperature and filtering.
    let params = SamplingParams {
        temperature: 0.3,
        top_k: Some(1),
        logprobs: Some(2),
        seed: Some(0),
        ..Default::default()
    };
    let out = sample(&logits, &params, &mut sequence_rng(Some(0), 0)).unwrap();
    assert_eq!(out.token, 2);
    assert!((out.logprob - want[2]).abs() < 1e-12);
    assert_eq!(out.top_logprobs.len(), 2);
    assert_eq!(out.top_logprobs[1].0, 1);
    // Not requested: no alternatives, but the chosen token's logprob is still there.
    let out = sample(
        &logits,
        &SamplingParams::greedy(),
        &mut sequence_rng(Some(0), 0),
    )
    .unwrap();
    assert!(out.top_logprobs.is_empty());
    assert!((out.logprob - want[2]).abs() < 1e-12);
}

#[test]
fn top_logprob_ties_go_to_the_lower_id() {
    let top = top_logprobs(&[1.0, 3.0, 3.0, 2.0, 3.0], 4).unwrap();
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2, 4, 3]);
    // A masked token (a constraint or a ban) is never offered as an alternative: it could
    // not have been sampled, and JSON has no -inf to report it with.
    let masked = top_logprobs(&[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, -1.0], 4).unwrap();
    assert_eq!(masked.len(), 2);
    assert_eq!(masked[0].0, 1);
    assert_eq!(masked[1].0, 3);
    assert!((masked[0].1.exp() + masked[1].1.exp() - 1.0).abs() < 1e-12);
}

#[test]
fn logprobs_match_transformers_on_fixture_logits() {
    for name in common::golden::NAMES {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
            .join("expected.json");
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for case in expected["cases"].as_array().unwrap() {
            // Logits after the last prompt token predict the first generated token.
            let last: Vec<f32> = case["prompt_logits"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let first_greedy = case["greedy_ids"][0].as_u64().unwrap() as u32;
            assert_eq!(argmax(&last).unwrap(), first_greedy, "{name}");
            let ours = top_logprobs(&last, 5).unwrap();
            let theirs = case["top5"][0].as_array().unwrap();
            for (o, t) in ours.iter().zip(theirs) {
                assert_eq!(o.0 as u64, t[0].as_u64().unwrap(), "{name}");
                let diff = (o.1 - t[1].as_f64().unwrap()).abs();
                assert!(diff < 1e-4, "{name}: token {} off by {diff}", o.0);
            }
        }
    }
}
