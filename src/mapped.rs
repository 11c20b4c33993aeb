//! Where a model's files come from, and their bytes. A model is a folder or a GGUF file on
//! disk, or files already in memory, by name ([`MemoryFiles`]: what a browser fetched; it has
//! no paths). The loaders read either through a [`Folder`]. A file's bytes ([`FileBytes`])
//! are memory-mapped natively (the `native` feature), so a checkpoint costs no copy in host
//! memory; read whole where there is no memory map; shared, without a copy, when they came
//! from memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file's bytes.
pub enum FileBytes {
    /// Mapped from disk.
    #[cfg(feature = "native")]
    Map(memmap2::Mmap),
    /// Read from disk.
    Owned(Vec<u8>),
    /// Given in memory.
    Shared(Arc<[u8]>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(feature = "native")]
            FileBytes::Map(m) => m,
            FileBytes::Owned(v) => v,
            FileBytes::Shared(s) => s,
        }
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileBytes({} bytes)", self.len())
    }
}

/// The bytes of the file at `path`: mapped natively, read whole elsewhere.
pub fn open(path: &Path) -> std::io::Result<FileBytes> {
    #[cfg(feature = "native")]
    {
        let file = std::fs::File::open(path)?;
        // SAFETY: the map is read-only and lives as long as its owner (a checkpoint, a GGUF
        // file). A file changed on disk while mapped is the user's error; every offset the
        // loaders read from it is checked against its length.
        unsafe { memmap2::Mmap::map(&file) }.map(FileBytes::Map)
    }
    #[cfg(not(feature = "native"))]
    std::fs::read(path).map(FileBytes::Owned)
}

/// A model's files held in memory, by file name (`config.json`, `model.safetensors` or its
/// shards with `model.safetensors.index.json`, or one `*.gguf`; `tokenizer.json`,
/// `tokenizer_config.json`, `generation_config.json`, `chat_template.jinja` as the model
/// has them).
#[derive(Clone, Default)]
pub struct MemoryFiles {
    name: String,
    files: BTreeMap<String, Arc<[u8]>>,
}

impl std::fmt::Debug for MemoryFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: BTreeMap<&str, usize> = self
            .files
            .iter()
            .map(|(n, b)| (n.as_str(), b.len()))
            .collect();
        f.debug_struct("MemoryFiles")
            .field("name", &self.name)
            .field("files", &sizes)
            .finish()
    }
}

impl MemoryFiles {
    /// No files yet; `name` (a URL, a title) stands for the model in messages.
    pub fn new(name: impl Into<String>) -> Self {
        MemoryFiles {
            name: name.into(),
            files: BTreeMap::new(),
        }
    }

    /// These files with `file` holding `bytes` (kept, not copied).
    pub fn with_file(mut self, file: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Self {
        self.files.insert(file.into(), bytes.into());
        self
    }

    /// The model's name, as messages show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files that make the model's weights and config, as the disk tier identifies a
    /// model folder (`config.json`, `*.safetensors`, `*.gguf`), sorted.
    pub fn weight_names(&self) -> impl Iterator<Item = &str> {
        self.files
            .keys()
            .map(String::as_str)
            .filter(|n| *n == "config.json" || n.ends_with(".safetensors") || n.ends_with(".gguf"))
    }

    /// File `name`'s bytes (empty when there is no such file).
    pub fn bytes(&self, name: &str) -> &[u8] {
        self.files.get(name).map_or(&[], |b| b)
    }
}

/// Where a model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A Hugging Face folder, a folder with `config.json` and one GGUF file, or a GGUF file.
    Path(PathBuf),
    /// The same files, in memory.
    Memory(MemoryFiles),
}

impl ModelSource {
    /// How messages name the model: its path, or the name its files were given.
    pub fn display_path(&self) -> PathBuf {
        match self {
            ModelSource::Path(p) => p.clone(),
            ModelSource::Memory(m) => PathBuf::from(&m.name),
        }
    }

    /// The folder of the model: where its config, tokenizer and chat template are (for a
    /// GGUF file on disk, the folder holding it).
    pub fn folder(&self) -> Folder<'_> {
        match self {
            ModelSource::Path(p) if is_gguf_file(p) => {
                Folder::Disk(p.parent().unwrap_or(Path::new(".")))
            }
            ModelSource::Path(p) => Folder::Disk(p),
            ModelSource::Memory(m) => Folder::Memory(m),
        }
    }

    /// The GGUF file the source names itself (a path to one), if it does.
    pub fn gguf_file(&self) -> Option<&Path> {
        match self {
            ModelSource::Path(p) if is_gguf_file(p) => Some(p),
            _ => None,
        }
    }
}

impl From<PathBuf> for ModelSource {
    fn from(p: PathBuf) -> Self {
        ModelSource::Path(p)
    }
}

impl From<&PathBuf> for ModelSource {
    fn from(p: &PathBuf) -> Self {
        ModelSource::Path(p.clone())
    }
}

impl From<&Path> for ModelSource {
    fn from(p: &Path) -> Self {
        ModelSource::Path(p.to_path_buf())
    }
}

impl From<&str> for ModelSource {
    fn from(p: &str) -> Self {
        ModelSource::Path(PathBuf::from(p))
    }
}

impl From<String> for ModelSource {
    fn from(p: String) -> Self {
        ModelSource::Path(PathBuf::from(p))
    }
}

impl From<MemoryFiles> for ModelSource {
    fn from(m: MemoryFiles) -> Self {
        ModelSource::Memory(m)
    }
}

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf_file(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && !path.is_dir()
}

/// A folder of model files, on disk or in memory, as the loaders read it.
#[derive(Clone, Copy, Debug)]
pub enum Folder<'a> {
    Disk(&'a Path),
    Memory(&'a MemoryFiles),
}

impl Folder<'_> {
    /// How messages name file `name` of the folder.
    pub fn path(&self, name: &str) -> PathBuf {
        match self {
            Folder::Disk(d) => d.join(name),
            Folder::Memory(m) => Path::new(&m.name).join(name),
        }
    }

    /// How messages name the folder.
    pub fn display_path(&self) -> PathBuf {
        match self {
            Folder::Disk(d) => d.to_path_buf(),
            Folder::Memory(m) => PathBuf::from(&m.name),
        }
    }

    pub fn exists(&self, name: &str) -> bool {
        match self {
            Folder::Disk(d) => d.join(name).exists(),
            Folder::Memory(m) => m.files.contains_key(name),
        }
    }

    /// File `name`'s bytes (a `NotFound` error when it is missing).
    pub fn open(&self, name: &str) -> std::io::Result<FileBytes> {
        match self {
            Folder::Disk(d) => open(&d.join(name)),
            Folder::Memory(m) => m
                .files
                .get(name)
                .map(|b| FileBytes::Shared(b.clone()))
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, name.to_string())),
        }
    }

    /// File `name` as text.
    pub fn read_to_string(&self, name: &str) -> std::io::Result<String> {
        match self {
            Folder::Disk(d) => std::fs::read_to_string(d.join(name)),
            Folder::Memory(_) => String::from_utf8(self.open(name)?.to_vec())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
    }

    /// The names of the folder's files, sorted.
    pub fn file_names(&self) -> std::io::Result<Vec<String>> {
        match self {
            Folder::Disk(d) => {
                let mut names: Vec<String> = std::fs::read_dir(d)?
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().is_file())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect();
                names.sort();
                Ok(names)
            }
            Folder::Memory(m) => Ok(m.files.keys().cloned().collect()),
        }
    }
}
