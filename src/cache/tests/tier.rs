//! The host tier of the prefix cache: evicted named blocks are copied down, found again by
//! later prompts and copied up; the tier keeps its budget and yields to swapping.

use super::{tokens, A, B, C};
use crate::cache::{BlockManager, CacheConfig, DeviceBlockId, HostBlockId};

/// Prefix caching with a host pool of `host` blocks, `tier` of which the tier may hold.
fn tier_manager(block_size: usize, device: usize, host: usize, tier: usize) -> BlockManager {
    let config = CacheConfig::new(block_size, device, host)
        .with_watermark_blocks(0)
        .with_prefix_caching(true)
        .with_host_tier(tier);
    BlockManager::new(config).unwrap()
}

/// Computes `prompt` as `seq` and frees it, leaving its full blocks cached on the device.
fn compute_and_free(m: &mut BlockManager, seq: crate::cache::SeqId, prompt: &[u32]) {
    m.allocate(seq, prompt).unwrap();
    m.mark_computed(seq, prompt).unwrap();
    m.free(seq).unwrap();
    assert!(m.take_ops().is_empty());
    m.check_invariants().unwrap();
}

#[test]
fn evicted_blocks_go_down_and_come_back_up() {
    let mut m = tier_manager(2, 4, 4, 4);
    let a = tokens(0, 5); // two full blocks and one partial
    compute_and_free(&mut m, A, &a);
    assert_eq!(m.stats().device.cached, 2);

    // B takes every device block: the two free ones, then A's two cached ones.
    m.allocate(B, &tokens(100, 8)).unwrap();
    m.check_invariants().unwrap();
    let ops = m.take_ops();
    assert_eq!(ops.swap_out.len(), 2, "{ops:?}");
    // The deepest block is evicted first (it was released first), so it goes down first.
    let down: Vec<HostBlockId> = ops.swap_out.iter().rev().map(|p| p.1).collect();
    // Each copy down names its host block after the device block it read.
    let names: Vec<_> = down.iter().map(|&h| m.host_tier_name(h).unwrap()).collect();
    assert_eq!(names[0].tokens, &a[0..2]);
    assert_eq!(names[1].tokens, &a[2..4]);
    assert_eq!(names[1].parent, Some(names[0].hash));
    let t = m.tier_stats();
    assert_eq!((t.blocks, t.saves, t.hits), (2, 2, 0));
    assert_eq!(m.stats().host.cached, 2);
    m.check_invariants().unwrap();
    m.mark_computed(B, &tokens(100, 8)).unwrap();
    m.free(B).unwrap();
    m.check_invariants().unwrap();
    // B's blocks were not evicted, so nothing goes down.
    assert!(m.take_ops().swap_out.is_empty());

    // A again: both blocks come up from the tier into device blocks, named at once.
    assert_eq!(m.allocate(C, &a), Ok(4));
    let table = m.block_table(C).unwrap().to_vec();
    let ops = m.take_ops();
    assert_eq!(ops.swap_in, vec![(down[0], table[0]), (down[1], table[1])]);
    assert!(m.is_cached(table[0]) && m.is_cached(table[1]));
    // The copies down of B's evicted blocks went to the other two host blocks: the tier
    // still names A's blocks, which stay there.
    assert_eq!(m.host_tier_name(down[0]).unwrap().tokens, &a[0..2]);
    let stats = m.stats();
    assert_eq!((stats.prefix_hits, stats.host_tier.hits), (2, 2));
    m.check_invariants().unwrap();
    m.check_contents(|s| (s == C).then_some(&a[..])).unwrap();
}

#[test]
fn a_prompt_can_hit_the_device_and_then_the_tier() {
    let mut m = tier_manager(2, 6, 4, 4);
    let a = tokens(0, 7); // three full blocks
    compute_and_free(&mut m, A, &a);
    // Evicting takes the least recently released first: the deepest block, then the
    // middle one; the head stays on the device.
    m.allocate(B, &tokens(100, 6)).unwrap(); // 3 free blocks
    m.mark_computed(B, &tokens(100, 6)).unwrap();
    m.allocate(C, &tokens(200, 4)).unwrap(); // evicts two of A's
    assert_eq!(m.take_ops().swap_out.len(), 2);
    m.free(C).unwrap();
    m.free(B).unwrap();
    m.check_invariants().unwrap();
    let d = crate::cache::SeqId(9);
    assert_eq!(m.allocate(d, &a), Ok(6));
    let ops = m.take_ops();
    assert_eq!(ops.swap_in.len(), 2, "one block hit on the device: {ops:?}");
    assert_eq!(m.stats().host_tier.hits, 2);
    m.check_invariants().unwrap();
}

#[test]
fn a_group_shares_one_copy_up() {
    let mut m = tier_manager(2, 4, 4, 4);
    let a = tokens(0, 3);
    compute_and_free(&mut m, A, &a);
    m.allocate(B, &tokens(100, 8)).unwrap();
    assert_eq!(m.take_ops().swap_out.len(), 1);
    m.free(B).unwrap();
    // Two prompts that start with A's block, admitted together: one device block, shared.
    let p1 = [&a[..2], &[7, 7][..]].concat();
    let p2 = [&a[..2], &[8][..]].concat();
    let cached = m.allocate_group(&[(A, &p1[..]), (C, &p2[..])]).unwrap();
    assert_eq!(cached, vec![2, 2]);
    let (t1, t2) = (m.block_table(A).unwrap(), m.block_table(C).unwrap());
    assert_eq!(t1[0], t2[0]);
    assert_eq!(m.device_refcount(t1[0]), Some(2));
    assert_eq!(m.take_ops().swap_in.len(), 1);
    m.check_invariants().unwrap();
}

#[test]
fn the_tier_keeps_its_budget() {
    // Room in the host pool for 4, but the tier may hold 1.
    let mut m = tier_manager(2, 4, 4, 1);
    compute_and_free(&mut m, A, &tokens(0, 5));
    m.allocate(B, &tokens(100, 8)).unwrap();
    let ops = m.take_ops();
    assert_eq!(ops.swap_out.len(), 1, "{ops:?}");
    assert_eq!(m.tier_stats().blocks, 1);
    m.check_invariants().unwrap();
    // Later copies down replace the least recently used tier block.
    m.mark_computed(B, &tokens(100, 8)).unwrap();
    m.free(B).unwrap();
    m.allocate(C, &tokens(200, 8)).unwrap();
    let ops = m.take_ops();
    assert_eq!(ops.swap_out.len(), 1);
    let t = m.tier_stats();
    assert_eq!((t.blocks, t.evictions), (1, 1));
    m.check_invariants().unwrap();
}

#[test]
fn swapping_takes_tier_blocks_when_the_host_pool_is_full() {
    let mut m = tier_manager(2, 4, 2, 2);
    compute_and_free(&mut m, A, &tokens(0, 5));
    m.allocate(B, &tokens(100, 8)).unwrap();
    assert_eq!(m.take_ops().swap_out.len(), 2);
    assert_eq!(m.num_free_host_blocks(), 0);
    assert_eq!(m.num_available_host_blocks(), 2);
    // B (4 blocks) cannot go out: only 2 host blocks. A smaller sequence can.
    assert!(!m.can_swap_out(&[B]));
    m.free(B).unwrap();
    m.allocate(C, &tokens(300, 3)).unwrap();
    assert!(m.can_swap_out(&[C]));
    let moved = m.swap_out(&[C]).unwrap();
    assert_eq!(moved.len(), 2);
    let t = m.tier_stats();
    assert_eq!((t.blocks, t.evictions), (0, 2));
    m.check_invariants().unwrap();
    m.take_ops();
    m.check_invariants().unwrap();
}

#[test]
fn write_through_copies_blocks_down_as_they_are_named() {
    let config = CacheConfig::new(2, 8, 4)
        .with_watermark_blocks(0)
        .with_prefix_caching(true)
        .with_host_tier(4)
        .with_tier_write_through(true);
    let mut m = BlockManager::new(config).unwrap();
    let a = tokens(0, 5);
    m.allocate(A, &a).unwrap();
    assert!(!m.has_tier_saves());
    m.mark_computed(A, &a).unwrap();
    assert!(m.has_tier_saves());
    let table = m.block_table(A).unwrap().to_vec();
    let ops = m.take_ops();
    let read: Vec<DeviceBlockId> = ops.swap_out.iter().map(|p| p.0).collect();
    assert_eq!(read, table[..2]);
    assert!(!m.has_tier_saves());
    // The device keeps its copies; a name the tier has is not copied twice.
    assert!(m.is_cached(table[0]));
    m.free(A).unwrap();
    m.allocate(B, &tokens(100, 16)).unwrap();
    assert!(m.take_ops().swap_out.is_empty());
    assert_eq!(m.tier_stats().saves, 2);
    m.check_invariants().unwrap();
}

#[test]
fn inserted_blocks_are_hits() {
    let mut m = tier_manager(2, 4, 4, 4);
    let a = tokens(0, 5);
    let h0 = crate::cache::hash_block(None, &a[0..2]);
    let h1 = crate::cache::hash_block(Some(h0), &a[2..4]);
    let x = m.insert_host_tier(h0, None, &a[0..2]).unwrap();
    assert_eq!(
        m.insert_host_tier(h0, None, &a[0..2]),
        None,
        "already there"
    );
    assert_eq!(
        m.insert_host_tier(h1, Some(h0), &a[2..3]),
        None,
        "not a full block"
    );
    let y = m.insert_host_tier(h1, Some(h0), &a[2..4]).unwrap();
    assert_ne!(x, y);
    assert_eq!(m.cached_prefix_blocks(&a), 2);
    m.check_invariants().unwrap();
    assert_eq!(m.allocate(A, &a), Ok(4));
    let ops = m.take_ops();
    assert_eq!(
        ops.swap_in.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![x, y]
    );
    // A name already on the device is not inserted.
    assert_eq!(m.insert_host_tier(h0, None, &a[0..2]), None);
    m.check_invariants().unwrap();
}

#[test]
fn no_tier_without_prefix_caching_or_budget() {
    let m = BlockManager::new(CacheConfig::new(2, 4, 4).with_host_tier(4)).unwrap();
    assert_eq!(m.tier_stats().budget, 0);
    let bad = CacheConfig::new(2, 4, 4)
        .with_prefix_caching(true)
        .with_host_tier(5);
    assert!(BlockManager::new(bad).is_err());
    let bad = CacheConfig::new(2, 4, 4).with_tier_write_through(true);
    assert!(BlockManager::new(bad).is_err());
}

#[test]
fn a_voided_plan_leaves_no_name_behind() {
    let mut m = tier_manager(2, 4, 4, 4);
    let a = tokens(0, 5);
    compute_and_free(&mut m, A, &a);
    m.allocate(B, &tokens(100, 8)).unwrap();
    m.take_ops();
    m.free(B).unwrap();
    // A comes up from the tier, but the step fails before its plan runs: the copied-up
    // blocks are named without their content, and the engine voids everything.
    assert_eq!(m.allocate(C, &a), Ok(4));
    assert!(!m.pending_ops().swap_in.is_empty());
    m.free(C).unwrap();
    m.void_ops();
    m.check_invariants().unwrap();
    let st = m.stats();
    assert_eq!((st.device.cached, st.host.cached), (0, 0));
    assert_eq!((st.device.used, st.host.used), (0, 0));
    assert_eq!(m.allocate(A, &a), Ok(0), "a stale name was trusted");
    m.check_invariants().unwrap();
}

#[test]
fn a_touched_tier_block_is_evicted_last() {
    let mut m = tier_manager(2, 4, 4, 2);
    let names: Vec<_> = (0..3u32)
        .map(|i| crate::cache::hash_block(None, &[i, i]))
        .collect();
    for (i, &h) in names.iter().enumerate().take(2) {
        m.insert_host_tier(h, None, &[i as u32, i as u32]).unwrap();
    }
    m.touch_host_tier(names[0]);
    // The tier is at its budget of 2: the third takes the least recently used, now the
    // second.
    m.insert_host_tier(names[2], None, &[2, 2]).unwrap();
    assert!(m.has_cached_name(names[0]) && m.has_cached_name(names[2]));
    assert!(!m.has_cached_name(names[1]));
    assert!(!m.has_device_name(names[0]));
    m.check_invariants().unwrap();
}
