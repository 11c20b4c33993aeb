//! Property tests of the block manager: long random runs of allocate (a whole prompt, or
//! slots for its first chunk only, the rest taken by later growth, as the engine computes a
//! long prompt) / grow / append / fork / free / swap out / swap in / step / speculate (slots
//! proposed, computed, and the rejected ones given back) / truncate / pin / unpin / forget
//! a prefix against small, often nearly full pools.
//!
//! After every operation the manager's own invariants must hold, a failed operation must
//! leave it unchanged, and each `can_*` must agree with the operation it guards. At every
//! step boundary the plan is checked against the GPU's preconditions by this file's own
//! code, then executed on a simulated KV memory (a value per slot, derived from the whole
//! token prefix as real K and V are), followed by a simulated forward pass; every computed
//! token of every sequence must then read back its own value through its block table. That
//! catches wrong copies, lost swaps, wrongly shared prefix blocks and plan-order hazards.
//!
//! With prefix caching, two thirds of the runs keep a host tier (a quarter of the host pool,
//! or all of it), half of those writing through: evicted or newly named blocks are copied
//! down at step boundaries by the plan and copied up on prefix hits, and the memory check
//! covers the copied-up blocks like any computed ones.
//!
//! Half of the runs model a sliding-window attention: after each step every sequence
//! releases the blocks its window has left, and every position inside the window must
//! still read back its value through the table with holes. Half of those keep KV cache
//! groups instead, as a model that mixes windowed and global layers does: a global group
//! and two windowed ones, every sequence with a table in each. Each group's K/V values
//! differ (a per-group salt), so a block read through the wrong group's table, or shared
//! across groups, reads back a wrong value; global tables never have holes.
//!
//! Two thirds of the admitted prompts carry a cache salt (one of two), and a sequence's K/V
//! values are marked with its salt: a prefix hit on a block computed under another salt (or
//! under none) reads back a wrong value.

use pagellm::internals::cache::{
    AllocStatus, BlockManager, BlockOps, CacheConfig, CacheError, DeviceBlockId, ExtraKeys,
    HostBlockId, KvGroups, Location, PinId, SeqId,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};

const NUM_SEQ_IDS: u64 = 12;
const VOCAB: u32 = 3;
const STEM_LEN: usize = 40;

/// A sequence chosen when the operation runs: mostly a live one (or, for new sequences, an
/// unused id), sometimes any id, so that error paths get exercised too.
#[derive(Clone, Copy, Debug)]
struct Pick(u16);

#[derive(Clone, Debug)]
enum Op {
    /// Prompt: the first `len` tokens of stem `stem`, its last token replaced by `last`;
    /// with `chunk`, slots for that many tokens only (`allocate_group_slots`).
    Allocate {
        seq: Pick,
        stem: usize,
        len: usize,
        last: Option<u32>,
        chunk: Option<usize>,
        /// The request's cache salt: none, or one of two (see [`keys`]).
        salt: u8,
    },
    /// Slots for `by` more prompt tokens of a prompt admitted in part (`grow_to`); on a
    /// whole sequence, nothing to do.
    Grow {
        seq: Pick,
        by: usize,
    },
    Append {
        seq: Pick,
        token: u32,
    },
    /// One decode step's appends: every sequence on the device, if all fit.
    AppendAll {
        token: u32,
    },
    Fork {
        parent: Pick,
        child: Pick,
    },
    Free {
        seq: Pick,
    },
    /// Swap the whole family of a sequence (it and everything forked from the same prompt).
    SwapOutFamily {
        seq: Pick,
    },
    SwapInFamily {
        seq: Pick,
    },
    /// Arbitrary sets, including malformed ones and partial families.
    SwapOut {
        seqs: Vec<Pick>,
    },
    SwapIn {
        seqs: Vec<Pick>,
    },
    /// End the step: execute the plan, run the forward pass, check every computed slot.
    Step,
    /// A speculative step of one sequence: a step boundary, a slot for each proposed token
    /// (as many as fit), the plan executed and every new slot written, then the slots past
    /// the first `accept` proposals given back before the verified tokens are marked
    /// computed.
    Speculate {
        seq: Pick,
        proposed: Vec<u32>,
        accept: usize,
    },
    /// A truncation at any moment to any length (often refused).
    Truncate {
        seq: Pick,
        keep: usize,
    },
    /// Pin the cached blocks of the first `len` tokens of a stem (refused when none is
    /// cached or the pins would hold too much).
    Pin {
        stem: usize,
        len: usize,
    },
    Unpin {
        pin: Pick,
    },
    /// Forget the cached blocks of a stem's prefix.
    Forget {
        stem: usize,
        len: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let pick = || any::<u16>().prop_map(Pick);
    let picks = || proptest::collection::vec(pick(), 0..4);
    prop_oneof![
        4 => (
            (
                pick(),
                0..3usize,
                1..=STEM_LEN,
                proptest::option::of(0..VOCAB + 1),
                proptest::option::of(0..STEM_LEN),
            ),
            0..3u8,
        )
            .prop_map(|((seq, stem, len, last, chunk), salt)| Op::Allocate {
                seq,
                stem,
                len,
                last,
                chunk,
                salt
            }),
        3 => (pick(), 1..12usize).prop_map(|(seq, by)| Op::Grow { seq, by }),
        4 => (pick(), 0..VOCAB).prop_map(|(seq, token)| Op::Append { seq, token }),
        4 => (0..VOCAB).prop_map(|token| Op::AppendAll { token }),
        3 => (pick(), pick()).prop_map(|(parent, child)| Op::Fork { parent, child }),
        2 => pick().prop_map(|seq| Op::Free { seq }),
        2 => pick().prop_map(|seq| Op::SwapOutFamily { seq }),
        2 => pick().prop_map(|seq| Op::SwapInFamily { seq }),
        1 => picks().prop_map(|seqs| Op::SwapOut { seqs }),
        1 => picks().prop_map(|seqs| Op::SwapIn { seqs }),
        4 => Just(Op::Step),
        3 => (pick(), proptest::collection::vec(0..VOCAB, 1..6), 0..6usize)
            .prop_map(|(seq, proposed, accept)| Op::Speculate { seq, proposed, accept }),
        1 => (pick(), 0..2 * STEM_LEN).prop_map(|(seq, keep)| Op::Truncate { seq, keep }),
        1 => (0..3usize, 1..=STEM_LEN).prop_map(|(stem, len)| Op::Pin { stem, len }),
        1 => pick().prop_map(|pin| Op::Unpin { pin }),
        1 => (0..3usize, 1..=STEM_LEN).prop_map(|(stem, len)| Op::Forget { stem, len }),
    ]
}

fn config() -> impl Strategy<Value = CacheConfig> {
    (
        2..=8usize,
        16..=48usize,
        8..=32usize,
        0..=3usize,
        any::<bool>(),
        0..=2u8,
        any::<bool>(),
    )
        .prop_map(|(bs, device, host, watermark, prefix, tier, through)| {
            // A third of the runs keep no host tier, a third one of a quarter of the host
            // pool, a third one as large as the pool (competing with swapping for it).
            let tier = [0, host / 4, host][tier as usize];
            // Tier runs get small device pools, so that cached blocks are evicted (and
            // found again below) often.
            let device = if tier > 0 && prefix {
                8 + device / 4
            } else {
                device
            };
            let config = CacheConfig::new(bs, device, host)
                .with_watermark_blocks(watermark)
                .with_prefix_caching(prefix)
                .with_host_tier(tier);
            config.with_tier_write_through(through && config.has_host_tier())
        })
}

/// The simulated K/V value of every position: a hash of the token prefix up to it.
fn kv_values(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ u64::from(t) ^ 0x9e37_79b9_0000_0000).wrapping_mul(0x0100_0000_01b3);
            h
        })
        .collect()
}

struct SimSeq {
    tokens: Vec<u32>,
    /// Its request's cache salt (0: none).
    salt: u8,
    /// Tokens with a slot: all of them, or the leading part of a prompt admitted in part.
    slots: usize,
    computed: usize,
    family: u64,
}

struct Sim {
    m: BlockManager,
    bs: usize,
    stems: Vec<Vec<u32>>,
    seqs: BTreeMap<u64, SimSeq>,
    device_mem: Vec<Vec<Option<u64>>>,
    host_mem: Vec<Vec<Option<u64>>>,
    next_family: u64,
    copies: u64,
    swapped_out: u64,
    swapped_in: u64,
    window: Option<usize>,
    /// KV cache groups: `[None, window, window]`, or `None` for one table per sequence.
    groups: Option<Vec<Option<usize>>>,
    pins: Vec<PinId>,
}

/// What distinguishes group `g`'s K/V values from another group's at the same position.
fn salt(g: usize) -> u64 {
    (g as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// A request's extra keys for cache salt `salt` (0: none, else one of two salts), and what
/// its K/V values are marked with: a block computed under one salt and read under another
/// (a prefix hit that should not have been) reads back the wrong values.
fn keys(salt: u8) -> (ExtraKeys, u64) {
    match salt {
        0 => (ExtraKeys::NONE, 0),
        s => (
            ExtraKeys::with_salt(&format!("tenant {s}")),
            u64::from(s).wrapping_mul(0xd6e8_feb8_6659_fd93),
        ),
    }
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

impl Sim {
    fn new(
        config: CacheConfig,
        stems: Vec<Vec<u32>>,
        window: Option<usize>,
        grouped: bool,
    ) -> Self {
        let groups = window
            .filter(|_| grouped)
            .map(|w| vec![None, Some(w), Some(w)]);
        let m = BlockManager::new(config).unwrap();
        let m = match &groups {
            Some(g) => m.with_groups(KvGroups::new(g.clone(), 4 * STEM_LEN)),
            None => m,
        };
        Sim {
            m,
            bs: config.block_size,
            stems,
            seqs: BTreeMap::new(),
            device_mem: vec![vec![None; config.block_size]; config.num_device_blocks],
            host_mem: vec![vec![None; config.block_size]; config.num_host_blocks],
            next_family: 0,
            copies: 0,
            swapped_out: 0,
            swapped_in: 0,
            window,
            groups,
            pins: Vec::new(),
        }
    }

    fn num_groups(&self) -> usize {
        self.groups.as_ref().map_or(1, Vec::len)
    }

    /// The window of group `g` (every group's without groups).
    fn window_of(&self, g: usize) -> Option<usize> {
        match &self.groups {
            Some(gs) => gs[g],
            None => self.window,
        }
    }

    /// The forward pass writing positions `from..` of `seq` (up to its slots) in every
    /// group.
    fn write_kv(&mut self, seq: u64, from: usize) -> Result<(), TestCaseError> {
        let s = &self.seqs[&seq];
        let kv = kv_values(&s.tokens[..s.slots]);
        let mark = keys(s.salt).1;
        for g in 0..self.num_groups() {
            for (p, &value) in kv.iter().enumerate().skip(from) {
                let slot = self
                    .m
                    .slot_in(SeqId(seq), g, p)
                    .map_err(|e| fail(e.to_string()))?;
                self.device_mem[slot / self.bs][slot % self.bs] = Some(value ^ salt(g) ^ mark);
            }
        }
        Ok(())
    }

    /// A live sequence, preferably at `place`, or (one time in eight, or when none lives)
    /// any id.
    fn live(&self, p: Pick, place: Option<Location>) -> u64 {
        let live: Vec<u64> = self.seqs.keys().copied().collect();
        let there: Vec<u64> = (live.iter().copied())
            .filter(|&s| place.is_none_or(|l| self.m.location(SeqId(s)) == Ok(l)))
            .collect();
        let pool = if there.is_empty() { live } else { there };
        match pool.len() {
            n if n > 0 && !p.0.is_multiple_of(8) => pool[p.0 as usize / 8 % n],
            _ => u64::from(p.0) % NUM_SEQ_IDS,
        }
    }

    /// An unused id, or (one time in eight, or when all are taken) any id.
    fn unused(&self, p: Pick) -> u64 {
        let free: Vec<u64> = (0..NUM_SEQ_IDS)
            .filter(|s| !self.seqs.contains_key(s))
            .collect();
        match free.len() {
            n if n > 0 && !p.0.is_multiple_of(8) => free[p.0 as usize / 8 % n],
            _ => u64::from(p.0) % NUM_SEQ_IDS,
        }
    }

    fn on_device(&self, seq: u64) -> bool {
        self.m.location(SeqId(seq)) == Ok(Location::Device)
    }

    fn family(&self, seq: u64) -> Vec<SeqId> {
        match self.seqs.get(&seq) {
            None => vec![SeqId(seq)],
            Some(s) => (self.seqs.iter())
                .filter(|(_, o)| o.family == s.family)
                .map(|(&id, _)| SeqId(id))
                .collect(),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let before = self.m.clone();
        let (device, host) = (Some(Location::Device), Some(Location::Host));
        let outcome = match op {
            Op::Allocate {
                seq,
                stem,
                len,
                last,
                chunk,
                salt,
            } => {
                let prompt = self.prompt(*stem, *len, *last);
                self.allocate(self.unused(*seq), prompt, *chunk, *salt)?
            }
            Op::Grow { seq, by } => self.grow(self.live(*seq, device), *by)?,
            Op::Append { seq, token } => self.append(self.live(*seq, device), *token)?,
            Op::AppendAll { token } => self.append_all(*token)?,
            Op::Fork { parent, child } => {
                self.fork(self.live(*parent, None), self.unused(*child))?
            }
            Op::Free { seq } => {
                let seq = self.live(*seq, None);
                let r = self.m.free(SeqId(seq));
                prop_assert_eq!(r.is_ok(), self.seqs.remove(&seq).is_some());
                r
            }
            Op::SwapOutFamily { seq } => self.swap_out(&self.family(self.live(*seq, device)))?,
            Op::SwapInFamily { seq } => self.swap_in(&self.family(self.live(*seq, host)))?,
            Op::SwapOut { seqs } => {
                let group: Vec<SeqId> = seqs.iter().map(|&p| SeqId(self.live(p, device))).collect();
                self.swap_out(&group)?
            }
            Op::SwapIn { seqs } => {
                let group: Vec<SeqId> = seqs.iter().map(|&p| SeqId(self.live(p, host))).collect();
                self.swap_in(&group)?
            }
            Op::Step => self.step().map(Ok)?,
            Op::Speculate {
                seq,
                proposed,
                accept,
            } => self.speculate(*seq, proposed, *accept)?,
            Op::Truncate { seq, keep } => self.truncate(self.live(*seq, device), *keep)?,
            Op::Pin { stem, len } => {
                let r = self.m.pin_prefix(&self.stems[*stem][..*len]);
                if let Ok((pin, held)) = r {
                    prop_assert!(held > 0 && held <= *len && held % self.bs == 0);
                    self.pins.push(pin);
                }
                r.map(|_| ())
            }
            Op::Unpin { pin } => {
                let r = match self.pins.len() {
                    0 => self.m.unpin(PinId(u64::from(pin.0))),
                    n => self.m.unpin(self.pins.remove(pin.0 as usize % n)),
                };
                r.map(|_| ())
            }
            Op::Forget { stem, len } => {
                self.m.forget_prefix(&self.stems[*stem][..*len]);
                Ok(())
            }
        };
        self.m
            .check_invariants()
            .map_err(|e| fail(format!("after {op:?}: {e}")))?;
        if let Err(e) = &outcome {
            prop_assert!(
                self.m == before,
                "failed {:?} ({}) changed the manager",
                op,
                e
            );
        }
        prop_assert_eq!(self.m.sequences().count(), self.seqs.len());
        for (&id, s) in &self.seqs {
            prop_assert_eq!(self.m.num_tokens(SeqId(id)), Ok(s.slots));
            prop_assert_eq!(self.m.num_computed_tokens(SeqId(id)), Ok(s.computed));
        }
        let seqs = &self.seqs;
        self.m
            .check_contents(|id| seqs.get(&id.0).map(|s| s.tokens.as_slice()))
            .map_err(|e| fail(format!("after {op:?}: {e}")))?;
        let st = self.m.stats();
        prop_assert_eq!(
            st.device.used + st.device.free + st.device.cached,
            st.device.total
        );
        prop_assert_eq!(st.host.used + st.host.free + st.host.cached, st.host.total);
        prop_assert_eq!(st.cow_copies, self.copies);
        prop_assert_eq!(st.swapped_out_blocks, self.swapped_out);
        prop_assert_eq!(st.swapped_in_blocks, self.swapped_in);
        Ok(())
    }

    /// The first `len` tokens of stem `stem`, its last token replaced by `last`.
    fn prompt(&self, stem: usize, len: usize, last: Option<u32>) -> Vec<u32> {
        let mut prompt = self.stems[stem][..len].to_vec();
        if let Some(t) = last {
            prompt[len - 1] = t;
        }
        prompt
    }

    fn allocate(
        &mut self,
        seq: u64,
        prompt: Vec<u32>,
        chunk: Option<usize>,
        salt: u8,
    ) -> Result<Result<(), CacheError>, TestCaseError> {
        let len = prompt.len();
        let slots = chunk.unwrap_or(len);
        let extra = keys(salt).0;
        let status = self
            .m
            .can_allocate_group_slots_keyed(extra, &[(&prompt, slots)]);
        let r = match (chunk, salt) {
            (None, 0) => self.m.allocate(SeqId(seq), &prompt),
            (chunk, _) => self
                .m
                .allocate_group_slots_keyed(extra, &[(SeqId(seq), &prompt, chunk.unwrap_or(len))])
                .map(|v| v[0]),
        };
        if self.seqs.contains_key(&seq) {
            prop_assert_eq!(r, Err(CacheError::SequenceExists(SeqId(seq))));
            return Ok(Err(CacheError::SequenceExists(SeqId(seq))));
        }
        match (status, &r) {
            (AllocStatus::Now, Ok(_))
            | (AllocStatus::Later, Err(CacheError::OutOfBlocks { .. }))
            | (AllocStatus::Never, Err(CacheError::ExceedsCapacity { .. })) => {}
            _ => {
                return Err(fail(format!(
                    "can_allocate said {status:?}, allocate {r:?}"
                )))
            }
        }
        if let Ok(cached) = r {
            prop_assert!(cached < prompt.len() && cached % self.bs == 0);
            prop_assert!(cached == 0 || self.m.config().enable_prefix_caching);
            prop_assert!(self.m.num_available_device_blocks() >= self.m.watermark_blocks());
            // Slots for the chunk, but at least the cache hits and one token, at most all.
            let slots = slots.clamp(cached + 1, prompt.len());
            prop_assert_eq!(self.m.num_tokens(SeqId(seq)), Ok(slots));
            let family = self.next_family;
            self.next_family += 1;
            self.seqs.insert(
                seq,
                SimSeq {
                    tokens: prompt,
                    salt,
                    slots,
                    computed: cached,
                    family,
                },
            );
        }
        Ok(r.map(|_| ()))
    }

    /// One more slot: for a new token, or (a prompt admitted in part) its next prompt token.
    fn append(&mut self, seq: u64, token: u32) -> Result<Result<(), CacheError>, TestCaseError> {
        let id = SeqId(seq);
        let can = self.m.can_append_slot(id);
        let r = self.m.append_slot(id);
        prop_assert_eq!(can, r.is_ok(), "can_append_slot disagrees: {:?}", r);
        match (self.seqs.get_mut(&seq), &r) {
            (None, _) => prop_assert_eq!(&r, &Err(CacheError::UnknownSequence(id))),
            (Some(s), Ok(out)) => {
                if s.slots == s.tokens.len() {
                    s.tokens.push(token);
                }
                s.slots += 1;
                prop_assert_eq!(self.m.slot(id, s.slots - 1), Ok(out.slot));
                // A copy-on-write happens in every KV cache group at once: sharing is made (fork,
                // prefix hit) and written (the last block) alike in all of them.
                self.copies += out.copy.is_some() as u64 * self.num_groups() as u64;
            }
            (Some(_), Err(_)) => {}
        }
        Ok(r.map(|_| ()))
    }

    fn append_all(&mut self, token: u32) -> Result<Result<(), CacheError>, TestCaseError> {
        let running: Vec<u64> = self
            .seqs
            .keys()
            .copied()
            .filter(|&s| self.on_device(s))
            .collect();
        let ids: Vec<SeqId> = running.iter().map(|&s| SeqId(s)).collect();
        let needed = self
            .m
            .blocks_needed_to_append(&ids)
            .map_err(|e| fail(e.to_string()))?;
        let available = self.m.num_available_device_blocks();
        prop_assert_eq!(self.m.can_append_slots(&ids), needed <= available);
        if needed > available {
            return Ok(Ok(()));
        }
        for seq in running {
            prop_assert!(
                self.append(seq, token)?.is_ok(),
                "append of a checked batch failed"
            );
        }
        prop_assert_eq!(available - self.m.num_available_device_blocks(), needed);
        Ok(Ok(()))
    }

    /// Slots for `by` more tokens of a prompt admitted in part, all or none.
    fn grow(&mut self, seq: u64, by: usize) -> Result<Result<(), CacheError>, TestCaseError> {
        let id = SeqId(seq);
        let target = self
            .seqs
            .get(&seq)
            .map_or(by, |s| (s.slots + by).min(s.tokens.len()));
        let needed = self.m.blocks_needed_to_grow(&[(id, target)]);
        let can = self.m.can_grow(&[(id, target)]);
        let available = self.m.num_available_device_blocks();
        let copies = self.m.pending_ops().copies.len();
        let r = self.m.grow_to(id, target);
        prop_assert_eq!(can, r.is_ok(), "can_grow disagrees: {:?}", r);
        // The first new slot may land in a block the sequence shares (copy-on-write), as
        // an append's would; the plan's copies are checked against memory at the step.
        self.copies += (self.m.pending_ops().copies.len() - copies) as u64;
        if let Ok(()) = r {
            let s = self.seqs.get_mut(&seq).unwrap();
            prop_assert_eq!(Ok(available - self.m.num_available_device_blocks()), needed);
            s.slots = s.slots.max(target);
        }
        Ok(r)
    }

    fn fork(&mut self, parent: u64, child: u64) -> Result<Result<(), CacheError>, TestCaseError> {
        let r = self.m.fork(SeqId(parent), SeqId(child));
        let expected = match (self.seqs.get(&parent), self.seqs.contains_key(&child)) {
            (None, _) => Err(CacheError::UnknownSequence(SeqId(parent))),
            (Some(_), true) => Err(CacheError::SequenceExists(SeqId(child))),
            (Some(p), false) => {
                let copy = SimSeq {
                    tokens: p.tokens.clone(),
                    salt: p.salt,
                    slots: p.slots,
                    computed: p.computed,
                    family: p.family,
                };
                self.seqs.insert(child, copy);
                Ok(())
            }
        };
        prop_assert_eq!(&r, &expected);
        Ok(r)
    }

    /// Each sequence of `group` in each KV cache group.
    fn kv_seqs(&self, group: &[SeqId]) -> Vec<(SeqId, usize)> {
        let n = self.num_groups();
        group
            .iter()
            .flat_map(|&s| (0..n).map(move |g| (s, g)))
            .collect()
    }

    fn swap_out(&mut self, group: &[SeqId]) -> Result<Result<(), CacheError>, TestCaseError> {
        let kv = self.kv_seqs(group);
        let tables: Option<Vec<Vec<DeviceBlockId>>> = kv
            .iter()
            .map(|&(s, g)| self.m.block_table_in(s, g).ok().map(<[_]>::to_vec))
            .collect();
        let can = self.m.can_swap_out(group);
        let r = self.m.swap_out(group);
        prop_assert_eq!(can, r.is_ok(), "can_swap_out disagrees: {:?}", r);
        let Ok(pairs) = r else {
            return Ok(r.map(|_| ()));
        };
        let tables =
            tables.ok_or_else(|| fail("swapped out a sequence not on the device".into()))?;
        let map: HashMap<DeviceBlockId, HostBlockId> = pairs.iter().copied().collect();
        let distinct: HashSet<DeviceBlockId> = tables.iter().flatten().copied().collect();
        prop_assert_eq!(map.len(), pairs.len());
        prop_assert_eq!(map.keys().copied().collect::<HashSet<_>>(), distinct);
        let mut entries: HashMap<HostBlockId, u32> = HashMap::new();
        for (&(seq, g), table) in kv.iter().zip(&tables) {
            let host = self
                .m
                .host_block_table_in(seq, g)
                .map_err(|e| fail(e.to_string()))?;
            let expected: Vec<HostBlockId> = table.iter().map(|d| map[d]).collect();
            prop_assert_eq!(host, &expected[..], "sharing not preserved on the host");
            for &h in host {
                *entries.entry(h).or_default() += 1;
            }
        }
        for (h, n) in entries {
            prop_assert_eq!(self.m.host_refcount(h), Some(n));
        }
        self.swapped_out += pairs.len() as u64;
        Ok(Ok(()))
    }

    fn swap_in(&mut self, group: &[SeqId]) -> Result<Result<(), CacheError>, TestCaseError> {
        let kv = self.kv_seqs(group);
        let tables: Option<Vec<Vec<HostBlockId>>> = kv
            .iter()
            .map(|&(s, g)| self.m.host_block_table_in(s, g).ok().map(<[_]>::to_vec))
            .collect();
        let status = self.m.can_swap_in(group);
        // Unknown sequences go in with no tokens: the manager refuses them by id first.
        let with_tokens: Vec<(SeqId, &[u32])> = group
            .iter()
            .map(|&id| (id, self.seqs.get(&id.0).map_or(&[][..], |s| &s.tokens)))
            .collect();
        let r = self.m.swap_in(&with_tokens);
        prop_assert_eq!(
            status == AllocStatus::Now,
            r.is_ok(),
            "can_swap_in disagrees: {:?}",
            r
        );
        let Ok(pairs) = r else {
            return Ok(r.map(|_| ()));
        };
        let tables = tables.ok_or_else(|| fail("swapped in a sequence not on the host".into()))?;
        let map: HashMap<HostBlockId, DeviceBlockId> = pairs.iter().copied().collect();
        let distinct: HashSet<HostBlockId> = tables.iter().flatten().copied().collect();
        prop_assert_eq!(map.keys().copied().collect::<HashSet<_>>(), distinct);
        prop_assert_eq!(map.values().collect::<HashSet<_>>().len(), pairs.len());
        let mut entries: HashMap<DeviceBlockId, u32> = HashMap::new();
        for (&(seq, g), table) in kv.iter().zip(&tables) {
            let device = self
                .m
                .block_table_in(seq, g)
                .map_err(|e| fail(e.to_string()))?;
            let expected: Vec<DeviceBlockId> = table.iter().map(|h| map[h]).collect();
            prop_assert_eq!(device, &expected[..], "sharing not preserved on the device");
            for &d in device {
                *entries.entry(d).or_default() += 1;
            }
        }
        for (d, n) in entries {
            prop_assert_eq!(self.m.device_refcount(d), Some(n));
        }
        prop_assert!(self.m.num_available_device_blocks() >= self.m.watermark_blocks());
        self.swapped_in += pairs.len() as u64;
        Ok(Ok(()))
    }

    /// Executes the plan in the documented order, runs the forward pass, checks all slots.
    fn speculate(
        &mut self,
        pick: Pick,
        proposed: &[u32],
        accept: usize,
    ) -> Result<Result<(), CacheError>, TestCaseError> {
        self.step()?;
        let seq = self.live(pick, Some(Location::Device));
        if !self.seqs.contains_key(&seq) || !self.on_device(seq) {
            let before = self.m.clone();
            prop_assert!(self.m.truncate(SeqId(seq), 1).is_err());
            prop_assert!(self.m == before);
            return Ok(Ok(()));
        }
        if self.seqs[&seq].slots < self.seqs[&seq].tokens.len() {
            return Ok(Ok(())); // a prompt still being computed proposes nothing
        }
        let start = self.seqs[&seq].tokens.len();
        for &t in proposed {
            if self.append(seq, t)?.is_err() {
                break;
            }
        }
        let len = self.seqs[&seq].tokens.len();
        self.execute_plan()?;
        // The forward pass writes every new slot, the rejected ones too.
        self.write_kv(seq, start)?;
        let keep = start + accept.min(len - start);
        let dropped = (len.div_ceil(self.bs) - keep.div_ceil(self.bs)) * self.num_groups();
        prop_assert_eq!(self.m.truncate(SeqId(seq), keep), Ok(dropped));
        let s = self.seqs.get_mut(&seq).unwrap();
        s.tokens.truncate(keep);
        s.slots = keep;
        s.computed = keep;
        self.m
            .mark_computed(SeqId(seq), &s.tokens)
            .map_err(|e| fail(e.to_string()))?;
        Ok(Ok(()))
    }

    fn truncate(&mut self, seq: u64, keep: usize) -> Result<Result<(), CacheError>, TestCaseError> {
        let r = self.m.truncate(SeqId(seq), keep);
        match (self.seqs.get_mut(&seq), &r) {
            (None, _) => prop_assert_eq!(&r, &Err(CacheError::UnknownSequence(SeqId(seq)))),
            (Some(s), Ok(_)) => {
                prop_assert!(s.computed <= keep && keep <= s.slots);
                // Generated tokens go with their slots; a prompt admitted in part keeps its
                // tokens and gives back slots only.
                if s.slots == s.tokens.len() {
                    s.tokens.truncate(keep);
                }
                s.slots = keep;
            }
            (Some(_), Err(_)) => {}
        }
        Ok(r.map(|_| ()))
    }

    /// Executes the step's plan on the simulated memory: swaps out, swaps in, copies.
    fn execute_plan(&mut self) -> Result<(), TestCaseError> {
        let ops = self.m.take_ops();
        check_gpu_preconditions(&ops)?;
        prop_assert_eq!(ops.check(), Ok(()));
        for &(d, h) in &ops.swap_out {
            self.host_mem[h.0 as usize] = self.device_mem[d.0 as usize].clone();
        }
        for &(h, d) in &ops.swap_in {
            self.device_mem[d.0 as usize] = self.host_mem[h.0 as usize].clone();
        }
        // All copies at once, as one kernel dispatch: read every source, then write.
        let staged: Vec<_> = (ops.copies.iter())
            .map(|&(s, _)| self.device_mem[s.0 as usize].clone())
            .collect();
        for (&(_, d), content) in ops.copies.iter().zip(staged) {
            self.device_mem[d.0 as usize] = content;
        }
        Ok(())
    }

    fn step(&mut self) -> Result<(), TestCaseError> {
        self.execute_plan()?;
        let bs = self.bs;
        let ids: Vec<u64> = self.seqs.keys().copied().collect();
        for id in ids {
            if !self.on_device(id) {
                continue;
            }
            self.write_kv(id, self.seqs[&id].computed)?;
            let s = self.seqs.get_mut(&id).unwrap();
            s.computed = s.slots;
            self.m
                .mark_computed(SeqId(id), &s.tokens[..s.slots])
                .map_err(|e| fail(e.to_string()))?;
            if let Some(gs) = &self.groups {
                let before: Vec<usize> = (0..gs.len())
                    .map(|g| self.m.released_blocks_in(SeqId(id), g).unwrap())
                    .collect();
                let n = self
                    .m
                    .release_group_windows(SeqId(id))
                    .map_err(|e| fail(e.to_string()))?;
                let mut released = 0;
                for (g, w) in gs.iter().enumerate() {
                    let after = self.m.released_blocks_in(SeqId(id), g).unwrap();
                    released += after - before[g];
                    let want = match w {
                        None => 0,
                        Some(w) => ((s.computed + 1).saturating_sub(*w) / bs)
                            .min(s.slots.div_ceil(bs) - 1)
                            .max(before[g]),
                    };
                    prop_assert_eq!(after, want, "{} holes in group {}", SeqId(id), g);
                }
                prop_assert_eq!(released, n);
                self.m.check_invariants().map_err(fail)?;
            } else if let Some(w) = self.window {
                let before = self.m.released_blocks(SeqId(id)).unwrap();
                let n = self
                    .m
                    .release_out_of_window(SeqId(id), w)
                    .map_err(|e| fail(e.to_string()))?;
                let after = self.m.released_blocks(SeqId(id)).unwrap();
                prop_assert_eq!(after, before + n);
                // Exactly the blocks wholly before the window are holes (never the last).
                let want = ((s.computed + 1).saturating_sub(w) / bs)
                    .min(s.slots.div_ceil(bs) - 1)
                    .max(before);
                prop_assert_eq!(after, want, "{} holes", SeqId(id));
                self.m.check_invariants().map_err(fail)?;
            }
        }
        self.check_memory()
    }

    /// Every computed token reads back its own value, on the device or on the host.
    fn check_memory(&self) -> Result<(), TestCaseError> {
        for g in 0..self.num_groups() {
            self.check_group_memory(g)?;
        }
        Ok(())
    }

    fn check_group_memory(&self, g: usize) -> Result<(), TestCaseError> {
        let bs = self.bs;
        for (&id, s) in &self.seqs {
            let mark = keys(s.salt).1;
            let kv: Vec<u64> = kv_values(&s.tokens)
                .iter()
                .map(|v| v ^ salt(g) ^ mark)
                .collect();
            let seq = SeqId(id);
            let (mem, table): (&Vec<Vec<Option<u64>>>, Vec<usize>) = match self.m.location(seq) {
                Ok(Location::Device) => {
                    prop_assert_eq!(self.m.num_computed_tokens(seq), Ok(s.computed));
                    let t = self.m.block_table_in(seq, g).unwrap();
                    (&self.device_mem, t.iter().map(|b| b.0 as usize).collect())
                }
                _ => {
                    let t = self.m.host_block_table_in(seq, g).unwrap();
                    (&self.host_mem, t.iter().map(|b| b.0 as usize).collect())
                }
            };
            let holes = self.m.released_blocks_in(seq, g).unwrap();
            if let Some(w) = self.window_of(g) {
                let seen_from = (s.computed + 1).saturating_sub(w);
                prop_assert!(
                    holes * bs <= seen_from,
                    "{} released a block in its window",
                    seq
                );
            } else {
                prop_assert_eq!(holes, 0);
            }
            for (p, &value) in kv.iter().enumerate().take(s.computed).skip(holes * bs) {
                let got = mem[table[p / bs - holes]][p % bs];
                prop_assert_eq!(got, Some(value), "{} position {} is wrong", seq, p);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), TestCaseError> {
        self.step()?;
        for pin in std::mem::take(&mut self.pins) {
            self.m.unpin(pin).map_err(|e| fail(e.to_string()))?;
        }
        for id in std::mem::take(&mut self.seqs).into_keys() {
            self.m.free(SeqId(id)).map_err(|e| fail(e.to_string()))?;
        }
        self.m.take_ops();
        self.m.check_invariants().map_err(fail)?;
        let st = self.m.stats();
        prop_assert_eq!((st.device.used, st.host.used), (0, 0), "blocks leaked");
        prop_assert_eq!(self.m.num_available_device_blocks(), st.device.total);
        Ok(())
    }
}

/// What `kernels::copy_blocks` and the swap copies need, checked without the library.
fn check_gpu_preconditions(ops: &BlockOps) -> Result<(), TestCaseError> {
    let sources: HashSet<_> = ops.copies.iter().map(|p| p.0).collect();
    let mut copy_dsts = HashSet::new();
    for &(_, d) in &ops.copies {
        prop_assert!(copy_dsts.insert(d), "copy destination {} twice", d);
        prop_assert!(
            !sources.contains(&d),
            "{} is a copy source and destination",
            d
        );
    }
    let mut swap_in_dsts = HashSet::new();
    for &(_, d) in &ops.swap_in {
        prop_assert!(
            swap_in_dsts.insert(d) && !copy_dsts.contains(&d),
            "{} written twice",
            d
        );
    }
    let mut swap_out_dsts = HashSet::new();
    for &(_, h) in &ops.swap_out {
        prop_assert!(swap_out_dsts.insert(h), "host block {} written twice", h);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_runs_keep_invariants_and_kv_contents(
        config in config(),
        stems in proptest::collection::vec(proptest::collection::vec(0..VOCAB, STEM_LEN), 3),
        ops in proptest::collection::vec(op(), 1..200),
        window in proptest::option::of(1usize..12),
        grouped in any::<bool>(),
    ) {
        let mut sim = Sim::new(config, stems, window, grouped);
        for op in &ops {
            sim.apply(op)?;
        }
        sim.finish()?;
    }
}
