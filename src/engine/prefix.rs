//! What an application says about its prompts' cached blocks (pin a system prompt, forget a
//! deleted conversation, save everything now), and the disk tier's part in each step (read
//! the next requests' blocks before scheduling, write what a step named after it), over the
//! scheduler's prefix cache (`cache::PrefixCache`) and the disk tier (`tiers.rs`).

use super::core::Engine;
use super::error::{EngineError, Result};
use crate::cache::{BlockOps, PinId};

impl Engine {
    /// Pins the cached device blocks of `prefix` (say, a system prompt every request starts
    /// with, after one request has computed it) so they are never evicted; returns the pin
    /// and how many tokens it holds. Refused when nothing of the prefix is cached, or when
    /// the pins would leave the pool unable to hold one sequence of the full context (or
    /// hold more than half of it).
    pub fn pin_prefix(&mut self, prefix: &[u32]) -> Result<(PinId, usize)> {
        let max_model_len = self.max_model_len();
        let mut cache = self.scheduler.prefix_cache();
        match cache.pin_prefix_within(prefix, max_model_len)? {
            (Some(pin), held) => Ok((pin, held)),
            (None, held) => Err(EngineError::InvalidRequest(format!(
                "pinning {held} tokens would leave the KV pool unable to hold one sequence of \
                 {max_model_len} tokens; give more blocks (--num-gpu-blocks) or a smaller \
                 --max-model-len"
            ))),
        }
    }

    /// Lets go of a pin; its blocks stay cached until evicted.
    pub fn unpin_prefix(&mut self, pin: PinId) -> Result<()> {
        Ok(self.scheduler.prefix_cache().unpin(pin)?)
    }

    /// Forgets `prefix` (a conversation the user deleted) in every tier: no later prompt
    /// reuses its blocks on the device or in host memory, and its disk records are deleted.
    /// Requests running with it keep their blocks. Returns how many disk records went.
    pub fn forget_prefix(&mut self, prefix: &[u32]) -> usize {
        let mut cache = self.scheduler.prefix_cache();
        let chain = cache.forget_prefix(prefix);
        let bs = cache.block_size();
        match self.disk.as_mut() {
            Some(disk) => disk.forget(&chain, prefix, bs),
            None => 0,
        }
    }

    /// Copies every block named since the last step down to the host tier and on to disk
    /// now, rather than with the next step, waiting for the copy. [`Engine::step`] does this
    /// when the engine runs out of work; a driver of [`Engine::end_step`] calls it when it
    /// goes idle (or, if it must not wait, see [`Self::has_unsaved_prefix_blocks`]), and
    /// an application may call it before it exits.
    pub fn flush_prefix_tiers(&mut self) -> Result<()> {
        if self.disk.is_none() {
            return Ok(());
        }
        let Some(ops) = self.scheduler.prefix_cache().take_tier_saves() else {
            return Ok(());
        };
        self.runner.execute(&ops)?;
        self.store_to_disk(&ops);
        Ok(())
    }

    /// Whether blocks named since the last step still wait to be copied down to the disk
    /// tier. [`Self::flush_prefix_tiers`] waits for those copies; a driver that must not
    /// wait (a browser's) runs one more step when it goes idle instead: a step with no
    /// requests carries the copies and writes the records when it ends.
    pub fn has_unsaved_prefix_blocks(&self) -> bool {
        self.disk.is_some() && self.scheduler.blocks().has_tier_saves()
    }

    /// Before a step: reads the waiting requests' missing prompt blocks from the disk tier.
    pub(super) fn load_waiting_from_disk(&mut self) {
        if let Some(disk) = self.disk.as_mut() {
            disk.load_waiting(&mut self.scheduler, self.runner.host_pool_mut());
        }
    }

    /// After a step's copies have landed in host memory: writes the host-tier blocks that
    /// `ops` filled to the disk tier.
    pub(super) fn store_to_disk(&mut self, ops: &BlockOps) {
        if let Some(disk) = self.disk.as_mut() {
            disk.store(&self.scheduler.prefix_cache(), self.runner.host_pool(), ops);
        }
    }
}
