//! Questions and operations about a sequence group as a whole: admitting all its sequences
//! at once (a group that was preempted for recomputation comes back with several), and how
//! many blocks it occupies, wherever its blocks are, once each of its sequences has grown by
//! one token. The scheduler asks the latter to tell a group that merely has to wait from one
//! that can never run.

use super::block_table::{blocks_for, Blocks};
use super::error::CacheError;
use super::groups::{group_of, kv_id};
use super::ids::{DeviceBlockId, HostBlockId, SeqId};
use super::manager::{status, AllocStatus, BlockManager, Hit};
use super::prefix::{BlockHash, ExtraKeys};
use std::collections::{BTreeMap, HashMap, HashSet};

/// One prompt's lookup in one KV cache group.
pub(super) struct PromptMatch {
    /// Slots the prompt is admitted with.
    pub slots: usize,
    /// Its leading prefix-cache hits (as many in every group).
    pub hits: Vec<(Hit, BlockHash)>,
    /// Leading hits left as holes: a windowed group's first query cannot see them.
    pub skipped: usize,
    /// Blocks looked up.
    pub lookups: usize,
}

/// The prefix-cache matches of every prompt of a group, and what admitting them costs.
pub(super) struct GroupLookup {
    /// Prompt by prompt, and for each prompt KV cache group by group.
    pub prompts: Vec<PromptMatch>,
    /// Distinct blocks the group's tables will point at, pinned ones not counted.
    pub worst: usize,
    /// Available blocks the allocation consumes: fresh blocks, distinct hits on evictable
    /// (unreferenced) blocks, and a block for each distinct host-tier hit.
    pub needed: usize,
}

impl BlockManager {
    /// Whether a group of new sequences with these prompts can be admitted together now,
    /// leaving the watermark free. `Never` means the prompts together need more blocks than
    /// the pool less its watermark (or a prompt is empty).
    pub fn can_allocate_group(&self, prompts: &[&[u32]]) -> AllocStatus {
        if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
            return AllocStatus::Never;
        }
        let whole: Vec<(&[u32], usize)> = prompts.iter().map(|p| (*p, p.len())).collect();
        let found = self.lookup_group(ExtraKeys::NONE, &whole);
        status(self.admission(found.worst, found.needed))
    }

    /// Whether a group of new sequences can be admitted now with slots for only the first
    /// `slots` tokens of each prompt (see [`BlockManager::allocate_group_slots`]).
    pub fn can_allocate_group_slots(&self, prompts: &[(&[u32], usize)]) -> AllocStatus {
        self.can_allocate_group_slots_keyed(ExtraKeys::NONE, prompts)
    }

    /// [`Self::can_allocate_group_slots`] for a request with extra keys `keys` (its cache
    /// salt): only blocks cached under the same keys are hits.
    pub fn can_allocate_group_slots_keyed(
        &self,
        keys: ExtraKeys,
        prompts: &[(&[u32], usize)],
    ) -> AllocStatus {
        if prompts.is_empty() || prompts.iter().any(|p| p.0.is_empty()) {
            return AllocStatus::Never;
        }
        let found = self.lookup_group(keys, prompts);
        status(self.admission(found.worst, found.needed))
    }

    /// Blocks the group `prompts` would occupy if admitted now (cache hits counted once),
    /// over all KV cache groups.
    pub fn blocks_to_allocate_group(&self, prompts: &[&[u32]]) -> usize {
        self.allocate_cost(ExtraKeys::NONE, prompts, None)
    }

    /// [`Self::blocks_to_allocate_group`] in KV cache group `g` alone.
    pub fn blocks_to_allocate_group_in(&self, prompts: &[&[u32]], g: usize) -> usize {
        self.allocate_cost(ExtraKeys::NONE, prompts, Some(g))
    }

    /// [`Self::blocks_to_allocate_group_in`] for a request with extra keys `keys`.
    pub fn blocks_to_allocate_group_keyed(
        &self,
        keys: ExtraKeys,
        prompts: &[&[u32]],
        g: usize,
    ) -> usize {
        self.allocate_cost(keys, prompts, Some(g))
    }

    fn allocate_cost(&self, keys: ExtraKeys, prompts: &[&[u32]], only: Option<usize>) -> usize {
        if prompts.iter().any(|p| p.is_empty()) {
            return 0;
        }
        let whole: Vec<(&[u32], usize)> = prompts.iter().map(|p| (*p, p.len())).collect();
        self.lookup_group_in(keys, &whole, only).worst
    }

    /// Gives each `(seq, prompt)` a block table, all or none: every cache hit of every
    /// prompt is claimed before any fresh block is taken, so one prompt's allocation cannot
    /// evict a block another prompt of the group was counted as hitting. Returns each
    /// sequence's number of cached leading tokens, which the engine skips.
    pub fn allocate_group(&mut self, seqs: &[(SeqId, &[u32])]) -> Result<Vec<usize>, CacheError> {
        let whole: Vec<(SeqId, &[u32], usize)> =
            seqs.iter().map(|&(id, p)| (id, p, p.len())).collect();
        self.allocate_group_slots(&whole)
    }

    /// [`BlockManager::allocate_group`], with slots for only the first `slots` tokens of
    /// each prompt (and at least its cache hits and one more token, at most the prompt):
    /// blocks for the rest are taken as the prompt is computed, chunk by chunk
    /// ([`BlockManager::grow_to`]).
    pub fn allocate_group_slots(
        &mut self,
        seqs: &[(SeqId, &[u32], usize)],
    ) -> Result<Vec<usize>, CacheError> {
        self.allocate_group_slots_keyed(ExtraKeys::NONE, seqs)
    }

    /// [`Self::allocate_group_slots`] for a request with extra keys `keys`: its hits are
    /// blocks cached under the same keys, and the blocks it computes are named under them.
    pub fn allocate_group_slots_keyed(
        &mut self,
        keys: ExtraKeys,
        seqs: &[(SeqId, &[u32], usize)],
    ) -> Result<Vec<usize>, CacheError> {
        if seqs.is_empty() {
            return Err(CacheError::EmptyGroup);
        }
        let mut seen = HashSet::new();
        for &(id, prompt, _) in seqs {
            if prompt.is_empty() {
                return Err(CacheError::EmptyPrompt);
            }
            self.check_new_id(id)?;
            if self.seqs.contains_key(&id) {
                return Err(CacheError::SequenceExists(id));
            }
            if !seen.insert(id) {
                return Err(CacheError::DuplicateSequence(id));
            }
        }
        let prompts: Vec<(&[u32], usize)> = seqs.iter().map(|&(_, p, n)| (p, n)).collect();
        let found = self.lookup_group(keys, &prompts);
        self.admission(found.worst, found.needed)?;

        self.claim_hits(&found);
        let caching = self.device.cache().is_some();
        let bs = self.config.block_size;
        // A host block hit by several prompts of the group comes up once, shared.
        let mut promoted: HashMap<HostBlockId, DeviceBlockId> = HashMap::new();
        let mut cached = Vec::with_capacity(seqs.len());
        let groups = self.groups.len();
        let entries = seqs.iter().flat_map(|s| (0..groups).map(move |g| (s, g)));
        for ((&(seq, prompt, _), g), m) in entries.zip(found.prompts) {
            let PromptMatch {
                slots,
                hits,
                skipped,
                lookups,
            } = m;
            let id = kv_id(seq, g);
            let blocks = blocks_for(slots, bs);
            let root = self.groups.root(g, keys);
            let mut table = self.hit_table(root, prompt, &hits, skipped, &mut promoted);
            while skipped + table.len() < blocks {
                table.push(
                    self.device
                        .allocate()
                        .expect("admission counted the blocks"),
                );
            }
            if caching && g == 0 {
                let host_hits = hits.iter().filter(|h| matches!(h.0, Hit::Host(_))).count();
                self.counters.prefix_hits += hits.len() as u64;
                self.counters.host_tier_hits += host_hits as u64;
                self.counters.prefix_misses += (lookups - hits.len()) as u64;
            }
            let num_cached = hits.len() * bs;
            self.seqs.insert(
                id,
                super::block_table::Sequence {
                    num_tokens: slots,
                    blocks: Blocks::Device(table),
                    hashes: hits.iter().map(|&(_, h)| h).collect(),
                    root,
                    num_computed: num_cached,
                    num_cached,
                    released: skipped,
                },
            );
            if g == 0 {
                cached.push(num_cached);
            }
        }
        // The plan's hold on each promoted host block (the tables never point at it)
        // outlives this call; the block stays in the host tier, named.
        Ok(cached)
    }

    /// Claims every hit of an admitted group before any fresh block is taken: device hits
    /// are retained, and host-tier hits are held by the plan until their copy up has read
    /// them.
    fn claim_hits(&mut self, found: &GroupLookup) {
        for m in &found.prompts {
            for &(hit, _) in &m.hits[m.skipped..] {
                match hit {
                    Hit::Device(block) => self.device.retain(block),
                    Hit::Host(block) => self.plan.hold_host(&mut self.host, block),
                }
            }
        }
    }

    /// The leading live table entries of `prompt` in KV cache group `g` for its claimed
    /// hits (those after the `skipped` holes): device blocks as they are, host-tier blocks
    /// copied up (once per group: `promoted`).
    fn hit_table(
        &mut self,
        root: Option<BlockHash>,
        prompt: &[u32],
        hits: &[(Hit, BlockHash)],
        skipped: usize,
        promoted: &mut HashMap<HostBlockId, DeviceBlockId>,
    ) -> Vec<DeviceBlockId> {
        let bs = self.config.block_size;
        let mut table = Vec::with_capacity(hits.len() - skipped);
        for (i, &(hit, hash)) in hits.iter().enumerate().skip(skipped) {
            let block = match hit {
                Hit::Device(block) => block,
                Hit::Host(h) => match promoted.get(&h) {
                    Some(&d) => {
                        self.device.retain(d);
                        d
                    }
                    None => {
                        let parent = match i {
                            0 => root,
                            _ => Some(hits[i - 1].1),
                        };
                        let d = self.promote(h, hash, parent, &prompt[i * bs..(i + 1) * bs]);
                        promoted.insert(h, d);
                        d
                    }
                },
            };
            table.push(block);
        }
        table
    }

    /// Distinct blocks the group `seqs` holds (on the device or in the host pool), plus
    /// what appending one token to each of `appending` (a subset of `seqs`) takes: the
    /// device blocks the group needs to take its next step. More than the pool less its
    /// watermark means the group can never run again once preempted.
    pub fn group_blocks_after_append(
        &self,
        seqs: &[SeqId],
        appending: &[SeqId],
    ) -> Result<usize, CacheError> {
        self.blocks_after_append_in(seqs, appending, |_| true)
    }

    /// [`Self::group_blocks_after_append`] in KV cache group `g` alone.
    pub fn group_blocks_after_append_in(
        &self,
        seqs: &[SeqId],
        appending: &[SeqId],
        g: usize,
    ) -> Result<usize, CacheError> {
        self.blocks_after_append_in(seqs, appending, |x| x == g)
    }

    fn blocks_after_append_in(
        &self,
        seqs: &[SeqId],
        appending: &[SeqId],
        keep: impl Fn(usize) -> bool,
    ) -> Result<usize, CacheError> {
        self.check_group(&self.expand(seqs))?;
        let only = |ids: &[SeqId]| -> Vec<SeqId> {
            let all = self.expand(ids);
            all.iter()
                .copied()
                .filter(|&id| keep(group_of(id)))
                .collect()
        };
        let (seqs, appending) = (only(seqs), only(appending));
        let mut device: HashSet<DeviceBlockId> = HashSet::new();
        let mut host: HashSet<HostBlockId> = HashSet::new();
        for &id in seqs.iter() {
            match &self.seq(id)?.blocks {
                Blocks::Device(t) => device.extend(t.iter().copied()),
                Blocks::Host(t) => host.extend(t.iter().copied()),
            }
        }
        // Pinned blocks are not the group's to count: the capacity leaves them out too.
        let device = device.iter().filter(|&&b| self.pin_refs(b) == 0).count();
        Ok(device + host.len() + self.append_need_anywhere_kv(&appending)?)
    }

    /// Blocks needed to append one token to each of `seqs`, wherever their blocks are (a
    /// swapped-out group is counted as it will be once back on the device, where a host
    /// block shared by `r` of its sequences becomes one device block shared by `r`).
    pub fn append_need_anywhere(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        self.append_need_anywhere_kv(&self.expand(seqs))
    }

    fn append_need_anywhere_kv(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        let bs = self.config.block_size;
        let mut seen = HashSet::new();
        let mut needed = 0;
        let mut device_writers: BTreeMap<DeviceBlockId, u32> = BTreeMap::new();
        let mut host_writers: BTreeMap<HostBlockId, u32> = BTreeMap::new();
        for &id in seqs {
            if !seen.insert(id) {
                return Err(CacheError::DuplicateSequence(id));
            }
            let s = self.seq(id)?;
            if s.num_tokens % bs == 0 {
                needed += 1;
                continue;
            }
            match &s.blocks {
                Blocks::Device(t) => {
                    *device_writers
                        .entry(*t.last().expect("a partly filled block"))
                        .or_default() += 1
                }
                Blocks::Host(t) => {
                    *host_writers
                        .entry(*t.last().expect("a partly filled block"))
                        .or_default() += 1
                }
            }
        }
        for (block, k) in device_writers {
            needed += k.min(self.table_refs(block).saturating_sub(1)) as usize;
        }
        for (block, k) in host_writers {
            let refs = self.host.refcount(block) - self.plan.host_hold(block);
            needed += k.min(refs.saturating_sub(1)) as usize;
        }
        Ok(needed)
    }

    /// The device pool less its watermark and its pinned blocks: the most blocks one group
    /// can be admitted or swapped in with (pinned blocks it hits not counted).
    pub fn group_capacity(&self) -> usize {
        (self.device.num_blocks() - self.config.watermark_blocks)
            .saturating_sub(self.num_pinned_blocks())
    }

    /// The hits and costs of admitting `prompts`, each with slots for its first tokens
    /// (clamped to its cache hits plus one token at least, and to the prompt at most).
    /// With several KV cache groups each prompt is looked up in every group, and its hits
    /// are cut to the fewest any group has.
    pub(super) fn lookup_group(&self, keys: ExtraKeys, prompts: &[(&[u32], usize)]) -> GroupLookup {
        self.lookup_group_in(keys, prompts, None)
    }

    /// [`Self::lookup_group`]; with `only`, the costs count KV cache group `only` alone
    /// (a question, not an allocation: the entries of other groups are left out).
    fn lookup_group_in(
        &self,
        keys: ExtraKeys,
        prompts: &[(&[u32], usize)],
        only: Option<usize>,
    ) -> GroupLookup {
        let mut device_hits: HashSet<DeviceBlockId> = HashSet::new();
        let mut host_hits: HashSet<HostBlockId> = HashSet::new();
        let mut fresh = 0;
        let groups = self.groups.len();
        let mut per_prompt = Vec::with_capacity(prompts.len() * groups);
        let bs = self.config.block_size;
        for &(prompt, slots) in prompts {
            let mut found: Vec<_> = (0..groups)
                .map(|g| self.prefix_hits_in(self.groups.root(g, keys), prompt))
                .collect();
            let common = found.iter().map(|f| f.0.len()).min().unwrap_or(0);
            for (g, (mut hits, lookups)) in found.drain(..).enumerate() {
                hits.truncate(common);
                let slots = slots.clamp(hits.len() * bs + 1, prompt.len());
                let skipped = self.groups.skipped_hits(g, hits.len(), bs);
                if only.is_some_and(|o| o != g) {
                    continue;
                }
                fresh += blocks_for(slots, bs) - hits.len();
                for &(hit, _) in &hits[skipped..] {
                    match hit {
                        Hit::Device(b) => device_hits.insert(b),
                        Hit::Host(h) => host_hits.insert(h),
                    };
                }
                per_prompt.push(PromptMatch {
                    slots,
                    hits,
                    skipped,
                    lookups,
                });
            }
        }
        // A hit on an evictable block takes it out of the evictor, which costs one available
        // block just as a fresh one does; only hits on blocks in use are free. A host-tier
        // hit needs a device block to come up into.
        let evictable_hits = device_hits
            .iter()
            .filter(|&&b| self.device.refcount(b) == 0)
            .count();
        let unpinned_hits = device_hits
            .iter()
            .filter(|&&b| self.pin_refs(b) == 0)
            .count();
        GroupLookup {
            prompts: per_prompt,
            worst: unpinned_hits + host_hits.len() + fresh,
            needed: evictable_hits + host_hits.len() + fresh,
        }
    }
}
