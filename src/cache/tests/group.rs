//! Sequence groups as a whole: joint admission of several prompts (cache hits counted once
//! and claimed before any fresh block), and a group's footprint after one more token,
//! the same whether its blocks are on the device or in the host pool.

use super::{manager, prefix_manager, A, B, C, D};
use crate::cache::{AllocStatus, SeqId};

/// Leaves the prompt's full blocks cached (named, unreferenced) in the prefix cache;
/// returns the block table it had.
fn cache_prompt(
    m: &mut crate::cache::BlockManager,
    seq: SeqId,
    prompt: &[u32],
) -> Vec<crate::cache::DeviceBlockId> {
    m.allocate(seq, prompt).unwrap();
    m.mark_computed(seq, prompt).unwrap();
    let table = m.block_table(seq).unwrap().to_vec();
    m.free(seq).unwrap();
    table
}

#[test]
fn a_group_claims_every_cache_hit_before_taking_fresh_blocks() {
    // Block size 2, 4 blocks. [1, 2] is cached first (the least recently used), then
    // [3, 4] and [5, 6]; one block is free.
    let mut m = prefix_manager(2, 4);
    let x = cache_prompt(&mut m, A, &[1, 2, 9])[0];
    cache_prompt(&mut m, B, &[3, 4, 5, 6, 9]);
    assert_eq!(m.num_available_device_blocks(), 4);
    let p1: &[u32] = &[7, 7, 7, 8];
    let p2: &[u32] = &[1, 2, 6];
    // Two fresh blocks for p1, one plus the hit on [1, 2] for p2: exactly what is there.
    assert_eq!(m.can_allocate_group(&[p1, p2]), AllocStatus::Now);
    let mut sequential = m.clone();
    assert_eq!(m.allocate_group(&[(C, p1), (D, p2)]).unwrap(), vec![0, 2]);
    assert_eq!(m.block_table(D).unwrap()[0], x);
    assert!(!m.block_table(C).unwrap().contains(&x));
    m.check_invariants().unwrap();
    // One prompt at a time, p1's fresh blocks evict the least recently used cached block,
    // which is the one p2 would have hit.
    sequential.allocate(C, p1).unwrap();
    assert_eq!(sequential.allocate(D, p2).unwrap(), 0);
    sequential.check_invariants().unwrap();
}

#[test]
fn prompts_of_a_group_share_their_hits_in_the_count() {
    // 3 blocks: two prompts hitting the same cached block need 1 + 1 + 1, not 2 + 2.
    let mut m = prefix_manager(2, 3);
    cache_prompt(&mut m, A, &[1, 2, 9]);
    let (p1, p2): (&[u32], &[u32]) = (&[1, 2, 5], &[1, 2, 6]);
    assert_eq!(m.blocks_to_allocate_group(&[p1, p2]), 3);
    assert_eq!(m.can_allocate_group(&[p1, p2]), AllocStatus::Now);
    assert_eq!(
        m.can_allocate_group(&[p1, p2, &[1, 2, 7, 8, 9]]),
        AllocStatus::Never
    );
    m.allocate_group(&[(B, p1), (C, p2)]).unwrap();
    let shared = m.block_table(B).unwrap()[0];
    assert_eq!(m.block_table(C).unwrap()[0], shared);
    assert_eq!(m.device_refcount(shared), Some(2));
    m.check_invariants().unwrap();
    // Without the cache the same group never fits.
    let m = manager(2, 3, 0);
    assert_eq!(m.blocks_to_allocate_group(&[p1, p2]), 4);
    assert_eq!(m.can_allocate_group(&[p1, p2]), AllocStatus::Never);
}

#[test]
fn a_failed_group_allocation_changes_nothing() {
    let mut m = manager(2, 3, 0);
    let before = m.clone();
    assert!(m
        .allocate_group(&[(A, &[1, 2, 3]), (B, &[4, 5, 6])])
        .is_err());
    assert!(m.allocate_group(&[(A, &[1]), (A, &[2])]).is_err());
    assert!(m.allocate_group(&[(A, &[1]), (B, &[])]).is_err());
    assert_eq!(m, before);
}

#[test]
fn a_groups_footprint_is_the_same_on_the_device_and_in_the_host_pool() {
    let mut m = manager(4, 10, 10);
    // 6 tokens: one full block and one half-filled block, shared by A and B.
    m.allocate(A, &[1, 2, 3, 4, 5, 6]).unwrap();
    m.fork(A, B).unwrap();
    m.allocate(C, &[1, 2, 3, 4]).unwrap();
    // Both append: the shared half block is copied once (the last writer keeps it).
    assert_eq!(m.blocks_needed_to_append(&[A, B]).unwrap(), 1);
    assert_eq!(m.group_blocks_after_append(&[A, B], &[A, B]).unwrap(), 3);
    assert_eq!(m.group_blocks_after_append(&[A, B], &[A]).unwrap(), 3);
    assert_eq!(m.group_blocks_after_append(&[A, B], &[]).unwrap(), 2);
    // C's last block is full: a new one.
    assert_eq!(m.group_blocks_after_append(&[C], &[C]).unwrap(), 2);
    m.take_ops();
    m.swap_out(&[A, B]).unwrap();
    m.take_ops();
    assert_eq!(m.append_need_anywhere(&[A, B]).unwrap(), 1);
    assert_eq!(m.group_blocks_after_append(&[A, B], &[A, B]).unwrap(), 3);
    m.check_invariants().unwrap();
}
