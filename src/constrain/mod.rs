//! Constrained decoding: outputs that match a JSON schema, a regular expression, a choice of
//! strings or a context-free grammar, because every token the sampler may pick is one the
//! constraint allows.
//!
//! - [`StructuredOutput`]: the request's constraint, as the APIs spell it.
//! - [`Compiler`]: per model, compiles one into a [`Constraint`] with llguidance (the
//!   Earley-parser mask engine vLLM, llama.cpp and SGLang use).
//! - [`Constraint`]: per sequence, the matcher state and its next mask; the engine applies
//!   the mask to the logits row before sampling (so logprobs are those after masking),
//!   accepts the sampled token, and clones the state on a fork.
//! - [`token_env`]: the model's vocabulary as token bytes, for llguidance's token trie.
//!
//! Plain Rust: nothing here touches the GPU.

mod matcher;
mod spec;
mod vocab;

pub use matcher::{Compiler, Constraint};
pub use spec::StructuredOutput;
pub use vocab::{token_bytes, token_env};

/// What can go wrong with a constraint.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The request's schema, regex or grammar does not compile.
    #[error("the {kind} constraint is invalid: {message}")]
    Invalid { kind: &'static str, message: String },
    /// The tokenizer could not be turned into a token trie.
    #[error("constrained decoding is unavailable for this tokenizer: {0}")]
    Setup(String),
    /// The matcher failed while generating (a fault of the constraint, not of the request).
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}
