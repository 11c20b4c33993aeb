// matmul_skinny_sg: matmul_skinny_vec.wgsl where subgroups of at least 8 invocations exist.
// Each group of 8 lanes loads 8 consecutive elements of an x row, one per lane, and hands
// them round with subgroupBroadcast: one load where matmul_skinny_vec has every lane load
// the same 8 values (on CPU adapters that load is a gather per lane). Same summation order
// as matmul_skinny.wgsl. No early return: broadcasts need every lane of the subgroup.

@group(0) @binding(1) var<storage, read> x: array<f32>;          // [m, k]

// x[row, 8j .. 8j + 8]: lane l of each group of 8 loads element 8j + l, and the eight
// values are broadcast to every lane.
fn x8(row: u32, j: u32, lane: u32) -> array<vec4<f32>, 2> {
    let xl = x[row * p.k + 8u * j + (lane & 7u)];
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

@compute @workgroup_size(64)
fn matmul_skinny_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    columns_body(wg, nwg, tid, lane);
}
