//! The GPU context: one adapter, device and queue, either created here or handed over by a
//! host application that already renders with wgpu on its own device.
//!
//! Devices are requested with the adapter's real limits (not wgpu's conservative defaults),
//! since the KV pool and large weights need every byte of binding size the hardware allows.
//! wgpu errors are caught with error scopes around each fallible step and returned as
//! [`GpuError`]s; on a device created here, errors nobody captured are recorded rather than
//! panicking, and a lost device is reported on the next call.

use super::bindings::{BindGroupStats, Bindings};
use super::pipeline::PipelineCache;
use super::profile::{Profiler, TimingMethod};
use super::select::{
    choose_adapter, choose_after_loss, no_adapter, AdapterRequest, AdapterSummary,
};
use crate::error::{GpuError, Result};
use std::sync::{Arc, Mutex};

/// Optional capabilities that kernels may use when present.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `enable f16;` in shaders.
    pub shader_f16: bool,
    /// Subgroup operations.
    pub subgroups: bool,
    /// Timestamp queries (kernel profiling).
    pub timestamp_query: bool,
}

impl Capabilities {
    fn of(features: wgpu::Features) -> Self {
        Capabilities {
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        }
    }

    fn features(self) -> wgpu::Features {
        let mut f = wgpu::Features::empty();
        f.set(wgpu::Features::SHADER_F16, self.shader_f16);
        f.set(wgpu::Features::SUBGROUP, self.subgroups);
        f.set(wgpu::Features::TIMESTAMP_QUERY, self.timestamp_query);
        f
    }
}

/// A description of one adapter, for `pagellm devices` and for logs.
#[derive(Clone, Debug)]
pub struct AdapterReport {
    /// Name, backend, type and driver.
    pub info: wgpu::AdapterInfo,
    /// The limits it offers.
    pub limits: wgpu::Limits,
    /// The optional features pagellm's kernels use.
    pub caps: Capabilities,
    /// Its memory, where the driver reports it (see [`GpuContext::memory`]).
    pub memory: Option<super::DeviceMemory>,
}

/// Lists every adapter the enabled backends can see.
pub fn enumerate_adapters(backends: wgpu::Backends) -> Vec<AdapterReport> {
    let instance = new_instance(backends);
    ready_now(instance.enumerate_adapters(backends))
        .unwrap_or_default()
        .into_iter()
        .map(|a| AdapterReport {
            info: a.get_info(),
            limits: a.limits(),
            caps: Capabilities::of(a.features()),
            memory: super::memory::injected_from_env().or_else(|| super::adapter_memory(&a)),
        })
        .collect()
}

/// The adapters on `req`'s backends, with their summaries, in enumeration order.
fn adapters_for(req: &AdapterRequest) -> (Vec<wgpu::Adapter>, Vec<AdapterSummary>) {
    let instance = new_instance(req.backends);
    let adapters = ready_now(instance.enumerate_adapters(req.backends)).unwrap_or_default();
    let summaries = adapters
        .iter()
        .map(|a| AdapterSummary::of(&a.get_info()))
        .collect();
    (adapters, summaries)
}

/// Percent of the memory budget a driver reports (Vulkan with `VK_EXT_memory_budget`,
/// DX12) past which wgpu refuses new buffers as out of memory on the devices pagellm opens,
/// rather than letting them spill or the device be lost: a refused KV pool is then retried
/// smaller, and weights that do not fit say so (`runner/fit.rs`).
pub const MEMORY_BUDGET_PERCENT: u8 = 95;

fn new_instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    desc.memory_budget_thresholds.for_resource_creation = Some(MEMORY_BUDGET_PERCENT);
    wgpu::Instance::new(desc)
}

/// How many spare buffers [`GpuContext::spare`] has.
pub const SPARE_BUFFERS: usize = 2;

/// Longest a wait holds the GL backend's context lock on a device shared with an
/// application (see [`GpuContext::from_existing`]).
pub const SHARED_GL_WAIT_SLICE: std::time::Duration = std::time::Duration::from_micros(500);

/// The environment variable that makes a context refuse buffers over so many bytes, as
/// a device short of memory would (see [`GpuContext::with_allocation_limit`]).
pub const ALLOCATION_LIMIT_VAR: &str = "PAGELLM_INJECT_ALLOCATION_LIMIT";

/// Errors noticed outside any error scope, and device loss, recorded for the next check.
#[derive(Default)]
struct Health {
    lost: Option<String>,
    uncaptured: Option<String>,
}

/// A device and queue plus what pagellm needs to know about them. Cheap to share in an
/// [`Arc`]; every method takes `&self`.
pub struct GpuContext {
    /// The adapter the device was created on.
    pub adapter: wgpu::Adapter,
    /// The device pagellm records on (the application's own, when shared).
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// The adapter's name, backend, type and driver.
    pub info: wgpu::AdapterInfo,
    /// The device's limits, which kernels and buffers stay within.
    pub limits: wgpu::Limits,
    /// The optional features the device has.
    pub caps: Capabilities,
    health: Arc<Mutex<Health>>,
    pub(crate) pipelines: PipelineCache,
    pub(crate) bindings: Bindings,
    wait_slice: Option<std::time::Duration>,
    profiler: std::sync::OnceLock<Profiler>,
    spares: std::sync::OnceLock<Vec<wgpu::Buffer>>,
    /// Whether pagellm opened the device (and so may open another when it is lost), and
    /// the request it chose the adapter by, when there was one.
    owned: bool,
    request: Option<AdapterRequest>,
    /// Buffers over this many bytes are refused as out of memory (fault injection).
    allocation_limit: Option<u64>,
    /// What [`Self::memory`] reports instead of the driver's figures (fault injection).
    pub(super) memory_report: Option<super::memory::DeviceMemory>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({})", self.describe())
    }
}

impl GpuContext {
    /// Creates a context on the adapter chosen by the environment (see [`AdapterRequest`]).
    pub fn from_env() -> Result<Self> {
        Self::new(&AdapterRequest::from_env()?)
    }

    /// Creates an instance, picks an adapter per `req` and opens a device with the adapter's
    /// full limits and the optional features it has.
    pub fn new(req: &AdapterRequest) -> Result<Self> {
        let (adapters, summaries) = adapters_for(req);
        if summaries.is_empty() {
            return Err(no_adapter(req));
        }
        let adapter = adapters
            .into_iter()
            .nth(choose_adapter(&summaries, req)?)
            .ok_or_else(|| no_adapter(req))?;
        let mut ctx = Self::open(adapter)?;
        ctx.request = Some(req.clone());
        Ok(ctx)
    }

    /// A new device for an engine whose device was lost, opened as this one was: on the
    /// same adapter if it is still there (a driver reset), else on the one this context's
    /// adapter request picks among those left (see
    /// [`choose_after_loss`](super::select::choose_after_loss)). Only for devices pagellm
    /// opened natively ([`Self::is_own`]); an application that shares its device hands the
    /// engine a new one itself (`EngineBuilder::on_device_lost`), and a browser's device
    /// comes back through [`Self::open_async`].
    pub fn reopen(&self) -> Result<Self> {
        let lost_on = AdapterSummary::of(&self.info);
        if !self.owned || cfg!(target_arch = "wasm32") {
            return Err(GpuError::RequestDevice {
                adapter: lost_on.describe(),
                message: "pagellm did not open this device, so it cannot open another in its \
                          place (the application gives one through its device-lost callback)"
                    .into(),
            });
        }
        let req = match &self.request {
            Some(req) => req.clone(),
            None => AdapterRequest {
                backends: wgpu::Backends::from(self.info.backend),
                ..AdapterRequest::default()
            },
        };
        let (adapters, summaries) = adapters_for(&req);
        let i = choose_after_loss(&summaries, &lost_on, &req)?;
        let adapter = adapters
            .into_iter()
            .nth(i)
            .ok_or_else(|| no_adapter(&req))?;
        let mut ctx = Self::open(adapter)?;
        ctx.request = Some(req);
        ctx.wait_slice = self.wait_slice;
        ctx.allocation_limit = self.allocation_limit;
        ctx.memory_report = self.memory_report;
        Ok(ctx)
    }

    /// The device pagellm would open on `adapter`: the adapter's full limits (large storage
    /// bindings hold weights and KV pools) and the optional features pagellm's kernels use
    /// where the adapter has them (f16 shaders, subgroups, timestamp queries). An application
    /// that creates its own device for rendering and inference passes this to
    /// `request_device` (or to its toolkit's device hook), then hands the device to
    /// [`GpuContext::from_existing`]; a device opened with less still works, with the
    /// kernels' fallbacks and the device's smaller limits.
    pub fn device_descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
        wgpu::DeviceDescriptor {
            label: Some("pagellm"),
            required_features: Capabilities::of(adapter.features()).features(),
            required_limits: adapter.limits(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }
    }

    fn open(adapter: wgpu::Adapter) -> Result<Self> {
        let info = adapter.get_info();
        let desc = Self::device_descriptor(&adapter);
        let requested =
            ready_now(adapter.request_device(&desc)).ok_or_else(|| GpuError::RequestDevice {
                adapter: format!("{} ({:?})", info.name, info.backend),
                message: "the adapter did not answer at once (a browser's adapters answer \
                          later: use GpuContext::open_async)"
                    .into(),
            })?;
        Self::own(adapter, requested)
    }

    /// Opens pagellm's own device on `adapter` as [`Self::new`] does, awaiting the device
    /// (a browser's adapters answer later; the page gets its adapter from
    /// `wgpu::Instance::request_adapter`). The context watches the device as its own:
    /// a lost device or an error that escaped every scope fails the next call.
    pub async fn open_async(adapter: wgpu::Adapter) -> Result<Self> {
        let desc = Self::device_descriptor(&adapter);
        let requested = adapter.request_device(&desc).await;
        Self::own(adapter, requested)
    }

    fn own(
        adapter: wgpu::Adapter,
        requested: std::result::Result<(wgpu::Device, wgpu::Queue), wgpu::RequestDeviceError>,
    ) -> Result<Self> {
        let info = adapter.get_info();
        let (device, queue) = requested.map_err(|e| GpuError::RequestDevice {
            adapter: format!("{} ({:?})", info.name, info.backend),
            message: e.to_string(),
        })?;
        let health = Arc::new(Mutex::new(Health::default()));
        {
            let h = health.clone();
            device.set_device_lost_callback(move |reason, msg| {
                if let Ok(mut h) = h.lock() {
                    h.lost = Some(format!("{reason:?}: {msg}"));
                }
            });
            let h = health.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                tracing::error!("uncaptured GPU error: {e}");
                if let Ok(mut h) = h.lock() {
                    h.uncaptured.get_or_insert_with(|| e.to_string());
                }
            }));
        }
        let mut ctx = Self::assemble(adapter, device, queue, health);
        ctx.owned = true;
        if std::env::var("PAGELLM_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0") {
            ctx.enable_profiling();
        }
        Ok(ctx)
    }

    /// Wraps a device that a host application already owns. pagellm uses the device's own
    /// limits and features and leaves its error and device-lost handlers alone: errors from
    /// pagellm's work are caught by error scopes and returned from the call that caused them.
    ///
    /// On GL, waits for the GPU are cut into slices of [`SHARED_GL_WAIT_SLICE`]: wgpu's GL
    /// backend holds its one context lock for the whole of a wait, so an unsliced wait of
    /// the thread that runs pagellm would stall every GL call of the application's render
    /// thread until pagellm's work finished. Other backends wait without such a lock.
    pub fn from_existing(adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let gl = adapter.get_info().backend == wgpu::Backend::Gl;
        let mut ctx = Self::assemble(
            adapter,
            device,
            queue,
            Arc::new(Mutex::new(Health::default())),
        );
        ctx.wait_slice = gl.then_some(SHARED_GL_WAIT_SLICE);
        ctx
    }

    /// Waits for the GPU in slices of at most `slice` (releasing the backend's locks in
    /// between), or in one blocking wait with `None`. See [`Self::from_existing`].
    pub fn with_wait_slice(mut self, slice: Option<std::time::Duration>) -> Self {
        self.wait_slice = slice;
        self
    }

    /// The slice waits are cut into, if any (see [`Self::with_wait_slice`]).
    pub fn wait_slice(&self) -> Option<std::time::Duration> {
        self.wait_slice
    }

    fn assemble(
        adapter: wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        health: Arc<Mutex<Health>>,
    ) -> Self {
        GpuContext {
            info: adapter.get_info(),
            limits: device.limits(),
            caps: Capabilities::of(device.features()),
            adapter,
            device,
            queue,
            health,
            pipelines: PipelineCache::default(),
            bindings: Bindings::default(),
            wait_slice: None,
            profiler: std::sync::OnceLock::new(),
            spares: std::sync::OnceLock::new(),
            owned: false,
            request: None,
            allocation_limit: allocation_limit_from_env(),
            memory_report: super::memory::injected_from_env(),
        }
    }

    /// Refuses every buffer over `bytes` as out of memory (`None`: none), as a device
    /// short of memory would, so that what pagellm does then (a smaller KV pool, a message
    /// saying what a model needs) can be checked on any machine. `PAGELLM_INJECT_ALLOCATION_LIMIT`
    /// sets it for every context.
    pub fn with_allocation_limit(mut self, bytes: Option<u64>) -> Self {
        self.allocation_limit = bytes;
        self
    }

    /// The limit of [`Self::with_allocation_limit`], if any.
    pub fn allocation_limit(&self) -> Option<u64> {
        self.allocation_limit
    }

    /// Whether pagellm opened this device ([`Self::new`], [`Self::from_env`],
    /// [`Self::open_async`]) rather than adopting an application's
    /// ([`Self::from_existing`]).
    pub fn is_own(&self) -> bool {
        self.owned
    }

    /// Records that the device was lost, so that the next call on this context fails with
    /// [`GpuError::DeviceLost`] and an engine running on it recovers on a new device.
    /// pagellm watches the devices it opens itself; an application that shares its device
    /// keeps the device's one lost callback (`wgpu::Device::set_device_lost_callback`) and
    /// calls this from it, since a lost device's errors are otherwise silent (WebGPU
    /// reports nothing for work on a lost device).
    pub fn report_device_lost(&self, reason: impl Into<String>) {
        if let Ok(mut h) = self.health.lock() {
            h.lost.get_or_insert_with(|| reason.into());
        }
    }

    /// Why the device was lost, if it is known to be.
    pub fn lost(&self) -> Option<String> {
        self.health.lock().ok().and_then(|h| h.lost.clone())
    }

    /// Spare storage buffer `i` (of [`SPARE_BUFFERS`]; 256 bytes each, distinct): what a
    /// kernel's writable binding is given when the dispatch writes nothing through it.
    /// Binding the dispatch's real output there instead would alias it, which WebGPU
    /// forbids for writable bindings (see `check_aliasing` in `gpu/batch.rs`).
    pub fn spare(&self, i: usize) -> &wgpu::Buffer {
        &self.spares.get_or_init(|| {
            (0..SPARE_BUFFERS)
                .map(|_| {
                    self.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("spare"),
                        size: 256,
                        usage: wgpu::BufferUsages::STORAGE,
                        mapped_at_creation: false,
                    })
                })
                .collect()
        })[i]
    }

    /// "name (Backend, DeviceType)".
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?})",
            self.info.name, self.info.backend, self.info.device_type
        )
    }

    /// The largest range of one buffer that a single storage binding may cover.
    pub fn max_binding_bytes(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// Fails if the device was lost or an error escaped every error scope since the last check.
    pub fn check_health(&self) -> Result<()> {
        let mut h = self
            .health
            .lock()
            .map_err(|_| GpuError::DeviceLost("poisoned".into()))?;
        if let Some(lost) = &h.lost {
            return Err(GpuError::DeviceLost(lost.clone()));
        }
        if let Some(msg) = h.uncaptured.take() {
            return Err(GpuError::Validation {
                context: "earlier GPU work".into(),
                message: msg,
            });
        }
        Ok(())
    }

    /// Runs `f` inside validation and out-of-memory error scopes and turns what they caught
    /// into a [`GpuError`] naming `context`.
    pub fn scoped<R>(&self, context: &str, f: impl FnOnce() -> R) -> Result<R> {
        self.check_health()?;
        if cfg!(target_arch = "wasm32") {
            // A browser answers a scope's pop only later, through the event loop; a scope
            // popped and dropped here would swallow its errors. Without scopes they reach
            // the device's handler (installed on pagellm's own device, see `own`), and the
            // next call that checks the device's health fails with them.
            return Ok(f());
        }
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        // Natively a scope's errors are known when it is popped.
        let val = ready_now(val.pop()).flatten();
        let oom = ready_now(oom.pop()).flatten();
        if let Some(e) = oom {
            return Err(map_error(context, e));
        }
        if let Some(e) = val {
            return Err(map_error(context, e));
        }
        Ok(out)
    }

    /// Drops every cached bind group, and with them the buffers that only they kept alive
    /// (see `gpu/bindings.rs`; groups no batch uses are dropped anyway after a few submits).
    /// An [`Engine`](crate::engine::Engine) calls this when it is dropped.
    pub fn release_bind_groups(&self) {
        self.bindings.release();
    }

    /// How often recording found its bind group cached, and how many groups are cached.
    pub fn bind_group_stats(&self) -> BindGroupStats {
        self.bindings.stats()
    }

    /// Turns on per-kernel timing for every batch recorded from now on (see
    /// `gpu/profile.rs`); `PAGELLM_PROFILE=1` does this for the contexts pagellm opens
    /// itself ([`Self::new`], [`Self::from_env`]), not for adopted ones. Returns the
    /// profiler, whose figures [`Profiler::take`] hands out.
    pub fn enable_profiling(&self) -> &Profiler {
        self.enable_profiling_with(TimingMethod::Timestamps)
    }

    /// Like [`Self::enable_profiling`] with the timing method asked for (timestamps fall
    /// back to one submit per dispatch on a device without timestamp queries). The first
    /// call fixes the method.
    pub fn enable_profiling_with(&self, method: TimingMethod) -> &Profiler {
        self.profiler.get_or_init(|| {
            let stamps = self
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY);
            let method = match method {
                TimingMethod::Timestamps if stamps => TimingMethod::Timestamps,
                _ => TimingMethod::SubmitPerDispatch,
            };
            Profiler::new(method, self.queue.get_timestamp_period())
        })
    }

    /// The profiler, when profiling is on.
    pub fn profiler(&self) -> Option<&Profiler> {
        self.profiler.get()
    }

    /// The profile so far as a table per phase (see [`super::profile::report`]), which
    /// then starts again empty; `None` when profiling is off.
    pub fn take_profile_report(&self) -> Option<String> {
        let p = self.profiler()?;
        Some(super::profile::report(
            p.method(),
            &self.describe(),
            &p.take(),
        ))
    }

    /// Lets the device make progress without waiting: the callbacks of finished work run
    /// (reads become ready, [`crate::gpu::InFlightRead`]). Natively something must poll for
    /// that to happen; in the browser the event loop does it and this does nothing.
    pub fn poll(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
        self.check_health()
    }

    /// Blocks until all work submitted so far is done (in slices, see
    /// [`Self::from_existing`]); a profiled context counts the time as waiting. In a
    /// browser (wasm32) nothing may wait: this is an error ([`GpuError::CannotWait`]).
    pub fn wait(&self) -> Result<()> {
        let Some(p) = self.profiler() else {
            return self.wait_untimed();
        };
        let t = web_time::Instant::now();
        let r = self.wait_untimed();
        p.host(None, Default::default(), Default::default(), t.elapsed());
        r
    }

    pub(crate) fn wait_untimed(&self) -> Result<()> {
        if cfg!(target_arch = "wasm32") {
            // WebGPU lands work only when control returns to the browser's event loop.
            return Err(GpuError::CannotWait("a blocking GPU call".into()));
        }
        let lost = |e: wgpu::PollError| GpuError::DeviceLost(e.to_string());
        match self.wait_slice {
            None => {
                self.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(lost)?;
            }
            Some(slice) => {
                // The target is fixed at the first slice: work submitted meanwhile (the
                // application's next frames) is not waited for.
                let target = self.queue.submit([]);
                loop {
                    match self.device.poll(wgpu::PollType::Wait {
                        submission_index: Some(target.clone()),
                        timeout: Some(slice),
                    }) {
                        Ok(_) => break,
                        Err(wgpu::PollError::Timeout) => std::thread::yield_now(),
                        Err(e) => return Err(lost(e)),
                    }
                }
            }
        }
        self.check_health()
    }
}

/// `PAGELLM_INJECT_ALLOCATION_LIMIT`, when it is set to a number of bytes (anything else is
/// ignored with a warning).
fn allocation_limit_from_env() -> Option<u64> {
    let v = std::env::var(ALLOCATION_LIMIT_VAR).ok()?;
    if v.trim().is_empty() {
        return None;
    }
    match v.trim().parse::<u64>() {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            tracing::warn!("{ALLOCATION_LIMIT_VAR}={v:?} is not a number of bytes ({e}); ignored");
            None
        }
    }
}

fn map_error(context: &str, e: wgpu::Error) -> GpuError {
    match e {
        wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory {
            context: context.to_string(),
        },
        wgpu::Error::Validation { description, .. } => GpuError::Validation {
            context: context.to_string(),
            message: description,
        },
        wgpu::Error::Internal { description, .. } => GpuError::Internal {
            context: context.to_string(),
            message: description,
        },
    }
}

/// The output of a future ready at its first poll, without blocking: wgpu's adapters,
/// devices and error scopes answer at once natively. `None` where it is not ready (a
/// browser answers later), which callers report rather than wait for.
pub(crate) fn ready_now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => Some(out),
        std::task::Poll::Pending => None,
    }
}
