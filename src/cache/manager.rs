//! The block manager: admits sequences, grows them slot by slot, shares blocks between
//! forks and between prompts with a common prefix, and writes the step's plan of block
//! operations. This is the bookkeeping half of PagedAttention (Kwon et al., SOSP 2023,
//! §4.2-4.5): block tables, reference counts, copy-on-write on the first write into a
//! shared block, and swapping of whole sequence groups (`swap.rs`).
//!
//! Every fallible operation comes as a pair: `can_x` answers without changing anything and
//! `x` first checks exactly what `can_x` checks, then mutates. So a failed operation leaves
//! the manager unchanged, and `can_x` says yes exactly when `x` would succeed.

use super::block_table::{blocks_for, Blocks, Sequence};
use super::config::CacheConfig;
use super::device::{DevicePool, HostPool};
use super::error::CacheError;
use super::groups::{engine_id, kv_id, KvGroups};
use super::holds::Pins;
use super::ids::{DeviceBlockId, HostBlockId, SeqId};
use super::ops::BlockOps;
use super::plan::PendingPlan;
use super::prefix::{hash_block, BlockHash};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

/// Whether a sequence group can be admitted (allocated, or swapped in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocStatus {
    /// Enough blocks are available now, watermark included.
    Now,
    /// Not now; it may fit once other sequences finish or are preempted.
    Later,
    /// It will never fit (more blocks than the pool less its watermark), or the request
    /// is malformed (an empty prompt, unknown or not swapped sequences).
    Never,
}

/// What `append_slot` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Where the new token's K and V go: `block * block_size + offset`.
    pub slot: usize,
    /// The copy-on-write this append needs, `(src, dst)`, also recorded in the step's plan.
    pub copy: Option<(DeviceBlockId, DeviceBlockId)>,
    /// Whether the token opened a new block because the last one was full.
    pub new_block: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Counters {
    pub cow_copies: u64,
    pub swapped_out_blocks: u64,
    pub swapped_in_blocks: u64,
    pub prefix_hits: u64,
    pub prefix_misses: u64,
    pub window_released_blocks: u64,
    /// Prompt blocks found in the host tier and copied up to the device.
    pub host_tier_hits: u64,
    /// Blocks copied down to the host tier.
    pub host_tier_saves: u64,
}

/// CPU-side owner of the KV cache's block tables and block pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockManager {
    pub(super) config: CacheConfig,
    pub(super) device: DevicePool,
    pub(super) host: HostPool,
    pub(super) seqs: BTreeMap<SeqId, Sequence>,
    pub(super) plan: PendingPlan,
    pub(super) counters: Counters,
    /// Blocks named since the last plan was taken, to be written through to the host tier
    /// (`tier.rs`; only with `tier_write_through`).
    pub(super) to_save: Vec<(DeviceBlockId, BlockHash)>,
    /// Pinned prefixes (`pins.rs`).
    pub(super) pins: Pins,
    /// KV cache groups (`groups.rs`): one block table per group for every sequence.
    pub(super) groups: KvGroups,
}

impl BlockManager {
    pub fn new(config: CacheConfig) -> Result<Self, CacheError> {
        config.validate()?;
        let tier = config.has_host_tier();
        Ok(BlockManager {
            config,
            device: DevicePool::new(
                config.num_device_blocks as u32,
                config.enable_prefix_caching,
            )
            .keep_evicted(tier),
            host: HostPool::new(config.num_host_blocks as u32, tier),
            seqs: BTreeMap::new(),
            plan: PendingPlan::default(),
            counters: Counters::default(),
            to_save: Vec::new(),
            pins: Pins::default(),
            groups: KvGroups::default(),
        })
    }

    /// The same (empty) manager keeping one block table per KV cache group for every
    /// sequence (see `groups.rs`).
    pub fn with_groups(mut self, groups: KvGroups) -> Self {
        self.groups = groups;
        self
    }

    pub fn groups(&self) -> &KvGroups {
        &self.groups
    }

    /// Blocks a sequence whose tables cover `from` tokens takes to cover `to`, over all
    /// KV cache groups; a windowed group counts at most what a sequence ever holds in it
    /// (see [`KvGroups::blocks_between`]). Without groups: the blocks between the two.
    pub fn blocks_between(&self, from: usize, to: usize) -> usize {
        self.groups
            .blocks_between(from, to.max(from), self.config.block_size)
    }

    /// The most blocks one sequence ever holds at once in KV cache group `g`: `None` for a
    /// group without a window (all of its tokens' blocks).
    pub fn held_blocks_cap(&self, g: usize) -> Option<usize> {
        self.groups.held_blocks_cap(g, self.config.block_size)
    }

    /// The KV sequences of engine sequence `seq`, one per group.
    pub(super) fn kv_ids(&self, seq: SeqId) -> impl Iterator<Item = SeqId> {
        (0..self.groups.len()).map(move |g| kv_id(seq, g))
    }

    /// The KV sequences of `seqs`, sequence by sequence.
    pub(super) fn expand<'a>(&self, seqs: &'a [SeqId]) -> Cow<'a, [SeqId]> {
        match self.groups.len() {
            1 => Cow::Borrowed(seqs),
            _ => Cow::Owned(seqs.iter().flat_map(|&s| self.kv_ids(s)).collect()),
        }
    }

    /// A new sequence id must leave room for the group index in its top byte.
    pub(super) fn check_new_id(&self, seq: SeqId) -> Result<(), CacheError> {
        if self.groups.len() > 1 && engine_id(seq) != seq {
            return Err(CacheError::SequenceIdTooLarge(seq));
        }
        Ok(())
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Whether a new sequence with this prompt can be admitted now, leaving the watermark
    /// free. Cached prefix blocks that are in use cost nothing.
    pub fn can_allocate(&self, prompt: &[u32]) -> AllocStatus {
        self.can_allocate_group(&[prompt])
    }

    /// Gives `seq` a block table for `prompt`: cached leading blocks are shared, the rest
    /// allocated. Returns the number of leading tokens whose KV is already cached (a
    /// multiple of the block size, always less than the prompt), which the engine skips.
    pub fn allocate(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize, CacheError> {
        Ok(self.allocate_group(&[(seq, prompt)])?[0])
    }

    /// Whether `seq` can take one more token now (the watermark may be used).
    pub fn can_append_slot(&self, seq: SeqId) -> bool {
        self.can_append_slots(&[seq])
    }

    /// Whether every sequence in `seqs` can take one more token, in any order.
    pub fn can_append_slots(&self, seqs: &[SeqId]) -> bool {
        matches!(self.blocks_needed_to_append(seqs), Ok(n) if n <= self.device.available())
    }

    /// Exactly how many blocks appending one token to each of `seqs` takes: one per
    /// sequence whose last block is full, and for a partly filled last block shared by
    /// `r` sequences of which `k` append, `min(k, r - 1)` copies (the last writer to
    /// arrive has the block to itself).
    pub fn blocks_needed_to_append(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        self.append_need_kv(&self.expand(seqs))
    }

    /// [`Self::blocks_needed_to_append`] of KV sequences.
    pub(super) fn append_need_kv(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        let bs = self.config.block_size;
        let mut seen = HashSet::new();
        let mut needed = 0;
        let mut writers: BTreeMap<DeviceBlockId, u32> = BTreeMap::new();
        for &id in seqs {
            if !seen.insert(id) {
                return Err(CacheError::DuplicateSequence(id));
            }
            let s = self.seq(id)?;
            let table = s.device_blocks().ok_or(CacheError::Swapped(id))?;
            match table.last() {
                Some(&last) if s.num_tokens % bs != 0 => *writers.entry(last).or_default() += 1,
                _ => needed += 1,
            }
        }
        for (block, k) in writers {
            needed += k.min(self.table_refs(block).saturating_sub(1)) as usize;
        }
        Ok(needed)
    }

    /// Gives `seq` a slot for one more token. Opens a new block only when the last one is
    /// full; writing into a partly filled block that other sequences share first copies it
    /// (copy-on-write), recorded in the step's plan.
    /// With several KV cache groups every group's table takes the slot; the outcome is
    /// group 0's.
    pub fn append_slot(&mut self, seq: SeqId) -> Result<AppendOutcome, CacheError> {
        let needed = self.blocks_needed_to_append(&[seq])?;
        let available = self.device.available();
        if needed > available {
            return Err(CacheError::OutOfBlocks { needed, available });
        }
        let mut first = None;
        for id in self.kv_ids(seq) {
            let outcome = self.append_slot_kv(id)?;
            first.get_or_insert(outcome);
        }
        first.ok_or(CacheError::UnknownSequence(seq))
    }

    fn append_slot_kv(&mut self, seq: SeqId) -> Result<AppendOutcome, CacheError> {
        let needed = self.append_need_kv(&[seq])?;
        let available = self.device.available();
        if needed > available {
            return Err(CacheError::OutOfBlocks { needed, available });
        }
        let bs = self.config.block_size;
        let BlockManager {
            device,
            plan,
            seqs,
            counters,
            ..
        } = self;
        let s = seqs.get_mut(&seq).ok_or(CacheError::UnknownSequence(seq))?;
        let Blocks::Device(table) = &mut s.blocks else {
            return Err(CacheError::Swapped(seq));
        };
        let pos = s.num_tokens;
        // The block being written is never a hole: the last block is never released.
        let idx = pos / bs - s.released;
        let new_block = pos % bs == 0;
        let mut copy = None;
        if new_block {
            table.push(device.allocate().expect("availability checked"));
        } else if needed == 1 {
            let old = table[idx];
            let src = plan.content_source(old);
            let dst = device.allocate().expect("availability checked");
            plan.record_copy(device, src, dst);
            table[idx] = dst;
            device.release(old);
            counters.cow_copies += 1;
            copy = Some((src, dst));
            tracing::trace!(%seq, %src, %dst, "copy-on-write");
        }
        s.num_tokens += 1;
        Ok(AppendOutcome {
            slot: table[idx].0 as usize * bs + pos % bs,
            copy,
            new_block,
        })
    }

    /// Exactly how many blocks growing each `(seq, target)` to `target` slots takes (none
    /// for a sequence that has them): the first new slot as in
    /// [`BlockManager::blocks_needed_to_append`] (with its copy-on-write), then a block per
    /// block boundary crossed.
    pub fn blocks_needed_to_grow(&self, seqs: &[(SeqId, usize)]) -> Result<usize, CacheError> {
        let bs = self.config.block_size;
        let mut first = Vec::with_capacity(seqs.len());
        let mut more = 0;
        for &(seq, target) in seqs {
            for id in self.kv_ids(seq) {
                let n = self.seq(id)?.num_tokens;
                if target > n {
                    first.push(id);
                    more += blocks_for(target, bs) - blocks_for(n + 1, bs);
                }
            }
        }
        Ok(self.append_need_kv(&first)? + more)
    }

    /// Whether every `(seq, target)` can grow to `target` slots now.
    pub fn can_grow(&self, seqs: &[(SeqId, usize)]) -> bool {
        matches!(self.blocks_needed_to_grow(seqs), Ok(n) if n <= self.device.available())
    }

    /// Gives `seq` slots up to `target` tokens (a prompt's next chunk); nothing if it has
    /// them. Checked as a whole first, so a failure changes nothing.
    pub fn grow_to(&mut self, seq: SeqId, target: usize) -> Result<(), CacheError> {
        let needed = self.blocks_needed_to_grow(&[(seq, target)])?;
        let available = self.device.available();
        if needed > available {
            return Err(CacheError::OutOfBlocks { needed, available });
        }
        while self.seq(seq)?.num_tokens < target {
            self.append_slot(seq)?;
        }
        Ok(())
    }

    /// Records that the KV of the first `computed.len()` tokens of `seq`, which are
    /// `computed`, is now in the cache (call it after the step's forward pass; a smaller
    /// count than before changes nothing). With prefix caching on, this names the newly
    /// completed full blocks, hashed from `computed`, so later prompts can reuse them.
    pub fn mark_computed(&mut self, seq: SeqId, computed: &[u32]) -> Result<(), CacheError> {
        self.seq(seq)?;
        for id in self.kv_ids(seq) {
            self.mark_computed_kv(id, computed)?;
        }
        Ok(())
    }

    fn mark_computed_kv(&mut self, seq: SeqId, computed: &[u32]) -> Result<(), CacheError> {
        let bs = self.config.block_size;
        let write_through = self.config.tier_write_through;
        let BlockManager {
            device,
            seqs,
            to_save,
            ..
        } = self;
        let s = seqs.get_mut(&seq).ok_or(CacheError::UnknownSequence(seq))?;
        if computed.len() > s.num_tokens {
            return Err(CacheError::TokenOutOfRange {
                seq,
                value: computed.len(),
                num_tokens: s.num_tokens,
            });
        }
        let Blocks::Device(table) = &s.blocks else {
            return Err(CacheError::Swapped(seq));
        };
        s.num_computed = s.num_computed.max(computed.len());
        if let Some(cache) = device.cache_mut() {
            // Blocks named before are below the old count; the new ones lie in `computed`.
            while s.hashes.len() < computed.len() / bs {
                let i = s.hashes.len();
                let parent = s.parent(i);
                let tokens = &computed[i * bs..(i + 1) * bs];
                let hash = hash_block(parent, tokens);
                // Blocks are released only once computed, so an unnamed one is live.
                if let Some(j) = s.live_index(i) {
                    if cache.register(table[j], hash, parent, tokens) && write_through {
                        to_save.push((table[j], hash));
                    }
                }
                s.hashes.push(hash);
            }
        }
        Ok(())
    }

    /// Releases the leading blocks of `seq` that no future query can attend to with a
    /// sliding window of `window` tokens in every layer: blocks whose tokens all lie
    /// before `num_computed + 1 - window` (the next query is at position `num_computed`
    /// and sees `window` positions up to itself). The last block is always kept. Their
    /// table entries become holes; a block another sequence still uses stays allocated
    /// for it, and a cached one stays in the prefix cache as evictable. Returns how many
    /// blocks this sequence let go. A swapped-out sequence releases nothing. With several
    /// KV cache groups only the windowed groups release (see
    /// [`Self::release_group_windows`]).
    pub fn release_out_of_window(
        &mut self,
        seq: SeqId,
        window: usize,
    ) -> Result<usize, CacheError> {
        self.seq(seq)?;
        let mut n = 0;
        for g in 0..self.groups.len() {
            // With several KV cache groups, a global group keeps every block.
            if self.groups.len() == 1 || self.groups.window(g).is_some() {
                n += self.release_kv(kv_id(seq, g), window)?;
            }
        }
        Ok(n)
    }

    /// Releases, in each windowed KV cache group, the blocks of `seq` that left the
    /// group's window (as [`Self::release_out_of_window`]); global groups keep theirs.
    pub fn release_group_windows(&mut self, seq: SeqId) -> Result<usize, CacheError> {
        self.seq(seq)?;
        let mut n = 0;
        for g in 0..self.groups.len() {
            if let Some(w) = self.groups.window(g) {
                n += self.release_kv(kv_id(seq, g), w)?;
            }
        }
        Ok(n)
    }

    pub(super) fn release_kv(&mut self, seq: SeqId, window: usize) -> Result<usize, CacheError> {
        let bs = self.config.block_size;
        let BlockManager {
            device,
            seqs,
            counters,
            ..
        } = self;
        let s = seqs.get_mut(&seq).ok_or(CacheError::UnknownSequence(seq))?;
        let Blocks::Device(table) = &mut s.blocks else {
            return Ok(0);
        };
        let seen_from = (s.num_computed + 1).saturating_sub(window.max(1));
        let total = s.released + table.len();
        let target = (seen_from / bs).min(total.saturating_sub(1));
        if target <= s.released {
            return Ok(0);
        }
        let n = target - s.released;
        // Deepest first, as in free(): with prefix caching the evictor then drops the
        // chain's tail before its head.
        table.drain(..n).rev().for_each(|b| device.release(b));
        s.released = target;
        counters.window_released_blocks += n as u64;
        tracing::trace!(%seq, released = n, holes = target, "blocks left the window");
        Ok(n)
    }

    /// Gives back the slots of `seq` past its first `num_tokens`: the tokens a speculative
    /// step proposed and verification rejected. Call it after the step's forward pass, and
    /// before [`BlockManager::mark_computed`] names the verified tokens, so no rejected token
    /// is ever hashed into the prefix cache. Blocks left holding only rejected tokens go back
    /// to the pool (or to whoever shares them); a copy-on-write made for a rejected token
    /// stays, since the private copy is as good as the shared original. Returns how many
    /// blocks this sequence let go.
    ///
    /// Errors, leaving everything unchanged: [`CacheError::TokenOutOfRange`] unless
    /// `num_computed <= num_tokens <= ` the slots it has (computed KV is never given back),
    /// more than the prefix-cache hit it was admitted with, and at least one token stays in
    /// a live block; [`CacheError::Swapped`];
    /// [`CacheError::BlocksInFlight`] when a block it would release is written by the
    /// pending plan; [`CacheError::CutsSharedBlock`] when the new end falls inside a block
    /// other sequences share.
    pub fn truncate(&mut self, seq: SeqId, num_tokens: usize) -> Result<usize, CacheError> {
        self.seq(seq)?;
        let mut keep = Vec::with_capacity(self.groups.len());
        for id in self.kv_ids(seq) {
            keep.push((id, self.truncate_check(id, num_tokens)?));
        }
        let mut dropped = 0;
        for (id, live) in keep {
            if let Some(live) = live {
                dropped += self.truncate_kv(id, num_tokens, live)?;
            }
        }
        Ok(dropped)
    }

    /// What [`Self::truncate`] checks for one KV sequence: `None` when it has exactly
    /// `num_tokens` slots, else the live blocks it keeps.
    fn truncate_check(&self, seq: SeqId, num_tokens: usize) -> Result<Option<usize>, CacheError> {
        let bs = self.config.block_size;
        let s = self.seq(seq)?;
        let Blocks::Device(table) = &s.blocks else {
            return Err(CacheError::Swapped(seq));
        };
        let keep = super::block_table::blocks_for(num_tokens, bs);
        let in_range =
            s.num_computed.max(s.num_cached + 1) <= num_tokens && num_tokens <= s.num_tokens;
        if !in_range || keep <= s.released {
            return Err(CacheError::TokenOutOfRange {
                seq,
                value: num_tokens,
                num_tokens: s.num_tokens,
            });
        }
        if num_tokens == s.num_tokens {
            return Ok(None);
        }
        let live = keep - s.released;
        if table[live..].iter().any(|&b| self.plan.writes(b)) {
            return Err(CacheError::BlocksInFlight(seq));
        }
        // Cutting into a block that other tables share would leave this sequence a partial
        // view of it: once the others fill and name it and then let it go, this sequence
        // would write its next token into a named block in place. Speculative slots never
        // end in one (the first write into a shared block copies it).
        let last = table[live - 1];
        if !num_tokens.is_multiple_of(bs) && self.table_refs(last) > 1 {
            return Err(CacheError::CutsSharedBlock { seq, block: last });
        }
        Ok(Some(live))
    }

    fn truncate_kv(
        &mut self,
        seq: SeqId,
        num_tokens: usize,
        live: usize,
    ) -> Result<usize, CacheError> {
        let BlockManager { device, seqs, .. } = self;
        let s = seqs.get_mut(&seq).ok_or(CacheError::UnknownSequence(seq))?;
        let Blocks::Device(table) = &mut s.blocks else {
            return Err(CacheError::Swapped(seq));
        };
        let dropped = table.len() - live;
        // Deepest first, as in free().
        table.drain(live..).rev().for_each(|b| device.release(b));
        s.num_tokens = num_tokens;
        tracing::trace!(%seq, num_tokens, released = dropped, "rejected slots given back");
        Ok(dropped)
    }

    /// Makes `child` a copy of `parent` that shares all its blocks (on the device or in
    /// the host pool); nothing is allocated until one of them writes a shared block.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), CacheError> {
        self.seq(parent)?;
        self.check_new_id(child)?;
        if self.seqs.contains_key(&child) {
            return Err(CacheError::SequenceExists(child));
        }
        for g in 0..self.groups.len() {
            self.fork_kv(kv_id(parent, g), kv_id(child, g))?;
        }
        Ok(())
    }

    fn fork_kv(&mut self, parent: SeqId, child: SeqId) -> Result<(), CacheError> {
        let s = self.seq(parent)?.clone();
        match &s.blocks {
            Blocks::Device(t) => t.iter().for_each(|&b| self.device.retain(b)),
            Blocks::Host(t) => t.iter().for_each(|&h| self.host.retain(h)),
        }
        self.seqs.insert(child, s);
        Ok(())
    }

    /// Drops `seq` (finished, aborted, or preempted for recomputation) and its references;
    /// blocks nobody else uses become free, or evictable if they are cached.
    pub fn free(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.seq(seq)?;
        for id in self.kv_ids(seq) {
            self.free_kv(id)?;
        }
        Ok(())
    }

    fn free_kv(&mut self, seq: SeqId) -> Result<(), CacheError> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or(CacheError::UnknownSequence(seq))?;
        match &s.blocks {
            // Deepest block first: it enters the evictor before the blocks it extends and
            // so is evicted before them; evicting a head first would strand its tail.
            Blocks::Device(t) => t.iter().rev().for_each(|&b| self.device.release(b)),
            Blocks::Host(t) => t.iter().for_each(|&h| self.host.release(h)),
        }
        Ok(())
    }

    /// The operations recorded so far in this step.
    pub fn pending_ops(&self) -> &BlockOps {
        &self.plan.ops
    }

    /// Ends the step: returns its plan (execute swap-out, then swap-in, then copies, before
    /// the forward pass) and releases the blocks the plan held. With a host tier, the plan
    /// first gets the copies down to it of the blocks this step evicted (and, writing
    /// through, of those named since the last plan); they read their blocks before anything
    /// in the step writes them, since swap-outs run first.
    pub fn take_ops(&mut self) -> BlockOps {
        self.settle_host_tier();
        self.plan.take(&mut self.device, &mut self.host)
    }

    /// Drops the pending plan without carrying it out, after a fault, and forgets every
    /// cached block name on the device and in the host tier: blocks the plan (or a failed
    /// step) should have written may be named without holding their content, and a name
    /// must never lead to wrong KV. The cache starts cold; nothing else changes.
    pub fn void_ops(&mut self) {
        self.to_save.clear();
        self.device.forget_names();
        let _ = self.plan.take(&mut self.device, &mut self.host);
        // Releasing the plan's holds may have made named blocks evictable again.
        self.device.forget_names();
        self.host.forget_names();
    }

    /// The device's memory is gone (a lost device): drops the pending plan and every name
    /// of a device block (evictable blocks become free; blocks in use, pinned ones among
    /// them, stay in use unnamed, their content being gone), and the names of the host
    /// blocks in `unlanded`, whose copies down from the device were under way and never
    /// arrived. The rest of the host tier keeps its names: host memory survived. The
    /// caller has already freed or requeued the sequences whose blocks were lost.
    pub fn lose_device_contents(&mut self, unlanded: &[HostBlockId]) {
        self.to_save.clear();
        self.device.forget_names();
        let _ = self.plan.take(&mut self.device, &mut self.host);
        self.device.forget_names();
        for &h in unlanded {
            self.host.forget_block_name(h);
        }
    }

    pub(super) fn seq(&self, seq: SeqId) -> Result<&Sequence, CacheError> {
        self.seqs.get(&seq).ok_or(CacheError::UnknownSequence(seq))
    }

    /// References to `block` from block tables, not counting the plan's hold or pins.
    pub(super) fn table_refs(&self, block: DeviceBlockId) -> u32 {
        self.device.refcount(block) - self.plan.device_hold(block) - self.pin_refs(block)
    }

    /// A group names at least one known sequence, each once.
    pub(super) fn check_group(&self, seqs: &[SeqId]) -> Result<(), CacheError> {
        if seqs.is_empty() {
            return Err(CacheError::EmptyGroup);
        }
        let mut seen = HashSet::new();
        for &id in seqs {
            self.seq(id)?;
            if !seen.insert(id) {
                return Err(CacheError::DuplicateSequence(id));
            }
        }
        Ok(())
    }

    /// Admitting something that takes `needed` available blocks now, and `worst` in all,
    /// must leave the watermark free.
    pub(super) fn admission(&self, worst: usize, needed: usize) -> Result<(), CacheError> {
        let capacity = self.group_capacity();
        if worst > capacity {
            return Err(CacheError::ExceedsCapacity {
                needed: worst,
                capacity,
            });
        }
        let usable = self
            .device
            .available()
            .saturating_sub(self.config.watermark_blocks);
        if needed > usable {
            return Err(CacheError::OutOfBlocks {
                needed,
                available: usable,
            });
        }
        Ok(())
    }

    /// The leading full blocks of `prompt` found in the prefix cache, on the device or in
    /// the host tier, and how many were looked up.
    /// (In one KV cache group, for one request's extra keys: names chained from `root`,
    /// see [`super::KvGroups::root`].)
    pub(super) fn prefix_hits_in(
        &self,
        root: Option<BlockHash>,
        prompt: &[u32],
    ) -> (Vec<(Hit, BlockHash)>, usize) {
        let bs = self.config.block_size;
        let mut hits = Vec::new();
        let mut lookups = 0;
        if let Some(cache) = self.device.cache() {
            let host = self.host.cache();
            // The last prompt token is always computed again, because the step samples
            // from its logits; so a fully cached prompt still computes its last block.
            lookups = (prompt.len() - 1) / bs;
            let mut parent = root;
            for tokens in prompt.chunks_exact(bs).take(lookups) {
                let hit = match cache.lookup(parent, tokens) {
                    Some((block, hash)) => (Hit::Device(block), hash),
                    None => match host.and_then(|h| h.lookup(parent, tokens)) {
                        Some((block, hash)) => (Hit::Host(block), hash),
                        None => break,
                    },
                };
                parent = Some(hit.1);
                hits.push(hit);
            }
        }
        (hits, lookups)
    }
}

/// A leading prompt block found in the prefix cache: on the device, or in the host tier
/// (to be copied up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hit {
    Device(DeviceBlockId),
    Host(HostBlockId),
}

pub(super) fn status(admission: Result<(), CacheError>) -> AllocStatus {
    match admission {
        Ok(()) => AllocStatus::Now,
        Err(CacheError::OutOfBlocks { .. }) => AllocStatus::Later,
        Err(_) => AllocStatus::Never,
    }
}
