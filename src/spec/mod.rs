//! Speculative decoding's plain-Rust parts (issue 26): proposing tokens, deciding which of
//! them the target model accepts, and choosing how many to propose.
//!
//! - [`ngram`]: prompt lookup. The last few tokens of a sequence are looked up among its
//!   earlier tokens (prompt and output); what followed the most recent match is proposed.
//!   No extra model, O(n) work per appended token.
//! - [`accept`]: verification of k proposed tokens against the k + 1 rows the target model
//!   computed for them in one step. Greedy requests keep the longest prefix equal to the
//!   target's arg-max; sampled requests use speculative sampling (Leviathan et al., 2023;
//!   Chen et al., 2023): accept with probability min(1, p/q), resample a rejection from the
//!   residual max(0, p - q), so every emitted token has exactly the target's distribution.
//! - [`adapt`]: the number of tokens to propose, per request, from its running acceptance
//!   rate and the cost of an extra query row on this adapter (measured by a fit of step
//!   time against rows); 0 switches speculation off.
//!
//! Everything here is independent of the GPU and of the block manager; the engine gives
//! proposed tokens KV slots and takes back the rejected ones.

pub mod accept;
pub mod adapt;
pub mod ngram;

pub use accept::{accept_greedy, accept_sampled, Accepted, Proposal};
pub use adapt::{AcceptanceRate, AdaptiveK, StepCostFit};
pub use ngram::NgramIndex;

/// A speculation setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("n-gram sizes must satisfy 1 <= min ({min}) <= max ({max})")]
    NgramRange { min: usize, max: usize },
    #[error("verification needs one target row per proposed token plus one: {proposed} proposed, {rows} rows")]
    Rows { proposed: usize, rows: usize },
}
