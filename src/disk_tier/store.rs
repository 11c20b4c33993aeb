//! Where the disk tier's records live: files in a folder (natively), or a [`RecordStore`]
//! in memory, which a host without files mirrors into storage of its own (the browser
//! build keeps it in the Origin Private File System). Both hold the same records under the
//! same relative names (`<namespace>/<2 hex>/<key hex>.kvb`), so a record's bytes and
//! checksums do not depend on where it is kept.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Error, ErrorKind};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// The disk tier's records held in memory, shared between the engine and its host: the host
/// fills it with the records it kept (before the engine opens), and after steps takes the
/// records written and deleted since ([`Self::take_changes`]) to keep them. Cloning shares
/// the store.
#[derive(Clone, Default)]
pub struct RecordStore(Arc<Mutex<Records>>);

#[derive(Default)]
struct Records {
    files: BTreeMap<String, Arc<[u8]>>,
    /// Names written or deleted since the last `take_changes`.
    changed: BTreeSet<String>,
}

impl RecordStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock left whole records (every change is one insert or
        // remove), so a poisoned lock is still good to use.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a record the host kept (not a change to hand back).
    pub fn insert(&self, name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) {
        self.lock().files.insert(name.into(), bytes.into());
    }

    /// The records written (with their bytes) and deleted (`None`) since the last call, by
    /// name; a record written and then deleted in between is only deleted.
    pub fn take_changes(&self) -> Vec<(String, Option<Arc<[u8]>>)> {
        let mut r = self.lock();
        let changed = std::mem::take(&mut r.changed);
        changed
            .into_iter()
            .map(|name| {
                let bytes = r.files.get(&name).cloned();
                (name, bytes)
            })
            .collect()
    }

    /// Forgets, in memory only (no change to hand back), every record whose name does not
    /// start with `prefix`: the host's storage may hold other models' records, which this
    /// engine never reads.
    fn keep_only(&self, prefix: &str) {
        self.lock().files.retain(|name, _| name.starts_with(prefix));
    }

    /// How many records the store holds, and their bytes.
    pub fn size(&self) -> (usize, u64) {
        let r = self.lock();
        let bytes = r.files.values().map(|b| b.len() as u64).sum();
        (r.files.len(), bytes)
    }
}

impl PartialEq for RecordStore {
    /// The same store (shared), not equal contents.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for RecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, bytes) = self.size();
        write!(f, "RecordStore({n} records, {bytes} bytes)")
    }
}

/// The tier's storage: a folder, or a record store (names are then `path`s relative to it).
#[derive(Clone)]
pub(super) enum Storage {
    Dir,
    Memory(RecordStore),
}

fn name(path: &Path) -> String {
    path.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn not_found() -> Error {
    Error::from(ErrorKind::NotFound)
}

impl Storage {
    /// The record's length, if there is a record.
    pub fn len(&self, path: &Path) -> Option<u64> {
        match self {
            Storage::Dir => std::fs::metadata(path)
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len()),
            Storage::Memory(s) => s.lock().files.get(&name(path)).map(|b| b.len() as u64),
        }
    }

    pub fn read(&self, path: &Path) -> std::io::Result<Arc<[u8]>> {
        match self {
            Storage::Dir => std::fs::read(path).map(Arc::from),
            Storage::Memory(s) => s
                .lock()
                .files
                .get(&name(path))
                .cloned()
                .ok_or_else(not_found),
        }
    }

    /// Writes the whole record or nothing: natively to a temporary file (named by the
    /// process and `unique`) renamed into place, so that readers never see part of one.
    pub fn write(&self, path: &Path, unique: u64, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Storage::Dir => {
                let file = path.file_name().unwrap_or_default().to_string_lossy();
                let temp =
                    path.with_file_name(format!(".{file}.{}.{unique}.tmp", std::process::id()));
                let written = path
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(&temp, bytes))
                    .and_then(|()| std::fs::rename(&temp, path));
                if written.is_err() {
                    let _ = std::fs::remove_file(&temp);
                }
                written
            }
            Storage::Memory(s) => {
                let mut r = s.lock();
                let n = name(path);
                r.files.insert(n.clone(), Arc::from(bytes));
                r.changed.insert(n);
                Ok(())
            }
        }
    }

    pub fn remove(&self, path: &Path) -> std::io::Result<()> {
        match self {
            Storage::Dir => std::fs::remove_file(path),
            Storage::Memory(s) => {
                let mut r = s.lock();
                let n = name(path);
                r.files.remove(&n).ok_or_else(not_found)?;
                r.changed.insert(n);
                Ok(())
            }
        }
    }

    /// Marks the record as just used, for other processes' eviction order (files only:
    /// the record store's host keeps no order).
    pub fn touch(&self, path: &Path) {
        if let Storage::Dir = self {
            if let Ok(f) = std::fs::File::options().append(true).open(path) {
                let _ = f.set_modified(std::time::SystemTime::now());
            }
        }
    }

    /// The records under `dir` (`<2 hex>/<name>` files), oldest first where the storage
    /// knows their age, as (file name, length); temporary files of writers that died long
    /// ago are removed on the way.
    pub fn scan(
        &self,
        dir: &Path,
        stale: std::time::Duration,
    ) -> std::io::Result<Vec<(String, u64)>> {
        match self {
            Storage::Dir => scan_dir(dir, stale),
            Storage::Memory(s) => {
                let prefix = format!("{}/", name(dir));
                let r = s.lock();
                Ok(r.files
                    .range(prefix.clone()..)
                    .take_while(|(n, _)| n.starts_with(&prefix))
                    .filter_map(|(n, b)| {
                        let file = n.rsplit('/').next()?.to_string();
                        Some((file, b.len() as u64))
                    })
                    .collect())
            }
        }
    }

    /// Creates the namespace's folder (files); a store forgets the records outside it, so
    /// that memory holds only records this engine may read.
    pub fn create_dir(&self, dir: &Path) -> std::io::Result<()> {
        match self {
            Storage::Dir => std::fs::create_dir_all(dir),
            Storage::Memory(s) => {
                s.keep_only(&format!("{}/", name(dir)));
                Ok(())
            }
        }
    }
}

fn scan_dir(dir: &Path, stale: std::time::Duration) -> std::io::Result<Vec<(String, u64)>> {
    use std::time::SystemTime;
    let mut found = Vec::new();
    for sub in std::fs::read_dir(dir)? {
        let sub = sub?.path();
        if !sub.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&sub)? {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.ends_with(".tmp") {
                let age = SystemTime::now()
                    .duration_since(modified)
                    .unwrap_or_default();
                if age > stale {
                    let _ = std::fs::remove_file(&path);
                }
            } else {
                found.push((modified, name.to_string(), meta.len()));
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, n, len)| (n, len)).collect())
}
