//! Launcher for `shaders/reshape_and_cache.wgsl`: the step's new K and V into their slots.

use super::{check_len, groups, params, RESHAPE_AND_CACHE, RESHAPE_AND_CACHE_Q};
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, Bind};
use crate::pool::KvPool;

params!(ReshapeAndCacheParams for RESHAPE_AND_CACHE {
    num_tokens: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    shard_first_block: u32,
    shard_num_blocks: u32,
    _pad0: u32,
    _pad1: u32,
});

/// Writes `key`/`value` (`[num_tokens, num_kv_heads, head_dim]` f32) of layer `layer` into the
/// pool at `slot_mapping` (`[num_tokens]` i32, slot = block * block_size + offset, negative =
/// skip). One dispatch per pool shard. A quantized pool quantizes each scale group as it
/// stores it (`shaders/reshape_and_cache_q.wgsl`, format in [`crate::formats::kv_blocks`]). The
/// pool's rotation is the caller's to apply to `key` and `value` first (the forward pass
/// does).
pub fn reshape_and_cache<'a>(
    batch: &mut Batch,
    pool: &KvPool,
    layer: usize,
    key: &wgpu::Buffer,
    value: &wgpu::Buffer,
    slot_mapping: impl Into<Bind<'a>>,
    num_tokens: usize,
) -> Result<()> {
    let slot_mapping: Bind<'_> = slot_mapping.into();
    const K: &str = "reshape_and_cache";
    let l = pool.layout;
    if layer >= l.num_layers {
        return Err(GpuError::invalid(
            K,
            format!("layer {layer} of {}", l.num_layers),
        ));
    }
    check_len(K, "key", key, num_tokens * l.num_kv_heads * l.head_dim)?;
    check_len(K, "value", value, num_tokens * l.num_kv_heads * l.head_dim)?;
    check_len(K, "slot_mapping", slot_mapping, num_tokens)?;
    for shard in 0..pool.num_shards() {
        let (first, count) = pool.shard_range(shard);
        let p = ReshapeAndCacheParams {
            num_tokens: num_tokens as u32,
            num_kv_heads: l.num_kv_heads as u32,
            head_dim: l.head_dim as u32,
            block_size: l.block_size as u32,
            shard_first_block: first as u32,
            shard_num_blocks: count as u32,
            ..Default::default()
        };
        let bindings = [
            key.into(),
            value.into(),
            slot_mapping,
            pool.slab(layer, shard),
        ];
        if l.dtype.is_quantized() {
            let group = l.group_size();
            batch.dispatch(
                RESHAPE_AND_CACHE_Q,
                &[("KV_DTYPE", l.dtype.code()), ("KV_GROUP", group as f64)],
                &p,
                &bindings,
                [
                    groups(l.num_kv_heads * l.head_dim / group, 64),
                    num_tokens as u32,
                    1,
                ],
            )?;
            continue;
        }
        batch.dispatch(
            RESHAPE_AND_CACHE,
            &[("KV_DTYPE", l.dtype.code())],
            &p,
            &bindings,
            [
                groups(l.num_kv_heads * l.row_words(), 64),
                num_tokens as u32,
                1,
            ],
        )?;
    }
    Ok(())
}
