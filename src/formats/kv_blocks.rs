//! The quantized KV block format, and its plain-Rust encoder and decoder (the reference the
//! GPU kernels are tested against).
//!
//! A quantized pool keeps the float pools' layout `[blocks, kv_heads, block_size, ...]`, but
//! each (block, KV head) tile is `block_size` rows of codes followed by those rows' scales:
//!
//! ```text
//! tile = codes [block_size][row_words] u32  ++  scales [block_size][groups] f16 (two per u32)
//! ```
//!
//! - int8: value `j` of a row is byte `j % 4` of word `j / 4`, two's complement, in
//!   `-127..=127`; scale = max |x| / 127 over its group.
//! - int4: value `j` is nibble `j % 8` of word `j / 8`, 4-bit two's complement, in `-8..=7`;
//!   scale = m / -8 where m is the group's value of largest magnitude (the first one on a
//!   tie), so m itself is stored exactly as -8 and the opposite extreme clamps to 7.
//! - A value decodes as `code * scale`, with the scale as stored (f16).
//! - Codes are `round_ties_even(x * (1 / scale))`, clamped; a zero scale gives zero codes.
//!
//! Putting the scales inside the tile, next to the rows they scale, makes a block one
//! self-contained run of bytes: copy-on-write, swap-out and swap-in move it unchanged, and
//! the block manager never learns the dtype. Packing the scales of a whole tile together
//! (rather than padding each row to whole words) is what keeps int8 at 8.25 bits a value
//! even when a row holds only one group.
//!
//! Group sizes: a row of `head_dim` values splits into the fewest groups `n` of at least
//! `ceil(head_dim / nominal)` such that each group is a whole number of words of either
//! width (`head_dim / n` divisible by 8); nominal is 64 for int8 and 32 for int4, chosen so
//! that for head_dim a multiple of 64 (int8) or 32 (int4) the scales cost a quarter or half
//! a bit a value: 1.94x (int8) and 3.56x (int4) the tokens of an f16 pool per byte. Other
//! head sizes get smaller groups and less: int4 with head_dim 80 (groups of 16) 3.2x, int8
//! with head_dim 16 1.78x. A head_dim not divisible by 8 cannot be quantized.

pub use super::kv::{group_size, INT4_GROUP, INT8_GROUP};
use super::kv::{KvDtype, KvLayout};
use half::f16;

/// Largest f16 value; scales are clamped to it.
const F16_MAX: f32 = 65504.0;

/// The scale and codes of one group, by the rule in the module docs.
pub fn quantize_group(dtype: KvDtype, x: &[f32]) -> (f16, Vec<i8>) {
    let (raw, lo, hi) = match dtype {
        KvDtype::Int8 => {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            (amax * (1.0 / 127.0), -127.0, 127.0)
        }
        KvDtype::Int4 => {
            let mut m = 0.0f32;
            for &v in x {
                if v.abs() > m.abs() {
                    m = v;
                }
            }
            (m * -0.125, -8.0, 7.0)
        }
        KvDtype::F16 | KvDtype::F32 => panic!("quantize_group on a float dtype {dtype:?}"),
    };
    let scale = f16::from_f32(raw.clamp(-F16_MAX, F16_MAX));
    let s = scale.to_f32();
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    let codes = x
        .iter()
        .map(|&v| (v * inv).round_ties_even().clamp(lo, hi) as i8)
        .collect();
    (scale, codes)
}

/// What a pool of `dtype` gives back for `rows` (`[n, head_dim]` values) written into it.
pub fn round_trip(dtype: KvDtype, head_dim: usize, rows: &[f32]) -> Vec<f32> {
    match dtype {
        KvDtype::F32 => rows.to_vec(),
        KvDtype::F16 => rows.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        KvDtype::Int8 | KvDtype::Int4 => {
            let g = group_size(dtype, head_dim).expect("a quantizable head_dim");
            rows.chunks(g)
                .flat_map(|group| {
                    let (scale, codes) = quantize_group(dtype, group);
                    let s = scale.to_f32();
                    codes.into_iter().map(move |c| c as f32 * s)
                })
                .collect()
        }
    }
}

/// One K or V half of a block, decoded: `[num_kv_heads, block_size, head_dim]` values, and
/// for quantized pools the codes (same shape) and scales (`[num_kv_heads, block_size,
/// groups]`) as stored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedHalf {
    pub values: Vec<f32>,
    pub codes: Vec<i8>,
    pub scales: Vec<f16>,
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Code `j` of a row starting at word `base`.
fn code_at(w: &[u32], dtype: KvDtype, base: usize, j: usize) -> i8 {
    match dtype {
        KvDtype::Int8 => (w[base + j / 4] >> (8 * (j % 4))) as u8 as i8,
        KvDtype::Int4 => (((w[base + j / 8] >> (4 * (j % 8))) as u8) << 4) as i8 >> 4,
        _ => unreachable!(),
    }
}

/// Decodes one half (K or V) of one block of one layer, as `KvPool::read_block`
/// returns it: `layout.block_bytes()` bytes.
pub fn decode_half(layout: &KvLayout, bytes: &[u8]) -> DecodedHalf {
    assert_eq!(bytes.len() as u64, layout.block_bytes(), "one block half");
    let (hd, bs) = (layout.head_dim, layout.block_size);
    let w = words(bytes);
    let mut out = DecodedHalf::default();
    match layout.dtype {
        KvDtype::F32 => out.values = w.iter().map(|&x| f32::from_bits(x)).collect(),
        KvDtype::F16 => {
            out.values = w
                .iter()
                .flat_map(|&x| [x as u16, (x >> 16) as u16])
                .map(|b| f16::from_bits(b).to_f32())
                .collect()
        }
        dtype @ (KvDtype::Int8 | KvDtype::Int4) => {
            let g = layout.group_size();
            let groups = hd / g;
            let rw = layout.row_words();
            for h in 0..layout.num_kv_heads {
                let tile = h * layout.tile_words();
                for off in 0..bs {
                    for gi in 0..groups {
                        let idx = off * groups + gi;
                        let sw = w[tile + bs * rw + idx / 2];
                        let scale = f16::from_bits((sw >> (16 * (idx % 2))) as u16);
                        out.scales.push(scale);
                        for j in gi * g..(gi + 1) * g {
                            let c = code_at(&w, dtype, tile + off * rw, j);
                            out.codes.push(c);
                            out.values.push(c as f32 * scale.to_f32());
                        }
                    }
                }
            }
        }
    }
    out
}

/// Encodes `[num_kv_heads, block_size, head_dim]` values as one block half of `layout`, by
/// the same rule as `reshape_and_cache` (the inverse of [`decode_half`]).
pub fn encode_half(layout: &KvLayout, values: &[f32]) -> Vec<u8> {
    let (hd, bs) = (layout.head_dim, layout.block_size);
    assert_eq!(
        values.len(),
        layout.num_kv_heads * bs * hd,
        "one block half"
    );
    let mut w = vec![0u32; layout.num_kv_heads * layout.tile_words()];
    match layout.dtype {
        KvDtype::F32 => w = values.iter().map(|v| v.to_bits()).collect(),
        KvDtype::F16 => {
            w = values
                .chunks(2)
                .map(|p| {
                    f16::from_f32(p[0]).to_bits() as u32
                        | (f16::from_f32(p[1]).to_bits() as u32) << 16
                })
                .collect()
        }
        dtype @ (KvDtype::Int8 | KvDtype::Int4) => {
            let g = layout.group_size();
            let groups = hd / g;
            let rw = layout.row_words();
            let (bits, mask) = if dtype == KvDtype::Int8 {
                (8, 0xff)
            } else {
                (4, 0xf)
            };
            for h in 0..layout.num_kv_heads {
                let tile = h * layout.tile_words();
                for off in 0..bs {
                    let row = &values[(h * bs + off) * hd..][..hd];
                    for gi in 0..groups {
                        let (scale, codes) = quantize_group(dtype, &row[gi * g..(gi + 1) * g]);
                        let idx = off * groups + gi;
                        w[tile + bs * rw + idx / 2] |= (scale.to_bits() as u32) << (16 * (idx % 2));
                        for (k, &c) in codes.iter().enumerate() {
                            let j = gi * g + k;
                            let per_word = 32 / bits;
                            let word = tile + off * rw + j / per_word;
                            w[word] |= ((c as u8 as u32) & mask) << (bits * (j % per_word));
                        }
                    }
                }
            }
        }
    }
    bytemuck::cast_slice(&w).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dtype: KvDtype, head_dim: usize, block_size: usize) -> KvLayout {
        KvLayout {
            num_layers: 1,
            num_kv_heads: 3,
            head_dim,
            block_size,
            dtype,
        }
    }

    #[test]
    fn group_sizes() {
        use KvDtype::*;
        let cases = [
            (Int8, 64, Some(64)),
            (Int8, 128, Some(64)),
            (Int8, 256, Some(64)),
            (Int8, 96, Some(48)),
            (Int8, 80, Some(40)),
            (Int8, 16, Some(16)),
            (Int8, 8, Some(8)),
            (Int4, 64, Some(32)),
            (Int4, 128, Some(32)),
            (Int4, 96, Some(32)),
            (Int4, 80, Some(16)),
            (Int4, 24, Some(24)),
            (Int4, 12, None),
            (Int8, 6, None),
            (F16, 64, None),
        ];
        for (dtype, hd, want) in cases {
            assert_eq!(group_size(dtype, hd), want, "{dtype:?} head_dim {hd}");
        }
    }

    /// Tokens per byte relative to an f16 pool: the capacity the issue asks of each dtype.
    #[test]
    fn capacity_against_f16() {
        for hd in [64, 128, 256] {
            for bs in [8, 16, 32] {
                let f16_bytes = layout(KvDtype::F16, hd, bs).block_bytes() as f64;
                let ratio = |d| f16_bytes / layout(d, hd, bs).block_bytes() as f64;
                assert!(
                    ratio(KvDtype::Int8) >= 1.9,
                    "int8 hd {hd} bs {bs}: {}",
                    ratio(KvDtype::Int8)
                );
                assert!(
                    ratio(KvDtype::Int4) >= 3.5,
                    "int4 hd {hd} bs {bs}: {}",
                    ratio(KvDtype::Int4)
                );
                assert_eq!(ratio(KvDtype::F32), 0.5);
            }
        }
        // head_dim 64, block 16: 16 rows x 16 words of int8 codes + 16 scales in 8 words.
        assert_eq!(layout(KvDtype::Int8, 64, 16).tile_words(), 256 + 8);
        assert_eq!(layout(KvDtype::Int4, 64, 16).tile_words(), 128 + 16);
    }

    /// Hand-computed groups.
    #[test]
    fn quantize_by_hand() {
        // int8: amax 2.54 -> scale 0.02 (as f16: 0.0200042...), codes x / scale.
        let (s, c) = quantize_group(KvDtype::Int8, &[2.54, -1.27, 0.0, 0.011]);
        assert_eq!(s, f16::from_f32(0.02));
        let inv = 1.0 / s.to_f32();
        assert_eq!(c, vec![127, (-1.27 * inv).round() as i8, 0, 1]);
        // int4: the largest magnitude is -4, so scale = 0.5 and -4 -> -8 exactly; 4 clamps to 7.
        let (s, c) = quantize_group(KvDtype::Int4, &[1.0, -4.0, 4.0, 0.25, 0.75, -0.25]);
        assert_eq!(s.to_f32(), 0.5);
        // 0.25 / 0.5 = 0.5 -> 0 and 0.75 / 0.5 = 1.5 -> 2 (ties to even).
        assert_eq!(c, vec![2, -8, 7, 0, 2, 0]);
        // A group of zeros has scale 0 and codes 0.
        assert_eq!(
            quantize_group(KvDtype::Int4, &[0.0; 8]),
            (f16::ZERO, vec![0; 8])
        );
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let mut x = 0.37f32;
        let rows: Vec<f32> = (0..4 * 128)
            .map(|i| {
                x = (x * 3.9 * (1.0 - x)).clamp(0.01, 0.99);
                (x - 0.5) * if i % 37 == 0 { 20.0 } else { 2.0 }
            })
            .collect();
        for dtype in [KvDtype::Int8, KvDtype::Int4] {
            let g = group_size(dtype, 128).unwrap();
            let back = round_trip(dtype, 128, &rows);
            for (group, got) in rows.chunks(g).zip(back.chunks(g)) {
                let s = quantize_group(dtype, group).0.to_f32().abs();
                for (a, b) in group.iter().zip(got) {
                    // Half a step, plus the f16 rounding of the scale at the extremes, plus
                    // the clamp of int4's positive extreme (one step).
                    let bound = if dtype == KvDtype::Int4 {
                        1.01 * s
                    } else {
                        0.51 * s
                    };
                    assert!((a - b).abs() <= bound, "{dtype:?}: {a} -> {b}, scale {s}");
                }
            }
        }
    }

    #[test]
    fn encode_and_decode_are_inverse() {
        for dtype in KvDtype::ALL {
            for (hd, bs) in [(64, 16), (80, 8), (128, 4), (8, 3)] {
                let l = layout(dtype, hd, bs);
                let n = l.num_kv_heads * bs * hd;
                let values: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919) % 1001) as f32 / 100.0 - 5.0)
                    .collect();
                let bytes = encode_half(&l, &values);
                assert_eq!(bytes.len() as u64, l.block_bytes());
                let d = decode_half(&l, &bytes);
                assert_eq!(
                    d.values,
                    round_trip(dtype, hd, &values),
                    "{dtype:?} hd {hd} bs {bs}"
                );
            }
        }
    }
}
