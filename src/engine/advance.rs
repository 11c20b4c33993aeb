//! After the forward pass: record progress, then turn each sampled row into the next token
//! of its sequence, by sampling (parallel samples, forked from the prompt's sequence once
//! it is prefilled) or by a beam-search step, stream it, and apply the stop conditions.
//! A failure here belongs to one request and fails that request alone.

use super::core::{Engine, Result};
use super::output::{CompletionOutput, FinishReason, RequestEvent, RequestId, TokenLogprob};
use super::request::completion;
use super::scheduler::SchedulerOutput;
use super::step_batch::{needs_logits, ReadBack};
use crate::cache::SeqId;
use crate::sampling::{log_softmax, Sampler, SamplingError};

impl Engine {
    pub(super) fn advance(&mut self, sched: &SchedulerOutput, read: &ReadBack) -> Result<()> {
        // With a sliding window in every layer, blocks that left it go back to the pool.
        let window = self
            .model
            .config
            .recipe
            .common_window()
            .filter(|_| self.config.free_out_of_window_blocks);
        for s in &sched.scheduled {
            let g = self
                .groups
                .get_mut(&s.request_id)
                .expect("scheduled group exists");
            let seq = &mut g.seqs[s.seq];
            seq.num_computed = s.start + s.len;
            self.scheduler
                .blocks
                .mark_computed(s.id, seq.num_computed)?;
            if let Some(w) = window {
                self.scheduler.blocks.release_out_of_window(s.id, w)?;
            }
        }
        // A group's sequences are scheduled next to each other.
        let mut by_group: Vec<(RequestId, Vec<(usize, usize)>)> = Vec::new();
        for (row, s) in sched.scheduled.iter().filter(|s| s.sample).enumerate() {
            match by_group.last_mut() {
                Some((id, v)) if *id == s.request_id => v.push((s.seq, row)),
                _ => by_group.push((s.request_id, vec![(s.seq, row)])),
            }
        }
        for (id, seq_rows) in by_group {
            let result = if self.groups[&id].data.beam.is_some() {
                self.advance_beams(id, &seq_rows, read)
            } else {
                self.advance_samples(id, &seq_rows, read)
            };
            if let Err(e) = result {
                self.scheduler.remove(id, &self.groups);
                if let Some(g) = self.groups.remove(&id) {
                    g.send(RequestEvent::Failed(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Parallel sampling: fork the prompt's sequence into `n` once it is prefilled, then
    /// give each sequence its next token.
    fn advance_samples(
        &mut self,
        id: RequestId,
        seq_rows: &[(usize, usize)],
        read: &ReadBack,
    ) -> Result<()> {
        let mut seq_rows = seq_rows.to_vec();
        let g = &self.groups[&id];
        let n = g.params().n;
        if !g.forked && n > 1 {
            let (first, r) = seq_rows[0];
            for index in 1..n {
                let child = self.new_seq_id();
                let g = self.groups.get_mut(&id).expect("group exists");
                let si = self.scheduler.fork_seq(g, first, child)?;
                let s = &mut g.seqs[si];
                s.index = index;
                s.data.sampler = Sampler::new(g.data.params.clone(), index as u64);
                seq_rows.push((si, r));
            }
        }
        self.groups.get_mut(&id).expect("group exists").forked = true;
        for (si, r) in seq_rows {
            let g = self.groups.get_mut(&id).expect("group exists");
            let params = &g.data.params;
            let seq = &mut g.seqs[si];
            let (token, lp) = if needs_logits(params) {
                let logits = read.logits(r).ok_or(SamplingError::EmptyLogits)?;
                let (prompt, output) = seq.tokens.split_at(seq.prompt_len);
                let out = seq.data.sampler.sample_after(logits, prompt, output)?;
                let lp = params.logprobs.map(|_| TokenLogprob {
                    token_id: out.token,
                    logprob: out.logprob,
                    top: out.top_logprobs.clone(),
                });
                seq.data.cum_logprob += out.logprob;
                (out.token, lp)
            } else {
                seq.data.cum_logprob += f64::from(read.argmax_logprob[r]);
                (read.argmax[r], None)
            };
            self.push_token(id, si, token, lp)?;
        }
        self.finish_group_if_done(id);
        Ok(())
    }

    /// Appends a sampled token, streams its text and applies the stop conditions.
    fn push_token(
        &mut self,
        id: RequestId,
        si: usize,
        token: u32,
        lp: Option<TokenLogprob>,
    ) -> Result<()> {
        let max_len = self.max_model_len();
        let g = self.groups.get_mut(&id).expect("group exists");
        let params = &g.data.params;
        let seq = &mut g.seqs[si];
        seq.tokens.push(token);
        let out = &mut seq.data;
        if let Some(lp) = &lp {
            out.logprobs.push(lp.clone());
        }
        let delta = out.decoder.step(&self.tokenizer, token)?;
        let mut update = out.stop.push(&delta);
        let eos = !params.ignore_eos && self.tokenizer.is_eos(token);
        let finish = if update.stop.is_some() || eos || params.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if seq.tokens.len() - seq.prompt_len >= params.max_tokens
            || seq.tokens.len() >= max_len
        {
            Some(FinishReason::Length)
        } else {
            None
        };
        if finish.is_some() && update.stop.is_none() {
            let tail = out.decoder.flush(&self.tokenizer)?;
            let more = out.stop.push(&tail);
            update.delta.push_str(&more.delta);
            if more.stop.is_none() {
                update.delta.push_str(&out.stop.finish());
            }
        }
        seq.finish = finish;
        let (index, sid) = (seq.index, seq.id);
        // A closed channel is noticed at the next step, which aborts the request.
        g.send(RequestEvent::Token {
            index,
            token_id: token,
            text: update.delta,
            logprob: lp,
        });
        if finish.is_some() {
            self.scheduler.free_seq(sid);
        }
        Ok(())
    }

    /// Beam search: rank all expansions of the live beams; fork the kept parents' block
    /// tables for their extra children and free the dropped beams.
    fn advance_beams(
        &mut self,
        id: RequestId,
        seq_rows: &[(usize, usize)],
        read: &ReadBack,
    ) -> Result<()> {
        let mut lp_rows = Vec::with_capacity(seq_rows.len());
        for &(_, r) in seq_rows {
            let logits = read.logits(r).ok_or(SamplingError::EmptyLogits)?;
            lp_rows.push(log_softmax(logits)?);
        }
        let max_len = self.max_model_len();
        let mut next_seq = self.next_seq;
        let g = self.groups.get_mut(&id).expect("group exists");
        let bs = g.data.beam.as_mut().expect("beam group");
        let children = bs.step(&lp_rows)?;
        let done = bs.is_done();
        let old: Vec<usize> = seq_rows.iter().map(|&(si, _)| si).collect();
        let kids: Vec<(usize, u32)> = children.iter().map(|c| (c.parent, c.token)).collect();
        let replaced = self.scheduler.replace_beams(g, &old, &kids, || {
            next_seq += 1;
            SeqId(next_seq)
        });
        // Ids handed out stay used, even if the replacement failed.
        self.next_seq = next_seq;
        replaced?;
        for (s, c) in g.seqs.iter_mut().zip(&children) {
            s.data.cum_logprob = c.cum_logprob;
        }
        let out_of_room = g.seqs.iter().any(|s| s.tokens.len() >= max_len);
        if done || out_of_room || g.seqs.is_empty() {
            let bs = g.data.beam.take().expect("beam group");
            let params = &g.data.params;
            let outputs: Vec<CompletionOutput> = bs
                .finish()
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
                .collect();
            self.complete(id, outputs);
        }
        Ok(())
    }

    fn finish_group_if_done(&mut self, id: RequestId) {
        let Some(g) = self.groups.get(&id) else {
            return;
        };
        if !g.is_finished() {
            return;
        }
        let outputs = g.seqs.iter().map(completion).collect();
        self.complete(id, outputs);
    }

    fn complete(&mut self, id: RequestId, outputs: Vec<CompletionOutput>) {
        self.scheduler.remove(id, &self.groups);
        if let Some(g) = self.groups.remove(&id) {
            g.send(RequestEvent::Finished(g.output(id, outputs)));
        }
    }
}
