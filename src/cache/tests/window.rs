//! Releasing blocks that left a sliding window: holes at the front of the table, shared
//! with forks, kept in the prefix cache, carried through swaps.

use super::{manager, prefix_manager, tokens, unnamed, A, B, C, FILLER};
use crate::cache::{CacheError, Location};

/// Appends `n` tokens to `seq` and marks everything computed, as decode steps do.
fn decode(m: &mut crate::cache::BlockManager, seq: crate::cache::SeqId, n: usize) {
    for _ in 0..n {
        m.append_slot(seq).unwrap();
        let len = m.num_tokens(seq).unwrap();
        m.mark_computed(seq, &FILLER[..len]).unwrap();
        m.take_ops();
    }
}

#[test]
fn blocks_wholly_before_the_window_become_holes_and_the_last_stays() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 10)).unwrap(); // blocks of 4, 4, 2 tokens
    let table = m.block_table(A).unwrap().to_vec();
    // Nothing computed yet: the next query is at position 0 and sees everything.
    assert_eq!(m.release_out_of_window(A, 3).unwrap(), 0);
    m.mark_computed(A, &tokens(0, 10)).unwrap();
    // The next query (position 10) with a window of 3 sees 8..=10: block 0 (0..4) and
    // block 1 (4..8) are out.
    assert_eq!(m.release_out_of_window(A, 3).unwrap(), 2);
    assert_eq!(m.released_blocks(A).unwrap(), 2);
    assert_eq!(m.block_table(A).unwrap(), &table[2..]);
    assert_eq!(m.device_refcount(table[0]), Some(0));
    assert_eq!(m.num_available_device_blocks(), 15);
    assert!(matches!(
        m.slot(A, 3),
        Err(CacheError::TokenOutOfRange { .. })
    ));
    assert_eq!(m.slot(A, 9).unwrap(), table[2].0 as usize * 4 + 1);
    m.check_invariants().unwrap();
    // Again: nothing more to release.
    assert_eq!(m.release_out_of_window(A, 3).unwrap(), 0);
    // Two more tokens fill block 2. A window of 1 at position 12 would release it too,
    // but the last block always stays; one token later block 3 is open and 2 goes.
    decode(&mut m, A, 2);
    assert_eq!(m.release_out_of_window(A, 1).unwrap(), 0);
    decode(&mut m, A, 1);
    assert_eq!(m.release_out_of_window(A, 1).unwrap(), 1);
    assert_eq!(m.block_table(A).unwrap().len(), 1);
    decode(&mut m, A, 1);
    assert_eq!(m.num_tokens(A).unwrap(), 14);
    m.check_invariants().unwrap();
    m.free(A).unwrap();
    assert_eq!(m.num_available_device_blocks(), 16);
}

#[test]
fn a_long_generation_holds_a_bounded_number_of_blocks() {
    let (bs, window) = (4, 10);
    let mut m = manager(bs, 64, 0);
    m.allocate(A, &tokens(0, 5)).unwrap();
    m.mark_computed(A, &tokens(0, 5)).unwrap();
    let mut most = 0;
    for _ in 0..200 {
        decode(&mut m, A, 1);
        m.release_out_of_window(A, window).unwrap();
        most = most.max(m.block_table(A).unwrap().len());
        m.check_invariants().unwrap();
    }
    // The window's tokens span at most ceil((window - 1) / bs) + 1 blocks, plus the block
    // the next token opens.
    assert!(most <= window.div_ceil(bs) + 1, "{most} blocks");
    assert_eq!(m.released_blocks(A).unwrap() + most, 205usize.div_ceil(bs));
}

#[test]
fn forks_share_holes_and_release_their_own_references() {
    let mut m = manager(4, 16, 0);
    m.allocate(A, &tokens(0, 12)).unwrap();
    m.mark_computed(A, &tokens(0, 12)).unwrap();
    let table = m.block_table(A).unwrap().to_vec();
    m.fork(A, B).unwrap();
    assert_eq!(m.release_out_of_window(A, 4).unwrap(), 2);
    // B still uses blocks 0 and 1.
    assert_eq!(m.device_refcount(table[0]), Some(1));
    assert_eq!(m.block_table(B).unwrap(), &table[..]);
    m.fork(A, C).unwrap();
    assert_eq!(m.released_blocks(C).unwrap(), 2);
    assert_eq!(m.block_table(C).unwrap(), &table[2..]);
    m.check_invariants().unwrap();
    assert_eq!(m.release_out_of_window(B, 4).unwrap(), 2);
    assert_eq!(m.device_refcount(table[0]), Some(0));
    assert_eq!(m.device_refcount(table[2]), Some(3));
    // Writing the shared last block copies it, with the holes in place.
    let out = m.append_slot(C).unwrap();
    assert!(out.new_block, "block 2 was full: a new block, no copy");
    m.check_invariants().unwrap();
    for s in [A, B, C] {
        m.free(s).unwrap();
    }
    m.take_ops();
    assert_eq!(m.num_available_device_blocks(), 16);
}

#[test]
fn released_cached_blocks_stay_findable_by_a_new_prompt() {
    let mut m = prefix_manager(4, 8);
    m.allocate(A, &tokens(0, 12)).unwrap();
    m.mark_computed(A, &tokens(0, 12)).unwrap();
    let table = m.block_table(A).unwrap().to_vec();
    assert_eq!(m.release_out_of_window(A, 2).unwrap(), 2);
    assert!(m.is_cached(table[0]) && m.is_cached(table[1]));
    assert_eq!(m.device_refcount(table[0]), Some(0));
    // A new prompt with the same first 8 tokens reuses both released blocks.
    let cached = m.allocate(B, &tokens(0, 9)).unwrap();
    assert_eq!(cached, 8);
    assert_eq!(m.block_table(B).unwrap()[..2], table[..2]);
    m.check_invariants().unwrap();
}

#[test]
fn swapping_out_and_in_moves_the_live_blocks_only() {
    let mut m = manager(4, 8, 8);
    m.allocate(A, &tokens(0, 14)).unwrap();
    m.mark_computed(A, &tokens(0, 14)).unwrap();
    assert_eq!(m.release_out_of_window(A, 3).unwrap(), 3);
    let out = m.swap_out(&[A]).unwrap();
    assert_eq!(out.len(), 1, "one live block goes to the host");
    assert_eq!(m.location(A).unwrap(), Location::Host);
    assert_eq!(
        m.release_out_of_window(A, 3).unwrap(),
        0,
        "nothing to do on the host"
    );
    m.take_ops();
    let back = m.swap_in(&unnamed(&[A])).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(m.released_blocks(A).unwrap(), 3);
    let slot = m.slot(A, 13).unwrap();
    assert_eq!(slot, back[0].1 .0 as usize * 4 + 1);
    m.check_invariants().unwrap();
}
