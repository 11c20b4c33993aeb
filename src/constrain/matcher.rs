//! Compiling a [`StructuredOutput`] once per request ([`Compiler`]) and advancing it token
//! by token per sequence ([`Constraint`]).
//!
//! A constraint keeps the mask of its next token between steps: the engine computes it
//! while the GPU runs the step that produces the logits it applies to, and a fork (parallel
//! samples, a new beam) clones the state with its mask, so each sequence's mask is computed
//! once. Masks come from llguidance's Earley parser over the token trie (Moskal et al.,
//! "LLGuidance", 2025); how long each took is recorded for the benchmarks.

use super::{token_env, ConstraintError, StructuredOutput};
use crate::tokenizer::Tokenizer;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use std::time::Duration;
use toktrie::SimpleVob;
use web_time::Instant;

/// Compiles constraints for one model: its vocabulary's token trie and llguidance's shared
/// lexer slices, built once (tens of milliseconds for a 150k vocabulary).
pub struct Compiler {
    factory: ParserFactory,
}

impl std::fmt::Debug for Compiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiler").finish_non_exhaustive()
    }
}

impl Compiler {
    /// The compiler of a model whose logits rows have `vocab_size` entries.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> Result<Self, ConstraintError> {
        let env = token_env(tokenizer, vocab_size);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Setup(e.to_string()))?;
        // Errors come back to the request; nothing goes to the server's stderr.
        factory.quiet();
        Ok(Compiler { factory })
    }

    /// Compiles `spec` into the constraint of a fresh sequence; an error names what is wrong
    /// with the schema, regex or grammar.
    pub fn compile(&self, spec: &StructuredOutput) -> Result<Constraint, ConstraintError> {
        let invalid = |message: String| ConstraintError::Invalid {
            kind: spec.kind(),
            message,
        };
        let grammar = spec.grammar().map_err(invalid)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(e));
        }
        Ok(Constraint {
            matcher,
            mask: None,
            mask_time: Duration::ZERO,
            masks: 0,
        })
    }
}

/// One sequence's progress through its constraint.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// The tokens allowed next, once computed; cleared when a token is accepted.
    mask: Option<SimpleVob>,
    mask_time: Duration,
    masks: u64,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("finished", &self.is_finished())
            .field("mask_ready", &self.mask.is_some())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// Computes the next token's mask unless it is ready (the output is complete: only
    /// the end-of-sequence ids).
    pub fn prepare(&mut self) -> Result<(), ConstraintError> {
        if self.mask.is_none() {
            let start = Instant::now();
            let mask = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| ConstraintError::Matcher(e.to_string()))?;
            self.mask_time += start.elapsed();
            self.masks += 1;
            if mask.is_zero() {
                return Err(ConstraintError::Matcher(
                    "no token can continue the output (the model's vocabulary cannot spell \
                     what the constraint requires next)"
                        .into(),
                ));
            }
            self.mask = Some(mask);
        }
        Ok(())
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        self.prepare()?;
        Ok(self.mask.as_ref().is_some_and(|m| m.is_allowed(token)))
    }

    /// Sets the logit of every token the constraint does not allow next to -inf
    /// (`row`: `[vocab]`).
    pub fn apply(&mut self, row: &mut [f32]) -> Result<(), ConstraintError> {
        self.prepare()?;
        if let Some(mask) = &self.mask {
            // Word by word: a word of all-allowed or all-disallowed tokens is one test, and
            // a mixed one a branch-free select per token, which is several times faster on
            // large vocabularies than testing each token (`cargo bench --bench structured`).
            // Bits past the mask's length are clear, so ids it does not cover are masked.
            let words = mask.as_slice();
            for (&w, chunk) in words.iter().zip(row.chunks_mut(32)) {
                match w {
                    u32::MAX => {}
                    0 => chunk.fill(f32::NEG_INFINITY),
                    w => {
                        for (b, x) in chunk.iter_mut().enumerate() {
                            *x = if (w >> b) & 1 == 1 {
                                *x
                            } else {
                                f32::NEG_INFINITY
                            };
                        }
                    }
                }
            }
            let covered = (words.len() * 32).min(row.len());
            row[covered..].fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Advances past `token`, which the mask allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Matcher(e.to_string()))
    }

    /// The output is complete and nothing may follow it.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Total time spent computing masks, and how many were computed.
    pub fn mask_time(&self) -> (Duration, u64) {
        (self.mask_time, self.masks)
    }
}
