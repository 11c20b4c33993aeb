// matmul_skinny_sg: matmul_skinny_vec.wgsl where subgroups of at least 8 invocations exist.
// Each group of 8 lanes loads 8 consecutive elements of an x row, one per lane, and hands
// them round with subgroupBroadcast: one load where matmul_skinny_vec has every lane load
// the same 8 values (on CPU adapters that load is a gather per lane). Same summation order
// as matmul_skinny.wgsl. No early return: broadcasts need every lane of the subgroup.

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
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;    // [n, k] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read> bias: array<f32>;       // [ldy]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;    // [m, ldy]

@compute @workgroup_size(64)
fn matmul_skinny_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let column = (wg.y * nwg.x + wg.x) * 64u + tid;
    let c = min(column, p.n - 1u);
    for (var r0 = 0u; r0 < p.m; r0 += ROWS) {
        var acc: array<f32, 8>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
        }
        for (var j = 0u; j < p.k / 8u; j++) {
            let b = weights8(c, j);
            for (var r = 0u; r < ROWS; r++) {
                let row = min(r0 + r, p.m - 1u);
                let xl = x[row * p.k + 8u * j + (lane & 7u)];
                acc[r] += subgroupBroadcast(xl, 0u) * b[0].x;
                acc[r] += subgroupBroadcast(xl, 1u) * b[0].y;
                acc[r] += subgroupBroadcast(xl, 2u) * b[0].z;
                acc[r] += subgroupBroadcast(xl, 3u) * b[0].w;
                acc[r] += subgroupBroadcast(xl, 4u) * b[1].x;
                acc[r] += subgroupBroadcast(xl, 5u) * b[1].y;
                acc[r] += subgroupBroadcast(xl, 6u) * b[1].z;
                acc[r] += subgroupBroadcast(xl, 7u) * b[1].w;
            }
        }
        if column < p.n {
            store_rows(r0, c, acc);
        }
    }
}

// Weights 8j .. 8j + 7 of column c, in order.
fn weights8(c: u32, j: u32) -> array<vec4<f32>, 2> {
    if WEIGHT_DTYPE == DTYPE_F32 {
        let i = c * (p.k / 4u) + 2u * j;
        return array<vec4<f32>, 2>(bitcast<vec4<f32>>(w[i]), bitcast<vec4<f32>>(w[i + 1u]));
    }
    let v = w[c * (p.k / 8u) + j];
    let b0 = unpack_pair(v.x, WEIGHT_DTYPE);
    let b1 = unpack_pair(v.y, WEIGHT_DTYPE);
    let b2 = unpack_pair(v.z, WEIGHT_DTYPE);
    let b3 = unpack_pair(v.w, WEIGHT_DTYPE);
    return array<vec4<f32>, 2>(vec4<f32>(b0, b1), vec4<f32>(b2, b3));
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
