//! One forward pass over a flat batch of tokens from many sequences, recorded into a
//! [`Batch`] (the engine submits once per step):
//!
//! ```text
//! embed (× scale) → per layer [rms_norm → q/k/v (+bias; one matmul) (→ per-head q/k
//!        rms_norm) → rope (→ rotate q, k) → reshape_and_cache → paged_attention (window,
//!        soft-cap) → o_proj (→ rms_norm) += residual → rms_norm → gate and up (one matmul)
//!        → act(gate) * up (on GPUs fused into down) → down (→ rms_norm) += residual]
//!       → final rms_norm → gather the sampling rows → LM head logits (→ soft-cap)
//!       (→ arg-max)
//! ```
//!
//! The norms before q k v, gate and up, and the LM head may be computed by those projections
//! as they read the residual stream ([`Workspace::norm_fusion`]); a fused final norm runs on
//! the gathered rows only.
//!
//! The parenthesised steps run when the architecture's [`Recipe`](super::arch::Recipe)
//! asks for them; the rotations run when the pool's [`KvRotation`] is Hadamard.

use super::gpu::{GpuLayer, GpuModel};
use super::ModelConfig;
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind, GpuContext};
use crate::kernels::logits::{argmax_partials_len, lm_head, ArgmaxKernel, LogitsBuffers};
use crate::kernels::matmul::{
    matmul, matmul_gated, matmul_normed, matmul_split, Norm, Output, Outputs,
};
use crate::kernels::paged_attention::{paged_attention, AttentionBuffers, AttentionOptions};
use crate::kernels::rms_norm::RmsNormKernel;
use crate::kernels::rotate::rotate_qk;
use crate::kernels::Weight;
use crate::kernels::{add, embedding, reshape_and_cache, rms_norm, rope, silu_mul};
use crate::nn::Activation;
use crate::pool::{KvPool, KvRotation};

/// Activation buffers for up to `max_tokens` tokens and `max_rows` sampled rows per step,
/// allocated once.
#[derive(Debug)]
pub struct Workspace {
    pub max_tokens: usize,
    pub max_rows: usize,
    x: wgpu::Buffer,       // [T, hidden] residual stream
    h: wgpu::Buffer,       // [T, hidden] normed
    q: wgpu::Buffer,       // [T, heads * head_dim]
    k: wgpu::Buffer,       // [T, kv_heads * head_dim]
    v: wgpu::Buffer,       // [T, kv_heads * head_dim]
    attn: wgpu::Buffer,    // [T, heads * head_dim]
    gate_up: wgpu::Buffer, // [T, 2 * intermediate]: gate then up, per token
    /// `[T, intermediate]`: the gated activation, where it is not fused into the down
    /// projection (see [`Workspace::set_fused_activation`]).
    act: Option<wgpu::Buffer>,
    /// Where the norms before q k v, gate-up and the LM head are computed (see
    /// [`Workspace::norm_fusion`]).
    norm_fusion: NormFusion,
    /// `[T, heads * head_dim]`, `[T, kv_heads * head_dim]`: q and k normed per head
    /// (recipes with q/k norms).
    qk_normed: Option<(wgpu::Buffer, wgpu::Buffer)>,
    /// `[T, hidden]`: an attention or MLP output on its way through its norm (recipes
    /// with sandwich norms).
    y: Option<wgpu::Buffer>,
    gathered: wgpu::Buffer, // [R, hidden]
    /// `[R, vocab]` logits of the sampled rows after [`forward`].
    pub logits: wgpu::Buffer,
    /// `[2, R]`: the arg-max token of each sampled row, then the bits of its logprob
    /// (see [`crate::kernels::logits::argmax`]).
    pub argmax: wgpu::Buffer,
    /// The arg-max's partials, where the adapter splits it across workgroups.
    argmax_partials: Option<wgpu::Buffer>,
}

impl Workspace {
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        max_tokens: usize,
        max_rows: usize,
    ) -> Result<Self> {
        let f = |label: &str, elems: usize| ctx.storage_buffer(label, (elems * 4) as u64);
        let (t, r) = (max_tokens, max_rows);
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        Ok(Workspace {
            max_tokens,
            max_rows,
            x: f("x", t * cfg.hidden_size)?,
            h: f("h", t * cfg.hidden_size)?,
            q: f("q", t * qd)?,
            k: f("k", t * kvd)?,
            v: f("v", t * kvd)?,
            attn: f("attn", t * qd)?,
            gate_up: f("gate up", 2 * t * cfg.intermediate_size)?,
            act: match fused_by_default(ctx) {
                true => None,
                false => Some(f("act", t * cfg.intermediate_size)?),
            },
            norm_fusion: norm_fusion_by_default(ctx, cfg),
            qk_normed: match cfg.recipe.qk_norm {
                true => Some((f("q normed", t * qd)?, f("k normed", t * kvd)?)),
                false => None,
            },
            y: match cfg.recipe.sandwich_norms {
                true => Some(f("y", t * cfg.hidden_size)?),
                false => None,
            },
            gathered: f("gathered", r * cfg.hidden_size)?,
            logits: f("logits", r * cfg.vocab_size)?,
            argmax: f("argmax", 2 * r)?,
            argmax_partials: match ArgmaxKernel::choose(ctx) {
                ArgmaxKernel::Split => Some(f(
                    "argmax partials",
                    argmax_partials_len(r, cfg.vocab_size),
                )?),
                _ => None,
            },
        })
    }

    /// Whether the MLP's gated activation (SiLU or GELU of the gate, times up) is computed
    /// by the down projection as it reads the gate-up output, instead of by a pass of its
    /// own (`silu_mul`) into a buffer the down projection then reads. Both give the same
    /// tokens up to rounding. The default: fused on GPUs (one pass over memory and one
    /// dispatch fewer per layer), separate on CPU adapters, where the column kernels read
    /// each input row once per subgroup and workgroup, so the fused activation is computed
    /// many times over: on lavapipe it measured 1.1x faster at one row but 0.8-0.9x at 16
    /// and 128 rows (docs/BENCHMARKS.md). A fixed choice per adapter, never per step, so a
    /// row's result does not depend on the rows beside it.
    pub fn fused_activation(&self) -> bool {
        self.act.is_none()
    }

    /// Chooses [`Self::fused_activation`] (tests run both ways on one adapter); turning
    /// fusion off allocates the activation buffer.
    pub fn set_fused_activation(
        &mut self,
        ctx: &GpuContext,
        cfg: &ModelConfig,
        on: bool,
    ) -> Result<()> {
        if on {
            self.act = None;
        } else if self.act.is_none() {
            let bytes = (self.max_tokens * cfg.intermediate_size * 4) as u64;
            self.act = Some(ctx.storage_buffer("act", bytes)?);
        }
        Ok(())
    }

    /// Where the RMSNorms before the q k v, gate-up and LM head projections are computed:
    /// by a pass of their own, or by those projections as they read the residual stream
    /// (one dispatch and one pass over `[tokens, hidden]` fewer per norm;
    /// [`crate::kernels::matmul::matmul_normed`]). See [`NormFusion`] for the default.
    pub fn norm_fusion(&self) -> NormFusion {
        self.norm_fusion
    }

    /// Whether a projection of `w` over `m` rows computes its input's norm.
    fn fuse_norm_here(&self, m: usize, w: &Weight) -> bool {
        match self.norm_fusion {
            NormFusion::Never => false,
            NormFusion::Always => true,
            NormFusion::WhereFaster => m == 1 && w.rows * w.cols <= SMALL_FUSED_WEIGHT,
        }
    }

    /// Chooses [`Self::norm_fusion`]. An error for a hidden size the fused norm cannot read
    /// (not a multiple of 8), and for [`NormFusion::WhereFaster`] where the adapter's norm
    /// kernel sums differently from the fused norm (a GPU's): that choice per call would
    /// make a row's result depend on the step it runs in.
    pub fn set_norm_fusion(
        &mut self,
        ctx: &GpuContext,
        cfg: &ModelConfig,
        mode: NormFusion,
    ) -> Result<()> {
        let bad = |why: String| Err(GpuError::invalid("forward", why));
        if mode != NormFusion::Never && !norm_fusable(cfg) {
            return bad(format!(
                "norms of {} elements cannot be fused",
                cfg.hidden_size
            ));
        }
        if mode == NormFusion::WhereFaster && !same_bits_fused(ctx, cfg) {
            return bad(
                "this adapter's norms round differently when fused; fuse always or never".into(),
            );
        }
        self.norm_fusion = mode;
        Ok(())
    }
}

/// Where a [`Workspace`] computes the norms that precede projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormFusion {
    /// Every norm by a pass of its own (the default where the hidden size is not a multiple
    /// of 8).
    Never,
    /// Every such norm by its projection: the default on GPUs, whose norm kernel sums a
    /// row's squares as a tree, so fused norms round differently from separate ones (the
    /// tokens agree up to rounding) and the choice must hold for every step.
    Always,
    /// Each call the faster way: fused for one-row steps of projections of at most
    /// [`SMALL_FUSED_WEIGHT`] weights, separate otherwise. Only where the adapter norms with
    /// the lane-per-row kernel (CPU adapters), whose sums and scaling the fused norm
    /// repeats exactly, so both ways give the same bits (tested); the default there. On
    /// lavapipe the fused kernel's sum of squares, repeated by every workgroup, costs more
    /// than the separate pass for wider weights and more rows (docs/BENCHMARKS.md).
    WhereFaster,
}

/// Whether `cfg`'s norms before projections can be fused into them (a hidden size the
/// normed-input matmul handles).
fn norm_fusable(cfg: &ModelConfig) -> bool {
    cfg.hidden_size.is_multiple_of(8)
}

/// Whether a fused norm gives the bits of `ctx`'s norm kernel.
fn same_bits_fused(ctx: &GpuContext, cfg: &ModelConfig) -> bool {
    RmsNormKernel::choose(ctx, cfg.hidden_size) == RmsNormKernel::Lanes
}

/// The default [`NormFusion`] for `cfg` on `ctx`.
fn norm_fusion_by_default(ctx: &GpuContext, cfg: &ModelConfig) -> NormFusion {
    match (norm_fusable(cfg), same_bits_fused(ctx, cfg)) {
        (false, _) => NormFusion::Never,
        (true, true) => NormFusion::WhereFaster,
        (true, false) => NormFusion::Always,
    }
}

/// Weights up to which [`NormFusion::WhereFaster`] fuses the norm into a one-row projection:
/// measured on lavapipe (`cargo bench --bench matmul -- --normed`), fusion won 1.2-1.5x for
/// 864 x 288 and 1536 x 288 weights and lost for 2304 x 768 and wider, where each of more
/// workgroups repeats the row's sum of squares.
pub const SMALL_FUSED_WEIGHT: usize = 1 << 19;

/// Fusing the gated activation into the down projection is the default on GPUs only.
fn fused_by_default(ctx: &GpuContext) -> bool {
    ctx.info.device_type != wgpu::DeviceType::Cpu
}

/// What one step computes.
#[derive(Debug)]
pub struct StepInput<'a> {
    /// `[num_tokens]` u32 token ids.
    pub tokens: Bind<'a>,
    pub meta: &'a AttentionBuffers,
    /// `[num_rows]` u32 indices of the tokens whose logits are wanted.
    pub rows: Bind<'a>,
    pub num_rows: usize,
    /// Also reduce the logits to their arg-max.
    pub argmax: bool,
}

/// Records a forward pass; after submission `ws.logits` holds `[num_rows, vocab]` logits and
/// `ws.argmax` (when asked) the greedy token of each row.
pub fn forward(
    batch: &mut Batch,
    model: &GpuModel,
    pool: &KvPool,
    ws: &Workspace,
    input: &StepInput,
) -> Result<()> {
    let c = &model.config;
    let t = input.meta.num_tokens;
    if t > ws.max_tokens || input.num_rows > ws.max_rows {
        return Err(GpuError::invalid(
            "forward",
            format!(
                "{t} tokens / {} rows exceed the workspace ({} / {})",
                input.num_rows, ws.max_tokens, ws.max_rows
            ),
        ));
    }
    let pass = Pass {
        model,
        pool,
        ws,
        input,
        t,
        eps: c.rms_norm_eps,
    };
    let scale = c.recipe.embed_scale.unwrap_or(1.0);
    embedding::scaled_embedding(batch, &model.embed, input.tokens, &ws.x, t, scale)?;
    for (i, l) in model.layers.iter().enumerate() {
        pass.attention_block(batch, i, l)?;
        pass.mlp_block(batch, l)?;
    }
    pass.lm_head(batch)
}

/// What every block of one forward pass reads: the model, the KV pool, the workspace and
/// the step's input, over `t` tokens.
struct Pass<'a> {
    model: &'a GpuModel,
    pool: &'a KvPool,
    ws: &'a Workspace,
    input: &'a StepInput<'a>,
    t: usize,
    eps: f32,
}

impl Pass<'_> {
    /// `x += [norm](o_proj(attention(rope(qkv(norm(x))))))`, writing the new keys and
    /// values of layer `i` into the pool on the way.
    fn attention_block(&self, batch: &mut Batch, i: usize, l: &GpuLayer) -> Result<()> {
        let (c, ws, t) = (&self.model.config, self.ws, self.t);
        let (qd, kvd) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let qkv = Outputs::Three([&ws.q, &ws.k, &ws.v], [qd, kvd]);
        let bias = l.qkv_bias.as_ref();
        self.normed(batch, "q k v", &l.input_norm, &l.qkv, bias, qkv)?;
        let (q, k) = self.qk_norms(batch, l)?;
        let meta = self.input.meta;
        let (heads, kv_heads) = (c.num_heads, c.num_kv_heads);
        let table = &self.model.ropes[l.rope];
        rope::rope(batch, table, meta.positions(), q, k, t, heads, kv_heads)?;
        if self.pool.rotation() == KvRotation::Hadamard {
            rotate_qk(batch, q, k, t * heads, t * kv_heads, c.head_dim)?;
        }
        let slots = meta.slot_mapping();
        reshape_and_cache::reshape_and_cache(batch, self.pool, i, k, &ws.v, slots, t)?;
        let rc = &c.recipe;
        let opts = AttentionOptions {
            scale: rc.attn_scale,
            window: rc.layers[i].window,
            softcap: rc.attn_softcap,
        };
        paged_attention(batch, self.pool, i, meta, q, &ws.attn, heads, opts)?;
        batch.profile_site(Some("o"));
        let post = l.post_attn_norm.as_ref();
        self.residual(batch, post, &ws.attn, None, &l.o, l.o_bias.as_ref())
    }

    /// q and k normed per head where the recipe has q/k norms, else as projected.
    fn qk_norms(&self, batch: &mut Batch, l: &GpuLayer) -> Result<(&wgpu::Buffer, &wgpu::Buffer)> {
        let (c, ws, t, eps) = (&self.model.config, self.ws, self.t, self.eps);
        match (&ws.qk_normed, &l.q_norm, &l.k_norm) {
            (Some((qn, kn)), Some(qw), Some(kw)) => {
                rms_norm::rms_norm(batch, &ws.q, qw, qn, t * c.num_heads, eps)?;
                rms_norm::rms_norm(batch, &ws.k, kw, kn, t * c.num_kv_heads, eps)?;
                Ok((qn, kn))
            }
            (_, None, None) => Ok((&ws.q, &ws.k)),
            // The recipe gives the weights and the buffers together (`Recipe::qk_norm`).
            _ => Err(GpuError::invalid(
                "forward",
                "q/k norm weights without the workspace buffers they write, or only one of them",
            )),
        }
    }

    /// `x += [norm](down(act(gate(norm(x))) * up(norm(x))))`.
    fn mlp_block(&self, batch: &mut Batch, l: &GpuLayer) -> Result<()> {
        let (c, ws) = (&self.model.config, self.ws);
        let gate_up = Outputs::One(&ws.gate_up);
        let bias = l.gate_up_bias.as_ref();
        self.normed(batch, "gate up", &l.mlp_norm, &l.gate_up, bias, gate_up)?;
        // The gated activation (SiLU or GELU of the gate, times up): its own pass, or
        // computed as the down projection reads the gate-up output.
        let activation = c.recipe.activation;
        let (down_in, gated) = match &ws.act {
            Some(act) => {
                let width = c.intermediate_size;
                silu_mul::gated_rows(batch, activation, &ws.gate_up, act, self.t, width)?;
                (act, None)
            }
            None => (&ws.gate_up, Some(activation)),
        };
        batch.profile_site(Some("down"));
        let post = l.post_mlp_norm.as_ref();
        self.residual(batch, post, down_in, gated, &l.down, l.down_bias.as_ref())?;
        batch.profile_site(None);
        Ok(())
    }

    /// The final norm, then the sampled rows' logits (and arg-max): the norm by the LM head
    /// as it reads the gathered rows, or over every token first.
    fn lm_head(&self, batch: &mut Batch) -> Result<()> {
        let (model, ws, input, t) = (self.model, self.ws, self.input, self.t);
        let head = model.lm_head();
        let (hidden, norm) = match ws.fuse_norm_here(input.num_rows, head) {
            true => (
                &ws.x,
                Some(Norm {
                    weight: &model.norm,
                    eps: self.eps,
                }),
            ),
            false => {
                rms_norm::rms_norm(batch, &ws.x, &model.norm, &ws.h, t, self.eps)?;
                (&ws.h, None)
            }
        };
        let out = LogitsBuffers {
            gathered: &ws.gathered,
            logits: &ws.logits,
            argmax: input.argmax.then_some(&ws.argmax),
            argmax_partials: ws.argmax_partials.as_ref(),
            softcap: model.config.recipe.final_softcap,
            norm,
        };
        // Gathering the sampled rows, the vocabulary projection and the arg-max.
        batch.profile_site(Some("lm head"));
        let r = lm_head(batch, hidden, t, input.rows, input.num_rows, head, out);
        batch.profile_site(None);
        r
    }

    /// Writes a projection's output into the residual stream: accumulated by the matmul, or
    /// through its norm and an add. With `gated`, `a` holds each row's gate then its up, and
    /// the projection's input is their gated activation.
    fn residual(
        &self,
        batch: &mut Batch,
        norm: Option<&Weight>,
        a: &wgpu::Buffer,
        gated: Option<Activation>,
        w: &Weight,
        bias: Option<&wgpu::Buffer>,
    ) -> Result<()> {
        let (ws, t) = (self.ws, self.t);
        let project = |batch: &mut Batch, y: &wgpu::Buffer, out: Output| match gated {
            Some(act) => matmul_gated(batch, a, act, w, bias, y, t, out),
            None => matmul(batch, a, w, bias, y, t, out),
        };
        match (norm, &ws.y) {
            (Some(norm), Some(y)) => {
                project(batch, y, Output::Overwrite)?;
                batch.profile_site(None);
                rms_norm::rms_norm(batch, y, norm, &ws.h, t, self.eps)?;
                add::add(batch, &ws.x, &ws.h, t * self.model.config.hidden_size)
            }
            (None, _) => project(batch, &ws.x, Output::Accumulate),
            // The recipe gives both or neither (`Recipe::sandwich_norms`).
            (Some(_), None) => Err(GpuError::invalid(
                "forward",
                "a post-norm weight without the workspace buffer it writes through",
            )),
        }
    }

    /// A projection of the residual stream's norm: normed as the matmul reads it, or by a
    /// pass of its own into `ws.h`.
    fn normed(
        &self,
        batch: &mut Batch,
        site: &'static str,
        norm: &Weight,
        w: &Weight,
        bias: Option<&wgpu::Buffer>,
        outputs: Outputs<'_>,
    ) -> Result<()> {
        let (ws, t, eps) = (self.ws, self.t, self.eps);
        let fused = ws.fuse_norm_here(t, w);
        batch.profile_site(None);
        if !fused {
            rms_norm::rms_norm(batch, &ws.x, norm, &ws.h, t, eps)?;
        }
        batch.profile_site(Some(site));
        let r = match (fused, outputs) {
            (true, _) => {
                let norm = Norm { weight: norm, eps };
                matmul_normed(batch, &ws.x, norm, w, bias, outputs, t, Output::Overwrite)
            }
            (false, Outputs::One(y)) => matmul(batch, &ws.h, w, bias, y, t, Output::Overwrite),
            (false, Outputs::Three(ys, widths)) => {
                matmul_split(batch, &ws.h, w, bias, ys, widths, t)
            }
        };
        batch.profile_site(None);
        r
    }
}
