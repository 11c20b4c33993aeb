//! What the engine streams to a request's owner and returns when it finishes.

use serde::Serialize;

/// The engine's name of a request, unique among the requests it has taken.
pub type RequestId = u64;

/// Why a sample or beam ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the model's context length.
    Length,
    /// Aborted by the caller.
    Abort,
}

/// The chosen token's log-probability and the top alternatives (log_softmax of the raw
/// logits).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The token chosen.
    pub token_id: u32,
    /// Its log-probability.
    pub logprob: f64,
    /// The most likely tokens with theirs, most likely first (as many as the request's
    /// `logprobs` asks).
    pub top: Vec<(u32, f64)>,
}

/// One sample or beam of a finished request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionOutput {
    /// Sample index (0..n) or beam rank.
    pub index: usize,
    /// The generated text (without a stop string that ended it).
    pub text: String,
    /// The generated token ids (a stop token that ended it included).
    pub token_ids: Vec<u32>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Per generated token, when the request asked for `logprobs`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    /// The sum of the generated tokens' log-probabilities.
    pub cumulative_logprob: f64,
}

/// A finished request: its prompt's tokens and every sample's or beam's output.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestOutput {
    /// The request, as the engine named it.
    pub request_id: RequestId,
    /// The prompt as token ids.
    pub prompt_token_ids: Vec<u32>,
    /// One per sample (by index) or beam (best first).
    pub outputs: Vec<CompletionOutput>,
}

/// Events on a request's channel, in order: tokens as they are generated, then exactly one
/// `Finished` (or `Failed`).
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// A new token of sample `index`, with the text it completes (possibly empty while a
    /// multi-byte character or a possible stop string is incomplete). Beam search streams
    /// nothing until it finishes.
    Token {
        /// The sample it belongs to.
        index: usize,
        /// The token.
        token_id: u32,
        /// The text it completes.
        text: String,
        /// Its log-probability, when the request asked for `logprobs`.
        logprob: Option<TokenLogprob>,
    },
    /// The request ended: every output, whole.
    Finished(RequestOutput),
    /// The request could not complete: the reason.
    Failed(String),
}
