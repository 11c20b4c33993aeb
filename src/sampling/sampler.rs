//! Choosing one token from one logits row, with its log-probability and top alternatives.
//!
//! Greedy (temperature below [`SAMPLING_EPS`](super::SAMPLING_EPS)) takes the arg-max of the
//! raw logits, the first index on ties like `torch.argmax`, and consumes no randomness.
//! Otherwise the token is drawn from [`filtered_distribution`] with exactly one uniform
//! number from the sequence's RNG per step, so a seeded sequence replays identically.

use super::filter::filtered_distribution;
use super::logprobs::{check_row, logsumexp, top_logprobs};
use super::penalties::apply_penalties;
use super::rng::{sequence_rng, SequenceRng};
use super::{SamplingError, SamplingParams};
use rand::Rng;

/// The chosen token and what the client may want to know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    pub token: u32,
    /// log_softmax of the raw logits at `token`.
    pub logprob: f64,
    /// The `params.logprobs` most likely tokens of the raw logits, most likely first (empty
    /// when not requested).
    pub top_logprobs: Vec<(u32, f64)>,
}

/// Index of the largest logit, the first one on ties.
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    check_row(logits)?;
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        // Strictly greater: an equal later value does not replace the first.
        if x > logits[best] {
            best = i;
        }
    }
    if logits[best] == f32::NEG_INFINITY {
        return Err(SamplingError::NoCandidates);
    }
    Ok(best as u32)
}

/// Samples one token from a raw logits row (`[vocab]`) under `params`.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut impl Rng,
) -> Result<SampleOutput, SamplingError> {
    let token = if params.is_greedy() {
        argmax(logits)?
    } else {
        filtered_distribution(
            logits,
            params.temperature,
            params.effective_top_k(),
            params.top_p,
            params.min_p,
        )?
        .sample(rng)
    };
    let logprob = f64::from(logits[token as usize]) - logsumexp(logits)?;
    let top_logprobs = match params.logprobs {
        Some(k) if k > 0 => top_logprobs(logits, k)?,
        _ => Vec::new(),
    };
    Ok(SampleOutput {
        token,
        logprob,
        top_logprobs,
    })
}

/// One sequence's sampler: its request's parameters and its own RNG
/// (see [`sequence_rng`] for the seeding scheme).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: SequenceRng,
}

impl Sampler {
    /// The sampler of sample `sample_index` (0..n) of a request.
    pub fn new(params: SamplingParams, sample_index: u64) -> Self {
        let rng = sequence_rng(params.seed, sample_index);
        Self { params, rng }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Samples the next token from this sequence's logits row.
    pub fn sample(&mut self, logits: &[f32]) -> Result<SampleOutput, SamplingError> {
        sample(logits, &self.params, &mut self.rng)
    }

    /// Samples the next token of a sequence with this prompt and output so far: the
    /// request's penalties first change the row (see [`apply_penalties`]); the reported
    /// logprobs stay those of the raw logits.
    pub fn sample_after(
        &mut self,
        logits: &[f32],
        prompt: &[u32],
        output: &[u32],
    ) -> Result<SampleOutput, SamplingError> {
        if !self.params.has_penalties() {
            return self.sample(logits);
        }
        check_row(logits)?;
        let mut penalized = logits.to_vec();
        apply_penalties(&mut penalized, &self.params, prompt, output);
        let mut out = sample(&penalized, &self.params, &mut self.rng)?;
        out.logprob = f64::from(logits[out.token as usize]) - logsumexp(logits)?;
        if let Some(k) = self.params.logprobs.filter(|&k| k > 0) {
            out.top_logprobs = top_logprobs(logits, k)?;
        }
        Ok(out)
    }
}
