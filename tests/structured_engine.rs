//! Constrained decoding in the engine, on the shipped model (a tiny model that writes
//! nonsense: the constraint is all that makes its output valid), on every test adapter:
//!
//! - sampled at temperature 1 over many seeds, with n > 1 and beams in the same batch,
//!   every output of a JSON schema validates (the `jsonschema` crate), every regex output
//!   matches (the `regex` crate), every choice is one of the choices, every grammar output
//!   derives from the grammar;
//! - a constrained greedy request gives the same tokens alone, batched with others, and
//!   under preemption by swap and by recompute;
//! - reported logprobs are those after masking: the engine's first token and logprob equal
//!   a plain-Rust computation from the reference forward pass and the constraint's mask;
//! - `logit_bias` moves greedy tokens as a hand computation says;
//! - a constraint that does not compile is refused alone; one that is cut off by
//!   `max_tokens` finishes with `length`, and a stop string ends one before it completes.

mod common;
use common::{arc, contexts};
use pagellm::internals::constrain::{Compiler, StructuredOutput};
use pagellm::internals::engine::{
    Engine, EngineConfig, EngineError, FinishReason, PreemptionMode, Prompt,
};
use pagellm::internals::model::reference::{log_softmax, ReferenceModel};
use pagellm::internals::model::ModelFiles;
use pagellm::internals::sampling::SamplingParams;
use serde_json::{json, Value};
use std::path::Path;

const MODEL: &str = "models/fortunes-llama";

fn engine(ctx: &pagellm::GpuContext, cfg: EngineConfig) -> Engine {
    Engine::with_context(arc(ctx), Path::new(MODEL), cfg, |_, _| {}).unwrap()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "fortune": {"type": "string", "minLength": 1, "maxLength": 24},
            "lucky": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99},
                      "minItems": 1, "maxItems": 3},
            "mood": {"enum": ["good", "bad", "strange"]},
            "certain": {"type": "boolean"}
        },
        "required": ["fortune", "lucky", "mood"],
        "additionalProperties": false
    })
}

fn constrained(spec: StructuredOutput, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: 200,
        structured_output: Some(spec),
        ..SamplingParams::default()
    }
}

const REGEX: &str = r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}(\.[0-9])?";
const GRAMMAR: &str = r#"
start: sum
sum: term (("+" | "-") term)*
term: NUMBER | "(" sum ")"
NUMBER: /[1-9][0-9]?/
"#;

/// Recognizes GRAMMAR by hand: returns what follows one `sum`.
fn sum(s: &[u8]) -> Option<&[u8]> {
    fn term(s: &[u8]) -> Option<&[u8]> {
        if let Some(rest) = s.strip_prefix(b"(") {
            return sum(rest)?.strip_prefix(b")");
        }
        let d = s.iter().take_while(|b| b.is_ascii_digit()).count();
        ((1..=2).contains(&d) && s[0] != b'0').then(|| &s[d..])
    }
    let mut rest = term(s)?;
    while let Some(r) = rest.strip_prefix(b"+").or_else(|| rest.strip_prefix(b"-")) {
        rest = term(r)?;
    }
    Some(rest)
}

#[test]
fn sampled_outputs_of_every_kind_are_valid_over_many_seeds() {
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let regex = regex::Regex::new(&format!("^(?:{REGEX})$")).unwrap();
    let choices = vec!["heads".to_string(), "tails".to_string(), "edge".to_string()];
    for ctx in contexts() {
        let mut e = engine(ctx, EngineConfig::default());
        let mut handles = Vec::new();
        for seed in 0..12u64 {
            let specs = [
                StructuredOutput::JsonSchema(schema()),
                StructuredOutput::Regex(REGEX.into()),
                StructuredOutput::Choice(choices.clone()),
                StructuredOutput::Grammar(GRAMMAR.into()),
            ];
            for spec in specs {
                let mut p = constrained(spec, seed);
                // Some requests sample several outputs from one prompt.
                p.n = if seed % 4 == 0 { 3 } else { 1 };
                let h = e.add_request(Prompt::Text("Your fortune:".into()), p.clone());
                handles.push((p, h.unwrap()));
            }
        }
        // Beam search through a schema, in the same batch.
        let beams = SamplingParams {
            n: 2,
            beam_width: Some(3),
            temperature: 0.0,
            max_tokens: 120,
            structured_output: Some(StructuredOutput::JsonSchema(schema())),
            ..SamplingParams::default()
        };
        let h = e.add_request(Prompt::Text("A fortune:".into()), beams.clone());
        handles.push((beams, h.unwrap()));
        e.run_to_completion().unwrap();
        let mut checked = 0;
        for (p, h) in handles {
            let out = h.wait().unwrap();
            assert_eq!(out.outputs.len(), p.n);
            for o in &out.outputs {
                let t = o.text.as_str();
                assert_eq!(o.finish_reason, FinishReason::Stop, "{t:?}");
                let ok = match p.structured_output.as_ref().unwrap() {
                    StructuredOutput::JsonSchema(_) => {
                        serde_json::from_str::<Value>(t).is_ok_and(|v| validator.is_valid(&v))
                    }
                    StructuredOutput::Regex(_) => regex.is_match(t),
                    StructuredOutput::Choice(c) => c.iter().any(|x| x == t),
                    StructuredOutput::Grammar(_) => sum(t.as_bytes()) == Some(&b""[..]),
                    StructuredOutput::JsonObject => unreachable!(),
                };
                assert!(ok, "{} output {t:?} is not valid", common::backend(ctx));
                checked += 1;
            }
        }
        assert_eq!(checked, 12 * 4 + 3 * 4 * 2 + 2);
        assert_eq!(e.stats().cache.device.used, 0);
    }
}

/// The greedy tokens of one schema-constrained request.
fn greedy_schema() -> SamplingParams {
    SamplingParams {
        max_tokens: 120,
        structured_output: Some(StructuredOutput::JsonSchema(schema())),
        ..SamplingParams::greedy()
    }
}

#[test]
fn constrained_greedy_tokens_are_the_same_alone_batched_and_preempted() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let prompt = || Prompt::Text("Today the stars say".into());
    let mut e = engine(ctx, EngineConfig::default());
    let h = e.add_request(prompt(), greedy_schema()).unwrap();
    e.run_to_completion().unwrap();
    let alone = h.wait().unwrap().outputs[0].token_ids.clone();
    assert!(serde_json::from_str::<Value>(&e.tokenizer().decode(&alone, true).unwrap()).is_ok());
    // Batched with sampled, unconstrained and other constrained requests, in a pool small
    // enough to preempt (each mode), and in a roomy one.
    let modes = [
        None,
        Some(PreemptionMode::Swap),
        Some(PreemptionMode::Recompute),
    ];
    for mode in modes {
        let cfg = match mode {
            None => EngineConfig::default(),
            Some(m) => EngineConfig {
                num_gpu_blocks: Some(40),
                num_cpu_blocks: Some(400),
                preemption_mode: Some(m),
                enable_prefix_caching: false,
                ..EngineConfig::default()
            },
        };
        let mut e = engine(ctx, cfg);
        let mut others = Vec::new();
        for i in 0..12u64 {
            let p = match i % 3 {
                0 => constrained(StructuredOutput::JsonSchema(schema()), i),
                1 => SamplingParams {
                    max_tokens: 150,
                    ignore_eos: true,
                    seed: Some(i),
                    ..SamplingParams::default()
                },
                _ => constrained(StructuredOutput::Regex(REGEX.into()), i),
            };
            let text = format!("Request {i} asks the stars about something long enough");
            others.push(e.add_request(Prompt::Text(text), p).unwrap());
        }
        let h = e.add_request(prompt(), greedy_schema()).unwrap();
        e.run_to_completion().unwrap();
        assert_eq!(h.wait().unwrap().outputs[0].token_ids, alone, "{mode:?}");
        let s = e.stats();
        if mode.is_some() {
            assert!(s.scheduler.preemptions > 0, "{mode:?}: {:?}", s.scheduler);
        }
        for o in others {
            o.wait().unwrap();
        }
        assert_eq!(s.cache.device.used, 0);
    }
}

#[test]
fn logprobs_are_reported_after_masking() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let mut e = engine(ctx, EngineConfig::default());
    let spec = StructuredOutput::Choice(vec!["sun".into(), "moon".into(), "stars".into()]);
    let prompt = e.tokenizer().encode("The sky holds the").unwrap();
    let p = SamplingParams {
        max_tokens: 8,
        logprobs: Some(3),
        structured_output: Some(spec.clone()),
        ..SamplingParams::greedy()
    };
    let h = e.add_request(Prompt::Tokens(prompt.clone()), p).unwrap();
    e.run_to_completion().unwrap();
    let out = h.wait().unwrap();
    let first = &out.outputs[0].logprobs[0];
    // The same step in plain Rust: reference logits, the constraint's mask, log_softmax of
    // what is left, its arg-max.
    let files = ModelFiles::open(Path::new(MODEL)).unwrap();
    let logits = ReferenceModel::new(&files)
        .unwrap()
        .forward(&prompt)
        .pop()
        .unwrap();
    let compiler = Compiler::new(e.tokenizer().clone(), logits.len()).unwrap();
    let mut c = compiler.compile(&spec).unwrap();
    let mut masked = logits.clone();
    c.apply(&mut masked).unwrap();
    let lp = log_softmax(&masked);
    let best = (0..lp.len())
        .max_by(|&a, &b| lp[a].total_cmp(&lp[b]))
        .unwrap();
    assert_eq!(first.token_id as usize, best);
    assert!(
        (first.logprob - lp[best]).abs() < 1e-3,
        "{} vs {}",
        first.logprob,
        lp[best]
    );
    // Only allowed tokens are alternatives, and their probabilities add up to at most 1.
    assert!(!first.top.is_empty());
    let mut total = 0.0;
    for &(t, l) in &first.top {
        assert!(masked[t as usize].is_finite(), "token {t} is masked");
        assert!((l - lp[t as usize]).abs() < 1e-3);
        total += l.exp();
    }
    assert!(total <= 1.0 + 1e-6);
    assert!(["sun", "moon", "stars"].contains(&out.outputs[0].text.as_str()));
}

#[test]
fn logit_bias_moves_greedy_tokens() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let mut e = engine(ctx, EngineConfig::default());
    let run = |e: &mut Engine, bias: Vec<(u32, f32)>| {
        let p = SamplingParams {
            max_tokens: 4,
            ignore_eos: true,
            logit_bias: bias,
            ..SamplingParams::greedy()
        };
        let h = e.add_request(Prompt::Text("Fortune:".into()), p).unwrap();
        e.run_to_completion().unwrap();
        h.wait().unwrap().outputs[0].token_ids.clone()
    };
    let plain = run(&mut e, vec![]);
    // -100 on the arg-max drops it below every other logit of this model (|logit| < 30).
    let banned = run(&mut e, vec![(plain[0], -100.0)]);
    assert_ne!(banned[0], plain[0]);
    assert!(!banned.contains(&plain[0]));
    // +100 on a token raises it above every other at every step.
    assert_eq!(run(&mut e, vec![(42, 100.0)]), vec![42; 4]);
}

#[test]
fn bad_constraints_fail_alone_and_cut_off_ones_finish_with_length() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let mut e = engine(ctx, EngineConfig::default());
    let good = e
        .add_request(Prompt::Text("Fortune:".into()), greedy_schema())
        .unwrap();
    for spec in [
        StructuredOutput::Regex("[unclosed".into()),
        StructuredOutput::JsonSchema(json!({"type": "string", "minLength": 5, "maxLength": 2})),
        StructuredOutput::Grammar("start: undefined_rule".into()),
    ] {
        let p = constrained(spec, 0);
        match e.add_request(Prompt::Text("x".into()), p) {
            Err(EngineError::Constraint(err)) => assert!(err.to_string().contains("invalid")),
            other => panic!("{other:?}"),
        }
    }
    let short = SamplingParams {
        max_tokens: 3,
        ..greedy_schema()
    };
    let cut = e
        .add_request(Prompt::Text("Fortune:".into()), short)
        .unwrap();
    e.run_to_completion().unwrap();
    let text = good.wait().unwrap().outputs[0].text.clone();
    assert!(jsonschema::validator_for(&schema())
        .unwrap()
        .is_valid(&serde_json::from_str(&text).unwrap()));
    let cut = cut.wait().unwrap();
    assert_eq!(cut.outputs[0].finish_reason, FinishReason::Length);
    assert_eq!(cut.outputs[0].token_ids.len(), 3);
    assert!(text.starts_with(&cut.outputs[0].text));
}

#[test]
fn a_stop_string_ends_a_constrained_output_before_the_constraint_does() {
    let Some(&ctx) = contexts().first() else {
        return;
    };
    let mut e = engine(ctx, EngineConfig::default());
    let choices: Vec<String> = ["heads up", "tails up", "edge up"].map(String::from).into();
    let handles: Vec<_> = (0..6u64)
        .map(|seed| {
            let mut p = constrained(StructuredOutput::Choice(choices.clone()), seed);
            p.n = 2;
            p.stop = vec![" up".into()];
            e.add_request(Prompt::Text("Toss:".into()), p).unwrap()
        })
        .collect();
    e.run_to_completion().unwrap();
    for h in handles {
        for o in &h.wait().unwrap().outputs {
            assert_eq!(o.finish_reason, FinishReason::Stop, "{o:?}");
            assert!(
                ["heads", "tails", "edge"].contains(&o.text.as_str()),
                "{o:?}"
            );
        }
    }
}
