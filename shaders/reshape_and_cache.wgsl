// reshape_and_cache: writes the new K and V of each token into its slot of the paged pool.
// Padding tokens and slots in other shards are skipped (reshape_common.wgsl).
// The bound slab is one layer's K and V for the blocks of one shard.
// Grid: x covers (kv head, word) of a token row, 64 per workgroup; y = token.

override KV_DTYPE: u32 = 1u;  // DTYPE_F32 or DTYPE_F16

@group(0) @binding(4) var<storage, read_write> kv: array<u32>;     // [2, shard_num_blocks, num_kv_heads, block_size, head_dim] in KV_DTYPE

@compute @workgroup_size(64)
fn reshape_and_cache(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let per_elem = select(2u, 1u, KV_DTYPE == DTYPE_F32);  // elements per word
    let row_words = p.head_dim / per_elem;
    let h = gid.x / row_words;
    let word = gid.x % row_words;
    if t >= p.num_tokens || h >= p.num_kv_heads {
        return;
    }
    let at = local_slot(t);
    if at.x == NO_SLOT.x {
        return;
    }
    let local_block = at.x;
    let offset = at.y;
    let dst = ((local_block * p.num_kv_heads + h) * p.block_size + offset) * row_words + word;
    let v_half = p.shard_num_blocks * p.num_kv_heads * p.block_size * row_words;
    let src = (t * p.num_kv_heads + h) * p.head_dim + word * per_elem;
    if KV_DTYPE == DTYPE_F32 {
        kv[dst] = bitcast<u32>(key[src]);
        kv[v_half + dst] = bitcast<u32>(value[src]);
    } else {
        kv[dst] = pack2x16float(vec2<f32>(key[src], key[src + 1u]));
        kv[v_half + dst] = pack2x16float(vec2<f32>(value[src], value[src + 1u]));
    }
}
