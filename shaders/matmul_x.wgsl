// The input binding of the kernels that read it one element at a time (matmul.wgsl,
// matmul_skinny.wgsl), and its read through matmul_store.wgsl's GATED.

@group(0) @binding(1) var<storage, read> x: array<f32>;          // [m, k], or gated [m, 2k]

// Element e of input row `row`.
fn x_at(row: u32, e: u32) -> f32 {
    let i = row * x_stride() + e;
    if GATED == 0u {
        return x[i];
    }
    return gated4(vec4<f32>(x[i]), vec4<f32>(x[i + p.k])).x;
}
