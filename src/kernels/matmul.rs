//! Launchers for the projection kernels: y = x · Wᵀ (+ bias) (+ y) for a Hugging Face
//! `[out, in]` weight, one dispatch per weight chunk.
//!
//! Batch invariance by construction: in every kernel each output element is one thread's
//! sequential sum over k, in increasing k, with the same expression, so a row's result does
//! not depend on how many other rows share the step or which kernel ran. That makes the
//! engine batch-invariant (a request produces the same tokens alone or in a batch, prefilled
//! or recomputed). A parallel reduction over k would be faster on a GPU but would round
//! differently.
//!
//! Two kernel families (see [`MatmulKernel`]): `matmul.wgsl` tiles 64 rows by 64 columns
//! through workgroup memory (prefill on GPUs); the column kernels (`matmul_skinny*.wgsl`)
//! give each thread one output column and read its weights once per 8 rows of x, which
//! avoids the tile's wasted arithmetic when few rows run (decode). Which runs when is the
//! kernel plan's choice ([`MatmulPlan`]).

use super::plan::MatmulPlan;
use super::{
    check_len, groups, params, Weight, MATMUL, MATMUL_SKINNY, MATMUL_SKINNY_SG,
    MATMUL_SKINNY_SG_WIDE, MATMUL_SKINNY_VEC, MATMUL_SKINNY_VEC_WIDE,
};
use crate::error::{GpuError, Result};
use crate::gpu::{grid_2d, Batch, Bind, GpuContext, KernelSource};
use crate::nn::Activation;

// One parameter block for every matmul kernel (tests/params_layout.rs checks all four).
params!(MatmulParams for MATMUL {
    m: u32,
    n: u32,
    k: u32,
    n_offset: u32,
    ldy: u32,
    _pad2: u32,
    _pad3: u32,
    first_row: u32,
    split1: u32,
    split2: u32,
    eps: f32,
    _pad1: u32,
});

pub use super::choice::MatmulKernel;

/// How the product combines with what `y` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Overwrite,
    /// y += x · Wᵀ: the residual connection fused into the projection.
    Accumulate,
}

/// Where a matmul's output columns go.
#[derive(Clone, Copy, Debug)]
pub enum Outputs<'a> {
    /// All of them to one `[m, out]` buffer.
    One(&'a wgpu::Buffer),
    /// A stacked weight's three projections (q, k and v): columns `[0, widths[0])` to the
    /// first buffer, the next `widths[1]` to the second and the rest to the third, each
    /// `[m, its width]`; each output is bitwise what a matmul of that projection alone
    /// gives.
    Three([&'a wgpu::Buffer; 3], [usize; 2]),
}

/// The RMSNorm of a projection's input, computed by the projection as it reads `x`.
#[derive(Clone, Copy, Debug)]
pub struct Norm<'a> {
    /// The `[1, in]` norm weight (with Gemma's `1 +` already applied at load).
    pub weight: &'a Weight,
    pub eps: f32,
}

/// What a matmul reads as its input (the kernels' `GATED` and `NORM`).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// `[m, in]` f32, as it is.
    Plain(&'a wgpu::Buffer),
    /// `[m, 2 * in]` f32, each row's gate then its up (the stacked gate-up projection's
    /// output); the product reads `act(gate) * up`: the MLP's gated activation fused into
    /// the down projection, with the expressions of `silu_mul` (tests/kernels_matmul.rs
    /// checks it against the two calls it replaces).
    Gated(&'a wgpu::Buffer, Activation),
    /// `[m, in]` f32 read as `rms_norm(x)`: the RMSNorm before a projection (the q k v,
    /// gate-up and LM head inputs) fused into it. Each row's norm scale is computed as
    /// `rms_norm_lanes.wgsl` computes it and applied to x as it is read, so the result is
    /// bitwise that of [`RmsNormKernel::Lanes`](super::rms_norm::RmsNormKernel::Lanes)
    /// followed by the matmul (tests/kernels_matmul.rs checks it); one dispatch and one
    /// pass over `[m, in]` fewer. Needs `in % 8 == 0`.
    Normed(&'a wgpu::Buffer, Norm<'a>),
}

/// One matmul: `outputs[m, out] (+)= input · weight[out, in]ᵀ + bias[out]` for a Hugging
/// Face `[out, in]` weight; `bias`: `[out]` f32.
#[derive(Clone, Copy, Debug)]
pub struct Matmul<'a> {
    pub input: Input<'a>,
    pub weight: &'a Weight,
    pub bias: Option<&'a wgpu::Buffer>,
    pub outputs: Outputs<'a>,
    pub m: usize,
    pub output: Output,
}

impl<'a> Matmul<'a> {
    /// `y[m, out] = x[m, in] · weight[out, in]ᵀ`, no bias.
    pub fn new(x: &'a wgpu::Buffer, weight: &'a Weight, y: &'a wgpu::Buffer, m: usize) -> Self {
        Matmul {
            input: Input::Plain(x),
            weight,
            bias: None,
            outputs: Outputs::One(y),
            m,
            output: Output::Overwrite,
        }
    }

    /// Plus `bias[out]`, where given.
    pub fn bias(self, bias: Option<&'a wgpu::Buffer>) -> Self {
        Matmul { bias, ..self }
    }

    /// Combined with what the output holds as `output` says.
    pub fn output(self, output: Output) -> Self {
        Matmul { output, ..self }
    }

    /// Into `outputs` instead of the one buffer given to [`Matmul::new`].
    pub fn outputs(self, outputs: Outputs<'a>) -> Self {
        Matmul { outputs, ..self }
    }

    /// The input read as [`Input::Gated`] by `act`.
    pub fn gated(self, act: Activation) -> Self {
        Matmul {
            input: Input::Gated(self.x(), act),
            ..self
        }
    }

    /// The input read as [`Input::Normed`] by `norm`.
    pub fn normed(self, norm: Norm<'a>) -> Self {
        Matmul {
            input: Input::Normed(self.x(), norm),
            ..self
        }
    }

    fn x(&self) -> &'a wgpu::Buffer {
        match self.input {
            Input::Plain(x) | Input::Gated(x, _) | Input::Normed(x, _) => x,
        }
    }
}

/// Records `call` with the kernel `plan` gives its row count: for each weight chunk the
/// tiled pass or the column passes (`column_passes`).
pub fn matmul(batch: &mut Batch, plan: &MatmulPlan, call: &Matmul<'_>) -> Result<()> {
    const K: &str = "matmul";
    let &Matmul {
        input,
        weight,
        bias,
        outputs,
        m,
        output,
    } = call;
    let kernel = plan.kernel(m);
    let (n_total, k) = (weight.rows, weight.cols);
    if m == 0 {
        return Ok(());
    }
    if !kernel.supports(batch.ctx(), k) {
        return Err(GpuError::invalid(
            K,
            format!("{kernel:?} cannot compute k = {k} on this adapter"),
        ));
    }
    let (x, gated, norm) = checked_input(input, m, k)?;
    let (ys, split1, split2) = checked_outputs(batch.ctx(), outputs, m, n_total)?;
    if let Some(b) = bias {
        check_len(K, "bias", b, n_total)?;
    }
    let store = store_bits(bias.is_some(), output, split1);
    for chunk in &weight.chunks {
        let p = MatmulParams {
            m: m as u32,
            n: chunk.rows as u32,
            k: k as u32,
            n_offset: chunk.first_row as u32,
            ldy: n_total as u32,
            first_row: 0,
            split1: split1 as u32,
            split2: split2 as u32,
            eps: norm.map_or(0.0, |n| n.eps),
            ..Default::default()
        };
        // The bias and norm bindings must be valid even when unused.
        let bias_buf = bias.unwrap_or(&chunk.buffer);
        let norm_buf = norm.map_or(&chunk.buffer, |n| &n.weight.chunks[0].buffer);
        let storage = [
            x.into(),
            (&chunk.buffer).into(),
            bias_buf.into(),
            ys[0].into(),
            ys[1].into(),
            ys[2].into(),
            norm_buf.into(),
        ];
        let constants = [
            ("WEIGHT_DTYPE", chunk.dtype.code()),
            ("GATED", gated),
            ("NORM", norm.is_some() as u32 as f64),
            ("NORM_DTYPE", norm.map_or(0.0, |n| n.weight.dtype().code())),
            ("STORE", store as f64),
        ];
        let source = match kernel {
            MatmulKernel::Tiled => {
                tiled_pass(batch, chunk.rows, m, &constants, &p, &storage)?;
                continue;
            }
            MatmulKernel::Columns => MATMUL_SKINNY,
            MatmulKernel::ColumnsVec => MATMUL_SKINNY_VEC,
            MatmulKernel::ColumnsSubgroup => MATMUL_SKINNY_SG,
        };
        let call = ColumnCall {
            kernel,
            source,
            rows: chunk.rows,
            params: p,
            constants: &constants,
        };
        column_passes(batch, plan, &call, &storage, m)?;
    }
    Ok(())
}

/// matmul_store.wgsl's `STORE` bits: bias, accumulate, and the split into three outputs.
fn store_bits(bias: bool, output: Output, split1: usize) -> u32 {
    u32::from(bias) | u32::from(output == Output::Accumulate) << 1 | u32::from(split1 != 0) << 2
}

/// The tiled kernel over `m` rows of a chunk of `cols` output columns: a workgroup per
/// 64 x 64 tile.
fn tiled_pass(
    batch: &mut Batch,
    cols: usize,
    m: usize,
    constants: &[(&'static str, f64)],
    p: &MatmulParams,
    storage: &[Bind<'_>],
) -> Result<()> {
    let max_dim = batch.ctx().limits.max_compute_workgroups_per_dimension;
    let grid = [groups(cols, 64), groups(m, 64), 1];
    if grid[0] > max_dim || grid[1] > max_dim {
        return Err(GpuError::invalid(
            "matmul",
            format!("{m} x {cols} outputs in one call"),
        ));
    }
    batch.dispatch(MATMUL, constants, p, storage, grid)
}

/// The input buffer, the `GATED` code and the norm of `input`, checked against `m` rows
/// of `k` values.
fn checked_input<'a>(
    input: Input<'a>,
    m: usize,
    k: usize,
) -> Result<(&'a wgpu::Buffer, f64, Option<Norm<'a>>)> {
    const K: &str = "matmul";
    let (x, gated, norm) = match input {
        Input::Plain(x) => (x, 0.0, None),
        Input::Gated(x, Activation::Silu) => (x, 1.0, None),
        Input::Gated(x, Activation::GeluTanh) => (x, 2.0, None),
        Input::Gated(_, act @ Activation::ClampedSwiglu { .. }) => {
            return Err(GpuError::invalid(
                K,
                format!("{act:?} is computed by its own pass, not fused into a projection"),
            ))
        }
        Input::Normed(x, norm) => (x, 0.0, Some(norm)),
    };
    if gated != 0.0 {
        check_len(K, "gate up", x, 2 * m * k)?;
    } else {
        check_len(K, "x", x, m * k)?;
    }
    if let Some(norm) = norm {
        let w = norm.weight;
        if w.rows * w.cols != k || w.chunks.len() != 1 || w.dtype().is_block() {
            return Err(GpuError::invalid(
                K,
                format!(
                    "a norm of {} x {} {} in {} buffers before an input of {k}",
                    w.rows,
                    w.cols,
                    w.dtype().name(),
                    w.chunks.len()
                ),
            ));
        }
        if !k.is_multiple_of(8) {
            return Err(GpuError::invalid(
                K,
                format!("a normed input needs k % 8 == 0, not k = {k}"),
            ));
        }
    }
    Ok((x, gated, norm))
}

/// The three output bindings and the two split columns of `outputs`, checked against `m`
/// rows of `n_total` columns. One output leaves y1 and y2 to the context's spare buffers,
/// which the kernel never writes then.
fn checked_outputs<'a>(
    ctx: &'a GpuContext,
    outputs: Outputs<'a>,
    m: usize,
    n_total: usize,
) -> Result<([&'a wgpu::Buffer; 3], usize, usize)> {
    const K: &str = "matmul";
    match outputs {
        Outputs::One(y) => {
            check_len(K, "y", y, m * n_total)?;
            Ok(([y, ctx.spare(0), ctx.spare(1)], 0, 0))
        }
        Outputs::Three(ys, [w0, w1]) => {
            if w0 == 0 || w1 == 0 || w0 + w1 >= n_total {
                return Err(GpuError::invalid(
                    K,
                    format!("outputs of {w0}, {w1} and the rest of {n_total} columns"),
                ));
            }
            for (i, (y, w)) in ys.iter().zip([w0, w1, n_total - w0 - w1]).enumerate() {
                check_len(K, ["y", "y1", "y2"][i], *y, m * w)?;
            }
            Ok((ys, w0, w0 + w1))
        }
    }
}

/// One weight chunk's call of a column kernel.
struct ColumnCall<'a> {
    kernel: MatmulKernel,
    source: KernelSource,
    /// Output columns of the chunk.
    rows: usize,
    params: MatmulParams,
    constants: &'a [(&'static str, f64)],
}

/// A column kernel over `m` rows: one dispatch of 8-row passes over the first m - m % 8
/// rows, one for the remaining rows in a pass of the next power of two (a pipeline per
/// pass size), so that 9 rows do not cost two full passes.
fn column_passes(
    batch: &mut Batch,
    plan: &MatmulPlan,
    call: &ColumnCall,
    storage: &[Bind<'_>],
    m: usize,
) -> Result<()> {
    let max_dim = batch.ctx().limits.max_compute_workgroups_per_dimension;
    let full = m - m % 8;
    // (first row, end row, rows per pass)
    let mut passes = Vec::with_capacity(2);
    if full > 0 {
        passes.push((0, full, 8));
    }
    if full < m {
        passes.push((full, m, (m - full).next_power_of_two()));
    }
    for (first_row, end_row, rows) in passes {
        // Columns per workgroup: 64, or where each invocation computes two, 128; 256 in the
        // wide one-row passes (see WIDE in matmul_columns_vec.wgsl).
        let wide = plan.wide(call.kernel, rows, call.rows);
        let per_group = match (call.kernel, wide) {
            (MatmulKernel::Columns, _) => 64,
            (_, true) => 256,
            _ => 128,
        };
        let grid = grid_2d(groups(call.rows, per_group), max_dim);
        let p = MatmulParams {
            m: end_row as u32,
            first_row: first_row as u32,
            ..call.params
        };
        let mut constants = call.constants.to_vec();
        constants.push(("ROWS", rows as f64));
        if call.kernel != MatmulKernel::Columns {
            constants.push(("WIDE", wide as u32 as f64));
        }
        // Wide passes of several rows have entry points of their own (columns_body4 in
        // matmul_columns_vec.wgsl).
        let source = match (call.kernel, wide && rows > 1) {
            (MatmulKernel::ColumnsVec, true) => MATMUL_SKINNY_VEC_WIDE,
            (MatmulKernel::ColumnsSubgroup, true) => MATMUL_SKINNY_SG_WIDE,
            _ => call.source,
        };
        batch.dispatch(source, &constants, &p, storage, grid)?;
    }
    Ok(())
}
