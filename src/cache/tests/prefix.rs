//! Prefix caching: reuse of computed full blocks across prompts, and LRU eviction.

use super::{manager, prefix_manager, tokens, A, B, C, D};
use crate::cache::{AllocStatus, BlockManager, DeviceBlockId, SeqId};
use std::collections::HashSet;

#[test]
fn prompt_extending_a_cached_prompt_reuses_its_full_blocks() {
    let mut m = prefix_manager(4, 16);
    let a_prompt = tokens(0, 9); // blocks of 4, 4, 1 tokens
    assert_eq!(m.allocate(A, &a_prompt), Ok(0));
    assert_eq!((m.stats().prefix_hits, m.stats().prefix_misses), (0, 2));
    let a = m.block_table(A).unwrap().to_vec();
    m.mark_computed(A, &a_prompt).unwrap();
    assert!(m.is_cached(a[0]) && m.is_cached(a[1]));
    assert!(!m.is_cached(a[2]), "a partly filled block has no name");
    m.free(A).unwrap();
    let stats = m.stats();
    assert_eq!((stats.device.cached, stats.device.free), (2, 14));
    assert_eq!(m.num_available_device_blocks(), 16);
    m.check_invariants().unwrap();

    let mut b_prompt = a_prompt.clone();
    b_prompt.extend(tokens(100, 5)); // 14 tokens: A's two full blocks, then new ones
    assert_eq!(m.allocate(B, &b_prompt), Ok(8));
    assert_eq!(m.num_cached_tokens(B), Ok(8));
    assert_eq!(m.num_computed_tokens(B), Ok(8));
    let b = m.block_table(B).unwrap();
    assert_eq!(b[..2], a[..2]);
    assert_eq!(b.len(), 4);
    let stats = m.stats();
    assert_eq!((stats.prefix_hits, stats.prefix_misses), (2, 3));
    assert!((stats.prefix_hit_rate() - 0.4).abs() < 1e-12);
    m.check_invariants().unwrap();
}

#[test]
fn a_running_prompt_is_shared_and_costs_nothing_twice() {
    let mut m = prefix_manager(4, 6);
    m.allocate(A, &tokens(0, 12)).unwrap();
    m.mark_computed(A, &tokens(0, 12)).unwrap();
    // B needs 4 blocks, but its first two are A's and in use: only 2 are taken.
    let b_prompt = [tokens(0, 8), tokens(50, 6)].concat();
    assert_eq!(m.can_allocate(&b_prompt), AllocStatus::Now);
    assert_eq!(m.allocate(B, &b_prompt), Ok(8));
    assert_eq!(m.num_available_device_blocks(), 1);
    let a = m.block_table(A).unwrap();
    assert_eq!(m.device_refcount(a[0]), Some(2));
    assert_eq!(m.device_refcount(a[2]), Some(1));
    m.check_invariants().unwrap();
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut m = prefix_manager(4, 8);
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.mark_computed(A, &tokens(0, 8)).unwrap();
    let a = m.block_table(A).unwrap().to_vec();
    m.free(A).unwrap();
    assert_eq!(m.allocate(B, &tokens(0, 8)), Ok(4));
    let b = m.block_table(B).unwrap().to_vec();
    assert_eq!(b[0], a[0]);
    assert_ne!(
        b[1], a[1],
        "the last block is recomputed into a fresh block"
    );
    m.mark_computed(B, &tokens(0, 8)).unwrap();
    assert!(!m.is_cached(b[1]), "the earlier copy keeps the name");
    assert!(m.is_cached(a[1]));
    m.check_invariants().unwrap();
    assert_eq!(m.allocate(C, &[7]), Ok(0), "a one-token prompt never hits");
}

/// A and B (2-token blocks, 5-token prompts) computed and freed: the evictor holds, oldest
/// first, A's second block, A's first, B's second, B's first.
fn two_released_prompts() -> (BlockManager, Vec<DeviceBlockId>, Vec<DeviceBlockId>) {
    let mut m = prefix_manager(2, 8);
    let mut tables = Vec::new();
    for (seq, start) in [(A, 1), (B, 11)] {
        m.allocate(seq, &tokens(start, 5)).unwrap();
        m.mark_computed(seq, &tokens(start, 5)).unwrap();
        tables.push(m.block_table(seq).unwrap().to_vec());
        m.free(seq).unwrap();
    }
    assert_eq!((m.stats().device.cached, m.stats().device.free), (4, 4));
    let b = tables.pop().unwrap();
    (m, tables.pop().unwrap(), b)
}

#[test]
fn eviction_takes_the_least_recently_released_block_first() {
    let (mut m, a, b) = two_released_prompts();
    m.allocate(C, &tokens(21, 7)).unwrap(); // 4 blocks: the free list suffices
    assert_eq!(m.stats().evictions, 0);
    m.allocate(D, &tokens(31, 2)).unwrap(); // 1 block: evicts A's tail
    assert_eq!(m.stats().evictions, 1);
    assert_eq!(m.block_table(D).unwrap(), &[a[1]]);
    assert!(!m.is_cached(a[1]) && m.is_cached(a[0]));
    m.allocate(SeqId(9), &tokens(41, 2)).unwrap(); // then A's head
    assert_eq!(m.block_table(SeqId(9)).unwrap(), &[a[0]]);
    assert!(m.is_cached(b[0]) && m.is_cached(b[1]));
    // A's prompt now misses entirely; B's still hits.
    m.free(C).unwrap();
    assert_eq!(m.allocate(SeqId(10), &tokens(1, 5)), Ok(0));
    assert_eq!(m.allocate(SeqId(11), &tokens(11, 5)), Ok(4));
    m.check_invariants().unwrap();
}

#[test]
fn a_hit_makes_a_block_recent_again() {
    let (mut m, a, b) = two_released_prompts();
    assert_eq!(m.allocate(C, &tokens(1, 5)), Ok(4)); // hits A's two blocks
    m.free(C).unwrap(); // ... and releases them after B's
    m.allocate(D, &tokens(21, 9)).unwrap(); // 5 blocks: 4 free, then one eviction
    assert!(!m.is_cached(b[1]), "B's blocks are now the oldest");
    assert!(m.is_cached(a[0]) && m.is_cached(a[1]) && m.is_cached(b[0]));
    m.check_invariants().unwrap();
}

#[test]
fn hits_are_claimed_before_fresh_blocks_are_evicted() {
    let (mut m, a, b) = two_released_prompts();
    m.allocate(C, &tokens(21, 7)).unwrap(); // the free list is empty now
                                            // A's two cached blocks, then two fresh ones: those must evict B's, not A's.
    let prompt = [tokens(1, 4), tokens(60, 3)].concat();
    assert_eq!(m.allocate(D, &prompt), Ok(4));
    let d = m.block_table(D).unwrap().to_vec();
    assert_eq!(d[..2], a[..2]);
    assert_eq!(
        d[2..].iter().copied().collect::<HashSet<_>>(),
        HashSet::from([b[0], b[1]])
    );
    assert_eq!(m.stats().evictions, 2);
    m.check_invariants().unwrap();
}

#[test]
fn failed_allocation_with_hits_changes_nothing() {
    let (mut m, _, _) = two_released_prompts();
    m.allocate(C, &tokens(21, 7)).unwrap();
    let before = m.clone();
    // Hits A's two cached blocks, but needs 3 more blocks where only 2 remain.
    let prompt = [tokens(1, 4), tokens(60, 5)].concat();
    assert_eq!(m.can_allocate(&prompt), AllocStatus::Later);
    assert!(m.allocate(D, &prompt).is_err());
    assert_eq!(m, before, "no hit claimed, no miss counted, no eviction");
}

#[test]
fn without_prefix_caching_equal_prompts_share_nothing() {
    let mut m = manager(4, 8, 0);
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.mark_computed(A, &tokens(0, 8)).unwrap();
    assert_eq!(m.allocate(B, &tokens(0, 8)), Ok(0));
    assert_eq!(m.num_available_device_blocks(), 4);
    assert!(!m.is_cached(m.block_table(A).unwrap()[0]));
    let stats = m.stats();
    assert_eq!(
        (stats.prefix_hits, stats.prefix_misses, stats.device.cached),
        (0, 0, 0)
    );
    m.check_invariants().unwrap();
}
