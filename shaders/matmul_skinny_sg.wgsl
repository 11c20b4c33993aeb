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
        for (var j = 0u; j < p.k / 8u; j++) {
            let b = weights8(c, j);
            let b2 = weights8(c2, j);
            for (var r = 0u; r < ROWS; r++) {
                let row = min(r0 + r, p.m - 1u);
                let xl = x[row * p.k + 8u * j + (lane & 7u)];
                let xa = vec4<f32>(
                    subgroupBroadcast(xl, 0u),
                    subgroupBroadcast(xl, 1u),
                    subgroupBroadcast(xl, 2u),
                    subgroupBroadcast(xl, 3u),
                );
                let xb = vec4<f32>(
                    subgroupBroadcast(xl, 4u),
                    subgroupBroadcast(xl, 5u),
                    subgroupBroadcast(xl, 6u),
                    subgroupBroadcast(xl, 7u),
                );
                acc[r] = add8(acc[r], xa, xb, b);
                acc2[r] = add8(acc2[r], xa, xb, b2);
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
