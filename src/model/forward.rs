//! One forward pass over a flat batch of tokens from many sequences, recorded into a
//! [`Batch`] (the engine submits once per step):
//!
//! ```text
//! embed → per layer [rms_norm → q/k/v (+bias) → rope (→ rotate q, k) → reshape_and_cache
//!        → paged_attention → o_proj (+= residual) → rms_norm → gate, up → silu_mul
//!        → down (+= residual)]
//!       → final rms_norm → gather the sampling rows → LM head logits (→ arg-max)
//! ```
//!
//! The rotations run when the pool's [`KvRotation`] is Hadamard.

use super::gpu::GpuModel;
use super::ModelConfig;
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind, GpuContext};
use crate::kernels::logits::{lm_head, LogitsBuffers};
use crate::kernels::matmul::{matmul, Output};
use crate::kernels::paged_attention::{paged_attention, AttentionBuffers};
use crate::kernels::rotate::rotate_qk;
use crate::kernels::{embedding, reshape_and_cache, rms_norm, rope, silu_mul};
use crate::pool::{KvPool, KvRotation};

/// Activation buffers for up to `max_tokens` tokens and `max_rows` sampled rows per step,
/// allocated once.
#[derive(Debug)]
pub struct Workspace {
    pub max_tokens: usize,
    pub max_rows: usize,
    x: wgpu::Buffer,        // [T, hidden] residual stream
    h: wgpu::Buffer,        // [T, hidden] normed
    q: wgpu::Buffer,        // [T, heads * head_dim]
    k: wgpu::Buffer,        // [T, kv_heads * head_dim]
    v: wgpu::Buffer,        // [T, kv_heads * head_dim]
    attn: wgpu::Buffer,     // [T, heads * head_dim]
    gate: wgpu::Buffer,     // [T, intermediate]
    up: wgpu::Buffer,       // [T, intermediate]
    act: wgpu::Buffer,      // [T, intermediate]
    gathered: wgpu::Buffer, // [R, hidden]
    /// `[R, vocab]` logits of the sampled rows after [`forward`].
    pub logits: wgpu::Buffer,
    /// `[2, R]`: the arg-max token of each sampled row, then the bits of its logprob
    /// (see [`crate::kernels::logits::argmax`]).
    pub argmax: wgpu::Buffer,
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
            gate: f("gate", t * cfg.intermediate_size)?,
            up: f("up", t * cfg.intermediate_size)?,
            act: f("act", t * cfg.intermediate_size)?,
            gathered: f("gathered", r * cfg.hidden_size)?,
            logits: f("logits", r * cfg.vocab_size)?,
            argmax: f("argmax", 2 * r)?,
        })
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
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    embedding::embedding(batch, &model.embed, input.tokens, &ws.x, t)?;
    for (i, l) in model.layers.iter().enumerate() {
        rms_norm::rms_norm(batch, &ws.x, &l.input_norm, &ws.h, t, c.rms_norm_eps)?;
        batch.profile_site(Some("q k v"));
        matmul(
            batch,
            &ws.h,
            &l.q,
            l.q_bias.as_ref(),
            &ws.q,
            t,
            Output::Overwrite,
        )?;
        matmul(
            batch,
            &ws.h,
            &l.k,
            l.k_bias.as_ref(),
            &ws.k,
            t,
            Output::Overwrite,
        )?;
        matmul(
            batch,
            &ws.h,
            &l.v,
            l.v_bias.as_ref(),
            &ws.v,
            t,
            Output::Overwrite,
        )?;
        batch.profile_site(None);
        rope::rope(
            batch,
            &model.rope,
            input.meta.positions(),
            &ws.q,
            &ws.k,
            t,
            c.num_heads,
            c.num_kv_heads,
        )?;
        let rotated = pool.rotation() == KvRotation::Hadamard;
        if rotated {
            let (rows_q, rows_k) = (t * c.num_heads, t * c.num_kv_heads);
            rotate_qk(batch, &ws.q, &ws.k, rows_q, rows_k, c.head_dim)?;
        }
        reshape_and_cache::reshape_and_cache(
            batch,
            pool,
            i,
            &ws.k,
            &ws.v,
            input.meta.slot_mapping(),
            t,
        )?;
        paged_attention(
            batch,
            pool,
            i,
            input.meta,
            &ws.q,
            &ws.attn,
            c.num_heads,
            scale,
        )?;

        batch.profile_site(Some("o"));
        matmul(
            batch,
            &ws.attn,
            &l.o,
            l.o_bias.as_ref(),
            &ws.x,
            t,
            Output::Accumulate,
        )?;
        batch.profile_site(None);
        rms_norm::rms_norm(batch, &ws.x, &l.post_norm, &ws.h, t, c.rms_norm_eps)?;
        batch.profile_site(Some("gate up"));
        matmul(
            batch,
            &ws.h,
            &l.gate,
            l.gate_bias.as_ref(),
            &ws.gate,
            t,
            Output::Overwrite,
        )?;
        matmul(
            batch,
            &ws.h,
            &l.up,
            l.up_bias.as_ref(),
            &ws.up,
            t,
            Output::Overwrite,
        )?;
        batch.profile_site(None);
        silu_mul::silu_mul(batch, &ws.gate, &ws.up, &ws.act, t * c.intermediate_size)?;
        batch.profile_site(Some("down"));
        matmul(
            batch,
            &ws.act,
            &l.down,
            l.down_bias.as_ref(),
            &ws.x,
            t,
            Output::Accumulate,
        )?;
        batch.profile_site(None);
    }
    rms_norm::rms_norm(batch, &ws.x, &model.norm, &ws.h, t, c.rms_norm_eps)?;
    let out = LogitsBuffers {
        gathered: &ws.gathered,
        logits: &ws.logits,
        argmax: input.argmax.then_some(&ws.argmax),
    };
    // Gathering the sampled rows, the vocabulary projection and the arg-max.
    batch.profile_site(Some("lm head"));
    let r = lm_head(
        batch,
        &ws.h,
        t,
        input.rows,
        input.num_rows,
        model.lm_head(),
        out,
    );
    batch.profile_site(None);
    r
}
