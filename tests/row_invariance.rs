//! A row's logits do not depend on how many rows its step computes: the greedy token and
//! its logprob after a prefix are the same, bit for bit, whether that row is a one-row
//! decode step or the last row of a prefill chunk of 4, 8 or the whole prompt. Speculative
//! decoding's verification (issue 26) relies on this: it computes the proposed tokens as
//! extra rows of one step and must keep greedy output identical to decoding one at a time.

mod common;
use common::{arc, contexts};
use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::sampling::SamplingParams;
use std::path::Path;

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        logprobs: Some(0),
        ..SamplingParams::greedy()
    }
}

#[test]
fn a_rows_logits_are_the_same_in_a_chunk_and_in_a_decode_step() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
    let prompt: Vec<u32> = vec![0, 300, 401, 77, 900, 12, 1500, 33];
    for ctx in contexts() {
        let config = |chunk| EngineConfig {
            enable_prefix_caching: false,
            max_num_batched_tokens: chunk,
            ..EngineConfig::default()
        };
        // One token per step after the prompt.
        let mut e = Engine::with_context(arc(ctx), &dir, config(512), |_, _| {}).unwrap();
        let h = e
            .add_request(Prompt::Tokens(prompt.clone()), params(24))
            .unwrap();
        e.run_to_completion().unwrap();
        let decoded = h.wait().unwrap().outputs.remove(0);
        for chunk in [4, 8, 512] {
            let mut e = Engine::with_context(arc(ctx), &dir, config(chunk), |_, _| {}).unwrap();
            for i in [1, 6, 13, 23] {
                // The same position as the last row of a prompt prefilled `chunk` at a time.
                let longer = [&prompt[..], &decoded.token_ids[..i]].concat();
                let h = e.add_request(Prompt::Tokens(longer), params(1)).unwrap();
                e.run_to_completion().unwrap();
                let one = h.wait().unwrap().outputs.remove(0);
                let what = format!("{}, chunk {chunk}, position {i}", ctx.describe());
                assert_eq!(one.token_ids[0], decoded.token_ids[i], "{what}");
                assert_eq!(
                    one.logprobs[0].logprob.to_bits(),
                    decoded.logprobs[i].logprob.to_bits(),
                    "{what}: {} vs {}",
                    one.logprobs[0].logprob,
                    decoded.logprobs[i].logprob
                );
            }
        }
    }
}
