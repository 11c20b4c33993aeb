//! A live KV budget: the device pool shrinks and grows while the engine serves, so an
//! application sharing the GPU can hand memory to a game or a browser and take it back.
//! Shrinking evicts the cached blocks beyond the new size (to the host tier, if there is
//! one) and preempts the running groups whose blocks lie there (newest first, by swap or
//! recomputation, `scheduler/resize.rs`), carries out those copies and swap-outs, copies
//! the blocks that stay into a smaller pool and lets the old one go; growing copies into a
//! larger pool and the next step admits what waits. Requests only pause: nothing they
//! produce changes, and a request fails only if it can never fit the smaller pool (with the
//! reason, at the next scheduling pass). A device lost during a resize is recovered from,
//! and the resize done on the new device.

use super::core::{watermark, Engine};
use super::error::{EngineError, Result};
use super::recovery::lost_reason;
use crate::pool::PoolSize;

/// What a change of the KV budget did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolResize {
    /// Blocks of the device pool before and after.
    pub blocks_before: usize,
    pub blocks_after: usize,
    /// Its bytes on the device before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Running groups preempted to make room (swapped out or requeued).
    pub preempted_groups: usize,
}

impl Engine {
    /// Gives the runner's pool `blocks` blocks; where the device refuses a larger pool as
    /// out of memory, as many as it gives between `before` and `blocks` (halving the
    /// growth). Returns the blocks the pool has.
    fn resize_fitting(&mut self, mut blocks: usize, before: usize) -> Result<usize> {
        loop {
            match self.runner.resize_pool(blocks) {
                Ok(()) => return Ok(blocks),
                Err(crate::error::GpuError::OutOfMemory { context }) if blocks > before + 1 => {
                    let smaller = before + (blocks - before) / 2;
                    tracing::warn!(
                        "the device refused a KV pool of {blocks} blocks ({context}); trying \
                         {smaller}"
                    );
                    blocks = smaller;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Resizes the device KV pool to `size` (blocks, or as many blocks as fit the bytes)
    /// between steps; see the module docs. Refused while a step is in flight, below the
    /// blocks one sequence of the full context needs, and below pinned prefix blocks; on a
    /// device error (an allocation refused) the pool keeps its size, and preempted groups
    /// come back as usual.
    pub fn set_kv_budget(&mut self, size: PoolSize) -> Result<PoolResize> {
        if self.in_flight {
            return Err(EngineError::Internal(
                "the KV budget changes between steps; end the step in flight first".into(),
            ));
        }
        let pool = self.runner.pool();
        let per_block = pool.layout.block_bytes_all_layers();
        let blocks = match size {
            PoolSize::Blocks(n) => n,
            PoolSize::Bytes(b) => (b / per_block) as usize,
        };
        if blocks < self.pool_needed {
            return Err(EngineError::Config(format!(
                "a KV budget of {blocks} blocks ({} bytes) holds less than one sequence of the \
                 full context, which needs {} blocks ({} bytes); lower max_model_len to go \
                 lower",
                blocks as u64 * per_block,
                self.pool_needed,
                self.pool_needed as u64 * per_block
            )));
        }
        let pinned = self.scheduler.blocks().pinned_above(blocks);
        if pinned > 0 {
            return Err(EngineError::Config(format!(
                "{pinned} pinned prefix blocks lie beyond a pool of {blocks} blocks; unpin the \
                 prefixes (Engine::unpin_prefix) before shrinking below them"
            )));
        }
        let mut report = PoolResize {
            blocks_before: pool.num_blocks,
            bytes_before: pool.total_bytes(),
            ..PoolResize::default()
        };
        if blocks < report.blocks_before {
            report.preempted_groups = self.scheduler.vacate_above(blocks)?;
        }
        let ops = self.scheduler.take_block_ops();
        if let Err(e) = self.runner.execute(&ops) {
            // Swap-outs that did not happen leave host blocks without their content: a
            // lost device is recovered from (and the resize tried again on the new one),
            // anything else fails what is pending, as a failed step does.
            self.on_fault(e.into())?;
            return self.set_kv_budget(size);
        }
        if blocks != report.blocks_before {
            let blocks = match self.resize_fitting(blocks, report.blocks_before) {
                Ok(blocks) => blocks,
                Err(e) if lost_reason(&self.ctx, &e).is_some() => {
                    self.on_fault(e)?;
                    return self.set_kv_budget(size);
                }
                // An allocation the device refused: the old pool stays, intact.
                Err(e) => return Err(e),
            };
            let mark = watermark(blocks, self.pool_needed);
            self.scheduler.resize_pool(blocks, mark)?;
            self.recovery.set_pool_blocks(blocks);
        }
        report.blocks_after = self.runner.pool().num_blocks;
        report.bytes_after = self.runner.pool().total_bytes();
        tracing::info!(?report, "KV budget changed");
        Ok(report)
    }
}
