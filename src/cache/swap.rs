//! Swapping whole sequence groups between the device pool and the host pool, the
//! preemption-by-swapping of PagedAttention (Kwon et al., SOSP 2023, §4.5).
//!
//! Sharing is preserved both ways: within one call, every distinct block of the group moves
//! once, and all table entries that pointed at it point at its one copy, so a block shared
//! by two beams becomes one host block with two references (and comes back as one device
//! block with two references). A device block that a sequence outside the group also uses
//! is copied out and stays on the device for that sequence.

use super::block_table::Blocks;
use super::error::CacheError;
use super::groups::kv_id;
use super::ids::{DeviceBlockId, HostBlockId, SeqId};
use super::manager::{status, AllocStatus, BlockManager};
use super::prefix::hash_block;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

impl BlockManager {
    /// Whether the group's blocks fit the host pool now. No means: recompute the group
    /// instead (or preempt a different one).
    pub fn can_swap_out(&self, seqs: &[SeqId]) -> bool {
        matches!(self.swap_out_need(&self.expand(seqs)), Ok(n) if n <= self.host.available())
    }

    /// Moves every device block of the group to the host pool and frees the device blocks
    /// the group alone used. Returns the `(device, host)` copies, also recorded in the plan.
    pub fn swap_out(
        &mut self,
        seqs: &[SeqId],
    ) -> Result<Vec<(DeviceBlockId, HostBlockId)>, CacheError> {
        let group = seqs;
        let seqs = &*self.expand(group).into_owned();
        let needed = self.swap_out_need(seqs)?;
        // Host-tier blocks count as room: the tier yields to swapping.
        let free = self.host.available();
        if needed > free {
            return Err(CacheError::HostPoolFull { needed, free });
        }
        let BlockManager {
            device,
            host,
            seqs: all,
            plan,
            counters,
            ..
        } = self;
        let mut to_host: HashMap<DeviceBlockId, HostBlockId> = HashMap::new();
        let mut moved = Vec::with_capacity(needed);
        for id in seqs {
            let s = all.get_mut(id).ok_or(CacheError::UnknownSequence(*id))?;
            let Blocks::Device(table) = &s.blocks else {
                return Err(CacheError::Swapped(*id));
            };
            let mut host_table = Vec::with_capacity(table.len());
            for &d in table {
                let h = match to_host.entry(d) {
                    Entry::Occupied(e) => {
                        host.retain(*e.get());
                        *e.get()
                    }
                    Entry::Vacant(e) => {
                        let h = host.allocate().expect("host pool checked");
                        plan.record_swap_out(host, d, h);
                        moved.push((d, h));
                        *e.insert(h)
                    }
                };
                host_table.push(h);
            }
            // Deepest first, as in `free`, for the evictor's order.
            table.iter().rev().for_each(|&d| device.release(d));
            s.blocks = Blocks::Host(host_table);
        }
        counters.swapped_out_blocks += moved.len() as u64;
        tracing::debug!(?group, blocks = moved.len(), "swapped out");
        Ok(moved)
    }

    /// Whether the group can come back to the device now, leaving the watermark free.
    /// `Never` also answers a group that is malformed or not swapped out.
    pub fn can_swap_in(&self, seqs: &[SeqId]) -> AllocStatus {
        match self.swap_in_need(&self.expand(seqs)) {
            Ok(n) => status(self.admission(n, n)),
            Err(_) => AllocStatus::Never,
        }
    }

    /// Brings the group back into (possibly different) device blocks and frees its host
    /// blocks. Each sequence comes with its tokens (at least its slots), from which the
    /// restored blocks are named again for the prefix cache. Returns the `(host, device)`
    /// copies, also recorded in the plan.
    pub fn swap_in(
        &mut self,
        group: &[(SeqId, &[u32])],
    ) -> Result<Vec<(HostBlockId, DeviceBlockId)>, CacheError> {
        let groups = self.groups.len();
        let group: Vec<(SeqId, &[u32])> = group
            .iter()
            .flat_map(|&(s, t)| (0..groups).map(move |g| (kv_id(s, g), t)))
            .collect();
        let seqs: Vec<SeqId> = group.iter().map(|g| g.0).collect();
        let needed = self.swap_in_need(&seqs)?;
        for &(seq, tokens) in &group {
            self.check_tokens(seq, tokens)?;
        }
        self.admission(needed, needed)?;
        let bs = self.config.block_size;
        let BlockManager {
            device,
            host,
            seqs: all,
            plan,
            counters,
            ..
        } = self;
        let mut to_device: HashMap<HostBlockId, DeviceBlockId> = HashMap::new();
        let mut moved = Vec::with_capacity(needed);
        for &(id, tokens) in &group {
            let s = all.get_mut(&id).ok_or(CacheError::UnknownSequence(id))?;
            let Blocks::Host(table) = &s.blocks else {
                return Err(CacheError::NotSwapped(id));
            };
            let mut device_table = Vec::with_capacity(table.len());
            for &h in table {
                let d = match to_device.entry(h) {
                    Entry::Occupied(e) => {
                        device.retain(*e.get());
                        *e.get()
                    }
                    Entry::Vacant(e) => {
                        let d = device.allocate().expect("admission counted the blocks");
                        // Held before the table lets go, so the host block cannot be
                        // reused (and overwritten) before the swap-in has read it.
                        plan.hold_host(host, h);
                        plan.record_swap_in(device, h, d);
                        moved.push((h, d));
                        *e.insert(d)
                    }
                };
                device_table.push(d);
            }
            table.iter().for_each(|&h| host.release(h));
            // The restored blocks hold computed content again: name them, unless blocks
            // with the same content kept their names while this group was away.
            if let Some(cache) = device.cache_mut() {
                for (i, &hash) in s.hashes.iter().enumerate() {
                    let Some(j) = s.live_index(i) else {
                        continue; // a hole
                    };
                    let parent = s.parent(i);
                    let tokens = &tokens[i * bs..(i + 1) * bs];
                    cache.register(device_table[j], hash, parent, tokens);
                }
            }
            s.blocks = Blocks::Device(device_table);
        }
        counters.swapped_in_blocks += moved.len() as u64;
        tracing::debug!(group = ?seqs, blocks = moved.len(), "swapped in");
        Ok(moved)
    }

    /// `tokens` covers the slots of `seq` and matches the names of its blocks.
    fn check_tokens(&self, seq: SeqId, tokens: &[u32]) -> Result<(), CacheError> {
        let s = self.seq(seq)?;
        if tokens.len() < s.num_tokens {
            return Err(CacheError::MissingTokens {
                seq,
                given: tokens.len(),
                num_tokens: s.num_tokens,
            });
        }
        let bs = self.config.block_size;
        let mut parent = s.root;
        for (i, &hash) in s.hashes.iter().enumerate() {
            if hash_block(parent, &tokens[i * bs..(i + 1) * bs]) != hash {
                return Err(CacheError::TokensMismatch(seq));
            }
            parent = Some(hash);
        }
        Ok(())
    }

    /// Host blocks the group needs: its distinct device blocks.
    fn swap_out_need(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        self.check_group(seqs)?;
        let mut distinct = HashSet::new();
        for &id in seqs {
            let table = self
                .seq(id)?
                .device_blocks()
                .ok_or(CacheError::Swapped(id))?;
            for &b in table {
                // Swap-out runs first in a step, before the plan's writes land.
                if self.plan.writes(b) {
                    return Err(CacheError::BlocksInFlight(id));
                }
                distinct.insert(b);
            }
        }
        Ok(distinct.len())
    }

    /// Device blocks the group needs: its distinct host blocks.
    fn swap_in_need(&self, seqs: &[SeqId]) -> Result<usize, CacheError> {
        self.check_group(seqs)?;
        let mut distinct = HashSet::new();
        for &id in seqs {
            let table = self
                .seq(id)?
                .host_blocks()
                .ok_or(CacheError::NotSwapped(id))?;
            distinct.extend(table.iter().copied());
        }
        Ok(distinct.len())
    }
}
