// Eight consecutive weights of a row at a time, and the eight terms they add to a dot
// product: shared by the column kernels that read x and the weights 16 bytes at a time
// (matmul_columns_vec.wgsl's two, and moe_matmul.wgsl). The kernel declares the weight
// binding `w: array<vec4<u32>>` ([rows, k] in WEIGHT_DTYPE), the WEIGHT_DTYPE override and
// `p.k` (k % 8 == 0), and is compiled with weight_blocks.wgsl.

// Word i of the weights (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return w[i >> 2u][i & 3u];
}

// Weights 8j .. 8j + 7 of weight row c, in order.
fn weights8(c: u32, j: u32) -> array<vec4<f32>, 2> {
    if is_block_dtype() {
        return block8(c * row_words(p.k), j);
    }
    if WEIGHT_DTYPE == DTYPE_F32 {
        let i = c * (p.k / 4u) + 2u * j;
        return array<vec4<f32>, 2>(bitcast<vec4<f32>>(w[i]), bitcast<vec4<f32>>(w[i + 1u]));
    }
    let v = w[c * (p.k / 8u) + j];
    let b0 = unpack_pair(v.x, WEIGHT_DTYPE);
    let b1 = unpack_pair(v.y, WEIGHT_DTYPE);
    let b2 = unpack_pair(v.z, WEIGHT_DTYPE);
    let b3 = unpack_pair(v.w, WEIGHT_DTYPE);
    return array<vec4<f32>, 2>(vec4<f32>(b0, b1), vec4<f32>(b2, b3));
}

// The group constants of weights 8j .. of row c (block_head in weight_blocks.wgsl), and
// weights8 given them: a kernel computes the constants once every head_steps() steps.
fn weights_head(c: u32, j: u32) -> vec2<f32> {
    if is_block_dtype() {
        return block_head(c * row_words(p.k), j);
    }
    return vec2<f32>(0.0);
}

fn weights8_with(c: u32, j: u32, head: vec2<f32>) -> array<vec4<f32>, 2> {
    if is_block_dtype() {
        return block8_with(c * row_words(p.k), j, head);
    }
    return weights8(c, j);
}

// The heads of rows c[i] for step j: `h` where j is inside a group, new ones where it
// starts one.
fn heads2(h: array<vec2<f32>, 2>, c: vec2<u32>, j: u32) -> array<vec2<f32>, 2> {
    if j % head_steps() != 0u {
        return h;
    }
    return array<vec2<f32>, 2>(weights_head(c.x, j), weights_head(c.y, j));
}

fn heads4(h: array<vec2<f32>, 4>, c: vec4<u32>, j: u32) -> array<vec2<f32>, 4> {
    if j % head_steps() != 0u {
        return h;
    }
    return array<vec2<f32>, 4>(
        weights_head(c.x, j),
        weights_head(c.y, j),
        weights_head(c.z, j),
        weights_head(c.w, j),
    );
}

// acc + x[0..8] · w[0..8], adding one term at a time in increasing k (the order every
// matmul kernel keeps; see matmul_columns.wgsl).
fn add8(acc: f32, xa: vec4<f32>, xb: vec4<f32>, w: array<vec4<f32>, 2>) -> f32 {
    var a = acc;
    a += xa.x * w[0].x;
    a += xa.y * w[0].y;
    a += xa.z * w[0].z;
    a += xa.w * w[0].w;
    a += xb.x * w[1].x;
    a += xb.y * w[1].y;
    a += xb.z * w[1].z;
    a += xb.w * w[1].w;
    return a;
}
