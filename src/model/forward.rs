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
//! Which kernel runs each step, and which steps are fused, is the workspace's
//! [`KernelPlan`]. The norms before q k v, gate and up, and the LM head may be computed by
//! those projections as they read the residual stream ([`KernelPlan::norm_fusion`]); a
//! fused final norm runs on the gathered rows only.
//!
//! The parenthesised steps run when the architecture's [`Recipe`](super::arch::Recipe)
//! asks for them; the rotations run when the pool's [`KvRotation`] is Hadamard.

use super::gpu::{GpuExperts, GpuLayer, GpuMlp, GpuModel};
use super::ModelConfig;
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind, GpuContext};
use crate::kernels::logits::{argmax_partials_len, lm_head, ArgmaxKernel, LogitsBuffers};
use crate::kernels::matmul::{matmul, Matmul, MatmulKernel, Norm, Output, Outputs};
use crate::kernels::moe::{self, ExpertMatmul, Mixture, Routes};
use crate::kernels::paged_attention::{
    paged_attention, Attention, AttentionBuffers, AttentionOptions,
};
use crate::kernels::rotate::rotate_qk;
use crate::kernels::{add, embedding, reshape_and_cache, rms_norm, rope, silu_mul};
use crate::kernels::{KernelPlan, Weight};
use crate::nn::Activation;
use crate::pool::{KvPool, KvRotation};

/// Activation buffers for up to `max_tokens` tokens and `max_rows` sampled rows per step,
/// allocated once for one kernel plan.
#[derive(Debug)]
pub struct Workspace {
    pub max_tokens: usize,
    pub max_rows: usize,
    /// The kernels and fusions of the forward passes run in this workspace.
    plan: KernelPlan,
    x: wgpu::Buffer,       // [T, hidden] residual stream
    h: wgpu::Buffer,       // [T, hidden] normed
    q: wgpu::Buffer,       // [T, heads * head_dim]
    k: wgpu::Buffer,       // [T, kv_heads * head_dim]
    v: wgpu::Buffer,       // [T, kv_heads * head_dim]
    attn: wgpu::Buffer,    // [T, heads * head_dim]
    gate_up: wgpu::Buffer, // [T, 2 * intermediate]: gate then up, per token (dense layers)
    /// `[T, intermediate]`: the gated activation, where the plan does not fuse it into the
    /// down projection ([`KernelPlan::fused_activation`]).
    act: Option<wgpu::Buffer>,
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
    /// The arg-max's partials, where the plan splits it across workgroups.
    argmax_partials: Option<wgpu::Buffer>,
    /// A mixture of experts' buffers, for models with sparse layers.
    moe: Option<MoeBuffers>,
}

/// What a mixture of experts computes through, for `T` tokens of `S = T * top_k` slots.
#[derive(Debug)]
struct MoeBuffers {
    logits: wgpu::Buffer,  // [T, experts] router logits
    expert: wgpu::Buffer,  // [S] u32: each slot's expert
    weight: wgpu::Buffer,  // [S] f32: each slot's routing weight
    offsets: wgpu::Buffer, // [experts + 1] u32
    list: wgpu::Buffer,    // [S] u32: the slots by expert
    gate_up: wgpu::Buffer, // [S, 2 * intermediate]
    act: wgpu::Buffer,     // [S, intermediate]
    out: wgpu::Buffer,     // [S, hidden]
}

impl MoeBuffers {
    fn routes(&self) -> Routes<'_> {
        Routes {
            expert: &self.expert,
            weight: &self.weight,
            offsets: &self.offsets,
            list: &self.list,
        }
    }
}

impl Workspace {
    /// A workspace for the default kernel plan of `cfg` on `ctx`.
    pub fn new(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        max_tokens: usize,
        max_rows: usize,
    ) -> Result<Self> {
        let plan = KernelPlan::choose(ctx, &cfg.dims());
        Self::with_plan(ctx, cfg, plan, max_tokens, max_rows)
    }

    /// A workspace whose passes run `plan` (tests and benchmarks compare plans); an error
    /// where `plan` cannot run `cfg` on `ctx` ([`KernelPlan::check`]).
    pub fn with_plan(
        ctx: &GpuContext,
        cfg: &ModelConfig,
        plan: KernelPlan,
        max_tokens: usize,
        max_rows: usize,
    ) -> Result<Self> {
        plan.check(ctx, &cfg.dims())?;
        let f = |label: &str, elems: usize| ctx.storage_buffer(label, (elems * 4) as u64);
        let (t, r) = (max_tokens, max_rows);
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        // The dense MLP's buffers, for the layers that have one (a model whose every layer
        // is a mixture, Mixtral or gpt-oss, needs none: one element stands in).
        let dense = match cfg.recipe.layers.iter().all(|l| l.sparse) {
            true => 0,
            false => t * cfg.intermediate_size,
        };
        Ok(Workspace {
            max_tokens,
            max_rows,
            plan,
            x: f("x", t * cfg.hidden_size)?,
            h: f("h", t * cfg.hidden_size)?,
            q: f("q", t * qd)?,
            k: f("k", t * kvd)?,
            v: f("v", t * kvd)?,
            attn: f("attn", t * qd)?,
            gate_up: f("gate up", (2 * dense).max(1))?,
            act: match plan.fused_activation {
                true => None,
                false => Some(f("act", dense.max(1))?),
            },
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
            argmax_partials: match plan.argmax {
                ArgmaxKernel::Split => Some(f(
                    "argmax partials",
                    argmax_partials_len(r, cfg.vocab_size),
                )?),
                _ => None,
            },
            moe: match cfg.recipe.moe {
                Some(m) => {
                    let slots = t * m.top_k;
                    Some(MoeBuffers {
                        logits: f("router logits", t * m.experts)?,
                        expert: f("slot experts", slots)?,
                        weight: f("slot weights", slots)?,
                        offsets: f("expert offsets", m.experts + 1)?,
                        list: f("slots by expert", slots)?,
                        gate_up: f("expert gate up", 2 * slots * m.intermediate)?,
                        act: f("expert act", slots * m.intermediate)?,
                        out: f("expert out", slots * cfg.hidden_size)?,
                    })
                }
                None => None,
            },
        })
    }

    /// The kernel plan this workspace's passes run.
    pub fn plan(&self) -> &KernelPlan {
        &self.plan
    }
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
    // Each further KV cache group's view of the metadata, made once for every layer.
    let groups = (1..pool.num_kv_groups())
        .map(|g| {
            input.meta.for_group(g).ok_or_else(|| {
                GpuError::invalid("forward", format!("no metadata for KV cache group {g}"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let pass = Pass {
        model,
        pool,
        ws,
        input,
        groups: &groups,
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
    /// The metadata as KV cache groups 1.. see it.
    groups: &'a [AttentionBuffers],
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
        // The layer's KV cache group: whose block tables and slots it uses, and which slab
        // of their blocks holds its K/V.
        let (group, slab) = self.pool.layer_slot(i);
        let meta = match group {
            0 => self.input.meta,
            g => self.groups.get(g - 1).ok_or_else(|| {
                GpuError::invalid("forward", format!("layer {i}: no KV cache group {g}"))
            })?,
        };
        let (heads, kv_heads) = (c.num_heads, c.num_kv_heads);
        let table = &self.model.ropes[l.rope];
        rope::rope(batch, table, meta.positions(), q, k, t, heads, kv_heads)?;
        if self.pool.rotation() == KvRotation::Hadamard {
            rotate_qk(batch, q, k, t * heads, t * kv_heads, c.head_dim)?;
        }
        let slots = meta.slot_mapping();
        reshape_and_cache::reshape_and_cache(batch, self.pool, slab, k, &ws.v, slots, t)?;
        let rc = &c.recipe;
        let opts = AttentionOptions {
            scale: rc.attn_scale,
            window: rc.layers[i].window,
            softcap: rc.attn_softcap,
            sinks: l.sinks.as_ref(),
        };
        let call = Attention {
            pool: self.pool,
            layer: slab,
            meta,
            q,
            out: &ws.attn,
            num_heads: heads,
            opts,
        };
        paged_attention(batch, ws.plan.attention, &call)?;
        batch.profile_site(Some("o"));
        let post = l.post_attn_norm.as_ref();
        self.residual(batch, post, &ws.attn, None, &l.o, l.o_bias.as_ref())
    }

    /// q and k normed per head where the recipe has q/k norms, else as projected.
    fn qk_norms(&self, batch: &mut Batch, l: &GpuLayer) -> Result<(&wgpu::Buffer, &wgpu::Buffer)> {
        let (c, ws, t, eps) = (&self.model.config, self.ws, self.t, self.eps);
        let kernel = ws.plan.qk_norm;
        match (&ws.qk_normed, &l.q_norm, &l.k_norm) {
            (Some((qn, kn)), Some(qw), Some(kw)) => {
                rms_norm::rms_norm(batch, kernel, &ws.q, qw, qn, t * c.num_heads, eps)?;
                rms_norm::rms_norm(batch, kernel, &ws.k, kw, kn, t * c.num_kv_heads, eps)?;
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

    /// `x += [norm](down(act(gate(norm(x))) * up(norm(x))))`, or for a mixture of experts
    /// the same through each token's experts, weighted and summed.
    fn mlp_block(&self, batch: &mut Batch, l: &GpuLayer) -> Result<()> {
        let (c, ws) = (&self.model.config, self.ws);
        let (gate_up_w, down_w, gate_up_bias, down_bias) = match &l.mlp {
            GpuMlp::Dense {
                gate_up,
                down,
                gate_up_bias,
                down_bias,
            } => (gate_up, down, gate_up_bias, down_bias),
            GpuMlp::Experts(x) => return self.experts_block(batch, l, x),
        };
        let gate_up = Outputs::One(&ws.gate_up);
        let bias = gate_up_bias.as_ref();
        self.normed(batch, "gate up", &l.mlp_norm, gate_up_w, bias, gate_up)?;
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
        self.residual(batch, post, down_in, gated, down_w, down_bias.as_ref())?;
        batch.profile_site(None);
        Ok(())
    }

    /// `x += sum over the token's experts e of weight_e * down_e(act(gate_e(h)) * up_e(h))`
    /// with `h = norm(x)`: the router's logits, the routing (on the GPU), each projection
    /// of every expert in one dispatch over the slots routed to it, and the weighted sum.
    fn experts_block(&self, batch: &mut Batch, l: &GpuLayer, x: &GpuExperts) -> Result<()> {
        let (c, ws, t) = (&self.model.config, self.ws, self.t);
        let (Some(b), None) = (&ws.moe, &l.post_mlp_norm) else {
            return Err(GpuError::invalid(
                "forward",
                "a mixture of experts needs the workspace's expert buffers, and no norm after it",
            ));
        };
        let m = x.moe;
        let (slots, inter) = (t * m.top_k, m.intermediate);
        batch.profile_site(None);
        rms_norm::rms_norm(
            batch,
            ws.plan.rms_norm,
            &ws.x,
            &l.mlp_norm,
            &ws.h,
            t,
            self.eps,
        )?;
        batch.profile_site(Some("router"));
        matmul(
            batch,
            &ws.plan.matmul,
            &Matmul::new(&ws.h, &x.router, &b.logits, t).bias(x.router_bias.as_ref()),
        )?;
        let mixture = Mixture {
            experts: m.experts,
            top_k: m.top_k,
            routing: m.routing,
        };
        moe::route(batch, mixture, &b.logits, t, b.routes())?;
        batch.profile_site(Some("experts"));
        // Gate and up read each token's normed row (in_div top_k) into the two halves of a
        // slot's row of gate_up; down reads each slot's activation.
        let h = c.hidden_size;
        let gate = ExpertMatmul {
            x: &ws.h,
            weight: &x.gate,
            n: inter,
            routes: b.routes(),
            y: &b.gate_up,
            ldy: 2 * inter,
            n_offset: 0,
            bias: x.gate_bias.as_ref(),
            in_div: m.top_k,
            slots,
            subgroups: ws.plan.matmul.few == MatmulKernel::ColumnsSubgroup,
        };
        moe::expert_matmul(batch, &gate)?;
        let up = ExpertMatmul {
            weight: &x.up,
            n_offset: inter,
            bias: x.up_bias.as_ref(),
            ..gate
        };
        moe::expert_matmul(batch, &up)?;
        silu_mul::gated_rows(batch, c.recipe.activation, &b.gate_up, &b.act, slots, inter)?;
        let down = ExpertMatmul {
            x: &b.act,
            weight: &x.down,
            n: h,
            y: &b.out,
            ldy: h,
            n_offset: 0,
            bias: x.down_bias.as_ref(),
            in_div: 1,
            ..gate
        };
        moe::expert_matmul(batch, &down)?;
        moe::combine(batch, &b.out, &b.weight, &ws.x, t, h, m.top_k)?;
        batch.profile_site(None);
        Ok(())
    }

    /// The final norm, then the sampled rows' logits (and arg-max): the norm by the LM head
    /// as it reads the gathered rows, or over every token first.
    fn lm_head(&self, batch: &mut Batch) -> Result<()> {
        let (model, ws, input, t) = (self.model, self.ws, self.input, self.t);
        let head = model.lm_head();
        let (hidden, norm) = match ws.plan.fuse_norm(input.num_rows, head.rows * head.cols) {
            true => (
                &ws.x,
                Some(Norm {
                    weight: &model.norm,
                    eps: self.eps,
                }),
            ),
            false => {
                let kernel = ws.plan.rms_norm;
                rms_norm::rms_norm(batch, kernel, &ws.x, &model.norm, &ws.h, t, self.eps)?;
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
        let r = lm_head(
            batch,
            &ws.plan,
            hidden,
            t,
            input.rows,
            input.num_rows,
            head,
            out,
        );
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
        let project = |batch: &mut Batch, y: &wgpu::Buffer, out: Output| {
            let call = Matmul::new(a, w, y, t).bias(bias).output(out);
            let call = match gated {
                Some(act) => call.gated(act),
                None => call,
            };
            matmul(batch, &ws.plan.matmul, &call)
        };
        match (norm, &ws.y) {
            (Some(norm), Some(y)) => {
                project(batch, y, Output::Overwrite)?;
                batch.profile_site(None);
                let kernel = ws.plan.rms_norm;
                rms_norm::rms_norm(batch, kernel, y, norm, &ws.h, t, self.eps)?;
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
        let fused = ws.plan.fuse_norm(t, w.rows * w.cols);
        batch.profile_site(None);
        if !fused {
            rms_norm::rms_norm(batch, ws.plan.rms_norm, &ws.x, norm, &ws.h, t, eps)?;
        }
        batch.profile_site(Some(site));
        let call = match fused {
            true => Matmul::new(&ws.x, w, &ws.h, t).normed(Norm { weight: norm, eps }),
            false => Matmul::new(&ws.h, w, &ws.h, t),
        };
        let r = matmul(batch, &ws.plan.matmul, &call.bias(bias).outputs(outputs));
        batch.profile_site(None);
        r
    }
}
