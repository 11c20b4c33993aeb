// embedding: out[t, :] = table[ids[t] - row_offset, :] * scale for the ids this table chunk
// holds (scale is 1, or Gemma's sqrt(hidden_size)).
// A table larger than one storage binding is split into row chunks, one dispatch each.
// Grid: x covers hidden elements (256 per workgroup), y = token.

override WEIGHT_DTYPE: u32 = 0u;

struct Params {
    num_tokens: u32,
    hidden: u32,
    row_offset: u32,  // first vocabulary row held by this table chunk
    num_rows: u32,    // rows in this chunk
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;        // [num_tokens]
@group(0) @binding(2) var<storage, read> table: array<u32>;      // [num_rows, hidden] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [num_tokens, hidden]

// Word i of the table (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return table[i];
}

@compute @workgroup_size(256)
fn embedding(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if i >= p.hidden || t >= p.num_tokens {
        return;
    }
    let id = ids[t];
    if id < p.row_offset || id - p.row_offset >= p.num_rows {
        return;
    }
    let e = (id - p.row_offset) * p.hidden + i;
    var v: f32;
    if is_block_dtype() {
        // The row's group of eight that holds element i.
        var g = block8((id - p.row_offset) * row_words(p.hidden), i / 8u);
        v = g[(i % 8u) / 4u][i % 4u];
    } else if WEIGHT_DTYPE == DTYPE_F32 {
        v = bitcast<f32>(table[e]);
    } else {
        let pair = unpack_pair(table[e / 2u], WEIGHT_DTYPE);
        v = select(pair.x, pair.y, (e & 1u) == 1u);
    }
    out[t * p.hidden + i] = v * p.scale;
}
