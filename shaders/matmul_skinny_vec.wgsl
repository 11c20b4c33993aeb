// matmul_skinny_vec: the column kernel for k % 8 == 0 (matmul_columns.wgsl has the
// contract), reading x and the weights 16 bytes at a time: CPU adapters turn each load whose
// address differs between lanes into a costly gather, whatever its width. Same summation
// order as matmul_skinny.wgsl. Used where subgroup operations are missing (e.g. GL); see
// matmul_skinny_sg.wgsl.

// x[row, 8j .. 8j + 8] as two 16-byte loads.
fn x8(row: u32, j: u32, lane: u32, s: f32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(xn4(row, 2u * j, s), xn4(row, 2u * j + 1u, s));
}

// Every row's norm scale, computed by every invocation.
fn pass_scales(r0: u32, lane: u32) -> Scales {
    var sc: Scales;
    for (var r = 0u; r < ROWS; r++) {
        sc.rows[r] = row_scale(min(r0 + r, p.m - 1u));
    }
    return sc;
}

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
    terms_by_row(acc, acc2, r0, j, lane, b, b2, sc);
}

fn pass_terms4(
    acc: ptr<function, array<array<f32, 8>, 4>>,
    r0: u32,
    j: u32,
    lane: u32,
    b: array<array<vec4<f32>, 2>, 4>,
    sc: Scales,
) {
    terms_by_row4(acc, r0, j, lane, b, sc);
}

@compute @workgroup_size(64)
fn matmul_skinny_vec(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    columns_body(wg, nwg, tid, 0u);
}
