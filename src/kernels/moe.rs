//! Launchers for a mixture of experts' kernels: the routing (`shaders/moe_route.wgsl`: each
//! token's experts and weights, and the slots grouped by expert), one projection of every
//! expert over the slots routed to it (`shaders/moe_matmul.wgsl`), and the weighted sum of a
//! token's experts into the residual stream (`shaders/moe_combine.wgsl`). Nothing is read
//! back to the host between them: the expert matmul's grid covers every expert of the layer,
//! and an expert no token chose costs a workgroup that returns at once.

use super::choice::MatmulKernel;
use super::{check_len, groups, params, Weight, MOE_COMBINE, MOE_MATMUL, MOE_MATMUL_SG, MOE_ROUTE};
use crate::error::{GpuError, Result};
use crate::gpu::Batch;
use crate::model::arch::{Routing, MAX_EXPERTS, MAX_TOP_K};

params!(MoeRouteParams for MOE_ROUTE {
    tokens: u32,
    experts: u32,
    top_k: u32,
    _pad: u32,
});

params!(MoeMatmulParams for MOE_MATMUL {
    n: u32,
    k: u32,
    ldy: u32,
    n_offset: u32,
    expert_first: u32,
    in_div: u32,
    has_bias: u32,
    _pad1: u32,
});

params!(MoeCombineParams for MOE_COMBINE {
    tokens: u32,
    width: u32,
    top_k: u32,
    _pad: u32,
});

/// Where the routing of one step goes: `[slots]` expert and weight of each slot (slot
/// `t * top_k + j` is token t's j-th expert), `[experts + 1]` offsets into `[slots]` list,
/// which holds each expert's slots.
#[derive(Clone, Copy, Debug)]
pub struct Routes<'a> {
    pub expert: &'a wgpu::Buffer,
    pub weight: &'a wgpu::Buffer,
    pub offsets: &'a wgpu::Buffer,
    pub list: &'a wgpu::Buffer,
}

/// The shape of one mixture: experts, experts per token, and the routing rule.
#[derive(Clone, Copy, Debug)]
pub struct Mixture {
    pub experts: usize,
    pub top_k: usize,
    pub routing: Routing,
}

impl Mixture {
    fn check(&self) -> Result<()> {
        let ok = (1..=MAX_EXPERTS).contains(&self.experts)
            && (1..=MAX_TOP_K.min(self.experts)).contains(&self.top_k);
        if !ok {
            return Err(GpuError::invalid(
                "moe_route",
                format!(
                    "{} experts, {} per token (up to {MAX_EXPERTS} and {MAX_TOP_K})",
                    self.experts, self.top_k
                ),
            ));
        }
        Ok(())
    }
}

/// Routes `tokens` tokens from their router logits `[tokens, experts]` into `out`.
pub fn route(
    batch: &mut Batch,
    mixture: Mixture,
    logits: &wgpu::Buffer,
    tokens: usize,
    out: Routes<'_>,
) -> Result<()> {
    mixture.check()?;
    let slots = tokens * mixture.top_k;
    check_len("moe_route", "logits", logits, tokens * mixture.experts)?;
    check_len("moe_route", "slot experts", out.expert, slots)?;
    check_len("moe_route", "slot weights", out.weight, slots)?;
    check_len("moe_route", "offsets", out.offsets, mixture.experts + 1)?;
    check_len("moe_route", "list", out.list, slots)?;
    let p = MoeRouteParams {
        tokens: tokens as u32,
        experts: mixture.experts as u32,
        top_k: mixture.top_k as u32,
        _pad: 0,
    };
    let (routing, renormalize) = match mixture.routing {
        Routing::SoftmaxTopK { renormalize } => (0.0, renormalize),
        Routing::TopKSoftmax => (1.0, false),
    };
    let constants = [
        ("ROUTING", routing),
        ("RENORMALIZE", f64::from(u8::from(renormalize))),
    ];
    let storage = [
        logits.into(),
        out.expert.into(),
        out.weight.into(),
        out.offsets.into(),
        out.list.into(),
    ];
    batch.dispatch(MOE_ROUTE, &constants, &p, &storage, [1, 1, 1])
}

/// One projection of every expert: `weight` stacks the experts' `[n, k]` weights,
/// `[experts * n, k]` with `k % 8 == 0`, in buffers of whole experts. For each slot s routed to expert e,
/// `y[s, n_offset ..][.. n] = x[s / in_div] · W_eᵀ`; `y` is `[slots, ldy]`.
#[derive(Clone, Copy, Debug)]
pub struct ExpertMatmul<'a> {
    pub x: &'a wgpu::Buffer,
    pub weight: &'a Weight,
    pub n: usize,
    pub routes: Routes<'a>,
    pub y: &'a wgpu::Buffer,
    pub ldy: usize,
    pub n_offset: usize,
    /// `[experts * n]` f32: added to expert e's output column c at `e * n + c` (gpt-oss).
    pub bias: Option<&'a wgpu::Buffer>,
    /// `top_k` when x holds a row per token, 1 when a row per slot.
    pub in_div: usize,
    pub slots: usize,
    /// Run `moe_matmul_sg.wgsl` (x handed round in subgroups; the same results bit for
    /// bit); the adapter must have subgroups of at least 8 invocations
    /// ([`MatmulKernel::ColumnsSubgroup`](super::choice::MatmulKernel) runs there).
    pub subgroups: bool,
}

/// Records [`ExpertMatmul`]: one dispatch per buffer of the weight.
pub fn expert_matmul(batch: &mut Batch, call: &ExpertMatmul<'_>) -> Result<()> {
    const K: &str = "moe_matmul";
    let (w, n, k) = (call.weight, call.n, call.weight.cols);
    if n == 0 || !w.rows.is_multiple_of(n) || call.in_div == 0 || call.n_offset + n > call.ldy {
        return Err(GpuError::invalid(
            K,
            format!(
                "a weight of {} rows for experts of {n} (output columns {}..{} of {})",
                w.rows,
                call.n_offset,
                call.n_offset + n,
                call.ldy
            ),
        ));
    }
    if !k.is_multiple_of(8) {
        return Err(GpuError::invalid(
            K,
            format!("expert rows of {k} weights (the kernel reads 8 at a time)"),
        ));
    }
    if call.subgroups && !MatmulKernel::ColumnsSubgroup.supports(batch.ctx(), 8) {
        return Err(GpuError::invalid(
            K,
            "the subgroup kernel on an adapter without subgroups of 8",
        ));
    }
    let experts = w.rows / n;
    check_len(K, "x", call.x, call.slots.div_ceil(call.in_div) * k)?;
    check_len(K, "y", call.y, call.slots * call.ldy)?;
    check_len(K, "offsets", call.routes.offsets, experts + 1)?;
    check_len(K, "list", call.routes.list, call.slots)?;
    if let Some(b) = call.bias {
        check_len(K, "bias", b, w.rows)?;
    }
    for chunk in &w.chunks {
        if !chunk.first_row.is_multiple_of(n) || !chunk.rows.is_multiple_of(n) {
            return Err(GpuError::invalid(
                K,
                format!(
                    "a buffer of rows {}..{} splits an expert of {n} rows",
                    chunk.first_row,
                    chunk.first_row + chunk.rows
                ),
            ));
        }
        let p = MoeMatmulParams {
            n: n as u32,
            k: k as u32,
            ldy: call.ldy as u32,
            n_offset: call.n_offset as u32,
            expert_first: (chunk.first_row / n) as u32,
            in_div: call.in_div as u32,
            has_bias: u32::from(call.bias.is_some()),
            _pad1: 0,
        };
        let storage = [
            call.x.into(),
            (&chunk.buffer).into(),
            call.routes.offsets.into(),
            call.routes.list.into(),
            call.y.into(),
            call.bias.unwrap_or(&chunk.buffer).into(),
        ];
        let rows = group_rows(call.slots, experts);
        let constants = [("WEIGHT_DTYPE", chunk.dtype.code()), ("ROWS", rows as f64)];
        let columns_per_group = if rows == 1 { 256 } else { 128 };
        let grid = [groups(n, columns_per_group), (chunk.rows / n) as u32, 1];
        let source = if call.subgroups {
            MOE_MATMUL_SG
        } else {
            MOE_MATMUL
        };
        batch.dispatch(source, &constants, &p, &storage, grid)?;
    }
    Ok(())
}

/// The slots an expert kernel's invocation multiplies per read of its weights: the slots
/// per expert on average, rounded up to a power of two, from 1 (one token: each expert has
/// at most one slot) to 8.
fn group_rows(slots: usize, experts: usize) -> usize {
    slots
        .div_ceil(experts.max(1))
        .next_power_of_two()
        .clamp(1, 8)
}

/// `x[t] += sum_j weight[t * top_k + j] * y[t * top_k + j]` for `tokens` rows of `width`.
pub fn combine(
    batch: &mut Batch,
    y: &wgpu::Buffer,
    weights: &wgpu::Buffer,
    x: &wgpu::Buffer,
    tokens: usize,
    width: usize,
    top_k: usize,
) -> Result<()> {
    check_len("moe_combine", "y", y, tokens * top_k * width)?;
    check_len("moe_combine", "weights", weights, tokens * top_k)?;
    check_len("moe_combine", "x", x, tokens * width)?;
    let p = MoeCombineParams {
        tokens: tokens as u32,
        width: width as u32,
        top_k: top_k as u32,
        _pad: 0,
    };
    let grid = [groups(width, 256), tokens as u32, 1];
    batch.dispatch(
        MOE_COMBINE,
        &[],
        &p,
        &[y.into(), weights.into(), x.into()],
        grid,
    )
}
