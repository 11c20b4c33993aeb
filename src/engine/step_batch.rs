//! One step's GPU work as the runner takes it: the flat batch of every scheduled sequence's
//! new tokens (and the proposals it verifies) with their block tables, the block
//! operations, and which read-backs sampling needs, submitted once (`crate::runner`).

use super::core::Engine;
use super::error::{EngineError, Result};
use super::request::{RequestSide, SeqOutput};
use super::scheduler::{ScheduledSeq, SchedulerOutput};
use super::sequence::Sequence;
use crate::kernels::paged_attention::NO_BLOCK;
use crate::model::step::{FlatBatch, SeqSlice};
use crate::runner::{PendingStep, StepPlan};

impl Engine {
    /// Records and submits the step: block operations, the forward pass over the flat
    /// batch, and the read-backs of what sampling needs; then prepares the constrained
    /// rows' masks while the GPU runs.
    pub(super) fn submit_forward(
        &mut self,
        sched: &SchedulerOutput<SeqOutput, RequestSide>,
    ) -> Result<PendingStep> {
        let host_start = web_time::Instant::now();
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
        let plan = StepPlan {
            ops: &sched.ops,
            forward: Some(FlatBatch {
                seqs: &slices,
                tokens: &flat.tokens,
                rows: &flat.rows,
                argmax: true,
                group_tables: &flat.group_tables,
            }),
            read_argmax: true,
            read_logits: need_logits,
            label: "engine step",
        };
        let pending = self.runner.submit(&plan)?;
        self.host
            .record(host_start.elapsed(), !prefill, pending.bind_groups_created);
        self.prepare_masks(sched);
        Ok(pending)
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
    /// verifies), back to back, the rows that sample, and each sequence's block table as
    /// the scheduler planned it (released blocks, which left every layer's window, are
    /// holes the kernels never read).
    fn flat_batch(&self, sched: &SchedulerOutput<SeqOutput, RequestSide>) -> Result<Flat> {
        let groups = sched.tables.first().map_or(1, Vec::len);
        let mut flat = Flat {
            tokens: Vec::new(),
            rows: Vec::new(),
            tables: Vec::with_capacity(sched.scheduled.len()),
            group_tables: vec![Vec::with_capacity(sched.scheduled.len()); groups.max(1) - 1],
        };
        for (s, tables) in sched.scheduled.iter().zip(&sched.tables) {
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
            let mut tables = tables.iter().map(|t| {
                std::iter::repeat_n(NO_BLOCK, t.holes)
                    .chain(t.blocks.iter().map(|b| b.0))
                    .collect::<Vec<u32>>()
            });
            flat.tables.push(tables.next().unwrap_or_default());
            for (g, table) in tables.enumerate() {
                flat.group_tables[g].push(table);
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
