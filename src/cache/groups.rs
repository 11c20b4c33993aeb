//! KV cache groups: models that mix sliding-window and global layers (Gemma 2 and 3, Qwen
//! with `max_window_layers`) keep one block table per group of layers, so that the windowed
//! groups give back the blocks their window has left while the global group keeps all of
//! its own.
//!
//! The layers are split into groups of one window each, and every group holds the same
//! number of layers (`slabs`; a class of layers whose count is not a multiple of it ends
//! in a group with unused slabs). A block then has the same size in every group, so all
//! groups share one device pool, one host pool, one free list, one prefix cache and one
//! watermark: a block is a block, whichever group's table points at it. This is how vLLM
//! v1's hybrid allocator lays out Gemma 3 (same-sized pages per group); the difference is
//! that our groups are whole block tables of the block manager, not a second allocator.
//!
//! Inside the manager each engine sequence is one *KV sequence* per group: group 0 keeps
//! the engine's id, group `g` uses the id with `g` in its top byte ([`kv_id`]). Every
//! operation on a sequence (admit, grow, fork, copy-on-write, swap, free) is applied to all
//! its KV sequences at once, after one check of the whole, so a sequence is admitted,
//! preempted, swapped and freed as a whole. Block names are chained from a root per group
//! ([`KvGroups::root`]: none for group 0, so a one-group manager names blocks as it always
//! did), and a prefix hit counts only as far as every group has it.

use super::block_table::blocks_for;
use super::ids::SeqId;
use super::prefix::{hash_block, BlockHash, ExtraKeys};

/// Bits of a [`SeqId`] below the group index of a KV sequence.
const GROUP_SHIFT: u32 = 56;

/// The id of sequence `seq`'s KV sequence in group `g` (`seq` itself for group 0).
pub(crate) fn kv_id(seq: SeqId, g: usize) -> SeqId {
    SeqId(seq.0 | (g as u64) << GROUP_SHIFT)
}

/// The group of a KV sequence.
pub(crate) fn group_of(id: SeqId) -> usize {
    (id.0 >> GROUP_SHIFT) as usize
}

/// The engine sequence a KV sequence belongs to.
pub(crate) fn engine_id(id: SeqId) -> SeqId {
    SeqId(id.0 & ((1 << GROUP_SHIFT) - 1))
}

/// Largest sequence id a manager with several groups takes.
pub const MAX_GROUPED_SEQ_ID: u64 = (1 << GROUP_SHIFT) - 1;

/// The block manager's groups: one sliding window (or none) per group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroups {
    windows: Vec<Option<usize>>,
    /// Most tokens one step computes for one sequence (the scheduler's token budget): a
    /// windowed group holds at most its window plus one such chunk.
    chunk_tokens: usize,
}

impl Default for KvGroups {
    fn default() -> Self {
        KvGroups {
            windows: vec![None],
            chunk_tokens: usize::MAX,
        }
    }
}

impl KvGroups {
    /// Groups with these windows, for steps of at most `chunk_tokens` tokens per sequence.
    /// No windows, or more than 255 groups (the group index has one byte of a sequence
    /// id), give one group without a window.
    pub fn new(windows: Vec<Option<usize>>, chunk_tokens: usize) -> Self {
        let windows = if windows.is_empty() || windows.len() > 255 {
            vec![None]
        } else {
            windows
        };
        KvGroups {
            windows,
            chunk_tokens: chunk_tokens.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn window(&self, g: usize) -> Option<usize> {
        self.windows.get(g).copied().flatten()
    }

    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// The name a chain of block names starts from in group `g` for a request with extra
    /// keys `keys`: without keys none for group 0 (so names are the same as without groups)
    /// and a fixed per-group value otherwise; with keys a value of both.
    pub fn root(&self, g: usize, keys: ExtraKeys) -> Option<BlockHash> {
        const TAG: u32 = 0x6b76_6772;
        match keys.digest() {
            None => (g > 0).then(|| hash_block(None, &[TAG, g as u32])),
            Some(k) => Some(hash_block(Some(k), &[TAG, g as u32])),
        }
    }

    /// Most blocks a sequence ever holds at once in windowed group `g` (`None` for a
    /// global group). After a step has computed `n` tokens, the blocks before position
    /// `n + 1 - w` are released; the next step grows the table by its chunk of at most `c`
    /// tokens, to position `n + c - 1`. Those `w + c - 1` positions span at most
    /// `ceil((w + c - 2) / block_size) + 1` blocks.
    pub fn held_blocks_cap(&self, g: usize, block_size: usize) -> Option<usize> {
        let w = self.window(g)?.max(1);
        let chunk = self.chunk_tokens.min(usize::MAX / 4);
        Some((w + chunk - 2).div_ceil(block_size) + 1)
    }

    /// Blocks a sequence whose table covers `from` tokens takes to cover `to` (`from <=
    /// to`), summed over the groups; a windowed group counts no more than it ever holds.
    pub fn blocks_between(&self, from: usize, to: usize, block_size: usize) -> usize {
        let more = blocks_for(to, block_size).saturating_sub(blocks_for(from, block_size));
        (0..self.len())
            .map(|g| match self.held_blocks_cap(g, block_size) {
                Some(cap) => more.min(cap),
                None => more,
            })
            .sum()
    }

    /// Leading hit blocks a new KV sequence of group `g` with `hits` cached blocks leaves as
    /// holes: those its first query (at position `hits * block_size`) cannot see.
    pub(crate) fn skipped_hits(&self, g: usize, hits: usize, block_size: usize) -> usize {
        match self.window(g) {
            Some(w) => ((hits * block_size + 1).saturating_sub(w.max(1)) / block_size).min(hits),
            None => 0,
        }
    }
}

/// How a model's layers map onto KV cache groups and onto the slabs of a pool block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGroups {
    /// Per layer: (group, slab within the group's blocks).
    pub layer_slots: Vec<(usize, usize)>,
    /// Per group: its window.
    pub windows: Vec<Option<usize>>,
    /// Layers a block holds.
    pub slabs: usize,
}

impl LayerGroups {
    /// One group of every layer: how the cache is laid out without groups.
    pub fn single(num_layers: usize) -> Self {
        LayerGroups {
            layer_slots: (0..num_layers).map(|l| (0, l)).collect(),
            windows: vec![None],
            slabs: num_layers,
        }
    }

    /// Groups for layers with these windows, when splitting pays: some layer's window is
    /// shorter than `max_model_len` and not every layer has the same one (a model whose
    /// layers all slide releases whole blocks already). Layers are classed by window; the
    /// group size is the smallest class's layer count, and each class is cut into groups of
    /// that many layers in layer order (its last group may have unused slabs). Otherwise
    /// one group of every layer.
    pub fn plan(windows: &[Option<usize>], max_model_len: usize) -> Self {
        let n = windows.len();
        let short = |w: &Option<usize>| w.is_some_and(|w| w < max_model_len);
        let mut classes: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for (l, w) in windows.iter().enumerate() {
            // A window as long as the context is no window.
            let w = if short(w) { *w } else { None };
            match classes.iter_mut().find(|c| c.0 == w) {
                Some(c) => c.1.push(l),
                None => classes.push((w, vec![l])),
            }
        }
        if classes.len() < 2 || classes.len() > 255 {
            return Self::single(n);
        }
        // The global class first, so that its blocks are group 0's.
        classes.sort_by_key(|c| c.0.is_some());
        let slabs = classes.iter().map(|c| c.1.len()).min().unwrap_or(n);
        let mut layer_slots = vec![(0, 0); n];
        let mut groups = Vec::new();
        for (window, layers) in &classes {
            for chunk in layers.chunks(slabs) {
                for (slab, &l) in chunk.iter().enumerate() {
                    layer_slots[l] = (groups.len(), slab);
                }
                groups.push(*window);
            }
        }
        if groups.len() > 255 {
            return Self::single(n);
        }
        LayerGroups {
            layer_slots,
            windows: groups,
            slabs,
        }
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_1b_splits_into_one_global_and_six_local_groups_of_four() {
        // 26 layers, every sixth global, window 512, context 32K.
        let windows: Vec<Option<usize>> = (0..26)
            .map(|i| if (i + 1) % 6 == 0 { None } else { Some(512) })
            .collect();
        let p = LayerGroups::plan(&windows, 32768);
        assert_eq!(p.slabs, 4);
        assert_eq!(p.num_groups(), 7);
        assert_eq!(p.windows[0], None);
        assert!(p.windows[1..].iter().all(|&w| w == Some(512)));
        for (l, &(g, slab)) in p.layer_slots.iter().enumerate() {
            assert_eq!(g == 0, windows[l].is_none(), "layer {l}");
            assert!(slab < 4);
        }
        // Every (group, slab) is used by one layer at most.
        let mut seen = std::collections::HashSet::new();
        assert!(p.layer_slots.iter().all(|s| seen.insert(*s)));
        // Global layers 5, 11, 17, 23 in order.
        assert_eq!(&p.layer_slots[5], &(0, 0));
        assert_eq!(&p.layer_slots[23], &(0, 3));
    }

    #[test]
    fn uniform_or_long_windows_keep_one_group() {
        assert_eq!(LayerGroups::plan(&[Some(8); 4], 256).num_groups(), 1);
        assert_eq!(LayerGroups::plan(&[None; 4], 256).num_groups(), 1);
        // A window as long as the context is no window.
        let p = LayerGroups::plan(&[Some(256), None, Some(256)], 256);
        assert_eq!(p, LayerGroups::single(3));
    }

    #[test]
    fn alternating_layers_make_two_groups() {
        let p = LayerGroups::plan(&[Some(8), None, Some(8), None], 256);
        assert_eq!(p.slabs, 2);
        assert_eq!(p.windows, vec![None, Some(8)]);
        assert_eq!(p.layer_slots, vec![(1, 0), (0, 0), (1, 1), (0, 1)]);
    }

    #[test]
    fn ids_roots_and_caps() {
        let s = SeqId(41);
        assert_eq!(kv_id(s, 0), s);
        let k = kv_id(s, 3);
        assert_eq!((group_of(k), engine_id(k)), (3, s));
        let g = KvGroups::new(vec![None, Some(32)], 16);
        let none = ExtraKeys::NONE;
        assert_eq!(g.root(0, none), None);
        assert!(g.root(1, none).is_some() && g.root(1, none) != g.root(2, none));
        // A salt moves every group's root, and two salts apart.
        let (a, b) = (ExtraKeys::with_salt("a"), ExtraKeys::with_salt("b"));
        assert!(g.root(0, a).is_some() && g.root(0, a) != g.root(0, b));
        assert!(g.root(1, a) != g.root(1, none) && g.root(1, a) != g.root(2, a));
        // Window 32 and chunks of 16 at block size 16: 47 positions, 4 blocks at most (a
        // window starting at the last slot of a block reaches into the third one after).
        assert_eq!(g.held_blocks_cap(1, 16), Some(4));
        assert_eq!(g.held_blocks_cap(0, 16), None);
        assert_eq!(g.blocks_between(0, 160, 16), 10 + 4);
        // A window of 1 decoding one token a step holds the block being written only.
        assert_eq!(
            KvGroups::new(vec![Some(1)], 1).held_blocks_cap(0, 16),
            Some(1)
        );
        // 3 hit blocks of 16 with window 32: the first query at 48 sees 17..=48, so block
        // 0 is a hole and block 1 is not.
        assert_eq!(g.skipped_hits(1, 3, 16), 1);
        assert_eq!(g.skipped_hits(0, 3, 16), 0);
    }
}
