// matmul_skinny_vec: the column kernel for k % 8 == 0 (matmul_columns.wgsl has the
// contract), reading x and the weights 16 bytes at a time: CPU adapters turn each load whose
// address differs between lanes into a costly gather, whatever its width. Same summation
// order as matmul_skinny.wgsl. Used where subgroup operations are missing (e.g. GL); see
// matmul_skinny_sg.wgsl.

@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // [m, k]

@compute @workgroup_size(64)
fn matmul_skinny_vec(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
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
                let xa = x[row * (p.k / 4u) + 2u * j];
                let xb = x[row * (p.k / 4u) + 2u * j + 1u];
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
