//! Reference (de)quantizers for the GGML weight formats a GGUF file stores.
//!
//! Plain, unoptimised Rust, written to be read and trusted: these functions are the oracle
//! for the GPU dequantization kernels and for quantizing weights at load time. Dequantization
//! is exact: [`dequantize`] gives, bit for bit, the f32 values and element order that
//! llama.cpp's `gguf` Python package gives (`tests/quant_reference.rs` checks that against
//! fixtures made with the package).
//!
//! Block layouts (all multi-byte fields little-endian; `f16` is IEEE half precision). A
//! "32-block" holds 32 values, a "super-block" 256 values in 8 or 16 sub-blocks:
//!
//! | type | elems | bytes | layout | value |
//! | --- | --- | --- | --- | --- |
//! | Q4_0 | 32 | 18 | `d: f16`, 16 bytes of 4-bit codes | `d * (q - 8)` |
//! | Q4_1 | 32 | 20 | `d: f16`, `m: f16`, 16 bytes of 4-bit codes | `d * q + m` |
//! | Q5_0 | 32 | 22 | `d: f16`, `qh: u32` (fifth bits), 16 bytes of low nibbles | `d * (q - 16)` |
//! | Q5_1 | 32 | 24 | `d: f16`, `m: f16`, `qh: u32`, 16 bytes of low nibbles | `d * q + m` |
//! | Q8_0 | 32 | 34 | `d: f16`, 32 `i8` codes | `d * q` |
//! | Q4_K | 256 | 144 | `d`, `dmin: f16`, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles | `d * sc * q - dmin * m` |
//! | Q5_K | 256 | 176 | as Q4_K, then 32 bytes of fifth bits before the nibbles | `d * sc * q - dmin * m` |
//! | Q6_K | 256 | 210 | 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 `i8` scales, `d: f16` | `d * sc * (q - 32)` |
//! | Q2_K | 256 | 84 | 16 bytes of 4-bit scales and mins, 64 bytes of 2-bit codes, `d`, `dmin: f16` | `d * sc * q - dmin * m` |
//! | Q3_K | 256 | 110 | 32 bytes of high bits, 64 bytes of 2-bit codes, 12 bytes of 6-bit scales, `d: f16` | `d * (sc - 32) * q` |
//! | IQ4_NL | 32 | 18 | `d: f16`, 16 bytes of 4-bit codes | `d * IQ4[q]` |
//! | IQ4_XS | 256 | 136 | `d: f16`, `scales_h: u16`, 4 bytes `scales_l`, 128 bytes of 4-bit codes | `d * (ls - 32) * IQ4[q]` |
//! | MXFP4 | 32 | 17 | `e: u8` (an E8M0 exponent), 16 bytes of 4-bit codes | `2^(e - 128) * FP4[q]` |
//!
//! In the 32-blocks, byte `j` of the nibbles holds element `j` in its low half and element
//! `j + 16` in its high half; bit `j` of `qh` is the fifth bit of element `j`. In Q4_K and
//! Q5_K each run of 32 nibble bytes holds two sub-blocks of 32 (low halves first), and bit `s`
//! of high-bit byte `l` belongs to element `l` of sub-block `s`. Q6_K works in halves of 128
//! values; `dequant_q6_k` below spells out the interleaving. Q2_K works in halves of 128 too:
//! element `128 n + 32 j + l` (`l` < 32) is bits `2 j ..` of code byte `32 n + l`, in
//! sub-block `8 n + 2 j + l / 16` of 16, whose scale byte holds its scale (low nibble) and
//! min (high nibble). Q3_K lays out its low two bits as Q2_K does; the code is those bits
//! minus 4 unless bit `4 n + j` of high-bit byte `l` is set, and its 16 six-bit scales keep
//! their low nibbles in bytes 0..8 (sub-block `s` in byte `s % 8`, high half for `s >= 8`)
//! and their high two bits in bytes 8..12 (bits `2 (s / 4)` of byte `8 + s % 4`). Every product is an f32 product of
//! the f16 fields widened to f32, in the order the value column shows. IQ4_NL's codes index
//! a non-linear table of 16 `i8` levels ([`IQ4_LEVELS`]); MXFP4's index the OCP E2M1 values
//! doubled ([`FP4_LEVELS`], hence the exponent's extra halving), so that both are products of
//! a scale and a small integer, exact in f32 (MXFP4's scale may be an f32 subnormal, for
//! exponents 0 and 1, or overflow to infinity with the largest codes at exponent 255, as in
//! ggml). IQ4_XS is IQ4_NL in super-blocks: sub-block `s` (of 8, 32 values each, its codes
//! laid out as an IQ4_NL block's in bytes `16 s ..`) has the 6-bit scale `ls` whose low four
//! bits are nibble `s % 2` of `scales_l[s / 2]` and high two bits are bits `2 s ..` of
//! `scales_h`.
//!
//! Quantization ([`quantize`]): for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 the bytes
//! are exactly those of the `gguf` package's quantizer (itself a port of ggml's reference
//! quantizers): same choice of scale, same f32 arithmetic, the same rounding of codes and the
//! same round-to-nearest-even of scales to f16. The package has no quantizer for the
//! K-quants, so Q4_K, Q5_K and Q6_K use a simple quantizer of this module's own, described at
//! [`quantize`]; it is not llama.cpp's error-minimising scale search and will not reproduce
//! llama.cpp's bytes, only dequantize within the documented bound. Q2_K, Q3_K, IQ4_NL,
//! IQ4_XS and MXFP4 also use quantizers of this module's own (see [`quantize`]).

use half::{bf16, f16};

/// Values in a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block.
const QK: usize = 32;
/// Values in a K-quant super-block.
const QK_K: usize = 256;

/// A tensor element type of GGUF/GGML that pagellm can (de)quantize.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    Q2_K,
    Q3_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
}

/// IQ4_NL's 16 levels (ggml's `kvalues_iq4nl`, a fact of the format).
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's 16 levels: the E2M1 values (sign, two exponent bits, one mantissa bit) doubled,
/// as ggml's `kvalues_mxfp4` keeps them.
pub const FP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// GGML type ids that exist (or once existed) in the format but that pagellm does not read,
/// with their GGML names, so that an error can say which type a file asked for.
const UNSUPPORTED: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (9, "Q8_1"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

impl GgmlType {
    /// Every supported type, in GGML id order.
    pub const ALL: [GgmlType; 16] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The type a GGUF tensor info's type id names. Ids of GGML types pagellm does not
    /// implement give [`QuantError::UnsupportedType`] with the type's name; ids GGML never
    /// defined give [`QuantError::UnknownTypeId`].
    pub fn from_id(id: u32) -> Result<GgmlType, QuantError> {
        if let Some(ty) = Self::ALL.iter().find(|ty| ty.id() == id) {
            return Ok(*ty);
        }
        match UNSUPPORTED.iter().find(|(known, _)| *known == id) {
            Some(&(id, name)) => Err(QuantError::UnsupportedType { id, name }),
            None => Err(QuantError::UnknownTypeId { id }),
        }
    }

    /// The GGML type id, as GGUF tensor infos store it.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// The GGML name ("Q4_K", "BF16", ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Values per block: 1 for the float types, 32 or 256 for the block formats.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => QK,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q2_K => 84,
            GgmlType::Q3_K => 110,
            GgmlType::IQ4_NL => 18,
            GgmlType::IQ4_XS => 136,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bytes that `elems` values take; an error unless `elems` is a whole number of blocks.
    pub fn bytes_for(self, elems: usize) -> Result<usize, QuantError> {
        let block = self.block_elems();
        if !elems.is_multiple_of(block) {
            return Err(QuantError::NotBlockMultiple {
                ty: self,
                elems,
                block,
            });
        }
        (elems / block)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::TooLarge { ty: self, elems })
    }

    /// Whether [`quantize`] reproduces the `gguf` package's (and ggml's reference) bytes for
    /// this type; false for the K-quants, which use this module's own quantizer.
    pub fn quantize_matches_ggml(self) -> bool {
        !matches!(
            self,
            GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
                | GgmlType::IQ4_NL
                | GgmlType::IQ4_XS
                | GgmlType::MXFP4
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What can go wrong sizing, decoding or encoding GGML data.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error("GGML type {name} (id {id}) is not supported")]
    UnsupportedType { id: u32, name: &'static str },
    #[error("unknown GGML type id {id}")]
    UnknownTypeId { id: u32 },
    #[error("{ty}: {elems} elements is not a multiple of its block of {block} elements")]
    NotBlockMultiple {
        ty: GgmlType,
        elems: usize,
        block: usize,
    },
    #[error("{ty}: {elems} elements is too many to count in bytes")]
    TooLarge { ty: GgmlType, elems: usize },
    #[error("{ty}: {elems} elements take {expected} bytes, but {got} bytes were given")]
    ByteLength {
        ty: GgmlType,
        elems: usize,
        expected: usize,
        got: usize,
    },
    #[error("{ty}: cannot quantize the non-finite value {value} at index {index}")]
    NonFinite {
        ty: GgmlType,
        index: usize,
        value: f32,
    },
    #[error("{ty}: the scale of block {block} overflows f16 (its values are too large for {ty})")]
    ScaleOverflow { ty: GgmlType, block: usize },
}

// ------------------------------------------------------------------------------------------
// f16 and bf16
// ------------------------------------------------------------------------------------------

/// f16 bits to f32, exactly. NaNs keep their sign and payload unchanged, as numpy (and so
/// the `gguf` package) widens them; `half` would set the quiet bit.
fn f16_bits_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    if h & 0x7C00 == 0x7C00 && h & 0x03FF != 0 {
        return f32::from_bits(((h & 0x8000) << 16) | 0x7F80_0000 | ((h & 0x03FF) << 13));
    }
    f16::from_bits(h as u16).to_f32()
}

/// f32 to f16 bits, rounding to nearest even. A NaN keeps its sign and the top ten payload
/// bits (made non-zero if they are all zero), as numpy narrows it.
fn f32_to_f16_bits(x: f32) -> u16 {
    if x.is_nan() {
        let bits = x.to_bits();
        let payload = (((bits & 0x007F_FFFF) >> 13) as u16).max(1);
        return ((bits >> 16) as u16 & 0x8000) | 0x7C00 | payload;
    }
    f16::from_f32(x).to_bits()
}

fn f16_at(block: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// A stored f16 field came out infinite: the block's values are out of the type's range.
struct ScaleOverflow;

fn put_f16(out: &mut [u8], at: usize, x: f32) -> Result<(), ScaleOverflow> {
    let h = f32_to_f16_bits(x);
    if h & 0x7C00 == 0x7C00 {
        return Err(ScaleOverflow);
    }
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
    Ok(())
}

/// The smallest finite f16 value (widened) that is at least `target` (`target >= 0`).
fn f16_at_least(target: f32) -> Result<f32, ScaleOverflow> {
    let mut h = f32_to_f16_bits(target);
    if f16_bits_to_f32(h) < target {
        h += 1;
    }
    if h & 0x7C00 == 0x7C00 {
        return Err(ScaleOverflow);
    }
    Ok(f16_bits_to_f32(h))
}

// ------------------------------------------------------------------------------------------
// Dequantization
// ------------------------------------------------------------------------------------------

/// Decodes `elems` values of type `ty` from `bytes`, which must be exactly
/// `ty.bytes_for(elems)` long. Exact: the result equals the `gguf` package's `dequantize`
/// bit for bit, NaN payloads of F16/BF16/F32 data included.
pub fn dequantize(ty: GgmlType, bytes: &[u8], elems: usize) -> Result<Vec<f32>, QuantError> {
    let expected = ty.bytes_for(elems)?;
    if bytes.len() != expected {
        return Err(QuantError::ByteLength {
            ty,
            elems,
            expected,
            got: bytes.len(),
        });
    }
    let mut out = vec![0.0f32; elems];
    let block: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, o| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, o| o[0] = f16_at(b, 0),
        // A bf16 is the top half of an f32: shifting keeps every bit, NaN payloads too.
        GgmlType::BF16 => {
            |b, o| o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
        }
        GgmlType::Q4_0 => dequant_q4_0,
        GgmlType::Q4_1 => dequant_q4_1,
        GgmlType::Q5_0 => dequant_q5_0,
        GgmlType::Q5_1 => dequant_q5_1,
        GgmlType::Q8_0 => dequant_q8_0,
        GgmlType::Q4_K => dequant_q4_k,
        GgmlType::Q5_K => dequant_q5_k,
        GgmlType::Q6_K => dequant_q6_k,
        GgmlType::Q2_K => dequant_q2_k,
        GgmlType::Q3_K => dequant_q3_k,
        GgmlType::IQ4_NL => dequant_iq4_nl,
        GgmlType::IQ4_XS => dequant_iq4_xs,
        GgmlType::MXFP4 => dequant_mxfp4,
    };
    for (b, o) in bytes
        .chunks_exact(ty.block_bytes())
        .zip(out.chunks_exact_mut(ty.block_elems()))
    {
        block(b, o);
    }
    Ok(out)
}

/// A 32-block whose byte `j` of `qs` holds codes `j` (low nibble) and `j + 16` (high), each
/// an index into `levels`, times `scale`.
fn dequant_levels(scale: f32, qs: &[u8], levels: &[i8; 16], out: &mut [f32]) {
    for (j, &byte) in qs.iter().enumerate().take(QK / 2) {
        out[j] = scale * f32::from(levels[usize::from(byte & 0xF)]);
        out[j + QK / 2] = scale * f32::from(levels[usize::from(byte >> 4)]);
    }
}

fn dequant_iq4_nl(b: &[u8], out: &mut [f32]) {
    dequant_levels(f16_at(b, 0), &b[2..], &IQ4_LEVELS, out);
}

fn dequant_q2_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
        let q = b[16 + 32 * n + l] >> (2 * j) & 3;
        let sc = b[8 * n + 2 * j + l / 16];
        let (dl, ml) = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
        *o = dl * f32::from(q) - ml;
    }
}

/// Q3_K sub-block `s`'s 6-bit scale, 0..=63 (`sc - 32` multiplies `d`), from its 12 bytes.
pub(crate) fn q3_k_scale(scales: &[u8], s: usize) -> u8 {
    let low = if s < 8 {
        scales[s] & 0xF
    } else {
        scales[s - 8] >> 4
    };
    low | (scales[8 + s % 4] >> (2 * (s / 4)) & 3) << 4
}

fn dequant_q3_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 108);
    for (e, o) in out.iter_mut().enumerate().take(QK_K) {
        let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
        let low = i8::try_from(b[32 + 32 * n + l] >> (2 * j) & 3).unwrap_or(0);
        let high = b[l] >> (4 * n + j) & 1;
        let q = if high == 1 { low } else { low - 4 };
        let sc = q3_k_scale(&b[96..108], 8 * n + 2 * j + l / 16);
        let dl = d * f32::from(i16::from(sc) - 32);
        *o = dl * f32::from(q);
    }
}

/// IQ4_XS sub-block `s`'s 6-bit scale, 0..=63 (`ls - 32` multiplies `d`).
fn iq4_xs_scale(b: &[u8], s: usize) -> u8 {
    let high = u16::from_le_bytes([b[2], b[3]]) >> (2 * s) & 3;
    (b[4 + s / 2] >> (4 * (s % 2)) & 0xF) | (high as u8) << 4
}

fn dequant_iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for s in 0..QK_K / QK {
        let dl = d * f32::from(i16::from(iq4_xs_scale(b, s)) - 32);
        let qs = &b[8 + 16 * s..8 + 16 * (s + 1)];
        dequant_levels(dl, qs, &IQ4_LEVELS, &mut out[QK * s..QK * (s + 1)]);
    }
}

/// MXFP4's scale: 2^(e - 128), as ggml's `ggml_e8m0_to_fp32_half` builds its bits (f32
/// subnormals for e of 0 and 1).
pub fn e8m0_half(e: u8) -> f32 {
    let e = u32::from(e);
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e - 1) << 23
    })
}

fn dequant_mxfp4(b: &[u8], out: &mut [f32]) {
    dequant_levels(e8m0_half(b[0]), &b[1..], &FP4_LEVELS, out);
}

fn dequant_q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &byte) in b[2..18].iter().enumerate() {
        out[j] = (i32::from(byte & 0x0F) - 8) as f32 * d;
        out[j + 16] = (i32::from(byte >> 4) - 8) as f32 * d;
    }
}

fn dequant_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &byte) in b[4..20].iter().enumerate() {
        out[j] = d * f32::from(byte & 0x0F) + m;
        out[j + 16] = d * f32::from(byte >> 4) + m;
    }
}

/// The 5-bit codes of a Q5_0/Q5_1 block from its `qh` word and 16 nibble bytes.
fn q5_codes(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = |i: usize| (((qh >> i) & 1) as u8) << 4;
    let mut q = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        q[j] = (byte & 0x0F) | high(j);
        q[j + 16] = (byte >> 4) | high(j + 16);
    }
    q
}

fn dequant_q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, q) in out.iter_mut().zip(q5_codes(&b[2..6], &b[6..22])) {
        *o = (i32::from(q) - 16) as f32 * d;
    }
}

fn dequant_q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (o, q) in out.iter_mut().zip(q5_codes(&b[4..8], &b[8..24])) {
        *o = d * f32::from(q) + m;
    }
}

fn dequant_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K
/// super-block. Sub-blocks 0..4 keep theirs in the low six bits of bytes `j` and `j + 4`;
/// sub-blocks 4..8 split theirs between a nibble of byte `j + 4` and the top two bits of
/// bytes `j - 4` and `j`.
pub(crate) fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 0x3F, scales[j + 4] & 0x3F)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Q4_K and Q5_K: `high(s, l)` gives the fifth bit (already shifted) of element `l` of
/// sub-block `s`, zero for Q4_K.
fn dequant_k_asym(b: &[u8], qs: &[u8], high: impl Fn(usize, usize) -> u8, out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    for s in 0..8 {
        let (sc, m) = k_scale_min(&b[4..16], s);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let (bytes, shift) = (&qs[32 * (s / 2)..32 * (s / 2) + 32], 4 * (s % 2));
        for (l, &byte) in bytes.iter().enumerate() {
            let q = ((byte >> shift) & 0x0F) | high(s, l);
            out[32 * s + l] = dl * f32::from(q) - ml;
        }
    }
}

fn dequant_q4_k(b: &[u8], out: &mut [f32]) {
    dequant_k_asym(b, &b[16..144], |_, _| 0, out);
}

fn dequant_q5_k(b: &[u8], out: &mut [f32]) {
    let qh = &b[16..48];
    dequant_k_asym(b, &b[48..176], |s, l| ((qh[l] >> s) & 1) << 4, out);
}

/// Q6_K. Each half `h` of 128 values takes 64 low-nibble bytes `ql`, 32 high-bit bytes `qh`
/// and 8 scales. Within it, element `32 * k + l` (`k` in 0..4, `l` in 0..32) has its low
/// nibble in `ql[l + 32 * (k % 2)]` (low half for `k < 2`, high half otherwise) and its two
/// high bits at bit `2 * k` of `qh[l]`; each run of 16 elements shares one `i8` scale.
fn dequant_q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let scales = &b[192 + 8 * h..192 + 8 * h + 8];
        for k in 0..4 {
            for l in 0..32 {
                let low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0F;
                let q = low | (((qh[l] >> (2 * k)) & 0x03) << 4);
                let e = 32 * k + l;
                let dl = d * f32::from(scales[e / 16] as i8);
                out[128 * h + e] = dl * (i32::from(q) - 32) as f32;
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// Quantization
// ------------------------------------------------------------------------------------------

/// Encodes `values` as type `ty`; `values.len()` must be a whole number of blocks.
///
/// - F32, F16, BF16: conversion, rounding to nearest even (NaNs and infinities pass through
///   as the `gguf` package passes them).
/// - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: byte for byte the `gguf` package's (and ggml's reference)
///   quantizer. The scale is computed in f32 from the block's extreme values (the
///   signed value of largest magnitude, first one on ties, for Q4_0/Q5_0; the absolute
///   maximum for Q8_0; max and min for Q4_1/Q5_1), codes are computed from that f32 scale
///   (Q8_0 rounds half away from zero; the others add one half and truncate), and the scale
///   (and min) are then stored rounded to f16.
/// - Q4_K, Q5_K, Q6_K: this module's own quantizer (not llama.cpp's code, and without an
///   importance matrix). Each super-block is encoded two ways and the one that decodes with
///   the smaller squared error is kept:
///   - bound-first: each sub-block of 32 gets the offset `-min(0, min x)` and the step
///     `(max x + offset) / L` (`L` = 15 or 31); the super-block's `dmin` and `d` are the
///     smallest f16 values that let 6-bit multiples reach the largest offset and step, each
///     sub-block's 6-bit min and scale are rounded up so that its grid covers its values,
///     and codes are rounded to nearest on the grid the dequantizer will use. Error per
///     value is at most about half a step: `|x - x'| <= ((span + dmin) / L + d) / 2` (plus
///     f32 rounding), where `span` is `max x - min(0, min x)` over the value's sub-block.
///     Q6_K: the same, symmetric: step `max |x| / 31` per sub-block of 16, `i8` scales
///     (0..=127) of an f16 `d`, codes in -31..=31; error at most `(max |x| / 31 + d) / 2`.
///   - least squares: per sub-block, codes are taken from nine grids a little finer and
///     coarser than the one spanning the values (for Q6_K, with the largest value towards
///     code -32, so the scale may be negative), the step and offset refitted to those codes
///     by least squares, the codes rounded again, and the best fit kept; the steps and
///     offsets are then rounded to the 6-bit (Q6_K: `i8`) multiples nearest to them of f16
///     super-block factors, and the codes rounded on that final grid.
///
///   So a super-block's squared error never exceeds what the bound-first per-value bounds
///   allow in sum, and on normal data it is 9-12% lower than bound-first alone. The search
///   costs ~50 ns a value on one core; large tensors are split across threads.
/// - Q2_K: this module's own bound-first encoding (per sub-block of 16, an offset rounded up
///   to a 4-bit multiple of `dmin` and a step covering the values rounded up to a 4-bit
///   multiple of `d`; codes round to nearest): error at most half a step,
///   `((span + dmin) / 3 + d) / 2`, `span = max x - min(0, min x)` over the sub-block.
/// - Q3_K: the same bound-first idea, symmetric: per sub-block of 16 the step
///   `max(max x / 3, -min x / 4)` rounded up to a 6-bit multiple of `d`: error at most
///   `(step + d) / 2`.
/// - IQ4_NL, IQ4_XS, MXFP4: this module's own, one pass per block (llama.cpp searches
///   IQ4_NL's and IQ4_XS's scales, so its bytes differ). IQ4_XS scales each sub-block as
///   IQ4_NL does, its step rounded away from zero to a 6-bit multiple of the super-block's
///   f16 `d` (the smallest f16 at least the largest step over 31): error at most `14` steps
///   of `|step| + d`. IQ4_NL puts the value of largest magnitude on the level -127
///   (`d = max / -127`, stored as f16) and every value on the level nearest `x / d`: error at
///   most `14 |d|` (half the widest gap between levels, or the distance from 113 to 127),
///   plus the f16 rounding of `d`. MXFP4 takes the `gguf` package's exponent
///   `floor(log2 max|x|) - 2 + 127`, so the largest magnitude lies between 8 and 16 scale
///   units, and every value goes to the nearest level: error at most 4 units (above the top
///   level 12), and 2 below it.
///
/// Errors: [`QuantError::NotBlockMultiple`] for a length that is not whole blocks;
/// [`QuantError::NonFinite`] for a NaN or infinite value given to a block format;
/// [`QuantError::ScaleOverflow`] when a block's scale or min does not fit in f16 (where the
/// `gguf` package would store an infinite scale).
pub fn quantize(ty: GgmlType, values: &[f32]) -> Result<Vec<u8>, QuantError> {
    let len = ty.bytes_for(values.len())?;
    let block: fn(&[f32], &mut [u8]) -> Result<(), ScaleOverflow> = match ty {
        GgmlType::F32 => return Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        GgmlType::F16 => {
            return Ok(values
                .iter()
                .flat_map(|&v| f32_to_f16_bits(v).to_le_bytes())
                .collect())
        }
        GgmlType::BF16 => {
            return Ok(values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
                .collect())
        }
        GgmlType::Q4_0 => quant_q4_0,
        GgmlType::Q4_1 => quant_q4_1,
        GgmlType::Q5_0 => quant_q5_0,
        GgmlType::Q5_1 => quant_q5_1,
        GgmlType::Q8_0 => quant_q8_0,
        GgmlType::Q4_K => quant_q4_k,
        GgmlType::Q5_K => quant_q5_k,
        GgmlType::Q6_K => quant_q6_k,
        GgmlType::Q2_K => quant_q2_k,
        GgmlType::Q3_K => quant_q3_k,
        GgmlType::IQ4_NL => quant_iq4_nl,
        GgmlType::IQ4_XS => quant_iq4_xs,
        GgmlType::MXFP4 => quant_mxfp4,
    };
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite {
            ty,
            index,
            value: values[index],
        });
    }
    let mut out = vec![0u8; len];
    let (elems, bytes) = (ty.block_elems(), ty.block_bytes());
    let blocks = values.len() / elems;
    // The K-quants' least-squares search costs ~50 ns a value on one core: a large tensor is
    // split across the machine's threads, in runs of whole blocks.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = blocks.div_ceil(threads).max(PARALLEL_BLOCKS);
    let encode = |first: usize, x: &[f32], o: &mut [u8]| -> Result<(), QuantError> {
        for (i, (x, o)) in x
            .chunks_exact(elems)
            .zip(o.chunks_exact_mut(bytes))
            .enumerate()
        {
            block(x, o).map_err(|ScaleOverflow| QuantError::ScaleOverflow {
                ty,
                block: first + i,
            })?;
        }
        Ok(())
    };
    if blocks <= per {
        encode(0, values, &mut out)?;
        return Ok(out);
    }
    let results: Vec<Result<(), QuantError>> = std::thread::scope(|scope| {
        let runs = values.chunks(per * elems).zip(out.chunks_mut(per * bytes));
        let handles: Vec<_> = runs
            .enumerate()
            .map(|(r, (x, o))| scope.spawn(move || encode(r * per, x, o)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    // The first failing block, as a serial pass would report it.
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(out)
}

/// Fewest blocks worth a thread of their own.
const PARALLEL_BLOCKS: usize = 256;

/// The value of largest magnitude, with its sign; the first one when several tie.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x[0];
    for &v in &x[1..] {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x[1..].iter().fold((x[0], x[0]), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

/// `1 / d`, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Codes `trunc(x * scale + offset)`, at most `top` (the arguments keep them non-negative).
fn truncated_codes(x: &[f32], sub: f32, id: f32, offset: f32, top: u8) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        // `as u8` saturates; the value is already within 0..=top + 1 here.
        *q = (((v - sub) * id + offset).trunc() as u8).min(top);
    }
    q
}

/// Packs 32 codes two to a byte: element `j` low, element `j + 16` high.
fn pack_nibbles(q: &[u8; QK], out: &mut [u8]) {
    for j in 0..QK / 2 {
        out[j] = (q[j] & 0x0F) | (q[j + 16] << 4);
    }
}

/// Packs 32 five-bit codes: the `qh` word of fifth bits, then the nibbles.
fn pack_q5(q: &[u8; QK], out: &mut [u8]) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &v)| acc | (u32::from(v >> 4) << j));
    out[..4].copy_from_slice(&qh.to_le_bytes());
    pack_nibbles(q, &mut out[4..20]);
}

/// The index of the level nearest `v` (the first of two equally near).
fn nearest_level(v: f32, levels: &[i8; 16]) -> u8 {
    let (mut best, mut err) = (0u8, f32::INFINITY);
    for (i, &l) in levels.iter().enumerate() {
        let e = (v - f32::from(l)).abs();
        if e < err {
            (best, err) = (i as u8, e);
        }
    }
    best
}

/// IQ4_NL: the value of largest magnitude on the level -127 (`d = max / -127`, stored as
/// f16), every value on the level nearest `x / d` of the stored `d`.
fn quant_iq4_nl(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    put_f16(out, 0, signed_absmax(x) / -127.0)?;
    let id = inverse(f16_at(out, 0));
    let mut q = [0u8; QK];
    for (c, &v) in q.iter_mut().zip(x) {
        *c = nearest_level(v * id, &IQ4_LEVELS);
    }
    pack_nibbles(&q, &mut out[2..18]);
    Ok(())
}

/// Q2_K, bound-first: each sub-block of 16 gets the offset `-min(0, min x)`, rounded up to a
/// 4-bit multiple `m` of `dmin` (the smallest f16 at least the largest offset over 15), and
/// the step `(max x + m dmin) / 3`, rounded up to a 4-bit multiple of `d` (the smallest f16
/// at least the largest step over 15), so its grid covers its values; codes round to
/// nearest on that grid.
fn quant_q2_k(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    const SUB: usize = 16;
    let offsets: Vec<f32> = x.chunks(SUB).map(|b| -min_max(b).0.min(0.0)).collect();
    let largest = offsets.iter().fold(0.0f32, |a, &o| a.max(o));
    let dmin = f16_at_least(largest / 15.0)?;
    let mins: Vec<u8> = offsets
        .iter()
        .map(|&o| (o * inverse(dmin)).ceil().min(15.0) as u8)
        .collect();
    let steps: Vec<f32> = x
        .chunks(SUB)
        .zip(&mins)
        .map(|(b, &m)| ((min_max(b).1 + f32::from(m) * dmin) / 3.0).max(0.0))
        .collect();
    let d = f16_at_least(steps.iter().fold(0.0f32, |a, &s| a.max(s)) / 15.0)?;
    put_f16(out, 80, d)?;
    put_f16(out, 82, dmin)?;
    out[16..80].fill(0);
    for (s, (b, (&step, &m))) in x.chunks(SUB).zip(steps.iter().zip(&mins)).enumerate() {
        let sc = (step * inverse(d)).ceil().min(15.0) as u8;
        out[s] = sc | m << 4;
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        let il = inverse(dl);
        for (i, &v) in b.iter().enumerate() {
            let q = ((v + ml) * il).round().clamp(0.0, 3.0) as u8;
            let e = SUB * s + i;
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            out[16 + 32 * n + l] |= q << (2 * j);
        }
    }
    Ok(())
}

/// Q3_K, bound-first and symmetric: each sub-block of 16 gets the step `max(max x / 3,
/// -min x / 4)` (codes run -4..=3), rounded up to a multiple `m` (1..=31) of `d`, the
/// smallest f16 at least the largest step over 31; codes round to nearest on that grid.
fn quant_q3_k(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    const SUB: usize = 16;
    let steps: Vec<f32> = x
        .chunks(SUB)
        .map(|b| {
            let (lo, hi) = min_max(b);
            (hi / 3.0).max(-lo / 4.0).max(0.0)
        })
        .collect();
    let d = f16_at_least(steps.iter().fold(0.0f32, |a, &s| a.max(s)) / 31.0)?;
    out[..108].fill(0);
    put_f16(out, 108, d)?;
    for (s, (b, &step)) in x.chunks(SUB).zip(&steps).enumerate() {
        let m = (step * inverse(d)).ceil().min(31.0) as u8;
        let sc = m + 32;
        if s < 8 {
            out[96 + s] |= sc & 0xF;
        } else {
            out[96 + s - 8] |= (sc & 0xF) << 4;
        }
        out[96 + 8 + s % 4] |= (sc >> 4) << (2 * (s / 4));
        let il = inverse(d * f32::from(m));
        for (i, &v) in b.iter().enumerate() {
            let q = (v * il).round().clamp(-4.0, 3.0) as i8;
            let e = SUB * s + i;
            let (n, j, l) = (e / 128, e % 128 / 32, e % 32);
            out[32 + 32 * n + l] |= ((q & 3) as u8) << (2 * j);
            if q >= 0 {
                out[l] |= 1 << (4 * n + j);
            }
        }
    }
    Ok(())
}

/// IQ4_XS: each sub-block's ideal step `max / -127` (as IQ4_NL's) is rounded away from zero
/// to a multiple `m` (-32..=31) of the super-block's `d`, the smallest f16 at least the
/// largest ideal step over 31, so every value stays within the levels; every value then goes
/// to the level nearest `x / (d m)`.
fn quant_iq4_xs(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let steps: Vec<f32> = x.chunks(QK).map(|b| signed_absmax(b) / -127.0).collect();
    let largest = steps.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    let d = f16_at_least(largest / 31.0)?;
    put_f16(out, 0, d)?;
    let id = inverse(d);
    let mut scales_h = 0u16;
    out[4..8].fill(0);
    for (s, (&step, b)) in steps.iter().zip(x.chunks(QK)).enumerate() {
        let m = (step.abs() * id).ceil().min(31.0).copysign(step) as i32;
        let ls = (m + 32) as u8;
        out[4 + s / 2] |= (ls & 0xF) << (4 * (s % 2));
        scales_h |= u16::from(ls >> 4) << (2 * s);
        let il = inverse(d * m as f32);
        let mut q = [0u8; QK];
        for (c, &v) in q.iter_mut().zip(b) {
            *c = nearest_level(v * il, &IQ4_LEVELS);
        }
        pack_nibbles(&q, &mut out[8 + 16 * s..8 + 16 * (s + 1)]);
    }
    out[2..4].copy_from_slice(&scales_h.to_le_bytes());
    Ok(())
}

/// `floor(log2(v))` of a positive finite `v`, from its bits (subnormals included).
fn floor_log2(v: f32) -> i32 {
    let bits = v.to_bits();
    match (bits >> 23) & 0xFF {
        0 => (31 - bits.leading_zeros() as i32) - 149,
        e => e as i32 - 127,
    }
}

/// MXFP4: the exponent `floor(log2(max |x|)) - 2 + 127`, as the `gguf` package chooses it
/// (0 for a block of zeros; clamped to 0..=254), which puts the largest magnitude between
/// levels 8 and 16 of the scale `2^(e - 128)`; every value on the level nearest `x / scale`.
fn quant_mxfp4(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 {
        (floor_log2(amax) + 125).clamp(0, 254) as u8
    } else {
        0
    };
    out[0] = e;
    let scale = e8m0_half(e);
    let mut q = [0u8; QK];
    for (c, &v) in q.iter_mut().zip(x) {
        *c = nearest_level(v / scale, &FP4_LEVELS);
    }
    pack_nibbles(&q, &mut out[1..17]);
    Ok(())
}

fn quant_q4_0(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let d = signed_absmax(x) / -8.0;
    let q = truncated_codes(x, 0.0, inverse(d), 8.5, 15);
    put_f16(out, 0, d)?;
    pack_nibbles(&q, &mut out[2..18]);
    Ok(())
}

fn quant_q5_0(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let d = signed_absmax(x) / -16.0;
    let q = truncated_codes(x, 0.0, inverse(d), 16.5, 31);
    put_f16(out, 0, d)?;
    pack_q5(&q, &mut out[2..22]);
    Ok(())
}

fn quant_q4_1(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 15.0;
    let q = truncated_codes(x, lo, inverse(d), 0.5, 15);
    put_f16(out, 0, d)?;
    put_f16(out, 2, lo)?;
    pack_nibbles(&q, &mut out[4..20]);
    Ok(())
}

fn quant_q5_1(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let (lo, hi) = min_max(x);
    let d = (hi - lo) / 31.0;
    let q = truncated_codes(x, lo, inverse(d), 0.5, 31);
    put_f16(out, 0, d)?;
    put_f16(out, 2, lo)?;
    pack_q5(&q, &mut out[4..24]);
    Ok(())
}

fn quant_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
    let id = inverse(d);
    put_f16(out, 0, d)?;
    for (o, &v) in out[2..34].iter_mut().zip(x) {
        // f32::round rounds half away from zero, as ggml's reference does.
        *o = (v * id).round() as i8 as u8;
    }
    Ok(())
}

/// The super-block factor (an f16 value) and per-sub-block multipliers `ceil(need / factor)`
/// (at most `max_mult`) that make `factor * mult >= need` for every sub-block.
fn k_multipliers<const N: usize>(
    need: &[f32; N],
    max_mult: u8,
) -> Result<(f32, [u8; N]), ScaleOverflow> {
    let largest = need.iter().fold(0.0f32, |m, &v| m.max(v));
    let factor = f16_at_least(largest / f32::from(max_mult))?;
    let mut mult = [0u8; N];
    if factor > 0.0 {
        for (m, &n) in mult.iter_mut().zip(need) {
            *m = (n / factor).ceil().min(f32::from(max_mult)) as u8;
        }
    }
    Ok((factor, mult))
}

/// Scales, mins and codes of a Q4_K/Q5_K super-block with `top` = 15 or 31 (see
/// [`quantize`]): (d, dmin, 6-bit scales, 6-bit mins, codes).
type KAsym = (f32, f32, [u8; 8], [u8; 8], [u8; QK_K]);

fn quant_k_asym(x: &[f32], top: u8) -> Result<KAsym, ScaleOverflow> {
    let mut offset = [0.0f32; 8];
    let mut hi = [0.0f32; 8];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let (lo, max) = min_max(sub);
        offset[s] = -lo.min(0.0);
        hi[s] = max;
    }
    let (dmin, mins) = k_multipliers(&offset, 63)?;
    let mut need = [0.0f32; 8];
    for s in 0..8 {
        need[s] = ((hi[s] + dmin * f32::from(mins[s])) / f32::from(top)).max(0.0);
    }
    let (d, scales) = k_multipliers(&need, 63)?;
    let mut q = [0u8; QK_K];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let (dl, ml) = (d * f32::from(scales[s]), dmin * f32::from(mins[s]));
        for (q, &v) in q[32 * s..32 * s + 32].iter_mut().zip(sub) {
            *q = if dl > 0.0 {
                ((v + ml) / dl).round().clamp(0.0, f32::from(top)) as u8
            } else {
                0
            };
        }
    }
    Ok((d, dmin, scales, mins, q))
}

/// Packs eight 6-bit scales and mins into the 12 bytes [`k_scale_min`] reads.
fn pack_k_scales(scales: &[u8; 8], mins: &[u8; 8], out: &mut [u8]) {
    for j in 0..4 {
        out[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
        out[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
        out[j + 8] = (scales[j + 4] & 0x0F) | ((mins[j + 4] & 0x0F) << 4);
    }
}

/// Packs 256 codes' low nibbles: each run of 32 bytes holds two sub-blocks, low half first.
fn pack_k_nibbles(q: &[u8; QK_K], out: &mut [u8]) {
    for c in 0..4 {
        for l in 0..32 {
            out[32 * c + l] = (q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4);
        }
    }
}

fn pack_q4_k(k: &KAsym, out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let (d, dmin, scales, mins, q) = k;
    put_f16(out, 0, *d)?;
    put_f16(out, 2, *dmin)?;
    pack_k_scales(scales, mins, &mut out[4..16]);
    pack_k_nibbles(q, &mut out[16..144]);
    Ok(())
}

fn pack_q5_k(k: &KAsym, out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let (d, dmin, scales, mins, q) = k;
    put_f16(out, 0, *d)?;
    put_f16(out, 2, *dmin)?;
    pack_k_scales(scales, mins, &mut out[4..16]);
    for l in 0..32 {
        out[16 + l] = (0..8).fold(0u8, |acc, s| acc | ((q[32 * s + l] >> 4) << s));
    }
    pack_k_nibbles(q, &mut out[48..176]);
    Ok(())
}

/// An encoder of one block into its bytes.
type BlockEncoder = fn(&[f32], &mut [u8]) -> Result<(), ScaleOverflow>;

/// Encodes `x` with each of `encoders` and keeps the block that decodes closest to `x`
/// (least squared error); fails only when every encoder does.
fn closest(
    x: &[f32],
    out: &mut [u8],
    decode: fn(&[u8], &mut [f32]),
    encoders: &[BlockEncoder],
) -> Result<(), ScaleOverflow> {
    let mut best: Option<(f64, Vec<u8>)> = None;
    let mut back = vec![0.0f32; x.len()];
    for encode in encoders {
        let mut bytes = vec![0u8; out.len()];
        if encode(x, &mut bytes).is_err() {
            continue;
        }
        decode(&bytes, &mut back);
        let err: f64 = x
            .iter()
            .zip(&back)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum();
        if best.as_ref().is_none_or(|(e, _)| err < *e) {
            best = Some((err, bytes));
        }
    }
    let (_, bytes) = best.ok_or(ScaleOverflow)?;
    out.copy_from_slice(&bytes);
    Ok(())
}

fn quant_q4_k(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    closest(
        x,
        out,
        dequant_q4_k,
        &[
            |x, o| pack_q4_k(&quant_k_asym(x, 15)?, o),
            |x, o| pack_q4_k(&fit_k_asym(x, 15)?, o),
        ],
    )
}

fn quant_q5_k(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    closest(
        x,
        out,
        dequant_q5_k,
        &[
            |x, o| pack_q5_k(&quant_k_asym(x, 31)?, o),
            |x, o| pack_q5_k(&fit_k_asym(x, 31)?, o),
        ],
    )
}

/// Least-squares step and offset of a sub-block for given codes: `x ~ step * q - min`
/// with `step >= 0` and `min >= 0` (the format's lowest value is never above 0).
fn fit_step_min(x: &[f32], q: &[u8]) -> (f64, f64) {
    let n = x.len() as f64;
    let (mut sq, mut sqq, mut sx, mut sqx) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&v, &c) in x.iter().zip(q) {
        let (v, c) = (f64::from(v), f64::from(c));
        sq += c;
        sqq += c * c;
        sx += v;
        sqx += c * v;
    }
    let det = n * sqq - sq * sq;
    if det > 0.0 {
        let step = (n * sqx - sq * sx) / det;
        let min = -(sqq * sx - sq * sqx) / det;
        if min >= 0.0 && step >= 0.0 {
            return (step, min);
        }
    }
    // The offset wants to be positive (or nothing varies): fit the step alone, min 0.
    let step = if sqq > 0.0 { (sqx / sqq).max(0.0) } else { 0.0 };
    (step, 0.0)
}

/// Codes `round((x + min) / step)` in `0..=top`.
fn asym_codes(x: &[f32], step: f64, min: f64, top: u8, q: &mut [u8]) {
    if step <= 0.0 {
        q.fill(0);
        return;
    }
    let (inv, min, top) = ((1.0 / step) as f32, min as f32, f32::from(top));
    // Clamped first, so truncating `t + 0.5` rounds to nearest (half up): `f32::round`
    // is a library call on baseline x86-64 and would dominate the search.
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v + min) * inv).clamp(0.0, top) + 0.5) as u8;
    }
}

fn asym_error(x: &[f32], q: &[u8], step: f64, min: f64) -> f64 {
    x.iter()
        .zip(q)
        .map(|(&v, &c)| (step * f64::from(c) - min - f64::from(v)).powi(2))
        .sum()
}

/// The step and offset of a sub-block that fit it best among a small search: codes from
/// grids a little finer and coarser than the one spanning the values, each refitted by
/// least squares and rounded again.
fn search_step_min(x: &[f32], top: u8) -> (f64, f64) {
    let (lo, hi) = min_max(x);
    let lo = f64::from(lo.min(0.0));
    let span = f64::from(hi) - lo;
    if span <= 0.0 {
        return (0.0, -lo);
    }
    let mut q = vec![0u8; x.len()];
    let mut best = (f64::INFINITY, 0.0, -lo);
    for t in -4..=4 {
        let levels = f64::from(top) + 0.25 * f64::from(t);
        asym_codes(x, span / levels, -lo, top, &mut q);
        let (step, min) = fit_step_min(x, &q);
        asym_codes(x, step, min, top, &mut q);
        let err = asym_error(x, &q, step, min);
        if err < best.0 {
            best = (err, step, min);
        }
    }
    (best.1, best.2)
}

/// The super-block factor (as f16 stores it) and 6-bit multiples nearest to `want`.
fn k_nearest<const N: usize>(
    want: &[f64; N],
    max_mult: u8,
) -> Result<(f32, [u8; N]), ScaleOverflow> {
    let largest = want.iter().fold(0.0f64, |m, &v| m.max(v));
    let factor = f16_bits_to_f32(f32_to_f16_bits((largest / f64::from(max_mult)) as f32));
    if !factor.is_finite() {
        return Err(ScaleOverflow);
    }
    let mut mult = [0u8; N];
    if factor > 0.0 {
        for (m, &w) in mult.iter_mut().zip(want) {
            *m = (w / f64::from(factor))
                .round()
                .clamp(0.0, f64::from(max_mult)) as u8;
        }
    }
    Ok((factor, mult))
}

/// Q4_K/Q5_K by least squares: each sub-block's step and offset searched for the least
/// squared error, then rounded to 6-bit multiples of the super-block's f16 factors, and the
/// codes rounded on the grid the dequantizer will use.
fn fit_k_asym(x: &[f32], top: u8) -> Result<KAsym, ScaleOverflow> {
    let mut steps = [0.0f64; 8];
    let mut mins = [0.0f64; 8];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        (steps[s], mins[s]) = search_step_min(sub, top);
    }
    let (d, scales) = k_nearest(&steps, 63)?;
    let (dmin, mins) = k_nearest(&mins, 63)?;
    let mut q = [0u8; QK_K];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let step = f64::from(d * f32::from(scales[s]));
        let min = f64::from(dmin * f32::from(mins[s]));
        asym_codes(sub, step, min, top, &mut q[32 * s..32 * s + 32]);
    }
    Ok((d, dmin, scales, mins, q))
}

fn quant_q6_k(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    closest(
        x,
        out,
        dequant_q6_k,
        &[quant_q6_k_bounded, quant_q6_k_fitted],
    )
}

/// Q6_K bound-first (see [`quantize`]): non-negative scales rounded up to cover each
/// sub-block.
fn quant_q6_k_bounded(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let mut need = [0.0f32; 16];
    for (n, sub) in need.iter_mut().zip(x.chunks_exact(16)) {
        *n = sub.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 31.0;
    }
    let (d, scales) = k_multipliers(&need, 127)?;
    let mut q = [0u8; QK_K];
    for (e, (q, &v)) in q.iter_mut().zip(x).enumerate() {
        let dl = d * f32::from(scales[e / 16]);
        let code = if dl > 0.0 {
            (v / dl).round().clamp(-32.0, 31.0)
        } else {
            0.0
        };
        *q = (code as i32 + 32) as u8;
    }
    pack_q6_k(d, &scales, &q, out)
}

/// Signed codes `round(x / step)` in -32..=31, stored plus 32.
fn sym_codes(x: &[f32], step: f64, q: &mut [u8]) {
    if step == 0.0 {
        q.fill(32);
        return;
    }
    let inv = (1.0 / step) as f32;
    // As in `asym_codes`: clamped, shifted to positive, then truncated.
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * inv).clamp(-32.0, 31.0) + 32.5) as u8;
    }
}

/// Q6_K by least squares: each sub-block of 16 gets the signed step (its largest value
/// towards code -32, the side with the extra level) that fits it best in a small search,
/// the steps are rounded to `i8` multiples of the f16 `d`, and the codes rounded on the
/// final grid.
fn quant_q6_k_fitted(x: &[f32], out: &mut [u8]) -> Result<(), ScaleOverflow> {
    let code = |codes: &[u8], i: usize| f64::from(codes[i]) - 32.0;
    let mut steps = [0.0f64; 16];
    let mut q = [0u8; QK_K];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        let v = f64::from(signed_absmax(sub));
        if v == 0.0 {
            continue;
        }
        let codes = &mut q[16 * j..16 * j + 16];
        let mut best = (f64::INFINITY, 0.0);
        for t in -4..=4 {
            sym_codes(sub, -v / (32.0 + 0.25 * f64::from(t)), codes);

            let (sqx, sqq) = (0..16).fold((0.0, 0.0), |(a, b), i| {
                let c = code(codes, i);
                (a + c * f64::from(sub[i]), b + c * c)
            });
            let step = if sqq > 0.0 { sqx / sqq } else { 0.0 };
            sym_codes(sub, step, codes);
            let err: f64 = (0..16)
                .map(|i| (step * code(codes, i) - f64::from(sub[i])).powi(2))
                .sum();
            if err < best.0 {
                best = (err, step);
            }
        }
        steps[j] = best.1;
    }
    let largest = steps.iter().fold(0.0f64, |m, &s| m.max(s.abs()));
    let d = f16_bits_to_f32(f32_to_f16_bits((largest / 127.0) as f32));
    if !d.is_finite() {
        return Err(ScaleOverflow);
    }
    let mut scales = [0u8; 16];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        let sc = if d > 0.0 {
            (steps[j] / f64::from(d)).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        };
        scales[j] = sc as u8;
        sym_codes(
            sub,
            f64::from(d) * f64::from(sc),
            &mut q[16 * j..16 * j + 16],
        );
    }
    pack_q6_k(d, &scales, &q, out)
}

/// Packs a Q6_K block: codes (plus 32) split into low nibbles and high bit pairs, the
/// sixteen `i8` scales (as bytes), then `d`.
fn pack_q6_k(
    d: f32,
    scales: &[u8; 16],
    q: &[u8; QK_K],
    out: &mut [u8],
) -> Result<(), ScaleOverflow> {
    for h in 0..2 {
        for l in 0..32 {
            let c = |k: usize| q[128 * h + 32 * k + l];
            out[64 * h + l] = (c(0) & 0x0F) | ((c(2) & 0x0F) << 4);
            out[64 * h + 32 + l] = (c(1) & 0x0F) | ((c(3) & 0x0F) << 4);
            out[128 + 32 * h + l] = (0..4).fold(0u8, |acc, k| acc | ((c(k) >> 4) << (2 * k)));
        }
    }
    out[192..208].copy_from_slice(scales);
    put_f16(out, 208, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_scales_pack_and_unpack_are_inverse() {
        for a in 0..64u8 {
            let scales = [a, 63 - a, a / 2, 1, a ^ 0x2A, 63, 0, a];
            let mins = [63 - a, a, 0, 63, a / 3, a ^ 0x15, a, 32];
            let mut packed = [0u8; 12];
            pack_k_scales(&scales, &mins, &mut packed);
            for j in 0..8 {
                assert_eq!(k_scale_min(&packed, j), (scales[j], mins[j]), "a={a} j={j}");
            }
        }
    }

    #[test]
    fn ids_and_names_round_trip() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Ok(ty));
            assert_eq!(ty.to_string(), ty.name());
        }
    }

    #[test]
    fn f16_at_least_never_rounds_down() {
        for target in [0.0f32, 1e-9, 5.9e-8, 6.0e-8, 1.0 / 3.0, 1.0009766, 65504.0] {
            let h = f16_at_least(target).ok().expect("finite");
            assert!(h >= target, "{h} < {target}");
        }
        assert!(f16_at_least(65505.0).is_err());
    }
}
