//! Safetensors checkpoints: one `model.safetensors` or a sharded set listed in
//! `model.safetensors.index.json`, memory-mapped so weights are read once, straight into the
//! GPU upload. Headers are validated by the safetensors crate (offsets inside the file), so
//! a truncated or malformed file is an error naming it.

use super::arch::Slice;
use super::error::{ModelError, Result};
use crate::kernels::WeightDtype;
use crate::mapped::{FileBytes, Folder};
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

struct File {
    path: PathBuf,
    map: Bytes,
    /// Start of the data section (8-byte length + header).
    data_start: usize,
}

/// A file's bytes: mapped from disk, or computed at open (GGUF q and k weights with their
/// rows put back in Hugging Face order).
pub(crate) enum Bytes {
    Map(FileBytes),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// How a tensor is stored: a weight format the loader reads, or another, by name.
#[derive(Clone, Debug)]
pub(crate) enum Stored {
    Format(WeightDtype),
    Other(String),
}

/// One tensor: its storage format, shape and bytes (little-endian, row-major).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub dtype: WeightDtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    /// The values widened to f32 (exactly: f16 and bf16 are subsets of f32), or a block
    /// format's values decoded by the reference dequantizer.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            block if block.is_block() => {
                let elems = self.bytes.len() / block.block_bytes() * block.block_elems();
                // The length was checked against the shape when the tensor was read.
                crate::formats::dequantize(block, self.bytes, elems).unwrap_or_default()
            }
            WeightDtype::F32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            WeightDtype::F16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            WeightDtype::BF16 => self
                .bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => unreachable!("block formats are decoded above"),
        }
    }
}

struct Entry {
    file: usize,
    dtype: Stored,
    shape: Vec<usize>,
    offsets: (usize, usize),
}

/// The tensors of a checkpoint folder, memory-mapped.
pub struct Checkpoint {
    files: Vec<File>,
    tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Checkpoint({} files, {} tensors)",
            self.files.len(),
            self.tensors.len()
        )
    }
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or every shard named by `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_in(Folder::Disk(dir))
    }

    /// [`Self::open`] for a folder on disk or in memory.
    pub fn open_in(folder: Folder<'_>) -> Result<Self> {
        const INDEX: &str = "model.safetensors.index.json";
        let names: Vec<String> = if folder.exists(INDEX) {
            let v = super::config::read_json_in(folder, INDEX)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Config {
                    path: folder.path(INDEX),
                    message: "missing weight_map".into(),
                })?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|s| s.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            shards
        } else if folder.exists("model.safetensors") {
            vec!["model.safetensors".to_string()]
        } else {
            return Err(ModelError::NoWeights(folder.display_path()));
        };
        let mut ck = Checkpoint {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        };
        for name in names {
            ck.add_file(folder, &name)?;
        }
        Ok(ck)
    }

    fn add_file(&mut self, folder: Folder<'_>, name: &str) -> Result<()> {
        let path = folder.path(name);
        let map = folder.open(name).map_err(|error| ModelError::Io {
            path: path.clone(),
            error,
        })?;
        let malformed = |message: String| ModelError::Malformed {
            path: path.clone(),
            message,
        };
        let (header_len, meta) =
            SafeTensors::read_metadata(&map).map_err(|e| malformed(e.to_string()))?;
        let tensors: HashMap<String, &TensorInfo> = meta.tensors();
        let index = self.files.len();
        for (name, info) in tensors {
            if self.tensors.contains_key(&name) {
                return Err(malformed(format!(
                    "tensor {name} appears in more than one shard"
                )));
            }
            let dtype = match info.dtype {
                Dtype::F32 => Stored::Format(WeightDtype::F32),
                Dtype::F16 => Stored::Format(WeightDtype::F16),
                Dtype::BF16 => Stored::Format(WeightDtype::BF16),
                other => Stored::Other(format!("{other:?}")),
            };
            self.tensors.insert(
                name,
                Entry {
                    file: index,
                    dtype,
                    shape: info.shape.clone(),
                    offsets: info.data_offsets,
                },
            );
        }
        self.files.push(File {
            path,
            map: Bytes::Map(map),
            data_start: 8 + header_len,
        });
        Ok(())
    }

    /// A checkpoint of no files, filled by [`Self::add_bytes`] and [`Self::add_tensor`].
    pub(crate) fn empty() -> Self {
        Checkpoint {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        }
    }

    /// Adds the bytes tensors will point into; returns their index.
    pub(crate) fn add_bytes(&mut self, path: PathBuf, map: Bytes) -> usize {
        self.files.push(File {
            path,
            map,
            data_start: 0,
        });
        self.files.len() - 1
    }

    /// Bytes `range` of file `file`.
    pub(crate) fn bytes(&self, file: usize, range: std::ops::Range<usize>) -> &[u8] {
        &self.files[file].map[range]
    }

    /// Adds tensor `name`: `bytes` of file `file` (an index from [`Self::add_bytes`]).
    pub(crate) fn add_tensor(
        &mut self,
        name: String,
        file: usize,
        dtype: Stored,
        shape: Vec<usize>,
        bytes: std::ops::Range<usize>,
    ) -> Result<()> {
        if self.tensors.contains_key(&name) {
            return Err(ModelError::Malformed {
                path: self.files[file].path.clone(),
                message: format!("two tensors map to {name}"),
            });
        }
        let offsets = (bytes.start, bytes.end);
        let entry = Entry {
            file,
            dtype,
            shape,
            offsets,
        };
        self.tensors.insert(name, entry);
        Ok(())
    }

    /// Drops tensor `name` (one a loader replaced by others).
    pub(crate) fn remove(&mut self, name: &str) {
        self.tensors.remove(name);
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The bytes and shape of tensor `name` stored as bytes (safetensors `U8`: gpt-oss's
    /// packed MXFP4 blocks and scales), checked against its shape.
    pub(crate) fn bytes_tensor(&self, name: &str) -> Result<(&[usize], &[u8])> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let f = &self.files[e.file];
        let wrong = |message: String| ModelError::Malformed {
            path: f.path.clone(),
            message,
        };
        match &e.dtype {
            Stored::Other(d) if d == "U8" => {}
            other => {
                let d = match other {
                    Stored::Format(d) => d.name().to_string(),
                    Stored::Other(d) => d.clone(),
                };
                return Err(wrong(format!("tensor {name} is {d}, not bytes (U8)")));
            }
        }
        let (start, end) = (f.data_start + e.offsets.0, f.data_start + e.offsets.1);
        let bytes = f
            .map
            .get(start..end)
            .ok_or_else(|| wrong(format!("tensor {name} lies outside the file")))?;
        if bytes.len() != e.shape.iter().product::<usize>() {
            let why = format!(
                "tensor {name} has {} bytes for shape {:?}",
                bytes.len(),
                e.shape
            );
            return Err(wrong(why));
        }
        Ok((&e.shape, bytes))
    }

    /// The tensor `name`, which must be f32, f16 or bf16.
    pub fn get(&self, name: &str) -> Result<TensorRef<'_>> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let dtype = match &e.dtype {
            Stored::Format(dtype) => *dtype,
            Stored::Other(other) => {
                return Err(ModelError::Dtype {
                    name: name.to_string(),
                    dtype: other.clone(),
                })
            }
        };
        let f = &self.files[e.file];
        let (start, end) = (f.data_start + e.offsets.0, f.data_start + e.offsets.1);
        let bytes = f.map.get(start..end).ok_or_else(|| ModelError::Malformed {
            path: f.path.clone(),
            message: format!("tensor {name} lies outside the file"),
        })?;
        let count: usize = e.shape.iter().product();
        let row = e.shape.last().copied().unwrap_or(1);
        let expected = dtype
            .row_bytes(row)
            .and_then(|r| r.checked_mul(count / row.max(1)));
        if Some(bytes.len()) != expected {
            return Err(ModelError::Malformed {
                path: f.path.clone(),
                message: format!(
                    "tensor {name} has {} bytes for shape {:?} of {dtype:?}",
                    bytes.len(),
                    e.shape
                ),
            });
        }
        Ok(TensorRef {
            dtype,
            shape: &e.shape,
            bytes,
        })
    }

    /// The weight a [`Slice`] names: a whole tensor (1-D tensors as one row), or a run of
    /// rows of a fused 2-D one.
    pub fn part(&self, s: &Slice) -> Result<Part<'_>> {
        let t = self.get(&s.name)?;
        let (rows, cols) = match t.shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            other => {
                return Err(ModelError::Unsupported(format!(
                    "{}: a weight of {} dimensions ({other:?})",
                    s.name,
                    other.len()
                )))
            }
        };
        let (first, n) = s.rows.unwrap_or((0, rows));
        if first + n > rows {
            return Err(ModelError::Shape {
                name: s.name.clone(),
                expected: vec![first + n, cols],
                found: t.shape.to_vec(),
            });
        }
        // Whole blocks: checked by `get`.
        let row_bytes = t.dtype.row_bytes(cols).unwrap_or(0);
        Ok(Part {
            dtype: t.dtype,
            rows: n,
            cols,
            bytes: &t.bytes[first * row_bytes..(first + n) * row_bytes],
        })
    }
}

/// A 2-D run of a checkpoint tensor's rows (see [`Checkpoint::part`]).
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
    pub bytes: &'a [u8],
}

impl Part<'_> {
    /// The values widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        TensorRef {
            dtype: self.dtype,
            shape: &[],
            bytes: self.bytes,
        }
        .to_f32()
    }
}
