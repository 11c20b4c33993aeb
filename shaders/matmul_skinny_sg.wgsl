// matmul_skinny_sg: matmul_skinny_vec.wgsl where subgroups of at least 8 invocations exist.
// Each group of 8 lanes loads 8 consecutive elements of an x row, one per lane, and hands
// them round with subgroupBroadcast: one load where matmul_skinny_vec has every lane load
// the same 8 values (on CPU adapters that load is a gather per lane). Same summation order
// as matmul_skinny.wgsl. No early return: broadcasts need every lane of the subgroup.

@group(0) @binding(1) var<storage, read> x: array<f32>;          // [m, k]

@compute @workgroup_size(64)
fn matmul_skinny_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let column = (wg.y * nwg.x + wg.x) * 64u + tid;
    let c = min(column, p.n - 1u);
    for (var r0 = 0u; r0 < p.m; r0 += ROWS) {
        var acc: array<f32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
        }
        for (var j = 0u; j < p.k / 8u; j++) {
            let b = weights8(c, j);
            for (var r = 0u; r < ROWS; r++) {
                let row = min(r0 + r, p.m - 1u);
                let xl = x[row * p.k + 8u * j + (lane & 7u)];
                acc[r] += subgroupBroadcast(xl, 0u) * b[0].x;
                acc[r] += subgroupBroadcast(xl, 1u) * b[0].y;
                acc[r] += subgroupBroadcast(xl, 2u) * b[0].z;
                acc[r] += subgroupBroadcast(xl, 3u) * b[0].w;
                acc[r] += subgroupBroadcast(xl, 4u) * b[1].x;
                acc[r] += subgroupBroadcast(xl, 5u) * b[1].y;
                acc[r] += subgroupBroadcast(xl, 6u) * b[1].z;
                acc[r] += subgroupBroadcast(xl, 7u) * b[1].w;
            }
        }
        if column < p.n {
            store_rows(r0, c, acc);
        }
    }
}
