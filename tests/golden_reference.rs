//! The plain-Rust reference forward pass against Hugging Face transformers' own outputs for
//! the checkpoints in tests/fixtures: prompt logits at every position, 16 greedy tokens,
//! and the top-5 log-probabilities of each greedy step (tolerances in common/golden.rs).

mod common;
use common::golden;
use pagellm::internals::model::reference::{log_softmax, ReferenceModel};

#[test]
fn reference_forward_matches_transformers() {
    for f in golden::all() {
        let model = ReferenceModel::new(&f.files).unwrap();
        let (mut worst_logit, mut worst) = (0.0f32, 0.0f64);
        for case in &f.cases {
            let logits = model.forward(&case.prompt_ids);
            worst_logit = worst_logit.max(golden::check_logits(&f, case, &logits, "reference"));
            let mut seq = case.prompt_ids.clone();
            for (step, &want) in case.greedy_ids.iter().enumerate() {
                let last = model.forward(&seq).pop().unwrap();
                let d = golden::check_top5(&f, case, step, &log_softmax(&last), "reference");
                worst = worst.max(d);
                let got = pagellm::internals::reference::argmax(&last) as u32;
                assert_eq!(
                    got, want,
                    "{} {:?} step {step}: greedy token",
                    f.name, case.prompt
                );
                seq.push(got);
            }
        }
        eprintln!(
            "{} reference: largest logit deviation from transformers {worst_logit:.2e}, logprob deviation {worst:.2e}",
            f.name
        );
    }
}
