//! One step's GPU work: the flat batch of every scheduled sequence's new tokens, its
//! attention metadata in one upload, the block operations and the forward pass recorded
//! into one command buffer and submitted once, and the read-back of what sampling needs.

use super::core::{Engine, EngineError, Result};
use super::request::{RequestSide, SeqOutput};
use super::scheduler::{ScheduledSeq, SchedulerOutput};
use super::sequence::Sequence;
use crate::gpu::{Batch, GpuContext, PendingRead};
use crate::kernels::logits::argmax_logprobs;
use crate::kernels::paged_attention::NO_BLOCK;
use crate::model::step::{record_step, FlatBatch, SeqSlice};

impl Engine {
    /// Records and submits the step: block operations, the forward pass over the flat
    /// batch, and the read-back of what sampling needs.
    pub(super) fn run_forward(
        &mut self,
        sched: &SchedulerOutput<SeqOutput, RequestSide>,
    ) -> Result<ReadBack> {
        let host_start = std::time::Instant::now();
        let prefill = self.is_prefill(sched)?;
        if let Some(p) = self.ctx.profiler() {
            p.begin_step(if prefill { "prefill" } else { "decode" });
        }
        let flat = self.flat_batch(sched)?;
        let slices: Vec<SeqSlice> = sched
            .scheduled
            .iter()
            .zip(&flat.tables)
            .map(|(s, t)| SeqSlice {
                query_len: s.len,
                context_len: s.start + s.len,
                block_table: t,
            })
            .collect();
        let need_logits = sched.scheduled.iter().filter(|s| s.sample).any(|s| {
            self.scheduler
                .get(s.request_id)
                .is_some_and(|g| needs_logits(g.params()))
        });
        let ctx = &self.ctx;
        let mut batch = Batch::new(ctx, "engine step");
        let pending = self.cache.encode(&mut batch, &sched.ops)?;
        let step = FlatBatch {
            seqs: &slices,
            tokens: &flat.tokens,
            rows: &flat.rows,
            argmax: true,
            group_tables: &flat.group_tables,
        };
        let io = &mut self.step_buffers;
        record_step(
            &mut batch,
            &self.model,
            &self.cache.device,
            &self.ws,
            &mut io.meta,
            &step,
        )?;
        let n = flat.rows.len();
        let vocab = self.model.config.vocab_size;
        let argmax = match n {
            0 => None,
            _ => Some(
                io.argmax
                    .read_later(&mut batch, &self.ws.argmax, 0, (n * 8) as u64)?,
            ),
        };
        let logits = match need_logits {
            true => {
                let bytes = (n * vocab * 4) as u64;
                Some(
                    io.logits
                        .read_later(&mut batch, &self.ws.logits, 0, bytes)?,
                )
            }
            false => None,
        };
        // The step's one submit: block operations, forward pass and read-back copies.
        let created = batch.bind_groups_created();
        batch.submit()?;
        self.host.record(host_start.elapsed(), !prefill, created);
        self.prepare_masks(sched);
        let ctx = &self.ctx;
        self.cache.finish(ctx, pending)?;
        ReadBack::complete(ctx, argmax, logits, n, vocab)
    }

    /// A step with any prompt chunk (or recomputation) is a prefill step, even when
    /// decodes ride along.
    fn is_prefill(&self, sched: &SchedulerOutput<SeqOutput, RequestSide>) -> Result<bool> {
        let mut prefill = false;
        for s in &sched.scheduled {
            prefill |= s.own_len() > 1 || s.start < self.scheduled_seq(s)?.prompt_len;
        }
        Ok(prefill)
    }

    /// The flat batch: each scheduled sequence's new tokens (and the proposals it
    /// verifies), back to back, the rows that sample, and each sequence's block table (released blocks, which left every layer's
    /// window, are holes the kernels never read).
    fn flat_batch(&self, sched: &SchedulerOutput<SeqOutput, RequestSide>) -> Result<Flat> {
        let blocks = &self.scheduler.blocks;
        let groups = blocks.groups().len();
        let mut flat = Flat {
            tokens: Vec::new(),
            rows: Vec::new(),
            tables: Vec::with_capacity(sched.scheduled.len()),
            group_tables: vec![Vec::with_capacity(sched.scheduled.len()); groups - 1],
        };
        for s in &sched.scheduled {
            let seq = self.scheduled_seq(s)?;
            let own = seq.tokens.get(s.start..s.start + s.own_len());
            let proposed = seq.proposed.get(..s.proposed);
            let (Some(own), Some(proposed)) = (own, proposed) else {
                return Err(EngineError::Internal(format!(
                    "{} scheduled past its tokens or proposals",
                    s.id
                )));
            };
            flat.tokens.extend_from_slice(own);
            flat.tokens.extend_from_slice(proposed);
            let end = flat.tokens.len() as u32;
            flat.rows.extend((end - s.rows() as u32)..end);
            let table = |g: usize| -> Result<Vec<u32>> {
                let holes = blocks.released_blocks_in(s.id, g)?;
                Ok(std::iter::repeat_n(NO_BLOCK, holes)
                    .chain(blocks.block_table_in(s.id, g)?.iter().map(|b| b.0))
                    .collect())
            };
            flat.tables.push(table(0)?);
            for g in 1..groups {
                flat.group_tables[g - 1].push(table(g)?);
            }
        }
        Ok(flat)
    }
}

/// A step's token ids, sampled rows and block tables (see [`Engine::flat_batch`]).
struct Flat {
    tokens: Vec<u32>,
    rows: Vec<u32>,
    tables: Vec<Vec<u32>>,
    /// KV cache groups 1..: per group, each sequence's table.
    group_tables: Vec<Vec<Vec<u32>>>,
}

impl Engine {
    /// Computes the next-token mask of every constrained sequence that samples this step,
    /// on this thread while the GPU runs the step. A mask that fails is computed again when
    /// the row is sampled, where the error fails its request alone.
    fn prepare_masks(&mut self, sched: &SchedulerOutput<SeqOutput, RequestSide>) {
        for s in sched.scheduled.iter().filter(|s| s.sample) {
            let Some(g) = self.scheduler.get_mut(s.request_id) else {
                continue;
            };
            let seq = g.seqs.iter_mut().find(|q| q.id == s.id);
            if let Some(c) = seq.and_then(|q| q.data.constraint.as_mut()) {
                let _ = c.prepare();
            }
        }
    }

    /// A sequence this step scheduled; missing, it is a scheduler fault.
    fn scheduled_seq(&self, s: &ScheduledSeq) -> Result<&Sequence<SeqOutput>> {
        self.scheduler.scheduled_seq(s).ok_or_else(|| {
            EngineError::Internal(format!("scheduled {} is not a running sequence", s.id))
        })
    }
}

/// What a step read back: per sampled row its arg-max and that token's logprob, and the
/// logits rows when some request needed them.
pub(super) struct ReadBack {
    pub argmax: Vec<u32>,
    pub argmax_logprob: Vec<f32>,
    pub logits: Vec<f32>,
    pub vocab: usize,
}

impl ReadBack {
    /// Waits for the step's read-backs: the arg-max and its logprob of each of `n` rows,
    /// and their logits when they were read.
    fn complete(
        ctx: &GpuContext,
        argmax: Option<PendingRead>,
        logits: Option<PendingRead>,
        n: usize,
        vocab: usize,
    ) -> Result<Self> {
        let (ids, lps) = match argmax {
            Some(r) => argmax_logprobs(&bytemuck::pod_collect_to_vec(&ctx.complete_read(r)?), n),
            None => (Vec::new(), Vec::new()),
        };
        let logits = match logits {
            Some(r) => bytemuck::pod_collect_to_vec(&ctx.complete_read(r)?),
            None => Vec::new(),
        };
        Ok(ReadBack {
            argmax: ids,
            argmax_logprob: lps,
            logits,
            vocab,
        })
    }

    pub fn logits(&self, row: usize) -> Option<&[f32]> {
        self.logits.get(row * self.vocab..(row + 1) * self.vocab)
    }
}

/// Greedy requests without logprobs, penalties, bias or constraint need only the GPU's
/// arg-max and its logprob; they take them even when other requests in the step read logits,
/// so their output never depends on the batch.
pub(super) fn needs_logits(p: &crate::sampling::SamplingParams) -> bool {
    !p.is_greedy()
        || p.logprobs.is_some()
        || p.beam_width.is_some()
        || p.has_penalties()
        || p.shapes_logits()
}
