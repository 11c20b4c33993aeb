// matmul_skinny_sg_wide: matmul_skinny_sg.wgsl's passes of several rows at four columns an
// invocation (columns_body4 in matmul_columns_vec.wgsl, which has the measurements). The
// launcher takes it for such passes where the plan makes them wide.

@compute @workgroup_size(64)
fn matmul_skinny_sg_wide(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    columns_body4(wg, nwg, tid, lane);
}
