//! The block-format fixtures in tests/fixtures/quant (tools/make_quant_fixtures.py documents
//! their format): blocks and the `gguf` package's dequantization of them.

use pagellm::internals::gguf::quant::GgmlType;
use std::path::PathBuf;

/// One fixture file: the type, the package's quantize input (if any), the quantized bytes and
/// the package's dequantize output.
pub struct Case {
    pub file: String,
    pub ty: GgmlType,
    pub input: Option<Vec<f32>>,
    pub bytes: Vec<u8>,
    pub expected: Vec<f32>,
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn load(file: &str) -> Case {
    let path: PathBuf = super::repo_root().join("tests/fixtures/quant").join(file);
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&raw[..4], b"GQF1", "{file}: bad magic");
    let word =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    let (id, n, flags) = (word(1), word(2) as usize, word(3));
    let ty = GgmlType::from_id(id).unwrap_or_else(|e| panic!("{file}: {e}"));
    let input_len = if flags & 1 != 0 { 4 * n } else { 0 };
    // The byte count comes from the file's size, not from the code under test.
    let nbytes = raw.len() - 16 - input_len - 4 * n;
    let body = &raw[16..];
    Case {
        file: file.to_string(),
        ty,
        input: (flags & 1 != 0).then(|| f32s(&body[..input_len])),
        bytes: body[input_len..input_len + nbytes].to_vec(),
        expected: f32s(&body[input_len + nbytes..]),
    }
}
