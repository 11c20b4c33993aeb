// reshape_and_cache_q: reshape_and_cache for quantized pools. Each invocation quantizes one
// scale group of one token's K and V row (one KV head) and writes its codes and its scale
// into the token's slot; src/pool/quant.rs is the reference for the format and the rounding
// rule. A (block, KV head) tile is `block_size` rows of codes followed by the rows' f16
// scales, two per word; neighbouring groups, possibly of different tokens of one dispatch,
// share a scale word, so scales are merged into their word with atomic and/or.
// Grid: x covers (kv head, group) of a token row, 64 per workgroup; y = token.

override KV_DTYPE: u32 = 3u;  // DTYPE_INT8 or DTYPE_INT4
override KV_GROUP: u32 = 64u; // values per scale

@group(0) @binding(4) var<storage, read_write> kv: array<atomic<u32>>; // [2, shard_num_blocks, num_kv_heads, tile]

const F16_MAX: f32 = 65504.0;

// Quantizes src[base .. base + KV_GROUP] into the tile whose words start at `tile`, row
// `off`, group `g`.
fn store_group(is_value: bool, base: u32, tile: u32, off: u32, g: u32) {
    var raw: f32;
    var lo: f32;
    var hi: f32;
    if KV_DTYPE == DTYPE_INT8 {
        var amax = 0.0;
        for (var i = 0u; i < KV_GROUP; i++) {
            amax = max(amax, abs(load(is_value, base + i)));
        }
        raw = amax * (1.0 / 127.0);
        lo = -127.0;
        hi = 127.0;
    } else {
        var m = 0.0;
        for (var i = 0u; i < KV_GROUP; i++) {
            let x = load(is_value, base + i);
            if abs(x) > abs(m) {
                m = x;
            }
        }
        raw = m * -0.125;
        lo = -8.0;
        hi = 7.0;
    }
    // The scale as stored: the codes are computed against it, not against `raw`.
    let s_bits = pack2x16float(vec2<f32>(clamp(raw, -F16_MAX, F16_MAX), 0.0)) & 0xffffu;
    let s = unpack2x16float(s_bits).x;
    let inv = select(1.0 / s, 0.0, s == 0.0);

    let bits = select(4u, 8u, KV_DTYPE == DTYPE_INT8);
    let per_word = 32u / bits;
    let mask = (1u << bits) - 1u;
    let row_words = p.head_dim / per_word;
    let first = g * KV_GROUP;
    for (var w = 0u; w < KV_GROUP / per_word; w++) {
        var word = 0u;
        for (var k = 0u; k < per_word; k++) {
            let x = load(is_value, base + w * per_word + k);
            let c = i32(clamp(round(x * inv), lo, hi));
            word |= (bitcast<u32>(c) & mask) << (bits * k);
        }
        atomicStore(&kv[tile + off * row_words + first / per_word + w], word);
    }
    let groups = p.head_dim / KV_GROUP;
    let idx = off * groups + g;
    let sw = tile + p.block_size * row_words + idx / 2u;
    let shift = 16u * (idx % 2u);
    atomicAnd(&kv[sw], ~(0xffffu << shift));
    atomicOr(&kv[sw], s_bits << shift);
}

fn load(is_value: bool, i: u32) -> f32 {
    if is_value {
        return value[i];
    }
    return key[i];
}

@compute @workgroup_size(64)
fn reshape_and_cache_q(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let groups = p.head_dim / KV_GROUP;
    let h = gid.x / groups;
    let g = gid.x % groups;
    if t >= p.num_tokens || h >= p.num_kv_heads {
        return;
    }
    let at = local_slot(t);
    if at.x == NO_SLOT.x {
        return;
    }
    let local_block = at.x;
    let offset = at.y;
    let per_word = select(8u, 4u, KV_DTYPE == DTYPE_INT8);
    let row_words = p.head_dim / per_word;
    let tile_words = p.block_size * row_words + (p.block_size * groups + 1u) / 2u;
    let tile = (local_block * p.num_kv_heads + h) * tile_words;
    let v_half = p.shard_num_blocks * p.num_kv_heads * tile_words;
    let src = (t * p.num_kv_heads + h) * p.head_dim + g * KV_GROUP;
    store_group(false, src, tile, offset, g);
    store_group(true, src, v_half + tile, offset, g);
}
