//! The plain-Rust GGML block formats of `pagellm::internals::gguf::quant` against llama.cpp's `gguf`
//! Python package (fixtures made by tools/make_quant_fixtures.py, which documents their
//! format): dequantization bit for bit for every type, quantization byte for byte where the
//! package has a quantizer, stated error bounds for quantize-then-dequantize, and clear
//! errors (never panics) for malformed input. No GPU and no Python needed.

mod common;
use common::quant_fixture::load;
use pagellm::internals::gguf::quant::{dequantize, quantize, GgmlType, QuantError};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

const QUANT_CASES: [&str; 8] = [
    "f32_quant.bin",
    "f16_quant.bin",
    "bf16_quant.bin",
    "q4_0_quant.bin",
    "q4_1_quant.bin",
    "q5_0_quant.bin",
    "q5_1_quant.bin",
    "q8_0_quant.bin",
];

const RAW_CASES: [&str; 16] = [
    "f32_raw.bin",
    "f16_raw.bin",
    "bf16_raw.bin",
    "q4_0_raw.bin",
    "q4_1_raw.bin",
    "q5_0_raw.bin",
    "q5_1_raw.bin",
    "q8_0_raw.bin",
    "q4_k_raw.bin",
    "q5_k_raw.bin",
    "q6_k_raw.bin",
    "iq4_nl_raw.bin",
    "mxfp4_raw.bin",
    "iq4_xs_raw.bin",
    "q2_k_raw.bin",
    "q3_k_raw.bin",
];

fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
}

#[test]
fn dequantize_matches_the_gguf_package_bit_for_bit() {
    let mut types = Vec::new();
    for file in QUANT_CASES.iter().chain(&RAW_CASES) {
        let case = load(file);
        let n = case.expected.len();
        let got = dequantize(case.ty, &case.bytes, n).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(got.len(), n, "{file}: element count");
        if let Some(i) = first_bit_difference(&got, &case.expected) {
            panic!(
                "{} ({}): element {i} is {} ({:#010x}), the package gives {} ({:#010x})",
                case.file,
                case.ty,
                got[i],
                got[i].to_bits(),
                case.expected[i],
                case.expected[i].to_bits()
            );
        }
        types.push(case.ty);
    }
    for ty in GgmlType::ALL {
        assert!(types.contains(&ty), "no dequantize fixture for {ty}");
    }
}

#[test]
fn quantize_matches_the_gguf_package_byte_for_byte() {
    for file in QUANT_CASES {
        let case = load(file);
        assert!(case.ty.quantize_matches_ggml(), "{file}");
        let input = case
            .input
            .as_ref()
            .expect("quantize fixtures carry their input");
        let got = quantize(case.ty, input).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(got.len(), case.bytes.len(), "{file}: byte count");
        if let Some(i) = got.iter().zip(&case.bytes).position(|(g, w)| g != w) {
            let block = i / case.ty.block_bytes();
            panic!(
                "{} ({}): byte {i} (byte {} of block {block}) is {:#04x}, the package has {:#04x}",
                case.file,
                case.ty,
                i % case.ty.block_bytes(),
                got[i],
                case.bytes[i]
            );
        }
    }
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        assert!(
            !ty.quantize_matches_ggml(),
            "{ty} has no package quantizer to match"
        );
    }
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
    ] {
        assert!(!ty.quantize_matches_ggml(), "{ty}: pagellm's own quantizer");
    }
}

/// Ids, names, block sizes and bytes per block as the package's `GGMLQuantizationType` and
/// `GGML_QUANT_SIZES` give them.
#[test]
fn type_table_matches_ggml() {
    let table: [(u32, &str, usize, usize); 16] = [
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (20, "IQ4_NL", 32, 18),
        (23, "IQ4_XS", 256, 136),
        (30, "BF16", 1, 2),
        (39, "MXFP4", 32, 17),
    ];
    for (id, name, block, bytes) in table {
        let ty = GgmlType::from_id(id).unwrap();
        assert_eq!(
            (ty.id(), ty.name(), ty.block_elems(), ty.block_bytes()),
            (id, name, block, bytes)
        );
        assert_eq!(ty.bytes_for(3 * block), Ok(3 * bytes), "{name}");
        assert_eq!(ty.bytes_for(0), Ok(0), "{name}");
    }
    // The fixtures' sizes agree as well.
    for file in RAW_CASES {
        let case = load(file);
        assert_eq!(
            case.ty.bytes_for(case.expected.len()),
            Ok(case.bytes.len()),
            "{file}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// Round-trip error bounds
// ------------------------------------------------------------------------------------------

const F16_ULP: f32 = 1.0 / 2048.0; // half an f16 ulp, relative (2^-11)
const F16_SUB: f32 = 1.0 / 33_554_432.0; // half the f16 subnormal spacing (2^-25)

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// The smallest f16 value at least `t` is at most `t` plus one f16 ulp.
fn f16_up(t: f32) -> f32 {
    t * (1.0 + 2.0 * F16_ULP) + 2.0 * F16_SUB
}

/// Largest allowed `|x - dequantize(quantize(x))|` for each element of one block `x`,
/// derived from `x` alone:
/// - F32 exact; F16 half an f16 ulp (2^-11 relative, 2^-25 absolute below the normal
///   range); BF16 half a bf16 ulp (2^-8 relative).
/// - Q8_0: step `d = max|x| / 127`; codes round to nearest (`d / 2`), and the f16 scale is
///   off by at most `d * 2^-11 + 2^-25`, times at most 127 codes.
/// - Q4_0 / Q5_0: step `d = max|x| / 8` (or 16), the value of largest magnitude maps to code
///   -8 (-16), so a value of the other sign near `max|x|` is clipped to code 7 (15): up to one
///   full step, plus the f16 scale error times 8 (16).
/// - Q4_1 / Q5_1: step `d = (max - min) / 15` (31); codes round half up (`d / 2`), plus the
///   f16 scale error times 15 (31) and the f16 error of the stored min.
/// - Q4_K / Q5_K (pagellm's bound-first encoding, which the quantizer uses wherever its
///   least-squares fit does no better, so these bound each super-block's squared error in
///   sum): per sub-block of 32, span `s = max x - min(0, min x)`;
///   with `O` the largest offset `-min(0, min x)` of the super-block, `dmin <= f16_up(O / 63)`,
///   the sub-block's step is at most `need + d` with `need <= (s + dmin) / L` (`L` = 15, 31)
///   and `d <= f16_up(max need / 63)`; codes round to nearest: `(need + d) / 2`.
/// - Q6_K (the same, bound-first): per sub-block of 16, `need = max|x| / 31`,
///   `d <= f16_up(max need / 127)`: `(need + d) / 2`.
///
/// Each adds `2^-18 * max|x|` for the f32 rounding of the arithmetic.
fn bounds(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let slack = absmax(x) / 262_144.0;
    let f16_err = |d: f32| d * F16_ULP + F16_SUB;
    let flat = |b: f32| vec![b + slack; x.len()];
    match ty {
        GgmlType::F32 => vec![0.0; x.len()],
        GgmlType::F16 => x.iter().map(|v| v.abs() * F16_ULP + F16_SUB).collect(),
        GgmlType::BF16 => x.iter().map(|v| v.abs() / 256.0).collect(),
        GgmlType::Q8_0 => {
            let d = absmax(x) / 127.0;
            flat(d / 2.0 + 127.0 * f16_err(d))
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let half_levels = if ty == GgmlType::Q4_0 { 8.0 } else { 16.0 };
            let d = absmax(x) / half_levels;
            flat(d + half_levels * f16_err(d))
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let levels = if ty == GgmlType::Q4_1 { 15.0 } else { 31.0 };
            let (lo, hi) = min_max(x);
            let d = (hi - lo) / levels;
            flat(d / 2.0 + levels * f16_err(d) + f16_err(lo.abs()))
        }
        GgmlType::Q4_K | GgmlType::Q5_K => k_asym_bounds(ty, x, slack),
        GgmlType::IQ4_NL => x
            .chunks(32)
            .flat_map(|b| {
                let d = absmax(b) / 127.0;
                [14.0 * d + 128.0 * f16_err(d) + slack; 32]
            })
            .collect(),
        GgmlType::Q2_K => {
            let subs: Vec<(f32, f32)> = x.chunks(16).map(min_max).collect();
            let mut out = Vec::with_capacity(x.len());
            for sup in subs.chunks(16) {
                let offset = sup.iter().fold(0.0f32, |m, &(lo, _)| m.max(-lo.min(0.0)));
                let dmin = f16_up(offset / 15.0);
                let need: Vec<f32> = sup
                    .iter()
                    .map(|&(lo, hi)| (hi - lo.min(0.0) + dmin) / 3.0)
                    .collect();
                let d = f16_up(need.iter().fold(0.0f32, |m, &v| m.max(v)) / 15.0);
                for n in need {
                    out.extend([(n + d) / 2.0 + slack; 16]);
                }
            }
            out
        }
        GgmlType::Q3_K => {
            let steps: Vec<f32> = x
                .chunks(16)
                .map(|b| {
                    let (lo, hi) = min_max(b);
                    (hi / 3.0).max(-lo / 4.0).max(0.0)
                })
                .collect();
            let mut out = Vec::with_capacity(x.len());
            for sup in steps.chunks(16) {
                let d = f16_up(sup.iter().fold(0.0f32, |m, &v| m.max(v)) / 31.0);
                for &step in sup {
                    out.extend([(step + d) / 2.0 + slack; 16]);
                }
            }
            out
        }
        GgmlType::IQ4_XS => x
            .chunks(256)
            .flat_map(|sup| {
                let d = f16_up(absmax(sup) / 127.0 / 31.0);
                sup.chunks(32)
                    .flat_map(|b| {
                        let step = absmax(b) / 127.0;
                        [14.0 * (step + d) + slack; 32]
                    })
                    .collect::<Vec<f32>>()
            })
            .collect(),
        GgmlType::MXFP4 => x
            .chunks(32)
            .flat_map(|b| {
                // The scale unit: 2^(floor(log2 max|x|) - 3), at least the smallest
                // scale, 2^-128.
                let a = absmax(b);
                let smallest = f32::from_bits(0x0020_0000);
                let unit = if a > 0.0 {
                    (a.log2().floor() - 3.0).exp2()
                } else {
                    0.0
                };
                let unit = unit.max(smallest);
                [4.0 * unit + slack; 32]
            })
            .collect(),
        GgmlType::Q6_K => {
            let need: Vec<f32> = x.chunks(16).map(|s| absmax(s) / 31.0).collect();
            let d = f16_up(need.iter().fold(0.0f32, |m, &v| m.max(v)) / 127.0);
            need.iter()
                .flat_map(|&n| [(n + d) / 2.0 + slack; 16])
                .collect()
        }
    }
}

fn k_asym_bounds(ty: GgmlType, x: &[f32], slack: f32) -> Vec<f32> {
    let levels = if ty == GgmlType::Q4_K { 15.0 } else { 31.0 };
    let mut out = Vec::with_capacity(x.len());
    for sup in x.chunks(256) {
        let subs: Vec<(f32, f32)> = sup.chunks(32).map(min_max).collect();
        let largest_offset = subs.iter().fold(0.0f32, |m, &(lo, _)| m.max(-lo.min(0.0)));
        let dmin = f16_up(largest_offset / 63.0);
        let need: Vec<f32> = subs
            .iter()
            .map(|&(lo, hi)| (hi - lo.min(0.0) + dmin) / levels)
            .collect();
        let d = f16_up(need.iter().fold(0.0f32, |m, &v| m.max(v)) / 63.0);
        for n in need {
            out.extend([(n + d) / 2.0 + slack; 32]);
        }
    }
    out
}

fn check_round_trip(ty: GgmlType, x: &[f32], what: &str) -> Result<(), String> {
    let bytes = quantize(ty, x).map_err(|e| format!("{ty} {what}: {e}"))?;
    let back = dequantize(ty, &bytes, x.len()).map_err(|e| format!("{ty} {what}: {e}"))?;
    let bound = bounds(ty, x);
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        // The quantizer keeps the better of the bound-first encoding and a least-squares
        // fit, so each super-block's squared error is at most what the bounds allow in sum
        // (single values may exceed theirs).
        let sq = |v: f32| f64::from(v) * f64::from(v);
        for (b, ((x, w), bound)) in x
            .chunks(256)
            .zip(back.chunks(256))
            .zip(bound.chunks(256))
            .enumerate()
        {
            let err: f64 = x.iter().zip(w).map(|(&a, &b)| sq(a - b)).sum();
            let allowed: f64 = bound.iter().map(|&b| sq(b)).sum();
            if err.is_nan() || err > allowed * (1.0 + 1e-6) {
                return Err(format!(
                    "{ty} {what}: super-block {b}: squared error {err} > {allowed}"
                ));
            }
        }
        return Ok(());
    }
    for (i, ((&v, &w), &b)) in x.iter().zip(&back).zip(&bound).enumerate() {
        let err = (v - w).abs();
        if err.is_nan() || err > b {
            return Err(format!(
                "{ty} {what}: element {i}: {v} came back as {w}, error {err} > bound {b}"
            ));
        }
    }
    Ok(())
}

/// Blocks of several shapes: normal at several scales, offsets of both signs, an outlier,
/// zeros, and sub-blocks of very different scales within one super-block.
fn sample_values(rng: &mut StdRng, elems: usize, kind: usize) -> Vec<f32> {
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let scale = [1e-3f32, 0.5, 20.0, 1000.0][kind % 4];
    let mut x: Vec<f32> = (0..elems).map(|_| normal.sample(rng) * scale).collect();
    match kind / 4 {
        0 => {}
        1 => x.iter_mut().for_each(|v| *v = v.abs() + 2.0 * scale), // all positive
        2 => x.iter_mut().for_each(|v| *v = -v.abs() - 2.0 * scale), // all negative
        3 => x[rng.random_range(0..elems)] = 40.0 * scale,          // one outlier
        4 => x.iter_mut().for_each(|v| *v = 0.0),
        _ => {
            for (i, v) in x.iter_mut().enumerate() {
                *v *= [1e-3f32, 0.1, 1.0, 4.0][(i / 16) % 4];
            }
        }
    }
    x
}

#[test]
fn quantize_then_dequantize_stays_within_the_bounds() {
    let mut rng = StdRng::seed_from_u64(0x6767_7566);
    for ty in GgmlType::ALL {
        for kind in 0..24 {
            let x = sample_values(&mut rng, 2 * 256, kind);
            if let Err(message) = check_round_trip(ty, &x, &format!("kind {kind}")) {
                panic!("{message}");
            }
        }
    }
}

/// The bounds are not vacuous: on normal data the K-quants' mean error is a fraction of
/// what a 4-, 5- or 6-bit code's half step on the block range would be.
#[test]
fn k_quant_errors_are_of_the_expected_size() {
    let mut rng = StdRng::seed_from_u64(7);
    let x = sample_values(&mut rng, 16 * 256, 1);
    for (ty, bits) in [
        (GgmlType::Q4_K, 4),
        (GgmlType::Q5_K, 5),
        (GgmlType::Q6_K, 6),
    ] {
        let back = dequantize(ty, &quantize(ty, &x).unwrap(), x.len()).unwrap();
        let rms = (x
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / x.len() as f32)
            .sqrt();
        let step = 2.0 * absmax(&x) / ((1 << bits) as f32 - 1.0);
        assert!(
            rms > 0.0 && rms < step / 2.0,
            "{ty}: rms error {rms} vs half step {}",
            step / 2.0
        );
    }
}

/// The least-squares search earns its cost: on normal data the K-quants beat the legacy
/// formats of one more bit per 32 values (Q4_1 spends 5 bits a value, Q4_K 4.5; Q5_1 6,
/// Q5_K 5.5), as llama.cpp's K-quants do; the bound-first encoding alone did not (RMS
/// 0.0798 against Q4_1's 0.0782, 0.0392 against Q5_1's 0.0379).
#[test]
fn k_quants_beat_the_legacy_formats_of_more_bits() {
    let mut rng = StdRng::seed_from_u64(11);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let x: Vec<f32> = (0..64 * 256).map(|_| normal.sample(&mut rng)).collect();
    let rms = |ty: GgmlType| {
        let back = dequantize(ty, &quantize(ty, &x).unwrap(), x.len()).unwrap();
        let sum: f64 = x
            .iter()
            .zip(&back)
            .map(|(&a, &b)| f64::from(a - b).powi(2))
            .sum();
        (sum / x.len() as f64).sqrt()
    };
    for (k, legacy) in [
        (GgmlType::Q4_K, GgmlType::Q4_1),
        (GgmlType::Q5_K, GgmlType::Q5_1),
    ] {
        let (a, b) = (rms(k), rms(legacy));
        assert!(a < 0.97 * b, "{k} rms {a:.5} vs {legacy} {b:.5}");
    }
}

fn any_type() -> impl Strategy<Value = GgmlType> {
    prop::sample::select(GgmlType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any whole number of blocks, any values at any of several scales.
    #[test]
    fn any_block_count_round_trips_within_the_bound(
        (ty, x) in (any_type(), 1usize..=3, prop::sample::select(vec![1e-2f32, 1.0, 1e3]))
            .prop_flat_map(|(ty, k, s)| {
                let elems = k * ty.block_elems().max(32);
                (Just(ty), prop::collection::vec(-s..s, elems))
            })
    ) {
        check_round_trip(ty, &x, "proptest").map_err(TestCaseError::fail)?;
    }

    /// Any byte string and element count: dequantize succeeds exactly when the length fits,
    /// and never panics.
    #[test]
    fn dequantize_never_panics(
        ty in any_type(),
        bytes in prop::collection::vec(any::<u8>(), 0..700),
        elems in 0usize..600,
    ) {
        let result = dequantize(ty, &bytes, elems);
        let fits = ty.bytes_for(elems) == Ok(bytes.len());
        prop_assert_eq!(result.is_ok(), fits);
        if let Ok(values) = result {
            prop_assert_eq!(values.len(), elems);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Bad input
// ------------------------------------------------------------------------------------------

#[test]
fn wrong_byte_lengths_are_errors_naming_type_and_counts() {
    for ty in GgmlType::ALL {
        let elems = 2 * ty.block_elems();
        let right = 2 * ty.block_bytes();
        for got in [right - 1, right + 1, 0] {
            let err = dequantize(ty, &vec![0u8; got], elems).unwrap_err();
            assert_eq!(
                err,
                QuantError::ByteLength {
                    ty,
                    elems,
                    expected: right,
                    got
                }
            );
            let message = err.to_string();
            for part in [
                ty.name().to_string(),
                elems.to_string(),
                right.to_string(),
                got.to_string(),
            ] {
                assert!(message.contains(&part), "{message:?} lacks {part:?}");
            }
        }
    }
}

#[test]
fn element_counts_off_the_block_are_errors() {
    for ty in GgmlType::ALL.into_iter().filter(|ty| ty.block_elems() > 1) {
        let block = ty.block_elems();
        for elems in [1, block - 1, block + 1, 3 * block + 7] {
            let want = QuantError::NotBlockMultiple { ty, elems, block };
            assert_eq!(ty.bytes_for(elems), Err(want.clone()));
            assert_eq!(dequantize(ty, &[0u8; 64], elems), Err(want.clone()));
            assert_eq!(quantize(ty, &vec![0.5; elems]), Err(want.clone()));
            let message = want.to_string();
            assert!(
                message.contains(ty.name()) && message.contains(&elems.to_string()),
                "{message}"
            );
            assert!(message.contains("multiple"), "{message}");
        }
    }
    assert!(matches!(
        GgmlType::Q8_0.bytes_for(usize::MAX - 31),
        Err(QuantError::TooLarge { .. })
    ));
}

#[test]
fn unsupported_and_unknown_type_ids_are_named() {
    for (id, name) in [
        (15, "Q8_K"),
        (16, "IQ2_XXS"),
        (22, "IQ2_S"),
        (34, "TQ1_0"),
        (40, "NVFP4"),
    ] {
        let err = GgmlType::from_id(id).unwrap_err();
        assert_eq!(err, QuantError::UnsupportedType { id, name });
        let message = err.to_string();
        assert!(
            message.contains(name) && message.contains("not supported"),
            "{message}"
        );
    }
    for id in [42, 99, u32::MAX] {
        let err = GgmlType::from_id(id).unwrap_err();
        assert_eq!(err, QuantError::UnknownTypeId { id });
        assert!(err.to_string().contains(&id.to_string()), "{err}");
    }
}

#[test]
fn non_finite_values_and_overflowing_scales_are_errors() {
    for ty in GgmlType::ALL.into_iter().filter(|ty| ty.block_elems() > 1) {
        let n = ty.block_elems();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![1.0f32; 2 * n];
            x[n + 3] = bad;
            let err = quantize(ty, &x).unwrap_err();
            assert!(
                matches!(err, QuantError::NonFinite { index, .. } if index == n + 3),
                "{ty}: {err}"
            );
            assert!(err.to_string().contains(ty.name()), "{err}");
        }
        // Far beyond what an f16 scale times the largest code reaches (MXFP4's scale is a
        // power of two up to 2^126: it takes any finite value).
        let mut x = vec![1.0f32; 2 * n];
        x[n] = 3.0e38;
        if ty == GgmlType::MXFP4 {
            let back = dequantize(ty, &quantize(ty, &x).unwrap(), x.len()).unwrap();
            assert_eq!((back[n], back[n + 1]), (3.0 * 2f32.powi(126), 0.0), "{ty}");
            continue;
        }
        let err = quantize(ty, &x).unwrap_err();
        assert_eq!(err, QuantError::ScaleOverflow { ty, block: 1 });
        assert!(err.to_string().contains("f16"), "{err}");
    }
    // The float types pass special values through, as the package does.
    let special = [f32::NAN, f32::INFINITY, -0.0];
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let back = dequantize(ty, &quantize(ty, &special).unwrap(), special.len()).unwrap();
        assert!(
            back[0].is_nan()
                && back[1] == f32::INFINITY
                && back[2].to_bits() == (-0.0f32).to_bits()
        );
    }
}
