//! Launcher for the attention kernels, `shaders/paged_attention.wgsl`, its subgroup variant
//! `paged_attention_sg.wgsl`, the lane-per-query `paged_attention_lanes.wgsl` and its
//! query-tiled form `paged_attention_tiles.wgsl` (and their shard merge,
//! `shaders/paged_attention_reduce.wgsl`), and the GPU buffer of a flat batch's metadata
//! ([`AttentionBuffers`]; the host-side builder is [`crate::model::step::AttentionMetadata`]).

use super::{
    check_len, params, PAGED_ATTENTION, PAGED_ATTENTION_LANES, PAGED_ATTENTION_REDUCE,
    PAGED_ATTENTION_SG, PAGED_ATTENTION_TILES,
};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch, Bind, GpuContext};
use crate::pool::KvPool;

// The parameters of the attention kernels (tests/params_layout.rs checks each).
params!(PagedAttentionParams for PAGED_ATTENTION {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    shard_first_block: u32,
    shard_num_blocks: u32,
    scale: f32,
    num_shards: u32,
    shard_index: u32,
    has_sinks: u32,
    window: u32,
    softcap: f32,
    _pad1: u32,
    _pad2: u32,
});

params!(PagedAttentionReduceParams for PAGED_ATTENTION_REDUCE {
    num_tokens: u32,
    num_heads: u32,
    head_dim: u32,
    num_shards: u32,
});

/// A block-table entry that points nowhere: a block freed because every token in it left
/// every layer's sliding window. The kernels never read entries below a query's window.
pub const NO_BLOCK: u32 = u32::MAX;

/// Largest head size the attention kernels hold in workgroup or private memory.
pub const MAX_HEAD_DIM: usize = 256;

/// The sizes the attention kernels take from a flat batch's metadata (built by
/// [`crate::model::step::AttentionMetadata`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetadataShape {
    pub num_tokens: usize,
    pub max_blocks_per_seq: usize,
    /// The most query tokens any one sequence has.
    pub longest_query: usize,
    /// KV cache groups, each with block tables and a slot mapping of its own (0 counts as
    /// 1).
    pub num_groups: usize,
}

/// A flat batch's metadata on the GPU: one buffer, each array a section of it, in the order
/// token_pos, block_tables, slot_mapping, positions, then the block tables and slot
/// mapping of each further KV cache group, then extra u32 arrays (the engine adds the
/// step's token ids and sampled rows). [`Self::for_group`] gives a group's view.
#[derive(Clone, Debug)]
pub struct AttentionBuffers {
    pub num_tokens: usize,
    pub max_blocks_per_seq: usize,
    /// The most query tokens any one sequence has (the tiled kernel's work needs 8).
    pub longest_query: usize,
    /// KV cache groups (at least 1).
    num_groups: usize,
    buffer: wgpu::Buffer,
    /// (offset, size) in bytes: token_pos, block_tables, slot_mapping, positions, extras.
    sections: Vec<(u64, u64)>,
}

impl AttentionBuffers {
    /// Uploads the arrays `parts` (see the type's docs) in one new buffer, one write.
    pub fn upload(ctx: &GpuContext, shape: MetadataShape, parts: &[&[u8]]) -> Result<Self> {
        let (buffer, sections) = ctx.upload_sections("step metadata", parts)?;
        Ok(AttentionBuffers {
            num_tokens: shape.num_tokens,
            max_blocks_per_seq: shape.max_blocks_per_seq,
            longest_query: shape.longest_query,
            num_groups: shape.num_groups.max(1),
            buffer,
            sections,
        })
    }

    /// Writes the arrays `parts` into `into` in place, through `batch` (so the batch's work
    /// sees them and earlier steps' work does not), first allocating it, or a larger one,
    /// when they do not fit. Each section is bound at its full capacity, so the bindings,
    /// and the bind groups the step's kernels create from them, stay the same from step to
    /// step (the kernels take lengths from their parameters).
    pub fn write(
        batch: &mut Batch,
        into: &mut Option<Self>,
        shape: MetadataShape,
        parts: &[&[u8]],
    ) -> Result<()> {
        let fits = into.as_ref().is_some_and(|b| {
            b.sections.len() == parts.len()
                && parts
                    .iter()
                    .zip(&b.sections)
                    .all(|(p, &(_, cap))| p.len() as u64 <= cap)
        });
        if !fits {
            *into = Some(AttentionBuffers::with_capacity(batch.ctx(), parts)?);
        }
        let Some(bufs) = into.as_mut() else {
            return Err(GpuError::invalid(
                "step metadata",
                "no buffer after allocating one",
            ));
        };
        bufs.num_tokens = shape.num_tokens;
        bufs.max_blocks_per_seq = shape.max_blocks_per_seq;
        bufs.longest_query = shape.longest_query;
        bufs.num_groups = shape.num_groups.max(1);
        // One write from the first section to the end of the last one's bytes (the gaps
        // between sections are written with zeros).
        let end = parts
            .iter()
            .zip(&bufs.sections)
            .map(|(p, &(o, _))| o as usize + p.len())
            .max()
            .unwrap_or(0);
        let mut image = vec![0u8; end.next_multiple_of(4)];
        for (p, &(o, _)) in parts.iter().zip(&bufs.sections) {
            image[o as usize..o as usize + p.len()].copy_from_slice(p);
        }
        batch.write(&bufs.buffer, 0, &image)
    }

    /// A buffer with room for arrays of twice the lengths of `parts` (rounded up to a power
    /// of two), the block tables laid out last so that a step's write ends where its tables
    /// end.
    fn with_capacity(ctx: &GpuContext, parts: &[&[u8]]) -> Result<Self> {
        let align = u64::from(ctx.limits.min_storage_buffer_offset_alignment).max(4);
        let caps: Vec<u64> = parts
            .iter()
            .map(|p| (2 * p.len() as u64).next_power_of_two().max(64))
            .collect();
        let mut sections = vec![(0, 0); parts.len()];
        let mut at = 0u64;
        let order = (0..parts.len()).filter(|&i| i != 1).chain([1]);
        for i in order {
            at = at.next_multiple_of(align);
            sections[i] = (at, caps[i]);
            at += caps[i];
        }
        let buffer = ctx.storage_buffer("step metadata", at)?;
        Ok(AttentionBuffers {
            num_tokens: 0,
            max_blocks_per_seq: 0,
            longest_query: 0,
            num_groups: 1,
            buffer,
            sections,
        })
    }

    fn section(&self, i: usize) -> Bind<'_> {
        let (offset, size) = self.sections[i];
        Bind::Range {
            buffer: &self.buffer,
            offset,
            size,
        }
    }

    /// `[num_tokens][2]` u32: (sequence, position) of each query token.
    pub fn token_pos(&self) -> Bind<'_> {
        self.section(0)
    }

    /// `[num_seqs, max_blocks_per_seq]` u32 physical block ids.
    pub fn block_tables(&self) -> Bind<'_> {
        self.section(1)
    }

    /// `[num_tokens]` i32 pool slot each new token's K/V goes to.
    pub fn slot_mapping(&self) -> Bind<'_> {
        self.section(2)
    }

    /// `[num_tokens]` u32 position of each token (rope).
    pub fn positions(&self) -> Bind<'_> {
        self.section(3)
    }

    /// The `i`-th extra array (see the type's docs).
    pub fn extra(&self, i: usize) -> Option<Bind<'_>> {
        let at = 4 + 2 * (self.num_groups - 1) + i;
        (at < self.sections.len()).then(|| self.section(at))
    }

    /// The same metadata as KV cache group `g` sees it: its block tables and slot mapping
    /// in place of group 0's (`None` past the last group).
    pub fn for_group(&self, g: usize) -> Option<AttentionBuffers> {
        if g >= self.num_groups || self.sections.len() < 2 + 2 * self.num_groups {
            return None;
        }
        let mut view = self.clone();
        if g > 0 {
            view.sections[1] = self.sections[4 + 2 * (g - 1)];
            view.sections[2] = self.sections[5 + 2 * (g - 1)];
        }
        Some(view)
    }
}

pub use super::choice::AttentionKernel;

/// What an attention call computes besides plain causal attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOptions<'a> {
    /// Scores are `q · k * scale`.
    pub scale: f32,
    /// Sliding window: a query at position p sees positions `p - window + 1 ..= p`.
    pub window: Option<usize>,
    /// `cap * tanh(score / cap)` on the scaled scores.
    pub softcap: Option<f32>,
    /// `[num_heads]` f32: each head's sink logit, one more term of the softmax's sum with no
    /// value (gpt-oss).
    pub sinks: Option<&'a wgpu::Buffer>,
}

impl AttentionOptions<'_> {
    /// Full causal attention with scores scaled by `scale`.
    pub fn scaled(scale: f32) -> Self {
        AttentionOptions {
            scale,
            window: None,
            softcap: None,
            sinks: None,
        }
    }
}

/// One attention call: `out[t, h, :] = softmax(q[t, h] · K[seq(t), :pos(t)+1]ᵀ · scale) ·
/// V[...]` for every query token, with K/V of layer `layer` read from the pool through the
/// block tables. `q`, `out`: `[num_tokens, num_heads, head_dim]` f32. With a rotated pool,
/// `q` must be rotated alike and `out` comes out rotated (the forward pass does both).
#[derive(Clone, Copy, Debug)]
pub struct Attention<'a> {
    pub pool: &'a KvPool,
    pub layer: usize,
    pub meta: &'a AttentionBuffers,
    pub q: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    pub num_heads: usize,
    pub opts: AttentionOptions<'a>,
}

/// Records `call` computed by `kernel`.
pub fn paged_attention(batch: &mut Batch, kernel: AttentionKernel, call: &Attention) -> Result<()> {
    attention(batch, kernel, call, false)
}

/// The same attention over a contiguous cache, the baseline of the paged-vs-contiguous
/// benchmark: sequence `s`'s history is block `s` of a pool whose `block_size` is the
/// longest context, and the kernel reads no block table.
pub fn contiguous_attention(
    batch: &mut Batch,
    kernel: AttentionKernel,
    call: &Attention,
) -> Result<()> {
    attention(batch, kernel, call, true)
}

/// Invocations per workgroup of the lane-per-query kernel.
const LANES_WG: usize = 8;

fn attention(
    batch: &mut Batch,
    kernel: AttentionKernel,
    args: &Attention,
    contiguous: bool,
) -> Result<()> {
    const K: &str = "paged_attention";
    check_attention(batch, kernel, args)?;
    let &Attention {
        pool,
        meta,
        q,
        out,
        num_heads,
        ..
    } = args;
    let l = pool.layout;
    let t = meta.num_tokens;
    if t == 0 {
        return Ok(());
    }
    check_len(K, "q", q, t * num_heads * l.head_dim)?;
    check_len(K, "out", out, t * num_heads * l.head_dim)?;
    check_len(K, "token_pos", meta.token_pos(), 2 * t)?;
    let shards = pool.num_shards();
    let partial = if shards > 1 {
        let bytes = (shards * t * num_heads * (l.head_dim + 2) * 4) as u64;
        Some(pool.partials(batch.ctx(), bytes)?)
    } else {
        None
    };
    let target = partial.as_ref().unwrap_or(out);
    for shard in 0..shards {
        attention_shard(batch, kernel, args, contiguous, shard, target)?;
    }
    if let Some(partial) = &partial {
        let p = PagedAttentionReduceParams {
            num_tokens: t as u32,
            num_heads: num_heads as u32,
            head_dim: l.head_dim as u32,
            num_shards: shards as u32,
        };
        batch.dispatch(
            PAGED_ATTENTION_REDUCE,
            &[],
            &p,
            &[partial.into(), out.into()],
            [num_heads as u32, t as u32, 1],
        )?;
    }
    Ok(())
}

/// The launch's arguments describe one the kernel can run.
fn check_attention(batch: &Batch, kernel: AttentionKernel, args: &Attention) -> Result<()> {
    const K: &str = "paged_attention";
    let &Attention {
        pool,
        layer,
        num_heads,
        opts,
        ..
    } = args;
    if opts.window == Some(0) || opts.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(GpuError::invalid(
            K,
            format!(
                "window {:?} and softcap {:?} must be positive",
                opts.window, opts.softcap
            ),
        ));
    }
    let l = pool.layout;
    if layer >= l.num_layers {
        return Err(GpuError::invalid(
            K,
            format!("layer {layer} of {}", l.num_layers),
        ));
    }
    if num_heads == 0 || num_heads % l.num_kv_heads != 0 {
        return Err(GpuError::invalid(
            K,
            format!(
                "{num_heads} query heads is not a multiple of {} KV heads",
                l.num_kv_heads
            ),
        ));
    }
    if l.head_dim > MAX_HEAD_DIM {
        return Err(GpuError::invalid(
            K,
            format!("head_dim {} > {MAX_HEAD_DIM}", l.head_dim),
        ));
    }
    if !kernel.supports(batch.ctx(), l.head_dim) {
        return Err(GpuError::invalid(
            K,
            format!(
                "{kernel:?} cannot run head_dim {} on this adapter",
                l.head_dim
            ),
        ));
    }
    Ok(())
}

/// Attention over the blocks of pool shard `shard`, into `target` (the output, or the
/// shards' partials when there are several).
fn attention_shard(
    batch: &mut Batch,
    kernel: AttentionKernel,
    args: &Attention,
    contiguous: bool,
    shard: usize,
    target: &wgpu::Buffer,
) -> Result<()> {
    let &Attention {
        pool,
        layer,
        meta,
        q,
        num_heads,
        ..
    } = args;
    let l = pool.layout;
    let t = meta.num_tokens;
    let p = shard_params(args, shard);
    let overrides = [
        ("KV_DTYPE", l.dtype.code()),
        // Float pools ignore it; one value keeps them to one pipeline each.
        ("KV_GROUP", l.group_size().max(1) as f64),
        ("CONTIGUOUS", contiguous as u32 as f64),
        ("BLOCK_SIZE", l.block_size as f64),
    ];
    // Without sinks the binding is never read; q stands in.
    let sinks = args.opts.sinks.unwrap_or(q);
    let mut binds = vec![
        q.into(),
        pool.slab(layer, shard),
        meta.block_tables(),
        meta.token_pos(),
        target.into(),
    ];
    match kernel {
        AttentionKernel::Plain | AttentionKernel::Subgroup => {
            let source = if kernel == AttentionKernel::Plain {
                PAGED_ATTENTION
            } else {
                PAGED_ATTENTION_SG
            };
            binds.push(sinks.into());
            let grid = [num_heads as u32, t as u32, 1];
            batch.dispatch(source, &overrides, &p, &binds, grid)
        }
        AttentionKernel::Lanes | AttentionKernel::Tiles => {
            binds.push(pool.slab(layer, shard));
            binds.push(sinks.into());
            // Tiles: a workgroup per (block of 8 tokens, head); Lanes: per 8 (token, head)
            // pairs.
            let (source, groups) =
                if kernel == AttentionKernel::Tiles && meta.longest_query >= LANES_WG {
                    binds.push(q.into());
                    (PAGED_ATTENTION_TILES, t.div_ceil(LANES_WG) * num_heads)
                } else {
                    (PAGED_ATTENTION_LANES, (t * num_heads).div_ceil(LANES_WG))
                };
            let grid = grid_2d(
                groups as u32,
                batch.ctx().limits.max_compute_workgroups_per_dimension,
            );
            let mut overrides = overrides.to_vec();
            overrides.push(("HD", l.head_dim as f64));
            batch.dispatch(source, &overrides, &p, &binds, grid)
        }
    }
}

/// The kernel parameters of `args` over pool shard `shard`.
fn shard_params(args: &Attention, shard: usize) -> PagedAttentionParams {
    let &Attention {
        pool,
        meta,
        num_heads,
        opts,
        ..
    } = args;
    let l = pool.layout;
    let t = meta.num_tokens;
    let (first, count) = pool.shard_range(shard);
    PagedAttentionParams {
        num_tokens: t as u32,
        num_heads: num_heads as u32,
        num_kv_heads: l.num_kv_heads as u32,
        head_dim: l.head_dim as u32,
        block_size: l.block_size as u32,
        max_blocks_per_seq: meta.max_blocks_per_seq as u32,
        shard_first_block: first as u32,
        shard_num_blocks: count as u32,
        scale: opts.scale,
        num_shards: pool.num_shards() as u32,
        shard_index: shard as u32,
        window: opts.window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        softcap: opts.softcap.unwrap_or(0.0),
        has_sinks: u32::from(opts.sinks.is_some()),
        ..Default::default()
    }
}
