//! The pending plan of the current step, and the holds that keep it valid.
//!
//! Operations append to one pending [`BlockOps`] until the engine takes it with
//! `BlockManager::take_ops`, which ends the step. Blocks freed during a step may be reused
//! by later operations of the same step (that is how a preemption makes room at once), so
//! the plan protects the blocks it still has to read or write: each one holds one extra
//! reference until the plan is taken. Held are copy sources and destinations, swap-in
//! sources (host) and destinations (device), and swap-out destinations (host). A held block
//! cannot be reallocated, which is what keeps destinations distinct and never also sources.
//!
//! Swap-out sources are not held: swap-out runs first in a step, so it reads them before
//! anything in the plan writes, and the blocks it frees serve the same step. Two orders that
//! holds cannot fix are avoided by the manager instead: a sequence whose blocks this plan
//! writes is not swapped out in the same step, and a copy-on-write of a block that is itself
//! a pending copy destination copies from that copy's source (the content the destination
//! will have when the copies run).

use super::device::{DevicePool, HostPool};
use super::ids::{DeviceBlockId, HostBlockId};
use super::ops::BlockOps;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PendingPlan {
    pub ops: BlockOps,
    held_device: BTreeSet<DeviceBlockId>,
    held_host: BTreeSet<HostBlockId>,
    /// Copy destination -> its source.
    copy_source: BTreeMap<DeviceBlockId, DeviceBlockId>,
    swap_in_targets: BTreeSet<DeviceBlockId>,
}

impl PendingPlan {
    pub fn device_hold(&self, block: DeviceBlockId) -> u32 {
        self.held_device.contains(&block) as u32
    }

    pub fn host_hold(&self, block: HostBlockId) -> u32 {
        self.held_host.contains(&block) as u32
    }

    /// Whether executing this plan writes `block`.
    pub fn writes(&self, block: DeviceBlockId) -> bool {
        self.copy_source.contains_key(&block) || self.swap_in_targets.contains(&block)
    }

    /// The block whose current content `block` will hold once the copies have run.
    pub fn content_source(&self, block: DeviceBlockId) -> DeviceBlockId {
        self.copy_source.get(&block).copied().unwrap_or(block)
    }

    fn hold_device(&mut self, pool: &mut DevicePool, block: DeviceBlockId) {
        if self.held_device.insert(block) {
            pool.retain(block);
        }
    }

    pub fn hold_host(&mut self, host: &mut HostPool, block: HostBlockId) {
        if self.held_host.insert(block) {
            host.retain(block);
        }
    }

    pub fn record_copy(&mut self, pool: &mut DevicePool, src: DeviceBlockId, dst: DeviceBlockId) {
        // A swap-in destination may be a source (swap-in runs before the copies); a copy
        // destination may not: the caller passes its `content_source` instead.
        debug_assert!(
            !self.copy_source.contains_key(&src),
            "{src} is a pending copy destination"
        );
        self.hold_device(pool, src);
        self.hold_device(pool, dst);
        self.copy_source.insert(dst, src);
        self.ops.copies.push((src, dst));
    }

    pub fn record_swap_out(&mut self, host: &mut HostPool, src: DeviceBlockId, dst: HostBlockId) {
        self.hold_host(host, dst);
        self.ops.swap_out.push((src, dst));
    }

    /// The caller holds `src` itself (before dropping its table references).
    pub fn record_swap_in(&mut self, pool: &mut DevicePool, src: HostBlockId, dst: DeviceBlockId) {
        self.hold_device(pool, dst);
        self.swap_in_targets.insert(dst);
        self.ops.swap_in.push((src, dst));
    }

    /// Ends the step: returns the plan and releases its holds.
    pub fn take(&mut self, pool: &mut DevicePool, host: &mut HostPool) -> BlockOps {
        let plan = std::mem::take(self);
        for block in plan.held_device {
            pool.release(block);
        }
        for block in plan.held_host {
            host.release(block);
        }
        plan.ops
    }

    /// Every block the plan names is held, and the bookkeeping matches the lists.
    pub fn check(&self) -> Result<(), String> {
        self.ops.check()?;
        for &(src, dst) in &self.ops.copies {
            if !self.held_device.contains(&src) || !self.held_device.contains(&dst) {
                return Err(format!("plan: copy {src} -> {dst} is not held"));
            }
            if self.copy_source.get(&dst) != Some(&src) {
                return Err(format!("plan: copy {src} -> {dst} is not indexed"));
            }
        }
        if self.copy_source.len() != self.ops.copies.len() {
            return Err("plan: copy index and copy list disagree".into());
        }
        for &(src, dst) in &self.ops.swap_in {
            if !self.held_host.contains(&src) || !self.held_device.contains(&dst) {
                return Err(format!("plan: swap-in {src} -> {dst} is not held"));
            }
        }
        if self.swap_in_targets.len() != self.ops.swap_in.len() {
            return Err("plan: swap-in index and swap-in list disagree".into());
        }
        for &(src, dst) in &self.ops.swap_out {
            if !self.held_host.contains(&dst) {
                return Err(format!("plan: swap-out {src} -> {dst} is not held"));
            }
        }
        // And nothing else is held, or the hold would outlive its reason.
        let copied = self.ops.copies.iter().flat_map(|&(s, d)| [s, d]);
        let swapped_in = self.ops.swap_in.iter().map(|p| p.1);
        let named: BTreeSet<_> = copied.chain(swapped_in).collect();
        if named != self.held_device {
            return Err("plan: holds device blocks it does not name".into());
        }
        let host_named: BTreeSet<_> = (self.ops.swap_in.iter().map(|p| p.0))
            .chain(self.ops.swap_out.iter().map(|p| p.1))
            .collect();
        if host_named != self.held_host {
            return Err("plan: holds host blocks it does not name".into());
        }
        Ok(())
    }
}
