// Shared prelude, prepended to every kernel by the Rust side (KernelSource::full_source).
//
// Storage formats. Weights and KV blocks live in `array<u32>` so one shader serves every
// format and every backend (GL has no shader-f16): f32 is one element per word (bitcast),
// f16 and bf16 are two per word with the lower-index element in the low 16 bits, which is
// how a little-endian safetensors file lays them out.
const DTYPE_F32: u32 = 0u;
const DTYPE_F16: u32 = 1u;
const DTYPE_BF16: u32 = 2u;
// KV pools only: quantized tiles (src/pool/quant.rs has the format).
const DTYPE_INT8: u32 = 3u;
const DTYPE_INT4: u32 = 4u;

// bf16 is the top half of an f32, so widening is an exact shift.
fn unpack_bf16x2(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

// The two elements packed in word `w` of a 16-bit format.
fn unpack_pair(w: u32, dtype: u32) -> vec2<f32> {
    if dtype == DTYPE_BF16 {
        return unpack_bf16x2(w);
    }
    return unpack2x16float(w);
}

// A finite stand-in for -infinity: WGSL has no infinity literal and exp() of it is 0 anyway.
const NEG_BIG: f32 = -3.0e38;

// RMSNorm's scale of a row of n elements, 1 / sqrt(mean(x^2) + eps), from its squares summed
// in eight chains: chain i holds elements 8j + i in increasing j (a holds chains 0..3, b
// chains 4..7, each updated as `a += u * u` for the row's 16-byte words u of even index and
// `b += v * v` for those of odd index), the chains then added in order. rms_norm_lanes.wgsl
// and the matmul kernels that norm their input as they read it (NORM in matmul_store.wgsl)
// sum this way, so both give a row the same bits. Eight chains rather than one keep a GPU's
// sequential dependency short.
fn inv_rms(a: vec4<f32>, b: vec4<f32>, n: u32, eps: f32) -> f32 {
    let ss = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    return inverseSqrt(ss / f32(n) + eps);
}
