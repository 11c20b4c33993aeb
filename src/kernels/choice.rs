//! The kernels there are for each operation the plan chooses, and what each supports: the
//! plan (`plan.rs`) picks among these per adapter and model; the launchers run the one they
//! are given. Kept apart from both so that neither imports the other's file.

use crate::formats::{GgmlType, KvDtype};
use crate::gpu::GpuContext;

/// The kernel that computes a matmul call (the plan's [`MatmulPlan`](super::plan::MatmulPlan) picks it). All of them
/// give bitwise the same result for a row, so the choice is purely about speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// `matmul.wgsl`: 64x64 tiles through workgroup memory.
    Tiled,
    /// `matmul_skinny.wgsl`: one thread per column, scalar loads; any k.
    Columns,
    /// `matmul_skinny_vec.wgsl`: one thread per column, 16-byte loads; k % 8 == 0.
    ColumnsVec,
    /// `matmul_skinny_sg.wgsl`: as `ColumnsVec`, x shared through subgroup broadcasts;
    /// k % 8 == 0 and subgroups of at least 8 invocations.
    ColumnsSubgroup,
}

impl MatmulKernel {
    /// Whether this kernel reads weights stored in `format`. Every projection kernel
    /// decodes every format this crate knows, as it reads (`shaders/weight_blocks.wgsl`); a
    /// format added to [`GgmlType`] must be placed here before a plan can use it.
    pub fn reads(self, format: GgmlType) -> bool {
        use GgmlType::*;
        match format {
            F32 | F16 | BF16 => true,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K => true,
            Q2_K | Q3_K | IQ4_NL | IQ4_XS | MXFP4 => true,
        }
    }

    /// Whether this kernel can compute a product with inner dimension `k` on `ctx`.
    pub fn supports(self, ctx: &GpuContext, k: usize) -> bool {
        match self {
            MatmulKernel::Tiled | MatmulKernel::Columns => true,
            MatmulKernel::ColumnsVec => k.is_multiple_of(8),
            MatmulKernel::ColumnsSubgroup => {
                k.is_multiple_of(8) && ctx.caps.subgroups && ctx.info.subgroup_min_size >= 8
            }
        }
    }
}

/// The kernel that normalises rows. They sum a row's squares in different orders, so a
/// model keeps to one per row width (the kernel plan's): a row's result then never depends
/// on how many rows share the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmsNormKernel {
    /// `rms_norm.wgsl`: a workgroup of 256 invocations per row, a tree of partial sums.
    Workgroup,
    /// `rms_norm_lanes.wgsl`: an invocation per row, eight rows per workgroup, the squares
    /// summed in eight chains (as the matmul kernels' normed inputs sum them); rows of a
    /// multiple of 8 elements.
    Lanes,
}

impl RmsNormKernel {
    /// Whether this kernel can normalise rows of `hidden` elements.
    pub fn supports(self, hidden: usize) -> bool {
        match self {
            RmsNormKernel::Workgroup => true,
            RmsNormKernel::Lanes => hidden.is_multiple_of(8),
        }
    }
}

/// The kernel that computes attention. All of them add the same terms in the same order
/// (`shaders/paged_attention_kv.wgsl` spells the arithmetic out), so the choice is only
/// about speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// `paged_attention.wgsl`: a workgroup per (query head, token); shared values read from
    /// workgroup memory one at a time.
    Plain,
    /// `paged_attention_sg.wgsl`: as `Plain`, shared values loaded 8 at a time and
    /// broadcast within subgroups; needs subgroups of at least 8 invocations and
    /// head_dim % 8 == 0.
    Subgroup,
    /// `paged_attention_lanes.wgsl`: an invocation per (query head, token), each running
    /// its query alone, eight per workgroup; needs head_dim % 8 == 0. Made for CPU
    /// adapters, where a workgroup's invocations are the lanes of a SIMD register.
    Lanes,
    /// `paged_attention_tiles.wgsl`: `Lanes` with the queries of a sequence taken eight at
    /// a time, each key and value row loaded once per eight queries and broadcast within
    /// the subgroup; needs head_dim % 8 == 0 and subgroups of at least 8 invocations. A
    /// batch in which no sequence has 8 query tokens (decode) runs the `Lanes` kernel,
    /// whose results are the same bit for bit.
    Tiles,
}

impl AttentionKernel {
    /// Whether this kernel reads a KV pool of `dtype`. Every attention kernel decodes every
    /// KV dtype (`shaders/paged_attention_kv.wgsl`); a dtype added to [`KvDtype`] must be
    /// placed here before a plan can use it.
    pub fn reads(self, dtype: KvDtype) -> bool {
        match dtype {
            KvDtype::F16 | KvDtype::F32 | KvDtype::Int8 | KvDtype::Int4 => true,
        }
    }

    /// Whether this kernel can run heads of `head_dim` on `ctx`.
    pub fn supports(self, ctx: &GpuContext, head_dim: usize) -> bool {
        match self {
            AttentionKernel::Plain => true,
            AttentionKernel::Lanes => head_dim.is_multiple_of(8),
            AttentionKernel::Subgroup | AttentionKernel::Tiles => {
                head_dim.is_multiple_of(8) && ctx.caps.subgroups && ctx.info.subgroup_min_size >= 8
            }
        }
    }
}

/// The kernel that reduces a row of logits to its arg-max. All pick the same token (the
/// first of equal maxima) for a row without NaN (with one, which token wins depends on how
/// the kernel splits the row); their logprobs may differ in the last bits (they add the
/// exponentials in different orders), so the choice is fixed per adapter (the kernel
/// plan's), never per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgmaxKernel {
    /// `argmax.wgsl`: 256 threads per row, tree reductions.
    Workgroup,
    /// `argmax_lanes.wgsl`: eight invocations per row, no tree; for CPU adapters.
    Lanes,
    /// `argmax_slices.wgsl` then `argmax_merge.wgsl`: a workgroup of 64 threads per slice
    /// of [`ARGMAX_SLICE`](super::logits::ARGMAX_SLICE) logits of a row, then one invocation per row merging its slices;
    /// needs a partials buffer ([`argmax_partials_len`](super::logits::argmax_partials_len)).
    Split,
}
