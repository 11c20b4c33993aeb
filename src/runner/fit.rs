//! Fitting what the device has: a KV pool the device refuses as out of memory is asked for
//! again at half the size, down to the blocks one full-context sequence needs; weights or a
//! pool that do not fit even so give an error saying how much was needed and which options
//! would make it fit (a smaller weight format, a quantized KV cache, a shorter context).

use super::{Result, RunnerError, RunnerSpec};
use crate::error::GpuError;
use crate::gpu::GpuContext;
use crate::pool::{KvPool, PoolSize};

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The device pool of `spec`: `gpu_blocks` blocks, or, where the device refuses them as out
/// of memory, as many as it gives halving down to `min_gpu_blocks`.
pub(super) fn allocate_pool(ctx: &GpuContext, spec: &RunnerSpec) -> Result<KvPool> {
    let per_block = spec.layout.block_bytes_all_layers();
    let mut blocks = spec.gpu_blocks;
    loop {
        match KvPool::new(ctx, spec.layout, PoolSize::Blocks(blocks)) {
            Ok(pool) => {
                if blocks < spec.gpu_blocks {
                    tracing::warn!(
                        "the device refused a KV pool of {} blocks ({:.1} MiB); using {} \
                         ({:.1} MiB)",
                        spec.gpu_blocks,
                        mib(spec.gpu_blocks as u64 * per_block),
                        blocks,
                        mib(blocks as u64 * per_block)
                    );
                }
                return Ok(pool);
            }
            Err(GpuError::OutOfMemory { context }) => {
                let min = spec.min_gpu_blocks.unwrap_or(spec.gpu_blocks);
                if blocks <= min {
                    return Err(pool_refused(spec, blocks, &context));
                }
                blocks = (blocks / 2).max(min);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The error for a pool the device refused at its smallest.
fn pool_refused(spec: &RunnerSpec, blocks: usize, context: &str) -> RunnerError {
    let per_block = spec.layout.block_bytes_all_layers();
    RunnerError::DoesNotFit(format!(
        "the KV cache needs at least {blocks} blocks ({:.1} MiB) to hold one sequence of \
         {} tokens, and the device refused them (out of memory while {context}); to fit, \
         store it quantized (--kv-dtype int8 holds 1.94x the tokens of f16, int4 3.56x), \
         shorten the context (--max-model-len), or make room with a smaller weight format \
         (--weight-dtype q4_k)",
        mib(blocks as u64 * per_block),
        spec.max_model_len
    ))
}

/// `e`, or for weights the device refused as out of memory, an error saying what they
/// need (`total` bytes to upload) and what would make them fit.
pub(super) fn weights_refused(
    e: crate::model::ModelError,
    total: u64,
    spec: &RunnerSpec,
) -> RunnerError {
    let oom = match &e {
        crate::model::ModelError::Gpu(GpuError::OutOfMemory { context }) => context.clone(),
        _ => return e.into(),
    };
    let format = spec
        .weight_dtype
        .map_or("as stored".to_string(), |w| format!("converted to {w:?}"));
    RunnerError::DoesNotFit(format!(
        "the model's weights ({:.1} MiB in the checkpoint, uploaded {format}) do not fit: the \
         device refused them (out of memory while {oom}); to fit, quantize them as they load \
         (--weight-dtype q4_k takes about 0.28x the memory of f16, q8_0 about 0.53x) or use \
         a smaller model",
        mib(total)
    ))
}
