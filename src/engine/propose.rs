//! Speculative decoding's proposals for a step: every decoding sequence that speculates
//! proposes the tokens its n-gram index predicts, or asks the draft model for them, as
//! many as its adaptive `k` says pay; the scheduler gives slots to those that fit.

use super::core::Engine;
use super::draft::{DraftRequest, DraftSampling};
use crate::cache::SeqId;

impl Engine {
    /// Speculative decoding: every decoding sequence that speculates proposes the tokens
    /// its n-gram index predicts, as many as its acceptance rate and the measured cost of a
    /// row make worth it; the scheduler gives slots to those that fit.
    pub(super) fn propose(&mut self) {
        let Some(spec) = self.config.speculative else {
            return;
        };
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
        if drafting {
            self.draft_proposals(wanted);
        }
    }

    /// The draft model's proposals for `wanted` (`(sequence, tokens, k)`), set on the
    /// running sequences; the draft forgets every sequence no longer running. A draft that
    /// fails proposes nothing this step (a warning): speculation is an optimization, and
    /// the step goes on without it.
    fn draft_proposals(&mut self, mut wanted: Vec<DraftRequest>) {
        let Some(draft) = self.draft.as_mut() else {
            return;
        };
        let live: std::collections::HashSet<SeqId> = self
            .scheduler
            .running()
            .iter()
            .flat_map(|g| g.live_ids())
            .collect();
        draft.retain(&live);
        let proposals = match draft.propose(&mut wanted) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; no proposals this step");
                return;
            }
        };
        let by_id: std::collections::HashMap<SeqId, Vec<u32>> =
            wanted.iter().map(|w| w.seq).zip(proposals).collect();
        for g in self.scheduler.running_mut().iter_mut() {
            for seq in g.seqs.iter_mut() {
                if let Some(p) = by_id.get(&seq.id) {
                    seq.proposed = p.clone();
                }
            }
        }
    }
}
