// moe_matmul: the expert kernel (moe_matmul_body.wgsl has the contract) reading x 16 bytes
// at a time, every lane the same values. moe_matmul_sg.wgsl is faster where subgroups of at
// least 8 invocations exist, with the same results bit for bit.

// x at 16-byte word `base` (an input row's start), elements 8j .. 8j + 8.
fn x8(base: u32, j: u32, lane: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(x[base + 2u * j], x[base + 2u * j + 1u]);
}

@compute @workgroup_size(64)
fn moe_matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    moe_body(wg, tid, 0u);
}
