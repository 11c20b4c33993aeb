// moe_matmul_sg: moe_matmul.wgsl where subgroups of at least 8 invocations exist: lane l of
// each group of 8 loads element 8j + l of the row and the eight values are broadcast
// (broadcast8.wgsl), where moe_matmul has every lane load all eight (on CPU adapters each
// load is a gather per lane). The same values reach the same sums: results are bitwise
// moe_matmul's. No early return: broadcasts need every lane of the subgroup, and every lane
// of a workgroup walks the same expert's slots.

fn x8(base: u32, j: u32, lane: u32) -> array<vec4<f32>, 2> {
    return broadcast8(x[base + 2u * j + ((lane & 7u) >> 2u)][lane & 3u]);
}

@compute @workgroup_size(64)
fn moe_matmul_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    moe_body(wg, tid, lane);
}
