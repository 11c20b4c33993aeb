//! A lost device is a preemption of everything. When the device goes (a driver reset, a GPU
//! timeout, an unplugged external GPU, or `Device::destroy`), whatever step meets the loss
//! hands it here instead of failing the requests: the scheduler requeues every running
//! group for recomputation and keeps the swapped ones whose host blocks all arrived
//! (`scheduler/lost.rs`); the engine gets a new device (its own: re-created on the same
//! adapter or the next one; an application's: from the callback the application registered,
//! [`Engine::on_device_lost`]), uploads the weights again, builds a new pool and workspace,
//! takes over the host pool (swapped blocks and the host tier survive in host memory), and
//! goes on. Callers see a pause: every request's tokens, sampler state and constraint live
//! on the host, and the kernels compute a row the same whatever batch it is in, so greedy
//! and seeded outputs are those of an uninterrupted run.
//!
//! Recovery is bounded: a new device that is lost while the weights upload is replaced
//! again up to [`MAX_CONSECUTIVE_LOSSES`] times, and so many losses with no step completed
//! in between fail the pending requests with the reason (the engine then takes requests
//! again, and tries again when one comes). A browser's device cannot be re-created inside a
//! step (its device arrives asynchronously), so there a loss fails the pending requests.

use super::core::Engine;
use super::error::{EngineError, Result};
use super::recovery::MAX_CONSECUTIVE_LOSSES;
use super::recovery::{destroy, destroy_halfway, lost_reason, new_device, DeviceStats};
use crate::error::GpuError;
use crate::faults::DEVICE_LOSS_VAR;
use crate::gpu::GpuContext;
use crate::runner::{open_model, ModelRunner};
use std::sync::Arc;
use web_time::Instant;

impl Engine {
    /// Registers what gives the engine a new device when its device is lost: needed for an
    /// application's device ([`GpuContext::from_existing`]), whose replacement only the
    /// application can make; optional for the engine's own, which it re-creates itself
    /// otherwise. See [`DeviceLostFn`](super::DeviceLostFn).
    pub fn on_device_lost(
        &mut self,
        f: impl FnMut(&str) -> Option<Arc<GpuContext>> + Send + 'static,
    ) {
        self.recovery.handler = Some(Box::new(f));
    }

    /// Lost devices and recoveries so far.
    pub fn device_stats(&self) -> DeviceStats {
        self.recovery.stats
    }

    /// Counts a step begun and destroys the device after its submit when the injection
    /// names it.
    pub(super) fn step_begun(&mut self) {
        self.recovery.steps_begun += 1;
        let n = self.recovery.steps_begun;
        if self.recovery.inject.at_step(n) {
            destroy(
                &self.ctx,
                &format!("injected at step {n} ({DEVICE_LOSS_VAR})"),
            );
        }
    }

    /// A step completed: losses before it no longer count as in a row.
    pub(super) fn step_completed(&mut self) {
        self.recovery.consecutive = 0;
    }

    /// Handles a step's error that no single request caused: a lost device is recovered
    /// from (`Ok`: the requests go on); anything else, or a recovery that fails, fails
    /// every pending request and is returned.
    pub(super) fn on_fault(&mut self, e: EngineError) -> Result<()> {
        let Some(reason) = lost_reason(&self.ctx, &e) else {
            return Err(self.failed(e));
        };
        match self.recover(&reason) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.recovery.stats.gave_up += 1;
                self.recovery.consecutive = 0;
                Err(self.failed(e))
            }
        }
    }

    /// Requeues every group and rebuilds the engine on a new device (see the module docs).
    fn recover(&mut self, reason: &str) -> Result<()> {
        let start = Instant::now();
        tracing::warn!("the GPU device was lost ({reason}); recovering");
        let unlanded = self.runner.unlanded_host_blocks();
        let loss = self.scheduler.device_lost(&unlanded);
        let stats = &mut self.recovery.stats;
        stats.losses += 1;
        stats.recomputed_groups += loss.recomputed_groups as u64;
        stats.kept_swapped += loss.kept_swapped as u64;
        stats.recomputed_tokens += loss.recomputed_tokens;
        if cfg!(target_arch = "wasm32") {
            return Err(GpuError::DeviceLost(reason.to_string()).into());
        }
        let mut reason = reason.to_string();
        loop {
            self.recovery.consecutive += 1;
            if self.recovery.consecutive > MAX_CONSECUTIVE_LOSSES {
                return Err(EngineError::Gpu(GpuError::DeviceLost(format!(
                    "lost {MAX_CONSECUTIVE_LOSSES} times in a row without completing a step; \
                     the last time: {reason}"
                ))));
            }
            // No new device to be had is final; a new device lost while loading is not.
            let ctx = new_device(self.recovery.handler.as_mut(), &self.ctx, &reason)?;
            self.ctx = ctx.clone();
            match self.rebuild(ctx) {
                Ok(()) => break,
                Err(e) => match lost_reason(&self.ctx, &e) {
                    Some(again) => reason = again,
                    None => return Err(e),
                },
            }
        }
        self.recovery.stats.recoveries += 1;
        self.recovery.stats.last_recovery = start.elapsed();
        tracing::info!(
            seconds = start.elapsed().as_secs_f64(),
            requeued = loss.recomputed_groups,
            kept_swapped = loss.kept_swapped,
            adapter = %self.ctx.describe(),
            "recovered from the lost device"
        );
        Ok(())
    }

    /// The weights uploaded again on the new device `ctx` (already the engine's), new pools
    /// and workspace, the old host pool and a reopened draft model. On an error the engine
    /// keeps its old runner, whose device is lost, and tries again at its next step.
    fn rebuild(&mut self, ctx: Arc<GpuContext>) -> Result<()> {
        if self.config.profile {
            ctx.enable_profiling();
        }
        let r = &mut self.recovery;
        let reload = std::mem::take(&mut r.reload_pending);
        let (files, _) = open_model(&r.model)?;
        let mut runner =
            ModelRunner::load(ctx.clone(), &files, &r.spec, destroy_halfway(&ctx, reload))?;
        runner.adopt_host_pool(&mut self.runner)?;
        let draft = match &self.config.draft_model {
            Some(dir) => Some(super::draft::DraftModel::open(
                ctx.clone(),
                dir,
                &r.target,
                &self.config,
                r.max_model_len,
                r.draft_pool_bytes,
            )?),
            None => None,
        };
        // The new device may have given a smaller pool (`runner/fit.rs`: a smaller GPU
        // than the lost one); every group is off the device, so the block manager follows.
        let blocks = runner.pool().num_blocks;
        if blocks != self.scheduler.blocks().num_device_blocks() {
            let mark = super::core::watermark(blocks, self.pool_needed);
            self.scheduler.resize_pool(blocks, mark)?;
            self.recovery.set_pool_blocks(blocks);
        }
        self.runner = runner;
        self.draft = draft;
        ctx.check_health()?;
        Ok(())
    }
}
