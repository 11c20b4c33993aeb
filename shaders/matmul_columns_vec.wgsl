// Shared by matmul_skinny_vec.wgsl and matmul_skinny_sg.wgsl (k % 8 == 0): the weights as
// 16-byte words and the read of eight consecutive ones.

@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;    // [n, k] in WEIGHT_DTYPE

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
