//! A request as the engine holds it: the scheduler's [`SequenceGroup`] carrying, per
//! sequence, what turns logits into text (sampler, constraint, incremental detokenizer, stop
//! strings, logprobs) and, per request, its parameters, its beam search and its event channel; and
//! the caller's side of that channel.
//!
//! Events travel over a `flume` channel: the engine can see that the caller dropped its
//! receiver (and abort the request), and the receiver works both blocking (`recv`) and in
//! async code (`recv_async`), for the HTTP server.

use super::output::{CompletionOutput, FinishReason, RequestEvent, RequestId, RequestOutput};
use super::sequence::{Sequence, SequenceGroup};
use super::EngineError;
use crate::constrain::Constraint;
use crate::sampling::{BeamSearch, Sampler, SamplingParams};
use crate::spec::{AdaptiveK, NgramIndex};
use crate::tokenizer::{IncrementalDecoder, StopChecker, StopStream};

/// A prompt as text (tokenized by the model's tokenizer) or as token ids.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Text, tokenized with the model's tokenizer (special tokens added as its
    /// configuration says).
    Text(String),
    /// Token ids, taken as they are.
    Tokens(Vec<u32>),
}

/// What the engine keeps per sequence beyond the scheduler's view.
#[derive(Clone, Debug)]
pub(crate) struct SeqOutput {
    pub sampler: Sampler,
    pub decoder: IncrementalDecoder,
    pub stop: StopStream,
    pub logprobs: Vec<super::output::TokenLogprob>,
    pub cum_logprob: f64,
    /// The request's constraint, as far as this sequence's output has advanced it.
    pub constraint: Option<Constraint>,
    /// Prompt lookup for speculative decoding, where the engine speculates.
    pub spec: Option<SpecState>,
}

/// A sequence's speculative decoding: the n-gram index of its tokens so far and its own
/// number of proposals, adapted to how many it has had accepted.
#[derive(Clone, Debug)]
pub(crate) struct SpecState {
    pub index: NgramIndex,
    pub k: AdaptiveK,
}

impl SpecState {
    /// Proposals to verify after `tokens` (the sequence's tokens; those not yet indexed
    /// are indexed first), at most the adapted `k`; empty when speculation does not pay or
    /// nothing matches.
    pub fn propose(&mut self, tokens: &[u32]) -> Vec<u32> {
        let seen = self.index.tokens().len();
        if seen > tokens.len() {
            return Vec::new();
        }
        self.index.extend(&tokens[seen..]);
        match self.k.next_k() {
            0 => Vec::new(),
            k => self.index.propose(k),
        }
    }
}

impl SeqOutput {
    pub fn new(
        prompt: &[u32],
        params: &SamplingParams,
        index: usize,
        constraint: Option<Constraint>,
    ) -> Self {
        SeqOutput {
            sampler: Sampler::new(params.clone(), index as u64),
            decoder: IncrementalDecoder::with_prompt(prompt, true),
            stop: StopStream::new(StopChecker::new(params.stop.iter().cloned())),
            logprobs: Vec::new(),
            cum_logprob: 0.0,
            constraint,
            spec: None,
        }
    }
}

/// What the engine keeps per request beyond the scheduler's view.
pub(crate) struct RequestSide {
    pub params: SamplingParams,
    pub prompt_ids: Vec<u32>,
    pub beam: Option<BeamSearch>,
    pub events: flume::Sender<RequestEvent>,
}

pub(crate) type Group = SequenceGroup<SeqOutput, RequestSide>;

impl Group {
    /// The request's sampling parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.data.params
    }

    /// Sends an event; false when the caller has dropped its receiver.
    pub fn send(&self, event: RequestEvent) -> bool {
        self.data.events.send(event).is_ok()
    }

    /// Whether the caller has dropped its receiver.
    pub fn abandoned(&self) -> bool {
        self.data.events.is_disconnected()
    }

    /// The request's output with `outputs`.
    pub fn output(&self, request_id: RequestId, outputs: Vec<CompletionOutput>) -> RequestOutput {
        RequestOutput {
            request_id,
            prompt_token_ids: self.data.prompt_ids.clone(),
            outputs,
        }
    }
}

/// A sample's output so far (its final output once it has finished).
pub(crate) fn completion(s: &Sequence<SeqOutput>) -> CompletionOutput {
    CompletionOutput {
        index: s.index,
        text: s.data.stop.text().to_string(),
        token_ids: s.output_ids().to_vec(),
        finish_reason: s.finish.unwrap_or(FinishReason::Abort),
        logprobs: s.data.logprobs.clone(),
        cumulative_logprob: s.data.cum_logprob,
    }
}

/// The caller's side of a request: its id and the channel its events arrive on. Dropping
/// the receiver aborts the request at the engine's next step.
#[derive(Debug)]
pub struct RequestHandle {
    /// The request's id, for [`super::Engine::abort`].
    pub id: RequestId,
    /// Its events, in order (see [`RequestEvent`]).
    pub events: flume::Receiver<RequestEvent>,
}

impl RequestHandle {
    /// Waits for the final output, skipping streamed tokens. Only meaningful when another
    /// thread drives the engine, or after the engine has run the request to completion.
    pub fn wait(&self) -> Result<RequestOutput, EngineError> {
        loop {
            match self.events.recv() {
                Ok(RequestEvent::Finished(out)) => return Ok(out),
                Ok(RequestEvent::Failed(msg)) => return Err(EngineError::RequestFailed(msg)),
                Ok(RequestEvent::Token { .. }) => continue,
                Err(_) => {
                    return Err(EngineError::RequestFailed(
                        "the engine dropped the request".into(),
                    ))
                }
            }
        }
    }
}
