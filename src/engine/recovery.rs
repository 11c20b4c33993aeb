//! What the engine keeps to come back from a lost device (see `recover.rs`, which does
//! it): how to get a new device, what to rebuild on it, the injected losses, and the
//! counts of losses and recoveries.

use super::error::{EngineError, Result};
use crate::error::GpuError;
use crate::faults::{DeviceLossInjection, DEVICE_LOSS_VAR};
use crate::gpu::GpuContext;
use crate::mapped::ModelSource;
use crate::model::ModelConfig;
use crate::runner::RunnerSpec;
use std::sync::Arc;
use std::time::Duration;

/// Losses in a row (no step completed in between, new devices lost while loading
/// included) the engine recovers from before it fails what is pending.
pub const MAX_CONSECUTIVE_LOSSES: u32 = 3;

/// What the engine calls for a new device after an application's device was lost: given
/// why it was lost, a context on the application's new device (see
/// [`GpuContext::from_existing`]), or `None` to decline, which fails the pending requests
/// with the reason. Called on the engine's thread, inside a step.
pub type DeviceLostFn = Box<dyn FnMut(&str) -> Option<Arc<GpuContext>> + Send>;

/// Lost devices and recoveries, for statistics and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceStats {
    /// Times the device was found lost (while running; losses at the first load are not
    /// counted here).
    pub losses: u64,
    /// Times the engine came back on a new device.
    pub recoveries: u64,
    /// Times it gave up and failed the pending requests.
    pub gave_up: u64,
    /// Groups requeued to be recomputed because their blocks were on the lost device.
    pub recomputed_groups: u64,
    /// Swapped groups that came through a loss in host memory.
    pub kept_swapped: u64,
    /// Tokens whose KV was computed again after losses.
    pub recomputed_tokens: u64,
    /// How long the latest recovery took (new device, weights, pools).
    pub last_recovery: Duration,
}

/// What the engine keeps to rebuild itself on a new device.
pub(super) struct Recovery {
    pub(super) inject: DeviceLossInjection,
    /// `inject.reload`, until the first rebuild uses it.
    pub(super) reload_pending: bool,
    pub(super) handler: Option<DeviceLostFn>,
    /// Steps begun, for the injection's step numbers.
    pub(super) steps_begun: u64,
    /// Losses since a step last completed.
    pub(super) consecutive: u32,
    pub(super) stats: DeviceStats,
    pub(super) model: ModelSource,
    pub(super) spec: RunnerSpec,
    /// The target model's configuration and the draft's pool bytes, to reopen a draft.
    pub(super) target: ModelConfig,
    pub(super) max_model_len: usize,
    pub(super) draft_pool_bytes: u64,
}

/// Everything [`Recovery::new`] needs, as the engine has it while it opens.
pub(super) struct RebuildSpec {
    pub model: ModelSource,
    pub spec: RunnerSpec,
    pub target: ModelConfig,
    pub max_model_len: usize,
    pub draft_pool_bytes: u64,
}

impl Recovery {
    pub(super) fn new(
        r: RebuildSpec,
        inject: DeviceLossInjection,
        handler: Option<DeviceLostFn>,
    ) -> Self {
        Recovery {
            reload_pending: inject.reload,
            inject,
            handler,
            steps_begun: 0,
            consecutive: 0,
            stats: DeviceStats::default(),
            model: r.model,
            spec: r.spec,
            target: r.target,
            max_model_len: r.max_model_len,
            draft_pool_bytes: r.draft_pool_bytes,
        }
    }
}

impl Recovery {
    /// The device pool has `blocks` blocks now: a rebuilt one has as many.
    pub(super) fn set_pool_blocks(&mut self, blocks: usize) {
        self.spec.gpu_blocks = blocks;
    }

    pub(super) fn set_handler(&mut self, handler: Option<DeviceLostFn>) {
        self.handler = handler;
    }
}

/// The injection `config` asks for, or else the environment's.
pub(super) fn injection(config: &crate::config::EngineConfig) -> Result<DeviceLossInjection> {
    match &config.inject_device_loss {
        Some(i) => Ok(i.clone()),
        None => DeviceLossInjection::from_env().map_err(EngineError::Config),
    }
}

/// Why the device of `ctx` is lost, if it is: its recorded loss, or an error that says so.
pub(super) fn lost_reason(ctx: &GpuContext, e: &EngineError) -> Option<String> {
    // Device-lost callbacks run when the device is polled: give one the chance, so the
    // loss is known (an application's device learns of it only through its callback).
    let _ = ctx.device.poll(wgpu::PollType::Poll);
    if let Some(why) = ctx.lost() {
        return Some(why);
    }
    match e {
        EngineError::Gpu(GpuError::DeviceLost(why)) => Some(why.clone()),
        _ => None,
    }
}

/// A new device in place of `lost`'s: from the application's callback when one is
/// registered, else re-created when pagellm opened the device itself.
pub(super) fn new_device(
    handler: Option<&mut DeviceLostFn>,
    lost: &GpuContext,
    reason: &str,
) -> Result<Arc<GpuContext>> {
    if let Some(f) = handler {
        return f(reason).ok_or_else(|| {
            EngineError::Gpu(GpuError::DeviceLost(format!(
                "{reason}; the application's device-lost callback gave no new device"
            )))
        });
    }
    if lost.is_own() {
        return Ok(Arc::new(lost.reopen()?));
    }
    Err(EngineError::Gpu(GpuError::DeviceLost(format!(
        "{reason}; the device is the application's and no device-lost callback gives a \
         new one (EngineBuilder::on_device_lost, Engine::on_device_lost)"
    ))))
}

/// A weight-upload progress callback that destroys `ctx`'s device halfway, when `on`.
pub(super) fn destroy_halfway(ctx: &Arc<GpuContext>, on: bool) -> impl FnMut(u64, u64) {
    let ctx = ctx.clone();
    let mut armed = on;
    move |done, total| {
        if armed && total > 0 && done * 2 >= total {
            armed = false;
            destroy(&ctx, &format!("injected while loading ({DEVICE_LOSS_VAR})"));
        }
    }
}

/// Destroys `ctx`'s device on purpose, recording why (an application's device reports its
/// loss through the application's own callback, which injection cannot count on).
pub(super) fn destroy(ctx: &GpuContext, why: &str) {
    tracing::warn!("destroying the GPU device: {why}");
    ctx.report_device_lost(why);
    ctx.device.destroy();
}
