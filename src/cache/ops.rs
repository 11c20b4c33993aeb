//! The block operations one engine step must carry out before its forward pass, as
//! decided by the block manager: copy-on-write copies inside the device pool, and swaps
//! between the device pool and the host pool. Plans, not actions (like vLLM's block
//! manager, which returns copy lists rather than copying): the cache engine executes them.
//!
//! Execution order within one step: all of `swap_out`, then all of `swap_in`, then all of
//! `copies`. The manager guarantees that in this order every operation reads the content it
//! means to read, and that within each list the writes commute:
//!
//! - `copies`: destinations are distinct and none is also a source (the `copy_blocks`
//!   kernel runs all pairs at once); one source may feed several destinations;
//! - `swap_in`: device destinations are distinct and are not copy destinations;
//! - `swap_out`: host destinations are distinct.
//!
//! A swap-out source may well be a swap-in or copy destination of the same step: a block
//! freed by the swap-out and reused, which is why swap-out goes first. The opposite case (a
//! block written by the plan, then swapped out) would read stale data; the lists alone
//! cannot tell the two apart, so the manager refuses it when it happens
//! (`CacheError::BlocksInFlight`). [`BlockOps::check`] verifies the rules the lists can show;
//! the GPU side may call it before launching.

use super::ids::{DeviceBlockId, HostBlockId};
use std::collections::HashSet;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockOps {
    /// `(src, dst)`: copy device block `src` onto device block `dst`.
    pub copies: Vec<(DeviceBlockId, DeviceBlockId)>,
    /// `(device, host)`: save a device block to the host pool.
    pub swap_out: Vec<(DeviceBlockId, HostBlockId)>,
    /// `(host, device)`: restore a host block into the device pool.
    pub swap_in: Vec<(HostBlockId, DeviceBlockId)>,
}

impl BlockOps {
    pub fn is_empty(&self) -> bool {
        self.copies.is_empty() && self.swap_out.is_empty() && self.swap_in.is_empty()
    }

    /// The copies as raw `(src, dst)` block indices, as `kernels::copy_blocks` takes them.
    pub fn copy_pairs(&self) -> Vec<(u32, u32)> {
        self.copies.iter().map(|&(s, d)| (s.0, d.0)).collect()
    }

    /// Checks the ordering and aliasing rules in the module docs.
    pub fn check(&self) -> Result<(), String> {
        let copy_srcs: HashSet<_> = self.copies.iter().map(|p| p.0).collect();
        let mut copy_dsts = HashSet::new();
        for &(src, dst) in &self.copies {
            if !copy_dsts.insert(dst) {
                return Err(format!("copy destination {dst} is written twice"));
            }
            if copy_srcs.contains(&dst) {
                return Err(format!(
                    "{dst} is both a copy source and a copy destination"
                ));
            }
            if src == dst {
                return Err(format!("{src} is copied onto itself"));
            }
        }
        let mut swap_in_dsts = HashSet::new();
        for &(_, dst) in &self.swap_in {
            if !swap_in_dsts.insert(dst) {
                return Err(format!("swap-in destination {dst} is written twice"));
            }
            if copy_dsts.contains(&dst) {
                return Err(format!("{dst} is written by both a swap-in and a copy"));
            }
        }
        let mut swap_out_dsts = HashSet::new();
        for &(_, dst) in &self.swap_out {
            if !swap_out_dsts.insert(dst) {
                return Err(format!("swap-out destination {dst} is written twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_rejects_each_hazard() {
        let d = DeviceBlockId;
        let h = HostBlockId;
        // d4 swapped out, then reused for a swap-in: fine, swap-out runs first.
        let ok = BlockOps {
            copies: vec![(d(1), d(2)), (d(1), d(3))],
            swap_out: vec![(d(1), h(0)), (d(4), h(2))],
            swap_in: vec![(h(1), d(4))],
        };
        ok.check().unwrap();
        assert_eq!(ok.copy_pairs(), vec![(1, 2), (1, 3)]);
        let bad = [
            BlockOps {
                copies: vec![(d(1), d(2)), (d(3), d(2))],
                ..ok.clone()
            },
            BlockOps {
                copies: vec![(d(1), d(2)), (d(2), d(3))],
                ..ok.clone()
            },
            BlockOps {
                swap_in: vec![(h(1), d(2))],
                ..ok.clone()
            },
            BlockOps {
                swap_in: vec![(h(1), d(4)), (h(2), d(4))],
                ..ok.clone()
            },
            BlockOps {
                swap_out: vec![(d(1), h(0)), (d(5), h(0))],
                ..ok.clone()
            },
        ];
        for ops in bad {
            assert!(ops.check().is_err(), "{ops:?} passed");
        }
    }
}
