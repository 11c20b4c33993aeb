//! How big a runner's pools are, and how a model's layers share their blocks: for the
//! engine ([`PoolPlan::for_engine`]: a byte budget or block counts, checked to hold one
//! sequence at its peak, with KV cache groups where layers mix windows), for a draft model
//! ([`PoolPlan::for_draft`]: every running sequence at the full context, within the
//! target pool's bytes) and for the scorer ([`PoolPlan::for_window`]: one window).

use super::fit::PoolFit;
use super::{Result, RunnerError, RunnerSpec};
use crate::cache::{KvGroups, LayerGroups};
use crate::config::EngineConfig;
use crate::gpu::DeviceMemory;
use crate::model::ModelConfig;
use crate::pool::{KvLayout, KvRotation};

/// The KV layout `config` asks of model `c`, validated: one slab per layer.
pub fn kv_layout(c: &ModelConfig, config: &EngineConfig) -> Result<KvLayout> {
    let layout = KvLayout {
        num_layers: c.num_layers,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        block_size: config.block_size,
        dtype: config.kv_dtype,
    };
    layout
        .validate()
        .map_err(|e| RunnerError::Config(e.to_string()))?;
    Ok(layout)
}

/// The rotation `config` asks for (by default: what its KV dtype wants).
pub fn kv_rotation(config: &EngineConfig) -> KvRotation {
    config
        .kv_rotation
        .unwrap_or(KvRotation::default_for(config.kv_dtype))
}

/// A runner's pools: the block layout, the device and host pools' sizes, and how the
/// layers map onto KV cache groups.
#[derive(Clone, Debug)]
pub struct PoolPlan {
    pub layer_groups: LayerGroups,
    pub kv_groups: KvGroups,
    /// One block: `layer_groups.slabs` layers.
    pub layout: KvLayout,
    pub gpu_blocks: usize,
    pub cpu_blocks: usize,
    /// Blocks one sequence holds at most.
    pub needed: usize,
    /// Where the pool was given no size: how the runner sizes it from the device's memory.
    pub fit: Option<PoolFit>,
}

impl PoolPlan {
    /// The engine's pools for model `c` at context `max_model_len`, checked to hold one
    /// sequence at its peak (every block of its context, except in windowed groups, which
    /// hold their window and a step's chunk).
    pub fn for_engine(
        c: &ModelConfig,
        config: &EngineConfig,
        max_model_len: usize,
        memory: Option<DeviceMemory>,
        fallback: u64,
    ) -> Result<Self> {
        let (layer_groups, kv_groups) = kv_groups(c, config, max_model_len);
        let layout = KvLayout {
            num_layers: layer_groups.slabs,
            ..kv_layout(c, config)?
        };
        let blocks_in = |bytes: u64| (bytes / layout.block_bytes_all_layers()) as usize;
        let needed = kv_groups.blocks_between(0, max_model_len, config.block_size);
        // Given no size, the pool is fitted to the device once the weights are on it; until
        // then it is planned at one sequence.
        let fit = match (config.num_gpu_blocks, config.kv_cache_bytes) {
            (None, None) => Some(PoolFit {
                memory,
                fraction: config.kv_memory_fraction,
                max_blocks: needed * config.max_num_seqs.max(1),
                fallback,
            }),
            _ => None,
        };
        let gpu_blocks = match (config.num_gpu_blocks, config.kv_cache_bytes) {
            (Some(n), _) => n,
            (None, Some(bytes)) => blocks_in(bytes),
            (None, None) => needed,
        };
        if gpu_blocks < needed {
            return Err(RunnerError::Config(format!(
                "a KV pool of {gpu_blocks} blocks cannot hold one sequence of {max_model_len} tokens \
                 ({needed} blocks of {} tokens over {} KV cache group(s)); give more blocks \
                 (--num-gpu-blocks) or a smaller --max-model-len",
                config.block_size,
                kv_groups.len()
            )));
        }
        let cpu_blocks = config
            .num_cpu_blocks
            .unwrap_or(blocks_in(config.swap_space_bytes));
        Ok(PoolPlan {
            layer_groups,
            kv_groups,
            layout,
            gpu_blocks,
            cpu_blocks,
            needed,
            fit,
        })
    }

    /// A draft model's pool: every running sequence at the full context, in the engine's
    /// block size and KV dtype, within `pool_bytes` (the target pool's); no host pool. The
    /// error says why it cannot hold one sequence.
    pub fn for_draft(
        c: &ModelConfig,
        config: &EngineConfig,
        max_model_len: usize,
        pool_bytes: u64,
    ) -> std::result::Result<Self, String> {
        let layout = kv_layout(c, config).map_err(|e| e.to_string())?;
        let per_seq = max_model_len.div_ceil(config.block_size) + 1;
        let affordable = (pool_bytes / layout.block_bytes_all_layers()) as usize;
        let blocks = (config.max_num_seqs.max(1) * per_seq).min(affordable);
        if blocks < per_seq {
            return Err(format!(
                "a pool of {blocks} blocks (the target pool's bytes) cannot hold one sequence \
                 of {max_model_len} tokens; give more KV memory or a smaller --max-model-len"
            ));
        }
        Ok(Self::single(c, layout, blocks, per_seq))
    }

    /// The scorer's pool: one window of `context` tokens.
    pub fn for_window(c: &ModelConfig, config: &EngineConfig, context: usize) -> Result<Self> {
        let layout = kv_layout(c, config)?;
        let blocks = context.div_ceil(config.block_size);
        Ok(Self::single(c, layout, blocks, blocks))
    }

    fn single(c: &ModelConfig, layout: KvLayout, blocks: usize, needed: usize) -> Self {
        PoolPlan {
            layer_groups: LayerGroups::single(c.num_layers),
            kv_groups: KvGroups::default(),
            layout,
            gpu_blocks: blocks,
            cpu_blocks: 0,
            needed,
            fit: None,
        }
    }

    /// The runner of this plan, for a model at context `max_model_len` computing at most
    /// `max_tokens` tokens and `max_rows` sampled rows a step.
    pub fn runner_spec(
        &self,
        config: &EngineConfig,
        max_model_len: usize,
        max_tokens: usize,
        max_rows: usize,
    ) -> RunnerSpec {
        RunnerSpec {
            max_model_len,
            weight_dtype: config.weight_dtype,
            layout: self.layout,
            gpu_blocks: self.gpu_blocks,
            cpu_blocks: self.cpu_blocks,
            min_gpu_blocks: Some(self.needed),
            fit: self.fit,
            rotation: kv_rotation(config),
            layer_slots: Some(self.layer_groups.layer_slots.clone()),
            max_tokens,
            max_rows,
        }
    }
}

/// The context of an engine whose pool is fitted to `pool_bytes` and whose context was not
/// given: `context` (the model's) where one sequence of it fits, else the longest whole
/// number of blocks that does (with a warning saying why and what to change), or
/// `context` where not even one block does (the load then fails saying what it needs).
pub fn fit_context(
    c: &ModelConfig,
    config: &EngineConfig,
    context: usize,
    pool_bytes: u64,
) -> Result<usize> {
    let base = kv_layout(c, config)?;
    let bs = config.block_size;
    let per_sequence = |ctx: usize| {
        let (layers, groups) = kv_groups(c, config, ctx);
        let layout = KvLayout {
            num_layers: layers.slabs,
            ..base
        };
        groups.blocks_between(0, ctx, bs) as u64 * layout.block_bytes_all_layers()
    };
    if per_sequence(context) <= pool_bytes {
        return Ok(context);
    }
    // The longest context of whole blocks that fits (a sequence's bytes grow with it).
    let (mut lo, mut hi) = (0, context / bs);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if per_sequence(mid * bs) <= pool_bytes {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        return Ok(context);
    }
    let fitted = lo * bs;
    tracing::warn!(
        "one sequence of the model's context of {context} tokens needs {:.1} MiB of KV cache, \
         more than the {:.1} MiB the device's free memory gives it; serving a context of \
         {fitted} tokens (--max-model-len sets one; --kv-dtype int8 or int4 fits more tokens \
         in the same memory)",
        per_sequence(context) as f64 / (1 << 20) as f64,
        pool_bytes as f64 / (1 << 20) as f64
    );
    Ok(fitted)
}

/// How the model's layers share KV blocks: with `free_out_of_window_blocks`, a model whose
/// layers all slide by one window gives back blocks that left it (one group with that
/// window), and a model that mixes windowed and global layers keeps a block table per group
/// of layers ([`LayerGroups::plan`]); otherwise one group keeps every block.
fn kv_groups(
    c: &ModelConfig,
    config: &EngineConfig,
    max_model_len: usize,
) -> (LayerGroups, KvGroups) {
    let chunk = config.max_num_batched_tokens;
    let single = LayerGroups::single(c.num_layers);
    if !config.free_out_of_window_blocks {
        return (single, KvGroups::default());
    }
    if let Some(w) = c.recipe.common_window() {
        return (single, KvGroups::new(vec![Some(w)], chunk));
    }
    let windows: Vec<Option<usize>> = c.recipe.layers.iter().map(|l| l.window).collect();
    let plan = LayerGroups::plan(&windows, max_model_len);
    let groups = KvGroups::new(plan.windows.clone(), chunk);
    (plan, groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::KvDtype;

    /// The shipped model: 4 layers, 2 KV heads of 64, a context of 512 tokens; one f16
    /// block of 16 tokens is 32 KiB, one full sequence 32 blocks (1 MiB).
    fn shipped() -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama");
        ModelConfig::from_dir(&dir).unwrap()
    }

    #[test]
    fn the_context_shrinks_to_what_one_sequence_of_the_pool_holds() {
        let c = shipped();
        let config = EngineConfig::default();
        assert_eq!(c.default_context(), 512);
        // One sequence fits: the model's context.
        assert_eq!(fit_context(&c, &config, 512, 1 << 20).unwrap(), 512);
        assert_eq!(fit_context(&c, &config, 512, 3 << 20).unwrap(), 512);
        // 400 KiB hold 12 blocks of 32 KiB: 192 tokens.
        assert_eq!(fit_context(&c, &config, 512, 400 << 10).unwrap(), 192);
        // Not even one block: the context stays, and the load says what it needs.
        assert_eq!(fit_context(&c, &config, 512, 1000).unwrap(), 512);
        // int8 blocks are smaller, so the same bytes hold more tokens.
        let int8 = EngineConfig {
            kv_dtype: KvDtype::Int8,
            ..EngineConfig::default()
        };
        let t = fit_context(&c, &int8, 512, 400 << 10).unwrap();
        assert!(t > 192 * 3 / 2 && t.is_multiple_of(16), "{t}");
    }

    #[test]
    fn a_pool_given_no_size_is_fitted_between_one_and_every_sequence() {
        let c = shipped();
        let config = EngineConfig {
            max_num_seqs: 8,
            ..EngineConfig::default()
        };
        let plan = PoolPlan::for_engine(&c, &config, 512, None, 256 << 20).unwrap();
        assert_eq!(plan.needed, 32);
        let fit = plan.fit.expect("fitted");
        assert_eq!((fit.max_blocks, fit.fraction), (8 * 32, 0.8));
        assert_eq!(plan.runner_spec(&config, 512, 64, 8).fit, Some(fit));
        // A size given, in blocks or bytes: no fitting.
        for given in [
            EngineConfig {
                num_gpu_blocks: Some(40),
                ..config.clone()
            },
            EngineConfig {
                kv_cache_bytes: Some(40 << 15),
                ..config.clone()
            },
        ] {
            let plan = PoolPlan::for_engine(&c, &given, 512, None, 256 << 20).unwrap();
            assert_eq!((plan.gpu_blocks, plan.fit), (40, None));
        }
    }
}
