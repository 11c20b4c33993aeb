//! The engine: requests in, token streams out. Each [`Engine::step`] schedules, records
//! the block operations and the forward pass into one command buffer, submits it once, reads
//! back what sampling needs (the arg-max of each row for greedy requests, logits otherwise),
//! samples, and streams the new tokens.

use super::config::EngineConfig;
use super::output::{
    CompletionOutput, FinishReason, RequestEvent, RequestId, RequestOutput, TokenLogprob,
};
use super::scheduler::{Scheduler, SchedulerStats};
use super::sequence::{GroupState, Sequence, SequenceGroup};
use crate::cache::{BlockManager, CacheConfig, CacheError, CacheStats, SeqId};
use crate::cache_engine::CacheEngine;
use crate::error::GpuError;
use crate::gpu::{Batch, GpuContext};
use crate::kernels::paged_attention::{AttentionMetadata, SeqSlice};
use crate::model::forward::{forward, StepInput, Workspace};
use crate::model::gpu::GpuModel;
use crate::model::{ModelError, ModelFiles};
use crate::pool::{KvLayout, KvPool, PoolSize};
use crate::sampling::{log_softmax, BeamSearch, BeamSearchConfig, SamplingError, SamplingParams};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("KV cache bookkeeping: {0}")]
    Cache(#[from] CacheError),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A prompt as text (tokenized by the model's tokenizer) or as token ids.
#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// The caller's side of a request: its id and the channel its events arrive on.
#[derive(Debug)]
pub struct RequestHandle {
    pub id: RequestId,
    pub events: Receiver<RequestEvent>,
}

impl RequestHandle {
    /// Waits for the final output, skipping streamed tokens. Only meaningful when another
    /// thread drives the engine, or after the engine has run the request to completion.
    pub fn wait(&self) -> Result<RequestOutput> {
        loop {
            match self.events.recv() {
                Ok(RequestEvent::Finished(out)) => return Ok(out),
                Ok(RequestEvent::Failed(msg)) => return Err(EngineError::InvalidRequest(msg)),
                Ok(RequestEvent::Token { .. }) => continue,
                Err(_) => {
                    return Err(EngineError::InvalidRequest(
                        "the engine dropped the request".into(),
                    ))
                }
            }
        }
    }
}

/// Statistics of the KV cache and the scheduler.
#[derive(Clone, Debug)]
pub struct EngineStats {
    pub cache: CacheStats,
    pub scheduler: SchedulerStats,
    pub copy_on_write_copies: u64,
    pub blocks_swapped_out: u64,
    pub blocks_swapped_in: u64,
    pub running_requests: usize,
}

pub struct Engine {
    pub ctx: Arc<GpuContext>,
    pub model: GpuModel,
    pub tokenizer: Tokenizer,
    pub config: EngineConfig,
    max_model_len: usize,
    cache: CacheEngine,
    ws: Workspace,
    scheduler: Scheduler,
    groups: HashMap<RequestId, SequenceGroup>,
    next_request: RequestId,
    next_seq: u64,
    /// Consecutive steps that computed nothing while requests were pending.
    idle_steps: u32,
}

impl Engine {
    /// Opens the model folder on the adapter chosen by the environment.
    pub fn new(model_dir: &Path, config: EngineConfig) -> Result<Self> {
        let ctx = Arc::new(GpuContext::from_env()?);
        Self::with_context(ctx, model_dir, config, |_, _| {})
    }

    /// Opens the model folder on an existing context (for instance an application's own
    /// device, see [`GpuContext::from_existing`]). `progress(done, total)` reports the
    /// weight upload in bytes.
    pub fn with_context(
        ctx: Arc<GpuContext>,
        model_dir: &Path,
        config: EngineConfig,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let files = ModelFiles::open(model_dir)?;
        let tokenizer = Tokenizer::from_dir(model_dir)?;
        let c = files.config.clone();
        if tokenizer.vocab_size() > c.vocab_size {
            return Err(ModelError::VocabMismatch {
                tokenizer: tokenizer.vocab_size(),
                model: c.vocab_size,
            }
            .into());
        }
        if config.block_size == 0 || config.max_num_seqs == 0 || config.max_num_batched_tokens == 0
        {
            return Err(EngineError::Config(
                "block size, max_num_seqs and max_num_batched_tokens must be positive".into(),
            ));
        }
        let max_model_len = config
            .max_model_len
            .unwrap_or(c.max_model_len())
            .min(c.max_model_len());
        let layout = KvLayout {
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: config.block_size,
            dtype: config.kv_dtype,
        };
        let gpu_blocks = config
            .num_gpu_blocks
            .unwrap_or((config.kv_cache_bytes / layout.block_bytes_all_layers()) as usize);
        let needed = max_model_len.div_ceil(config.block_size);
        if gpu_blocks < needed {
            return Err(EngineError::Config(format!(
                "a KV pool of {gpu_blocks} blocks cannot hold one sequence of {max_model_len} tokens \
                 ({needed} blocks of {}); give more blocks or a smaller max model length",
                config.block_size
            )));
        }
        let cpu_blocks = config
            .num_cpu_blocks
            .unwrap_or((config.swap_space_bytes / layout.block_bytes_all_layers()) as usize);
        let model = GpuModel::upload(&ctx, &files, progress)?;
        let pool = KvPool::new(&ctx, layout, PoolSize::Blocks(gpu_blocks))?;
        let ws = Workspace::new(&ctx, &c, config.max_num_batched_tokens, config.max_num_seqs)?;
        let watermark = (gpu_blocks / 100).min(gpu_blocks.saturating_sub(needed));
        let cache_cfg = CacheConfig::new(config.block_size, gpu_blocks, cpu_blocks)
            .with_watermark_blocks(watermark)
            .with_prefix_caching(config.enable_prefix_caching);
        let blocks = BlockManager::new(cache_cfg)?;
        Ok(Engine {
            cache: CacheEngine::new(pool, cpu_blocks),
            scheduler: Scheduler::new(config.clone(), blocks),
            ws,
            model,
            tokenizer,
            max_model_len,
            config,
            ctx,
            groups: HashMap::new(),
            next_request: 0,
            next_seq: 0,
            idle_steps: 0,
        })
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Queues a request after checking it; its events arrive on the returned handle.
    pub fn add_request(&mut self, prompt: Prompt, params: SamplingParams) -> Result<RequestHandle> {
        let vocab = self.model.config.vocab_size;
        params.validate(vocab)?;
        let ids = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(&t)?,
            Prompt::Tokens(ids) => ids,
        };
        if ids.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        if ids.len() >= self.max_model_len {
            return Err(EngineError::InvalidRequest(format!(
                "the prompt has {} tokens; the model's context is {} (at least one must remain to generate)",
                ids.len(),
                self.max_model_len
            )));
        }
        let seqs_needed = params.beam_width.unwrap_or(params.n).max(params.n);
        if seqs_needed > self.config.max_num_seqs {
            return Err(EngineError::InvalidRequest(format!(
                "{seqs_needed} sequences in one request exceed max_num_seqs {}",
                self.config.max_num_seqs
            )));
        }
        let id = self.next_request;
        self.next_request += 1;
        let (tx, rx) = channel();
        let beam = BeamSearchConfig::from_params(&params, self.tokenizer.eos_token_ids())
            .map(BeamSearch::new);
        let seq = Sequence::new(self.new_seq_id(), 0, &ids, &params);
        self.groups.insert(
            id,
            SequenceGroup {
                request_id: id,
                arrival: id,
                params,
                prompt_ids: ids,
                seqs: vec![seq],
                state: GroupState::Waiting,
                forked: false,
                beam,
                events: tx,
            },
        );
        self.scheduler.add(id);
        Ok(RequestHandle { id, events: rx })
    }

    fn new_seq_id(&mut self) -> SeqId {
        self.next_seq += 1;
        SeqId(self.next_seq)
    }

    /// Aborts a request at any point, freeing everything it holds. Returns false for an
    /// unknown or already finished request.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if !self.groups.contains_key(&id) {
            return false;
        }
        self.scheduler.remove(id, &self.groups);
        if let Some(mut g) = self.groups.remove(&id) {
            for s in g.seqs.iter_mut().filter(|s| !s.is_finished()) {
                s.finish = Some(FinishReason::Abort);
            }
            let _ = g.events.send(RequestEvent::Finished(RequestOutput {
                request_id: id,
                prompt_token_ids: g.prompt_ids.clone(),
                outputs: g.seqs.iter().map(Sequence::completion).collect(),
            }));
        }
        true
    }

    pub fn has_unfinished(&self) -> bool {
        !self.groups.is_empty()
    }

    pub fn stats(&self) -> EngineStats {
        let cache = self.scheduler.blocks.stats();
        EngineStats {
            copy_on_write_copies: cache.cow_copies,
            blocks_swapped_out: self.cache.stats.blocks_swapped_out,
            blocks_swapped_in: self.cache.stats.blocks_swapped_in,
            cache,
            scheduler: self.scheduler.stats,
            running_requests: self.groups.len(),
        }
    }

    /// Runs steps until every request has finished.
    pub fn run_to_completion(&mut self) -> Result<()> {
        while self.has_unfinished() {
            self.step()?;
        }
        Ok(())
    }

    /// One engine step. Returns the number of tokens computed.
    pub fn step(&mut self) -> Result<usize> {
        let sched = self.scheduler.schedule(&mut self.groups)?;
        for (id, msg) in sched.rejected {
            if let Some(g) = self.groups.remove(&id) {
                let _ = g.events.send(RequestEvent::Failed(msg));
            }
        }
        if sched.scheduled.is_empty() {
            if !sched.ops.is_empty() {
                self.cache.execute(&self.ctx, &sched.ops)?;
                self.idle_steps = 0;
            } else if self.has_unfinished() {
                // A step may compute nothing once (say, right after a preemption while a
                // group waits in host memory); several in a row mean no request can ever run.
                self.idle_steps += 1;
                if self.idle_steps > 3 {
                    return Err(EngineError::Config(
                        "requests are pending but none can be scheduled; the KV pool or \
                         max_num_seqs is too small for them"
                            .into(),
                    ));
                }
            }
            return Ok(0);
        }
        self.idle_steps = 0;

        // The flat batch: each scheduled sequence's new tokens, back to back.
        let mut tokens = Vec::new();
        let mut tables = Vec::with_capacity(sched.scheduled.len());
        let mut rows = Vec::new();
        for s in &sched.scheduled {
            let seq = &self.groups[&s.request_id].seqs[s.seq];
            tokens.extend_from_slice(&seq.tokens[s.start..s.start + s.len]);
            if s.sample {
                rows.push((tokens.len() - 1) as u32);
            }
            let table: Vec<u32> = self
                .scheduler
                .blocks
                .block_table(s.id)?
                .iter()
                .map(|b| b.0)
                .collect();
            tables.push(table);
        }
        let slices: Vec<SeqSlice> = sched
            .scheduled
            .iter()
            .zip(&tables)
            .map(|(s, t)| SeqSlice {
                query_len: s.len,
                context_len: s.start + s.len,
                block_table: t,
            })
            .collect();
        let meta = AttentionMetadata::build(&slices, self.config.block_size)?;
        let need_logits = sched
            .scheduled
            .iter()
            .filter(|s| s.sample)
            .any(|s| needs_logits(&self.groups[&s.request_id].params));

        let ctx = &self.ctx;
        // The step's metadata, token ids and sampled rows: one buffer, one write.
        let bufs = meta.upload_with(ctx, &[&tokens, &rows])?;
        let missing = || GpuError::invalid("step metadata", "an extra array is missing");
        let tok_buf = bufs.extra(0).ok_or_else(missing)?;
        let row_buf = bufs.extra(1).ok_or_else(missing)?;
        let mut batch = Batch::new(ctx, "engine step");
        let pending = self.cache.encode(&mut batch, &sched.ops)?;
        if !rows.is_empty() || !tokens.is_empty() {
            let input = StepInput {
                tokens: tok_buf,
                meta: &bufs,
                rows: row_buf,
                num_rows: rows.len().max(1),
                argmax: !need_logits,
            };
            // With no sampling row, gather row 0 anyway (harmless) to keep shapes simple.
            forward(
                &mut batch,
                &self.model,
                &self.cache.device,
                &self.ws,
                &input,
            )?;
        }
        let vocab = self.model.config.vocab_size;
        let read = match (rows.is_empty(), need_logits) {
            (true, _) => None,
            (false, true) => {
                Some(batch.read_later(&self.ws.logits, 0, (rows.len() * vocab * 4) as u64)?)
            }
            (false, false) => {
                Some(batch.read_later(&self.ws.argmax, 0, (rows.len() * 4) as u64)?)
            }
        };
        // The step's one submit: block operations, forward pass and read-back copy.
        batch.submit()?;
        self.cache.finish(ctx, pending)?;
        let bytes = match read {
            Some(r) => ctx.complete_read(r)?,
            None => Vec::new(),
        };
        let (logits, argmax): (Vec<f32>, Vec<u32>) = if need_logits {
            (bytemuck::pod_collect_to_vec(&bytes), Vec::new())
        } else {
            (Vec::new(), bytemuck::pod_collect_to_vec(&bytes))
        };

        // Progress, then sampling.
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
        }
        // A group's sequences are scheduled next to each other.
        let mut by_group: Vec<(RequestId, Vec<(usize, usize)>)> = Vec::new();
        for (row, s) in sched.scheduled.iter().filter(|s| s.sample).enumerate() {
            match by_group.last_mut() {
                Some((id, v)) if *id == s.request_id => v.push((s.seq, row)),
                _ => by_group.push((s.request_id, vec![(s.seq, row)])),
            }
        }
        let read = ReadBack {
            logits: &logits,
            argmax: &argmax,
            vocab,
        };
        for (id, seq_rows) in by_group {
            let result = if self.groups[&id].beam.is_some() {
                self.advance_beams(id, &seq_rows, &read)
            } else {
                self.advance_samples(id, &seq_rows, &read)
            };
            if let Err(e) = result {
                // A failure of one request never takes down the others.
                self.scheduler.remove(id, &self.groups);
                if let Some(g) = self.groups.remove(&id) {
                    let _ = g.events.send(RequestEvent::Failed(e.to_string()));
                }
            }
        }
        Ok(tokens.len())
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
        let n = self.groups[&id].params.n;
        if !self.groups[&id].forked && n > 1 {
            let (first, r) = seq_rows[0];
            for index in 1..n {
                let child = self.new_seq_id();
                let g = self.groups.get_mut(&id).expect("group exists");
                let parent = g.seqs[first].id;
                self.scheduler.blocks.fork(parent, child)?;
                let mut s = g.seqs[first].clone();
                s.id = child;
                s.index = index;
                s.sampler = crate::sampling::Sampler::new(g.params.clone(), index as u64);
                g.seqs.push(s);
                seq_rows.push((g.seqs.len() - 1, r));
            }
        }
        self.groups.get_mut(&id).expect("group exists").forked = true;
        for (si, r) in seq_rows {
            let g = self.groups.get_mut(&id).expect("group exists");
            let seq = &mut g.seqs[si];
            let (token, lp) = match read.row(r) {
                Row::Argmax(t) => (t, None),
                Row::Logits(l) => {
                    let out = seq.sampler.sample(l)?;
                    let lp = g.params.logprobs.map(|_| TokenLogprob {
                        token_id: out.token,
                        logprob: out.logprob,
                        top: out.top_logprobs.clone(),
                    });
                    seq.cum_logprob += out.logprob;
                    (out.token, lp)
                }
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
        let max_len = self.max_model_len;
        let g = self.groups.get_mut(&id).expect("group exists");
        let params = &g.params;
        let seq = &mut g.seqs[si];
        seq.tokens.push(token);
        if let Some(lp) = &lp {
            seq.logprobs.push(lp.clone());
        }
        let delta = seq.decoder.step(&self.tokenizer, token)?;
        let mut update = seq.stop.push(&delta);
        let eos = !params.ignore_eos && self.tokenizer.is_eos(token);
        let finish = if update.stop.is_some() || eos || params.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if seq.output_ids().len() >= params.max_tokens || seq.tokens.len() >= max_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        if finish.is_some() && update.stop.is_none() {
            let tail = seq.decoder.flush(&self.tokenizer)?;
            let more = seq.stop.push(&tail);
            update.delta.push_str(&more.delta);
            if more.stop.is_none() {
                update.delta.push_str(&seq.stop.finish());
            }
        }
        seq.finish = finish;
        let _ = g.events.send(RequestEvent::Token {
            index: seq.index,
            token_id: token,
            text: update.delta,
            logprob: lp,
        });
        if finish.is_some() {
            let sid = seq.id;
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
            match read.row(r) {
                Row::Logits(l) => lp_rows.push(log_softmax(l)?),
                Row::Argmax(_) => unreachable!("beam search always reads logits"),
            }
        }
        let g = self.groups.get_mut(&id).expect("group exists");
        let bs = g.beam.as_mut().expect("beam group");
        let children = bs.step(&lp_rows)?;
        let done = bs.is_done();
        let old: Vec<Sequence> = seq_rows.iter().map(|&(si, _)| g.seqs[si].clone()).collect();
        let mut used = vec![false; old.len()];
        let mut new_seqs = Vec::with_capacity(children.len());
        for c in &children {
            let mut s = old[c.parent].clone();
            if used[c.parent] {
                s.id = {
                    self.next_seq += 1;
                    SeqId(self.next_seq)
                };
                self.scheduler.blocks.fork(old[c.parent].id, s.id)?;
            }
            used[c.parent] = true;
            s.tokens.push(c.token);
            s.cum_logprob = c.cum_logprob;
            new_seqs.push(s);
        }
        for (i, s) in old.iter().enumerate() {
            if !used[i] {
                self.scheduler.free_seq(s.id);
            }
        }
        let g = self.groups.get_mut(&id).expect("group exists");
        for (i, s) in new_seqs.iter_mut().enumerate() {
            s.index = i;
        }
        g.seqs = new_seqs;
        let out_of_room = g.seqs.iter().any(|s| s.tokens.len() >= self.max_model_len);
        if done || out_of_room || g.seqs.is_empty() {
            let bs = g.beam.take().expect("beam group");
            let n = g.params.n;
            let finished = bs.finish();
            let outputs: Vec<CompletionOutput> = finished
                .into_iter()
                .take(n)
                .enumerate()
                .map(|(i, f)| {
                    let ends = f.tokens.last().is_some_and(|t| {
                        self.tokenizer.is_eos(*t) || g.params.stop_token_ids.contains(t)
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
            let ids: Vec<SeqId> = g.seqs.iter().map(|s| s.id).collect();
            for sid in ids {
                self.scheduler.free_seq(sid);
            }
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
        let outputs = g.seqs.iter().map(Sequence::completion).collect();
        self.complete(id, outputs);
    }

    fn complete(&mut self, id: RequestId, outputs: Vec<CompletionOutput>) {
        self.scheduler.remove(id, &self.groups);
        if let Some(g) = self.groups.remove(&id) {
            let _ = g.events.send(RequestEvent::Finished(RequestOutput {
                request_id: id,
                prompt_token_ids: g.prompt_ids,
                outputs,
            }));
        }
    }
}

enum Row<'a> {
    Argmax(u32),
    Logits(&'a [f32]),
}

/// What the step read back: logits rows, or only their arg-max.
struct ReadBack<'a> {
    logits: &'a [f32],
    argmax: &'a [u32],
    vocab: usize,
}

impl ReadBack<'_> {
    fn row(&self, r: usize) -> Row<'_> {
        if self.logits.is_empty() {
            Row::Argmax(self.argmax[r])
        } else {
            Row::Logits(&self.logits[r * self.vocab..(r + 1) * self.vocab])
        }
    }
}

/// Greedy requests without logprobs need only the GPU's arg-max.
fn needs_logits(p: &SamplingParams) -> bool {
    !p.is_greedy() || p.logprobs.is_some() || p.beam_width.is_some()
}
