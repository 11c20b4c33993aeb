//! Requests on their way in: checked against the model and the engine's limits, tokenized,
//! and their constraint compiled. None of this needs the engine itself, only the model's
//! tokenizer and limits, so [`Intake`] is shared between the engine and its handle: the
//! caller's thread does the work (a long prompt's tokenization, a JSON schema's
//! compilation) while the engine thread goes on stepping the requests it already has.

use super::error::{EngineError, Result};
use super::request::Prompt;
use super::sequence::GroupShape;
use crate::cache::ExtraKeys;
use crate::constrain::{Compiler, Constraint};
use crate::sampling::{BeamSearch, BeamSearchConfig, SamplingParams};
use crate::tokenizer::Tokenizer;
use std::sync::{Arc, Mutex};

/// What an application asks of the engine: a prompt, how to sample its continuation, and
/// what besides its tokens keeps its cached KV blocks apart from other requests'.
///
/// ```
/// use pagellm::{Request, SamplingParams};
///
/// let request = Request::text("A wise man once said")
///     .with_params(SamplingParams { max_tokens: 24, temperature: 0.0, ..Default::default() })
///     .with_cache_salt("user-42");
/// assert_eq!(request.cache_salt.as_deref(), Some("user-42"));
/// ```
#[derive(Clone, Debug)]
pub struct Request {
    /// The text or token ids to continue.
    pub prompt: Prompt,
    /// How to sample, how long, when to stop; what to report (logprobs).
    pub params: SamplingParams,
    /// Requests share cached prompt blocks only with requests of the same salt (vLLM's
    /// `cache_salt`): give each user or tenant its own, and no one can tell from response
    /// times whether another's prompt is cached. `None` shares with every unsalted request.
    pub cache_salt: Option<String>,
}

impl Request {
    /// A request to continue `prompt`, tokenized with the model's tokenizer (special tokens
    /// such as BOS added as the model's tokenizer configuration says), with default sampling
    /// parameters.
    pub fn text(prompt: impl Into<String>) -> Self {
        Self::new(Prompt::Text(prompt.into()))
    }

    /// A request to continue the token ids `ids`, taken as they are.
    pub fn tokens(ids: Vec<u32>) -> Self {
        Self::new(Prompt::Tokens(ids))
    }

    /// A request to continue `prompt`, with default sampling parameters.
    pub fn new(prompt: Prompt) -> Self {
        Request {
            prompt,
            params: SamplingParams::default(),
            cache_salt: None,
        }
    }

    /// The request with sampling parameters `params`.
    pub fn with_params(mut self, params: SamplingParams) -> Self {
        self.params = params;
        self
    }

    /// The request with cache salt `salt` (see [`Request::cache_salt`]).
    pub fn with_cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.cache_salt = Some(salt.into());
        self
    }
}

/// A request checked and made ready for the scheduler.
pub(crate) struct Prepared {
    pub ids: Vec<u32>,
    pub params: SamplingParams,
    pub beam: Option<BeamSearch>,
    pub shape: GroupShape,
    pub constraint: Option<Constraint>,
    pub keys: ExtraKeys,
}

/// The model's tokenizer and the engine's limits, and the constraint compiler (built at
/// the first constrained request): everything a request is checked and prepared with.
pub struct Intake {
    tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    max_model_len: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    compiler: Mutex<Option<Arc<Compiler>>>,
}

impl std::fmt::Debug for Intake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intake")
            .field("vocab_size", &self.vocab_size)
            .field("max_model_len", &self.max_model_len)
            .finish_non_exhaustive()
    }
}

impl Intake {
    pub(crate) fn new(
        tokenizer: Arc<Tokenizer>,
        vocab_size: usize,
        max_model_len: usize,
        config: &super::EngineConfig,
    ) -> Self {
        Intake {
            tokenizer,
            vocab_size,
            max_model_len,
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            compiler: Mutex::new(None),
        }
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The context length requests are checked against.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The model's vocabulary size: token ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Checks `request` and prepares it for the scheduler: parameters valid for the
    /// vocabulary, a prompt that fits the context, a group no wider than the limits, a
    /// constraint that compiles, a salt that is not empty.
    pub(crate) fn prepare(&self, request: Request) -> Result<Prepared> {
        let Request {
            prompt,
            params,
            cache_salt,
        } = request;
        let keys = match cache_salt.as_deref() {
            None => ExtraKeys::NONE,
            Some("") => {
                return Err(EngineError::InvalidRequest(
                    "cache_salt is empty; give a non-empty salt or none".into(),
                ))
            }
            Some(salt) => ExtraKeys::with_salt(salt),
        };
        let ids = self.prompt_ids(prompt, &params)?;
        let beam = BeamSearchConfig::from_params(&params, self.tokenizer.eos_token_ids())
            .map(BeamSearch::new);
        let shape = match &beam {
            Some(b) => GroupShape::Beams(b.config().beam_width.max(params.n)),
            None => GroupShape::Samples(params.n),
        };
        self.check_width(shape.width())?;
        let constraint = self.compile(&params)?;
        Ok(Prepared {
            ids,
            params,
            beam,
            shape,
            constraint,
            keys,
        })
    }

    /// A request's prompt as token ids, checked: parameters valid for the vocabulary, ids
    /// inside it, not empty, and room for the prompt and `max_tokens` in the context.
    fn prompt_ids(&self, prompt: Prompt, params: &SamplingParams) -> Result<Vec<u32>> {
        let vocab = self.vocab_size;
        params.validate(vocab)?;
        let ids = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(&t)?,
            Prompt::Tokens(ids) => ids,
        };
        if ids.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if ids.len().saturating_add(params.max_tokens) > self.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {} tokens and max_tokens is {}, together more than the context \
                 of {} tokens; shorten the prompt, lower max_tokens, or raise --max-model-len \
                 (up to the model's own context)",
                ids.len(),
                params.max_tokens,
                self.max_model_len
            )));
        }
        Ok(ids)
    }

    /// A request of `width` sequences must fit the running sequences and a step's budget.
    fn check_width(&self, width: usize) -> Result<()> {
        if width > self.max_num_seqs {
            return Err(EngineError::InvalidRequest(format!(
                "{width} sequences in one request exceed max_num_seqs {}; raise --max-num-seqs",
                self.max_num_seqs
            )));
        }
        if width > self.max_num_batched_tokens {
            return Err(EngineError::InvalidRequest(format!(
                "{width} sequences in one request exceed the step budget of {} tokens; raise \
                 --max-batched-tokens",
                self.max_num_batched_tokens
            )));
        }
        Ok(())
    }

    /// The constraint of a request's first sequence, compiled from its structured output.
    fn compile(&self, params: &SamplingParams) -> Result<Option<Constraint>> {
        let Some(spec) = &params.structured_output else {
            return Ok(None);
        };
        let compiler = {
            let mut slot = self
                .compiler
                .lock()
                .map_err(|_| EngineError::Internal("the constraint compiler panicked".into()))?;
            match slot.as_ref() {
                Some(c) => c.clone(),
                None => slot
                    .insert(Arc::new(Compiler::new(
                        self.tokenizer.clone(),
                        self.vocab_size,
                    )?))
                    .clone(),
            }
        };
        Ok(Some(compiler.compile(spec)?))
    }
}
