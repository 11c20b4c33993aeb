//! Fitting what the device has: a KV pool the device refuses as out of memory is asked for
//! again at half the size, down to the blocks one full-context sequence needs; weights or a
//! pool that do not fit even so give an error saying how much was needed and which options
//! would make it fit (a smaller weight format, a quantized KV cache, a shorter context).
//!
//! A pool given no size ([`PoolFit`]) takes a share of the memory the device reports free
//! once the weights are on it, between one full-context sequence and every sequence at the
//! full context; a device that reports nothing, or whose memory is the host's, gets
//! [`fallback_pool_bytes`] at most: a share of its largest buffer, 256 MiB at most.

use super::{Result, RunnerError, RunnerSpec};
use crate::error::GpuError;
use crate::gpu::{DeviceMemory, GpuContext, MemorySource};
use crate::pool::{KvPool, PoolSize};

/// The most a pool takes where the device reports no memory, or where its memory is the
/// host's (software and integrated adapters), unless told otherwise.
pub const FALLBACK_POOL_BYTES: u64 = 256 << 20;

/// The pool's bytes on a device that reports no memory: half its largest buffer (a device
/// that offers small buffers is a small one: WebGPU's default 256 MiB gives 128), at most
/// [`FALLBACK_POOL_BYTES`].
pub fn fallback_pool_bytes(limits: &wgpu::Limits) -> u64 {
    (limits.max_buffer_size / 2).min(FALLBACK_POOL_BYTES)
}

/// How a pool given no size is sized.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolFit {
    /// What the device reported before the weights were uploaded.
    pub memory: Option<DeviceMemory>,
    /// The share of the memory free after the weights that the pool takes.
    pub fraction: f64,
    /// Blocks every sequence the engine runs at once takes at the full context: more
    /// would never be used by running sequences.
    pub max_blocks: usize,
    /// The pool's bytes where the device reports nothing, and the most it takes of host
    /// memory ([`fallback_pool_bytes`]).
    pub fallback: u64,
}

impl PoolFit {
    /// The pool's bytes once `taken` bytes (the weights) are gone from what the device
    /// reported, with why, for the log. Where the device reports its memory through the
    /// driver, it is asked again (`now`), which counts every buffer made since.
    pub fn pool_bytes(&self, taken: u64, now: Option<DeviceMemory>) -> (u64, String) {
        let Some(before) = self.memory else {
            return (
                self.fallback,
                format!(
                    "{:.0} MiB as the device reports no free memory",
                    mib(self.fallback)
                ),
            );
        };
        let (free, m) = match now {
            Some(now) if now.source != MemorySource::Injected => (now.available(), now),
            _ => (before.available().saturating_sub(taken), before),
        };
        let share = (free as f64 * self.fraction) as u64;
        let why = format!(
            "{:.0}% of the {:.1} MiB the device reports free after the weights (it reported {m})",
            self.fraction * 100.0,
            mib(free)
        );
        if m.host_memory && share > self.fallback {
            return (
                self.fallback,
                format!(
                    "at most {:.0} MiB of host memory; {why}",
                    mib(self.fallback)
                ),
            );
        }
        (share, why)
    }

    /// Blocks of `block_bytes` for a pool of `bytes`, between `needed` (one full-context
    /// sequence) and [`Self::max_blocks`].
    pub fn blocks(&self, bytes: u64, block_bytes: u64, needed: usize) -> usize {
        ((bytes / block_bytes.max(1)) as usize)
            .min(self.max_blocks)
            .max(needed)
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// `spec` with its pool's size settled: where it has a [`PoolFit`], the blocks it gives
/// once `weights` bytes of weights are on the device (logged with why).
pub(super) fn settle(ctx: &GpuContext, spec: &RunnerSpec, weights: u64) -> RunnerSpec {
    let Some(fit) = spec.fit else {
        return spec.clone();
    };
    let per_block = spec.layout.block_bytes_all_layers();
    let (bytes, why) = fit.pool_bytes(weights, ctx.memory());
    let needed = spec.min_gpu_blocks.unwrap_or(1);
    let blocks = fit.blocks(bytes, per_block, needed);
    let bound = if blocks == fit.max_blocks && blocks as u64 * per_block < bytes {
        "; capped at every sequence (--max-num-seqs) at the full context"
    } else if blocks == needed && (blocks as u64 * per_block) > bytes {
        "; raised to one sequence at the full context"
    } else {
        ""
    };
    tracing::info!(
        "KV pool: {blocks} blocks ({:.1} MiB), {why}{bound}",
        mib(blocks as u64 * per_block)
    );
    RunnerSpec {
        gpu_blocks: blocks,
        fit: None,
        ..spec.clone()
    }
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

/// `e`, or for a step workspace the device refused as out of memory, an error saying what
/// sizes it and what would make it fit.
pub(super) fn workspace_refused(e: GpuError, spec: &RunnerSpec) -> RunnerError {
    let GpuError::OutOfMemory { context: oom } = &e else {
        return e.into();
    };
    RunnerError::DoesNotFit(format!(
        "the step's working buffers for {} tokens and {} sampled rows a step do not fit: the \
         device refused them (out of memory while {oom}); to fit, compute fewer tokens a step \
         (--max-batched-tokens) or run fewer sequences at once (--max-num-seqs)",
        spec.max_tokens, spec.max_rows
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn discrete(budget: u64, usage: u64) -> DeviceMemory {
        DeviceMemory {
            budget,
            usage,
            host_memory: false,
            source: MemorySource::VulkanBudget,
        }
    }

    fn fit(memory: Option<DeviceMemory>) -> PoolFit {
        PoolFit {
            memory,
            fraction: 0.8,
            max_blocks: 1000,
            fallback: FALLBACK_POOL_BYTES,
        }
    }

    #[test]
    fn the_pool_takes_its_share_of_what_the_weights_left() {
        // 8 GiB budget, 2 GiB used by this process before loading: 6 GiB free. The
        // driver asked again after the weights says 5 GiB are left: 0.8 x 5 GiB.
        let f = fit(Some(discrete(8192 * MIB, 2048 * MIB)));
        let (bytes, why) = f.pool_bytes(1024 * MIB, Some(discrete(8192 * MIB, 3072 * MIB)));
        assert_eq!(bytes, 4096 * MIB);
        assert!(why.starts_with("80% of the 5120.0 MiB"), "{why}");
        // An injected report is not asked again: the weights come off what it said.
        let injected = fit(Some(DeviceMemory::injected(100 * MIB)));
        let (bytes, _) = injected.pool_bytes(60 * MIB, Some(DeviceMemory::injected(100 * MIB)));
        assert_eq!(bytes, 32 * MIB);
        // Weights larger than the report leave nothing (the floor below still holds one
        // sequence, which the device then gives or refuses).
        assert_eq!(injected.pool_bytes(200 * MIB, None).0, 0);
    }

    #[test]
    fn host_memory_and_silent_devices_get_the_fallback_at_most() {
        let host = DeviceMemory {
            host_memory: true,
            ..discrete(24 << 30, 0)
        };
        let (bytes, why) = fit(Some(host)).pool_bytes(0, None);
        assert_eq!(bytes, FALLBACK_POOL_BYTES);
        assert!(why.contains("host memory"), "{why}");
        // The host-memory cap is the device's fallback (half its largest buffer).
        let small = PoolFit {
            fallback: 128 * MIB,
            ..fit(Some(host))
        };
        assert_eq!(small.pool_bytes(0, None).0, 128 * MIB);
        // A small host-memory report is taken at its share, like any other.
        let small = DeviceMemory {
            host_memory: true,
            ..discrete(100 * MIB, 0)
        };
        assert_eq!(fit(Some(small)).pool_bytes(0, None).0, 80 * MIB);
        let (bytes, why) = fit(None).pool_bytes(123, None);
        assert_eq!(bytes, FALLBACK_POOL_BYTES);
        assert!(why.contains("reports no free memory"), "{why}");
        // The fallback follows the largest buffer the device offers.
        let limits = |max_buffer_size| wgpu::Limits {
            max_buffer_size,
            ..wgpu::Limits::default()
        };
        assert_eq!(fallback_pool_bytes(&limits(256 * MIB)), 128 * MIB);
        assert_eq!(
            fallback_pool_bytes(&limits(4096 * MIB)),
            FALLBACK_POOL_BYTES
        );
    }

    #[test]
    fn blocks_stay_between_one_sequence_and_every_sequence() {
        let f = fit(None);
        // 10 MiB of 32 KiB blocks: 320.
        assert_eq!(f.blocks(10 * MIB, 32 << 10, 32), 320);
        // Below one sequence: raised to it.
        assert_eq!(f.blocks(MIB / 2, 32 << 10, 32), 32);
        // Above every sequence at the full context: capped.
        assert_eq!(f.blocks(1 << 40, 32 << 10, 32), 1000);
    }
}
