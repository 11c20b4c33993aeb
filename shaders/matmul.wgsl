// matmul: y[m, n_offset + n] = (accumulate ? y : 0) + sum_k x[m, k] * w[n, k] + bias[n_offset + n]
// The weight is a Hugging Face Linear weight, [out_features, in_features], or a row chunk of
// one when it exceeds a storage binding. Accumulating into y fuses the residual add.
// Grid: one workgroup per 64x64 tile of y (x = column tiles, y = row tiles); 16x16 threads,
// each owning 4 rows x 4 columns strided by 16 (rows lid.y + 16i, columns lid.x + 16j), so
// neighbouring threads read neighbouring words of workgroup memory (no bank conflicts);
// k advances 16 at a time through workgroup memory, stored k-major.
// Each output is one thread's sum over k in increasing k (acc += x * w), then + bias, then
// + y (matmul_store.wgsl, which also holds the parameters): the order the column kernels (matmul_skinny*.wgsl) keep, for batch invariance.

override WEIGHT_DTYPE: u32 = 0u;

@group(0) @binding(2) var<storage, read> w: array<u32>;          // [n, k] in WEIGHT_DTYPE

// Word i of the weights (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return w[i];
}

const TILE: u32 = 64u;
const TK: u32 = 16u;
// k-major, rows padded to LD words so that the k-strided stores do not collide in banks.
const LD: u32 = 65u;
var<workgroup> xs: array<f32, 1040>;  // [TK][LD], x rows
var<workgroup> ws: array<f32, 1040>;  // [TK][LD], weight rows (output columns)
// With NORM: the tile's rows' eight square-sum chains (chain c & 7 of row c >> 3), and their
// norm scales.
var<workgroup> chains: array<f32, 512>;
var<workgroup> scales: array<f32, 64>;

@compute @workgroup_size(16, 16)
fn matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row0 = wg.y * TILE;
    let col0 = wg.x * TILE;
    // acc[i] holds row lid.y + 16 i, columns lid.x + 16 j in component j.
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let words_per_row = select(p.k / 2u, p.k, WEIGHT_DTYPE == DTYPE_F32);
    if NORM {
        // The 512 chains of common.wgsl's inv_rms for the tile's 64 rows, two per thread
        // (neighbouring threads read neighbouring elements of a row), each summed in order;
        // then a thread per row adds its eight in order, as a single invocation would.
        for (var q = 0u; q < 2u; q++) {
            let c = li + 256u * q;
            let base = min(row0 + (c >> 3u), p.m - 1u) * p.k + (c & 7u);
            var sum = 0.0;
            for (var e = 0u; e < p.k; e += 8u) {
                let v = x[base + e];
                sum += v * v;
            }
            chains[c] = sum;
        }
        workgroupBarrier();
        if li < TILE {
            let c = 8u * li;
            let a = vec4<f32>(chains[c], chains[c + 1u], chains[c + 2u], chains[c + 3u]);
            let b = vec4<f32>(chains[c + 4u], chains[c + 5u], chains[c + 6u], chains[c + 7u]);
            scales[li] = inv_rms(a, b, p.k, p.eps);
        }
        workgroupBarrier();
    }
    for (var k0 = 0u; k0 < p.k; k0 += TK) {
        for (var i = 0u; i < 4u; i++) {
            let e = li + i * 256u;
            let r = e / TK;
            let c = e % TK;
            var v = 0.0;
            if row0 + r < p.m && k0 + c < p.k {
                v = xn_at(row0 + r, k0 + c, scales[r]);
            }
            xs[c * LD + r] = v;
        }
        if is_block_dtype() {
            // 64 rows x 2 groups of 8 weights (k is whole blocks, so k0 + 16 <= k), decoded
            // by half the threads.
            if li < 128u {
                let r = li / 2u;
                let c = (li % 2u) * 8u;
                var v: array<vec4<f32>, 2>;
                if col0 + r < p.n {
                    v = block8((col0 + r) * row_words(p.k), (k0 + c) / 8u);
                }
                for (var i = 0u; i < 8u; i++) {
                    ws[(c + i) * LD + r] = v[i / 4u][i % 4u];
                }
            }
        } else if WEIGHT_DTYPE == DTYPE_F32 {
            for (var i = 0u; i < 4u; i++) {
                let e = li + i * 256u;
                let r = e / TK;
                let c = e % TK;
                var v = 0.0;
                if col0 + r < p.n && k0 + c < p.k {
                    v = bitcast<f32>(w[(col0 + r) * words_per_row + k0 + c]);
                }
                ws[c * LD + r] = v;
            }
        } else {
            // 64 rows x 8 words of two elements; k is even for packed formats.
            for (var i = 0u; i < 2u; i++) {
                let e = li + i * 256u;
                let r = e / 8u;
                let c = (e % 8u) * 2u;
                var v = vec2<f32>(0.0);
                if col0 + r < p.n && k0 + c < p.k {
                    v = unpack_pair(w[(col0 + r) * words_per_row + (k0 + c) / 2u], WEIGHT_DTYPE);
                }
                ws[c * LD + r] = v.x;
                ws[(c + 1u) * LD + r] = v.y;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let xo = kk * LD + lid.y;
            let wo = kk * LD + lid.x;
            let b = vec4<f32>(ws[wo], ws[wo + 16u], ws[wo + 32u], ws[wo + 48u]);
            acc0 += xs[xo] * b;
            acc1 += xs[xo + 16u] * b;
            acc2 += xs[xo + 32u] * b;
            acc3 += xs[xo + 48u] * b;
        }
        workgroupBarrier();
    }
    let accs = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + lid.y + 16u * i;
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + lid.x + 16u * j;
            if r < p.m && c < p.n {
                store_output(r, p.n_offset + c, accs[i][j]);
            }
        }
    }
}
