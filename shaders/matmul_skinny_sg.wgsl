// matmul_skinny_sg: matmul_skinny_vec.wgsl where subgroups of at least 8 invocations exist.
// Lanes of each group of 8 load different parts of x and hand them round with
// subgroupBroadcast, where matmul_skinny_vec has every lane load the same values (on CPU
// adapters every load is a gather per lane). Same summation order as matmul_skinny.wgsl.
// No early return: broadcasts need every lane of the subgroup.

// x[row, 8j .. 8j + 8]: lane l of each group of 8 takes element 8j + l (a component of a
// 16-byte load), and the eight values are broadcast to every lane.
// With NORM the element is normed as rms_norm_lanes.wgsl norms it (scale s, then the norm
// weight of that element alone).
fn x8(row: u32, j: u32, lane: u32, s: f32) -> array<vec4<f32>, 2> {
    var xl = x4(row, 2u * j + ((lane & 7u) >> 2u))[lane & 3u];
    if NORM {
        xl = xl * s * norm_at(8u * j + (lane & 7u));
    }
    return broadcast8(xl);
}

// The norm scales of a pass's rows. In a one-row pass the row's squares are summed in
// common.wgsl's eight chains with chain l computed by lane l of each group of 8 (the same
// additions in the same order as when one invocation keeps all eight) and the chains
// broadcast; in longer passes lane l of each group of 8 computes row r0 + l's scale (the row
// it loads in an 8-row pass), and row r's is broadcast from lane r.
fn pass_scales(r0: u32, lane: u32) -> Scales {
    var sc: Scales;
    if !NORM {
        for (var r = 0u; r < 8u; r++) {
            sc.rows[r] = 1.0;
        }
        sc.own = 1.0;
        return sc;
    }
    if ROWS == 1u {
        let base = r0 * (p.k / 4u);
        var chain = 0.0;
        for (var j = 0u; j < p.k / 8u; j++) {
            let v = x[base + 2u * j + ((lane & 7u) >> 2u)][lane & 3u];
            chain += v * v;
        }
        let chains = broadcast8(chain);
        sc.rows[0] = inv_rms(chains[0], chains[1], p.k, p.eps);
        sc.own = sc.rows[0];
        return sc;
    }
    sc.own = row_scale(min(r0 + (lane & 7u), p.m - 1u));
    let rows = broadcast8(sc.own);
    sc.rows = array<f32, 8>(rows[0].x, rows[0].y, rows[0].z, rows[0].w, rows[1].x, rows[1].y, rows[1].z, rows[1].w);
    return sc;
}

// The norm weights 8j .. 8j + 8 in an 8-row pass: lane l of each group of 8 loads element
// 8j + l and they are broadcast.
fn norm8(j: u32, lane: u32) -> array<vec4<f32>, 2> {
    return broadcast8(norm_at(8u * j + (lane & 7u)));
}

// In an 8-row pass, the eight elements 8j .. 8j + 8 of the row lane l of each group of 8
// loads (r0 + l), normed under NORM.
fn held8(r0: u32, j: u32, lane: u32, sc: Scales) -> array<vec4<f32>, 2> {
    let row = min(r0 + (lane & 7u), p.m - 1u);
    var held = array<vec4<f32>, 2>(x4(row, 2u * j), x4(row, 2u * j + 1u));
    if NORM {
        let g = norm8(j, lane);
        held = array<vec4<f32>, 2>(held[0] * sc.own * g[0], held[1] * sc.own * g[1]);
    }
    return held;
}

// A pass's terms of step j. Passes of eight rows: lane l of each group of 8 loads row
// r0 + l's eight elements (two 16-byte loads), and row r's are broadcast from lane r, so
// one load per lane serves all eight rows where `terms_by_row` takes one per row
// (measured on lavapipe: 1.1-1.25x faster 8-row passes, docs/BENCHMARKS.md). The
// broadcasts name their lane as a constant, so the rows are spelled out. Shorter passes
// (the rest of a step, a one-row decode) go row by row.
fn pass_terms(
    acc: ptr<function, array<f32, 8>>,
    acc2: ptr<function, array<f32, 8>>,
    r0: u32,
    j: u32,
    lane: u32,
    b: array<vec4<f32>, 2>,
    b2: array<vec4<f32>, 2>,
    sc: Scales,
) {
    if ROWS != 8u {
        terms_by_row(acc, acc2, r0, j, lane, b, b2, sc);
        return;
    }
    let held = held8(r0, j, lane, sc);
    var xa: vec4<f32>;
    var xb: vec4<f32>;
    xa = subgroupBroadcast(held[0], 0u);
    xb = subgroupBroadcast(held[1], 0u);
    (*acc)[0] = add8((*acc)[0], xa, xb, b);
    (*acc2)[0] = add8((*acc2)[0], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 1u);
    xb = subgroupBroadcast(held[1], 1u);
    (*acc)[1] = add8((*acc)[1], xa, xb, b);
    (*acc2)[1] = add8((*acc2)[1], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 2u);
    xb = subgroupBroadcast(held[1], 2u);
    (*acc)[2] = add8((*acc)[2], xa, xb, b);
    (*acc2)[2] = add8((*acc2)[2], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 3u);
    xb = subgroupBroadcast(held[1], 3u);
    (*acc)[3] = add8((*acc)[3], xa, xb, b);
    (*acc2)[3] = add8((*acc2)[3], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 4u);
    xb = subgroupBroadcast(held[1], 4u);
    (*acc)[4] = add8((*acc)[4], xa, xb, b);
    (*acc2)[4] = add8((*acc2)[4], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 5u);
    xb = subgroupBroadcast(held[1], 5u);
    (*acc)[5] = add8((*acc)[5], xa, xb, b);
    (*acc2)[5] = add8((*acc2)[5], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 6u);
    xb = subgroupBroadcast(held[1], 6u);
    (*acc)[6] = add8((*acc)[6], xa, xb, b);
    (*acc2)[6] = add8((*acc2)[6], xa, xb, b2);
    xa = subgroupBroadcast(held[0], 7u);
    xb = subgroupBroadcast(held[1], 7u);
    (*acc)[7] = add8((*acc)[7], xa, xb, b);
    (*acc2)[7] = add8((*acc2)[7], xa, xb, b2);
}

// pass_terms over four columns (columns_body4): row r's eight x values, broadcast once,
// serve all four.
fn pass_terms4(
    acc: ptr<function, array<array<f32, 8>, 4>>,
    r0: u32,
    j: u32,
    lane: u32,
    b: array<array<vec4<f32>, 2>, 4>,
    sc: Scales,
) {
    if ROWS != 8u {
        terms_by_row4(acc, r0, j, lane, b, sc);
        return;
    }
    let held = held8(r0, j, lane, sc);
    terms4_row(acc, 0u, subgroupBroadcast(held[0], 0u), subgroupBroadcast(held[1], 0u), b);
    terms4_row(acc, 1u, subgroupBroadcast(held[0], 1u), subgroupBroadcast(held[1], 1u), b);
    terms4_row(acc, 2u, subgroupBroadcast(held[0], 2u), subgroupBroadcast(held[1], 2u), b);
    terms4_row(acc, 3u, subgroupBroadcast(held[0], 3u), subgroupBroadcast(held[1], 3u), b);
    terms4_row(acc, 4u, subgroupBroadcast(held[0], 4u), subgroupBroadcast(held[1], 4u), b);
    terms4_row(acc, 5u, subgroupBroadcast(held[0], 5u), subgroupBroadcast(held[1], 5u), b);
    terms4_row(acc, 6u, subgroupBroadcast(held[0], 6u), subgroupBroadcast(held[1], 6u), b);
    terms4_row(acc, 7u, subgroupBroadcast(held[0], 7u), subgroupBroadcast(held[1], 7u), b);
}

@compute @workgroup_size(64)
fn matmul_skinny_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    columns_body(wg, nwg, tid, lane);
}
