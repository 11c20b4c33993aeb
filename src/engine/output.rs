//! What the engine streams to a request's owner and returns when it finishes.

use serde::Serialize;

pub type RequestId = u64;

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
    pub token_id: u32,
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// One sample or beam of a finished request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CompletionOutput {
    /// Sample index (0..n) or beam rank.
    pub index: usize,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    pub cumulative_logprob: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestOutput {
    pub request_id: RequestId,
    pub prompt_token_ids: Vec<u32>,
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
        index: usize,
        token_id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Finished(RequestOutput),
    Failed(String),
}
