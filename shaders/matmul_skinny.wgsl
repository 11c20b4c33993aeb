// matmul_skinny: the matmul of few rows (decode steps; every step on CPU adapters), same
// contract as matmul.wgsl: y[m, n_offset + n] = (accumulate ? y : 0) + sum_k x[m, k] * w[n, k]
// + bias. Each output is summed over k one term at a time, in increasing k, with the same
// expression as matmul.wgsl (acc += x * w, then + bias, then + y), so a row's result is
// bitwise the same whichever kernel computes it: batch invariance survives.
// This is the variant for any k; matmul_skinny_vec.wgsl and matmul_skinny_sg.wgsl are the
// faster ones for k % 8 == 0 and must keep this summation order.
// Grid: one invocation per output column (64 per workgroup, 2-D when the columns exceed
// the dispatch limit); it reads the column's weights once per ROWS rows of x.

override WEIGHT_DTYPE: u32 = 0u;
// Rows per pass (1, 2, 4 or 8), fixed per pipeline so the row loops unroll into registers.
override ROWS: u32 = 1u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    n_offset: u32,
    ldy: u32,
    has_bias: u32,
    accumulate: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // [m, k]
@group(0) @binding(2) var<storage, read> w: array<u32>;          // [n, k] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read> bias: array<f32>;       // [ldy]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;    // [m, ldy]

@compute @workgroup_size(64)
fn matmul_skinny(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let column = (wg.y * nwg.x + wg.x) * 64u + tid;
    let c = min(column, p.n - 1u);
    for (var r0 = 0u; r0 < p.m; r0 += ROWS) {
        var acc: array<f32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
        }
        if WEIGHT_DTYPE == DTYPE_F32 {
            for (var k = 0u; k < p.k; k++) {
                let b = bitcast<f32>(w[c * p.k + k]);
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(r0 + r, p.m - 1u);
                    acc[r] += x[row * p.k + k] * b;
                }
            }
        } else {
            let words = p.k / 2u;
            for (var j = 0u; j < words; j++) {
                let b = unpack_pair(w[c * words + j], WEIGHT_DTYPE);
                for (var r = 0u; r < ROWS; r++) {
                    let row = min(r0 + r, p.m - 1u);
                    acc[r] += x[row * p.k + 2u * j] * b.x;
                    acc[r] += x[row * p.k + 2u * j + 1u] * b.y;
                }
            }
        }
        if column < p.n {
            store_rows(r0, c, acc);
        }
    }
}

// Writes the pass's rows r0 .. r0 + ROWS (those below m) of column c.
fn store_rows(r0: u32, c: u32, acc: array<f32, 8>) {
    let col = p.n_offset + c;
    for (var r = 0u; r < ROWS; r++) {
        if r0 + r < p.m {
            var v = acc[r];
            if p.has_bias != 0u {
                v += bias[col];
            }
            let o = (r0 + r) * p.ldy + col;
            if p.accumulate != 0u {
                v += y[o];
            }
            y[o] = v;
        }
    }
}
