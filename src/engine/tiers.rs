//! The engine's side of the prefix cache's lower tiers. The block manager plans copies
//! between the device pool and the host tier (`cache/tier.rs`); this file adds the disk
//! tier under them (`disk_tier`), which outlives the process and may be shared by several:
//!
//! - **down**: every host-tier block that a step's plan filled (a copy down of a block the
//!   device evicted or, with a disk tier, of every block as soon as it is named) is written
//!   to disk once the step's copies have landed in host memory. When the engine runs out of
//!   work, blocks named in its last step are copied down and written at once, so a process
//!   that exits after its last request has saved everything it computed.
//! - **up**: before each step, for the requests next in line for admission, the leading
//!   blocks of their prompts that neither the device nor the host tier holds are looked for
//!   on disk, block by block while they are found; each verified record goes into a
//!   host-tier block, from which admission copies it up like any host-tier hit. The host-
//!   tier blocks of the requests ahead and the blocks read stay within the tier's budget,
//!   so reads never evict blocks a request ahead will use (reading at arrival instead did
//!   exactly that when many requests arrived together: measured in the conversations
//!   bench). A request's block names are hashed once per token count. A record that fails
//!   verification is a miss: the prompt is computed from there on, never read from a bad
//!   record.
//!
//! Disk records are keyed by the block's chained name (`cache::hash_block`) within a
//! namespace that names everything else KV bytes depend on (`namespace`).

use super::output::RequestId;
use super::request::{RequestSide, SeqOutput};
use super::scheduler::Scheduler;
use crate::cache::PrefixCache;
use crate::cache_engine::HostPool;
use crate::config::EngineConfig;
use crate::disk_tier::DiskStats;
use crate::mapped::{MemoryFiles, ModelSource};
use std::collections::HashMap;

/// A waiting request's tokens and the names of its full blocks, for disk lookups.
#[derive(Debug)]
pub(super) struct DiskChain {
    tokens: Vec<u32>,
    /// Per KV cache group, the name its chain starts from (the request's extra keys in it).
    roots: Vec<Option<BlockHash>>,
    /// Per KV cache group, the names of the leading blocks.
    names: Vec<Vec<BlockHash>>,
}
use crate::cache::{hash_block, BlockHash, BlockOps};
use crate::disk_tier::{BlockKey, DiskTier, DiskTierConfig, RecordStore};
use crate::model::ModelConfig;
use crate::pool::{KvLayout, KvRotation};
use std::io::Read;
use std::path::Path;

/// The disk key's form of a block name: the name's 8 bytes, zero-padded.
fn key_of(hash: BlockHash) -> BlockKey {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&hash.0.to_le_bytes());
    BlockKey(k)
}

/// Everything besides the tokens that the KV bytes of a block depend on: the model's
/// files (their content hash), its configuration, the context (LongRoPE picks its factors
/// by it), the weights' format, and the pool's layout, dtype and rotation.
pub(super) fn namespace(
    model_id: &str,
    c: &ModelConfig,
    max_model_len: usize,
    weight_dtype: &str,
    layout: &KvLayout,
    rotation: KvRotation,
) -> String {
    format!(
        "pagellm kv v1\nmodel {model_id}\nconfig {c:?}\nmax_model_len {max_model_len}\n\
         weights {weight_dtype}\nlayout {layout:?}\nrotation {rotation:?}\n"
    )
}

/// A content hash of the model's files (config and weights, or the one GGUF file),
/// remembered in `cache_dir` under the files' paths, sizes and modification times so that
/// a restart hashes nothing again. Hashing reads every byte once (BLAKE3 on all cores).
pub(super) fn model_identity(model: &Path, cache_dir: Option<&Path>) -> std::io::Result<String> {
    let mut files: Vec<std::path::PathBuf> = if model.is_dir() {
        std::fs::read_dir(model)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf")
            })
            .collect()
    } else {
        vec![model.to_path_buf()]
    };
    files.sort();
    let memo = match cache_dir {
        Some(dir) => Some(identity_memo(&files, dir)?),
        None => None,
    };
    if let Some(Ok(mut f)) = memo.as_ref().map(std::fs::File::open) {
        let mut id = String::new();
        if f.read_to_string(&mut id).is_ok() && id.len() == 64 {
            return Ok(id);
        }
    }
    let mut content = blake3::Hasher::new();
    for f in &files {
        content.update(f.file_name().unwrap_or_default().as_encoded_bytes());
        hash_file(&mut content, f)?;
    }
    let id = content.finalize().to_hex().to_string();
    // Best effort: without the memo the next start hashes again.
    if let Some(memo) = memo {
        let memo_dir = memo.parent().unwrap_or(Path::new("."));
        let tmp = memo_dir.join(format!(".{}.tmp", std::process::id()));
        let saved = std::fs::create_dir_all(memo_dir)
            .and_then(|()| std::fs::write(&tmp, &id))
            .and_then(|()| std::fs::rename(&tmp, &memo));
        if let Err(e) = saved {
            tracing::debug!("could not remember the model's identity: {e}");
        }
    }
    Ok(id)
}

/// Where the identity of `files` is remembered under `cache_dir`: named by their paths,
/// sizes and modification times.
fn identity_memo(
    files: &[std::path::PathBuf],
    cache_dir: &Path,
) -> std::io::Result<std::path::PathBuf> {
    let mut stamp = blake3::Hasher::new();
    for f in files {
        let meta = std::fs::metadata(f)?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let path = std::fs::canonicalize(f)?;
        stamp.update(path.to_string_lossy().as_bytes());
        stamp.update(&meta.len().to_le_bytes());
        stamp.update(&mtime.to_le_bytes());
    }
    Ok(cache_dir
        .join("model-ids")
        .join(stamp.finalize().to_hex().as_str()))
}

/// The content hash of a model's files held in memory (their names and bytes), as
/// [`model_identity`] hashes files on disk, so the same model read either way shares records.
fn memory_identity(files: &MemoryFiles) -> String {
    let mut content = blake3::Hasher::new();
    for name in files.weight_names() {
        content.update(name.as_bytes());
        content.update(files.bytes(name));
    }
    content.finalize().to_hex().to_string()
}

/// Adds the file at `path` to `hasher`: mapped and hashed on every core natively, read
/// whole elsewhere.
fn hash_file(hasher: &mut blake3::Hasher, path: &Path) -> std::io::Result<()> {
    #[cfg(feature = "native")]
    hasher.update_mmap_rayon(path)?;
    #[cfg(not(feature = "native"))]
    hasher.update(&std::fs::read(path)?);
    Ok(())
}

/// Opens the disk tier for this engine's namespace: in `dir`, or in `store` when given.
pub(super) fn open_disk_tier(
    dir: &Path,
    store: Option<RecordStore>,
    max_bytes: u64,
    namespace: &str,
    block_bytes: usize,
) -> std::io::Result<DiskTier> {
    let config = DiskTierConfig {
        dir: dir.to_path_buf(),
        store,
        max_bytes,
    };
    DiskTier::open(config, namespace.as_bytes(), block_bytes)
}

/// The disk tier as the engine uses it: the tier itself, a block's worth of bytes to read
/// records into, and the block names of the waiting requests next in line.
pub(super) struct Disk {
    tier: DiskTier,
    scratch: Vec<u8>,
    chains: HashMap<RequestId, DiskChain>,
}

impl Disk {
    /// The disk tier in `dir` (or in `config.kv_cache_store`, `dir` then being the records'
    /// name prefix) for this model, context, weight format and pool layout.
    pub(super) fn open(
        model: &ModelSource,
        dir: &Path,
        c: &ModelConfig,
        max_model_len: usize,
        config: &EngineConfig,
        pool: (&KvLayout, KvRotation),
    ) -> std::result::Result<Self, String> {
        let failed = |e: std::io::Error| {
            format!("the KV cache folder {} cannot be used: {e}", dir.display())
        };
        let id = match model {
            // The memo of file identities lives in the folder, when the records do.
            ModelSource::Path(path) => {
                let memo = config.kv_cache_store.is_none().then_some(dir);
                model_identity(path, memo).map_err(failed)?
            }
            ModelSource::Memory(files) => memory_identity(files),
        };
        let weights = config
            .weight_dtype
            .map_or("as stored".to_string(), |w| format!("{w:?}"));
        let (layout, rotation) = pool;
        let ns = namespace(&id, c, max_model_len, &weights, layout, rotation);
        let bytes = layout.block_bytes_all_layers() as usize;
        let store = config.kv_cache_store.clone();
        let tier =
            open_disk_tier(dir, store, config.kv_cache_disk_bytes, &ns, bytes).map_err(failed)?;
        Ok(Disk {
            tier,
            scratch: Vec::new(),
            chains: HashMap::new(),
        })
    }

    pub(super) fn stats(&self) -> DiskStats {
        self.tier.stats()
    }

    /// Reads from the disk tier the missing leading blocks of the waiting requests next in
    /// line, oldest first, while the blocks they have in the host tier and those read stay
    /// within the tier's budget (so reads never evict blocks a request ahead will use).
    pub(super) fn load_waiting(
        &mut self,
        scheduler: &mut Scheduler<SeqOutput, RequestSide>,
        host: &mut HostPool,
    ) {
        if scheduler.num_waiting() == 0 {
            self.chains.clear();
            return;
        }
        let mut left = scheduler.prefix_cache().tier_budget();
        // Admission takes requests in order; a handful ahead is all one step admits.
        let ahead: Vec<RequestId> = scheduler.waiting().take(16).map(|g| g.request_id).collect();
        self.chains.retain(|id, _| ahead.contains(id));
        for id in ahead {
            if !self.refresh_chain(scheduler, id) {
                continue;
            }
            let used = self.load_chain(&mut scheduler.prefix_cache(), host, id, left);
            left = left.saturating_sub(used);
            if left == 0 {
                break;
            }
        }
    }

    /// Makes `chains[id]` the block names of waiting request `id`'s tokens, hashing them
    /// only when they changed (a recomputed request comes back with more). False if the
    /// request has no live sequence.
    fn refresh_chain(
        &mut self,
        scheduler: &Scheduler<SeqOutput, RequestSide>,
        id: RequestId,
    ) -> bool {
        let Some(g) = scheduler.waiting().find(|g| g.request_id == id) else {
            return false;
        };
        let Some(s) = g.live().next() else {
            return false;
        };
        if self
            .chains
            .get(&id)
            .is_some_and(|c| c.tokens.len() == s.tokens.len())
        {
            return true;
        }
        let bs = scheduler.blocks().block_size();
        // As the prefix lookup: the last token is always computed again.
        let lookups = s.tokens.len().saturating_sub(1) / bs;
        let groups = scheduler.kv_groups();
        let roots: Vec<Option<BlockHash>> =
            (0..groups.len()).map(|k| groups.root(k, g.keys)).collect();
        let names = roots
            .iter()
            .map(|&root| {
                let mut names = Vec::with_capacity(lookups);
                let mut parent = root;
                for tokens in s.tokens.chunks_exact(bs).take(lookups) {
                    let hash = hash_block(parent, tokens);
                    names.push(hash);
                    parent = Some(hash);
                }
                names
            })
            .collect();
        let chain = DiskChain {
            tokens: s.tokens.clone(),
            roots,
            names,
        };
        self.chains.insert(id, chain);
        true
    }

    /// Walks request `id`'s chain, block by block and at each block KV cache group by
    /// group: blocks on the device cost nothing, blocks in the host tier count against
    /// `most`, and missing ones are read from disk into the host tier while they are found
    /// and `most` allows. Returns how much of `most` it used.
    fn load_chain(
        &mut self,
        blocks: &mut PrefixCache,
        host: &mut HostPool,
        id: RequestId,
        most: usize,
    ) -> usize {
        let Some(chain) = self.chains.get(&id) else {
            return 0;
        };
        let disk = &mut self.tier;
        let bs = blocks.block_size();
        let (mut used, mut read) = (0, 0);
        let depth = chain.names.first().map_or(0, Vec::len);
        let steps = (0..depth).flat_map(|i| (0..chain.names.len()).map(move |g| (i, g)));
        for (i, g) in steps {
            let names = &chain.names[g];
            let hash = names[i];
            let parent = match i {
                0 => chain.roots[g],
                _ => Some(names[i - 1]),
            };
            let tokens = &chain.tokens[i * bs..(i + 1) * bs];
            if blocks.has_device_name(hash) {
                continue;
            }
            if used >= most {
                break;
            }
            if blocks.has_cached_name(hash) {
                // In the host tier: keep it there until this request is admitted.
                blocks.touch_host_tier(hash);
            } else {
                let key = disk.key(parent.map(key_of), tokens);
                if !disk.contains(key) {
                    break;
                }
                let scratch = &mut self.scratch;
                scratch.resize(host.layout.block_bytes_all_layers() as usize, 0);
                if !disk.load(key, parent.map(key_of), tokens, scratch) {
                    break;
                }
                let Some(h) = blocks.insert_host_tier(hash, parent, tokens) else {
                    break;
                };
                match host.block_mut(h.0 as usize) {
                    Some(dst) => dst.copy_from_slice(scratch),
                    None => break,
                }
                read += 1;
            }
            used += 1;
        }
        if read > 0 {
            tracing::debug!(blocks = read, "prompt blocks read from the disk tier");
        }
        used
    }

    /// Writes the host-tier blocks that `ops` filled to the disk tier (after the step's
    /// copies have landed in host memory).
    pub(super) fn store(&mut self, blocks: &PrefixCache, host: &HostPool, ops: &BlockOps) {
        let disk = &mut self.tier;
        for &(_, h) in &ops.swap_out {
            // Swap-outs of preempted sequences have no name; copies down do.
            let Some(name) = blocks.host_tier_name(h) else {
                continue;
            };
            let key = disk.key(name.parent.map(key_of), name.tokens);
            if let Some(bytes) = host.block(h.0 as usize) {
                disk.store(key, name.parent.map(key_of), name.tokens, bytes);
            }
        }
    }

    /// Deletes the records of `chain` (`(name, parent)` per block, one chain per KV cache
    /// group, back to back, each over the full blocks of `prefix`); returns how many went.
    pub(super) fn forget(
        &mut self,
        chain: &[(BlockHash, Option<BlockHash>)],
        prefix: &[u32],
        block_size: usize,
    ) -> usize {
        let disk = &mut self.tier;
        chain
            .iter()
            .zip(prefix.chunks_exact(block_size).cycle())
            .filter(|((_, parent), tokens)| disk.remove(disk.key(parent.map(key_of), tokens)))
            .count()
    }
}
