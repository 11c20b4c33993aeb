//! A reader of GGUF files, the format of llama.cpp, Ollama and LM Studio models: the header,
//! the metadata and the tensor directory, parsed from the file's bytes (memory-mapped by
//! [`GgufFile::open`]), with each tensor's data borrowed from those bytes, never copied.
//!
//! The layout (GGUF versions 2 and 3; version 1 counted in 32 bits and is not read):
//!
//! ```text
//! "GGUF" | u32 version | u64 tensor count | u64 metadata count
//! metadata:   (string key, u32 value type, value) per entry
//! tensors:    (string name, u32 dims, u64 extent per dim, u32 ggml type, u64 offset) each
//! padding to `general.alignment` (32 if absent), then the tensor data; each tensor's
//! offset is relative to the data's start and a multiple of the alignment
//! ```
//!
//! Strings are a u64 byte length and UTF-8 bytes; an array is a u32 element type, a u64
//! length and the elements. Everything is little-endian. A tensor's first dimension is the
//! fastest-varying one (ggml's order): a Hugging Face `[out, in]` weight has extents
//! `[in, out]`. Every length and offset is checked against the file before it is used, so a
//! truncated or corrupted file is an error naming what is wrong and where, never a panic
//! or an allocation of a size the file merely claims.

use crate::formats::GgmlType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The metadata key that sets the tensor data's alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// The alignment of tensor data where the file does not set one.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Dimensions a tensor may have (ggml's limit).
pub const MAX_DIMS: u32 = 4;

/// What is wrong with a GGUF file, and at which byte.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: not a valid GGUF file: {message}")]
    Malformed { path: PathBuf, message: String },
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Extents, fastest-varying first (ggml's order).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// The data's offset from the start of the file.
    pub start: usize,
    /// The data's length in bytes (what the type and extents imply).
    pub len: usize,
}

impl TensorInfo {
    pub fn elems(&self) -> u64 {
        self.dims.iter().product()
    }

    /// The extents in Hugging Face order (slowest-varying first): `[out, in]` for a weight.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file: its metadata, its tensor directory and the bytes the directory
/// points into.
#[derive(Debug)]
pub struct Gguf<B> {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    /// In the order of the file.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    bytes: B,
}

/// A GGUF file memory-mapped from disk (read whole without the `native` feature).
pub type GgufFile = Gguf<crate::mapped::FileBytes>;

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let map = crate::mapped::open(path).map_err(io)?;
        Gguf::parse(map).map_err(|message| GgufError::Malformed {
            path: path.to_path_buf(),
            message,
        })
    }
}

impl<B: AsRef<[u8]>> Gguf<B> {
    /// Parses `bytes` as a GGUF file; the error says what is wrong and at which byte.
    pub fn parse(bytes: B) -> Result<Self, String> {
        let mut r = Reader {
            bytes: bytes.as_ref(),
            pos: 0,
        };
        let version = header(&mut r)?;
        let tensor_count = r.count("tensor count")?;
        let kv_count = r.count("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let at = r.pos;
            let key = r.string()?;
            let value = r.value(0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(format!("metadata key {key:?} appears twice (byte {at})"));
            }
        }
        let alignment = alignment(&metadata)?;
        let mut entries = Vec::new();
        for _ in 0..tensor_count {
            entries.push(r.tensor_entry()?);
        }
        let data_start = r.pos.div_ceil(alignment as usize) * alignment as usize;
        let tensors = place_tensors(entries, data_start, alignment, r.bytes.len())?;
        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            bytes,
        })
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of tensor `t` (an entry of this file's directory).
    pub fn data(&self, t: &TensorInfo) -> &[u8] {
        &self.bytes.as_ref()[t.start..t.start + t.len]
    }

    /// The metadata value at `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensor directory and the bytes it points into.
    pub fn into_parts(self) -> (Vec<TensorInfo>, B) {
        (self.tensors, self.bytes)
    }
}

/// Reads the magic and the version.
fn header(r: &mut Reader<'_>) -> Result<u32, String> {
    let magic = r.take(4, "the magic")?;
    if magic != b"GGUF" {
        return Err(format!(
            "the file starts with {magic:?}, not the GGUF magic {:?}",
            b"GGUF"
        ));
    }
    let version = r.u32()?;
    match version {
        2 | 3 => Ok(version),
        1 => Err(
            "GGUF version 1 (before 64-bit counts) is not supported; convert the file \
                  with a current llama.cpp"
                .into(),
        ),
        v if v.swap_bytes() <= 3 => Err(format!(
            "a big-endian GGUF file (version {}) is not supported",
            v.swap_bytes()
        )),
        v => Err(format!(
            "unknown GGUF version {v} (this reader knows 2 and 3)"
        )),
    }
}

/// The file's tensor data alignment: `general.alignment`, a power of two, or 32.
fn alignment(metadata: &BTreeMap<String, Value>) -> Result<u64, String> {
    let Some(v) = metadata.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_u64() {
        Some(a) if a.is_power_of_two() && a <= 1 << 20 => Ok(a),
        _ => Err(format!(
            "{ALIGNMENT_KEY} is {v:?}; it must be a power of two of at most 2^20"
        )),
    }
}

/// A tensor directory entry as the file states it, before its data is placed.
struct Entry {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    len: usize,
}

/// Checks each entry's data lies inside the file, aligned, without overlapping another's.
fn place_tensors(
    entries: Vec<Entry>,
    data_start: usize,
    alignment: u64,
    file_len: usize,
) -> Result<Vec<TensorInfo>, String> {
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(entries.len());
    for e in entries {
        if tensors.iter().any(|t| t.name == e.name) {
            return Err(format!("tensor {} appears twice", e.name));
        }
        if e.offset % alignment != 0 {
            return Err(format!(
                "tensor {}'s data offset {} is not a multiple of the alignment {alignment}",
                e.name, e.offset
            ));
        }
        let start = usize::try_from(e.offset)
            .ok()
            .and_then(|o| o.checked_add(data_start));
        let end = start.and_then(|s| s.checked_add(e.len));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(format!(
                "tensor {}'s data offset {} overflows",
                e.name, e.offset
            ));
        };
        if end > file_len {
            return Err(format!(
                "tensor {} ({} bytes at byte {start}) runs past the end of the file ({file_len} \
                 bytes): truncated?",
                e.name, e.len
            ));
        }
        if let Some(t) = tensors
            .iter()
            .find(|t| start < t.start + t.len && t.start < end)
        {
            return Err(format!("tensors {} and {} overlap", t.name, e.name));
        }
        tensors.push(TensorInfo {
            name: e.name,
            dims: e.dims,
            ty: e.ty,
            start,
            len: e.len,
        });
    }
    Ok(tensors)
}

/// A cursor over the file's bytes whose reads fail, naming the byte, past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// Nesting of arrays a metadata value may have (GGUF writers nest at most one level).
const MAX_NESTING: usize = 4;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(format!(
                "the file ends at byte {} inside {what} ({n} bytes at byte {}): truncated?",
                self.bytes.len(),
                self.pos
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.take(N, what)?;
        Ok(s.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array("a u32")?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array("a u64")?))
    }

    /// A u64 count of things of at least one byte each: more than the bytes left is an
    /// error here, before anything is allocated for them.
    fn count(&mut self, what: &str) -> Result<usize, String> {
        let at = self.pos;
        let n = self.u64()?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(format!(
                "{what} {n} at byte {at} is more than the {left} bytes left: truncated or corrupted?"
            ));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String, String> {
        let at = self.pos;
        let len = self.count("a string length")?;
        let bytes = self.take(len, "a string")?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("the string at byte {at} is not UTF-8"))
    }

    /// A u32 value type and the value.
    fn value(&mut self, depth: usize) -> Result<Value, String> {
        let at = self.pos;
        let ty = self.u32()?;
        self.typed(ty, depth).map_err(|e| {
            if e.is_empty() {
                format!("unknown metadata value type {ty} at byte {at}")
            } else {
                e
            }
        })
    }

    /// A value of type `ty`; an empty error for an unknown type (the caller names it).
    fn typed(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>("a u8")?[0]),
            1 => Value::I8(self.array::<1>("an i8")?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array("a u16")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("an i16")?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array("an i32")?)),
            6 => Value::F32(f32::from_le_bytes(self.array("an f32")?)),
            7 => match self.array::<1>("a bool")?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("a bool of {b} at byte {}", self.pos - 1)),
            },
            8 => Value::String(self.string()?),
            9 => self.array_value(depth)?,
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array("an i64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("an f64")?)),
            _ => return Err(String::new()),
        })
    }

    /// An array: its element type, its length and the elements.
    fn array_value(&mut self, depth: usize) -> Result<Value, String> {
        let at = self.pos;
        if depth >= MAX_NESTING {
            return Err(format!("arrays nested {MAX_NESTING} deep at byte {at}"));
        }
        let ty = self.u32()?;
        let n = self.count("an array length")?;
        let mut items = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            match self.typed(ty, depth + 1) {
                Err(e) if e.is_empty() => {
                    return Err(format!("unknown array element type {ty} at byte {at}"))
                }
                r => items.push(r?),
            }
        }
        Ok(Value::Array(items))
    }

    /// One tensor directory entry.
    fn tensor_entry(&mut self) -> Result<Entry, String> {
        let at = self.pos;
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name} (byte {at}) has {n_dims} dimensions; 1 to {MAX_DIMS} are allowed"
            ));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64())
            .collect::<Result<Vec<u64>, String>>()?;
        let type_id = self.u32()?;
        let offset = self.u64()?;
        let ty = GgmlType::from_id(type_id).map_err(|e| format!("tensor {name}: {e}"))?;
        let block = ty.block_elems() as u64;
        if dims[0] % block != 0 {
            return Err(format!(
                "tensor {name}'s rows of {} elements are not whole {} blocks of {block}",
                dims[0],
                ty.name()
            ));
        }
        let elems = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|e| usize::try_from(e).ok())
            .ok_or_else(|| format!("tensor {name}'s extents {dims:?} overflow"))?;
        let len = ty
            .bytes_for(elems)
            .map_err(|e| format!("tensor {name} with extents {dims:?}: {e}"))?;
        Ok(Entry {
            name,
            dims,
            ty,
            offset,
            len,
        })
    }
}
