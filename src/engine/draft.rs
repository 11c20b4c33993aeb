//! A draft model for speculative decoding: a smaller model with the target's vocabulary
//! proposes the next tokens of each speculating sequence by decoding greedily ahead of it.
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
//! Proposals are the draft's arg-max, a point mass, and the engine verifies them by
//! sampling each row with the sequence's own sampler (`advance.rs`); so greedy and seeded
//! outputs are those of plain decoding, token for token, whatever the draft proposes.

use super::core::{kv_layout, kv_pool, open_model, EngineError, Result};
use super::EngineConfig;
use crate::cache::{BlockManager, CacheConfig, SeqId};
use crate::gpu::{Batch, GpuContext, Readback};
use crate::kernels::logits::argmax_logprobs;
use crate::kernels::paged_attention::AttentionBuffers;
use crate::model::forward::Workspace;
use crate::model::gpu::GpuModel;
use crate::model::step::{record_step, FlatBatch, SeqSlice};
use crate::model::ModelConfig;
use crate::pool::KvPool;
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

/// A loaded draft model with its KV cache.
pub struct DraftModel {
    ctx: Arc<GpuContext>,
    model: GpuModel,
    pool: KvPool,
    ws: Workspace,
    blocks: BlockManager,
    meta: Option<AttentionBuffers>,
    argmax: Readback,
    /// Per engine sequence: the tokens whose K/V the draft cache holds, in order.
    seqs: HashMap<SeqId, Vec<u32>>,
    /// Most tokens and rows one pass computes.
    max_tokens: usize,
    /// Positions the draft computes (its rope tables' length): no proposal goes past it.
    max_model_len: usize,
    max_rows: usize,
    pub stats: DraftStats,
}

impl Drop for DraftModel {
    /// As the engine's: cached bind groups would keep the draft's buffers alive.
    fn drop(&mut self) {
        self.ctx.release_bind_groups();
    }
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
        let (files, _tokenizer) = open_model(dir).map_err(|e| what(e.to_string()))?;
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
        let layout = kv_layout(&c, config)?;
        let per_seq = max_model_len.div_ceil(config.block_size) + 1;
        let affordable = (pool_bytes / layout.block_bytes_all_layers()) as usize;
        let blocks = (config.max_num_seqs.max(1) * per_seq).min(affordable);
        if blocks < per_seq {
            return Err(what(format!(
                "a pool of {blocks} blocks (the target pool's bytes) cannot hold one sequence \
                 of {max_model_len} tokens; give more KV memory or a smaller --max-model-len"
            )));
        }
        let model = GpuModel::upload_as(&ctx, &files, max_model_len, None, |_, _| {})?;
        let pool = kv_pool(&ctx, layout, blocks, config)?;
        let max_tokens = config.max_num_batched_tokens.max(1);
        // A pass has a row per sequence it computes and at least a token per row.
        let max_rows = config.max_num_seqs.max(1).min(max_tokens);
        let ws = Workspace::new(&ctx, &c, max_tokens, max_rows)?;
        let cache = CacheConfig::new(config.block_size, blocks, 0).with_watermark_blocks(0);
        Ok(DraftModel {
            ctx,
            model,
            pool,
            ws,
            blocks: BlockManager::new(cache)?,
            meta: None,
            argmax: Readback::default(),
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

    /// Up to `k` proposals after `tokens` for each `(seq, tokens, k)`: the draft's greedy
    /// continuation. A sequence the draft cannot hold proposes nothing.
    pub fn propose(&mut self, reqs: &[(SeqId, &[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        let mut out = vec![Vec::new(); reqs.len()];
        // Bring each sequence's cache in line with its tokens, with slots for all of them.
        let mut active: Vec<usize> = Vec::new();
        for (i, &(id, tokens, k)) in reqs.iter().enumerate() {
            if k == 0 || tokens.is_empty() || tokens.len() > self.max_model_len {
                continue;
            }
            if self.prepare(id, tokens) {
                active.push(i);
            } else {
                self.forget(id);
                self.stats.dropped += 1;
            }
        }
        // Catch up: every token the draft has not computed, sequences packed into passes
        // of at most `max_tokens` tokens; a sequence's last token gives its first proposal.
        let mut pending: Vec<(usize, usize)> = active
            .iter()
            .map(|&i| (i, self.seqs[&reqs[i].0].len()))
            .collect();
        while !pending.is_empty() {
            let mut pass: Vec<(usize, usize, usize)> = Vec::new(); // (req, start, end)
            let mut budget = self.max_tokens;
            for p in pending.iter_mut() {
                if budget == 0 || pass.len() == self.max_rows {
                    break;
                }
                let len = reqs[p.0].1.len();
                let end = (p.1 + budget).min(len);
                pass.push((p.0, p.1, end));
                budget -= end - p.1;
                p.1 = end;
            }
            let next = self.forward(reqs, &pass)?;
            for ((i, _, end), token) in pass.iter().zip(next) {
                if *end == reqs[*i].1.len() {
                    out[*i].push(token);
                }
            }
            pending.retain(|&(i, done)| done < reqs[i].1.len());
        }
        for &i in &active {
            let (id, tokens, _) = reqs[i];
            self.seqs.insert(id, tokens.to_vec());
        }
        // Each further proposal: the last one goes in, one token per sequence.
        loop {
            let mut pass = Vec::new();
            for &i in &active {
                let (id, tokens, k) = reqs[i];
                // One token each, as many sequences as one pass holds; the rest next pass.
                if out[i].is_empty() || out[i].len() >= k || pass.len() == self.max_rows {
                    continue;
                }
                let len = tokens.len() + out[i].len();
                if len > self.max_model_len || self.blocks.grow_to(id, len).is_err() {
                    continue; // the pool is short: this sequence proposes what it has
                }
                pass.push((i, len - 1, len));
            }
            if pass.is_empty() {
                break;
            }
            let next = self.forward_proposals(reqs, &out, &pass)?;
            for ((i, _, _), token) in pass.iter().zip(next) {
                // The proposal that went in is computed now; the new one is not yet.
                let last = *out[*i].last().expect("a proposal");
                self.seqs.get_mut(&reqs[*i].0).expect("prepared").push(last);
                out[*i].push(token);
            }
        }
        self.blocks.take_ops();
        Ok(out)
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

    /// One pass over `pass` (`(request, start, end)`: the tokens `start..end` of each
    /// request's tokens); returns the arg-max after each one's last token.
    fn forward(
        &mut self,
        reqs: &[(SeqId, &[u32], usize)],
        pass: &[(usize, usize, usize)],
    ) -> Result<Vec<u32>> {
        let tokens: Vec<u32> = pass
            .iter()
            .flat_map(|&(i, s, e)| reqs[i].1[s..e].iter().copied())
            .collect();
        self.run(reqs, pass, &tokens)
    }

    /// One pass computing each sequence's newest proposal (at `start`).
    fn forward_proposals(
        &mut self,
        reqs: &[(SeqId, &[u32], usize)],
        out: &[Vec<u32>],
        pass: &[(usize, usize, usize)],
    ) -> Result<Vec<u32>> {
        let tokens: Vec<u32> = pass
            .iter()
            .map(|&(i, _, _)| *out[i].last().expect("a proposal"))
            .collect();
        self.run(reqs, pass, &tokens)
    }

    fn run(
        &mut self,
        reqs: &[(SeqId, &[u32], usize)],
        pass: &[(usize, usize, usize)],
        tokens: &[u32],
    ) -> Result<Vec<u32>> {
        let mut tables = Vec::with_capacity(pass.len());
        for &(i, _, _) in pass {
            let id = reqs[i].0;
            let t: Vec<u32> = self.blocks.block_table(id)?.iter().map(|b| b.0).collect();
            tables.push(t);
        }
        let seqs: Vec<SeqSlice> = pass
            .iter()
            .zip(&tables)
            .map(|(&(_, s, e), t)| SeqSlice {
                query_len: e - s,
                context_len: e,
                block_table: t,
            })
            .collect();
        let mut rows = Vec::with_capacity(pass.len());
        let mut at = 0u32;
        for &(_, s, e) in pass {
            at += (e - s) as u32;
            rows.push(at - 1);
        }
        let mut batch = Batch::new(&self.ctx, "draft step");
        let step = FlatBatch {
            seqs: &seqs,
            tokens,
            rows: &rows,
            argmax: true,
            group_tables: &[],
        };
        record_step(
            &mut batch,
            &self.model,
            &self.pool,
            &self.ws,
            &mut self.meta,
            &step,
        )?;
        let n = rows.len();
        let pending = self
            .argmax
            .read_later(&mut batch, &self.ws.argmax, 0, (n * 8) as u64)?;
        batch.submit()?;
        let bytes = self.ctx.complete_read(pending)?;
        let (ids, _) = argmax_logprobs(&bytemuck::pod_collect_to_vec(&bytes), n);
        self.stats.passes += 1;
        self.stats.tokens += tokens.len() as u64;
        Ok(ids)
    }
}
