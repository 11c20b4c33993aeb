//! `gpt_oss` (GptOssForCausalLM; gpt-oss-20b and -120b): attention with biases and a learned
//! sink logit per head (`self_attn.sinks`), layers alternating between a sliding window
//! (`sliding_window`, 128) and full attention (`layer_types`, sliding first), YaRN rope; every
//! MLP a mixture of `num_local_experts` experts: a biased router (`mlp.router`), the top
//! `num_experts_per_tok` logits then a softmax over those alone, each expert a biased gated
//! MLP with a clamped SwiGLU (`swiglu_alpha`, `swiglu_limit`).
//!
//! transformers keeps a layer's experts stacked (`mlp.experts.gate_up_proj`
//! `[experts, hidden, 2 * intermediate]`, input-major with gate and up interleaved by column,
//! `gate_up_proj_bias`, `down_proj` `[experts, intermediate, hidden]`, `down_proj_bias`);
//! [`split_experts`] turns them into each expert's `[out, in]` projections and biases as the
//! folder is opened, so the graph reads them as every family's.

use super::{
    activation_default_swiglu, layer_windows, moe, separate_layer_named, window_or, ArchDef,
    Architecture, Defaults, ExpertNames, Routing,
};
use crate::kernels::WeightDtype;
use crate::model::checkpoint::{Bytes, Checkpoint, Stored};
use crate::model::config::ModelConfig;
use crate::model::error::{ModelError, Result};
use crate::nn::rope::RopeScaling;

const NAMES: ExpertNames = ExpertNames {
    module: "mlp",
    router: "router",
    expert: |e, which| format!("experts.{e}.{which}_proj"),
};

pub(super) const DEF: ArchDef = ArchDef {
    model_type: "gpt_oss",
    architecture: Architecture::GptOss,
    tied_by_default: false,
    defaults: Defaults::new(Some(64), 131072, 1e-5),
    configure: |r, cfg| {
        cfg.recipe.activation = activation_default_swiglu(r)?;
        let bias = r.bool("attention_bias")?.unwrap_or(true);
        (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) = (bias, bias, false);
        cfg.recipe.attn_sinks = true;
        let window = window_or(r, Some(128))?;
        layer_windows(r, cfg, window, |i| i % 2 == 0)?;
        let mut m = moe(r, cfg.intermediate_size, (128, 4), Routing::TopKSoftmax)?;
        m.biased = true;
        cfg.recipe.moe = Some(m);
        cfg.recipe.layers.iter_mut().for_each(|l| l.sparse = true);
        if r.get("rope_parameters").is_none() && r.get("rope_scaling").is_none() {
            // transformers' defaults for a config that names no rope.
            cfg.rope_theta = r.f64("rope_theta")?.unwrap_or(150000.0);
            cfg.rope_scaling = RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 32f64.ln() + 1.0,
                truncate: false,
            };
        }
        Ok(())
    },
    layer: |cfg, i| separate_layer_named(cfg, i, &NAMES),
};

/// The stacked experts of every layer of a gpt-oss checkpoint as each expert's tensors
/// (`mlp.experts.{e}.gate_proj.weight` `[intermediate, hidden]`, `up_proj`, `down_proj`
/// `[hidden, intermediate]`, and their `.bias`es), copied out in the stored format; the
/// stacked tensors are dropped. A layer without them is left alone.
pub(crate) fn split_experts(cfg: &ModelConfig, ck: &mut Checkpoint) -> Result<()> {
    let Some(m) = cfg.recipe.moe else {
        return Ok(());
    };
    let dims = (m.experts, cfg.hidden_size, m.intermediate);
    let mut out = Split::default();
    for i in 0..cfg.num_layers {
        let base = format!("model.layers.{i}.mlp.experts");
        let stacked = [
            "gate_up_proj",
            "gate_up_proj_bias",
            "down_proj",
            "down_proj_bias",
        ]
        .map(|s| format!("{base}.{s}"));
        if !ck.contains(&stacked[0]) {
            continue;
        }
        let (n, h, inter) = dims;
        let shapes = [
            vec![n, h, 2 * inter],
            vec![n, 2 * inter],
            vec![n, inter, h],
            vec![n, h],
        ];
        let mut parts = Vec::new();
        for (name, shape) in stacked.iter().zip(shapes) {
            parts.push(read_stacked(ck, name, shape)?);
        }
        out.layer(&base, dims, &parts);
        for s in &stacked {
            ck.remove(s);
        }
    }
    if out.made.is_empty() {
        return Ok(());
    }
    let file = ck.add_bytes("experts split at load".into(), Bytes::Owned(out.bytes));
    for (name, dtype, shape, range) in out.made {
        ck.add_tensor(name, file, Stored::Format(dtype), shape, range)?;
    }
    Ok(())
}

/// A stacked tensor of a float format: its format, element size and bytes, after checking
/// its shape.
fn read_stacked(
    ck: &Checkpoint,
    name: &str,
    shape: Vec<usize>,
) -> Result<(WeightDtype, usize, Vec<u8>)> {
    let t = ck.get(name)?;
    if t.shape != shape.as_slice() {
        return Err(ModelError::Shape {
            name: name.to_string(),
            expected: shape,
            found: t.shape.to_vec(),
        });
    }
    match t.dtype.row_bytes(1) {
        Some(size) if !t.dtype.is_block() => Ok((t.dtype, size, t.bytes.to_vec())),
        _ => Err(ModelError::Unsupported(format!(
            "{name}: stacked experts in {} (float formats only)",
            t.dtype.name()
        ))),
    }
}

/// The split tensors: their bytes one after another, and each one's name, format, shape
/// and byte range.
#[derive(Default)]
struct Split {
    bytes: Vec<u8>,
    made: Vec<(String, WeightDtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl Split {
    /// Element `at` of `src` (elements of `size` bytes) appended.
    fn element(&mut self, src: &(WeightDtype, usize, Vec<u8>), at: usize) {
        let size = src.1;
        self.bytes
            .extend_from_slice(&src.2[at * size..(at + 1) * size]);
    }

    /// Records the bytes appended since `start` as tensor `name` of `shape`.
    fn made(&mut self, name: String, dtype: WeightDtype, shape: Vec<usize>, start: usize) {
        self.made
            .push((name, dtype, shape, start..self.bytes.len()));
    }

    /// One layer's experts from its four stacked tensors (`parts`: gate_up, its bias,
    /// down, its bias), `dims` = (experts, hidden, intermediate).
    fn layer(
        &mut self,
        base: &str,
        (n, h, inter): (usize, usize, usize),
        parts: &[(WeightDtype, usize, Vec<u8>)],
    ) {
        let [gu, gub, dn, dnb] = parts else {
            return;
        };
        let dt = gu.0;
        for e in 0..n {
            let name = |which: &str, kind: &str| format!("{base}.{e}.{which}_proj.{kind}");
            // Gate (even columns of gate_up) and up (odd), transposed to [inter, hidden].
            for (which, parity) in [("gate", 0), ("up", 1)] {
                let start = self.bytes.len();
                for r in 0..inter {
                    for c in 0..h {
                        self.element(gu, (e * h + c) * 2 * inter + 2 * r + parity);
                    }
                }
                self.made(name(which, "weight"), dt, vec![inter, h], start);
                let start = self.bytes.len();
                for r in 0..inter {
                    self.element(gub, e * 2 * inter + 2 * r + parity);
                }
                self.made(name(which, "bias"), dt, vec![inter], start);
            }
            // Down, transposed to [hidden, inter].
            let start = self.bytes.len();
            for r in 0..h {
                for c in 0..inter {
                    self.element(dn, (e * inter + c) * h + r);
                }
            }
            self.made(name("down", "weight"), dt, vec![h, inter], start);
            let start = self.bytes.len();
            for r in 0..h {
                self.element(dnb, e * h + r);
            }
            self.made(name("down", "bias"), dt, vec![h], start);
        }
    }
}
