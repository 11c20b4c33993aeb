//! Running requests through an engine and comparing their outputs field by field (the
//! engine tests that demand identical outputs under pressure, batching or speculation).

use super::arc;
use pagellm::internals::engine::{Engine, EngineConfig, Prompt, RequestHandle, RequestOutput};
use pagellm::internals::sampling::SamplingParams;
use std::path::Path;

pub fn engine(ctx: &pagellm::GpuContext, dir: &Path, cfg: EngineConfig) -> Engine {
    Engine::with_context(arc(ctx), dir, cfg, |_, _| {}).unwrap()
}

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// `len` token ids in `2..502` (clear of BOS and EOS), distinct per `salt`.
pub fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 2 + (i * 37 + salt * 11) % 500)
        .collect()
}

/// `n` seeded samples at temperature 0.9 and top-p 0.95, with logprobs, ignoring EOS.
pub fn sampled(n: usize, seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        n,
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens,
        logprobs: Some(2),
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// A beam search of `width` beams returning the best 2, ignoring EOS.
pub fn beams(width: usize, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        n: 2,
        beam_width: Some(width),
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

pub fn run(e: &mut Engine, work: &[(Vec<u32>, SamplingParams)]) -> Vec<RequestOutput> {
    let hs = add_all(e, work);
    e.run_to_completion().unwrap();
    wait_all(&hs)
}

/// Queues every request of `work`, in order.
pub fn add_all(e: &mut Engine, work: &[(Vec<u32>, SamplingParams)]) -> Vec<RequestHandle> {
    work.iter()
        .map(|(p, s)| e.add_request(Prompt::Tokens(p.clone()), s.clone()).unwrap())
        .collect()
}

/// The outputs of finished requests, in order.
pub fn wait_all(hs: &[RequestHandle]) -> Vec<RequestOutput> {
    hs.iter().map(|h| h.wait().unwrap()).collect()
}

/// Compares every field of every output, naming the first difference.
#[track_caller]
pub fn assert_same(what: &str, got: &[RequestOutput], want: &[RequestOutput]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.prompt_token_ids, w.prompt_token_ids,
            "{what}: request {i}"
        );
        assert_eq!(g.outputs.len(), w.outputs.len(), "{what}: request {i}");
        for (a, b) in g.outputs.iter().zip(&w.outputs) {
            assert_eq!(
                a.token_ids, b.token_ids,
                "{what}: request {i} sample {}",
                a.index
            );
            assert_eq!(a.text, b.text, "{what}: request {i} sample {}", a.index);
            assert_eq!(a.finish_reason, b.finish_reason, "{what}: request {i}");
            assert_eq!(a.logprobs, b.logprobs, "{what}: request {i} logprobs");
            assert_eq!(
                a.cumulative_logprob, b.cumulative_logprob,
                "{what}: request {i} sample {} cumulative_logprob",
                a.index
            );
        }
    }
}
