//! What validation accepts, the sampler can compute: random sampling parameters over every
//! range a client can send (extremes, subnormals, infinities and NaN among them) against
//! random logits rows over f32's whole finite range. Whenever `validate` accepts the
//! parameters, sampling after penalties must give a token inside the row with a finite
//! log-probability, and the same token again from the same seed; whatever validation
//! refuses is refused with a parameter named.

use pagellm::internals::sampling::{Sampler, SamplingError, SamplingParams};
use proptest::prelude::*;

const VOCAB: usize = 40;

fn float() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(0.0f32),
        Just(-0.0),
        Just(1e-45),
        Just(1e-30),
        Just(1e-5),
        Just(0.5),
        Just(1.0),
        Just(1.5),
        Just(2.0),
        Just(1e30),
        Just(f32::MAX),
        Just(-1.0),
        Just(-2.0),
        Just(-f32::MAX),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(f32::NAN),
        -3.0f32..3.0,
    ]
}

/// Mostly values in `range` (what validation accepts), the extremes of [`float`] a fifth of
/// the time.
fn around(range: std::ops::Range<f32>) -> impl Strategy<Value = f32> {
    prop_oneof![4 => range, 1 => float()]
}

fn logit() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -20.0f32..20.0,
        1 => Just(f32::MAX),
        1 => Just(-f32::MAX),
        1 => Just(1e30f32),
        1 => Just(-1e30f32),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
    ]
}

fn params() -> impl Strategy<Value = SamplingParams> {
    let k = prop_oneof![
        Just(None),
        Just(Some(0usize)),
        Just(Some(1)),
        Just(Some(2)),
        Just(Some(VOCAB)),
        Just(Some(VOCAB + 5)),
        Just(Some(usize::MAX))
    ];
    let lp = prop_oneof![
        Just(None),
        Just(Some(0usize)),
        Just(Some(1)),
        Just(Some(5)),
        Just(Some(VOCAB + 1))
    ];
    (
        (around(0.0..3.0), k, around(0.0..1.0), around(0.0..1.0)),
        (
            around(-2.0..2.0),
            around(-2.0..2.0),
            around(0.01..3.0),
            lp,
            any::<u64>(),
        ),
    )
        .prop_map(
            |((t, top_k, top_p, min_p), (pp, fp, rp, logprobs, seed))| SamplingParams {
                temperature: t,
                top_k,
                top_p,
                min_p,
                presence_penalty: pp,
                frequency_penalty: fp,
                repetition_penalty: rp,
                logprobs,
                seed: Some(seed),
                ..SamplingParams::default()
            },
        )
}

fn row() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(logit(), VOCAB).prop_filter("a token to choose", |r| {
        r.iter().any(|&x| x > f32::NEG_INFINITY)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    #[test]
    fn accepted_parameters_always_sample(
        params in params(),
        logits in row(),
        prompt in proptest::collection::vec(0u32..VOCAB as u32, 0..6),
        output in proptest::collection::vec(0u32..VOCAB as u32, 0..6),
    ) {
        match params.validate(VOCAB) {
            Err(SamplingError::Invalid { param, .. }) => prop_assert!(!param.is_empty()),
            Err(e) => prop_assert!(false, "refused without naming a parameter: {e}"),
            Ok(()) => {
                let mut a = Sampler::new(params.clone(), 0);
                let out = a.sample_after(&logits, &prompt, &output);
                let out = out.map_err(|e| TestCaseError::fail(format!("{params:?}: {e}")))?;
                prop_assert!((out.token as usize) < VOCAB);
                prop_assert!(logits[out.token as usize] > f32::NEG_INFINITY, "{params:?}");
                prop_assert!(out.logprob.is_finite() && out.logprob <= 0.0, "{}", out.logprob);
                for &(id, lp) in &out.top_logprobs {
                    prop_assert!((id as usize) < VOCAB && lp <= 0.0 && !lp.is_nan());
                }
                let mut b = Sampler::new(params.clone(), 0);
                prop_assert_eq!(b.sample_after(&logits, &prompt, &output).unwrap().token, out.token);
            }
        }
    }
}
