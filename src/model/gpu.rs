//! The model's weights on the GPU, uploaded from a validated [`ModelFiles`] in their on-disk
//! precision (fused projections split into their parts, Gemma's `1 + w` norms widened to
//! f32 with the one added), plus the rotary tables.

use super::arch::{MlpTensors, Moe, NormKind, Rope, Slice};
use super::checkpoint::Checkpoint;
use super::convert::converted;
use super::error::{ModelError, Result};
use super::spec;
use super::{ModelConfig, ModelFiles};
use crate::gpu::GpuContext;
use crate::kernels::rope::RopeTable;
use crate::kernels::{Weight, WeightDtype};

/// One decoder layer's weights. Biases are small and kept in f32.
#[derive(Debug)]
pub struct GpuLayer {
    pub input_norm: Weight,
    /// The q, k and v projections stacked: `[(heads + 2 * kv_heads) * head_dim, hidden]`,
    /// q's rows, then k's, then v's.
    pub qkv: Weight,
    pub o: Weight,
    pub qkv_bias: Option<wgpu::Buffer>,
    pub o_bias: Option<wgpu::Buffer>,
    pub q_norm: Option<Weight>,
    pub k_norm: Option<Weight>,
    pub post_attn_norm: Option<Weight>,
    /// `[heads]` f32: each head's attention sink ([`super::arch::Recipe::attn_sinks`]).
    pub sinks: Option<wgpu::Buffer>,
    pub mlp_norm: Weight,
    pub post_mlp_norm: Option<Weight>,
    pub mlp: GpuMlp,
    /// Index into [`GpuModel::ropes`].
    pub rope: usize,
}

/// A layer's MLP on the GPU.
#[derive(Debug)]
pub enum GpuMlp {
    Dense {
        /// The gate and up projections stacked: `[2 * intermediate, hidden]`, gate's rows
        /// first.
        gate_up: Weight,
        down: Weight,
        gate_up_bias: Option<wgpu::Buffer>,
        down_bias: Option<wgpu::Buffer>,
    },
    Experts(GpuExperts),
}

/// A mixture of experts on the GPU: the router `[experts, hidden]`, and every expert's
/// gate, up (`[experts * intermediate, hidden]`, expert e's rows at `e * intermediate`) and
/// down (`[experts * hidden, intermediate]`) projections, each in buffers of whole experts.
#[derive(Debug)]
pub struct GpuExperts {
    pub moe: Moe,
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    /// With [`Moe::biased`]: the router's `[experts]` bias and each projection's, every
    /// expert's one after another (`[experts * width]`), in f32.
    pub router_bias: Option<wgpu::Buffer>,
    pub gate_bias: Option<wgpu::Buffer>,
    pub up_bias: Option<wgpu::Buffer>,
    pub down_bias: Option<wgpu::Buffer>,
}

impl GpuMlp {
    /// Its matmuls' weights.
    pub fn weights(&self) -> Vec<&Weight> {
        match self {
            GpuMlp::Dense { gate_up, down, .. } => vec![gate_up, down],
            GpuMlp::Experts(x) => vec![&x.router, &x.gate, &x.up, &x.down],
        }
    }
}

#[derive(Debug)]
pub struct GpuModel {
    pub config: ModelConfig,
    pub embed: Weight,
    pub layers: Vec<GpuLayer>,
    pub norm: Weight,
    /// `None` when the LM head is tied to the embedding.
    pub lm_head: Option<Weight>,
    /// The main rope's table, then the local one (when the recipe has one).
    pub ropes: Vec<RopeTable>,
}

/// The config a model computes with for sequences of up to `context` tokens: rope scalings
/// picked for the context ([`ModelConfig::for_context`]), and Gemma's embedding scale
/// rounded to the embedding's dtype, as transformers multiplies by
/// `embed_scale.to(weight.dtype)` (sqrt(3584) = 59.87 is 59.75 in bfloat16).
pub(crate) fn computing_config(files: &ModelFiles, context: usize) -> Result<ModelConfig> {
    let mut cfg = files.config.for_context(context);
    if let Some(s) = cfg.recipe.embed_scale {
        let rounded = match files.checkpoint.get(spec::EMBED)?.dtype {
            WeightDtype::F32 => s,
            WeightDtype::F16 => half::f16::from_f32(s).to_f32(),
            WeightDtype::BF16 => half::bf16::from_f32(s).to_f32(),
            // A block format has no element type to round to (llama.cpp scales in f32).
            _ => s,
        };
        cfg.recipe.embed_scale = Some(rounded);
    }
    Ok(cfg)
}

/// A norm weight as the kernels use it: Gemma's `1 + w` is added here, in f32.
pub(crate) fn norm_values(cfg: &ModelConfig, w: Vec<f32>) -> Vec<f32> {
    match cfg.recipe.norm {
        NormKind::Weight => w,
        NormKind::OnePlusWeight => w.into_iter().map(|x| 1.0 + x).collect(),
    }
}

struct Uploader<'a> {
    ctx: &'a GpuContext,
    ck: &'a Checkpoint,
    cfg: &'a ModelConfig,
    /// The format weights convert to as they upload ([`super::convert`]); `None` keeps
    /// each as stored.
    to: Option<WeightDtype>,
    done: u64,
    total: u64,
}

impl Uploader<'_> {
    /// Layer `i`'s weights. The recipe and the layer's tensors must agree on the optional
    /// norms, or the forward pass would have a weight without its step (or the reverse).
    fn layer(&mut self, i: usize, p: &mut impl FnMut(u64, u64)) -> Result<GpuLayer> {
        let cfg = self.cfg;
        let n = spec::layer(cfg, i);
        let rc = &cfg.recipe;
        let sandwich = (n.post_attn_norm.is_some(), n.post_mlp_norm.is_some());
        let qk = (n.q_norm.is_some(), n.k_norm.is_some());
        if sandwich != (rc.sandwich_norms, rc.sandwich_norms) || qk != (rc.qk_norm, rc.qk_norm) {
            return Err(ModelError::Unsupported(format!(
                "layer {i}: the architecture's recipe (sandwich norms {}, q/k norms {}) and \
                 its tensors (post-attention/post-MLP norms {sandwich:?}, q/k norms {qk:?}) \
                 disagree",
                rc.sandwich_norms, rc.qk_norm
            )));
        }
        let qd = cfg.num_heads * cfg.head_dim;
        let kvd = cfg.num_kv_heads * cfg.head_dim;
        let inter = cfg.intermediate_size;
        let mlp = match &n.mlp {
            MlpTensors::Dense(d) => GpuMlp::Dense {
                gate_up: self.stacked(&[&d.gate, &d.up], p)?,
                down: self.weight(&d.down, p)?,
                gate_up_bias: self.stacked_bias(
                    "gate up bias",
                    &[&d.gate_bias, &d.up_bias],
                    &[inter, inter],
                )?,
                down_bias: self.bias(&d.down_bias)?,
            },
            MlpTensors::Experts(x) => {
                let moe = rc.moe.ok_or_else(|| {
                    ModelError::Unsupported(format!(
                        "layer {i}: expert tensors without the recipe's experts"
                    ))
                })?;
                GpuMlp::Experts(GpuExperts {
                    moe,
                    router: self.weight(&x.router, p)?,
                    gate: self.experts(&x.gate, p)?,
                    up: self.experts(&x.up, p)?,
                    down: self.experts(&x.down, p)?,
                    router_bias: self.bias(&x.router_bias)?,
                    gate_bias: self.expert_biases("expert gate biases", &x.gate_bias)?,
                    up_bias: self.expert_biases("expert up biases", &x.up_bias)?,
                    down_bias: self.expert_biases("expert down biases", &x.down_bias)?,
                })
            }
        };
        Ok(GpuLayer {
            input_norm: self.norm(&n.input_norm, p)?,
            qkv: self.stacked(&[&n.q, &n.k, &n.v], p)?,
            o: self.weight(&n.o, p)?,
            qkv_bias: self.stacked_bias(
                "q k v bias",
                &[&n.q_bias, &n.k_bias, &n.v_bias],
                &[qd, kvd, kvd],
            )?,
            o_bias: self.bias(&n.o_bias)?,
            q_norm: self.opt_norm(&n.q_norm, p)?,
            k_norm: self.opt_norm(&n.k_norm, p)?,
            post_attn_norm: self.opt_norm(&n.post_attn_norm, p)?,
            sinks: self.bias(&n.sinks)?,
            mlp_norm: self.norm(&n.mlp_norm, p)?,
            post_mlp_norm: self.opt_norm(&n.post_mlp_norm, p)?,
            mlp,
            rope: usize::from(rc.layers[i].local_rope && rc.local_rope.is_some()),
        })
    }

    fn weight(&mut self, s: &Slice, progress: &mut impl FnMut(u64, u64)) -> Result<Weight> {
        let p = self.ck.part(s)?;
        let (bytes, dtype) = converted(&s.name, &p, self.to)?;
        let w = Weight::upload(self.ctx, &s.name, &bytes, p.rows, p.cols, dtype)?;
        self.done += p.bytes.len() as u64;
        progress(self.done, self.total);
        Ok(w)
    }

    /// Weights of one row length as one, their rows one after the other (q, k and v; gate
    /// and up): one matmul instead of several. Parts may differ in format (a Q4_K_M file
    /// keeps v in Q6_K and q and k in Q4_K): each format gets chunks of its own.
    fn stacked(
        &mut self,
        slices: &[&Slice],
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<Weight> {
        let parts = slices
            .iter()
            .map(|s| self.ck.part(s))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let first = &parts[0];
        if let Some((s, p)) = slices
            .iter()
            .zip(&parts)
            .find(|(_, p)| p.cols != first.cols)
        {
            return Err(ModelError::Unsupported(format!(
                "{} ({} x {}) cannot be stacked with {} ({} x {})",
                s.name, p.rows, p.cols, slices[0].name, first.rows, first.cols
            )));
        }
        let name = slices
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let converted = slices
            .iter()
            .zip(&parts)
            .map(|(s, p)| converted(&s.name, p, self.to))
            .collect::<Result<Vec<_>>>()?;
        let stack: Vec<(WeightDtype, usize, &[u8])> = converted
            .iter()
            .zip(&parts)
            .map(|((bytes, dtype), p)| (*dtype, p.rows, &bytes[..]))
            .collect();
        let w = Weight::upload_stack(self.ctx, &name, &stack, first.cols)?;
        self.done += parts.iter().map(|p| p.bytes.len() as u64).sum::<u64>();
        progress(self.done, self.total);
        Ok(w)
    }

    /// Every expert's weight of one projection as one, expert after expert, in buffers of
    /// whole experts (the expert kernels bind a buffer per dispatch). The experts must share
    /// one format and shape.
    fn experts(&mut self, slices: &[Slice], progress: &mut impl FnMut(u64, u64)) -> Result<Weight> {
        let parts = slices
            .iter()
            .map(|s| self.ck.part(s))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let converted = slices
            .iter()
            .zip(&parts)
            .map(|(s, p)| converted(&s.name, p, self.to))
            .collect::<Result<Vec<_>>>()?;
        let (first, (_, dtype)) = (&parts[0], &converted[0]);
        for ((s, p), (_, d)) in slices.iter().zip(&parts).zip(&converted) {
            if (p.rows, p.cols, *d) != (first.rows, first.cols, *dtype) {
                return Err(ModelError::Unsupported(format!(
                    "{} ({} x {} {}) differs from {} ({} x {} {}): every expert of a layer \
                     must have one shape and format",
                    s.name,
                    p.rows,
                    p.cols,
                    d.name(),
                    slices[0].name,
                    first.rows,
                    first.cols,
                    dtype.name()
                )));
            }
        }
        if !first.cols.is_multiple_of(8) {
            return Err(ModelError::Unsupported(format!(
                "{}: experts with rows of {} weights (the expert kernels read rows of a \
                 multiple of 8)",
                slices[0].name, first.cols
            )));
        }
        let name = format!("{} ({} experts)", slices[0].name, slices.len());
        let bytes: Vec<&[u8]> = converted.iter().map(|(b, _)| &b[..]).collect();
        let w = Weight::upload_experts(self.ctx, &name, &bytes, first.rows, first.cols, *dtype)?;
        self.done += parts.iter().map(|p| p.bytes.len() as u64).sum::<u64>();
        progress(self.done, self.total);
        Ok(w)
    }

    /// The biases of [`Self::stacked`] weights of `rows[i]` rows each, zeros standing in for
    /// a missing one; `None` when none has one.
    fn stacked_bias(
        &mut self,
        label: &str,
        biases: &[&Option<Slice>],
        rows: &[usize],
    ) -> Result<Option<wgpu::Buffer>> {
        if biases.iter().all(|b| b.is_none()) {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(rows.iter().sum());
        for (b, &n) in biases.iter().zip(rows) {
            match b {
                Some(s) => values.extend(self.ck.part(s)?.to_f32()),
                None => values.extend(std::iter::repeat_n(0.0, n)),
            }
        }
        Ok(Some(self.ctx.upload(label, &values)?))
    }

    /// A norm weight: as stored (never converted), or in f32 where Gemma's `1 +` is added
    /// or the file keeps it in a block format (the norm kernels read float weights).
    fn norm(&mut self, s: &Slice, progress: &mut impl FnMut(u64, u64)) -> Result<Weight> {
        let p = self.ck.part(s)?;
        if self.cfg.recipe.norm == NormKind::Weight && !p.dtype.is_block() {
            let w = Weight::upload(self.ctx, &s.name, p.bytes, p.rows, p.cols, p.dtype)?;
            self.done += p.bytes.len() as u64;
            progress(self.done, self.total);
            return Ok(w);
        }
        let values = norm_values(self.cfg, p.to_f32());
        let w = Weight::from_f32(
            self.ctx,
            &s.name,
            &values,
            1,
            values.len(),
            WeightDtype::F32,
        )?;
        self.done += p.bytes.len() as u64;
        progress(self.done, self.total);
        Ok(w)
    }

    fn opt_norm(
        &mut self,
        s: &Option<Slice>,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<Option<Weight>> {
        s.as_ref().map(|s| self.norm(s, progress)).transpose()
    }

    /// Every expert's bias of one projection, one after another, in f32.
    fn expert_biases(
        &mut self,
        label: &str,
        slices: &Option<Vec<Slice>>,
    ) -> Result<Option<wgpu::Buffer>> {
        let Some(slices) = slices else {
            return Ok(None);
        };
        let mut values = Vec::new();
        for s in slices {
            values.extend(self.ck.part(s)?.to_f32());
        }
        Ok(Some(self.ctx.upload(label, &values)?))
    }

    fn bias(&mut self, s: &Option<Slice>) -> Result<Option<wgpu::Buffer>> {
        match s {
            None => Ok(None),
            Some(s) => Ok(Some(self.ctx.upload(&s.name, &self.ck.part(s)?.to_f32())?)),
        }
    }
}

/// What a model's weights take on the GPU, and what of them one token reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightBytes {
    /// Every weight: embedding, norms, projections, routers, experts, LM head.
    pub total: u64,
    /// The experts' projections of every sparse layer (part of `total`).
    pub experts: u64,
    /// What one token's forward pass reads: everything but the experts it was not routed
    /// to (the embedding counted whole; it reads one row).
    pub active: u64,
}

impl GpuModel {
    /// The bytes of the model's weights on the GPU ([`WeightBytes`]).
    pub fn weight_bytes(&self) -> WeightBytes {
        let mut all: Vec<&Weight> = vec![&self.embed, &self.norm];
        all.extend(self.lm_head.as_ref());
        let (mut experts, mut active_experts) = (0, 0);
        for l in &self.layers {
            all.extend([&l.input_norm, &l.qkv, &l.o, &l.mlp_norm]);
            let optional = [&l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_mlp_norm];
            all.extend(optional.into_iter().flatten());
            match &l.mlp {
                GpuMlp::Dense { gate_up, down, .. } => all.extend([gate_up, down]),
                GpuMlp::Experts(x) => {
                    all.push(&x.router);
                    let bytes: u64 = [&x.gate, &x.up, &x.down]
                        .iter()
                        .map(|w| w.gpu_bytes())
                        .sum();
                    experts += bytes;
                    active_experts += bytes * x.moe.top_k as u64 / x.moe.experts as u64;
                }
            }
        }
        let rest: u64 = all.iter().map(|w| w.gpu_bytes()).sum();
        WeightBytes {
            total: rest + experts,
            experts,
            active: rest + active_experts,
        }
    }

    /// Every format the model's weights are stored in (its matmuls' and embedding's, norms
    /// included), each once.
    pub fn weight_formats(&self) -> Vec<WeightDtype> {
        let mut all: Vec<&Weight> = vec![&self.embed, &self.norm];
        all.extend(self.lm_head.as_ref());
        for l in &self.layers {
            all.extend([&l.input_norm, &l.qkv, &l.o, &l.mlp_norm]);
            all.extend(l.mlp.weights());
            let optional = [&l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_mlp_norm];
            all.extend(optional.into_iter().flatten());
        }
        let mut formats: Vec<WeightDtype> = Vec::new();
        for chunk in all.iter().flat_map(|w| &w.chunks) {
            if !formats.contains(&chunk.dtype) {
                formats.push(chunk.dtype);
            }
        }
        formats
    }
}

impl GpuModel {
    /// Uploads every weight, with rope tables for the config's default context
    /// ([`ModelConfig::default_context`]). `progress(done, total)` is called in bytes after
    /// each tensor.
    pub fn upload(
        ctx: &GpuContext,
        files: &ModelFiles,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let context = files.config.default_context();
        Self::upload_for_context(ctx, files, context, progress)
    }

    /// [`Self::upload`] for sequences of up to `context` tokens (which picks LongRoPE's
    /// factors, see [`ModelConfig::for_context`]).
    pub fn upload_for_context(
        ctx: &GpuContext,
        files: &ModelFiles,
        context: usize,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        Self::upload_as(ctx, files, context, None, progress)
    }

    /// [`Self::upload_for_context`] with every weight a matmul or the embedding reads
    /// converted to `weight_dtype` as it uploads (quantized, or widened; see
    /// [`super::convert`]); `None` keeps each as stored.
    pub fn upload_as(
        ctx: &GpuContext,
        files: &ModelFiles,
        context: usize,
        weight_dtype: Option<WeightDtype>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let cfg = computing_config(files, context)?;
        let ck = &files.checkpoint;
        let total: u64 = spec::expected_tensors(&cfg)
            .iter()
            .filter_map(|(n, _)| ck.get(n).ok())
            .map(|t| t.bytes.len() as u64)
            .sum();
        progress(0, total);
        let mut up = Uploader {
            ctx,
            ck,
            cfg: &cfg,
            to: weight_dtype,
            done: 0,
            total,
        };
        let p = &mut progress;
        let whole = |name: &str| Slice {
            name: name.to_string(),
            rows: None,
        };
        let embed = up.weight(&whole(spec::EMBED), p)?;
        let layers = (0..cfg.num_layers)
            .map(|i| up.layer(i, p))
            .collect::<Result<Vec<_>>>()?;
        let norm = up.norm(&whole(spec::FINAL_NORM), p)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(up.weight(&whole(spec::LM_HEAD), p)?)
        };
        let main = Rope {
            theta: cfg.rope_theta,
            scaling: cfg.rope_scaling.clone(),
        };
        let ropes = std::iter::once(&main)
            .chain(&cfg.recipe.local_rope)
            .map(|r| RopeTable::new(ctx, cfg.head_dim, r.theta, &r.scaling, context))
            .collect::<crate::error::Result<Vec<_>>>()?;
        Ok(GpuModel {
            config: cfg,
            embed,
            layers,
            norm,
            lm_head,
            ropes,
        })
    }

    /// About the bytes [`Self::upload_as`] would take on the GPU for `files` converted to
    /// `weight_dtype`: every 2-D tensor in that format, the rest as stored (what the
    /// engine plans its KV pool around before it uploads anything).
    pub fn estimate_bytes(
        files: &ModelFiles,
        context: usize,
        weight_dtype: Option<WeightDtype>,
    ) -> Result<u64> {
        let cfg = computing_config(files, context)?;
        let ck = &files.checkpoint;
        Ok(spec::expected_tensors(&cfg)
            .iter()
            .filter_map(|(n, _)| ck.get(n).ok())
            .map(|t| match weight_dtype {
                Some(to) if t.shape.len() >= 2 && t.dtype != to => {
                    let elems: u64 = t.shape.iter().map(|&d| d as u64).product();
                    elems.div_ceil(to.block_elems() as u64) * to.block_bytes() as u64
                }
                _ => t.bytes.len() as u64,
            })
            .sum())
    }

    pub fn lm_head(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}
