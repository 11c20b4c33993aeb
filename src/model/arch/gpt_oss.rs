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
/// `[hidden, intermediate]`, and their `.bias`es); the stacked tensors are dropped. Float
/// stacks are transposed into copies in their format; MXFP4 ones (`{proj}_blocks` and
/// `{proj}_scales`, as gpt-oss is released) become MXFP4 rows of GGML's block layout, the
/// same values ([`Split::packed`]). A layer without stacked experts is left alone.
pub(crate) fn split_experts(cfg: &ModelConfig, ck: &mut Checkpoint) -> Result<()> {
    let Some(m) = cfg.recipe.moe else {
        return Ok(());
    };
    let dims = (m.experts, cfg.hidden_size, m.intermediate);
    let mut out = Split::default();
    for i in 0..cfg.num_layers {
        let base = format!("model.layers.{i}.mlp.experts");
        let packed = ck.contains(&format!("{base}.gate_up_proj_blocks"));
        if !packed && !ck.contains(&format!("{base}.gate_up_proj")) {
            continue;
        }
        let (n, h, inter) = dims;
        if packed {
            out.packed(ck, &base, dims)?;
        } else {
            let gu = read_stacked(ck, &format!("{base}.gate_up_proj"), vec![n, h, 2 * inter])?;
            let dn = read_stacked(ck, &format!("{base}.down_proj"), vec![n, inter, h])?;
            out.transposed(&base, dims, &gu, &dn);
        }
        let gub = read_stacked(ck, &format!("{base}.gate_up_proj_bias"), vec![n, 2 * inter])?;
        let dnb = read_stacked(ck, &format!("{base}.down_proj_bias"), vec![n, h])?;
        out.biases(&base, dims, &gub, &dnb);
        for s in [
            "gate_up_proj",
            "gate_up_proj_blocks",
            "gate_up_proj_scales",
            "gate_up_proj_bias",
            "down_proj",
            "down_proj_blocks",
            "down_proj_scales",
            "down_proj_bias",
        ] {
            ck.remove(&format!("{base}.{s}"));
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

/// A packed MXFP4 stack: `{name}_blocks` `[experts, rows, groups, 16]` and `{name}_scales`
/// `[experts, rows, groups]` for rows of `groups * 32` weights.
fn read_packed<'a>(
    ck: &'a Checkpoint,
    name: &str,
    (n, rows, cols): (usize, usize, usize),
) -> Result<(&'a [u8], &'a [u8])> {
    if !cols.is_multiple_of(32) {
        return Err(ModelError::Unsupported(format!(
            "{name}: MXFP4 rows of {cols} weights (a multiple of 32 is needed)"
        )));
    }
    let g = cols / 32;
    let read = |suffix: &str, shape: Vec<usize>| -> Result<&'a [u8]> {
        let full = format!("{name}_{suffix}");
        let (found, bytes) = ck.bytes_tensor(&full)?;
        if found != shape.as_slice() {
            return Err(ModelError::Shape {
                name: full,
                expected: shape,
                found: found.to_vec(),
            });
        }
        Ok(bytes)
    };
    Ok((
        read("blocks", vec![n, rows, g, 16])?,
        read("scales", vec![n, rows, g])?,
    ))
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

    /// Float stacks: gate (even columns of gate_up, `[experts, hidden, 2 * inter]`) and up
    /// (odd), transposed to `[inter, hidden]`; down `[experts, inter, hidden]` transposed to
    /// `[hidden, inter]`.
    fn transposed(
        &mut self,
        base: &str,
        (n, h, inter): (usize, usize, usize),
        gu: &(WeightDtype, usize, Vec<u8>),
        dn: &(WeightDtype, usize, Vec<u8>),
    ) {
        for e in 0..n {
            let name = |which: &str| format!("{base}.{e}.{which}_proj.weight");
            for (which, parity) in [("gate", 0), ("up", 1)] {
                let start = self.bytes.len();
                for r in 0..inter {
                    for c in 0..h {
                        self.element(gu, (e * h + c) * 2 * inter + 2 * r + parity);
                    }
                }
                self.made(name(which), gu.0, vec![inter, h], start);
            }
            let start = self.bytes.len();
            for r in 0..h {
                for c in 0..inter {
                    self.element(dn, (e * inter + c) * h + r);
                }
            }
            self.made(name("down"), dn.0, vec![h, inter], start);
        }
    }

    /// MXFP4 stacks, output-major already: gate is the even rows of gate_up's blocks, up
    /// the odd ones, down all of expert e's. Each 32-weight block becomes GGML's: the scale
    /// byte (the same power of two, 2^(e - 127) times E2M1 values, which GGML writes as
    /// 2^(e - 128) times doubled ones), then 16 bytes with weight j in the low nibble of byte
    /// j and weight j + 16 in its high nibble (the checkpoint pairs weights 2k and 2k + 1).
    fn packed(
        &mut self,
        ck: &Checkpoint,
        base: &str,
        (n, h, inter): (usize, usize, usize),
    ) -> Result<()> {
        let gu = read_packed(ck, &format!("{base}.gate_up_proj"), (n, 2 * inter, h))?;
        let dn = read_packed(ck, &format!("{base}.down_proj"), (n, h, inter))?;
        for e in 0..n {
            let name = |which: &str| format!("{base}.{e}.{which}_proj.weight");
            for (which, parity) in [("gate", 0), ("up", 1)] {
                let start = self.bytes.len();
                for r in 0..inter {
                    self.mxfp4_row(gu, (e * 2 * inter + 2 * r + parity, h / 32));
                }
                self.made(name(which), WeightDtype::MXFP4, vec![inter, h], start);
            }
            let start = self.bytes.len();
            for r in 0..h {
                self.mxfp4_row(dn, (e * h + r, inter / 32));
            }
            self.made(name("down"), WeightDtype::MXFP4, vec![h, inter], start);
        }
        Ok(())
    }

    /// Row `row` (of `groups` blocks) of a packed stack, in GGML's MXFP4 layout.
    fn mxfp4_row(&mut self, (blocks, scales): (&[u8], &[u8]), (row, groups): (usize, usize)) {
        for g in 0..groups {
            let b = row * groups + g;
            self.bytes.push(scales[b]);
            let codes = &blocks[b * 16..(b + 1) * 16];
            let nibble = |i: usize| (codes[i / 2] >> (4 * (i % 2))) & 0xf;
            self.bytes
                .extend((0..16).map(|j| nibble(j) | (nibble(j + 16) << 4)));
        }
    }

    /// The biases: gate's and up's the even and odd entries of each expert's gate_up bias,
    /// down's its own.
    fn biases(
        &mut self,
        base: &str,
        (n, h, inter): (usize, usize, usize),
        gub: &(WeightDtype, usize, Vec<u8>),
        dnb: &(WeightDtype, usize, Vec<u8>),
    ) {
        for e in 0..n {
            let name = |which: &str| format!("{base}.{e}.{which}_proj.bias");
            for (which, parity) in [("gate", 0), ("up", 1)] {
                let start = self.bytes.len();
                for r in 0..inter {
                    self.element(gub, e * 2 * inter + 2 * r + parity);
                }
                self.made(name(which), gub.0, vec![inter], start);
            }
            let start = self.bytes.len();
            for r in 0..h {
                self.element(dnb, e * h + r);
            }
            self.made(name("down"), dnb.0, vec![h], start);
        }
    }
}
