//! A GGUF file as a [`Checkpoint`]: its tensors under their Hugging Face names, so that the
//! spec check, the reference model and the GPU upload read it as they read a safetensors
//! folder. llama.cpp's converter reorders the rows of Llama's q and k projections within
//! each head (it interleaves the two halves that rope rotates together, for its own rope
//! kernel); those tensors are put back in Hugging Face order here, row by row, so the rest
//! of pagellm sees the weights transformers computes with. Likewise Gemma's norms: the
//! converter stores `1 + w` (llama.cpp's norm multiplies by the weight alone), and `w` is
//! given back here in f32. Tensors that hold settings (rope factors) are read into the
//! config and left out.

use super::checkpoint::{Bytes, Stored};
use super::error::{ModelError, Result};
use super::{Checkpoint, ModelConfig};
use crate::formats::GgmlType;
use crate::gguf::config::{hf_config, CONFIG_TENSORS};
use crate::gguf::file::{GgufFile, TensorInfo};
use crate::mapped::FileBytes;
use std::path::Path;

/// The config and the tensors of the GGUF file at `path`; the config from the file's
/// metadata, or `config` where the caller has one (a folder's `config.json`).
pub fn open(path: &Path, config: Option<ModelConfig>) -> Result<(ModelConfig, Checkpoint)> {
    let bytes = crate::mapped::open(path).map_err(|error| ModelError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    open_bytes(path, bytes, config)
}

/// [`open`] for a GGUF file's bytes (mapped from disk, or given in memory); `path` names
/// it in messages.
pub fn open_bytes(
    path: &Path,
    bytes: FileBytes,
    config: Option<ModelConfig>,
) -> Result<(ModelConfig, Checkpoint)> {
    let malformed = |message: String| ModelError::Gguf {
        path: path.to_path_buf(),
        message,
    };
    let file = GgufFile::parse(bytes).map_err(&malformed)?;
    let arch = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let config = match config {
        Some(c) => c,
        None => {
            let json = hf_config(&file).map_err(|message| ModelError::Config {
                path: path.to_path_buf(),
                message,
            })?;
            ModelConfig::parse(path, &json)?
        }
    };
    let (tensors, map) = file.into_parts();
    let mut ck = Checkpoint::empty();
    let mapped = ck.add_bytes(path.to_path_buf(), Bytes::Map(map));
    let mut owned: Vec<(String, Stored, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in tensors
        .iter()
        .filter(|t| !CONFIG_TENSORS.contains(&t.name.as_str()))
    {
        let shape = t.shape();
        if let Some(stack) = experts_tensor(&t.name) {
            add_experts(&mut ck, (path, mapped), t, &arch, stack)?;
            continue;
        }
        let name = hf_name(&t.name, &arch).unwrap_or_else(|| t.name.clone());
        let bytes = || ck.bytes(mapped, t.start..t.start + t.len);
        let heads = match (arch.as_str(), name.rsplit('.').nth(1)) {
            ("llama", Some("q_proj")) => Some(config.num_heads),
            ("llama", Some("k_proj")) => Some(config.num_kv_heads),
            _ => None,
        };
        if let Some(heads) = heads {
            let bytes = unpermute(bytes(), t, heads).map_err(&malformed)?;
            owned.push((name, stored(t.ty), shape, bytes));
        } else if arch.starts_with("gemma") && name.ends_with("norm.weight") {
            let bytes = unshift(bytes(), t).map_err(&malformed)?;
            owned.push((name, stored(GgmlType::F32), shape, bytes));
        } else {
            let range = t.start..t.start + t.len;
            ck.add_tensor(name, mapped, stored(t.ty), shape, range)?;
        }
    }
    add_owned(&mut ck, path, owned)?;
    Ok((config, ck))
}

/// A mixture's experts stacked in GGUF tensor `t` of file `mapped`, `[experts, rows, cols]`
/// (biases `[experts, rows]`), added as one tensor per expert under the family's Hugging
/// Face names (`stack`: layer, projection, kind), each a run of the stack's bytes; `path`
/// names the file in errors.
fn add_experts(
    ck: &mut Checkpoint,
    (path, mapped): (&Path, usize),
    t: &TensorInfo,
    arch: &str,
    (layer, which, kind): (usize, &str, &str),
) -> Result<()> {
    let shape = t.shape();
    let (n, each_shape) = match (&shape[..], kind) {
        (&[n, rows, cols], "weight") if n > 0 => (n, vec![rows, cols]),
        (&[n, rows], "bias") if n > 0 => (n, vec![rows]),
        _ => {
            return Err(ModelError::Gguf {
                path: path.to_path_buf(),
                message: format!("{}: {shape:?} is not a stack of experts", t.name),
            })
        }
    };
    let each = t.len / n;
    for e in 0..n {
        let name = expert_name(arch, layer, e, which, kind);
        let range = t.start + e * each..t.start + (e + 1) * each;
        ck.add_tensor(name, mapped, stored(t.ty), each_shape.clone(), range)?;
    }
    Ok(())
}

/// Tensors whose bytes were rewritten at load (reordered q/k rows, unshifted norms), one
/// after another in one buffer of the checkpoint.
fn add_owned(
    ck: &mut Checkpoint,
    path: &Path,
    owned: Vec<(String, Stored, Vec<usize>, Vec<u8>)>,
) -> Result<()> {
    let mut all = Vec::new();
    let mut ranges = Vec::new();
    for (_, _, _, bytes) in &owned {
        ranges.push(all.len()..all.len() + bytes.len());
        all.extend_from_slice(bytes);
    }
    let own = ck.add_bytes(path.to_path_buf(), Bytes::Owned(all));
    for ((name, dtype, shape, _), range) in owned.into_iter().zip(ranges) {
        ck.add_tensor(name, own, dtype, shape, range)?;
    }
    Ok(())
}

/// The layer, projection (`gate`, `up` or `down`) and kind (`weight` or `bias`) of a
/// stacked experts tensor (`blk.3.ffn_gate_exps.weight`, gpt-oss's `.bias`).
fn experts_tensor(gguf: &str) -> Option<(usize, &str, &str)> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (which, kind) = rest.strip_prefix("ffn_")?.split_once("_exps.")?;
    let known = matches!(which, "gate" | "up" | "down") && matches!(kind, "weight" | "bias");
    known.then_some((layer.parse().ok()?, which, kind))
}

/// The Hugging Face name of expert `e`'s projection `which` (its `kind`, weight or bias) in
/// layer `layer`: Mixtral's (`w1`, `w3`, `w2`; llama.cpp converts Mixtral to its `llama`
/// architecture) or Qwen's and gpt-oss's.
fn expert_name(arch: &str, layer: usize, e: usize, which: &str, kind: &str) -> String {
    if arch == "llama" {
        let w = match which {
            "gate" => "w1",
            "up" => "w3",
            _ => "w2",
        };
        return format!("model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.{kind}");
    }
    format!("model.layers.{layer}.mlp.experts.{e}.{which}_proj.{kind}")
}

/// How the loader sees a GGUF tensor type: every type the reader accepts is a weight format.
fn stored(ty: GgmlType) -> Stored {
    Stored::Format(ty)
}

/// The Hugging Face name of a tensor of llama.cpp's naming in a file of architecture
/// `arch` (`blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`); `None` for
/// names it does not know. Gemma's `ffn_norm` is its pre-MLP norm (its
/// `post_attention_layernorm` is `post_attention_norm`); Phi-3's `attn_qkv` and `ffn_up`
/// hold its fused projections.
pub fn hf_name(gguf: &str, arch: &str) -> Option<String> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    let gemma = arch.starts_with("gemma");
    let hf = match part {
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "post_attention_norm" if gemma => "post_attention_layernorm",
        "post_ffw_norm" if gemma => "post_feedforward_layernorm",
        "attn_qkv" if arch == "phi3" => "self_attn.qkv_proj",
        "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        // A mixture's router.
        "ffn_gate_inp" if arch == "llama" => "block_sparse_moe.gate",
        "ffn_gate_inp" if arch == "gpt-oss" => "mlp.router",
        "ffn_gate_inp" => "mlp.gate",
        // gpt-oss: the MLP's input norm, and each head's sink logit.
        "post_attention_norm" if arch == "gpt-oss" => "post_attention_layernorm",
        "attn_sinks" if arch == "gpt-oss" && kind == "weight" => {
            return Some(format!("model.layers.{layer}.self_attn.sinks"))
        }
        _ => return None,
    };
    match kind {
        "weight" | "bias" => Some(format!("model.layers.{layer}.{hf}.{kind}")),
        _ => None,
    }
}

/// The rows of a q or k projection of `heads` heads (a weight, or a bias of one value per
/// row) in Hugging Face order: within each head the converter stores the rotated pairs
/// interleaved (its row `2 b + a` is row `a * head_dim / 2 + b` of transformers').
fn unpermute(bytes: &[u8], t: &TensorInfo, heads: usize) -> std::result::Result<Vec<u8>, String> {
    let shape = t.shape();
    let rows = shape[0];
    let row_bytes = bytes.len() / rows.max(1);
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(format!(
            "tensor {} has {rows} rows, not an even number per head for {heads} heads",
            t.name
        ));
    }
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for a in 0..2 {
            for b in 0..half {
                let hf = h * head_dim + a * half + b;
                let stored = h * head_dim + 2 * b + a;
                out[hf * row_bytes..(hf + 1) * row_bytes]
                    .copy_from_slice(&bytes[stored * row_bytes..(stored + 1) * row_bytes]);
            }
        }
    }
    Ok(out)
}

/// A Gemma norm's weights `w` from the stored `1 + w`, in f32. For every stored value of
/// at least 1/2 the subtraction is exact, so the `1 + w` the model computes with is again
/// the stored value, as llama.cpp and transformers multiply by.
fn unshift(bytes: &[u8], t: &TensorInfo) -> std::result::Result<Vec<u8>, String> {
    let values = crate::formats::dequantize(t.ty, bytes, t.elems() as usize)
        .map_err(|e| format!("tensor {}: {e}", t.name))?;
    Ok(values
        .iter()
        .flat_map(|v| (v - 1.0).to_le_bytes())
        .collect())
}
