//! [`SamplingParams`]: how one request turns logits into tokens, and when it stops.
//!
//! Names and defaults follow vLLM's `SamplingParams` (and the OpenAI API it mirrors), except
//! that "off" is `None`/`0` rather than vLLM's `-1` for `top_k`. [`SamplingParams::validate`]
//! rejects impossible combinations up front, so the sampler and beam search never have to
//! guess what a request meant.

use super::SamplingError;
use crate::constrain::StructuredOutput;
use serde::{Deserialize, Serialize};

/// At most this many top alternatives per token (the OpenAI API's `top_logprobs` limit, and
/// vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;

/// Temperatures below this are greedy, as in vLLM: dividing logits by a tiny temperature
/// overflows and would pick the arg-max anyway.
pub const SAMPLING_EPS: f32 = 1e-5;

/// Per-request sampling and stopping settings. Deserialises from JSON with every field
/// optional (missing fields take the defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Number of output sequences (parallel samples, or the best `n` beams).
    pub n: usize,
    /// Softmax temperature; 0 means greedy arg-max.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; `None` or `Some(0)` turns it off.
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the most likely tokens whose probabilities add up to `top_p`.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the most likely one's.
    pub min_p: f32,
    /// Seed of the per-sequence RNG; `None` draws one from the operating system.
    pub seed: Option<u64>,
    /// Most tokens to generate per sequence.
    pub max_tokens: usize,
    /// Stop strings; the output ends before the first one that appears.
    pub stop: Vec<String>,
    /// Token ids that end a sequence (in addition to EOS); the token is kept in the output ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating after EOS.
    pub ignore_eos: bool,
    /// Return this many top alternatives with each token (`Some(0)`: only the chosen one's).
    pub logprobs: Option<usize>,
    /// Beam search with this many beams instead of sampling.
    pub beam_width: Option<usize>,
    /// Beam search score exponent: `cum_logprob / length^length_penalty`.
    pub length_penalty: f32,
    /// Subtracted once from the logit of every token already in the output (OpenAI's
    /// `presence_penalty`, in [-2, 2]).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence in the output (OpenAI's
    /// `frequency_penalty`, in [-2, 2]).
    pub frequency_penalty: f32,
    /// Divides positive and multiplies negative logits of tokens in the prompt or output
    /// (vLLM's and transformers' `repetition_penalty`, > 0; 1 is off).
    pub repetition_penalty: f32,
    /// Added to the logits of these token ids before sampling (OpenAI's `logit_bias`, each
    /// in [-100, 100]; -100 in effect bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// The output must match this JSON schema, regex, choice or grammar (constrained
    /// decoding: tokens the constraint does not allow are masked before sampling).
    pub structured_output: Option<StructuredOutput>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            beam_width: None,
            length_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            structured_output: None,
        }
    }
}

fn invalid(param: &'static str, value: impl ToString, allowed: impl Into<String>) -> SamplingError {
    SamplingError::Invalid {
        param,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// `lo <= x <= hi`, false for NaN.
fn in_range(x: f32, lo: f32, hi: f32) -> bool {
    (lo..=hi).contains(&x)
}

impl SamplingParams {
    /// Defaults with temperature 0: deterministic arg-max decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether tokens are chosen by arg-max (temperature below [`SAMPLING_EPS`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS
    }

    /// Whether this request runs beam search.
    pub fn is_beam_search(&self) -> bool {
        self.beam_width.is_some()
    }

    /// Whether any penalty changes the logits (then sampling needs the logits row, even
    /// for greedy decoding).
    pub fn has_penalties(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether the logits row is changed before sampling besides penalties: a logit bias
    /// or a constraint's mask (then sampling needs the row, even for greedy decoding).
    pub fn shapes_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.structured_output.is_some()
    }

    /// The top-k cut-off in effect, if any.
    pub fn effective_top_k(&self) -> Option<usize> {
        self.top_k.filter(|&k| k > 0)
    }

    /// Whether generating `token` ends the sequence: one of `stop_token_ids`, or an EOS id
    /// unless `ignore_eos`.
    pub fn stops_on_token(&self, token: u32, eos_token_ids: &[u32]) -> bool {
        self.stop_token_ids.contains(&token) || (!self.ignore_eos && eos_token_ids.contains(&token))
    }

    /// Checks every parameter against its range and the model's vocabulary size; the error
    /// names the first offending parameter, its value and what is allowed.
    pub fn validate(&self, vocab_size: usize) -> Result<(), SamplingError> {
        self.validate_filters(vocab_size)?;
        self.validate_outputs(vocab_size)?;
        self.validate_penalties()?;
        self.validate_stops(vocab_size)?;
        self.validate_logit_bias(vocab_size)?;
        if let Some(width) = self.beam_width {
            self.validate_beam(width)?;
        }
        Ok(())
    }

    /// `n`, temperature and the filters.
    fn validate_filters(&self, vocab_size: usize) -> Result<(), SamplingError> {
        if self.n == 0 {
            return Err(invalid("n", self.n, "must be at least 1"));
        }
        // `is_finite` also rejects NaN.
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(invalid(
                "temperature",
                self.temperature,
                "must be a finite number >= 0 (0 means greedy)",
            ));
        }
        if !in_range(self.top_p, 0.0, 1.0) || self.top_p == 0.0 {
            return Err(invalid("top_p", self.top_p, "must be in (0, 1]"));
        }
        if let Some(k) = self.top_k {
            if k > vocab_size {
                return Err(invalid(
                    "top_k",
                    k,
                    format!(
                        "must not exceed the vocabulary size {vocab_size} (0 or unset turns top-k off)"
                    ),
                ));
            }
        }
        if !in_range(self.min_p, 0.0, 1.0) {
            return Err(invalid("min_p", self.min_p, "must be in [0, 1]"));
        }
        Ok(())
    }

    /// How much each sample returns: tokens and logprobs.
    fn validate_outputs(&self, vocab_size: usize) -> Result<(), SamplingError> {
        if self.max_tokens == 0 {
            return Err(invalid("max_tokens", self.max_tokens, "must be at least 1"));
        }
        if let Some(k) = self.logprobs {
            let limit = MAX_LOGPROBS.min(vocab_size);
            if k > limit {
                return Err(invalid(
                    "logprobs",
                    k,
                    format!(
                        "must be at most {limit} (the smaller of {MAX_LOGPROBS} and the vocabulary size {vocab_size})"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_penalties(&self) -> Result<(), SamplingError> {
        if !self.length_penalty.is_finite() {
            return Err(invalid(
                "length_penalty",
                self.length_penalty,
                "must be a finite number",
            ));
        }
        for (param, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !in_range(value, -2.0, 2.0) {
                return Err(invalid(param, value, "must be in [-2, 2]"));
            }
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return Err(invalid(
                "repetition_penalty",
                self.repetition_penalty,
                "must be a finite number > 0 (1 is off)",
            ));
        }
        Ok(())
    }

    fn validate_stops(&self, vocab_size: usize) -> Result<(), SamplingError> {
        if let Some(i) = self.stop.iter().position(String::is_empty) {
            return Err(invalid(
                "stop",
                format!("{:?} (entry {i})", self.stop[i]),
                "stop strings must not be empty",
            ));
        }
        if let Some(&id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(invalid(
                "stop_token_ids",
                format!("[.., {id}, ..]"),
                format!("token ids must be below the vocabulary size {vocab_size}"),
            ));
        }
        Ok(())
    }

    fn validate_logit_bias(&self, vocab_size: usize) -> Result<(), SamplingError> {
        for &(id, bias) in &self.logit_bias {
            if id as usize >= vocab_size {
                return Err(invalid(
                    "logit_bias",
                    format!("{{{id}: {bias}}}"),
                    format!("token ids must be below the vocabulary size {vocab_size}"),
                ));
            }
            if !in_range(bias, -100.0, 100.0) {
                return Err(invalid(
                    "logit_bias",
                    format!("{{{id}: {bias}}}"),
                    "biases must be in [-100, 100]",
                ));
            }
        }
        Ok(())
    }

    fn validate_beam(&self, beam_width: usize) -> Result<(), SamplingError> {
        if beam_width == 0 {
            return Err(invalid("beam_width", beam_width, "must be at least 1"));
        }
        let conflict = |param, value: String, allowed: &str| SamplingError::BeamSearchConflict {
            beam_width,
            param,
            value,
            allowed: allowed.to_string(),
        };
        if self.n > beam_width {
            return Err(conflict(
                "n",
                self.n.to_string(),
                "beam search returns at most beam_width sequences, so n must be <= beam_width",
            ));
        }
        const DETERMINISTIC: &str = "beam search is deterministic; use temperature = 0, top_k \
                                     unset, top_p = 1 and min_p = 0 with it";
        if self.temperature != 0.0 {
            return Err(conflict(
                "temperature",
                self.temperature.to_string(),
                DETERMINISTIC,
            ));
        }
        if let Some(k) = self.effective_top_k() {
            return Err(conflict("top_k", k.to_string(), DETERMINISTIC));
        }
        if self.top_p != 1.0 {
            return Err(conflict("top_p", self.top_p.to_string(), DETERMINISTIC));
        }
        if self.min_p != 0.0 {
            return Err(conflict("min_p", self.min_p.to_string(), DETERMINISTIC));
        }
        if self.has_penalties() {
            return Err(conflict(
                "presence_penalty/frequency_penalty/repetition_penalty",
                format!(
                    "{}/{}/{}",
                    self.presence_penalty, self.frequency_penalty, self.repetition_penalty
                ),
                "penalties are not supported with beam search; leave them at 0/0/1",
            ));
        }
        Ok(())
    }
}
