//! KV cache groups: a sequence is admitted, grown, forked, copied on write, swapped,
//! truncated and freed in every group at once; windowed groups release what left their
//! window while the global group keeps everything; a prefix hit counts as far as every
//! group has it, and a windowed group leaves the hits its first query cannot see as holes.

use super::{tokens, A, B, C};
use crate::cache::{BlockManager, CacheConfig, CacheError, KvGroups};

/// Block size 2; a global group and two groups with a window of 3 tokens; steps of up to
/// 4 tokens.
fn grouped(device: usize, host: usize, caching: bool) -> BlockManager {
    let config = CacheConfig::new(2, device, host)
        .with_watermark_blocks(0)
        .with_prefix_caching(caching);
    BlockManager::new(config)
        .unwrap()
        .with_groups(KvGroups::new(vec![None, Some(3), Some(3)], 4))
}

#[test]
fn every_group_gets_its_own_blocks_and_windowed_ones_release() {
    let mut m = grouped(30, 0, false);
    let p = tokens(10, 9);
    assert_eq!(m.allocate(A, &p).unwrap(), 0);
    // Five blocks of 2 for 9 tokens in each of three groups, all distinct.
    assert_eq!(m.num_used_device_blocks(), 15);
    let mut all: Vec<_> = (0..3)
        .flat_map(|g| m.block_table_in(A, g).unwrap().to_vec())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 15);
    m.mark_computed(A, &p).unwrap();
    // The next query, at 9, sees 7..=9: blocks 0..=2 (tokens 0..6) left both windows.
    assert_eq!(m.release_group_windows(A).unwrap(), 6);
    assert_eq!(m.released_blocks_in(A, 0).unwrap(), 0);
    assert_eq!(m.released_blocks_in(A, 1).unwrap(), 3);
    assert_eq!(m.released_blocks_in(A, 2).unwrap(), 3);
    assert_eq!(m.num_used_device_blocks(), 9);
    m.check_invariants().unwrap();
    // A window given by the caller releases in the windowed groups only, never in the
    // global one.
    let mut other = grouped(30, 0, false);
    other.allocate(A, &p).unwrap();
    other.mark_computed(A, &p).unwrap();
    assert_eq!(other.release_out_of_window(A, 3).unwrap(), 6);
    assert_eq!(other.released_blocks_in(A, 0).unwrap(), 0);
    other.check_invariants().unwrap();
    // A token takes a slot in every group: a new block in each (9 is odd: block 4 has room).
    m.append_slot(A).unwrap();
    assert_eq!(m.num_used_device_blocks(), 9);
    m.append_slot(A).unwrap();
    assert_eq!(m.num_used_device_blocks(), 12);
    assert_eq!(m.num_tokens(A).unwrap(), 11);
    m.free(A).unwrap();
    assert_eq!(m.num_used_device_blocks(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn a_fork_copies_on_write_in_every_group() {
    let mut m = grouped(30, 0, false);
    m.allocate(A, &tokens(1, 3)).unwrap();
    m.fork(A, B).unwrap();
    assert_eq!(m.num_used_device_blocks(), 6);
    // The shared last block (one token free) is copied in each group on B's write.
    let out = m.append_slot(B).unwrap();
    assert!(out.copy.is_some());
    assert_eq!(m.pending_ops().copies.len(), 3);
    assert_eq!(m.stats().cow_copies, 3);
    for g in 0..3 {
        assert_ne!(
            m.block_table_in(A, g).unwrap()[1],
            m.block_table_in(B, g).unwrap()[1]
        );
        assert_eq!(
            m.block_table_in(A, g).unwrap()[0],
            m.block_table_in(B, g).unwrap()[0]
        );
    }
    m.check_invariants().unwrap();
}

#[test]
fn a_group_is_swapped_out_and_in_whole() {
    let mut m = grouped(12, 12, false);
    m.allocate(A, &tokens(1, 5)).unwrap();
    assert!(m.can_swap_out(&[A]));
    assert_eq!(m.swap_out(&[A]).unwrap().len(), 9);
    assert_eq!(m.num_used_device_blocks(), 0);
    for g in 0..3 {
        assert_eq!(m.host_block_table_in(A, g).unwrap().len(), 3);
    }
    m.take_ops();
    assert_eq!(m.swap_in(&[(A, &tokens(1, 5))]).unwrap().len(), 9);
    assert_eq!(m.num_used_device_blocks(), 9);
    m.check_invariants().unwrap();
    // A host pool with room for two groups' blocks but not three refuses the whole.
    let mut small = grouped(12, 8, false);
    small.allocate(A, &tokens(1, 5)).unwrap();
    let before = small.clone();
    assert!(!small.can_swap_out(&[A]));
    assert!(matches!(
        small.swap_out(&[A]),
        Err(CacheError::HostPoolFull { needed: 9, .. })
    ));
    assert_eq!(small, before);
}

#[test]
fn admission_counts_every_group_and_fails_whole() {
    // 8 blocks: a 5-token prompt needs 3 per group, 9 in all.
    let mut m = grouped(8, 0, false);
    let before = m.clone();
    assert!(matches!(
        m.allocate(A, &tokens(1, 5)),
        Err(CacheError::ExceedsCapacity { needed: 9, .. })
    ));
    assert_eq!(m, before);
    // Slots for a first chunk of 2 tokens: one block per group, then growth in all three.
    assert_eq!(
        m.allocate_group_slots(&[(A, &tokens(1, 5), 2)]).unwrap(),
        vec![0]
    );
    assert_eq!(m.num_used_device_blocks(), 3);
    assert_eq!(m.blocks_needed_to_grow(&[(A, 5)]).unwrap(), 6);
    assert!(!m.can_grow(&[(A, 5)]));
    let before = m.clone();
    assert!(m.grow_to(A, 5).is_err());
    assert_eq!(m, before);
    m.grow_to(A, 4).unwrap();
    assert_eq!(m.num_used_device_blocks(), 6);
    m.check_invariants().unwrap();
}

#[test]
fn a_prefix_hit_counts_as_far_as_every_group_and_windowed_groups_skip_what_they_cannot_see() {
    let mut m = grouped(60, 0, true);
    let p = tokens(1, 11);
    m.allocate(A, &p).unwrap();
    m.mark_computed(A, &p).unwrap();
    // Group 0 names blocks as a manager without groups does; the others differently.
    let names = |g: usize| m.block_table_in(A, g).unwrap()[0];
    assert!(m.is_cached(names(0)) && m.is_cached(names(1)) && m.is_cached(names(2)));
    assert_eq!(m.cached_prefix_blocks(&p), 5);
    // A prompt with the same 10 first tokens hits 5 blocks in every group. Its first
    // query, at 10, sees 8..=10 with a window of 3: the windowed groups keep hit block 4
    // and leave 0..=3 as holes.
    let q = [&p[..10], &[99, 98][..]].concat();
    assert_eq!(m.allocate(B, &q).unwrap(), 10);
    assert_eq!(m.released_blocks_in(B, 0).unwrap(), 0);
    assert_eq!(m.released_blocks_in(B, 1).unwrap(), 4);
    assert_eq!(m.released_blocks_in(B, 2).unwrap(), 4);
    assert_eq!(
        m.block_table_in(B, 1).unwrap()[0],
        m.block_table_in(A, 1).unwrap()[4]
    );
    m.check_invariants().unwrap();
    m.check_contents(|id| match id {
        id if id == A => Some(&p[..]),
        id if id == B => Some(&q[..]),
        _ => None,
    })
    .unwrap();
    // Forgetting the prefix drops the names in every group: nothing hits any more.
    m.forget_prefix(&p);
    assert_eq!(m.cached_prefix_blocks(&p), 0);
    assert_eq!(m.allocate(C, &q).unwrap(), 0);
    m.check_invariants().unwrap();
}

#[test]
fn a_hit_missing_in_one_group_is_no_hit() {
    let mut m = grouped(60, 0, true);
    let p = tokens(1, 7);
    m.allocate(A, &p).unwrap();
    m.mark_computed(A, &p).unwrap();
    // Drop group 2's copy of the first block's name only: the chain breaks there.
    let mut only_two = m.clone();
    let first = only_two.block_table_in(A, 2).unwrap()[0];
    let hash = only_two.device.cache().unwrap().name(first).unwrap().hash;
    only_two.device.forget_name(hash);
    assert_eq!(only_two.cached_prefix_blocks(&p), 0);
    assert_eq!(m.cached_prefix_blocks(&p), 3);
}

#[test]
fn a_truncation_refused_in_one_group_changes_no_group() {
    let mut m = grouped(30, 0, false);
    m.allocate(A, &tokens(1, 3)).unwrap();
    m.append_slot(A).unwrap();
    m.append_slot(A).unwrap();
    m.mark_computed(A, &tokens(1, 5)).unwrap();
    // Below the computed tokens: refused before anything changes.
    let before = m.clone();
    assert!(m.truncate(A, 4).is_err());
    assert_eq!(m, before);
    m.append_slot(A).unwrap();
    m.append_slot(A).unwrap();
    // Back to 5 slots: the block holding only tokens 6 and 7 goes, in every group.
    assert_eq!(m.truncate(A, 5).unwrap(), 3);
    m.check_invariants().unwrap();
}

#[test]
fn sequence_ids_must_leave_room_for_the_group() {
    let mut m = grouped(30, 0, false);
    let big = crate::cache::SeqId(crate::cache::MAX_GROUPED_SEQ_ID + 1);
    assert_eq!(
        m.allocate(big, &[1, 2]),
        Err(CacheError::SequenceIdTooLarge(big))
    );
    m.allocate(A, &[1, 2]).unwrap();
    assert_eq!(m.fork(A, big), Err(CacheError::SequenceIdTooLarge(big)));
    // Ids are those of engine sequences, one per sequence whatever the groups.
    assert_eq!(m.sequences().collect::<Vec<_>>(), vec![A]);
    assert_eq!(m.stats().device_sequences, 1);
}
