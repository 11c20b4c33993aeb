//! Pinned prefixes survive any pressure and shrink what one request may get; forgotten
//! prefixes are never hit again.

use super::{prefix_manager, tokens, A, B, C};
use crate::cache::{AllocStatus, CacheError, PinId};

#[test]
fn a_pinned_prefix_is_never_evicted() {
    let mut m = prefix_manager(2, 8);
    let sys = tokens(0, 6); // three full blocks
    m.allocate(A, &[&sys[..], &[99]].concat()).unwrap();
    m.mark_computed(A, &[&sys[..], &[99]].concat()).unwrap();
    m.free(A).unwrap();
    let (pin, held) = m.pin_prefix(&sys).unwrap();
    assert_eq!(held, 6);
    assert_eq!(m.num_pinned_blocks(), 3);
    assert_eq!(m.group_capacity(), 5);
    m.check_invariants().unwrap();
    // The other five blocks serve a request; a sixth can never be had.
    assert_eq!(m.can_allocate(&tokens(100, 12)), AllocStatus::Never);
    assert!(matches!(
        m.allocate(B, &tokens(100, 12)),
        Err(CacheError::ExceedsCapacity { capacity: 5, .. })
    ));
    m.allocate(B, &tokens(100, 10)).unwrap();
    m.mark_computed(B, &tokens(100, 10)).unwrap();
    m.free(B).unwrap();
    // A prompt that starts with the pinned prefix hits all of it, and its pinned blocks do
    // not count against it: 3 pinned + 5 fresh blocks in an 8-block pool.
    let long = [&sys[..], &tokens(200, 10)[..]].concat();
    assert_eq!(m.can_allocate(&long), AllocStatus::Now);
    assert_eq!(m.allocate(C, &long), Ok(6));
    m.check_invariants().unwrap();
    m.free(C).unwrap();
    m.unpin(pin).unwrap();
    assert_eq!(m.unpin(pin), Err(CacheError::UnknownPin(pin.0)));
    assert_eq!(m.num_pinned_blocks(), 0);
    assert_eq!(m.stats().device.used, 0);
    m.check_invariants().unwrap();
}

#[test]
fn pins_are_bounded_and_need_a_cached_prefix() {
    let mut m = prefix_manager(2, 8);
    assert_eq!(m.pin_prefix(&tokens(0, 4)), Err(CacheError::NothingToPin));
    let long = tokens(0, 11); // five full blocks
    m.allocate(A, &long).unwrap();
    m.mark_computed(A, &long).unwrap();
    let before = m.clone();
    assert!(matches!(
        m.pin_prefix(&long),
        Err(CacheError::PinTooLarge { pinned: 5, .. })
    ));
    assert_eq!(m, before, "a refused pin changed the manager");
    // Four blocks are half the pool; the same prefix pinned twice holds them once.
    let (p1, _) = m.pin_prefix(&long[..8]).unwrap();
    let (p2, _) = m.pin_prefix(&long[..8]).unwrap();
    assert_eq!(m.num_pinned_blocks(), 4);
    let a = m.block_table(A).unwrap().to_vec();
    assert_eq!(
        m.device_refcount(a[0]),
        Some(1),
        "pins are not table references"
    );
    m.check_invariants().unwrap();
    m.free(A).unwrap();
    m.unpin(p2).unwrap();
    assert_eq!(m.num_pinned_blocks(), 4);
    m.unpin(p1).unwrap();
    m.check_invariants().unwrap();
    assert_eq!(m.stats().device.cached, 5);
    assert_ne!(p1, PinId(p2.0 + 1));
}

#[test]
fn a_forgotten_prefix_is_not_reused() {
    let mut m = prefix_manager(2, 8);
    let conv = tokens(0, 7);
    m.allocate(A, &conv).unwrap();
    m.mark_computed(A, &conv).unwrap();
    // Forgotten while in use: A keeps its blocks, nobody else finds them.
    let chain = m.forget_prefix(&conv);
    assert_eq!(chain.len(), 3);
    assert_eq!(chain[1].1, Some(chain[0].0));
    m.check_invariants().unwrap();
    assert_eq!(m.allocate(B, &conv), Ok(0));
    m.free(A).unwrap();
    m.free(B).unwrap();
    m.check_invariants().unwrap();
    // B's own blocks were never named (A's names were taken first, then forgotten)...
    assert_eq!(m.stats().device.cached, 0);
    // ...and once computed and freed, forgetting puts them back on the free list.
    m.allocate(C, &conv).unwrap();
    m.mark_computed(C, &conv).unwrap();
    m.free(C).unwrap();
    assert_eq!(m.stats().device.cached, 3);
    m.forget_prefix(&conv);
    let st = m.stats();
    assert_eq!((st.device.cached, st.device.free), (0, 8));
    assert_eq!(m.allocate(A, &conv), Ok(0));
    m.check_invariants().unwrap();
}
