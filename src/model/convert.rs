//! Weights converted to another format as they load (`--weight-dtype`,
//! `EngineConfig::weight_dtype`): a safetensors model quantized to Q8_0 or Q4_K while it
//! uploads, in plain Rust with the reference quantizers of [`crate::formats::ggml`], or a GGUF
//! model's blocks widened to f16 or f32.
//!
//! What converts: every 2-D tensor, which is every weight a matmul or the embedding gather
//! reads (the projections, the embedding table and the LM head). Norms and biases keep their
//! own format (the loader widens them to f32 where needed). A tensor whose rows are not whole
//! blocks of the target format (a 256-element K-quant block and a row of 100) keeps the
//! format it has, with a warning naming it: llama.cpp likewise falls back for such tensors.

use super::checkpoint::Part;
use super::error::{ModelError, Result};
use crate::kernels::weight::encode;
use crate::kernels::WeightDtype;
use std::borrow::Cow;

/// The bytes and format `part` (the tensor `name`) uploads as when converted to `to`
/// (`None`: kept as stored).
pub(crate) fn converted<'a>(
    name: &str,
    part: &Part<'a>,
    to: Option<WeightDtype>,
) -> Result<(Cow<'a, [u8]>, WeightDtype)> {
    let keep = Ok((Cow::Borrowed(part.bytes), part.dtype));
    let Some(to) = to.filter(|&to| to != part.dtype) else {
        return keep;
    };
    if !part.cols.is_multiple_of(to.block_elems()) {
        tracing::warn!(
            "{name}: rows of {} elements are not whole {}-element blocks of {}; kept as {}",
            part.cols,
            to.block_elems(),
            to.name(),
            part.dtype.name()
        );
        return keep;
    }
    let bytes = encode(&part.to_f32(), to).map_err(|e| {
        ModelError::Unsupported(format!("{name} cannot be converted to {}: {e}", to.name()))
    })?;
    Ok((Cow::Owned(bytes), to))
}

impl super::ModelFiles {
    /// This model with its weights converted to `to` in host memory, as `converted` would
    /// convert them while uploading: for tests and tools that compare a format with its
    /// dequantized copy (`files.converted(Q4_K)?.converted(F32)?` holds in f32 exactly the
    /// values that the Q4_K weights decode to).
    pub fn converted(&self, to: WeightDtype) -> Result<super::ModelFiles> {
        use super::checkpoint::{Bytes, Checkpoint, Stored};
        let ck = &self.checkpoint;
        let mut all = Vec::new();
        let mut tensors = Vec::new();
        for name in ck.names() {
            let t = ck.get(name)?;
            let (bytes, dtype) = match *t.shape {
                [rows, cols] => {
                    let part = Part {
                        dtype: t.dtype,
                        rows,
                        cols,
                        bytes: t.bytes,
                    };
                    converted(name, &part, Some(to))?
                }
                _ => (Cow::Borrowed(t.bytes), t.dtype),
            };
            tensors.push((
                name.to_string(),
                dtype,
                t.shape.to_vec(),
                all.len()..all.len() + bytes.len(),
            ));
            all.extend_from_slice(&bytes);
        }
        let mut out = Checkpoint::empty();
        let file = out.add_bytes(
            self.dir.join(format!("(converted to {to})")),
            Bytes::Owned(all),
        );
        for (name, dtype, shape, range) in tensors {
            out.add_tensor(name, file, Stored::Format(dtype), shape, range)?;
        }
        super::spec::validate(&self.config, &out)?;
        Ok(super::ModelFiles {
            dir: self.dir.clone(),
            config: self.config.clone(),
            checkpoint: out,
        })
    }
}
