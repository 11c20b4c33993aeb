//! Giving back the slots of rejected speculative tokens: blocks that held only rejected
//! tokens return to the pool, shared blocks stay shared, the prefix cache never sees a
//! rejected token, and what cannot be given back is refused without a change.

use super::{manager, prefix_manager, tokens, unnamed, A, B};
use crate::cache::{BlockManager, CacheError, SeqId};

/// Appends `n` slots to `seq` (a speculative step's proposals).
fn propose(m: &mut BlockManager, seq: SeqId, n: usize) {
    for _ in 0..n {
        m.append_slot(seq).unwrap();
    }
}

#[test]
fn blocks_holding_only_rejected_tokens_go_back() {
    let mut m = manager(4, 8, 0);
    m.allocate(A, &tokens(0, 5)).unwrap(); // blocks of 4 and 1
    m.mark_computed(A, &tokens(0, 5)).unwrap();
    propose(&mut m, A, 6); // 11 slots: a third block
    m.take_ops();
    let table = m.block_table(A).unwrap().to_vec();
    assert_eq!((table.len(), m.num_available_device_blocks()), (3, 5));
    // Two of the six accepted: 7 tokens, two blocks.
    assert_eq!(m.truncate(A, 7).unwrap(), 1);
    assert_eq!(m.num_tokens(A).unwrap(), 7);
    assert_eq!(m.block_table(A).unwrap(), &table[..2]);
    assert_eq!(m.device_refcount(table[2]), Some(0));
    assert_eq!(m.num_available_device_blocks(), 6);
    m.mark_computed(A, &tokens(0, 7)).unwrap();
    m.check_invariants().unwrap();
    // The next token goes where the first rejected one went.
    let next = m.append_slot(A).unwrap();
    assert_eq!(next.slot, table[1].0 as usize * 4 + 3);
    assert!(!next.new_block);
    // Truncating to the current length gives back nothing.
    assert_eq!(m.truncate(A, 8).unwrap(), 0);
    m.free(A).unwrap();
    assert_eq!(m.num_available_device_blocks(), 8);
}

#[test]
fn a_fork_keeps_its_copy_and_the_shared_blocks_stay_shared() {
    let mut m = manager(4, 8, 0);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.mark_computed(A, &tokens(0, 6)).unwrap();
    m.fork(A, B).unwrap();
    let shared = m.block_table(A).unwrap().to_vec();
    // B proposes 3: its first write into the shared, half-full block copies it, and the
    // third opens a block of its own.
    propose(&mut m, B, 3);
    m.take_ops();
    let b = m.block_table(B).unwrap().to_vec();
    assert_eq!(b.len(), 3);
    assert_eq!(b[0], shared[0]);
    assert_ne!(b[1], shared[1]);
    // All rejected: B is back at 6 tokens, with its private copy of block 1.
    assert_eq!(m.truncate(B, 6).unwrap(), 1);
    assert_eq!(m.block_table(B).unwrap(), &b[..2]);
    assert_eq!(m.device_refcount(shared[0]), Some(2));
    assert_eq!(m.device_refcount(shared[1]), Some(1));
    assert_eq!(m.device_refcount(b[1]), Some(1));
    assert_eq!(m.device_refcount(b[2]), Some(0));
    assert_eq!(m.block_table(A).unwrap(), &shared[..]);
    m.check_invariants().unwrap();
}

#[test]
fn the_prefix_cache_never_names_a_rejected_token() {
    let mut m = prefix_manager(4, 16);
    let prompt = tokens(10, 5);
    m.allocate(A, &prompt).unwrap();
    m.mark_computed(A, &prompt).unwrap();
    // Proposals 90 91 92 fill block 1 as [14, 90, 91, 92]; only 90 is accepted.
    propose(&mut m, A, 3);
    m.take_ops();
    m.truncate(A, 6).unwrap();
    let verified = [&prompt[..], &[90]].concat();
    m.mark_computed(A, &verified).unwrap();
    m.check_invariants().unwrap();
    // A prompt that continues with the rejected tokens finds block 0 only: block 1 was
    // never full of verified tokens, so it was never named.
    let other = [&prompt[..], &[90, 91, 92, 7]].concat();
    assert_eq!(m.allocate(B, &other).unwrap(), 4);
    // Verified tokens that fill the block do name it.
    propose(&mut m, A, 2);
    m.take_ops();
    let verified = [&verified[..], &[50, 51]].concat();
    m.mark_computed(A, &verified).unwrap();
    m.free(B).unwrap();
    let again = [&verified[..], &[3]].concat();
    assert_eq!(m.allocate(B, &again).unwrap(), 8);
    m.check_invariants().unwrap();
}

#[test]
fn what_cannot_be_given_back_is_refused_without_a_change() {
    let mut m = manager(4, 8, 8);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.mark_computed(A, &tokens(0, 6)).unwrap();
    propose(&mut m, A, 2);
    m.take_ops();
    let before = m.clone();
    let out_of_range = |e| matches!(e, Err(CacheError::TokenOutOfRange { .. }));
    // Computed KV is never given back, nor slots it does not have.
    assert!(out_of_range(m.truncate(A, 5)));
    assert!(out_of_range(m.truncate(A, 9)));
    assert_eq!(m.truncate(B, 6), Err(CacheError::UnknownSequence(B)));
    assert_eq!(m, before);
    // A block the pending plan still writes stays: B's copy of a shared block whose
    // tokens past the computed 6 are not computed yet, dropped before the plan ran.
    m.truncate(A, 6).unwrap();
    propose(&mut m, A, 3); // 9 slots: block 2 opened
    m.take_ops();
    m.fork(A, B).unwrap();
    propose(&mut m, B, 1); // B's write into shared block 2 copies it
    let before = m.clone();
    assert_eq!(m.truncate(B, 6), Err(CacheError::BlocksInFlight(B)));
    assert_eq!(m, before);
    // Once the plan is taken, B can give back its copy by cutting at the end of the
    // block it still shares, but not inside that block.
    m.take_ops();
    assert!(matches!(
        m.truncate(B, 6),
        Err(CacheError::CutsSharedBlock { seq: B, .. })
    ));
    assert_eq!(m.truncate(B, 8).unwrap(), 1);
    m.check_invariants().unwrap();
    // Swapped out: nothing to give back on the device.
    m.free(B).unwrap();
    m.truncate(A, 6).unwrap();
    m.swap_out(&[A]).unwrap();
    m.take_ops();
    let before = m.clone();
    assert_eq!(m.truncate(A, 6), Err(CacheError::Swapped(A)));
    assert_eq!(m, before);
    m.swap_in(&unnamed(&[A])).unwrap();
    m.check_invariants().unwrap();
}

/// Found by the property test: a fork cut back into a block it shares would later write
/// its next token into that block in place once the block was named and the other sharer
/// gone. Such a cut is refused; a cut at the block's end is fine.
#[test]
fn a_cut_inside_a_shared_block_is_refused() {
    let mut m = prefix_manager(2, 22);
    m.allocate(A, &[0; 8]).unwrap();
    m.fork(A, B).unwrap();
    let shared = m.block_table(A).unwrap()[0];
    let before = m.clone();
    assert_eq!(
        m.truncate(B, 1),
        Err(CacheError::CutsSharedBlock {
            seq: B,
            block: shared
        })
    );
    assert_eq!(m, before);
    // At the block's end: B keeps all of block 0 and gives back the other three.
    assert_eq!(m.truncate(B, 2).unwrap(), 3);
    m.mark_computed(A, &[0; 8]).unwrap();
    m.check_invariants().unwrap();
    m.check_contents(|id| (id == A || id == B).then_some(&[0u32; 8][..]))
        .unwrap();
    // B's next token opens a block of its own.
    assert!(m.append_slot(B).unwrap().new_block);
}
