//! The GGUF reader against files written by the `gguf` Python package
//! (tools/make_gguf_fixtures.py): every metadata value type, a custom alignment and tensors
//! of several types read back as the package was asked to write them; and every truncation
//! and a set of corruptions of that file refused by name, never a panic.

use pagellm::internals::gguf::file::{Gguf, GgufFile, Value};
use serde_json::Value as Json;
use std::path::Path;

const DIR: &str = "tests/fixtures/gguf";

fn fixture() -> (Vec<u8>, Json) {
    let bytes = std::fs::read(Path::new(DIR).join("metadata.gguf")).unwrap();
    let text = std::fs::read_to_string(Path::new(DIR).join("metadata.json")).unwrap();
    (bytes, serde_json::from_str(&text).unwrap())
}

/// Whether `got` is the value the JSON entry of type `ty` describes.
fn same(ty: &str, want: &Json, got: &Value) -> bool {
    match (ty, got) {
        ("UINT8", Value::U8(v)) => want.as_u64() == Some((*v).into()),
        ("INT8", Value::I8(v)) => want.as_i64() == Some((*v).into()),
        ("UINT16", Value::U16(v)) => want.as_u64() == Some((*v).into()),
        ("INT16", Value::I16(v)) => want.as_i64() == Some((*v).into()),
        ("UINT32", Value::U32(v)) => want.as_u64() == Some((*v).into()),
        ("INT32", Value::I32(v)) => want.as_i64() == Some((*v).into()),
        ("UINT64", Value::U64(v)) => want.as_u64() == Some(*v),
        ("INT64", Value::I64(v)) => want.as_i64() == Some(*v),
        // The JSON holds the f32's exact value (the package wrote it from a double).
        ("FLOAT32", Value::F32(v)) => want.as_f64() == Some((*v).into()),
        ("FLOAT64", Value::F64(v)) => want.as_f64() == Some(*v),
        ("BOOL", Value::Bool(v)) => want.as_bool() == Some(*v),
        ("STRING", Value::String(v)) => want.as_str() == Some(v.as_str()),
        _ => false,
    }
}

#[test]
fn metadata_of_every_type_reads_as_the_package_wrote_it() {
    let (bytes, want) = fixture();
    let file = Gguf::parse(&bytes[..]).unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.alignment, 64);
    let kv = want["metadata"].as_object().unwrap();
    assert_eq!(file.metadata.len(), kv.len(), "{:?}", file.metadata.keys());
    for (key, entry) in kv {
        let got = file.get(key).unwrap_or_else(|| panic!("{key} missing"));
        let ty = entry["type"].as_str().unwrap();
        let ok = match (ty, got) {
            ("ARRAY", Value::Array(items)) => {
                let sub = entry["element_type"].as_str().unwrap();
                let want = entry["value"].as_array().unwrap();
                want.len() == items.len() && want.iter().zip(items).all(|(w, g)| same(sub, w, g))
            }
            _ => same(ty, &entry["value"], got),
        };
        assert!(ok, "{key}: {got:?} is not {entry}");
    }
}

#[test]
fn tensors_are_found_with_their_type_extents_and_bytes() {
    let (bytes, want) = fixture();
    let file = Gguf::parse(&bytes[..]).unwrap();
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(file.tensors.len(), tensors.len());
    for (t, w) in file.tensors.iter().zip(tensors) {
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(t.ty.name(), w["type"].as_str().unwrap(), "{}", t.name);
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims, dims, "{}", t.name);
        assert_eq!(t.start % 64, 0, "{} starts at {}", t.name, t.start);
        let hex: String = file.data(t).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, w["data"].as_str().unwrap(), "{}", t.name);
    }
    // The Hugging Face order of a [out, in] weight stored as [in, out].
    assert_eq!(file.tensor("weight.f32").unwrap().shape(), vec![3, 5]);
    assert!(file.tensor("absent").is_none());
}

#[test]
fn a_file_on_disk_is_mapped_and_a_missing_one_named() {
    let file = GgufFile::open(&Path::new(DIR).join("metadata.gguf")).unwrap();
    assert_eq!(file.tensors.len(), 5);
    let e = GgufFile::open(Path::new("no/such.gguf")).unwrap_err();
    assert!(e.to_string().contains("no/such.gguf"), "{e}");
}

#[test]
fn every_truncation_into_the_data_is_an_error_never_a_panic() {
    let (bytes, _) = fixture();
    // The writer pads the last tensor's data to the alignment; cutting only padding leaves
    // a whole file.
    let whole = Gguf::parse(&bytes[..]).unwrap();
    let end = whole.tensors.iter().map(|t| t.start + t.len).max().unwrap();
    assert!(end < bytes.len());
    for len in 0..end {
        let e = Gguf::parse(&bytes[..len]).unwrap_err();
        assert!(
            e.contains("truncated") || e.contains("corrupted") || e.contains("magic"),
            "cut at {len}: {e}"
        );
    }
    for len in end..bytes.len() {
        assert_eq!(Gguf::parse(&bytes[..len]).unwrap().tensors, whole.tensors);
    }
}

/// The byte offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

/// `bytes` with the little-endian `value` written at `at`.
fn patched(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + value.len()].copy_from_slice(value);
    b
}

#[test]
fn corruptions_are_refused_by_name() {
    let (bytes, _) = fixture();
    // A tensor's directory entry: its name, then u32 dims, the extents, u32 type, u64 offset.
    let entry = |name: &str| find(&bytes, name.as_bytes()) + name.len();
    let q8 = entry("weight.q8_0");
    let q8_type = q8 + 4 + 3 * 8;
    let f32_entry = entry("weight.f32");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (patched(&bytes, 0, b"GGUG"), "magic"),
        (patched(&bytes, 4, &1u32.to_le_bytes()), "version 1"),
        (
            patched(&bytes, 4, &7u32.to_le_bytes()),
            "unknown GGUF version 7",
        ),
        (patched(&bytes, 4, &3u32.to_be_bytes()), "big-endian"),
        // More tensors or keys than the file has bytes.
        (patched(&bytes, 8, &u64::MAX.to_le_bytes()), "tensor count"),
        (
            patched(&bytes, 16, &(1u64 << 40).to_le_bytes()),
            "metadata count",
        ),
        // Q2_K (type 10) and an id no type has.
        (patched(&bytes, q8_type, &10u32.to_le_bytes()), "Q2_K"),
        (patched(&bytes, q8_type, &9999u32.to_le_bytes()), "9999"),
        // Five dimensions; an extent past the file's end; a misaligned offset.
        (
            patched(&bytes, f32_entry, &5u32.to_le_bytes()),
            "5 dimensions",
        ),
        (
            patched(&bytes, f32_entry + 4, &(1u64 << 30).to_le_bytes()),
            "past the end",
        ),
        (
            patched(&bytes, f32_entry + 4 + 16 + 4, &8u64.to_le_bytes()),
            "not a multiple of the alignment 64",
        ),
        // Q8_0 rows must be whole blocks of 32.
        (
            patched(&bytes, q8 + 4, &48u64.to_le_bytes()),
            "whole Q8_0 blocks",
        ),
    ];
    for (bad, names) in cases {
        let e = Gguf::parse(&bad[..]).unwrap_err();
        assert!(e.contains(names), "wanted {names:?} in: {e}");
    }
    // A second tensor whose data lies over the first's.
    let f16_offset = entry("weight.f16") + 4 + 16 + 4;
    let e = Gguf::parse(&patched(&bytes, f16_offset, &0u64.to_le_bytes())[..]).unwrap_err();
    assert!(e.contains("overlap"), "{e}");
    // An alignment that is not a power of two.
    let align = find(&bytes, b"general.alignment") + "general.alignment".len() + 4;
    let e = Gguf::parse(&patched(&bytes, align, &48u32.to_le_bytes())[..]).unwrap_err();
    assert!(e.contains("power of two"), "{e}");
}
