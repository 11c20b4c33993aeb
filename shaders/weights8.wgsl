// Eight consecutive weights of a row at a time, and the eight terms they add to a dot
// product: shared by the column kernels that read x and the weights 16 bytes at a time
// (matmul_columns_vec.wgsl's two, and moe_matmul.wgsl). The kernel declares the weight
// binding `w: array<vec4<u32>>` ([rows, k] in WEIGHT_DTYPE), the WEIGHT_DTYPE override and
// `p.k` (k % 8 == 0), and is compiled with weight_blocks.wgsl.

// Word i of the weights (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return w[i >> 2u][i & 3u];
}

// Weights 8j .. 8j + 7 of weight row c, in order, for the formats of one step a group
// (head_steps() == 1: the float formats, Q2_K, Q3_K, IQ4_XS; weights8_with reads the others).
fn weights8(c: u32, j: u32) -> array<vec4<f32>, 2> {
    if is_block_dtype() {
        return block8_single(c * row_words(p.k), j);
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

// A group's constants, which a kernel computes once every head_steps() steps: the scale and
// min of its block or sub-block (weight_blocks.wgsl). For the K formats and the grouped 32-element
// formats also the 16-byte words that hold the group's codes (a group of two steps reads one
// half of each: Q4_K's code nibbles, Q5_K's and its high bits, Q6_K's low and high bits,
// Q8_0's bytes; a 4-bit block's group of four reads each half twice) and the super-block's
// scales and d (the four blocks' header and high bits), loaded once per super-block: on a
// CPU adapter a load per lane costs about the same for 4 bytes as for 16, and loads were
// what a block-format step cost most there (docs/BENCHMARKS.md).
struct Head {
    s: vec2<f32>,
    ql: vec4<u32>,
    qh: vec4<u32>,
    top: vec4<u32>,
    d: f32,
    // Q5_0's and Q5_1's high bits of the group's block.
    hw: u32,
}

// The group constants of weights 8j .. of row c, given the previous group's `prev` (formats of
// more than one step a group).
fn weights_head(c: u32, j: u32, prev: Head) -> Head {
    var h: Head;
    let row = c * row_words(p.k);
    if grouped32() {
        // A group of four blocks' constants (and high bits), loaded once per 128 weights; a
        // block's codes once per block (Q8_0: per half block).
        h.top = prev.top;
        h.qh = prev.qh;
        let b = j / 4u;
        if j % 16u == 0u {
            let group = q32_group(row, b);
            h.top = w[group >> 2u];
            if five_bit() {
                h.qh = w[(group + 4u) >> 2u];
            }
        }
        h.s = q32_head(h.top[q32_head_word(b % 4u)], b % 4u);
        h.hw = h.qh[b % 4u];
        h.ql = w[(q32_codes(row, b) + q32_step_word(j % 4u)) >> 2u];
        return h;
    }
    let base = row + (j / 32u) * block_words();
    let g = j % 32u;
    h.top = prev.top;
    h.d = prev.d;
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        if g == 0u {
            h.top = w[(base + 48u) >> 2u];
            h.d = unpack2x16float(w[(base + 52u) >> 2u].x).x;
        }
        // q6_k_scale's expression, from the scales held.
        let si = 8u * (g / 16u) + (g % 16u) / 2u;
        h.s = vec2<f32>(h.d * f32(extractBits(bitcast<i32>(h.top[si / 4u]), 8u * (si % 4u), 8u)), 0.0);
        let at = q6_k_words(base, g);
        h.ql = w[at.x >> 2u];
        h.qh = w[at.y >> 2u];
        return h;
    }
    if g == 0u {
        h.top = w[base >> 2u];
    }
    h.s = k_asym_scale_min(h.top, g);
    let at = k_asym_words(base, g);
    h.ql = w[at.x >> 2u];
    if WEIGHT_DTYPE == DTYPE_Q5_K {
        h.qh = w[at.y >> 2u];
    }
    return h;
}

// Weights 8j .. 8j + 8 of row c, step `s` (0 .. head_steps()) of the group whose `head` it
// is, for the formats of more than one step a group (Q4_0 .. Q8_0, IQ4_NL, MXFP4, Q4_K, Q5_K,
// Q6_K; weights8 reads the others). The kernels step through a group in an inner loop of
// head_steps() iterations, which a compiler unrolls: `s` is then a constant, and so are the
// shifts and the halves of the 16-byte words that it picks.
fn weights8_with(c: u32, j: u32, s: u32, head: Head) -> array<vec4<f32>, 2> {
    let second = (s & 1u) == 1u;
    if WEIGHT_DTYPE == DTYPE_Q6_K {
        let ql = select(head.ql.xy, head.ql.zw, second);
        let qh = select(head.qh.xy, head.qh.zw, second);
        return block8_q6_k_six(q6_k_six(ql, qh, j % 32u), head.s.x);
    }
    if grouped32() {
        // A 4-bit block's steps are its group's (s = j % 4); Q8_0's two steps read its words
        // in halves.
        return block8_q32(select(head.ql.xy, head.ql.zw, second), head.hw, s, head.s);
    }
    // Q4_K and Q5_K.
    let qs = select(head.ql.xy, head.ql.zw, second);
    let qh = select(head.qh.xy, head.qh.zw, second);
    return block8_k_asym_words(qs, qh, j % 32u, head.s);
}

// The heads of rows c[i] for the group of steps from j (a multiple of head_steps()), given
// the previous group's.
//
// The kernels step through a row in groups of head_steps() steps, the inner loop of two:
//     for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
//         h = heads2(h, c, j0);
//         for (var t = 0u; t < head_steps(); t++) { ... weights8_with(c.x, j0 + t, t, h[0]) ... }
//     }
// A compiler unrolls the inner loop, so that `t` and what it picks (shifts, halves of words)
// are constants: on lavapipe, with the grouped 32-element layout, the LM head shape at one
// row ran 1.3-1.7x faster in every format with groups of 2 or 4 steps (docs/BENCHMARKS.md).
// The formats of one step a group (f16 and the like, Q2_K, Q3_K, IQ4_XS) keep a flat loop
// over weights8, with no heads: nested loops of one step each measured 10% slower for f16,
// and their steps made into groups of four 15-20% slower. Each loop calls only its formats'
// code (weights8, weights8_with): a compiler inlines every format's code at each call and
// drops the other formats' only afterwards, so calls that reached every format made
// compiling a column kernel about twice as slow on lavapipe. The four-column bodies keep four scalar accumulators, as a
// vec4 measured 10-15% slower for f16.
fn heads2(h: array<Head, 2>, c: vec2<u32>, j: u32) -> array<Head, 2> {
    return array<Head, 2>(weights_head(c.x, j, h[0]), weights_head(c.y, j, h[1]));
}

fn heads4(h: array<Head, 4>, c: vec4<u32>, j: u32) -> array<Head, 4> {
    return array<Head, 4>(
        weights_head(c.x, j, h[0]),
        weights_head(c.y, j, h[1]),
        weights_head(c.z, j, h[2]),
        weights_head(c.w, j, h[3]),
    );
}

// Weights 8j .. 8j + 8 of rows c.x and c.y, step t of their groups.
fn weights8x2(c: vec2<u32>, h: array<Head, 2>, j: u32, t: u32) -> array<array<vec4<f32>, 2>, 2> {
    return array<array<vec4<f32>, 2>, 2>(weights8_with(c.x, j, t, h[0]), weights8_with(c.y, j, t, h[1]));
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
