//! Sequences and sequence groups: the scheduler's view of a request. A group is the unit of
//! admission, preemption and resumption; its sequences are the `n` samples or the live beams.
//!
//! What the scheduler needs (token ids, group shape, arrival) is plain data here; how many
//! of a sequence's tokens are computed is the block manager's count (a sequence without a
//! block table has none computed), read through [`Sequence::num_computed`]; where a group is (waiting, running, swapped) is the queue of the [`super::scheduler`]
//! that holds it, and nothing else; what only the engine needs (sampler, detokenizer, stop strings, logprobs, the
//! event channel) rides along as the type parameters `D` (per sequence) and `R` (per
//! request), so the scheduler and the block manager run, and are tested, without a GPU, a
//! tokenizer or a channel (`()` for both).

use super::output::{FinishReason, RequestId};
use crate::cache::{BlockManager, ExtraKeys, SeqId};

#[derive(Clone, Debug)]
pub struct Sequence<D = ()> {
    pub id: SeqId,
    /// Sample index within the request (parallel sampling), or beam rank.
    pub index: usize,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub finish: Option<FinishReason>,
    /// Tokens a proposer suggests after `tokens` (speculative decoding), not yet verified:
    /// [`super::scheduler::Scheduler::schedule`] cuts them to what it can give slots and
    /// budget (none for a sequence that does not decode this step), the step computes them
    /// after the sequence's newest token, and [`super::scheduler::Scheduler::commit`] moves
    /// the accepted ones into `tokens` and drops the rest. They are never hashed into the
    /// prefix cache and never outlive the step.
    pub proposed: Vec<u32>,
    pub data: D,
}

impl<D> Sequence<D> {
    pub fn new(id: SeqId, index: usize, prompt: &[u32], data: D) -> Self {
        Sequence {
            id,
            index,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            finish: None,
            proposed: Vec::new(),
            data,
        }
    }

    pub fn output_ids(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn is_finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Leading tokens whose K/V are in the cache: the block manager's count, 0 while the
    /// sequence has no block table (waiting, or preempted for recomputation).
    pub fn num_computed(&self, blocks: &BlockManager) -> usize {
        blocks.num_computed_tokens(self.id).unwrap_or(0)
    }

    /// Tokens not yet computed (1 for a sequence about to decode).
    pub fn pending(&self, blocks: &BlockManager) -> usize {
        self.tokens.len() - self.num_computed(blocks)
    }
}

/// How a request's sequences multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupShape {
    /// `n` independent samples, forked from the prompt's sequence once it is prefilled.
    Samples(usize),
    /// Beam search of this width: up to `width` live beams, reshuffled every step.
    Beams(usize),
}

impl GroupShape {
    /// Most sequences the group ever has alive at once.
    pub fn width(self) -> usize {
        match self {
            GroupShape::Samples(n) | GroupShape::Beams(n) => n.max(1),
        }
    }
}

pub struct SequenceGroup<D = (), R = ()> {
    pub request_id: RequestId,
    /// Admission order; preemption picks the largest.
    pub arrival: u64,
    pub shape: GroupShape,
    /// Most tokens (prompt included) any of its sequences can reach.
    pub max_len: usize,
    pub seqs: Vec<Sequence<D>>,
    /// Parallel samples are forked from the prompt's sequence once it is prefilled.
    pub forked: bool,
    /// What besides its tokens names the request's KV blocks (its cache salt): it hits
    /// only blocks cached under the same keys.
    pub keys: ExtraKeys,
    pub data: R,
}

impl<D, R> SequenceGroup<D, R> {
    pub fn new(
        request_id: RequestId,
        shape: GroupShape,
        max_len: usize,
        first: Sequence<D>,
        data: R,
    ) -> Self {
        SequenceGroup {
            request_id,
            arrival: request_id,
            shape,
            max_len,
            seqs: vec![first],
            forked: false,
            keys: ExtraKeys::NONE,
            data,
        }
    }

    /// The group with extra keys `keys` (see [`ExtraKeys`]).
    pub fn with_keys(mut self, keys: ExtraKeys) -> Self {
        self.keys = keys;
        self
    }

    pub fn live(&self) -> impl Iterator<Item = &Sequence<D>> {
        self.seqs.iter().filter(|s| !s.is_finished())
    }

    pub fn live_ids(&self) -> Vec<SeqId> {
        self.live().map(|s| s.id).collect()
    }

    pub fn is_finished(&self) -> bool {
        self.seqs.iter().all(Sequence::is_finished)
    }

    /// Sequence slots the group holds against `max_num_seqs` (and rows of the step's
    /// workspace): its full width until its samples are forked, and for beams always (a
    /// beam group may grow back to its width any step); afterwards its live sequences.
    pub fn slots(&self) -> usize {
        match self.shape {
            GroupShape::Beams(w) => w.max(1),
            GroupShape::Samples(n) if !self.forked => n.max(1),
            GroupShape::Samples(_) => self.live().count(),
        }
    }

    /// Every live sequence has exactly its newest token to compute: the group decodes.
    pub fn is_decoding(&self, blocks: &BlockManager) -> bool {
        self.live().all(|s| s.pending(blocks) == 1)
    }
}
