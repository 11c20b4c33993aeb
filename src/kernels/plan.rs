//! The kernel plan: which kernel computes each operation of a forward pass, and which
//! operations are fused, chosen once per adapter and model. Every choice and the
//! measurement behind it is in this file; launchers take the kernel they run from the plan
//! and never look at the adapter themselves.
//!
//! Two rules hold for every field. A choice is made per adapter and model, never per step
//! or per call, unless both ways give the same bits: kernels that sum in different orders
//! would otherwise make a row's result depend on the rows that share its step (the engine
//! is batch-invariant: a request gives the same tokens alone or in a batch). And the
//! defaults are measured (`cargo bench --bench matmul`, `--bench paged_attention`, `--bench
//! engine`; the figures are in docs/BENCHMARKS.md); tests and benchmarks build other plans
//! to compare kernels.
//!
//! CPU adapters (lavapipe, llvmpipe) get plans of their own: they run a workgroup's
//! invocations as the lanes of a SIMD register, so workgroup memory and barriers, cheap on
//! a GPU, become per-lane gathers and loops there, and a kernel that gives each invocation
//! a whole row wins.

use super::choice::{ArgmaxKernel, AttentionKernel, MatmulKernel, RmsNormKernel};
use crate::error::{GpuError, Result};
use crate::formats::{KvDtype, WeightDtype};
use crate::gpu::GpuContext;

/// The sizes of a model that kernel choices depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelDims {
    /// The residual stream's width: the rows of the layer norms and the inner dimension
    /// of the q k v, gate-up and LM head projections.
    pub hidden: usize,
    pub head_dim: usize,
    /// Query heads times `head_dim`: the inner dimension of the output projection.
    pub q_width: usize,
    /// The MLP's width: the inner dimension of the down projection.
    pub intermediate: usize,
}

impl ModelDims {
    /// The inner dimensions of the model's projections.
    pub fn inner_dims(&self) -> [usize; 3] {
        [self.hidden, self.q_width, self.intermediate]
    }
}

/// The formats a model's kernels read: its weights' (every one it stores, in any layer)
/// and its KV pool's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Formats {
    pub weights: Vec<WeightDtype>,
    pub kv: KvDtype,
}

/// Every kernel choice of a forward pass over one model on one adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPlan {
    pub matmul: MatmulPlan,
    pub attention: AttentionKernel,
    /// The norms of the residual stream (rows of `hidden`).
    pub rms_norm: RmsNormKernel,
    /// The per-head q and k norms (rows of `head_dim`) of recipes that have them.
    pub qk_norm: RmsNormKernel,
    /// The greedy arg-max of the logits.
    pub argmax: ArgmaxKernel,
    /// Whether the MLP's gated activation (SiLU or GELU of the gate, times up) is computed
    /// by the down projection as it reads the gate-up output instead of by a pass of its
    /// own (`silu_mul`) into a buffer the down projection reads. Both give the same tokens
    /// up to rounding. Fused on GPUs: one pass over memory and one dispatch fewer per
    /// layer. Separate on CPU adapters, where the column kernels read each input row once
    /// per subgroup and workgroup, so a fused activation is computed many times over: on
    /// lavapipe fusion measured 1.1x faster at one row but 0.8-0.9x at 16 and 128 rows.
    pub fused_activation: bool,
    /// Where the norms before the q k v, gate-up and LM head projections are computed.
    pub norm_fusion: NormFusion,
}

/// Where the RMSNorms that precede projections are computed: by a pass of their own, or by
/// the projection as it reads the residual stream (one dispatch and one pass over `[tokens,
/// hidden]` fewer per norm).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormFusion {
    /// Every norm by a pass of its own (the default where the hidden size is not a multiple
    /// of 8, which the fused norm cannot read).
    Never,
    /// Every such norm by its projection: the default on GPUs, whose norm kernel sums a
    /// row's squares as a tree, so fused norms round differently from separate ones (the
    /// tokens agree up to rounding) and the choice must hold for every step.
    Always,
    /// Each call the faster way: fused for one-row steps of projections of at most
    /// [`SMALL_FUSED_WEIGHT`] weights, separate otherwise. Only where the residual norms
    /// run the lane-per-row kernel (CPU adapters), whose sums and scaling the fused norm
    /// repeats exactly, so both ways give the same bits (tested); the default there. On
    /// lavapipe the fused kernel's sum of squares, repeated by every workgroup, costs more
    /// than the separate pass for wider weights and more rows.
    WhereFaster,
}

/// Weights up to which [`NormFusion::WhereFaster`] fuses the norm into a one-row projection:
/// measured on lavapipe (`cargo bench --bench matmul -- --normed`), fusion won 1.2-1.5x for
/// 864 x 288 and 1536 x 288 weights and lost for 2304 x 768 and wider, where each of more
/// workgroups repeats the row's sum of squares.
pub const SMALL_FUSED_WEIGHT: usize = 1 << 19;

/// Rows up to which a GPU runs a column kernel instead of the tiled one: the tile's 64
/// rows would mostly compute padding below that (the column kernels run 8 rows a pass).
pub const SKINNY_MAX_M: usize = 8;

/// The projections' kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulPlan {
    /// The kernel of steps of at most [`MatmulPlan::few_rows`] rows.
    pub few: MatmulKernel,
    pub few_rows: usize,
    /// The kernel of larger steps.
    pub many: MatmulKernel,
    /// Output columns from which one-row passes of the vector column kernels give each
    /// invocation four columns instead of two (`WIDE` in `matmul_columns_vec.wgsl`);
    /// `None`: never. A speed choice only: it never changes a bit.
    pub wide_from: Option<usize>,
    /// Whether passes of several rows also give each invocation four columns from
    /// `wide_from` columns (`columns_body4` in `matmul_columns_vec.wgsl`, run by the
    /// `_wide` kernels). A speed choice only: it never changes a bit. On CPU adapters:
    /// measured on lavapipe 1.09-1.22x faster on f16 weights of 1,536 to 32,000 columns at
    /// 16 and 128 rows (`cargo bench --bench matmul -- --wide`; block formats 0.96-1.09x);
    /// GPUs run more rows than 8 by the tiled kernel.
    pub wide_passes: bool,
}

impl MatmulPlan {
    /// The projections of a model whose inner dimensions are `inner` on `ctx`. On GPUs the
    /// column kernels for decode-sized steps and the 64 x 64 tiles for larger ones; on CPU
    /// adapters the column kernels for every step, because there each workgroup-memory
    /// access of the tiles is a per-lane gather (the column kernels won at every row count
    /// measured on lavapipe, 1 to 256). The column kernel is the fastest one the adapter
    /// and every inner dimension allow: subgroup broadcasts of x, else 16-byte loads, else
    /// scalar loads.
    pub fn choose(ctx: &GpuContext, inner: &[usize]) -> MatmulPlan {
        let aligned = inner.iter().all(|k| k.is_multiple_of(8));
        let columns = [MatmulKernel::ColumnsSubgroup, MatmulKernel::ColumnsVec]
            .into_iter()
            .find(|kern| aligned && kern.supports(ctx, 8))
            .unwrap_or(MatmulKernel::Columns);
        let cpu = is_cpu(ctx);
        MatmulPlan {
            few: columns,
            few_rows: SKINNY_MAX_M,
            many: if cpu { columns } else { MatmulKernel::Tiled },
            wide_from: cpu.then(wide_min_columns),
            wide_passes: cpu,
        }
    }

    /// This plan with every step run by `kernel` (tests and benchmarks compare kernels).
    pub fn only(self, kernel: MatmulKernel) -> MatmulPlan {
        MatmulPlan {
            few: kernel,
            many: kernel,
            ..self
        }
    }

    /// The kernel of a step of `m` rows.
    pub fn kernel(&self, m: usize) -> MatmulKernel {
        if m <= self.few_rows {
            self.few
        } else {
            self.many
        }
    }

    /// Whether passes of `rows` rows over `columns` output columns give each invocation
    /// four.
    pub fn wide(&self, kernel: MatmulKernel, rows: usize, columns: usize) -> bool {
        kernel != MatmulKernel::Columns
            && (rows == 1 || self.wide_passes)
            && self.wide_from.is_some_and(|w| columns >= w)
    }
}

/// Output columns from which a CPU adapter's passes give each invocation four columns
/// instead of two: two workgroups of 256 columns per core of this machine (a CPU
/// adapter runs its workgroups on the host's cores; fewer would leave cores idle).
fn wide_min_columns() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    2 * 256 * cores
}

fn is_cpu(ctx: &GpuContext) -> bool {
    ctx.info.device_type == wgpu::DeviceType::Cpu
}

impl KernelPlan {
    /// The default plan for a model of `dims` on `ctx`.
    pub fn choose(ctx: &GpuContext, dims: &ModelDims) -> KernelPlan {
        let rms_norm = RmsNormKernel::choose(ctx, dims.hidden);
        let norm_fusion = match (norm_fusable(dims), rms_norm == RmsNormKernel::Lanes) {
            (false, _) => NormFusion::Never,
            (true, true) => NormFusion::WhereFaster,
            (true, false) => NormFusion::Always,
        };
        KernelPlan {
            matmul: MatmulPlan::choose(ctx, &dims.inner_dims()),
            attention: AttentionKernel::choose(ctx, dims.head_dim),
            rms_norm,
            qk_norm: RmsNormKernel::choose(ctx, dims.head_dim),
            argmax: ArgmaxKernel::choose(ctx),
            fused_activation: !is_cpu(ctx),
            norm_fusion,
        }
    }

    /// The plan for a model of `dims` whose weights and KV pool are stored in `formats`,
    /// on `ctx`: [`Self::choose`], refused with an error naming the kernel and the format
    /// where a chosen kernel cannot read one of them (or cannot run the shapes).
    pub fn for_model(ctx: &GpuContext, dims: &ModelDims, formats: &Formats) -> Result<KernelPlan> {
        let plan = Self::choose(ctx, dims);
        plan.check(ctx, dims)?;
        plan.check_formats(formats)?;
        Ok(plan)
    }

    /// Whether every kernel of this plan reads the formats it will be given.
    pub fn check_formats(&self, formats: &Formats) -> Result<()> {
        for kernel in [self.matmul.few, self.matmul.many] {
            if let Some(f) = formats.weights.iter().find(|&&f| !kernel.reads(f)) {
                return Err(GpuError::invalid(
                    "kernel plan",
                    format!("the projection kernel {kernel:?} cannot read weights in {f}"),
                ));
            }
        }
        if !self.attention.reads(formats.kv) {
            return Err(GpuError::invalid(
                "kernel plan",
                format!(
                    "the attention kernel {:?} cannot read a {} KV cache",
                    self.attention, formats.kv
                ),
            ));
        }
        Ok(())
    }

    /// Whether this plan can run a model of `dims` on `ctx`: every kernel supports its
    /// shapes there, and the norm fusion is one the model and kernels allow. An error for
    /// a hidden size the fused norm cannot read (not a multiple of 8), and for
    /// [`NormFusion::WhereFaster`] where the residual norm kernel sums differently from the
    /// fused norm: that choice per call would make a row's result depend on its step.
    pub fn check(&self, ctx: &GpuContext, dims: &ModelDims) -> Result<()> {
        let bad = |why: String| Err(GpuError::invalid("kernel plan", why));
        let m = &self.matmul;
        for kernel in [m.few, m.many] {
            if let Some(k) = dims
                .inner_dims()
                .into_iter()
                .find(|&k| !kernel.supports(ctx, k))
            {
                return bad(format!("{kernel:?} cannot compute k = {k} on this adapter"));
            }
        }
        if !self.attention.supports(ctx, dims.head_dim) {
            return bad(format!(
                "{:?} cannot run head_dim {} on this adapter",
                self.attention, dims.head_dim
            ));
        }
        for (kernel, width) in [(self.rms_norm, dims.hidden), (self.qk_norm, dims.head_dim)] {
            if !kernel.supports(width) {
                return bad(format!("{kernel:?} cannot normalise rows of {width}"));
            }
        }
        if self.norm_fusion != NormFusion::Never && !norm_fusable(dims) {
            return bad(format!("norms of {} elements cannot be fused", dims.hidden));
        }
        if self.norm_fusion == NormFusion::WhereFaster && self.rms_norm != RmsNormKernel::Lanes {
            return bad(format!(
                "{:?} norms round differently when fused; fuse always or never",
                self.rms_norm
            ));
        }
        Ok(())
    }

    /// Whether a projection of a weight of `weight_elems` elements over `m` rows computes
    /// its input's norm.
    pub fn fuse_norm(&self, m: usize, weight_elems: usize) -> bool {
        match self.norm_fusion {
            NormFusion::Never => false,
            NormFusion::Always => true,
            NormFusion::WhereFaster => m == 1 && weight_elems <= SMALL_FUSED_WEIGHT,
        }
    }
}

/// Whether the norms before projections of a model of `dims` can be fused into them (a
/// hidden size the normed-input matmul reads).
fn norm_fusable(dims: &ModelDims) -> bool {
    dims.hidden.is_multiple_of(8)
}

impl RmsNormKernel {
    /// The lane-per-row kernel on CPU adapters (where a workgroup's invocations are the
    /// lanes of a SIMD register), the workgroup one on GPUs and for rows the lane kernel
    /// cannot read.
    pub fn choose(ctx: &GpuContext, width: usize) -> RmsNormKernel {
        if is_cpu(ctx) && RmsNormKernel::Lanes.supports(width) {
            RmsNormKernel::Lanes
        } else {
            RmsNormKernel::Workgroup
        }
    }
}

impl AttentionKernel {
    /// On CPU adapters the lane-per-query kernel (1.8-5x faster than the subgroup kernel on
    /// lavapipe), query-tiled where subgroups allow (a 128-token prefill's attention 2.2x
    /// faster again); on GPUs the subgroup kernel where it can run, the plain one elsewhere.
    pub fn choose(ctx: &GpuContext, head_dim: usize) -> AttentionKernel {
        let cpu = is_cpu(ctx);
        if cpu && AttentionKernel::Tiles.supports(ctx, head_dim) {
            AttentionKernel::Tiles
        } else if cpu && AttentionKernel::Lanes.supports(ctx, head_dim) {
            AttentionKernel::Lanes
        } else if AttentionKernel::Subgroup.supports(ctx, head_dim) {
            AttentionKernel::Subgroup
        } else {
            AttentionKernel::Plain
        }
    }
}

impl ArgmaxKernel {
    /// The lane kernel on CPU adapters (where a 256-thread workgroup's barriers dominate,
    /// and their few cores are kept busy by one workgroup per row), the split one elsewhere
    /// (a GPU would run a one-sequence step's arg-max on one of its many cores).
    pub fn choose(ctx: &GpuContext) -> ArgmaxKernel {
        if is_cpu(ctx) {
            ArgmaxKernel::Lanes
        } else {
            ArgmaxKernel::Split
        }
    }
}
