// rms_norm_lanes: rms_norm.wgsl with one invocation per row, eight rows per workgroup, for
// CPU adapters: there a workgroup's invocations are the lanes of a SIMD register, so the
// 256-invocation workgroup of rms_norm.wgsl runs 32 register-wide slices through eight
// barriers for one row of a few hundred elements, while here every lane is busy whenever
// the step has eight rows. Each lane sums its row's squares in the eight chains of
// common.wgsl's inv_rms, as the matmul kernels' normed inputs do (rms_norm.wgsl adds them as
// a tree, so the two round differently; an adapter uses one). Rows of a multiple of 8
// elements, read and written 16 bytes at a time.

override WEIGHT_DTYPE: u32 = 0u;

struct Params {
    num_tokens: u32,
    hidden: u32,
    eps: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;          // [num_tokens, hidden]
@group(0) @binding(2) var<storage, read> weight: array<u32>;           // [hidden] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;  // [num_tokens, hidden]

const LANES: u32 = 8u;

// weight[4i .. 4i + 4].
fn weight4(i: u32) -> vec4<f32> {
    if WEIGHT_DTYPE == DTYPE_F32 {
        return vec4<f32>(
            bitcast<f32>(weight[4u * i]),
            bitcast<f32>(weight[4u * i + 1u]),
            bitcast<f32>(weight[4u * i + 2u]),
            bitcast<f32>(weight[4u * i + 3u]),
        );
    }
    return vec4<f32>(unpack_pair(weight[2u * i], WEIGHT_DTYPE), unpack_pair(weight[2u * i + 1u], WEIGHT_DTYPE));
}

@compute @workgroup_size(LANES)
fn rms_norm_lanes(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let t = (wg.y * nwg.x + wg.x) * LANES + tid;
    if t >= p.num_tokens {
        return;
    }
    let n4 = p.hidden / 4u;
    let base = t * n4;
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var i = 0u; i < n4; i += 2u) {
        let u = x[base + i];
        let v = x[base + i + 1u];
        a += u * u;
        b += v * v;
    }
    let inv = inv_rms(a, b, p.hidden, p.eps);
    for (var i = 0u; i < n4; i++) {
        out[base + i] = x[base + i] * inv * weight4(i);
    }
}
