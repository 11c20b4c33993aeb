//! Automatic prefix caching: full, computed KV blocks are named by their content, so that a
//! prompt starting like an earlier one reuses the earlier blocks instead of recomputing them.
//!
//! A block's name is a hash chained over (the previous block's name, this block's token
//! ids). Equal names therefore mean equal prefixes up to and including the block, which is
//! what equal KV requires (a token's K and V depend on every token before it). This is the
//! hash-based block identity that vLLM's automatic prefix caching layers on PagedAttention's
//! block sharing (Kwon et al., SOSP 2023). A lookup also compares the stored parent name and
//! tokens, so a 64-bit collision can only mislead through a colliding parent chain.
//!
//! A named block that no sequence references any more keeps its content and waits in an LRU
//! evictor: either it is found again (a hit, and it leaves the evictor) or, once the free
//! list is empty, it is reclaimed for new data, least recently released first.

use super::ids::BlockId;
use std::collections::{BTreeMap, HashMap};

/// The content name of a full block: a hash chained over all tokens up to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockHash(pub u64);

/// Name of a block holding `tokens` after the block named `parent` (`None` for the first):
/// the first 8 bytes of BLAKE3 over (a parent flag, the parent's name, the token ids, all
/// little-endian). A specified hash rather than std's `DefaultHasher`, whose algorithm may
/// change between Rust releases: names outlive the process in the disk tier.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut h = blake3::Hasher::new();
    match parent {
        Some(p) => h.update(&[1]).update(&p.0.to_le_bytes()),
        None => h.update(&[0; 9]),
    };
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    BlockHash(u64::from_le_bytes(first))
}

/// What besides its tokens names a request's blocks, digested into one name that the
/// request's chains start from (vLLM v1's `extra_keys`): today a cache salt, later adapters
/// and image inputs. Requests whose keys differ never share a block name, so they never hit
/// each other's cached blocks on the device, in host memory or on disk, and a client that
/// does not know another's salt cannot time whether that client's prompt is cached.
/// [`ExtraKeys::NONE`] names blocks by their tokens alone, as before keys existed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExtraKeys(Option<BlockHash>);

impl ExtraKeys {
    /// No extra keys: blocks are named by their tokens alone.
    pub const NONE: ExtraKeys = ExtraKeys(None);

    /// The keys of a request with cache salt `salt`: BLAKE3 in key-derivation mode, so no
    /// salt's digest is a block name computed from tokens by design.
    pub fn with_salt(salt: &str) -> Self {
        let digest = blake3::derive_key("pagellm 2026 prefix cache salt", salt.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        ExtraKeys(Some(BlockHash(u64::from_le_bytes(first))))
    }

    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// The digest chains of these keys start from (`None` without keys).
    pub fn digest(&self) -> Option<BlockHash> {
        self.0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamedBlock {
    pub hash: BlockHash,
    pub parent: Option<BlockHash>,
    pub tokens: Box<[u32]>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrefixCache<Id> {
    by_hash: HashMap<BlockHash, Id>,
    /// Per block of the pool, its name if it has one.
    named: Vec<Option<NamedBlock>>,
    /// The evictor: unreferenced named blocks by release time, oldest first.
    lru: BTreeMap<u64, Id>,
    released_at: Vec<Option<u64>>,
    clock: u64,
}

impl<Id: BlockId> PrefixCache<Id> {
    pub fn new(num_blocks: usize) -> Self {
        PrefixCache {
            by_hash: HashMap::new(),
            named: vec![None; num_blocks],
            lru: BTreeMap::new(),
            released_at: vec![None; num_blocks],
            clock: 0,
        }
    }

    /// The cached block holding `tokens` after the block named `parent`, with its name.
    pub fn lookup(&self, parent: Option<BlockHash>, tokens: &[u32]) -> Option<(Id, BlockHash)> {
        let hash = hash_block(parent, tokens);
        let block = *self.by_hash.get(&hash)?;
        let entry = self.named[block.index()].as_ref()?;
        (entry.parent == parent && *entry.tokens == *tokens).then_some((block, hash))
    }

    /// Names `block`. The first block computed with some content keeps the name: a later
    /// block with the same content (computed before the first was cached) stays unnamed and
    /// goes back to the free list when released. Returns whether the name was taken.
    pub fn register(
        &mut self,
        block: Id,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        if self.by_hash.contains_key(&hash) || self.named[block.index()].is_some() {
            return false;
        }
        self.by_hash.insert(hash, block);
        self.named[block.index()] = Some(NamedBlock {
            hash,
            parent,
            tokens: tokens.into(),
        });
        true
    }

    pub fn name(&self, block: Id) -> Option<&NamedBlock> {
        self.named[block.index()].as_ref()
    }

    pub fn is_named(&self, block: Id) -> bool {
        self.named[block.index()].is_some()
    }

    pub fn is_evictable(&self, block: Id) -> bool {
        self.released_at[block.index()].is_some()
    }

    pub fn num_evictable(&self) -> usize {
        self.lru.len()
    }

    /// A named block lost its last reference: it becomes the most recently released.
    pub fn make_evictable(&mut self, block: Id) {
        debug_assert!(self.is_named(block) && !self.is_evictable(block));
        self.lru.insert(self.clock, block);
        self.released_at[block.index()] = Some(self.clock);
        self.clock += 1;
    }

    /// A hit on an evictable block takes it back out of the evictor.
    pub fn reclaim(&mut self, block: Id) {
        if let Some(t) = self.released_at[block.index()].take() {
            self.lru.remove(&t);
        }
    }

    /// Named blocks, evictable or in use.
    pub fn num_named(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether some block carries the name `hash`.
    pub fn has_name(&self, hash: BlockHash) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// Makes the evictable block named `hash`, if any, the most recently released: it is
    /// about to be used.
    pub fn touch(&mut self, hash: BlockHash) {
        let Some(&block) = self.by_hash.get(&hash) else {
            return;
        };
        if self.is_evictable(block) {
            self.reclaim(block);
            self.make_evictable(block);
        }
    }

    /// Reclaims the least recently released block for new data, forgetting its name, which
    /// comes back with it (a lower tier may keep the content under that name).
    pub fn evict_lru(&mut self) -> Option<(Id, NamedBlock)> {
        let (_, block) = self.lru.pop_first()?;
        self.released_at[block.index()] = None;
        let entry = self.named[block.index()].take()?;
        self.by_hash.remove(&entry.hash);
        Some((block, entry))
    }

    /// Forgets the name `hash`; returns its block and whether it was evictable (and so
    /// holds nothing worth keeping now).
    pub fn forget(&mut self, hash: BlockHash) -> Option<(Id, bool)> {
        let block = self.by_hash.remove(&hash)?;
        self.named[block.index()] = None;
        let evictable = match self.released_at[block.index()].take() {
            Some(t) => self.lru.remove(&t).is_some(),
            None => false,
        };
        Some((block, evictable))
    }

    /// Grows or shrinks the per-block records to `num_blocks` (blocks cut off have no
    /// name: the caller forgot them first).
    pub fn resize(&mut self, num_blocks: usize) {
        debug_assert!(self.named.iter().skip(num_blocks).all(Option::is_none));
        self.named.resize(num_blocks, None);
        self.released_at.resize(num_blocks, None);
    }

    /// The name of `block`, if it has one.
    pub fn name_of(&self, block: Id) -> Option<BlockHash> {
        self.named.get(block.index())?.as_ref().map(|n| n.hash)
    }

    /// Forgets every name; returns the blocks that were evictable (unreferenced), which
    /// hold nothing worth keeping now.
    pub fn clear(&mut self) -> Vec<Id> {
        let evictable = std::mem::take(&mut self.lru).into_values().collect();
        self.by_hash.clear();
        self.named.iter_mut().for_each(|n| *n = None);
        self.released_at.iter_mut().for_each(|r| *r = None);
        evictable
    }

    /// Internal consistency: names and the hash index agree, names are correct hashes of
    /// full blocks, and the evictor holds exactly the blocks stamped with a release time.
    pub fn check(&self, block_size: usize) -> Result<(), String> {
        let mut named = 0;
        for (i, entry) in self.named.iter().enumerate() {
            let Some(entry) = entry else { continue };
            named += 1;
            let block = Id::from_index(i as u32);
            if self.by_hash.get(&entry.hash) != Some(&block) {
                return Err(format!("prefix cache: {block} is named but not indexed"));
            }
            if entry.tokens.len() != block_size {
                return Err(format!("prefix cache: {block} is named but not full"));
            }
            if hash_block(entry.parent, &entry.tokens) != entry.hash {
                return Err(format!(
                    "prefix cache: {block}'s name is not its content hash"
                ));
            }
        }
        if named != self.by_hash.len() {
            return Err("prefix cache: hash index names blocks that have no name".into());
        }
        let stamped = self.released_at.iter().flatten().count();
        if stamped != self.lru.len() {
            return Err("prefix cache: evictor and release stamps disagree".into());
        }
        for (&t, &block) in &self.lru {
            if self.released_at[block.index()] != Some(t) {
                return Err(format!(
                    "prefix cache: {block} evictable under a stale stamp"
                ));
            }
            if !self.is_named(block) {
                return Err(format!("prefix cache: {block} is evictable but unnamed"));
            }
            if t >= self.clock {
                return Err(format!("prefix cache: {block} released in the future"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ids::DeviceBlockId;

    #[test]
    fn names_chain_over_the_whole_prefix() {
        let a = hash_block(None, &[1, 2]);
        let b = hash_block(Some(a), &[3, 4]);
        assert_eq!(b, hash_block(Some(hash_block(None, &[1, 2])), &[3, 4]));
        assert_ne!(b, hash_block(Some(hash_block(None, &[9, 2])), &[3, 4]));
        assert_ne!(b, hash_block(None, &[3, 4]));
    }

    #[test]
    fn lookup_register_and_lru_eviction() {
        let mut c = PrefixCache::<DeviceBlockId>::new(4);
        let h0 = hash_block(None, &[1, 2]);
        let h1 = hash_block(Some(h0), &[3, 4]);
        assert!(c.register(DeviceBlockId(2), h0, None, &[1, 2]));
        assert!(c.register(DeviceBlockId(3), h1, Some(h0), &[3, 4]));
        // Same content elsewhere keeps the first name.
        assert!(!c.register(DeviceBlockId(1), h0, None, &[1, 2]));
        assert_eq!(c.lookup(None, &[1, 2]), Some((DeviceBlockId(2), h0)));
        assert_eq!(c.lookup(Some(h0), &[3, 4]), Some((DeviceBlockId(3), h1)));
        assert_eq!(c.lookup(None, &[3, 4]), None);

        c.make_evictable(DeviceBlockId(3));
        c.make_evictable(DeviceBlockId(2));
        c.reclaim(DeviceBlockId(3));
        c.make_evictable(DeviceBlockId(3));
        c.check(2).unwrap();
        assert_eq!(
            c.evict_lru().map(|e| (e.0, e.1.hash)),
            Some((DeviceBlockId(2), h0))
        );
        assert_eq!(c.lookup(None, &[1, 2]), None);
        assert_eq!(c.evict_lru().map(|e| e.0), Some(DeviceBlockId(3)));
        assert_eq!(c.evict_lru(), None);
        c.check(2).unwrap();
    }
}
