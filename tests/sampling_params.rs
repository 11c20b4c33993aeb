//! `SamplingParams`: defaults, JSON with missing fields, and one test per validation error
//! checking that the message names the parameter, the value and what is allowed.

use pagellm::internals::sampling::{SamplingError, SamplingParams, MAX_LOGPROBS};

const VOCAB: usize = 512;

fn params(edit: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    edit(&mut p);
    p
}

/// The validation message of `p`, after checking the error names `param`.
fn rejected(p: SamplingParams, param: &str) -> String {
    let err = p.validate(VOCAB).expect_err("should be rejected");
    match &err {
        SamplingError::Invalid { param: got, .. }
        | SamplingError::BeamSearchConflict { param: got, .. } => {
            assert_eq!(*got, param, "{err}")
        }
        other => panic!("unexpected error kind: {other:?}"),
    }
    err.to_string()
}

#[test]
fn defaults_follow_vllm() {
    let p = SamplingParams::default();
    assert_eq!(p.n, 1);
    assert_eq!(p.temperature, 1.0);
    assert_eq!(p.top_k, None);
    assert_eq!(p.top_p, 1.0);
    assert_eq!(p.min_p, 0.0);
    assert_eq!(p.seed, None);
    assert_eq!(p.max_tokens, 16);
    assert!(p.stop.is_empty() && p.stop_token_ids.is_empty());
    assert!(!p.ignore_eos);
    assert_eq!(p.logprobs, None);
    assert_eq!(p.beam_width, None);
    assert_eq!(p.length_penalty, 1.0);
    assert!(!p.is_greedy() && !p.is_beam_search());
    assert!(SamplingParams::greedy().is_greedy());
    p.validate(VOCAB).unwrap();
    SamplingParams::greedy().validate(VOCAB).unwrap();
}

#[test]
fn json_fills_missing_fields_with_defaults() {
    let p: SamplingParams =
        serde_json::from_str(r#"{"temperature": 0.7, "top_k": 40, "stop": ["\n"], "seed": 3}"#)
            .unwrap();
    assert_eq!(
        p,
        params(|p| {
            p.temperature = 0.7;
            p.top_k = Some(40);
            p.stop = vec!["\n".into()];
            p.seed = Some(3);
        })
    );
    let back: SamplingParams = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn valid_edge_values_pass() {
    for p in [
        params(|p| p.top_p = 1e-6),
        params(|p| p.min_p = 1.0),
        params(|p| p.top_k = Some(0)),
        params(|p| p.top_k = Some(VOCAB)),
        params(|p| p.logprobs = Some(MAX_LOGPROBS)),
        params(|p| p.stop_token_ids = vec![VOCAB as u32 - 1]),
        params(|p| p.length_penalty = -2.0),
        params(|p| {
            p.temperature = 0.0;
            p.beam_width = Some(4);
            p.n = 4;
        }),
    ] {
        p.validate(VOCAB).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    }
}

#[test]
fn n_zero() {
    let msg = rejected(params(|p| p.n = 0), "n");
    assert_eq!(msg, "invalid n = 0: must be at least 1");
}

#[test]
fn temperature_negative_nan_or_infinite() {
    let msg = rejected(params(|p| p.temperature = -0.5), "temperature");
    assert_eq!(
        msg,
        "invalid temperature = -0.5: must be a finite number >= 0 (0 means greedy)"
    );
    let msg = rejected(params(|p| p.temperature = f32::NAN), "temperature");
    assert!(msg.starts_with("invalid temperature = NaN:"), "{msg}");
    let msg = rejected(params(|p| p.temperature = f32::INFINITY), "temperature");
    assert!(msg.starts_with("invalid temperature = inf:"), "{msg}");
}

#[test]
fn top_p_outside_zero_one() {
    for (v, shown) in [(0.0, "0"), (1.5, "1.5"), (-0.1, "-0.1"), (f32::NAN, "NaN")] {
        let msg = rejected(params(|p| p.top_p = v), "top_p");
        assert_eq!(msg, format!("invalid top_p = {shown}: must be in (0, 1]"));
    }
}

#[test]
fn min_p_outside_zero_one() {
    for (v, shown) in [(-0.1, "-0.1"), (1.01, "1.01"), (f32::NAN, "NaN")] {
        let msg = rejected(params(|p| p.min_p = v), "min_p");
        assert_eq!(msg, format!("invalid min_p = {shown}: must be in [0, 1]"));
    }
}

#[test]
fn max_tokens_zero() {
    let msg = rejected(params(|p| p.max_tokens = 0), "max_tokens");
    assert_eq!(msg, "invalid max_tokens = 0: must be at least 1");
}

#[test]
fn top_k_above_vocabulary() {
    let msg = rejected(params(|p| p.top_k = Some(513)), "top_k");
    assert_eq!(
        msg,
        "invalid top_k = 513: must not exceed the vocabulary size 512 (0 or unset turns top-k off)"
    );
}

#[test]
fn logprobs_above_limit_or_vocabulary() {
    let msg = rejected(params(|p| p.logprobs = Some(21)), "logprobs");
    assert_eq!(
        msg,
        "invalid logprobs = 21: must be at most 20 (the smaller of 20 and the vocabulary size 512)"
    );
    let err = params(|p| p.logprobs = Some(6)).validate(5).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid logprobs = 6: must be at most 5 (the smaller of 20 and the vocabulary size 5)"
    );
}

#[test]
fn length_penalty_not_finite() {
    let msg = rejected(params(|p| p.length_penalty = f32::NAN), "length_penalty");
    assert_eq!(msg, "invalid length_penalty = NaN: must be a finite number");
}

#[test]
fn empty_stop_string() {
    let msg = rejected(
        params(|p| p.stop = vec!["ok".into(), String::new()]),
        "stop",
    );
    assert_eq!(
        msg,
        "invalid stop = \"\" (entry 1): stop strings must not be empty"
    );
}

#[test]
fn stop_token_ids_outside_vocabulary() {
    let msg = rejected(
        params(|p| p.stop_token_ids = vec![1, 512]),
        "stop_token_ids",
    );
    assert_eq!(
        msg,
        "invalid stop_token_ids = [.., 512, ..]: token ids must be below the vocabulary size 512"
    );
}

#[test]
fn beam_width_zero() {
    let msg = rejected(
        params(|p| {
            p.temperature = 0.0;
            p.beam_width = Some(0);
        }),
        "beam_width",
    );
    assert_eq!(msg, "invalid beam_width = 0: must be at least 1");
}

#[test]
fn beam_width_below_n() {
    let msg = rejected(
        params(|p| {
            p.temperature = 0.0;
            p.beam_width = Some(2);
            p.n = 3;
        }),
        "n",
    );
    assert_eq!(
        msg,
        "beam search (beam_width = 2) does not allow n = 3: beam search returns at most \
         beam_width sequences, so n must be <= beam_width"
    );
}

#[test]
fn beam_search_with_sampling_settings() {
    let beam = |edit: fn(&mut SamplingParams)| {
        params(|p| {
            p.temperature = 0.0;
            p.beam_width = Some(3);
            edit(p);
        })
    };
    let allowed = "beam search is deterministic; use temperature = 0, top_k unset, top_p = 1 \
                   and min_p = 0 with it";
    type Edit = fn(&mut SamplingParams);
    let cases: [(Edit, &str, &str); 4] = [
        (|p| p.temperature = 0.8, "temperature", "0.8"),
        (|p| p.top_k = Some(5), "top_k", "5"),
        (|p| p.top_p = 0.9, "top_p", "0.9"),
        (|p| p.min_p = 0.1, "min_p", "0.1"),
    ];
    for (edit, param, value) in cases {
        let msg = rejected(beam(edit), param);
        assert_eq!(
            msg,
            format!("beam search (beam_width = 3) does not allow {param} = {value}: {allowed}")
        );
    }
}

#[test]
fn stops_on_token_honours_ignore_eos() {
    let p = params(|p| p.stop_token_ids = vec![7]);
    assert!(p.stops_on_token(7, &[1]));
    assert!(p.stops_on_token(1, &[1]));
    assert!(!p.stops_on_token(2, &[1]));
    let p = params(|p| {
        p.stop_token_ids = vec![7];
        p.ignore_eos = true;
    });
    assert!(p.stops_on_token(7, &[1]));
    assert!(!p.stops_on_token(1, &[1]));
}
