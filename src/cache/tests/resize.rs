//! The device pool resized: growing adds free blocks (handed out after those already free);
//! shrinking refuses while a sequence or a pin holds a block beyond the new size and then
//! changes nothing, evicts cached blocks there (copying them down to the host tier), and
//! keeps every invariant; a lost device forgets every device name and the host names of
//! blocks that never landed.

use super::{manager, tokens, A, B};
use crate::cache::{BlockManager, CacheConfig, CacheError, DeviceBlockId, HostBlockId};

fn tiered(block_size: usize, device: usize, host: usize) -> BlockManager {
    let config = CacheConfig::new(block_size, device, host)
        .with_watermark_blocks(0)
        .with_prefix_caching(true)
        .with_host_tier(host);
    BlockManager::new(config).unwrap()
}

#[test]
fn growing_adds_free_blocks_after_those_already_free() {
    let mut m = manager(2, 4, 0);
    m.allocate(A, &tokens(0, 4)).unwrap(); // blocks 0 and 1
    m.resize_device(8, 1).unwrap();
    m.check_invariants().unwrap();
    let s = m.stats().device;
    assert_eq!((s.total, s.used, s.free), (8, 2, 6));
    assert_eq!(m.config().watermark_blocks, 1);
    // The blocks free before the resize go first.
    m.allocate(B, &tokens(10, 4)).unwrap();
    assert_eq!(
        m.block_table(B).unwrap(),
        &[DeviceBlockId(2), DeviceBlockId(3)]
    );
}

#[test]
fn shrinking_refuses_a_held_block_and_then_changes_nothing() {
    let mut m = manager(2, 8, 0);
    m.allocate(A, &tokens(0, 6)).unwrap(); // blocks 0, 1, 2
    let before = m.clone();
    let e = m.resize_device(2, 0).unwrap_err();
    assert!(matches!(e, CacheError::BlockInUse(DeviceBlockId(2))), "{e}");
    assert_eq!(m, before);
    assert_eq!(m.sequences_above(2), vec![A]);
    assert!(m.sequences_above(3).is_empty());
    m.resize_device(3, 0).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.stats().device.total, 3);
    // A full pool now: nothing more fits.
    assert!(m.allocate(B, &tokens(10, 2)).is_err());
}

#[test]
fn shrinking_evicts_cached_blocks_down_to_the_host_tier() {
    let mut m = tiered(2, 6, 4);
    // A's four full blocks are computed, then released: cached, evictable.
    m.allocate(A, &tokens(0, 8)).unwrap();
    m.mark_computed(A, &tokens(0, 8)).unwrap();
    m.free(A).unwrap();
    assert!(m.take_ops().is_empty());
    assert_eq!(m.stats().device.cached, 4);
    assert_eq!(m.evict_cached_above(2), 2);
    let ops = m.take_ops();
    let read: Vec<u32> = ops.swap_out.iter().map(|p| p.0 .0).collect();
    assert_eq!(read, vec![3, 2], "the deepest first: {ops:?}");
    m.resize_device(2, 0).unwrap();
    m.check_invariants().unwrap();
    // The first two blocks hit on the device, the last two in the host tier.
    let (hits, _) = m.prefix_hits_in(None, &tokens(0, 9));
    assert_eq!(hits.len(), 4, "{hits:?}");
}

#[test]
fn a_lost_device_forgets_device_names_and_unlanded_host_names() {
    let mut m = tiered(2, 4, 4);
    m.allocate(A, &tokens(0, 4)).unwrap();
    m.mark_computed(A, &tokens(0, 4)).unwrap();
    m.free(A).unwrap();
    let _ = m.take_ops();
    // Both blocks go down to the tier; then the device is lost with the second block's copy
    // unlanded.
    assert_eq!(m.evict_cached_above(0), 2);
    let ops = m.take_ops();
    let unlanded: Vec<HostBlockId> = ops
        .swap_out
        .iter()
        .filter(|p| p.0 == DeviceBlockId(1))
        .map(|p| p.1)
        .collect();
    m.lose_device_contents(&unlanded);
    m.check_invariants().unwrap();
    assert_eq!(m.stats().device.cached, 0);
    let (hits, _) = m.prefix_hits_in(None, &tokens(0, 5));
    assert_eq!(hits.len(), 1, "only the landed copy remains: {hits:?}");
}

#[test]
fn pinned_blocks_beyond_the_new_size_refuse_the_shrink() {
    let config = CacheConfig::new(2, 8, 0)
        .with_watermark_blocks(0)
        .with_prefix_caching(true);
    let mut m = BlockManager::new(config).unwrap();
    m.allocate(A, &tokens(0, 4)).unwrap(); // blocks 0 and 1
    m.allocate(B, &tokens(100, 4)).unwrap(); // blocks 2 and 3
    m.mark_computed(B, &tokens(100, 4)).unwrap();
    m.free(B).unwrap();
    let (pin, held) = m.pin_prefix(&tokens(100, 4)).unwrap();
    assert_eq!(held, 4);
    assert_eq!(m.pinned_above(2), 2);
    assert_eq!(m.pinned_above(3), 1);
    assert_eq!(m.pinned_above(4), 0);
    let e = m.resize_device(2, 0).unwrap_err();
    assert!(e.to_string().contains("unpin"), "{e}");
    m.unpin(pin).unwrap();
    m.free(A).unwrap();
    m.resize_device(2, 0).unwrap();
    m.check_invariants().unwrap();
}
