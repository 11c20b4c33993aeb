// Shared by the kernels that hand x round within subgroups (matmul_skinny_sg.wgsl,
// moe_matmul_sg.wgsl); only kernels compiled where subgroups exist include it.

// The values v of lanes 0 .. 7, in lane order, in every lane.
fn broadcast8(v: f32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(
        vec4<f32>(
            subgroupBroadcast(v, 0u),
            subgroupBroadcast(v, 1u),
            subgroupBroadcast(v, 2u),
            subgroupBroadcast(v, 3u),
        ),
        vec4<f32>(
            subgroupBroadcast(v, 4u),
            subgroupBroadcast(v, 5u),
            subgroupBroadcast(v, 6u),
            subgroupBroadcast(v, 7u),
        ),
    );
}
