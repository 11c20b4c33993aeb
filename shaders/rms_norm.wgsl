// rms_norm: out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * weight[:]
// One workgroup per row (token, or token and head for per-head q/k norms), in a 2-D grid
// when there are more rows than one grid dimension holds; the sum of squares is reduced in
// workgroup memory.

override WEIGHT_DTYPE: u32 = 0u;

struct Params {
    num_tokens: u32,
    hidden: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // [num_tokens, hidden]
@group(0) @binding(2) var<storage, read> weight: array<u32>;     // [hidden] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [num_tokens, hidden]

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

fn weight_at(i: u32) -> f32 {
    if WEIGHT_DTYPE == DTYPE_F32 {
        return bitcast<f32>(weight[i]);
    }
    let pair = unpack_pair(weight[i / 2u], WEIGHT_DTYPE);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(WG)
fn rms_norm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let t = wg.y * nwg.x + wg.x;
    if t >= p.num_tokens {
        return;  // uniform: the whole workgroup leaves
    }
    let base = t * p.hidden;
    var ss = 0.0;
    for (var i = tid; i < p.hidden; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    partial[tid] = ss;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            partial[tid] += partial[tid + stride];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(p.hidden) + p.eps);
    for (var i = tid; i < p.hidden; i += WG) {
        out[base + i] = x[base + i] * inv * weight_at(i);
    }
}
