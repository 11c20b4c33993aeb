//! Forks, copy-on-write, freeing, and the per-step plan that copy-on-write produces.

use super::{manager, tokens, A, B, C, D};
use crate::cache::{BlockOps, CacheError};

#[test]
fn fork_then_append_in_both_copies_only_the_partial_last_block() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 10)).unwrap(); // blocks of 4, 4, 2 tokens
    let parent = m.block_table(A).unwrap().to_vec();
    let available = m.num_available_device_blocks();
    m.fork(A, B).unwrap();
    assert_eq!(
        m.num_available_device_blocks(),
        available,
        "fork allocates nothing"
    );
    assert_eq!(m.block_table(B).unwrap(), &parent[..]);
    assert!(parent.iter().all(|&b| m.device_refcount(b) == Some(2)));
    m.check_invariants().unwrap();

    let a = m.append_slot(A).unwrap();
    let (src, dst) = a
        .copy
        .expect("first write into the shared last block copies it");
    assert_eq!(src, parent[2]);
    assert!(!parent.contains(&dst));
    assert_eq!(m.block_table(A).unwrap(), &[parent[0], parent[1], dst]);
    assert_eq!(a.slot, dst.0 as usize * 4 + 2);
    m.check_invariants().unwrap();

    // The child now has the old block to itself and writes in place.
    let b = m.append_slot(B).unwrap();
    assert_eq!(b.copy, None);
    assert_eq!(b.slot, parent[2].0 as usize * 4 + 2);
    assert_eq!(m.block_table(B).unwrap(), &parent[..]);
    m.check_invariants().unwrap();

    assert_eq!(m.stats().cow_copies, 1);
    assert_eq!(
        m.device_refcount(parent[0]),
        Some(2),
        "full blocks stay shared"
    );
    assert_eq!(m.device_refcount(parent[1]), Some(2));
    assert_eq!(m.device_refcount(parent[2]), Some(1));
    assert_eq!(m.device_refcount(dst), Some(1));
    let ops = m.take_ops();
    assert_eq!(ops.copies, vec![(parent[2], dst)]);
    assert!(ops.swap_in.is_empty() && ops.swap_out.is_empty());
    assert!(m.take_ops().is_empty(), "taking the plan ends the step");
    m.check_invariants().unwrap();
}

#[test]
fn fork_of_full_blocks_appends_without_copies() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.fork(A, B).unwrap();
    let a = m.append_slot(A).unwrap();
    let b = m.append_slot(B).unwrap();
    assert!(a.new_block && b.new_block);
    assert_eq!((a.copy, b.copy), (None, None));
    assert_ne!(m.block_table(A).unwrap()[2], m.block_table(B).unwrap()[2]);
    assert_eq!(m.stats().cow_copies, 0);
    m.check_invariants().unwrap();
}

#[test]
fn one_source_feeds_several_copies_and_the_last_writer_keeps_the_block() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 6)).unwrap();
    for child in [B, C, D] {
        m.fork(A, child).unwrap();
    }
    let shared = m.block_table(A).unwrap()[1];
    let group = [A, B, C, D];
    assert_eq!(m.blocks_needed_to_append(&group), Ok(3));
    assert_eq!(m.blocks_needed_to_append(&[A, C]), Ok(2));
    let before = m.num_available_device_blocks();
    for seq in group {
        m.append_slot(seq).unwrap();
        m.check_invariants().unwrap();
    }
    assert_eq!(before - m.num_available_device_blocks(), 3);
    let ops = m.take_ops();
    assert_eq!(ops.copies.len(), 3);
    assert!(ops.copies.iter().all(|&(src, _)| src == shared));
    ops.check().unwrap();
    assert_eq!(m.block_table(D).unwrap()[1], shared);
}

#[test]
fn free_releases_only_unshared_blocks() {
    let mut m = manager(4, 8, 0);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.fork(A, B).unwrap();
    m.free(A).unwrap();
    assert_eq!(m.num_available_device_blocks(), 6);
    assert!(m
        .block_table(B)
        .unwrap()
        .iter()
        .all(|&b| m.device_refcount(b) == Some(1)));
    m.free(B).unwrap();
    assert_eq!(m.num_available_device_blocks(), 8);
    assert_eq!(m.stats().device.used, 0);
    assert_eq!(m.free(B), Err(CacheError::UnknownSequence(B)));
    m.check_invariants().unwrap();
}

#[test]
fn copy_blocks_stay_held_until_the_plan_is_taken() {
    let mut m = manager(4, 4, 0);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.fork(A, B).unwrap();
    let (src, dst) = m.append_slot(A).unwrap().copy.unwrap();
    // B leaves: the source has no table entry any more, but the copy has yet to read it.
    m.free(B).unwrap();
    assert_eq!(m.device_refcount(src), Some(0));
    assert_eq!(m.num_available_device_blocks(), 1);
    m.allocate(C, &tokens(50, 4)).unwrap();
    assert_ne!(m.block_table(C).unwrap()[0], src);
    assert!(
        m.allocate(D, &[1]).is_err(),
        "the source is not free before the step ends"
    );
    m.check_invariants().unwrap();
    assert_eq!(m.take_ops().copies, vec![(src, dst)]);
    assert_eq!(m.num_available_device_blocks(), 1);
    m.allocate(D, &[1]).unwrap();
    assert_eq!(m.block_table(D).unwrap(), &[src]);
    m.check_invariants().unwrap();
}

#[test]
fn copy_of_a_pending_copy_destination_reads_the_original() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.fork(A, B).unwrap();
    let (src, x) = m.append_slot(A).unwrap().copy.unwrap();
    m.fork(A, C).unwrap(); // C shares x, whose content arrives only when the copies run
    let (src2, y) = m.append_slot(C).unwrap().copy.unwrap();
    assert_eq!(
        src2, src,
        "x is not readable yet; its content comes from src"
    );
    let ops = m.take_ops();
    assert_eq!(ops.copies, vec![(src, x), (src, y)]);
    ops.check().unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn slots_follow_the_block_table() {
    let mut m = manager(3, 16, 0);
    m.allocate(A, &tokens(0, 5)).unwrap();
    for _ in 0..7 {
        let pos = m.num_tokens(A).unwrap();
        let out = m.append_slot(A).unwrap();
        assert_eq!(Ok(out.slot), m.slot(A, pos));
    }
    let table = m.block_table(A).unwrap().to_vec();
    assert_eq!(table.len(), 4);
    for pos in 0..12 {
        assert_eq!(m.slot(A, pos), Ok(table[pos / 3].0 as usize * 3 + pos % 3));
    }
    assert!(matches!(
        m.slot(A, 12),
        Err(CacheError::TokenOutOfRange { .. })
    ));
    assert_eq!(m.take_ops(), BlockOps::default());
}
