//! Extra keys (a cache salt): blocks computed under one request's keys are hits only for
//! requests with the same keys, on the device and in the host tier, in every KV cache
//! group; pins and forgetting follow the keys; swapped and grouped sequences keep naming
//! their blocks under their own keys.

use super::{prefix_manager, tokens, A, B, C, D};
use crate::cache::{BlockManager, CacheConfig, ExtraKeys, KvGroups, SeqId};

/// Admits `seq` with `prompt` under `keys`, computes it and frees it; returns the cached
/// tokens it found at admission.
fn compute_and_free(m: &mut BlockManager, keys: ExtraKeys, seq: SeqId, prompt: &[u32]) -> usize {
    let cached = m
        .allocate_group_slots_keyed(keys, &[(seq, prompt, prompt.len())])
        .unwrap()[0];
    m.mark_computed(seq, prompt).unwrap();
    m.free(seq).unwrap();
    m.check_invariants().unwrap();
    cached
}

#[test]
fn salted_blocks_are_hits_only_under_the_same_salt() {
    let mut m = prefix_manager(4, 32);
    let prompt = tokens(0, 13); // three full blocks
    let (a, b) = (ExtraKeys::with_salt("alice"), ExtraKeys::with_salt("bob"));
    assert_eq!(compute_and_free(&mut m, a, A, &prompt), 0);
    assert_eq!(m.cached_prefix_blocks_keyed(a, &prompt), 3);
    // Another salt, and no salt, see nothing of alice's blocks.
    assert_eq!(m.cached_prefix_blocks_keyed(b, &prompt), 0);
    assert_eq!(m.cached_prefix_blocks(&prompt), 0);
    assert_eq!(compute_and_free(&mut m, b, B, &prompt), 0);
    assert_eq!(compute_and_free(&mut m, ExtraKeys::NONE, C, &prompt), 0);
    // Each salt now has its own three named blocks, and each hits its own.
    assert_eq!(m.stats().device.cached, 9);
    assert_eq!(compute_and_free(&mut m, a, D, &prompt), 12);
    assert_eq!(m.cached_prefix_blocks(&prompt), 3);
    assert_eq!(m.cached_prefix_blocks_keyed(b, &prompt), 3);
}

#[test]
fn a_salted_group_counts_only_its_own_hits_at_admission() {
    let mut m = prefix_manager(4, 6);
    let prompt = tokens(0, 17); // four full blocks and one more token: five blocks
    let salt = ExtraKeys::with_salt("s");
    // Held by a running sequence, the unsalted blocks cost nothing to an unsalted prompt,
    // but a salted one needs five blocks of its own where one is free.
    m.allocate(A, &prompt).unwrap();
    m.mark_computed(A, &prompt).unwrap();
    let with_slots = [(prompt.as_slice(), prompt.len())];
    assert_eq!(
        m.can_allocate_group_slots(&with_slots),
        crate::cache::AllocStatus::Now
    );
    assert_eq!(
        m.can_allocate_group_slots_keyed(salt, &with_slots),
        crate::cache::AllocStatus::Later
    );
}

#[test]
fn pins_and_forgetting_follow_the_salt() {
    let mut m = prefix_manager(2, 16);
    let prompt = tokens(0, 7);
    let salt = ExtraKeys::with_salt("tenant");
    compute_and_free(&mut m, salt, A, &prompt);
    compute_and_free(&mut m, ExtraKeys::NONE, B, &prompt);
    assert!(m
        .pin_prefix_keyed(ExtraKeys::with_salt("other"), &prompt)
        .is_err());
    let (_, held) = m.pin_prefix_keyed(salt, &prompt).unwrap();
    assert_eq!(held, 6);
    assert_eq!(m.num_pinned_blocks(), 3);
    // Forgetting the salted prefix leaves the unsalted one cached, and back.
    let chain = m.forget_prefix_keyed(salt, &prompt);
    assert_eq!(chain.len(), 3);
    assert_eq!(m.cached_prefix_blocks_keyed(salt, &prompt), 0);
    assert_eq!(m.cached_prefix_blocks(&prompt), 3);
    m.forget_prefix(&prompt);
    assert_eq!(m.cached_prefix_blocks(&prompt), 0);
    m.check_invariants().unwrap();
}

#[test]
fn a_salted_sequence_names_its_blocks_under_its_salt_after_a_swap() {
    let config = CacheConfig::new(2, 16, 16)
        .with_watermark_blocks(0)
        .with_prefix_caching(true);
    let mut m = BlockManager::new(config).unwrap();
    let salt = ExtraKeys::with_salt("x");
    let prompt = tokens(0, 5);
    m.allocate_group_slots_keyed(salt, &[(A, &prompt, 5)])
        .unwrap();
    m.mark_computed(A, &prompt).unwrap();
    m.swap_out(&[A]).unwrap();
    m.take_ops();
    // Drop the names the device kept: swapping in names the blocks again, chained from
    // the sequence's own root (and checks its tokens against its names on the way).
    assert_eq!(m.forget_prefix_keyed(salt, &prompt).len(), 2);
    assert_eq!(m.cached_prefix_blocks_keyed(salt, &prompt), 0);
    m.swap_in(&[(A, &prompt)]).unwrap();
    m.take_ops();
    m.check_invariants().unwrap();
    assert_eq!(m.cached_prefix_blocks_keyed(salt, &prompt), 2);
    assert_eq!(m.cached_prefix_blocks(&prompt), 0);
    // Its further blocks are named under the salt too.
    let longer = tokens(0, 9);
    m.grow_to(A, 9).unwrap();
    m.mark_computed(A, &longer).unwrap();
    assert_eq!(m.cached_prefix_blocks_keyed(salt, &longer), 4);
    assert_eq!(m.cached_prefix_blocks(&longer), 0);
    m.check_invariants().unwrap();
}

#[test]
fn every_kv_cache_group_keeps_salts_apart() {
    let config = CacheConfig::new(2, 60, 0)
        .with_watermark_blocks(0)
        .with_prefix_caching(true);
    let mut m = BlockManager::new(config)
        .unwrap()
        .with_groups(KvGroups::new(vec![None, Some(3), Some(3)], 4));
    let prompt = tokens(0, 9);
    let salt = ExtraKeys::with_salt("g");
    compute_and_free(&mut m, salt, A, &prompt);
    assert_eq!(m.cached_prefix_blocks(&prompt), 0);
    assert_eq!(m.cached_prefix_blocks_keyed(salt, &prompt), 4);
    // An unsalted prompt computes its own blocks in every group; both are hits afterwards.
    assert_eq!(compute_and_free(&mut m, ExtraKeys::NONE, B, &prompt), 0);
    assert_eq!(compute_and_free(&mut m, salt, C, &prompt), 8);
    assert_eq!(compute_and_free(&mut m, ExtraKeys::NONE, D, &prompt), 8);
}
