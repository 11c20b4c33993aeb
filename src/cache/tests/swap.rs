//! Swapping sequence groups out to the host pool and back, with sharing preserved.

use super::{manager, prefix_manager, tokens, unnamed, A, B, C};
use crate::cache::{AllocStatus, BlockManager, CacheConfig, CacheError, Location, SeqId};
use std::collections::HashSet;

/// Beams A and B sharing three full blocks, each with a block of its own.
fn beams() -> BlockManager {
    let mut m = manager(4, 16, 16);
    m.allocate(A, &tokens(0, 12)).unwrap();
    m.fork(A, B).unwrap();
    for seq in [A, B, A, B] {
        assert_eq!(m.append_slot(seq).unwrap().copy, None);
    }
    m.take_ops();
    m.check_invariants().unwrap();
    m
}

#[test]
fn beams_sharing_three_blocks_swap_out_and_in_preserving_sharing() {
    let mut m = beams();
    let (a, b) = (
        m.block_table(A).unwrap().to_vec(),
        m.block_table(B).unwrap().to_vec(),
    );
    assert_eq!(a[..3], b[..3]);
    assert_eq!(m.stats().device.used, 5);

    assert!(m.can_swap_out(&[A, B]));
    let out = m.swap_out(&[A, B]).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(out.len(), 5, "one host block per distinct device block");
    let (ha, hb) = (
        m.host_block_table(A).unwrap().to_vec(),
        m.host_block_table(B).unwrap().to_vec(),
    );
    assert_eq!(ha[..3], hb[..3]);
    assert_ne!(ha[3], hb[3]);
    for &h in &ha[..3] {
        assert_eq!(m.host_refcount(h), Some(2));
    }
    assert_eq!(
        (m.host_refcount(ha[3]), m.host_refcount(hb[3])),
        (Some(1), Some(1))
    );
    for (i, &d) in a.iter().enumerate() {
        assert!(out.contains(&(d, ha[i])));
    }
    let stats = m.stats();
    assert_eq!(
        (stats.device.used, stats.host.used, stats.swapped_out_blocks),
        (0, 5, 5)
    );
    assert_eq!(m.location(A), Ok(Location::Host));
    assert_eq!(m.take_ops().swap_out, out);

    // Someone else takes the freed device blocks meanwhile.
    m.allocate(C, &tokens(100, 12)).unwrap();
    let c: HashSet<_> = m.block_table(C).unwrap().iter().copied().collect();
    assert!(a.iter().any(|d| c.contains(d)));

    assert_eq!(m.can_swap_in(&[A, B]), AllocStatus::Now);
    let back = m.swap_in(&unnamed(&[A, B])).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(back.len(), 5);
    let (a2, b2) = (
        m.block_table(A).unwrap().to_vec(),
        m.block_table(B).unwrap().to_vec(),
    );
    assert_eq!(a2[..3], b2[..3], "the beams share device blocks again");
    assert_ne!(a2[3], b2[3]);
    assert!(a2.iter().chain(&b2).all(|d| !c.contains(d)));
    for &d in &a2[..3] {
        assert_eq!(m.device_refcount(d), Some(2));
    }
    for (i, &h) in ha.iter().enumerate() {
        assert!(back.contains(&(h, a2[i])));
    }
    assert_eq!(m.stats().swapped_in_blocks, 5);
    assert_eq!(m.take_ops().swap_in, back);
    assert_eq!(
        m.stats().host.used,
        0,
        "host blocks are free once the plan is taken"
    );
    m.check_invariants().unwrap();
}

#[test]
fn swap_out_that_does_not_fit_changes_nothing() {
    let mut m = beams();
    // Fill the host pool to 4 free blocks, one short of the beams' 5.
    for i in 0..3 {
        let seq = SeqId(10 + i);
        m.allocate(seq, &tokens(50, 16)).unwrap();
        m.swap_out(&[seq]).unwrap();
    }
    assert_eq!(m.num_free_host_blocks(), 4);
    let before = m.clone();
    assert!(!m.can_swap_out(&[A, B]));
    assert_eq!(
        m.swap_out(&[A, B]),
        Err(CacheError::HostPoolFull { needed: 5, free: 4 })
    );
    assert_eq!(m, before);
    assert!(m.can_swap_out(&[A]), "one beam alone fits");
}

#[test]
fn swap_out_copies_blocks_shared_outside_the_group() {
    let mut m = manager(4, 8, 8);
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.fork(A, B).unwrap();
    let table = m.block_table(B).unwrap().to_vec();
    let out = m.swap_out(&[A]).unwrap();
    assert_eq!(out.len(), 2);
    assert!(table.iter().all(|&d| m.device_refcount(d) == Some(1)));
    assert_eq!(m.block_table(B).unwrap(), &table[..]);
    m.check_invariants().unwrap();
}

#[test]
fn swap_out_waits_for_blocks_the_plan_writes() {
    let mut m = manager(4, 8, 8);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.fork(A, B).unwrap();
    m.append_slot(A).unwrap(); // A's last block is a pending copy destination
    let before = m.clone();
    assert!(!m.can_swap_out(&[A]));
    assert_eq!(m.swap_out(&[A]), Err(CacheError::BlocksInFlight(A)));
    assert_eq!(m, before);
    assert!(m.can_swap_out(&[B]), "B reads the copy source only");
    m.take_ops();
    assert!(m.can_swap_out(&[A]));
    m.swap_out(&[A]).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn swap_in_leaves_the_watermark() {
    let config = CacheConfig::new(4, 8, 8).with_watermark_blocks(2);
    let mut m = BlockManager::new(config).unwrap();
    m.allocate(A, &tokens(0, 16)).unwrap();
    m.swap_out(&[A]).unwrap();
    m.allocate(C, &tokens(0, 12)).unwrap();
    let before = m.clone();
    assert_eq!(m.can_swap_in(&[A]), AllocStatus::Later);
    assert!(matches!(
        m.swap_in(&unnamed(&[A])),
        Err(CacheError::OutOfBlocks { needed: 4, .. })
    ));
    assert_eq!(m, before);
    m.free(C).unwrap();
    assert_eq!(m.can_swap_in(&[A]), AllocStatus::Now);
    m.swap_in(&unnamed(&[A])).unwrap();
    assert!(m.num_available_device_blocks() >= 2);
    m.check_invariants().unwrap();
}

#[test]
fn swapped_sequences_refuse_device_work_and_fork_on_the_host() {
    let mut m = manager(4, 8, 8);
    m.allocate(A, &tokens(0, 6)).unwrap();
    m.swap_out(&[A]).unwrap();
    let before = m.clone();
    assert_eq!(m.append_slot(A), Err(CacheError::Swapped(A)));
    assert_eq!(m.block_table(A), Err(CacheError::Swapped(A)));
    assert_eq!(m.swap_out(&[A]), Err(CacheError::Swapped(A)));
    assert_eq!(
        m.mark_computed(A, &tokens(0, 6)),
        Err(CacheError::Swapped(A))
    );
    assert_eq!(m.swap_in(&unnamed(&[])), Err(CacheError::EmptyGroup));
    assert_eq!(
        m.swap_in(&unnamed(&[A, A])),
        Err(CacheError::DuplicateSequence(A))
    );
    assert_eq!(
        m.swap_in(&unnamed(&[A, C])),
        Err(CacheError::UnknownSequence(C))
    );
    assert_eq!(m.can_swap_in(&[A, C]), AllocStatus::Never);
    assert_eq!(m, before);

    m.fork(A, B).unwrap();
    let h = m.host_block_table(B).unwrap().to_vec();
    assert!(h.iter().all(|&h| m.host_refcount(h) == Some(2)));
    assert_eq!(m.swap_in(&unnamed(&[A, B])).unwrap().len(), 2);
    assert_eq!(m.block_table(A), m.block_table(B));
    assert_eq!(m.swap_in(&unnamed(&[A])), Err(CacheError::NotSwapped(A)));
    m.check_invariants().unwrap();
}

#[test]
fn swapped_in_blocks_serve_prefix_hits() {
    let mut m = prefix_manager(4, 4);
    m = BlockManager::new(CacheConfig {
        num_host_blocks: 4,
        ..*m.config()
    })
    .unwrap();
    m.allocate(A, &tokens(0, 9)).unwrap();
    m.mark_computed(A, &tokens(0, 9)).unwrap();
    m.swap_out(&[A]).unwrap();
    m.take_ops();
    // Swapping in needs 3 of the 4 blocks, so it evicts at least one of A's old cached
    // blocks; the restored copies carry the names on.
    m.swap_in(&[(A, &tokens(0, 9))]).unwrap();
    m.take_ops();
    m.check_invariants().unwrap();
    let table = m.block_table(A).unwrap().to_vec();
    assert!(m.is_cached(table[0]) || m.is_cached(table[1]));
    m.free(A).unwrap();
    assert_eq!(m.allocate(B, &tokens(0, 10)), Ok(8));
    m.check_invariants().unwrap();
}

#[test]
fn swap_in_refuses_tokens_that_are_short_or_not_the_named_ones() {
    let config = CacheConfig::new(4, 8, 4)
        .with_watermark_blocks(0)
        .with_prefix_caching(true);
    let mut m = BlockManager::new(config).unwrap();
    m.allocate(A, &tokens(0, 9)).unwrap();
    m.mark_computed(A, &tokens(0, 9)).unwrap();
    m.swap_out(&[A]).unwrap();
    m.take_ops();
    let before = m.clone();
    assert_eq!(
        m.swap_in(&[(A, &tokens(0, 8))]),
        Err(CacheError::MissingTokens {
            seq: A,
            given: 8,
            num_tokens: 9
        })
    );
    // Block 1 (tokens 4..8) is named from other tokens than these.
    let mut other = tokens(0, 9);
    other[5] = 77;
    assert_eq!(
        m.swap_in(&[(A, &other)]),
        Err(CacheError::TokensMismatch(A))
    );
    assert_eq!(m, before);
    // The engine passes a decoding sequence's newest token too, which has no slot yet.
    m.swap_in(&[(A, &tokens(0, 10))]).unwrap();
    m.check_invariants().unwrap();
    m.check_contents(|_| Some(&other[..])).unwrap_err();
}
