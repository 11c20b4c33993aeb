//! One step of the forward pass over a flat batch of tokens from many sequences: the
//! batch's host-side metadata ([`AttentionMetadata`]: which sequence and position each
//! query token has, the block tables, and the slots the step's new K/V go to), and the step
//! as the engine and the scorer both record it: metadata, token ids and sampled rows
//! written in place, in one write, into buffers kept across steps (so the step's bind
//! groups are the last step's), then the forward pass over them.

use super::forward::{forward, StepInput, Workspace};
use super::gpu::GpuModel;
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, GpuContext};
use crate::kernels::paged_attention::{AttentionBuffers, MetadataShape, NO_BLOCK};
use crate::pool::KvPool;

/// One sequence's share of a flat batch: its `query_len` newest tokens are computed this
/// step, and after the step its cache holds `context_len` tokens, reachable through
/// `block_table` (physical block ids, logical order).
#[derive(Clone, Copy, Debug)]
pub struct SeqSlice<'a> {
    pub query_len: usize,
    pub context_len: usize,
    pub block_table: &'a [u32],
}

/// Host-side metadata of a flat batch of query tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionMetadata {
    pub num_tokens: usize,
    pub num_seqs: usize,
    pub max_blocks_per_seq: usize,
    /// Offset of each sequence's first query token; `num_seqs + 1` entries.
    pub query_start: Vec<u32>,
    /// `[num_tokens]` (sequence index, position).
    pub token_pos: Vec<[u32; 2]>,
    /// `[num_seqs, max_blocks_per_seq]`, padded with 0.
    pub block_tables: Vec<u32>,
    /// `[num_tokens]` slot of each token's new K/V.
    pub slot_mapping: Vec<i32>,
    /// `[num_tokens]` position of each token (for RoPE).
    pub positions: Vec<u32>,
    /// KV cache groups 1.. (group 0's are the fields above): each group's block tables
    /// and slot mapping, laid out alike.
    pub groups: Vec<(Vec<u32>, Vec<i32>)>,
}

impl AttentionMetadata {
    /// Lays out `seqs` back to back: each sequence's query tokens together, at consecutive
    /// positions (the query-tiled kernel relies on it: eight tokens whose first and last
    /// are one sequence's, seven positions apart, are eight consecutive queries). Fails
    /// when a sequence's query is longer than its context, or its table is too short for
    /// its context.
    pub fn build(seqs: &[SeqSlice<'_>], block_size: usize) -> Result<Self> {
        Self::build_grouped(seqs, &[], block_size)
    }

    /// [`Self::build`] with the block tables of further KV cache groups: `groups[g][i]` is
    /// sequence `i`'s table in group `g + 1` (holes are [`NO_BLOCK`], as in group 0's).
    pub fn build_grouped(
        seqs: &[SeqSlice<'_>],
        groups: &[Vec<Vec<u32>>],
        block_size: usize,
    ) -> Result<Self> {
        let mut m = Self::build_one(seqs, block_size)?;
        for (g, tables) in groups.iter().enumerate() {
            if tables.len() != seqs.len() {
                return Err(GpuError::invalid(
                    "step metadata",
                    format!(
                        "KV cache group {}: {} block tables for {} sequences",
                        g + 1,
                        tables.len(),
                        seqs.len()
                    ),
                ));
            }
            let slices: Vec<SeqSlice> = seqs
                .iter()
                .zip(tables)
                .map(|(s, t)| SeqSlice {
                    block_table: t,
                    ..*s
                })
                .collect();
            let other = Self::build_one(&slices, block_size)?;
            m.groups.push((other.block_tables, other.slot_mapping));
        }
        Ok(m)
    }

    fn build_one(seqs: &[SeqSlice<'_>], block_size: usize) -> Result<Self> {
        const K: &str = "step metadata";
        let max_blocks = seqs
            .iter()
            .map(|s| s.context_len.div_ceil(block_size))
            .max()
            .unwrap_or(0)
            .max(1);
        let mut m = AttentionMetadata {
            num_seqs: seqs.len(),
            max_blocks_per_seq: max_blocks,
            query_start: vec![0],
            block_tables: vec![0; seqs.len() * max_blocks],
            ..Default::default()
        };
        for (i, s) in seqs.iter().enumerate() {
            if s.query_len == 0 || s.query_len > s.context_len {
                return Err(GpuError::invalid(
                    K,
                    format!(
                        "sequence {i}: query of {} tokens, context of {}",
                        s.query_len, s.context_len
                    ),
                ));
            }
            let needed = s.context_len.div_ceil(block_size);
            if s.block_table.len() < needed {
                return Err(GpuError::invalid(
                    K,
                    format!(
                        "sequence {i}: {} blocks for {} tokens of block size {block_size}",
                        s.block_table.len(),
                        s.context_len
                    ),
                ));
            }
            m.block_tables[i * max_blocks..i * max_blocks + needed]
                .copy_from_slice(&s.block_table[..needed]);
            for pos in s.context_len - s.query_len..s.context_len {
                let block = s.block_table[pos / block_size];
                if block == NO_BLOCK {
                    return Err(GpuError::invalid(
                        K,
                        format!("sequence {i}: position {pos} is in a released block"),
                    ));
                }
                let block = block as usize;
                m.token_pos.push([i as u32, pos as u32]);
                m.positions.push(pos as u32);
                m.slot_mapping
                    .push((block * block_size + pos % block_size) as i32);
            }
            m.num_tokens += s.query_len;
            m.query_start.push(m.num_tokens as u32);
        }
        Ok(m)
    }

    /// The most query tokens any one sequence has.
    pub fn longest_query(&self) -> usize {
        self.query_start
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
    }

    fn shape(&self) -> MetadataShape {
        MetadataShape {
            num_tokens: self.num_tokens,
            max_blocks_per_seq: self.max_blocks_per_seq,
            longest_query: self.longest_query(),
            num_groups: 1 + self.groups.len(),
        }
    }

    /// The arrays in section order, then `extra`.
    fn parts<'a>(&'a self, extra: &[&'a [u32]]) -> Vec<&'a [u8]> {
        let mut parts: Vec<&[u8]> = vec![
            bytemuck::cast_slice(&self.token_pos),
            bytemuck::cast_slice(&self.block_tables),
            bytemuck::cast_slice(&self.slot_mapping),
            bytemuck::cast_slice(&self.positions),
        ];
        for (tables, slots) in &self.groups {
            parts.push(bytemuck::cast_slice(tables));
            parts.push(bytemuck::cast_slice(slots));
        }
        parts.extend(extra.iter().map(|e| bytemuck::cast_slice::<u32, u8>(e)));
        parts
    }

    pub fn upload(&self, ctx: &GpuContext) -> Result<AttentionBuffers> {
        self.upload_with(ctx, &[])
    }

    /// Uploads the metadata together with `extra` u32 arrays in one new buffer, one write;
    /// `extra[i]` is bound through [`AttentionBuffers::extra`].
    pub fn upload_with(&self, ctx: &GpuContext, extra: &[&[u32]]) -> Result<AttentionBuffers> {
        AttentionBuffers::upload(ctx, self.shape(), &self.parts(extra))
    }

    /// Writes the metadata and `extra` into `into` in place, through `batch` (see
    /// [`AttentionBuffers::write`]).
    pub fn write_into(
        &self,
        batch: &mut Batch,
        into: &mut Option<AttentionBuffers>,
        extra: &[&[u32]],
    ) -> Result<()> {
        AttentionBuffers::write(batch, into, self.shape(), &self.parts(extra))
    }
}

/// What one step computes.
#[derive(Clone, Copy, Debug)]
pub struct FlatBatch<'a> {
    /// Each sequence's share, back to back.
    pub seqs: &'a [SeqSlice<'a>],
    /// `[num_tokens]` the token ids computed, in the order of `seqs`.
    pub tokens: &'a [u32],
    /// Indices into `tokens` of the rows whose logits are wanted; with none, row 0 is
    /// gathered anyway (harmless) to keep shapes simple.
    pub rows: &'a [u32],
    /// Also reduce the logits to their arg-max.
    pub argmax: bool,
    /// Block tables of KV cache groups 1.. (see [`AttentionMetadata::build_grouped`]);
    /// empty without groups.
    pub group_tables: &'a [Vec<Vec<u32>>],
}

/// Records the step's upload into `kept` (allocated, or grown, as needed) and its forward
/// pass into `batch`.
pub fn record_step(
    batch: &mut Batch,
    model: &GpuModel,
    pool: &KvPool,
    ws: &Workspace,
    kept: &mut Option<AttentionBuffers>,
    step: &FlatBatch,
) -> Result<()> {
    let meta =
        AttentionMetadata::build_grouped(step.seqs, step.group_tables, pool.layout.block_size)?;
    meta.write_into(batch, kept, &[step.tokens, step.rows])?;
    let missing = || GpuError::invalid("step metadata", "an extra array is missing");
    let bufs = kept.as_ref().ok_or_else(missing)?;
    let input = StepInput {
        tokens: bufs.extra(0).ok_or_else(missing)?,
        meta: bufs,
        rows: bufs.extra(1).ok_or_else(missing)?,
        num_rows: step.rows.len().max(1),
        argmax: step.argmax,
    };
    forward(batch, model, pool, ws, &input)
}
