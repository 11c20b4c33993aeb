//! Sampling: turning one row of logits into the next token, or advancing a beam search.
//!
//! - [`SamplingParams`]: the per-request knobs (vLLM's names and defaults where they exist),
//!   checked by [`SamplingParams::validate`] before a request is admitted.
//! - [`sample`] / [`Sampler`]: greedy arg-max, or temperature → top-k → top-p → min-p
//!   ([`filtered_distribution`]) and a draw from the sequence's own seeded RNG ([`rng`]).
//! - [`apply_penalties`]: presence, frequency and repetition penalties on tokens already
//!   seen, applied to the row before the filters.
//! - [`log_softmax`], [`top_logprobs`]: log-probabilities of the raw logits, as returned to
//!   clients and as transformers reports them.
//! - [`beam`]: Hugging Face-style beam search on the CPU; the engine forks and frees KV blocks
//!   following the parent index of each new beam.
//!
//! Everything here is plain Rust over `&[f32]` rows; the GPU only supplies the logits.

pub mod beam;
mod error;
mod filter;
mod logprobs;
mod params;
mod penalties;
pub mod rng;
mod sampler;

pub use beam::{
    beam_score, beam_step, Beam, BeamChild, BeamSearch, BeamSearchConfig, BeamStep, FinishedBeam,
};
pub use error::SamplingError;
pub use filter::{filtered_distribution, Distribution};
pub use logprobs::{log_softmax, logsumexp, top_logprobs};
pub use params::{SamplingParams, MAX_LOGPROBS, SAMPLING_EPS};
pub use penalties::apply_penalties;
pub use rng::{sequence_rng, SequenceRng};
pub use sampler::{argmax, sample, SampleOutput, Sampler};
