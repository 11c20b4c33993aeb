//! Admission (watermark, capacity, slots for a first chunk and growth), failure atomicity,
//! input errors and statistics.

use super::{manager, tokens, A, B, C};
use crate::cache::{AllocStatus, BlockManager, CacheConfig, CacheError, SeqId};

#[test]
fn watermark_holds_back_new_groups_but_not_growth() {
    let config = CacheConfig::new(4, 10, 0).with_watermark_blocks(2);
    let mut m = BlockManager::new(config).unwrap();
    assert_eq!(m.can_allocate(&tokens(0, 33)), AllocStatus::Never);
    assert_eq!(
        m.allocate(A, &tokens(0, 33)),
        Err(CacheError::ExceedsCapacity {
            needed: 9,
            capacity: 8
        })
    );
    assert_eq!(m.can_allocate(&tokens(0, 32)), AllocStatus::Now);
    m.allocate(A, &tokens(0, 32)).unwrap();
    assert_eq!(m.num_available_device_blocks(), 2);
    assert_eq!(m.can_allocate(&[1]), AllocStatus::Later);
    assert_eq!(
        m.allocate(B, &[1]),
        Err(CacheError::OutOfBlocks {
            needed: 1,
            available: 0
        })
    );
    // A running sequence may grow into the watermark.
    assert!(m.can_append_slot(A));
    assert!(m.append_slot(A).unwrap().new_block);
    assert_eq!(m.num_available_device_blocks(), 1);
    m.check_invariants().unwrap();
}

#[test]
fn failed_append_changes_nothing() {
    let mut m = manager(4, 3, 0);
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.allocate(B, &tokens(0, 2)).unwrap();
    m.fork(B, C).unwrap();
    let before = m.clone();
    // A's last block is full, B's is shared: both need a block and none is left.
    assert!(!m.can_append_slot(A) && !m.can_append_slot(B));
    assert_eq!(
        m.append_slot(A),
        Err(CacheError::OutOfBlocks {
            needed: 1,
            available: 0
        })
    );
    assert!(m.append_slot(B).is_err());
    assert_eq!(m, before);
    // Once C leaves, B writes its block in place.
    m.free(C).unwrap();
    assert_eq!(m.append_slot(B).unwrap().copy, None);
    m.check_invariants().unwrap();
}

#[test]
fn bad_requests_are_errors_that_change_nothing() {
    let mut m = manager(4, 8, 4);
    m.allocate(A, &tokens(0, 5)).unwrap();
    let before = m.clone();
    let x = SeqId(99);
    assert_eq!(m.allocate(A, &[1]), Err(CacheError::SequenceExists(A)));
    assert_eq!(m.allocate(x, &[]), Err(CacheError::EmptyPrompt));
    assert_eq!(m.can_allocate(&[]), AllocStatus::Never);
    assert_eq!(m.append_slot(x), Err(CacheError::UnknownSequence(x)));
    assert_eq!(m.fork(x, B), Err(CacheError::UnknownSequence(x)));
    assert_eq!(m.fork(A, A), Err(CacheError::SequenceExists(A)));
    assert_eq!(m.free(x), Err(CacheError::UnknownSequence(x)));
    assert_eq!(m.swap_out(&[A, x]), Err(CacheError::UnknownSequence(x)));
    assert_eq!(
        m.blocks_needed_to_append(&[A, A]),
        Err(CacheError::DuplicateSequence(A))
    );
    assert!(!m.can_append_slots(&[A, x]));
    assert!(matches!(
        m.mark_computed(A, &tokens(0, 6)),
        Err(CacheError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.slot(A, 5),
        Err(CacheError::TokenOutOfRange { .. })
    ));
    assert_eq!(m.num_tokens(x), Err(CacheError::UnknownSequence(x)));
    assert_eq!(m.device_refcount(crate::cache::DeviceBlockId(8)), None);
    assert_eq!(m.host_refcount(crate::cache::HostBlockId(4)), None);
    assert_eq!(m, before);
}

#[test]
fn invalid_configurations_are_rejected() {
    for config in [
        CacheConfig::new(0, 8, 0),
        CacheConfig::new(4, 0, 0),
        CacheConfig::new(4, 8, 0).with_watermark_blocks(8),
    ] {
        assert!(matches!(
            BlockManager::new(config),
            Err(CacheError::InvalidConfig(_))
        ));
    }
    assert_eq!(CacheConfig::new(16, 1000, 0).watermark_blocks, 10);
}

#[test]
fn stats_count_blocks_tokens_and_sharing() {
    let mut m = manager(4, 8, 4);
    let s = m.stats();
    assert_eq!(
        (s.device.total, s.device.free, s.host.total, s.utilization()),
        (8, 8, 4, 1.0)
    );
    m.allocate(A, &tokens(0, 10)).unwrap();
    m.fork(A, B).unwrap();
    let s = m.stats();
    assert_eq!(
        (s.device.used, s.stored_tokens, s.logical_tokens),
        (3, 10, 20)
    );
    assert!((s.utilization() - 10.0 / 12.0).abs() < 1e-12);
    m.append_slot(A).unwrap();
    let s = m.stats();
    assert_eq!((s.device.used, s.stored_tokens, s.cow_copies), (4, 13, 1));
    m.take_ops();
    m.swap_out(&[B]).unwrap();
    let s = m.stats();
    assert_eq!(
        (s.device_sequences, s.swapped_sequences, s.host.used),
        (1, 1, 3)
    );
    assert_eq!(
        (s.device.used, s.stored_tokens, s.swapped_out_blocks),
        (3, 11, 3)
    );
    m.check_invariants().unwrap();
}

#[test]
fn a_prompt_can_be_admitted_with_slots_for_its_first_chunk_and_grow() {
    let mut m = manager(4, 5, 0);
    let p = tokens(0, 18); // five blocks in all
    let cached = m.allocate_group_slots(&[(A, &p, 6)]).unwrap();
    assert_eq!(cached, vec![0]);
    assert_eq!(m.num_tokens(A), Ok(6));
    assert_eq!(m.block_table(A).unwrap().len(), 2);
    assert_eq!(m.blocks_needed_to_grow(&[(A, 6)]), Ok(0));
    assert_eq!(m.blocks_needed_to_grow(&[(A, 13)]), Ok(2));
    m.grow_to(A, 13).unwrap();
    assert_eq!(m.block_table(A).unwrap().len(), 4);
    m.check_invariants().unwrap();
    // Another sequence takes the last block: growing A to the end fails, changing nothing.
    m.allocate(B, &[1]).unwrap();
    assert!(!m.can_grow(&[(A, 18)]));
    let before = m.clone();
    assert!(matches!(
        m.grow_to(A, 18),
        Err(CacheError::OutOfBlocks {
            needed: 1,
            available: 0
        })
    ));
    assert_eq!(m, before);
    m.free(B).unwrap();
    m.grow_to(A, 18).unwrap();
    assert_eq!(m.num_tokens(A), Ok(18));
    m.check_invariants().unwrap();
}

#[test]
fn slots_at_admission_cover_the_cache_hits_and_one_more_token() {
    let mut m = super::prefix_manager(4, 8);
    let p = tokens(0, 13);
    m.allocate(A, &p).unwrap();
    m.mark_computed(A, &p).unwrap();
    m.free(A).unwrap();
    // Asked for no slots, B still gets its 12 cached tokens and the next one.
    assert_eq!(m.allocate_group_slots(&[(B, &p, 0)]), Ok(vec![12]));
    assert_eq!(m.num_tokens(B), Ok(13));
    // And never more than its prompt.
    assert_eq!(m.allocate_group_slots(&[(C, &[7, 7], 9)]), Ok(vec![0]));
    assert_eq!(m.num_tokens(C), Ok(2));
    m.check_invariants().unwrap();
}
