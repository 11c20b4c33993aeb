// Shared by matmul_skinny_vec.wgsl and matmul_skinny_sg.wgsl (k % 8 == 0): the weights as
// 16-byte words, the read of eight consecutive ones, the eight terms they add, and the
// kernel body. The two kernels differ only in how they fetch x: each defines
// `x8(row, j, lane, s)` (x[row, 8j .. 8j + 8], normed with scale s under NORM),
// `pass_scales` (the norm scales of a pass's rows) and `pass_terms`, which adds a pass's
// eight terms of step j to every row's accumulators (`terms_by_row` below, or its own way).
// Both kernels give each invocation two columns, c and c + 64 (128 per workgroup): the
// loaded or broadcast x values then serve two dot products, which halves their cost per
// multiply on CPU adapters (measured: 1.4-1.5x faster at 8 and 32 rows on lavapipe; four
// columns spill registers there and are slower).

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // [m, k], or gated [m, 2k]
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;    // [n, k] in WEIGHT_DTYPE
// weights8 and add8 (weights8.wgsl) read it eight weights at a time.

// Input row `row`'s elements 4i .. 4i + 4, through matmul_store.wgsl's GATED.
fn x4(row: u32, i: u32) -> vec4<f32> {
    let at = row * (x_stride() / 4u) + i;
    if GATED == 0u {
        return x[at];
    }
    return gated4(x[at], x[at + p.k / 4u]);
}

// x4 as the product reads it: with NORM, times the row's norm scale `s` and the norm weight,
// as rms_norm_lanes.wgsl writes it.
fn xn4(row: u32, i: u32, s: f32) -> vec4<f32> {
    if NORM {
        return x4(row, i) * s * norm4(i);
    }
    return x4(row, i);
}

// With NORM, the norm scale of input row `row` (common.wgsl's inv_rms); 1 without.
fn row_scale(row: u32) -> f32 {
    if !NORM {
        return 1.0;
    }
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var j = 0u; j < p.k / 8u; j++) {
        let u = x4(row, 2u * j);
        let v = x4(row, 2u * j + 1u);
        a += u * u;
        b += v * v;
    }
    return inv_rms(a, b, p.k, p.eps);
}

// The norm scales of a pass's rows (`rows[r]` for row r0 + r; past the last row, the last
// row's), and in the subgroup kernel `own`, the scale of the row lane l of each group of 8
// loads in an 8-row pass (r0 + l). Each kernel defines `pass_scales(r0, lane)`.
struct Scales {
    rows: array<f32, 8>,
    own: f32,
}

// acc[r] += x[r0 + r, 8j .. 8j + 8] · b and acc2[r] likewise with b2, for the pass's rows
// (past the last row, the last row again), each row fetched by x8 with its norm scale.
fn terms_by_row(
    acc: ptr<function, array<f32, 8>>,
    acc2: ptr<function, array<f32, 8>>,
    r0: u32,
    j: u32,
    lane: u32,
    b: array<vec4<f32>, 2>,
    b2: array<vec4<f32>, 2>,
    sc: Scales,
) {
    for (var r = 0u; r < ROWS; r++) {
        let xv = x8(min(r0 + r, p.m - 1u), j, lane, sc.rows[r]);
        (*acc)[r] = add8((*acc)[r], xv[0], xv[1], b);
        (*acc2)[r] = add8((*acc2)[r], xv[0], xv[1], b2);
    }
}

// acc[i][r] += x[r0 + r, 8j .. 8j + 8] · b[i] for the four columns of columns_body4, row by
// row (terms_by_row's order).
fn terms_by_row4(
    acc: ptr<function, array<array<f32, 8>, 4>>,
    r0: u32,
    j: u32,
    lane: u32,
    b: array<array<vec4<f32>, 2>, 4>,
    sc: Scales,
) {
    for (var r = 0u; r < ROWS; r++) {
        let xv = x8(min(r0 + r, p.m - 1u), j, lane, sc.rows[r]);
        terms4_row(acc, r, xv[0], xv[1], b);
    }
}

// Row r's terms of one step in the four columns' accumulators.
fn terms4_row(
    acc: ptr<function, array<array<f32, 8>, 4>>,
    r: u32,
    xa: vec4<f32>,
    xb: vec4<f32>,
    b: array<array<vec4<f32>, 2>, 4>,
) {
    (*acc)[0][r] = add8((*acc)[0][r], xa, xb, b[0]);
    (*acc)[1][r] = add8((*acc)[1][r], xa, xb, b[1]);
    (*acc)[2][r] = add8((*acc)[2][r], xa, xb, b[2]);
    (*acc)[3][r] = add8((*acc)[3][r], xa, xb, b[3]);
}

// The body of both kernels, invocation `tid` of workgroup `wg` (of `nwg`), subgroup lane
// `lane`: columns c and c + 64 of the workgroup's 128, rows first_row .. m (one-row passes
// with WIDE: one_row_body).
fn columns_body(wg: vec3<u32>, nwg: vec3<u32>, tid: u32, lane: u32) {
    if ROWS == 1u && WIDE {
        one_row_body(wg, nwg, tid, lane);
        return;
    }
    let column = (wg.y * nwg.x + wg.x) * 128u + tid;
    let c = min(column, p.n - 1u);
    let c2 = min(column + 64u, p.n - 1u);
    for (var r0 = p.first_row; r0 < p.m; r0 += ROWS) {
        var acc: array<f32, 8>;
        var acc2: array<f32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
            acc2[r] = 0.0;
        }
        let sc = pass_scales(r0, lane);
        // Groups of head_steps() steps (weights8.wgsl's heads2).
        let cs = vec2<u32>(c, c2);
        if head_steps() == 1u {
            for (var j = 0u; j < p.k / 8u; j++) {
                pass_terms(&acc, &acc2, r0, j, lane, weights8(c, j), weights8(c2, j), sc);
            }
        } else {
            var h = array<Head, 2>();
            for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
                h = heads2(h, cs, j0);
                for (var t = 0u; t < head_steps(); t++) {
                    let b = weights8x2(cs, h, j0 + t, t);
                    pass_terms(&acc, &acc2, r0, j0 + t, lane, b[0], b[1], sc);
                }
            }
        }
        if column < p.n {
            store_rows(r0, c, acc);
        }
        if column + 64u < p.n {
            store_rows(r0, c2, acc2);
        }
    }
}

// With WIDE, one-row passes (a decode step's projections and LM head) give each invocation
// four columns, c + 64 i for i < 4, 256 per workgroup. A single row needs only four
// accumulators (more columns in the multi-row passes spill registers), and the row's eight
// x values of a step, loaded once, serve four dot products instead of two: 15-25% faster
// on lavapipe for the wider weights (docs/BENCHMARKS.md). The launcher asks for it on CPU
// adapters for weights wide enough to give every core two workgroups (1,024 columns on two
// cores); a GPU wants more workgroups, not wider ones. Each column's terms are added in the
// same order as in the other passes, so the results are the same bits.
override WIDE: bool = false;

// The wide kernels' body (matmul_skinny_vec_wide.wgsl, matmul_skinny_sg_wide.wgsl): passes
// of several rows that give each invocation four columns, c + 64 i for i < 4 (256 per
// workgroup), where wide one-row passes take one_row_body: each x value a lane loads or
// broadcasts then serves four dot products instead of two. Measured on lavapipe (`cargo bench --bench matmul -- --peak`):
// an 8-row pass of 4 columns ran at 1.33x the rate of one of 2, its sums in 32 registers
// of a CPU with 32 vector registers; 1.06-1.17x in this kernel on f16 weights of 1,536 to
// 32,000 columns at 16 rows, 1.15-1.3x at 128. Its own entry points, since a compiler
// inlines a body before it drops it as dead: in every other pipeline it made lavapipe's
// compilation 2.5x slower. Each column's terms are added in the same order as in
// the other passes, so the results are the same bits.
fn columns_body4(wg: vec3<u32>, nwg: vec3<u32>, tid: u32, lane: u32) {
    let column = (wg.y * nwg.x + wg.x) * 256u + tid;
    let cs = vec4<u32>(
        min(column, p.n - 1u),
        min(column + 64u, p.n - 1u),
        min(column + 128u, p.n - 1u),
        min(column + 192u, p.n - 1u),
    );
    for (var r0 = p.first_row; r0 < p.m; r0 += ROWS) {
        // Zeroed by a store at every pass (a var's implicit zero may be hoisted out of the
        // loop by a translator: the browser build's did so), and indexed by constants only.
        var acc: array<array<f32, 8>, 4>;
        acc = array<array<f32, 8>, 4>();
        let sc = pass_scales(r0, lane);
        // Groups of head_steps() steps (weights8.wgsl's heads4).
        if head_steps() == 1u {
            for (var j = 0u; j < p.k / 8u; j++) {
                let b = array<array<vec4<f32>, 2>, 4>(
                    weights8(cs.x, j),
                    weights8(cs.y, j),
                    weights8(cs.z, j),
                    weights8(cs.w, j),
                );
                pass_terms4(&acc, r0, j, lane, b, sc);
            }
        } else {
            var h = array<Head, 4>();
            for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
                h = heads4(h, cs, j0);
                for (var t = 0u; t < head_steps(); t++) {
                    let j = j0 + t;
                    let b = array<array<vec4<f32>, 2>, 4>(
                        weights8_with(cs.x, j, t, h[0]),
                        weights8_with(cs.y, j, t, h[1]),
                        weights8_with(cs.z, j, t, h[2]),
                        weights8_with(cs.w, j, t, h[3]),
                    );
                    pass_terms4(&acc, r0, j, lane, b, sc);
                }
            }
        }
        if column < p.n {
            store_rows(r0, cs.x, acc[0]);
        }
        if column + 64u < p.n {
            store_rows(r0, cs.y, acc[1]);
        }
        if column + 128u < p.n {
            store_rows(r0, cs.z, acc[2]);
        }
        if column + 192u < p.n {
            store_rows(r0, cs.w, acc[3]);
        }
    }
}

fn one_row_body(wg: vec3<u32>, nwg: vec3<u32>, tid: u32, lane: u32) {
    let column = (wg.y * nwg.x + wg.x) * 256u + tid;
    let c0 = min(column, p.n - 1u);
    let c1 = min(column + 64u, p.n - 1u);
    let c2 = min(column + 128u, p.n - 1u);
    let c3 = min(column + 192u, p.n - 1u);
    for (var r = p.first_row; r < p.m; r++) {
        var a0 = 0.0;
        var a1 = 0.0;
        var a2 = 0.0;
        var a3 = 0.0;
        let s = pass_scales(r, lane).rows[0];
        // Groups of head_steps() steps (weights8.wgsl's heads2).
        let cs = vec4<u32>(c0, c1, c2, c3);
        if head_steps() == 1u {
            for (var j = 0u; j < p.k / 8u; j++) {
                let xv = x8(r, j, lane, s);
                a0 = add8(a0, xv[0], xv[1], weights8(c0, j));
                a1 = add8(a1, xv[0], xv[1], weights8(c1, j));
                a2 = add8(a2, xv[0], xv[1], weights8(c2, j));
                a3 = add8(a3, xv[0], xv[1], weights8(c3, j));
            }
        } else {
            var h = array<Head, 4>();
            for (var j0 = 0u; j0 < p.k / 8u; j0 += head_steps()) {
                h = heads4(h, cs, j0);
                for (var t = 0u; t < head_steps(); t++) {
                    let j = j0 + t;
                    let xv = x8(r, j, lane, s);
                    a0 = add8(a0, xv[0], xv[1], weights8_with(c0, j, t, h[0]));
                    a1 = add8(a1, xv[0], xv[1], weights8_with(c1, j, t, h[1]));
                    a2 = add8(a2, xv[0], xv[1], weights8_with(c2, j, t, h[2]));
                    a3 = add8(a3, xv[0], xv[1], weights8_with(c3, j, t, h[3]));
                }
            }
        }
        let acc = array<f32, 4>(a0, a1, a2, a3);
        for (var i = 0u; i < 4u; i++) {
            if column + 64u * i < p.n {
                store_output(r, p.n_offset + column + 64u * i, acc[i]);
            }
        }
    }
}
