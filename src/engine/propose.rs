//! Speculative decoding's proposals for a step: every decoding sequence that speculates
//! proposes the tokens its n-gram index predicts, or asks the draft model for them, as
//! many as its adaptive `k` says pay; the scheduler gives slots to those that fit.

use super::core::Engine;
use super::draft::{DraftJob, DraftRequest, DraftSampling};
use crate::cache::SeqId;

impl Engine {
    /// Speculative decoding: every decoding sequence that speculates proposes the tokens
    /// its n-gram index predicts, as many as its acceptance rate and the measured cost of a
    /// row make worth it; the scheduler gives slots to those that fit. With a draft model
    /// the proposals are asked for and the job making them is returned (its first pass
    /// submitted); they are set when it is done ([`Self::set_draft_proposals`]).
    pub(super) fn propose(&mut self) -> Option<DraftJob> {
        let spec = self.config.speculative?;
        let seqs: usize = self
            .scheduler
            .running()
            .iter()
            .map(|g| g.live().count())
            .sum();
        // What k proposals cost a sequence, as measured at this batch size; row counts not
        // timed yet are guessed from the prior (a fixed `row_cost` overrides it all).
        let measured = match spec.row_cost {
            Some(_) => None,
            None => self.step_costs.relative_costs(seqs, spec.num_tokens),
        };
        let prior = spec.row_cost.unwrap_or(crate::config::DEFAULT_ROW_COST);
        let computed: Vec<Vec<usize>> = self
            .scheduler
            .running()
            .iter()
            .map(|g| {
                g.seqs
                    .iter()
                    .map(|s| self.scheduler.num_computed(s.id))
                    .collect()
            })
            .collect();
        let drafting = self.draft.is_some();
        // With a draft model: each decoding sequence's adapted k, proposals made below.
        let mut wanted: Vec<DraftRequest> = Vec::new();
        for (g, computed) in self.scheduler.running_mut().iter_mut().zip(computed) {
            let samples = !g.data.params.is_greedy();
            for (seq, computed) in g.seqs.iter_mut().zip(computed) {
                let decoding = !seq.is_finished() && computed + 1 == seq.tokens.len();
                seq.proposed = match seq.data.spec.as_mut() {
                    Some(spec) if decoding => {
                        match &measured {
                            Some(costs) => spec.k.set_costs(costs, prior),
                            None => spec.k.set_row_cost(prior),
                        }
                        if drafting {
                            wanted.push(DraftRequest {
                                seq: seq.id,
                                tokens: seq.tokens.clone(),
                                k: spec.k.next_k(),
                                sampling: samples.then(|| DraftSampling {
                                    sampler: seq.data.sampler.clone(),
                                    prompt_len: seq.prompt_len,
                                }),
                            });
                            Vec::new()
                        } else {
                            spec.propose(&seq.tokens)
                        }
                    }
                    _ => Vec::new(),
                };
            }
        }
        match drafting && !wanted.is_empty() {
            true => self.start_draft(wanted),
            false => None,
        }
    }

    /// Starts the draft model's proposals for `wanted`; the draft first forgets every
    /// sequence no longer running. A draft that fails proposes nothing this step (a
    /// warning): speculation is an optimization, and the step goes on without it.
    fn start_draft(&mut self, wanted: Vec<DraftRequest>) -> Option<DraftJob> {
        let draft = self.draft.as_mut()?;
        let live: std::collections::HashSet<SeqId> = self
            .scheduler
            .running()
            .iter()
            .flat_map(|g| g.live_ids())
            .collect();
        draft.retain(&live);
        match draft.start(wanted) {
            Ok(job) => Some(job),
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; no proposals this step");
                None
            }
        }
    }

    /// Drives the draft's `job` (waiting for each pass when `wait`); once it is done, sets
    /// its proposals on the running sequences and returns true. A draft that fails
    /// proposes nothing this step (a warning).
    pub(super) fn advance_draft(&mut self, job: &mut DraftJob, wait: bool) -> bool {
        let Some(draft) = self.draft.as_mut() else {
            return true;
        };
        loop {
            let waited = match wait {
                true => draft.wait(job),
                false => Ok(()),
            };
            match waited.and_then(|()| draft.advance(job)) {
                Ok(true) => return true,
                Ok(false) if !wait => return false,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the draft model failed; no proposals this step");
                    draft.abandon(job);
                    return true;
                }
            }
        }
    }

    /// Sets a finished draft job's proposals on the running sequences.
    pub(super) fn set_draft_proposals(&mut self, job: DraftJob) {
        let by_id: std::collections::HashMap<SeqId, Vec<u32>> =
            job.proposals().into_iter().collect();
        for g in self.scheduler.running_mut().iter_mut() {
            for seq in g.seqs.iter_mut() {
                if let Some(p) = by_id.get(&seq.id) {
                    seq.proposed = p.clone();
                }
            }
        }
    }
}
