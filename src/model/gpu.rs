//! The model's weights on the GPU, uploaded from a validated [`ModelFiles`] in their on-disk
//! precision, plus the rotary table.

use super::error::Result;
use super::spec::{self, LayerNames};
use super::{ModelConfig, ModelFiles};
use crate::gpu::GpuContext;
use crate::kernels::rope::RopeTable;
use crate::kernels::Weight;

/// One decoder layer's weights. Biases are small and kept in f32.
#[derive(Debug)]
pub struct GpuLayer {
    pub input_norm: Weight,
    pub q: Weight,
    pub k: Weight,
    pub v: Weight,
    pub o: Weight,
    pub q_bias: Option<wgpu::Buffer>,
    pub k_bias: Option<wgpu::Buffer>,
    pub v_bias: Option<wgpu::Buffer>,
    pub o_bias: Option<wgpu::Buffer>,
    pub post_norm: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub gate_bias: Option<wgpu::Buffer>,
    pub up_bias: Option<wgpu::Buffer>,
    pub down_bias: Option<wgpu::Buffer>,
}

#[derive(Debug)]
pub struct GpuModel {
    pub config: ModelConfig,
    pub embed: Weight,
    pub layers: Vec<GpuLayer>,
    pub norm: Weight,
    /// `None` when the LM head is tied to the embedding.
    pub lm_head: Option<Weight>,
    pub rope: RopeTable,
}

impl GpuModel {
    /// Uploads every weight. `progress(done, total)` is called in bytes after each tensor.
    pub fn upload(
        ctx: &GpuContext,
        files: &ModelFiles,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let cfg = files.config.clone();
        let ck = &files.checkpoint;
        let total: u64 = spec::expected_tensors(&cfg)
            .iter()
            .filter_map(|(n, _)| ck.get(n).ok())
            .map(|t| t.bytes.len() as u64)
            .sum();
        let mut done = 0u64;
        let mut weight = |name: &str| -> Result<Weight> {
            let t = ck.get(name)?;
            let (rows, cols) = match t.shape {
                [n] => (1, *n),
                [r, c] => (*r, *c),
                _ => unreachable!("shapes were validated"),
            };
            let w = Weight::upload(ctx, name, t.bytes, rows, cols, t.dtype)?;
            done += t.bytes.len() as u64;
            progress(done, total);
            Ok(w)
        };
        let bias = |name: &Option<String>| -> Result<Option<wgpu::Buffer>> {
            match name {
                None => Ok(None),
                Some(n) => Ok(Some(ctx.upload(n, &ck.get(n)?.to_f32())?)),
            }
        };
        let embed = weight(spec::EMBED)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = LayerNames::new(&cfg, i);
            layers.push(GpuLayer {
                input_norm: weight(&n.input_norm)?,
                q: weight(&n.q)?,
                k: weight(&n.k)?,
                v: weight(&n.v)?,
                o: weight(&n.o)?,
                q_bias: bias(&n.q_bias)?,
                k_bias: bias(&n.k_bias)?,
                v_bias: bias(&n.v_bias)?,
                o_bias: bias(&n.o_bias)?,
                post_norm: weight(&n.post_norm)?,
                gate: weight(&n.gate)?,
                up: weight(&n.up)?,
                down: weight(&n.down)?,
                gate_bias: bias(&n.gate_bias)?,
                up_bias: bias(&n.up_bias)?,
                down_bias: bias(&n.down_bias)?,
            });
        }
        let norm = weight(spec::FINAL_NORM)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(weight(spec::LM_HEAD)?)
        };
        let rope = RopeTable::new(
            ctx,
            cfg.head_dim,
            cfg.rope_theta,
            cfg.rope_scaling,
            cfg.max_model_len(),
        )?;
        Ok(GpuModel {
            config: cfg,
            embed,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    pub fn lm_head(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}
