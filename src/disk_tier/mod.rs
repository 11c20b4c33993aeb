//! The disk tier of the prefix cache: computed KV blocks kept as files, one per block, so
//! that a later process (after a restart, or another replica of the same model on the same
//! machine) reads a long shared prefix instead of recomputing it. The idea is LMCache's
//! local-disk backend and llama.cpp's slot files, keyed here by the prefix cache's hash
//! chain so that any prompt that starts the same way finds them.
//!
//! A record lives at `<dir>/<namespace>/<2 hex>/<key hex>.kvb`; the namespace folder is named
//! after a hash of everything besides the tokens that the KV bytes depend on, so models and
//! cache layouts never meet. Writes go to a temporary file that is renamed into place, so a
//! reader sees a whole record or none; every read checks the whole record (`record.rs`), so
//! a torn or damaged file is a miss and is deleted. Errors never reach the caller: a full
//! disk or a vanished folder is a warning and a miss, since the tier only saves time.
//!
//! Each process keeps its own index of the records it knows (scanned at open, grown by its
//! writes and reads) and deletes the least recently used ones past its byte budget; records
//! other processes wrote since are picked up by reads, not counted against the budget until
//! the next open.

mod record;
mod store;
#[cfg(test)]
mod tests;

use record::{Expect, RecordError};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;
pub use store::RecordStore;
use store::Storage;

/// A record's name: stable across processes, builds and Rust versions (BLAKE3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub [u8; 32]);

impl BlockKey {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut k = [0u8; 32];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(BlockKey(k))
    }
}

#[derive(Clone, Debug)]
pub struct DiskTierConfig {
    /// The folder (with `store`: the records' common name prefix, usually empty).
    pub dir: PathBuf,
    /// Keep the records in this store instead of files (a host without files persists it).
    pub store: Option<RecordStore>,
    /// Most bytes of records this process keeps in its namespace's folder; the least
    /// recently stored or loaded go first past it. 0 writes nothing.
    pub max_bytes: u64,
}

/// What the disk tier holds and has done in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Loads that returned a valid record.
    pub hits: u64,
    /// Loads that found no record.
    pub misses: u64,
    /// Loads whose record failed verification (a miss for the caller; the file is deleted).
    pub corrupt: u64,
    /// Records this process wrote.
    pub writes: u64,
    /// Stores skipped because the record existed.
    pub skipped: u64,
    /// Stores that failed (a full disk, permissions): warned about, never an error.
    pub write_errors: u64,
    /// Records this process deleted to stay within its budget.
    pub evictions: u64,
    /// Bytes of the records this process knows of now.
    pub bytes: u64,
    /// How many records those are.
    pub records: u64,
}

/// Temporary files older than this were left by a writer that died.
const STALE_TEMP: Duration = Duration::from_secs(600);

pub struct DiskTier {
    dir: PathBuf,
    storage: Storage,
    namespace: [u8; 32],
    block_bytes: usize,
    max_bytes: u64,
    /// Known records: key -> (use stamp, bytes); and stamps in use order.
    index: HashMap<BlockKey, (u64, u64)>,
    lru: BTreeMap<u64, BlockKey>,
    /// Bytes of the indexed records, kept as they change (stores are frequent).
    bytes: u64,
    clock: u64,
    temp_counter: u64,
    stats: DiskStats,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.dir)
            .field("stats", &self.stats)
            .finish()
    }
}

impl DiskTier {
    /// Opens (creating it if needed) the folder of `namespace` under `config.dir`, indexes
    /// the records already there by modification time, and removes temporary files that
    /// crashed writers left. `namespace` names everything besides the tokens that KV bytes
    /// depend on; `block_bytes` is every record's payload size.
    pub fn open(
        config: DiskTierConfig,
        namespace: &[u8],
        block_bytes: usize,
    ) -> std::io::Result<Self> {
        let namespace = *blake3::hash(namespace).as_bytes();
        let hex: String = namespace[..8].iter().map(|b| format!("{b:02x}")).collect();
        let dir = config.dir.join(hex);
        let storage = config.store.map_or(Storage::Dir, Storage::Memory);
        storage.create_dir(&dir)?;
        let found = storage.scan(&dir, STALE_TEMP)?;
        let mut tier = DiskTier {
            dir,
            storage,
            namespace,
            block_bytes,
            max_bytes: config.max_bytes,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            bytes: 0,
            clock: 0,
            temp_counter: 0,
            stats: DiskStats::default(),
        };
        let records = found.into_iter().filter_map(|(name, len)| {
            let key = name.strip_suffix(".kvb").and_then(BlockKey::from_hex)?;
            Some((key, len))
        });
        for (key, bytes) in records {
            tier.touch(key, bytes);
        }
        Ok(tier)
    }

    /// The key of a block holding `tokens` after the block keyed `parent`.
    pub fn key(&self, parent: Option<BlockKey>, tokens: &[u32]) -> BlockKey {
        let mut h = blake3::Hasher::new();
        h.update(&self.namespace);
        match parent {
            Some(p) => h.update(&[1]).update(&p.0),
            None => h.update(&[0]).update(&[0; 32]),
        };
        h.update(&(tokens.len() as u32).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockKey(*h.finalize().as_bytes())
    }

    /// Whether a record for `key` exists now (perhaps written by another process); not
    /// verified.
    pub fn contains(&self, key: BlockKey) -> bool {
        self.storage.len(&self.path(key)).is_some()
    }

    /// Writes the record unless it exists with the right length; see the module docs.
    /// Returns whether it wrote.
    pub fn store(
        &mut self,
        key: BlockKey,
        parent: Option<BlockKey>,
        tokens: &[u32],
        payload: &[u8],
    ) -> bool {
        if self.max_bytes == 0 {
            return false;
        }
        if payload.len() != self.block_bytes {
            self.write_failed(&format!(
                "a block of {} bytes where {} were expected",
                payload.len(),
                self.block_bytes
            ));
            return false;
        }
        let path = self.path(key);
        let bytes = record::encode(&self.expect(key, parent, tokens), payload);
        // A record of the right length is taken to be whole (every read checks it); one cut
        // short by a torn copy is written again.
        if self.storage.len(&path) == Some(bytes.len() as u64) {
            self.stats.skipped += 1;
            return false;
        }
        self.temp_counter += 1;
        if let Err(e) = self.storage.write(&path, self.temp_counter, &bytes) {
            self.write_failed(&format!("{}: {e}", path.display()));
            return false;
        }
        self.stats.writes += 1;
        self.touch(key, bytes.len() as u64);
        self.evict_over_budget(key);
        true
    }

    /// Reads and verifies the record for `key` into `out`, which is written only if the
    /// record is whole and names exactly this block; see the module docs.
    pub fn load(
        &mut self,
        key: BlockKey,
        parent: Option<BlockKey>,
        tokens: &[u32],
        out: &mut [u8],
    ) -> bool {
        let path = self.path(key);
        // A file of the wrong length is not read at all (a stray huge file costs nothing).
        let expected = record::encoded_len(tokens.len(), out.len()) as u64;
        match self.storage.len(&path) {
            Some(len) if len != expected => {
                return self.corrupt(key, &path, "the file has the wrong length")
            }
            _ => {}
        }
        let bytes = match self.storage.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.stats.misses += 1;
                self.forget(key);
                return false;
            }
            Err(e) => return self.corrupt(key, &path, &e.to_string()),
        };
        let expect = Expect {
            payload_len: out.len(),
            ..self.expect(key, parent, tokens)
        };
        let checked: Result<&[u8], RecordError> = if out.len() == self.block_bytes {
            record::decode_verified(&bytes, &expect)
        } else {
            Err(RecordError::PayloadLength)
        };
        match checked {
            Ok(payload) => out.copy_from_slice(payload),
            Err(e) => return self.corrupt(key, &path, &e.to_string()),
        }
        self.stats.hits += 1;
        self.touch(key, bytes.len() as u64);
        // Other processes order their evictions by modification time.
        self.storage.touch(&path);
        true
    }

    /// Deletes the record for `key` if there is one (a conversation the user dropped).
    /// Returns whether a file was removed.
    pub fn remove(&mut self, key: BlockKey) -> bool {
        self.forget(key);
        self.storage.remove(&self.path(key)).is_ok()
    }

    pub fn stats(&self) -> DiskStats {
        DiskStats {
            bytes: self.bytes,
            records: self.index.len() as u64,
            ..self.stats
        }
    }

    /// The namespace's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: BlockKey) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.kvb"))
    }

    fn expect<'a>(
        &'a self,
        key: BlockKey,
        parent: Option<BlockKey>,
        tokens: &'a [u32],
    ) -> Expect<'a> {
        Expect {
            namespace: &self.namespace,
            key,
            parent,
            tokens,
            payload_len: self.block_bytes,
        }
    }

    /// `key` becomes the most recently used record, of `bytes` bytes.
    fn touch(&mut self, key: BlockKey, bytes: u64) {
        self.forget(key);
        self.bytes += bytes;
        self.clock += 1;
        self.index.insert(key, (self.clock, bytes));
        self.lru.insert(self.clock, key);
    }

    fn forget(&mut self, key: BlockKey) {
        if let Some((stamp, bytes)) = self.index.remove(&key) {
            self.lru.remove(&stamp);
            self.bytes -= bytes;
        }
    }

    /// Deletes least recently used records (never `keep`) until within the budget.
    fn evict_over_budget(&mut self, keep: BlockKey) {
        while self.bytes > self.max_bytes {
            // `keep` was just touched, so it is the newest: the oldest is another record
            // unless it is the only one.
            let Some((_, &key)) = self.lru.iter().next().filter(|&(_, &k)| k != keep) else {
                break;
            };
            self.forget(key);
            match self.storage.remove(&self.path(key)) {
                Ok(()) => self.stats.evictions += 1,
                // Another process deleted it first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::debug!("could not delete a KV record: {e}"),
            }
        }
    }

    fn corrupt(&mut self, key: BlockKey, path: &Path, why: &str) -> bool {
        self.stats.corrupt += 1;
        tracing::debug!("disk KV record {} ignored: {why}", path.display());
        let _ = self.storage.remove(path);
        self.forget(key);
        false
    }

    fn write_failed(&mut self, why: &str) {
        if self.stats.write_errors.is_multiple_of(100) {
            tracing::warn!(
                "the disk tier of the KV cache could not write a block ({why}); the block \
                 stays uncached on disk ({} such failures so far)",
                self.stats.write_errors + 1
            );
        }
        self.stats.write_errors += 1;
    }
}
