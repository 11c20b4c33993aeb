// The input binding of the kernels that read it one element at a time (matmul.wgsl,
// matmul_skinny.wgsl), and its read through matmul_store.wgsl's GATED and NORM.

@group(0) @binding(1) var<storage, read> x: array<f32>;          // [m, k], or gated [m, 2k]

// Element e of input row `row`.
fn x_at(row: u32, e: u32) -> f32 {
    let i = row * x_stride() + e;
    if GATED == 0u {
        return x[i];
    }
    return gated4(vec4<f32>(x[i]), vec4<f32>(x[i + p.k])).x;
}

// x_at as the product reads it: with NORM, times the row's norm scale `s` and the norm
// weight, as rms_norm_lanes.wgsl writes it (the same products as matmul_columns_vec.wgsl's
// xn4, one component at a time).
fn xn_at(row: u32, e: u32, s: f32) -> f32 {
    if NORM {
        return x_at(row, e) * s * norm4(e / 4u)[e % 4u];
    }
    return x_at(row, e);
}

// With NORM, the norm scale of input row `row` (common.wgsl's inv_rms), computed by one
// invocation (matmul_skinny.wgsl; matmul.wgsl spreads the chains over its threads); 1
// without.
fn row_scale(row: u32) -> f32 {
    if !NORM {
        return 1.0;
    }
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    let base = row * p.k;
    for (var e = 0u; e < p.k; e += 8u) {
        let u = vec4<f32>(x[base + e], x[base + e + 1u], x[base + e + 2u], x[base + e + 3u]);
        let v = vec4<f32>(x[base + e + 4u], x[base + e + 5u], x[base + e + 6u], x[base + e + 7u]);
        a += u * u;
        b += v * v;
    }
    return inv_rms(a, b, p.k, p.eps);
}
