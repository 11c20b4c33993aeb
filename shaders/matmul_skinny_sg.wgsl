// matmul_skinny_sg: matmul_skinny_vec.wgsl where subgroups of at least 8 invocations exist.
// Lanes of each group of 8 load different parts of x and hand them round with
// subgroupBroadcast, where matmul_skinny_vec has every lane load the same values (on CPU
// adapters every load is a gather per lane). Same summation order as matmul_skinny.wgsl.
// No early return: broadcasts need every lane of the subgroup.

// x[row, 8j .. 8j + 8]: lane l of each group of 8 takes element 8j + l (a component of a
// 16-byte load), and the eight values are broadcast to every lane.
fn x8(row: u32, j: u32, lane: u32) -> array<vec4<f32>, 2> {
    let xl = x4(row, 2u * j + ((lane & 7u) >> 2u))[lane & 3u];
    return array<vec4<f32>, 2>(
        vec4<f32>(
            subgroupBroadcast(xl, 0u),
            subgroupBroadcast(xl, 1u),
            subgroupBroadcast(xl, 2u),
            subgroupBroadcast(xl, 3u),
        ),
        vec4<f32>(
            subgroupBroadcast(xl, 4u),
            subgroupBroadcast(xl, 5u),
            subgroupBroadcast(xl, 6u),
            subgroupBroadcast(xl, 7u),
        ),
    );
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
) {
    if ROWS != 8u {
        terms_by_row(acc, acc2, r0, j, lane, b, b2);
        return;
    }
    let row = min(r0 + (lane & 7u), p.m - 1u);
    let held = array<vec4<f32>, 2>(x4(row, 2u * j), x4(row, 2u * j + 1u));
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

@compute @workgroup_size(64)
fn matmul_skinny_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    columns_body(wg, nwg, tid, lane);
}
