//! After the forward pass: turn each sampled row into the next token of its sequence, by
//! sampling (parallel samples, forked from the prompt's sequence once it is prefilled) or
//! by a beam-search step, stream it and apply the stop conditions; then hand the results to
//! [`super::scheduler::Scheduler::commit`], which applies them to the groups and the block
//! manager, and report the groups it let go. A failure here belongs to one request and
//! fails that request alone.

use super::core::Engine;
use super::error::{EngineError, Result};
use super::output::{CompletionOutput, FinishReason, RequestEvent, RequestId, TokenLogprob};
use super::request::{completion, Group, RequestSide, SeqOutput};
use super::scheduler::{BeamChild, Fork, NextToken, SampleOutcome, Sampled, SchedulerOutput};
use super::sequence::Sequence;
use super::step_batch::needs_logits;
use crate::constrain::Constraint;
use crate::runner::StepOutput as ReadBack;
use crate::sampling::SamplingParams;
use crate::sampling::{log_softmax, Sampler, SamplingError};
use crate::tokenizer::Tokenizer;
use std::borrow::Cow;

/// A sequence's rows in the step's read-back: `1 + proposed` of them from `row` on, the
/// first after its newest token, each next one after one more of its proposals.
#[derive(Clone, Copy, Debug)]
struct SeqRows {
    /// Index into the group's `seqs`.
    seq: usize,
    row: usize,
    proposed: usize,
}

/// What sampling one row needs besides the sequence.
struct RowSampler<'a> {
    tokenizer: &'a Tokenizer,
    read: &'a ReadBack,
    max_model_len: usize,
}

/// The sequence a token is sampled for: its tokens so far, its prompt length and its
/// sample index.
struct History<'a> {
    tokens: &'a [u32],
    prompt_len: usize,
    index: usize,
}

impl Engine {
    pub(super) fn advance(
        &mut self,
        sched: &SchedulerOutput<SeqOutput, RequestSide>,
        read: &ReadBack,
    ) -> Result<()> {
        let sampled = self.sample_groups(sched, read);
        let committed = self.scheduler.commit(sched, sampled)?;
        for f in committed.failed {
            f.group.send(RequestEvent::Failed(f.reason));
        }
        for g in committed.finished {
            self.complete(g);
        }
        Ok(())
    }

    /// Samples every group that has rows this step (a group's sequences are scheduled next
    /// to each other, so its rows are consecutive).
    fn sample_groups(
        &mut self,
        sched: &SchedulerOutput<SeqOutput, RequestSide>,
        read: &ReadBack,
    ) -> Vec<Sampled<SeqOutput>> {
        let mut by_group: Vec<(RequestId, Vec<SeqRows>)> = Vec::new();
        let mut row = 0;
        for s in sched.scheduled.iter().filter(|s| s.sample) {
            let r = SeqRows {
                seq: s.seq,
                row,
                proposed: s.proposed,
            };
            row += s.rows();
            match by_group.last_mut() {
                Some((id, v)) if *id == s.request_id => v.push(r),
                _ => by_group.push((s.request_id, vec![r])),
            }
        }
        let rs = RowSampler {
            tokenizer: &self.tokenizer,
            read,
            max_model_len: self.max_model_len(),
        };
        let mut sampled = Vec::with_capacity(by_group.len());
        for (id, seq_rows) in by_group {
            let Some(g) = self.scheduler.get_mut(id) else {
                continue;
            };
            let outcome = if g.data.beam.is_some() {
                rs.beams(g, &seq_rows)
            } else {
                rs.samples(g, &seq_rows)
            };
            if let Ok(SampleOutcome::Tokens { tokens, .. }) = &outcome {
                // Each sampled sequence's token, in the order of its rows.
                for (t, r) in tokens.iter().zip(&seq_rows) {
                    self.spec_rate.record(r.proposed, t.accepted);
                }
            }
            sampled.push(Sampled {
                request_id: id,
                outcome: outcome.unwrap_or_else(|e| SampleOutcome::Failed(e.to_string())),
            });
        }
        sampled
    }

    /// Sends a finished group's output: its samples, or its best beams.
    fn complete(&self, mut g: Group) {
        let outputs = match g.data.beam.take() {
            Some(bs) => {
                let params = &g.data.params;
                bs.finish()
                    .into_iter()
                    .take(params.n)
                    .enumerate()
                    .map(|(i, f)| {
                        let ends = f.tokens.last().is_some_and(|t| {
                            self.tokenizer.is_eos(*t) || params.stop_token_ids.contains(t)
                        });
                        CompletionOutput {
                            index: i,
                            text: self.tokenizer.decode(&f.tokens, true).unwrap_or_default(),
                            token_ids: f.tokens,
                            finish_reason: if ends {
                                FinishReason::Stop
                            } else {
                                FinishReason::Length
                            },
                            logprobs: Vec::new(),
                            cumulative_logprob: f.cum_logprob,
                        }
                    })
                    .collect()
            }
            None => g.seqs.iter().map(completion).collect(),
        };
        g.send(RequestEvent::Finished(g.output(g.request_id, outputs)));
    }
}

impl RowSampler<'_> {
    /// Parallel sampling: each sequence that sampled gets its next token; the first time,
    /// a group of `n > 1` also gets its `n - 1` forks, each sampled from the same row with
    /// its own sampler, starting from the prompt sequence's state before its own token.
    fn samples(&self, g: &mut Group, seq_rows: &[SeqRows]) -> Result<SampleOutcome<SeqOutput>> {
        let n = g.data.params.n;
        let mut forks = Vec::new();
        let mut fork_data = Vec::new();
        if !g.forked && n > 1 {
            let first = seq_rows[0].seq;
            for index in 1..n {
                let mut data = g.seqs[first].data.clone();
                data.sampler = Sampler::new(g.data.params.clone(), index as u64);
                fork_data.push((index, data));
            }
        }
        let mut tokens = Vec::with_capacity(seq_rows.len());
        for r in seq_rows {
            tokens.push(self.verify(&g.data, &mut g.seqs[r.seq], r)?);
        }
        if let Some(&SeqRows {
            seq: first, row, ..
        }) = seq_rows.first()
        {
            for (index, mut data) in fork_data {
                let parent = &g.seqs[first];
                let h = History {
                    tokens: &parent.tokens,
                    prompt_len: parent.prompt_len,
                    index,
                };
                let (token, finish) = self.next_token(&g.data, &h, &mut data, row)?;
                forks.push(Fork {
                    index,
                    token,
                    finish,
                    data,
                });
            }
        }
        Ok(SampleOutcome::Tokens { tokens, forks })
    }

    /// The step's new tokens of one sequence: from each of its rows in turn, the token its
    /// sampler picks, as it would decoding one token per step; a proposal is accepted when
    /// the pick equals it, and the first pick that does not, or that ends the sequence, is
    /// the last. With prompt-lookup proposals (a point mass each) this is speculative
    /// sampling's rule, so outputs keep the target model's distribution; and since every
    /// pick draws from the sampler exactly as it would without speculation, seeded and
    /// greedy outputs are the same token for token.
    fn verify(
        &self,
        side: &RequestSide,
        seq: &mut Sequence<SeqOutput>,
        r: &SeqRows,
    ) -> Result<NextToken> {
        let own = seq.tokens.len();
        let mut result = None;
        for j in 0..=r.proposed {
            let h = History {
                tokens: &seq.tokens,
                prompt_len: seq.prompt_len,
                index: seq.index,
            };
            let (token, finish) = self.next_token(side, &h, &mut seq.data, r.row + j)?;
            let proposal = seq.proposed.get(j).copied().filter(|_| j < r.proposed);
            if finish.is_some() || proposal != Some(token) {
                result = Some(NextToken {
                    seq: r.seq,
                    accepted: j,
                    token,
                    finish,
                });
                break;
            }
            // Accepted: the next row's history has it (taken out again below; the commit
            // moves accepted proposals into the tokens).
            seq.tokens.push(token);
        }
        seq.tokens.truncate(own);
        let next = result
            .ok_or_else(|| EngineError::Internal("verification ended without a token".into()))?;
        if let Some(spec) = seq.data.spec.as_mut() {
            spec.k.record(r.proposed, next.accepted);
        }
        Ok(next)
    }

    /// Samples one token for a sequence with history `h`, records its logprob, streams its
    /// text and applies the stop conditions.
    fn next_token(
        &self,
        side: &RequestSide,
        h: &History,
        out: &mut SeqOutput,
        row: usize,
    ) -> Result<(u32, Option<FinishReason>)> {
        let params = &side.params;
        let (token, lp) = if needs_logits(params) {
            let raw = self.read.logits(row).ok_or(SamplingError::EmptyLogits)?;
            let logits = shaped(raw, params, out.constraint.as_mut())?;
            let (prompt, output) = h.tokens.split_at(h.prompt_len);
            let s = out.sampler.sample_after(&logits, prompt, output)?;
            let lp = params.logprobs.map(|_| TokenLogprob {
                token_id: s.token,
                logprob: s.logprob,
                top: s.top_logprobs.clone(),
            });
            out.cum_logprob += s.logprob;
            (s.token, lp)
        } else {
            out.cum_logprob += f64::from(self.read.argmax_logprob[row]);
            (self.read.argmax[row], None)
        };
        if let Some(lp) = &lp {
            out.logprobs.push(lp.clone());
        }
        let delta = out.decoder.step(self.tokenizer, token)?;
        let mut update = out.stop.push(&delta);
        let eos = !params.ignore_eos && self.tokenizer.is_eos(token);
        let stops = update.stop.is_some() || eos || params.stop_token_ids.contains(&token);
        let complete = match out.constraint.as_mut() {
            Some(c) if !stops => {
                c.accept(token)?;
                c.is_finished()
            }
            _ => false,
        };
        let len = h.tokens.len() + 1;
        let finish = if stops || complete {
            Some(FinishReason::Stop)
        } else if len - h.prompt_len >= params.max_tokens || len >= self.max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        if finish.is_some() && update.stop.is_none() {
            let tail = out.decoder.flush(self.tokenizer)?;
            let more = out.stop.push(&tail);
            update.delta.push_str(&more.delta);
            if more.stop.is_none() {
                update.delta.push_str(&out.stop.finish());
            }
        }
        // A closed channel is noticed at the next step, which aborts the request.
        let _ = side.events.send(RequestEvent::Token {
            index: h.index,
            token_id: token,
            text: update.delta,
            logprob: lp,
        });
        Ok((token, finish))
    }

    /// Beam search: rank all expansions of the live beams; the kept ones become the group's
    /// new beams, each with its cumulative logprob.
    fn beams(&self, g: &mut Group, seq_rows: &[SeqRows]) -> Result<SampleOutcome<SeqOutput>> {
        let mut lp_rows = Vec::with_capacity(seq_rows.len());
        for &SeqRows {
            seq: si, row: r, ..
        } in seq_rows
        {
            let raw = self.read.logits(r).ok_or(SamplingError::EmptyLogits)?;
            let constraint = g.seqs[si].data.constraint.as_mut();
            lp_rows.push(log_softmax(&shaped(raw, &g.data.params, constraint)?)?);
        }
        let Some(bs) = g.data.beam.as_mut() else {
            return Err(EngineError::Internal(
                "a beam group without its search".into(),
            ));
        };
        let kept = bs.step(&lp_rows)?;
        let params = &g.data.params;
        let mut done = bs.is_done();
        let mut children = Vec::with_capacity(kept.len());
        for c in kept {
            let parent = seq_rows[c.parent].seq;
            let p = &g.seqs[parent];
            done |= p.tokens.len() + 1 >= self.max_model_len;
            let mut data = p.data.clone();
            data.cum_logprob = c.cum_logprob;
            let ends = self.tokenizer.is_eos(c.token) || params.stop_token_ids.contains(&c.token);
            if let Some(constraint) = data.constraint.as_mut().filter(|_| !ends) {
                constraint.accept(c.token)?;
            }
            children.push(BeamChild {
                parent,
                token: c.token,
                data,
            });
        }
        Ok(SampleOutcome::Beams { children, done })
    }
}

/// The row sampling sees (`[vocab]`): the raw logits plus the request's logit bias, with
/// every token the sequence's constraint does not allow next at -inf; the raw row itself
/// when neither applies.
fn shaped<'a>(
    raw: &'a [f32],
    params: &SamplingParams,
    constraint: Option<&mut Constraint>,
) -> Result<Cow<'a, [f32]>> {
    if params.logit_bias.is_empty() && constraint.is_none() {
        return Ok(Cow::Borrowed(raw));
    }
    let mut row = raw.to_vec();
    for &(id, bias) in &params.logit_bias {
        if let Some(x) = row.get_mut(id as usize) {
            *x += bias;
        }
    }
    if let Some(c) = constraint {
        c.apply(&mut row)?;
    }
    Ok(Cow::Owned(row))
}
