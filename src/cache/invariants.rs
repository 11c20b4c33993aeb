//! The block manager's invariants, checked in one place so that tests can call it after
//! every operation: free and used blocks partition the pool, a block is free iff its count
//! is 0, a count equals the block-table entries pointing at the block (plus the pending
//! plan's and the prefix cache's holds), and each table covers exactly its tokens.
//!
//! Device blocks have three exclusive states (see `device.rs`): free (count 0, on the free
//! list, unnamed), evictable (count 0, named, in the LRU evictor) and in use (count > 0).
//! Host blocks have the same three, where the named ones form the host tier of the prefix
//! cache and are never in a swapped-out sequence's table. For both pools, a
//! block's count is the number of block-table entries pointing at it plus one if the
//! step's pending plan holds it (`plan.rs`). Device and host ids are different types, so a
//! table or a plan cannot mix them up.
//!
//! The token ids are the caller's, so the checks that need them ([`BlockManager::check_contents`]:
//! names are chained hashes of the tokens, a shared block holds the same tokens for every
//! sharer, a cached block's name matches) take them from the caller.

use super::block_table::{blocks_for, Blocks};
use super::ids::{DeviceBlockId, HostBlockId, SeqId};
use super::manager::BlockManager;
use super::prefix::hash_block;
use std::collections::HashMap;

/// First table entry seen per block: (sequence, logical index).
type Sharer = Option<(SeqId, usize)>;

impl BlockManager {
    /// Checks every invariant; the error names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_sequences()?;
        self.check_device()?;
        self.check_host()?;
        self.plan.check()
    }

    fn check_sequences(&self) -> Result<(), String> {
        let bs = self.config.block_size;
        let caching = self.device.cache().is_some();
        let engine_seqs = self.sequences().count();
        if self.seqs.len() != engine_seqs * self.groups.len() {
            return Err(format!(
                "{} KV sequences for {engine_seqs} sequences in {} KV cache groups",
                self.seqs.len(),
                self.groups.len()
            ));
        }
        for (&id, s) in &self.seqs {
            // A sequence is in every KV cache group, at the same place and progress.
            let g = super::groups::group_of(id);
            if g >= self.groups.len() {
                return Err(format!("{id}: KV cache group {g} of {}", self.groups.len()));
            }
            let first = self
                .seq(super::groups::engine_id(id))
                .map_err(|e| e.to_string())?;
            let progress = |s: &super::block_table::Sequence| {
                (s.num_tokens, s.num_computed, s.num_cached, s.location())
            };
            if progress(first) != progress(s) {
                return Err(format!(
                    "{id}: KV cache group {g} at {:?}, group 0 at {:?}",
                    progress(s),
                    progress(first)
                ));
            }
            if self.groups.len() > 1 && self.groups.window(g).is_none() && s.released > 0 {
                return Err(format!("{id}: holes in a KV cache group without a window"));
            }
            let n = s.num_tokens;
            if n == 0 {
                return Err(format!("{id} has no tokens"));
            }
            if s.released + s.num_blocks() != blocks_for(n, bs) || s.num_blocks() == 0 {
                return Err(format!(
                    "{id}: {} blocks and {} holes for {n} tokens of block size {bs}",
                    s.num_blocks(),
                    s.released
                ));
            }
            if s.released * bs > s.num_computed {
                return Err(format!(
                    "{id}: {} blocks released but only {} tokens computed",
                    s.released, s.num_computed
                ));
            }
            if s.num_computed > n {
                return Err(format!("{id}: {} of {n} tokens computed", s.num_computed));
            }
            if s.num_cached > s.num_computed || s.num_cached % bs != 0 || s.num_cached >= n {
                return Err(format!("{id}: {} cached tokens", s.num_cached));
            }
            let want = if caching { s.num_computed / bs } else { 0 };
            if s.hashes.len() != want {
                return Err(format!(
                    "{id}: {} block names, expected {want}",
                    s.hashes.len()
                ));
            }
        }
        Ok(())
    }

    /// Checks what depends on the token ids, with `tokens(seq)` giving each sequence's
    /// tokens (at least its slots; `None` skips the sequence): each block name is the
    /// chained hash of its tokens, a cached block holds the tokens of every table pointing
    /// at it under the same name, and a shared block holds the same tokens for all sharers
    /// (as far as each has slots in it).
    pub fn check_contents<'a>(
        &self,
        tokens: impl Fn(SeqId) -> Option<&'a [u32]>,
    ) -> Result<(), String> {
        let bs = self.config.block_size;
        let cache = self.device.cache();
        let mut first: HashMap<DeviceBlockId, &[u32]> = HashMap::new();
        let mut first_host: HashMap<HostBlockId, &[u32]> = HashMap::new();
        for (&id, s) in &self.seqs {
            let Some(all) = tokens(super::groups::engine_id(id)) else {
                continue;
            };
            if all.len() < s.num_tokens {
                return Err(format!(
                    "{id}: {} slots, {} tokens",
                    s.num_tokens,
                    all.len()
                ));
            }
            let block =
                |i: usize| &all[(i * bs).min(s.num_tokens)..((i + 1) * bs).min(s.num_tokens)];
            let mut parent = s.root;
            for (i, &h) in s.hashes.iter().enumerate() {
                if hash_block(parent, block(i)) != h {
                    return Err(format!("{id}: block {i}'s name is not its chained hash"));
                }
                parent = Some(h);
            }
            let live = s.released..s.released + s.num_blocks();
            let shared = |b: String, seen: Option<&'a [u32]>, i: usize| {
                longer_if_agreeing(seen, block(i)).ok_or_else(|| {
                    format!(
                        "{b} is shared by {id} at block {i} but holds other tokens for another \
                         sequence"
                    )
                })
            };
            match &s.blocks {
                Blocks::Device(table) => {
                    for (i, &b) in live.zip(table) {
                        let longest = shared(b.to_string(), first.get(&b).copied(), i)?;
                        first.insert(b, longest);
                        if let Some(name) = cache.and_then(|c| c.name(b)) {
                            if *name.tokens != *block(i) {
                                return Err(format!(
                                    "{b} is cached under other tokens than {id} has"
                                ));
                            }
                        }
                    }
                }
                Blocks::Host(table) => {
                    for (i, &h) in live.zip(table) {
                        let longest = shared(h.to_string(), first_host.get(&h).copied(), i)?;
                        first_host.insert(h, longest);
                    }
                }
            }
        }
        Ok(())
    }

    fn check_device(&self) -> Result<(), String> {
        let bs = self.config.block_size;
        let alloc = self.device.allocator();
        let cache = self.device.cache();
        let on_free_list = alloc.check("device")?;
        if let Some(c) = cache {
            c.check(bs)?;
        }
        let mut refs = vec![0u32; alloc.num_blocks()];
        let mut first: Vec<Sharer> = vec![None; alloc.num_blocks()];
        for (&id, s) in &self.seqs {
            let Some(table) = s.device_blocks() else {
                continue;
            };
            for (j, &b) in table.iter().enumerate() {
                let i = s.released + j;
                if !alloc.contains(b) {
                    return Err(format!("{id} points at {b}, outside the device pool"));
                }
                refs[b.0 as usize] += 1;
                same_index(&mut first[b.0 as usize], id, i, b)?;
                if let Some(name) = cache.and_then(|c| c.name(b)) {
                    if s.hashes.get(i).is_some_and(|&h| h != name.hash) {
                        return Err(format!("{b} is cached under another name than {id}'s"));
                    }
                }
            }
        }
        for (i, &table_refs) in refs.iter().enumerate() {
            let b = DeviceBlockId(i as u32);
            let count = alloc.refcount(b);
            let hold = self.plan.device_hold(b);
            let pins = self.pin_refs(b);
            if count != table_refs + hold + pins {
                return Err(format!(
                    "{b}: count {count}, but {table_refs} table entries, hold {hold} and {pins} \
                     pins"
                ));
            }
            let named = cache.is_some_and(|c| c.is_named(b));
            let evictable = cache.is_some_and(|c| c.is_evictable(b));
            let free = on_free_list[i];
            let ok = match count {
                0 => (free && !named && !evictable) || (!free && named && evictable),
                _ => !free && !evictable,
            };
            if !ok {
                return Err(format!(
                    "{b}: count {count}, free-listed {free}, named {named}, evictable {evictable}"
                ));
            }
        }
        Ok(())
    }

    fn check_host(&self) -> Result<(), String> {
        let alloc = self.host.allocator();
        let cache = self.host.cache();
        let on_free_list = alloc.check("host")?;
        if let Some(c) = cache {
            c.check(self.config.block_size)?;
            if c.num_named() > self.config.host_tier_blocks {
                return Err(format!(
                    "host tier: {} named blocks over a budget of {}",
                    c.num_named(),
                    self.config.host_tier_blocks
                ));
            }
        }
        let mut refs = vec![0u32; alloc.num_blocks()];
        let mut first: Vec<Sharer> = vec![None; alloc.num_blocks()];
        for (&id, s) in &self.seqs {
            let Some(table) = s.host_blocks() else {
                continue;
            };
            for (j, &h) in table.iter().enumerate() {
                let i = s.released + j;
                if !alloc.contains(h) {
                    return Err(format!("{id} points at {h}, outside the host pool"));
                }
                refs[h.0 as usize] += 1;
                same_index(&mut first[h.0 as usize], id, i, h)?;
            }
        }
        for (i, &table_refs) in refs.iter().enumerate() {
            let h = HostBlockId(i as u32);
            let count = alloc.refcount(h);
            let hold = self.plan.host_hold(h);
            if count != table_refs + hold {
                return Err(format!(
                    "{h}: count {count}, but {table_refs} table entries and hold {hold}"
                ));
            }
            // Tier blocks belong to no swapped-out sequence; at most the plan holds them.
            let named = cache.is_some_and(|c| c.is_named(h));
            let evictable = cache.is_some_and(|c| c.is_evictable(h));
            let free = on_free_list[i];
            let ok = match count {
                0 => (free && !named && !evictable) || (!free && named && evictable),
                _ => !(free || evictable || (named && table_refs > 0)),
            };
            if !ok {
                return Err(format!(
                    "{h}: count {count} ({table_refs} in tables), free-listed {free}, named \
                     {named}, evictable {evictable}"
                ));
            }
        }
        Ok(())
    }
}

/// A shared block is never written (the first write copies it), so every sequence that
/// points at it has it at the same logical index (and, checked by `check_contents`, with
/// the same tokens).
fn same_index(
    first: &mut Sharer,
    id: SeqId,
    index: usize,
    block: impl std::fmt::Display,
) -> Result<(), String> {
    match *first {
        None => {
            *first = Some((id, index));
            Ok(())
        }
        Some((other, j)) if j != index => Err(format!(
            "{block} is logical block {j} of {other} and {index} of {id}"
        )),
        Some(_) => Ok(()),
    }
}

/// Sharers of a block agree on the slots they all have (one that gave back rejected
/// speculative slots sees fewer of its tokens than the others): the longer of the two views
/// when they agree, so that keeping it checks every sharer against all the others.
fn longer_if_agreeing<'t>(seen: Option<&'t [u32]>, mine: &'t [u32]) -> Option<&'t [u32]> {
    match seen {
        Some(t) if t.iter().zip(mine).any(|(x, y)| x != y) => None,
        Some(t) if t.len() >= mine.len() => Some(t),
        _ => Some(mine),
    }
}
