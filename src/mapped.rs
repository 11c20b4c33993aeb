//! A file's bytes for the model loaders: memory-mapped natively (the `native` feature), so a
//! checkpoint costs no copy in host memory; read whole where there is no memory map.

use std::path::Path;

/// The bytes of a file opened by [`open`].
#[cfg(feature = "native")]
pub type Mapped = memmap2::Mmap;
/// The bytes of a file opened by [`open`].
#[cfg(not(feature = "native"))]
pub type Mapped = Vec<u8>;

/// The bytes of the file at `path`.
#[cfg(feature = "native")]
pub fn open(path: &Path) -> std::io::Result<Mapped> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the map is read-only and lives as long as its owner (a checkpoint, a GGUF
    // file). A file changed on disk while mapped is the user's error; every offset the
    // loaders read from it is checked against its length.
    unsafe { memmap2::Mmap::map(&file) }
}

/// The bytes of the file at `path`.
#[cfg(not(feature = "native"))]
pub fn open(path: &Path) -> std::io::Result<Mapped> {
    std::fs::read(path)
}
