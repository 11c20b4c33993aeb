// The expert kernels' body (moe_matmul.wgsl and moe_matmul_sg.wgsl, which differ in how
// they fetch x: each defines `x8(base, j, lane)`, the input row starting at 16-byte word
// `base`'s elements 8j .. 8j + 8). One projection of every expert of a mixture, over the slots routed to each
// (moe_route.wgsl's offsets and list): y[s, n_offset + c] = x[s / in_div] · W_e[c] for each
// slot s that chose expert e, where W_e is rows e * n .. (e + 1) * n of the weight binding
// (experts expert_first .. of the layer; a weight in several buffers gets a dispatch per
// buffer). in_div is top_k where the input is per token (gate and up read the token's normed
// hidden state) and 1 where it is per slot (down reads the slot's activation). k % 8 == 0.
//
// Grid: x covers the n output columns, 128 per workgroup, two per invocation (c and c + 64:
// each x value loaded serves two dot products, as in the dense column kernels,
// matmul_columns_vec.wgsl), or with ROWS = 1 256 per workgroup, four per invocation
// (one_slot_body); y is the expert. A workgroup walks its expert's slots ROWS at a
// time and decodes each group of eight weights once for all of them, so an expert's weights
// are read once per ROWS slots routed to it, and not at all when none are. x and the weights
// are read 16 bytes at a time (weights8.wgsl). Each output is one invocation's sum over k in
// increasing k, eight terms at a time (add8), as in the dense column kernels: a slot's result
// does not depend on the other slots.

override WEIGHT_DTYPE: u32 = 0u;
// Slots per group (1 to 8): the launcher picks the average slots per expert, rounded up to a
// power of two, so that one token's decode step does not multiply 8 rows for its 1.
override ROWS: u32 = 8u;

struct Params {
    n: u32,
    k: u32,
    ldy: u32,
    n_offset: u32,
    expert_first: u32,
    in_div: u32,
    // With a bias: bias[e * n + c] is added to expert e's output column c (gpt-oss).
    has_bias: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // [rows, k]
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;    // [experts * n, k] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read> offsets: array<u32>;    // [experts + 1]
@group(0) @binding(4) var<storage, read> list: array<u32>;       // slots by expert
@group(0) @binding(5) var<storage, read_write> y: array<f32>;    // [slots, ldy]
@group(0) @binding(6) var<storage, read> bias: array<f32>;       // [layer's experts * n]

// Expert e's output column c: the sum, then the bias where there is one (as r::matmul adds
// it).
fn biased(sum: f32, e: u32, c: u32) -> f32 {
    if p.has_bias == 1u {
        return sum + bias[e * p.n + c];
    }
    return sum;
}

// acc[r] += x · b[0] and acc2[r] += x · b[1] for each slot r of the pass (input rows at
// xrow[r]), eight terms of step j.
fn slot_terms(
    acc: ptr<function, array<f32, 8>>,
    acc2: ptr<function, array<f32, 8>>,
    xrow: ptr<function, array<u32, 8>>,
    j: u32,
    lane: u32,
    b: array<array<vec4<f32>, 2>, 2>,
) {
    for (var r = 0u; r < ROWS; r++) {
        let xv = x8((*xrow)[r], j, lane);
        (*acc)[r] = add8((*acc)[r], xv[0], xv[1], b[0]);
        (*acc2)[r] = add8((*acc2)[r], xv[0], xv[1], b[1]);
    }
}

fn moe_body(wg: vec3<u32>, tid: u32, lane: u32) {
    if ROWS == 1u {
        one_slot_body(wg, tid, lane);
        return;
    }
    let column = wg.x * 128u + tid;
    let c = min(column, p.n - 1u);
    let c2 = min(column + 64u, p.n - 1u);
    let e = p.expert_first + wg.y;
    let first = offsets[e];
    let end = offsets[e + 1u];
    let row = wg.y * p.n + c;
    let row2 = wg.y * p.n + c2;
    for (var r0 = first; r0 < end; r0 += ROWS) {
        var acc: array<f32, 8>;
        var acc2: array<f32, 8>;
        // Where each slot's input row starts, in 16-byte words.
        var xrow: array<u32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
            acc2[r] = 0.0;
            xrow[r] = (list[min(r0 + r, end - 1u)] / p.in_div) * (p.k / 4u);
        }
        // Groups of head_steps() steps (weights8.wgsl's heads2).
        let rows = vec2<u32>(row, row2);
        if head_steps() == 1u {
            for (var j = 0u; j < p.k / 8u; j++) {
                let b = array<array<vec4<f32>, 2>, 2>(weights8(row, j), weights8(row2, j));
                slot_terms(&acc, &acc2, &xrow, j, lane, b);
            }
        } else {
            var h = array<Head, 2>();
            for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
                h = heads2(h, rows, j0);
                for (var t = 0u; t < head_steps(); t++) {
                    slot_terms(&acc, &acc2, &xrow, j0 + t, lane, weights8x2(rows, h, j0 + t, t));
                }
            }
        }
        for (var r = 0u; r < ROWS; r++) {
            if r0 + r < end {
                let at = list[r0 + r] * p.ldy + p.n_offset;
                if column < p.n {
                    y[at + c] = biased(acc[r], e, c);
                }
                if column + 64u < p.n {
                    y[at + c2] = biased(acc2[r], e, c2);
                }
            }
        }
    }
}

// One-slot groups (a decode step of one token: each expert has at most one slot) give each
// invocation four columns, c + 64 i for i < 4, 256 per workgroup: a slot needs only four
// accumulators, and each x value loaded serves four dot products instead of two (as the
// dense kernels' WIDE one-row passes do).
fn one_slot_body(wg: vec3<u32>, tid: u32, lane: u32) {
    let column = wg.x * 256u + tid;
    let base = wg.y * p.n;
    let r0 = base + min(column, p.n - 1u);
    let r1 = base + min(column + 64u, p.n - 1u);
    let r2 = base + min(column + 128u, p.n - 1u);
    let r3 = base + min(column + 192u, p.n - 1u);
    let e = p.expert_first + wg.y;
    for (var s = offsets[e]; s < offsets[e + 1u]; s++) {
        let slot = list[s];
        let xrow = (slot / p.in_div) * (p.k / 4u);
        var a0 = 0.0;
        var a1 = 0.0;
        var a2 = 0.0;
        var a3 = 0.0;
        // Groups of head_steps() steps (weights8.wgsl's heads2); four scalar accumulators,
        // as a vec4 measured slower in the dense kernel's flat loop.
        if head_steps() == 1u {
            for (var j = 0u; j < p.k / 8u; j++) {
                let xv = x8(xrow, j, lane);
                a0 = add8(a0, xv[0], xv[1], weights8(r0, j));
                a1 = add8(a1, xv[0], xv[1], weights8(r1, j));
                a2 = add8(a2, xv[0], xv[1], weights8(r2, j));
                a3 = add8(a3, xv[0], xv[1], weights8(r3, j));
            }
        } else {
            var h = array<Head, 4>();
            for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
                h = heads4(h, vec4<u32>(r0, r1, r2, r3), j0);
                for (var t = 0u; t < head_steps(); t++) {
                    let j = j0 + t;
                    let xv = x8(xrow, j, lane);
                    a0 = add8(a0, xv[0], xv[1], weights8_with(r0, j, t, h[0]));
                    a1 = add8(a1, xv[0], xv[1], weights8_with(r1, j, t, h[1]));
                    a2 = add8(a2, xv[0], xv[1], weights8_with(r2, j, t, h[2]));
                    a3 = add8(a3, xv[0], xv[1], weights8_with(r3, j, t, h[3]));
                }
            }
        }
        let acc = array<f32, 4>(a0, a1, a2, a3);
        let at = slot * p.ldy + p.n_offset;
        for (var i = 0u; i < 4u; i++) {
            if column + 64u * i < p.n {
                y[at + column + 64u * i] = biased(acc[i], e, column + 64u * i);
            }
        }
    }
}
