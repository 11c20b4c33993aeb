//! Speculative sampling keeps the target's distribution exactly: on a tiny Markov "model"
//! whose distribution over three-token outputs can be written down, outputs produced by
//! proposing and verifying (with a draft distribution, and with point-mass proposals as
//! prompt lookup makes) match it by a chi-square test, and a verifier that skipped the
//! residual would not.

use pagellm::internals::sampling::{sequence_rng, Distribution, SequenceRng};
use pagellm::internals::spec::{accept_sampled, Proposal};

const V: usize = 4;
/// Target next-token probabilities given the previous token.
const P: [[f64; V]; V] = [
    [0.10, 0.40, 0.30, 0.20],
    [0.50, 0.05, 0.15, 0.30],
    [0.25, 0.25, 0.25, 0.25],
    [0.06, 0.14, 0.20, 0.60],
];
/// A draft that disagrees with the target everywhere.
const Q: [[f64; V]; V] = [
    [0.40, 0.10, 0.10, 0.40],
    [0.10, 0.60, 0.20, 0.10],
    [0.70, 0.10, 0.10, 0.10],
    [0.25, 0.25, 0.25, 0.25],
];
const OUT: usize = 3;
const TRIALS: usize = 120_000;

fn dist(row: &[f64; V]) -> Distribution {
    Distribution::from_weights(
        row.iter()
            .enumerate()
            .map(|(i, &p)| (i as u32, p))
            .collect(),
    )
    .unwrap()
}

#[derive(Clone, Copy)]
enum Mode {
    Draft,
    /// Prompt lookup's kind of guess: a fixed function of the context.
    Point,
}

/// The first `OUT` tokens after token 0, produced `k` proposals at a time.
fn generate(mode: Mode, k: usize, rng: &mut SequenceRng) -> [u32; OUT] {
    let targets: Vec<Distribution> = P.iter().map(dist).collect();
    let drafts: Vec<Distribution> = Q.iter().map(dist).collect();
    let mut out = Vec::new();
    let mut prev = 0u32;
    while out.len() < OUT {
        let mut tokens = Vec::new();
        let mut ctx = prev;
        for _ in 0..k {
            let t = match mode {
                Mode::Draft => drafts[ctx as usize].sample(rng),
                Mode::Point => (ctx * 3 + 1) % V as u32,
            };
            tokens.push(t);
            ctx = t;
        }
        let proposals: Vec<Proposal> = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| match mode {
                Mode::Draft => {
                    let from = if i == 0 { prev } else { tokens[i - 1] };
                    Proposal::Drawn {
                        token: t,
                        q: &drafts[from as usize],
                    }
                }
                Mode::Point => Proposal::Point(t),
            })
            .collect();
        // Row i judges proposal i: the target after `prev` and proposals 0..i.
        let rows: Vec<Distribution> = std::iter::once(prev)
            .chain(tokens.iter().copied())
            .map(|c| targets[c as usize].clone())
            .collect();
        let got = accept_sampled(&proposals, &rows, rng).unwrap();
        out.extend_from_slice(&tokens[..got.accepted]);
        out.push(got.next);
        prev = *out.last().unwrap();
    }
    [out[0], out[1], out[2]]
}

/// Pearson's chi-square of observed counts over all V^3 outputs against the exact
/// target probabilities.
fn chi_square(counts: &[usize]) -> f64 {
    let mut chi = 0.0;
    for (cell, &n) in counts.iter().enumerate() {
        let (a, b, c) = (cell / (V * V), (cell / V) % V, cell % V);
        let expected = TRIALS as f64 * P[0][a] * P[a][b] * P[b][c];
        chi += (n as f64 - expected).powi(2) / expected;
    }
    chi
}

fn counts(mut next: impl FnMut() -> [u32; OUT]) -> Vec<usize> {
    let mut counts = vec![0usize; V * V * V];
    for _ in 0..TRIALS {
        let [a, b, c] = next();
        counts[(a as usize * V + b as usize) * V + c as usize] += 1;
    }
    counts
}

/// 63 degrees of freedom: mean 63, standard deviation 11.2; 140 is about seven standard
/// deviations out (a right implementation fails it with probability ~1e-9, and the seeds
/// are fixed anyway).
const LIMIT: f64 = 140.0;

#[test]
fn speculative_outputs_have_the_targets_distribution() {
    for (mode, name) in [(Mode::Draft, "draft"), (Mode::Point, "point")] {
        for k in [1, 2, 4] {
            let mut rng = sequence_rng(Some(2023 + k as u64), 0);
            let chi = chi_square(&counts(|| generate(mode, k, &mut rng)));
            assert!(
                chi < LIMIT,
                "{name} proposals, k = {k}: chi-square {chi:.1}"
            );
        }
    }
}

/// The test has power: taking every draft token unexamined (what verification prevents),
/// or sampling a rejection from the target instead of the residual, is far outside it.
#[test]
fn a_wrong_verifier_fails_the_same_test() {
    let drafts: Vec<Distribution> = Q.iter().map(dist).collect();
    let targets: Vec<Distribution> = P.iter().map(dist).collect();
    let mut rng = sequence_rng(Some(7), 0);
    // Always accept: the draft's distribution.
    let chi = chi_square(&counts(|| {
        let a = drafts[0].sample(&mut rng);
        let b = drafts[a as usize].sample(&mut rng);
        let c = drafts[b as usize].sample(&mut rng);
        [a, b, c]
    }));
    assert!(chi > 10.0 * LIMIT, "chi-square {chi:.1}");
    // Accept with min(1, p/q) but resample a rejection from p instead of max(0, p - q):
    // too many of the tokens the draft over-proposes.
    let one = |prev: u32, rng: &mut SequenceRng| {
        let (p, q) = (&targets[prev as usize], &drafts[prev as usize]);
        let x = q.sample(rng);
        let u: f64 = rand::Rng::random(rng);
        if u * q.prob(x) < p.prob(x) {
            x
        } else {
            p.sample(rng)
        }
    };
    let chi = chi_square(&counts(|| {
        let a = one(0, &mut rng);
        let b = one(a, &mut rng);
        let c = one(b, &mut rng);
        [a, b, c]
    }));
    assert!(chi > 2.0 * LIMIT, "chi-square {chi:.1}");
}
