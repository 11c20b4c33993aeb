// Shared by reshape_and_cache.wgsl and reshape_and_cache_q.wgsl: the parameters, the input
// bindings, and where a token's slot lies in the bound shard. Each kernel declares the pool
// binding (4) itself: plain words, or atomic words for the quantized one.
// slot = physical_block * block_size + offset; a negative slot (padding) is skipped, and so
// is a slot whose block lives in another shard of the pool (one dispatch per shard).

struct Params {
    num_tokens: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    shard_first_block: u32,  // global id of the shard's first block
    shard_num_blocks: u32,   // blocks in the shard (stride between the K and V halves)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> key: array<f32>;          // [num_tokens, num_kv_heads, head_dim]
@group(0) @binding(2) var<storage, read> value: array<f32>;        // [num_tokens, num_kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> slot_mapping: array<i32>; // [num_tokens]

const NO_SLOT: vec2<u32> = vec2<u32>(0xffffffffu, 0u);

// (block within the bound shard, offset within the block) of token t's slot, or NO_SLOT
// when the token is padding or its block is in another shard.
fn local_slot(t: u32) -> vec2<u32> {
    let slot = slot_mapping[t];
    if slot < 0 {
        return NO_SLOT;
    }
    let block = u32(slot) / p.block_size;
    if block < p.shard_first_block || block - p.shard_first_block >= p.shard_num_blocks {
        return NO_SLOT;
    }
    return vec2<u32>(block - p.shard_first_block, u32(slot) % p.block_size);
}
