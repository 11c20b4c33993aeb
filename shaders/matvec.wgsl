// matvec: the matmul of a few rows (m <= 8, decode steps), same contract as matmul.wgsl:
// y[m, n_offset + n] = (accumulate ? y : 0) + sum_k x[m, k] * w[n, k] + bias[n_offset + n]
// Each weight row is read once for all m rows, which is what bounds decode speed.
// Grid: one workgroup per output column n (2-D when n exceeds the dispatch limit); 64
// threads stride over k and reduce in workgroup memory.

override WEIGHT_DTYPE: u32 = 0u;

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

const WG: u32 = 64u;
const MAX_M: u32 = 8u;
var<workgroup> partial: array<f32, 512>;  // [MAX_M][WG]

@compute @workgroup_size(WG)
fn matvec(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let n = wg.y * nwg.x + wg.x;
    var acc: array<f32, MAX_M>;
    for (var i = 0u; i < MAX_M; i++) {
        acc[i] = 0.0;
    }
    if n < p.n {
        if WEIGHT_DTYPE == DTYPE_F32 {
            for (var k = tid; k < p.k; k += WG) {
                let wv = bitcast<f32>(w[n * p.k + k]);
                for (var r = 0u; r < p.m; r++) {
                    acc[r] += x[r * p.k + k] * wv;
                }
            }
        } else {
            let words = p.k / 2u;
            for (var j = tid; j < words; j += WG) {
                let wv = unpack_pair(w[n * words + j], WEIGHT_DTYPE);
                for (var r = 0u; r < p.m; r++) {
                    let xo = r * p.k + 2u * j;
                    acc[r] += x[xo] * wv.x + x[xo + 1u] * wv.y;
                }
            }
        }
    }
    for (var r = 0u; r < MAX_M; r++) {
        partial[r * WG + tid] = acc[r];
    }
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            for (var r = 0u; r < MAX_M; r++) {
                partial[r * WG + tid] += partial[r * WG + tid + stride];
            }
        }
        workgroupBarrier();
    }
    if n < p.n && tid < p.m {
        let col = p.n_offset + n;
        var v = partial[tid * WG];
        if p.has_bias != 0u {
            v += bias[col];
        }
        let o = tid * p.ldy + col;
        if p.accumulate != 0u {
            v += y[o];
        }
        y[o] = v;
    }
}
