// matmul_skinny: the column kernel for any k (matmul_columns.wgsl has the contract), with
// scalar loads. matmul_skinny_vec.wgsl and matmul_skinny_sg.wgsl are the faster ones for
// k % 8 == 0 and keep this summation order.

@group(0) @binding(2) var<storage, read> w: array<u32>;          // [n, k] in WEIGHT_DTYPE

// Word i of the weights (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return w[i];
}

@compute @workgroup_size(64)
fn matmul_skinny(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let column = (wg.y * nwg.x + wg.x) * 64u + tid;
    let c = min(column, p.n - 1u);
    for (var r0 = p.first_row; r0 < p.m; r0 += ROWS) {
        var acc: array<f32, 8>;
        var sc: array<f32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
            sc[r] = row_scale(min(r0 + r, p.m - 1u));
        }
        if is_block_dtype() {
            // Whole blocks, so k % 8 == 0; eight weights decoded at a time.
            for (var j = 0u; j < p.k / 8u; j++) {
                var b = block8(c * row_words(p.k), j);
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(r0 + r, p.m - 1u);
                    for (var i = 0u; i < 8u; i++) {
                        acc[r] += xn_at(row, 8u * j + i, sc[r]) * b[i / 4u][i % 4u];
                    }
                }
            }
        } else if WEIGHT_DTYPE == DTYPE_F32 {
            for (var k = 0u; k < p.k; k++) {
                let b = bitcast<f32>(w[c * p.k + k]);
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(r0 + r, p.m - 1u);
                    acc[r] += xn_at(row, k, sc[r]) * b;
                }
            }
        } else {
            let words = p.k / 2u;
            for (var j = 0u; j < words; j++) {
                let b = unpack_pair(w[c * words + j], WEIGHT_DTYPE);
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(r0 + r, p.m - 1u);
                    acc[r] += xn_at(row, 2u * j, sc[r]) * b.x;
                    acc[r] += xn_at(row, 2u * j + 1u, sc[r]) * b.y;
                }
            }
        }
        if column < p.n {
            store_rows(r0, c, acc);
        }
    }
}
