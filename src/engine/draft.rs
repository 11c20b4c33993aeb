//! A draft model for speculative decoding: a smaller model with the target's vocabulary
//! proposes the next tokens of each speculating sequence by decoding ahead of it: the
//! arg-max for a greedy request, and for a request that samples, a token drawn from the
//! draft's distribution by a copy of the sequence's sampler with the uniform numbers the
//! target's sampler will draw for those rows (so the two agree wherever both put that number
//! on the same token).
//!
//! The draft keeps its own paged KV cache: its own pool (within the bytes of the target's)
//! and its own [`BlockManager`] (one
//! table per engine sequence, no prefix caching, no sharing), so its memory is managed by
//! the same code as the target's. What it holds for a sequence is a record of the tokens
//! whose K/V it computed. Before proposing, that record is compared with the sequence's
//! tokens now: the common prefix stays, the rest is given back (`truncate`: rejected
//! proposals, or a sequence whose tokens the target replaced), and the tokens the draft
//! has not seen are computed in one pass with every other sequence's, whose last row
//! gives the first proposal; each further proposal is one more batched one-token pass.
//! So the draft follows the target through acceptance, rejection, preemption, swapping and
//! recomputation without being told: a sequence it lost track of (preempted, or its table
//! freed when the draft pool ran short) is simply computed again from its tokens.
//!
//! The engine verifies proposals by sampling each row with the sequence's own sampler and
//! keeping a proposal while the sample equals it (`advance.rs`); so greedy and seeded
//! outputs are those of plain decoding, token for token, whatever the draft proposes. A
//! greedy request's proposals are the draft's arg-max. A request that samples gets
//! proposals drawn from the draft's own distribution by a copy of the sequence's sampler
//! (its parameters, penalties and logit bias, and its random number generator as it
//! stands): proposal j uses the very uniform number the target's sampler will draw for row
//! j, so the two picks coincide wherever both distributions put that number on the same
//! token (sampling coupled through a shared random number). That accepts far more than
//! the draft's arg-max, which a sampled row matches only as often as the target's
//! probability of it, and the outputs stay the target's own samples.

use super::error::{EngineError, Result};
use super::EngineConfig;
use crate::cache::{BlockManager, BlockOps, CacheConfig, SeqId};
use crate::gpu::GpuContext;
use crate::model::step::{FlatBatch, SeqSlice};
use crate::model::ModelConfig;
use crate::runner::plan::PoolPlan;
use crate::runner::{open_model, ModelRunner, PendingStep, RunnerSpec, StepPlan};
use crate::sampling::Sampler;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// What the draft model has done, for `--stats` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Forward passes of the draft.
    pub passes: u64,
    /// Tokens it computed (catching up and proposing).
    pub tokens: u64,
    /// Sequences it dropped because its pool was short (they propose nothing that step).
    pub dropped: u64,
}

/// One speculating sequence's request for proposals.
pub struct DraftRequest {
    pub seq: SeqId,
    /// Its tokens (prompt and output).
    pub tokens: Vec<u32>,
    /// At most this many proposals.
    pub k: usize,
    /// For a request that samples: how it samples (greedy requests take the arg-max).
    pub sampling: Option<DraftSampling>,
}

/// A copy of a sampling sequence's sampler as it stands, and where its prompt ends (for
/// the penalties): the draft's proposals draw the random numbers the target's sampler will.
pub struct DraftSampling {
    pub sampler: Sampler,
    pub prompt_len: usize,
}

/// A loaded draft model with its KV cache.
pub struct DraftModel {
    /// The draft with its pool and workspace.
    runner: ModelRunner,
    blocks: BlockManager,
    /// Per engine sequence: the tokens whose K/V the draft cache holds, in order.
    seqs: HashMap<SeqId, Vec<u32>>,
    /// Most tokens and rows one pass computes.
    max_tokens: usize,
    /// Positions the draft computes (its rope tables' length): no proposal goes past it.
    max_model_len: usize,
    max_rows: usize,
    pub stats: DraftStats,
}

impl DraftModel {
    /// Loads the draft in `dir` for a target with config `target` and context
    /// `max_model_len`, in the engine's block size and KV dtype. Its pool holds every
    /// running sequence at the full context, but takes no more bytes than the target's pool
    /// (`pool_bytes`). Refused when the vocabularies differ or the draft's context is
    /// shorter than the target's.
    pub fn open(
        ctx: Arc<GpuContext>,
        dir: &Path,
        target: &ModelConfig,
        config: &EngineConfig,
        max_model_len: usize,
        pool_bytes: u64,
    ) -> Result<Self> {
        let what = |e: String| EngineError::Config(format!("draft model {}: {e}", dir.display()));
        let (files, _tokenizer) = open_model(&dir.into()).map_err(|e| what(e.to_string()))?;
        let c = files.config.clone();
        if c.vocab_size != target.vocab_size {
            return Err(what(format!(
                "its vocabulary has {} tokens, the target's {}; a draft must share the \
                 target's tokenizer",
                c.vocab_size, target.vocab_size
            )));
        }
        if c.max_model_len() < max_model_len {
            return Err(what(format!(
                "its context of {} tokens is shorter than the target's {max_model_len}; \
                 give a smaller --max-model-len",
                c.max_model_len()
            )));
        }
        let plan = PoolPlan::for_draft(&c, config, max_model_len, pool_bytes).map_err(what)?;
        let max_tokens = config.max_num_batched_tokens.max(1);
        // A pass has a row per sequence it computes and at least a token per row.
        let max_rows = config.max_num_seqs.max(1).min(max_tokens);
        // The draft's weights stay as they are on disk.
        let spec = RunnerSpec {
            weight_dtype: None,
            // Its block manager is sized by the plan: exactly so many blocks, or none.
            min_gpu_blocks: None,
            fit: None,
            ..plan.runner_spec(config, max_model_len, max_tokens, max_rows)
        };
        let runner = ModelRunner::load(ctx, &files, &spec, |_, _| {})?;
        let cache =
            CacheConfig::new(config.block_size, plan.gpu_blocks, 0).with_watermark_blocks(0);
        Ok(DraftModel {
            runner,
            blocks: BlockManager::new(cache)?,
            seqs: HashMap::new(),
            max_tokens,
            max_rows,
            max_model_len,
            stats: DraftStats::default(),
        })
    }

    /// Forgets every sequence not in `live` (finished, aborted, or no longer running).
    pub fn retain(&mut self, live: &HashSet<SeqId>) {
        let gone: Vec<SeqId> = self
            .seqs
            .keys()
            .filter(|id| !live.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.forget(id);
        }
    }

    fn forget(&mut self, id: SeqId) {
        self.seqs.remove(&id);
        if self.blocks.contains(id) {
            let _ = self.blocks.free(id);
        }
    }

    /// Starts proposing for `reqs`: brings each sequence's cache in line with its tokens
    /// and submits the first pass, without waiting for it. [`Self::advance`] lands each
    /// pass and submits the next; a sequence the draft cannot hold proposes nothing.
    pub fn start(&mut self, reqs: Vec<DraftRequest>) -> Result<DraftJob> {
        let mut active: Vec<usize> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let (id, tokens) = (r.seq, r.tokens.as_slice());
            if r.k == 0 || tokens.is_empty() || tokens.len() > self.max_model_len {
                continue;
            }
            if self.prepare(id, tokens) {
                active.push(i);
            } else {
                self.forget(id);
                self.stats.dropped += 1;
            }
        }
        let pending = active
            .iter()
            .map(|&i| (i, self.seqs[&reqs[i].seq].len()))
            .collect();
        let mut job = DraftJob {
            out: vec![Vec::new(); reqs.len()],
            reqs,
            active,
            pending,
            caught_up: false,
            pass: None,
        };
        if let Err(e) = self.submit_next(&mut job) {
            self.abandon(&mut job);
            return Err(e);
        }
        Ok(job)
    }

    /// Lands `job`'s pass if it has run and submits the next one; true once every proposal
    /// is made (then [`DraftJob::proposals`] has them). Never waits. On an error the
    /// draft forgets the job's sequences (computed again next time) and the job is done.
    pub fn advance(&mut self, job: &mut DraftJob) -> Result<bool> {
        let Some(pass) = &job.pass else {
            return Ok(true);
        };
        let landed = match self.runner.is_ready(&pass.pending) {
            Ok(ready) => ready,
            Err(e) => {
                self.abandon(job);
                return Err(e.into());
            }
        };
        if !landed {
            return Ok(false);
        }
        let pass = job.pass.take().expect("a pass in flight");
        match self.land(job, pass).and_then(|()| self.submit_next(job)) {
            Ok(()) => Ok(job.pass.is_none()),
            Err(e) => {
                self.abandon(job);
                Err(e)
            }
        }
    }

    /// Waits on this thread until `job`'s pass in flight has run (native drivers).
    pub fn wait(&self, job: &DraftJob) -> Result<()> {
        match &job.pass {
            Some(pass) => Ok(self.runner.wait(&pass.pending)?),
            None => Ok(()),
        }
    }

    /// Submits `job`'s next pass: first the tokens the draft has not computed, sequences
    /// packed into passes of at most `max_tokens` tokens (a sequence's last token gives its
    /// first proposal); then one token per sequence and pass, the last proposal going in,
    /// until each has its `k` (or the pool or the context runs out). None left: the job
    /// is done.
    fn submit_next(&mut self, job: &mut DraftJob) -> Result<()> {
        let (rows, tokens, propose) = match job.pending.is_empty() {
            false => self.catch_up_pass(job),
            true => {
                if !job.caught_up {
                    job.caught_up = true;
                    for &i in &job.active {
                        self.seqs
                            .insert(job.reqs[i].seq, job.reqs[i].tokens.clone());
                    }
                }
                self.further_pass(job)
            }
        };
        if rows.is_empty() {
            self.blocks.take_ops();
            return Ok(());
        }
        let pending = self.submit_pass(job, &rows, &tokens, &propose)?;
        job.pass = Some(Pass {
            rows,
            propose,
            catching_up: !job.caught_up,
            pending,
        });
        Ok(())
    }

    /// The next catch-up pass's rows (`(request, start, end)`), tokens, and which rows
    /// propose (a sequence's last).
    fn catch_up_pass(&self, job: &mut DraftJob) -> (Vec<Row>, Vec<u32>, Vec<bool>) {
        let mut rows: Vec<Row> = Vec::new();
        let mut budget = self.max_tokens;
        for p in job.pending.iter_mut() {
            if budget == 0 || rows.len() == self.max_rows {
                break;
            }
            let len = job.reqs[p.0].tokens.len();
            let end = (p.1 + budget).min(len);
            rows.push((p.0, p.1, end));
            budget -= end - p.1;
            p.1 = end;
        }
        let reqs = &job.reqs;
        job.pending.retain(|&(i, done)| done < reqs[i].tokens.len());
        let tokens = rows
            .iter()
            .flat_map(|&(i, s, e)| reqs[i].tokens[s..e].iter().copied())
            .collect();
        let last = rows
            .iter()
            .map(|&(i, _, e)| e == reqs[i].tokens.len())
            .collect();
        (rows, tokens, last)
    }

    /// The next pass of further proposals: one token (the newest proposal) per sequence
    /// that wants more, as many as a pass holds.
    fn further_pass(&mut self, job: &DraftJob) -> (Vec<Row>, Vec<u32>, Vec<bool>) {
        let mut rows = Vec::new();
        for &i in &job.active {
            let (id, k, out) = (job.reqs[i].seq, job.reqs[i].k, &job.out[i]);
            if out.is_empty() || out.len() >= k || rows.len() == self.max_rows {
                continue;
            }
            let len = job.reqs[i].tokens.len() + out.len();
            if len > self.max_model_len || self.blocks.grow_to(id, len).is_err() {
                continue; // the pool is short: this sequence proposes what it has
            }
            rows.push((i, len - 1, len));
        }
        let tokens = rows
            .iter()
            .map(|&(i, _, _)| *job.out[i].last().expect("a proposal"))
            .collect();
        let propose = vec![true; rows.len()];
        (rows, tokens, propose)
    }

    /// Lands a pass: each proposing row's pick (the arg-max, or a draw of the request's
    /// sampler copy) joins its request's proposals.
    fn land(&mut self, job: &mut DraftJob, pass: Pass) -> Result<()> {
        let read = self.runner.finish(pass.pending)?;
        for (r, &(i, _, end)) in pass.rows.iter().enumerate() {
            if !pass.propose[r] {
                continue;
            }
            let mut token = read.argmax[r];
            let req = &mut job.reqs[i];
            if let (Some(s), Some(row)) = (req.sampling.as_mut(), read.logits(r)) {
                token = draw(s, row, &req.tokens, &job.out[i])?;
            }
            if pass.catching_up {
                debug_assert_eq!(end, job.reqs[i].tokens.len());
            } else {
                // The proposal that went in is computed now; the new one is not yet.
                let last = *job.out[i].last().expect("a proposal");
                self.seqs
                    .get_mut(&job.reqs[i].seq)
                    .expect("prepared")
                    .push(last);
            }
            job.out[i].push(token);
        }
        Ok(())
    }

    /// Ends a job that failed: it proposes nothing, and the draft forgets its sequences
    /// (what their caches hold is unknown; they are computed again next time).
    pub fn abandon(&mut self, job: &mut DraftJob) {
        job.pass = None;
        job.out.iter_mut().for_each(Vec::clear);
        for &i in &job.active {
            self.forget(job.reqs[i].seq);
        }
        self.blocks.take_ops();
    }

    /// Makes the draft's table of `id` hold exactly the common prefix of what it computed
    /// and `tokens` (never the last token: it is computed again for its logits), with slots
    /// for all of `tokens`. False when the pool cannot hold them.
    fn prepare(&mut self, id: SeqId, tokens: &[u32]) -> bool {
        let seen = self.seqs.entry(id).or_default();
        let keep = seen
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        seen.truncate(keep);
        if self.blocks.contains(id) {
            let cut = match keep {
                0 => self.blocks.free(id).is_ok(),
                n => {
                    let slots = self.blocks.num_tokens(id).unwrap_or(0);
                    slots <= n || self.blocks.truncate(id, n).is_ok()
                }
            };
            if !cut {
                return false;
            }
        }
        match self.blocks.contains(id) {
            true => self.blocks.grow_to(id, tokens.len()).is_ok(),
            false => self.blocks.allocate(id, tokens).is_ok(),
        }
    }

    /// Submits one pass over `rows` (`(request, start, end)`: positions `start..end` of
    /// each request, whose tokens are `tokens`, in order), reading back each row's arg-max,
    /// and the logits where a proposing row's request samples.
    fn submit_pass(
        &mut self,
        job: &DraftJob,
        rows: &[Row],
        tokens: &[u32],
        propose: &[bool],
    ) -> Result<PendingStep> {
        let mut tables = Vec::with_capacity(rows.len());
        for &(i, _, _) in rows {
            let t: Vec<u32> = (self.blocks.block_table(job.reqs[i].seq)?.iter())
                .map(|b| b.0)
                .collect();
            tables.push(t);
        }
        let seqs: Vec<SeqSlice> = rows
            .iter()
            .zip(&tables)
            .map(|(&(_, s, e), t)| SeqSlice {
                query_len: e - s,
                context_len: e,
                block_table: t,
            })
            .collect();
        let mut last_rows = Vec::with_capacity(rows.len());
        let mut at = 0u32;
        for &(_, s, e) in rows {
            at += (e - s) as u32;
            last_rows.push(at - 1);
        }
        let sampled = |r: usize| propose[r] && job.reqs[rows[r].0].sampling.is_some();
        let pending = self.runner.submit(&StepPlan {
            ops: &BlockOps::default(),
            forward: Some(FlatBatch {
                seqs: &seqs,
                tokens,
                rows: &last_rows,
                argmax: true,
                group_tables: &[],
            }),
            read_argmax: true,
            read_logits: (0..rows.len()).any(sampled),
            label: "draft step",
        })?;
        self.stats.passes += 1;
        self.stats.tokens += tokens.len() as u64;
        Ok(pending)
    }
}

/// A pass's row: positions `start..end` of request `req`'s tokens (`(req, start, end)`).
type Row = (usize, usize, usize);

/// A draft pass submitted and not yet landed.
struct Pass {
    rows: Vec<Row>,
    /// Which rows propose (in a catch-up pass, only a sequence's last).
    propose: Vec<bool>,
    /// A pass of tokens the draft had not computed (else one of further proposals).
    catching_up: bool,
    pending: PendingStep,
}

/// The draft's proposals for one step, made one pass at a time
/// ([`DraftModel::start`], [`DraftModel::advance`]).
pub struct DraftJob {
    reqs: Vec<DraftRequest>,
    /// The requests the draft holds (the others propose nothing).
    active: Vec<usize>,
    /// Each request's proposals so far.
    out: Vec<Vec<u32>>,
    /// Catching up: `(request, next position)` of sequences with tokens left to compute.
    pending: Vec<(usize, usize)>,
    caught_up: bool,
    pass: Option<Pass>,
}

impl DraftJob {
    /// Resolves once the pass in flight, if any, has landed (see
    /// [`crate::runner::PendingStep::landed`]).
    pub async fn landed(&self) {
        if let Some(pass) = &self.pass {
            pass.pending.landed().await;
        }
    }

    /// Each request's sequence and its proposals (what was made, if the job is cut short).
    pub fn proposals(self) -> Vec<(SeqId, Vec<u32>)> {
        self.reqs.iter().map(|r| r.seq).zip(self.out).collect()
    }
}

/// The next proposal of a sampling sequence with `tokens` and `proposed` so far, from the
/// draft's logits `row`: the request's logit bias, then its sampler (penalties, filters
/// and one draw of its random numbers), as `advance.rs` samples the target's row.
fn draw(s: &mut DraftSampling, row: &[f32], tokens: &[u32], proposed: &[u32]) -> Result<u32> {
    let mut logits = row.to_vec();
    for &(id, bias) in &s.sampler.params().logit_bias {
        if let Some(x) = logits.get_mut(id as usize) {
            *x += bias;
        }
    }
    let history = [tokens, proposed].concat();
    let (prompt, output) = history.split_at(s.prompt_len.min(history.len()));
    Ok(s.sampler.sample_after(&logits, prompt, output)?.token)
}
