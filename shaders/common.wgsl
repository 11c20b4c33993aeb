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
