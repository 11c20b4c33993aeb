//! The second half of a step: what the forward pass computed and what sampling made of it
//! become the groups' new state, with the block manager following every change. The
//! engine calls [`Scheduler::commit`] after sampling real logits; the randomized
//! simulation calls it with simulated samples, so both run this one code.
//!
//! In order: every scheduled sequence's tokens are marked computed (and, with a sliding
//! window in every layer, blocks that left it go back to the pool); then, group by group,
//! parallel samples fork off the prompt's sequence the first time it samples, beams are
//! replaced by their children, each new token is appended, finished sequences free their
//! blocks, and groups that are done leave the scheduler. A group whose results do not fit
//! it, or whose sampling failed, fails alone.

use super::super::output::{FinishReason, RequestId};
use super::super::sequence::{GroupShape, Sequence, SequenceGroup};
use super::{FailedGroup, ScheduledSeq, Scheduler, SchedulerOutput};
use crate::cache::{CacheError, SeqId};
use std::collections::{HashMap, HashSet};

/// What sampling made of one group's rows this step.
#[derive(Debug)]
pub struct Sampled<D> {
    pub request_id: RequestId,
    pub outcome: SampleOutcome<D>,
}

#[derive(Debug)]
pub enum SampleOutcome<D> {
    /// Parallel sampling: the next token of each sequence that sampled, and, the first time
    /// a group of `n > 1` samples, the `n - 1` forks of its one sequence (which share its
    /// blocks and start from its tokens before `tokens[0]`).
    Tokens {
        tokens: Vec<NextToken>,
        forks: Vec<Fork<D>>,
    },
    /// A beam-search step: the new beams, best first, each continuing one of the group's
    /// sequences; sequences no child continues are dropped. `done` ends the search with
    /// these beams (so does an empty list).
    Beams {
        children: Vec<BeamChild<D>>,
        done: bool,
    },
    /// Sampling failed for this group; it fails alone with this reason.
    Failed(String),
}

/// A sequence's next token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextToken {
    /// Index into the group's `seqs`.
    pub seq: usize,
    /// How many of the sequence's scheduled proposals were accepted: the step's new tokens
    /// are those proposals, then `token`.
    pub accepted: usize,
    pub token: u32,
    /// Set when this token ends the sequence.
    pub finish: Option<FinishReason>,
}

/// A parallel sample forked off a group's one sequence.
#[derive(Debug)]
pub struct Fork<D> {
    /// Its sample index within the request.
    pub index: usize,
    pub token: u32,
    pub finish: Option<FinishReason>,
    pub data: D,
}

/// A beam's child: its parent's tokens and blocks plus `token`.
#[derive(Debug)]
pub struct BeamChild<D> {
    /// Index into the group's `seqs`.
    pub parent: usize,
    pub token: u32,
    pub data: D,
}

/// The groups a commit let go; their blocks are already free.
pub struct Committed<D, R> {
    /// Every sequence finished, or the beam search ended.
    pub finished: Vec<SequenceGroup<D, R>>,
    /// Sampling failed, or its results did not fit the group.
    pub failed: Vec<FailedGroup<D, R>>,
}

impl<D, R> Scheduler<D, R> {
    /// Applies one step's results (see the module docs). An error is a bookkeeping fault
    /// that no single group caused.
    pub fn commit(
        &mut self,
        out: &SchedulerOutput<D, R>,
        sampled: Vec<Sampled<D>>,
    ) -> Result<Committed<D, R>, CacheError> {
        let accepted: HashMap<(RequestId, usize), usize> = sampled
            .iter()
            .filter_map(|s| match &s.outcome {
                SampleOutcome::Tokens { tokens, .. } => Some((s.request_id, tokens)),
                _ => None,
            })
            .flat_map(|(id, tokens)| tokens.iter().map(move |t| ((id, t.seq), t.accepted)))
            .collect();
        let mismatched = self.mark_computed(&out.scheduled, &accepted)?;
        let mut done = Committed {
            finished: Vec::new(),
            failed: Vec::new(),
        };
        for Sampled {
            request_id: id,
            outcome,
        } in sampled
        {
            let result = match outcome {
                _ if mismatched.contains(&id) => {
                    Err("sampling accepted other proposals than the step verified".into())
                }
                SampleOutcome::Tokens { tokens, forks } => self
                    .commit_tokens(id, tokens, forks)
                    .map_err(|e| e.to_string()),
                SampleOutcome::Beams { children, done } => self
                    .commit_beams(id, children, done)
                    .map_err(|e| e.to_string()),
                SampleOutcome::Failed(reason) => Err(reason),
            };
            match result {
                Ok(false) => {}
                Ok(true) => done.finished.extend(self.remove(id)),
                Err(reason) => {
                    tracing::warn!(request = id, "{reason}");
                    if let Some(group) = self.remove(id) {
                        done.failed.push(FailedGroup { group, reason });
                    }
                }
            }
        }
        Ok(done)
    }

    /// Records the tokens each scheduled sequence computed, and releases the blocks that
    /// left the window. A sequence that verified proposals first gives back the slots of
    /// those rejected (`accepted` has how many of its proposals were, by group and index;
    /// none for a group whose sampling failed) and takes the accepted ones into its tokens,
    /// so that only verified tokens are ever named in the prefix cache. Returns the groups
    /// whose sampling claims more accepted proposals than a sequence verified, which fail.
    fn mark_computed(
        &mut self,
        scheduled: &[ScheduledSeq],
        accepted: &HashMap<(RequestId, usize), usize>,
    ) -> Result<HashSet<RequestId>, CacheError> {
        let mut mismatched: HashSet<(RequestId, usize)> = accepted
            .iter()
            .filter(|&(_, &a)| a > 0)
            .map(|(&key, _)| key)
            .collect();
        let Scheduler {
            running,
            blocks,
            stats,
            ..
        } = self;
        for s in scheduled {
            let seq = running
                .iter_mut()
                .find(|g| g.request_id == s.request_id)
                .and_then(|g| g.seqs.get_mut(s.seq))
                .filter(|seq| seq.id == s.id)
                .ok_or(CacheError::UnknownSequence(s.id))?;
            let mut len = s.start + s.len;
            if s.proposed > 0 {
                let own = s.start + s.own_len();
                let claimed = accepted.get(&(s.request_id, s.seq)).copied().unwrap_or(0);
                let a = claimed.min(s.proposed).min(seq.proposed.len());
                if a == claimed {
                    mismatched.remove(&(s.request_id, s.seq));
                }
                blocks.truncate(s.id, own + a)?;
                seq.tokens.extend(seq.proposed.drain(..).take(a));
                stats.spec_accepted += a as u64;
                len = own + a;
            }
            seq.proposed.clear();
            let computed = seq.tokens.get(..len).ok_or(CacheError::TokenOutOfRange {
                seq: s.id,
                value: len,
                num_tokens: seq.tokens.len(),
            })?;
            blocks.mark_computed(s.id, computed)?;
            if let Some(w) = self.window {
                blocks.release_out_of_window(s.id, w)?;
            }
            blocks.release_group_windows(s.id)?;
        }
        Ok(mismatched.into_iter().map(|(id, _)| id).collect())
    }

    /// Parallel samples: forks first (they copy the parent's tokens before its new one),
    /// then each token. True when every sequence of the group has finished.
    fn commit_tokens(
        &mut self,
        id: RequestId,
        tokens: Vec<NextToken>,
        forks: Vec<Fork<D>>,
    ) -> Result<bool, CacheError> {
        let bad = |reason: &str| CacheError::BadSample {
            request: id,
            reason: reason.into(),
        };
        let mut next_seq = self.next_seq;
        let Scheduler {
            running, blocks, ..
        } = self;
        let g = running_group(running, id)?;
        if tokens
            .iter()
            .any(|t| g.seqs.get(t.seq).is_none_or(Sequence::is_finished))
        {
            return Err(bad("a token for a sequence the group does not have live"));
        }
        if !forks.is_empty() {
            let [first] = tokens.as_slice() else {
                return Err(bad("forks need exactly one sampled sequence to fork"));
            };
            for f in forks {
                next_seq += 1;
                let child = SeqId(next_seq);
                let parent = &g.seqs[first.seq];
                // A fork joins the group as soon as it holds blocks, so that a failure
                // later on frees it with the group.
                if let Err(e) = blocks.fork(parent.id, child) {
                    self.next_seq = next_seq;
                    return Err(e);
                }
                let mut c = continued(parent, child, f.index, f.token, f.data);
                c.finish = f.finish;
                g.seqs.push(c);
            }
        }
        if matches!(g.shape, GroupShape::Samples(_)) {
            g.forked = true;
        }
        for t in tokens {
            let seq = &mut g.seqs[t.seq];
            seq.tokens.push(t.token);
            seq.finish = t.finish;
        }
        for s in g.seqs.iter().filter(|s| s.is_finished()) {
            if blocks.contains(s.id) {
                blocks.free(s.id)?;
            }
        }
        let finished = g.is_finished();
        self.next_seq = next_seq;
        Ok(finished)
    }

    /// One beam-search step: a parent's first child continues it, later children fork its
    /// blocks, parents without children are freed, and the new beams are ranked in the
    /// order of `children`. True when the search is over.
    fn commit_beams(
        &mut self,
        id: RequestId,
        children: Vec<BeamChild<D>>,
        done: bool,
    ) -> Result<bool, CacheError> {
        let mut next_seq = self.next_seq;
        let Scheduler {
            running, blocks, ..
        } = self;
        let g = running_group(running, id)?;
        if children.iter().any(|c| c.parent >= g.seqs.len()) {
            return Err(CacheError::BadSample {
                request: id,
                reason: "a beam's parent is not one of the group's sequences".into(),
            });
        }
        // The forks first, undone if one fails, so that an error leaves the block manager
        // as it was.
        let mut used = vec![false; g.seqs.len()];
        let mut ids = Vec::with_capacity(children.len());
        for c in &children {
            let parent_id = g.seqs[c.parent].id;
            if !std::mem::replace(&mut used[c.parent], true) {
                ids.push(parent_id);
                continue;
            }
            next_seq += 1;
            let child = SeqId(next_seq);
            if let Err(e) = blocks.fork(parent_id, child) {
                let first_new = self.next_seq;
                for &c in ids.iter().filter(|c| c.0 > first_new) {
                    let _ = blocks.free(c);
                }
                self.next_seq = next_seq;
                return Err(e);
            }
            ids.push(child);
        }
        let mut beams = Vec::with_capacity(children.len());
        for (c, id) in children.into_iter().zip(ids) {
            let rank = beams.len();
            beams.push(continued(&g.seqs[c.parent], id, rank, c.token, c.data));
        }
        for (s, used) in g.seqs.iter().zip(used) {
            if !used && blocks.contains(s.id) {
                blocks.free(s.id)?;
            }
        }
        g.seqs = beams;
        self.next_seq = next_seq;
        Ok(done || g.seqs.is_empty())
    }
}

/// Running group `id`, among `running`.
fn running_group<D, R>(
    running: &mut [SequenceGroup<D, R>],
    id: RequestId,
) -> Result<&mut SequenceGroup<D, R>, CacheError> {
    running
        .iter_mut()
        .find(|g| g.request_id == id)
        .ok_or(CacheError::UnknownGroup(id))
}

/// `parent` continued by `token` as sequence `id` with sample index (or beam rank) `index`.
fn continued<D>(parent: &Sequence<D>, id: SeqId, index: usize, token: u32, data: D) -> Sequence<D> {
    let mut tokens = Vec::with_capacity(parent.tokens.len() + 1);
    tokens.extend_from_slice(&parent.tokens);
    tokens.push(token);
    Sequence {
        id,
        index,
        tokens,
        prompt_len: parent.prompt_len,
        finish: None,
        proposed: Vec::new(),
        data,
    }
}
