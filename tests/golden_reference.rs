//! The plain-Rust reference forward pass against Hugging Face transformers' own outputs for
//! the four checkpoints in tests/fixtures: prompt logits at every position, 16 greedy tokens,
//! and the top-5 log-probabilities of each greedy step (tolerances in common/golden.rs).

mod common;
use common::golden;
use pagellm::model::reference::{log_softmax, ReferenceModel};

#[test]
fn reference_forward_matches_transformers() {
    for f in golden::all() {
        let model = ReferenceModel::new(&f.files).unwrap();
        for case in &f.cases {
            golden::check_logits(&f, case, &model.forward(&case.prompt_ids), "reference");
            let mut seq = case.prompt_ids.clone();
            for (step, &want) in case.greedy_ids.iter().enumerate() {
                let last = model.forward(&seq).pop().unwrap();
                golden::check_top5(&f, case, step, &log_softmax(&last), "reference");
                let got = pagellm::reference::argmax(&last) as u32;
                assert_eq!(
                    got, want,
                    "{} {:?} step {step}: greedy token",
                    f.name, case.prompt
                );
                seq.push(got);
            }
        }
    }
}
