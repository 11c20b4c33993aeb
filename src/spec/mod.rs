//! Speculative decoding's plain-Rust parts (issue 26): proposing tokens and choosing how
//! many to propose.
//!
//! - [`ngram`]: prompt lookup. The last few tokens of a sequence are looked up among its
//!   earlier tokens (prompt and output); what followed the most recent match is proposed.
//!   No extra model, O(n) work per appended token.
//! - [`adapt`]: the number of tokens to propose, per request, from its running acceptance
//!   rate and the cost of an extra query row on this adapter (measured by a fit of step
//!   time against rows); 0 switches speculation off.
//!
//! Verification is the engine's (`engine/advance.rs`): each of a sequence's 1 + k rows is
//! sampled by the sequence's own sampler, exactly as plain decoding would sample it, and
//! proposals are kept while they equal what was sampled. So every output, greedy or seeded,
//! is plain decoding's token for token, whatever was proposed and however many. (Speculative
//! sampling's min(1, p/q) rule, Leviathan et al. 2023, keeps only the distribution: a seeded
//! request's tokens would then depend on how many proposals the adaptive `k`, which follows
//! measured step times, happened to make. A draft model's sampled proposals are instead
//! drawn with the uniform numbers the target's sampler will draw, `engine/draft.rs`.)
//!
//! Everything here is independent of the GPU and of the block manager; the engine gives
//! proposed tokens KV slots and takes back the rejected ones.

pub mod adapt;
pub mod ngram;

pub use adapt::{AcceptanceRate, AdaptiveK, StepCostFit};
pub use ngram::NgramIndex;

/// A speculation setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The n-gram sizes are not `1 <= min <= max`.
    #[error("n-gram sizes must satisfy 1 <= min ({min}) <= max ({max})")]
    NgramRange {
        /// The shortest n-gram asked for.
        min: usize,
        /// The longest.
        max: usize,
    },
}
