//! The one rule for the impossible: a group that can never run, at admission or at any
//! later point, fails alone with a reason naming the numbers and the option to raise.
//! Never means: its sequences together, at the length they have reached (plus the token
//! each is about to take), need more blocks than the pool less its watermark (the most one
//! group can be admitted or swapped in with), or it needs more sequence slots than
//! `max_num_seqs`, or more tokens in one step than the step's budget.

use super::super::sequence::{GroupShape, SequenceGroup};
use super::{appending, Queue, Scheduler};
use crate::cache::CacheError;

impl<D, R> Scheduler<D, R> {
    /// Why `g`, in `queue`, can never run from where it is, or `None` when it may run now
    /// or later.
    pub(super) fn never_runs(
        &self,
        g: &SequenceGroup<D, R>,
        queue: Queue,
    ) -> Result<Option<String>, CacheError> {
        let c = &self.config;
        let slots = g.slots();
        if slots > c.max_num_seqs {
            return Ok(Some(format!(
                "the request needs {slots} sequences at once but max_num_seqs is {}; \
                 raise --max-num-seqs or lower n / the beam width",
                c.max_num_seqs
            )));
        }
        let width = g.shape.width();
        if width > c.max_num_batched_tokens {
            return Ok(Some(format!(
                "the request's {width} sequences take {width} tokens per step but a step \
                 holds {}; raise --max-batched-tokens or lower n / the beam width",
                c.max_num_batched_tokens
            )));
        }
        // Group by group: what the sequences hold and still take at their length; in a
        // windowed group, no more than a window and a step's chunk per sequence (as many
        // as the group will have once forked).
        let seqs = g.live().count().max(width);
        let mut need = 0;
        for kv in 0..self.blocks.groups().len() {
            let exact = match queue {
                Queue::Waiting => {
                    let prompts: Vec<&[u32]> = g.live().map(|s| s.tokens.as_slice()).collect();
                    self.blocks
                        .blocks_to_allocate_group_keyed(g.keys, &prompts, kv)
                        + self.first_growth(g)
                }
                Queue::Running | Queue::Swapped => {
                    let ids = g.live_ids();
                    let appending = appending(&self.blocks, g);
                    // A prompt still being computed takes blocks for the rest of it, and
                    // then for its first generated tokens.
                    let tail = self.tail_blocks(g);
                    let growth = if tail > 0 { self.first_growth(g) } else { 0 };
                    self.blocks
                        .group_blocks_after_append_in(&ids, &appending, kv)?
                        + tail
                        + growth
                }
            };
            need += match self.blocks.held_blocks_cap(kv) {
                Some(cap) => exact.min(seqs * cap),
                None => exact,
            };
        }
        let capacity = self.blocks.group_capacity();
        if need <= capacity {
            return Ok(None);
        }
        let live = g.live().count();
        let len = g.live().map(|s| s.tokens.len()).max().unwrap_or(0);
        let cfg = self.blocks.config();
        let unshared = if queue == Queue::Waiting && live > 1 {
            " (recomputed after a preemption, its sequences no longer share blocks; more \
             swap space, --num-cpu-blocks, lets such a group be swapped instead)"
        } else {
            ""
        };
        Ok(Some(format!(
            "the request's {live} sequence(s) need {need} KV blocks together at {len} tokens{unshared}, \
             but one request can hold at most {capacity} (a pool of {} blocks of {} tokens \
             less a watermark of {}); raise --num-gpu-blocks, or lower max_tokens, n or the \
             beam width",
            cfg.num_device_blocks, cfg.block_size, cfg.watermark_blocks
        )))
    }

    /// Blocks the live sequences of `g` still take, in one KV cache group, for the tokens
    /// they have beyond their slots and their next one (a prompt computed chunk by chunk).
    pub(super) fn tail_blocks(&self, g: &SequenceGroup<D, R>) -> usize {
        let bs = self.blocks.block_size();
        g.live()
            .map(|s| {
                let slots = self.blocks.num_tokens(s.id).unwrap_or(0);
                let len = s.tokens.len();
                len.div_ceil(bs)
                    .saturating_sub((slots + 1).min(len).div_ceil(bs))
            })
            .sum()
    }

    /// Blocks a waiting group takes beyond its prompts for its next generated token. A
    /// group about to fork (samples not yet forked, or beam search down to one live beam)
    /// becomes `width` sequences that each write their own token: a new block each when
    /// the sequence fills its last block, else copies of that shared block for all writers
    /// but the last. Otherwise each sequence whose last block is full takes a new one.
    fn first_growth(&self, g: &SequenceGroup<D, R>) -> usize {
        let bs = self.blocks.block_size();
        let width = g.shape.width();
        let live: Vec<usize> = g.live().map(|s| s.tokens.len()).collect();
        let forks = match g.shape {
            GroupShape::Samples(_) => !g.forked,
            GroupShape::Beams(_) => live.len() == 1,
        };
        if forks && width > 1 && live.len() == 1 {
            return if live[0].is_multiple_of(bs) {
                width
            } else {
                width - 1
            };
        }
        live.iter().filter(|&&n| n % bs == 0).count()
    }
}
