//! Sequences and sequence groups: the engine's view of a request. A group is the unit of
//! admission, preemption and resumption; its sequences are the `n` samples or the live beams.

use super::output::{CompletionOutput, FinishReason, RequestEvent, RequestId, TokenLogprob};
use crate::cache::SeqId;
use crate::sampling::{BeamSearch, Sampler, SamplingParams};
use crate::tokenizer::{IncrementalDecoder, StopChecker, StopStream};
use std::sync::mpsc::Sender;

#[derive(Clone, Debug)]
pub struct Sequence {
    pub id: SeqId,
    /// Sample index within the request (parallel sampling).
    pub index: usize,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache.
    pub num_computed: usize,
    pub sampler: Sampler,
    pub decoder: IncrementalDecoder,
    pub stop: StopStream,
    pub logprobs: Vec<TokenLogprob>,
    pub cum_logprob: f64,
    pub finish: Option<FinishReason>,
}

impl Sequence {
    pub fn new(id: SeqId, index: usize, prompt: &[u32], params: &SamplingParams) -> Self {
        Sequence {
            id,
            index,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            num_computed: 0,
            sampler: Sampler::new(params.clone(), index as u64),
            decoder: IncrementalDecoder::with_prompt(prompt, true),
            stop: StopStream::new(StopChecker::new(params.stop.iter().cloned())),
            logprobs: Vec::new(),
            cum_logprob: 0.0,
            finish: None,
        }
    }

    pub fn output_ids(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    pub fn completion(&self) -> CompletionOutput {
        CompletionOutput {
            index: self.index,
            text: self.stop.text().to_string(),
            token_ids: self.output_ids().to_vec(),
            finish_reason: self.finish.unwrap_or(FinishReason::Abort),
            logprobs: self.logprobs.clone(),
            cumulative_logprob: self.cum_logprob,
        }
    }
}

/// Where a group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Waiting,
    Running,
    Swapped,
}

pub struct SequenceGroup {
    pub request_id: RequestId,
    /// Admission order; preemption picks the largest.
    pub arrival: u64,
    pub params: SamplingParams,
    pub prompt_ids: Vec<u32>,
    pub seqs: Vec<Sequence>,
    pub state: GroupState,
    /// Parallel samples are forked from the prompt's sequence once it is prefilled.
    pub forked: bool,
    pub beam: Option<BeamSearch>,
    pub events: Sender<RequestEvent>,
}

impl SequenceGroup {
    pub fn live(&self) -> impl Iterator<Item = &Sequence> {
        self.seqs.iter().filter(|s| !s.is_finished())
    }

    pub fn live_ids(&self) -> Vec<SeqId> {
        self.live().map(|s| s.id).collect()
    }

    pub fn is_finished(&self) -> bool {
        self.seqs.iter().all(Sequence::is_finished)
    }
}
