//! [`EngineHandle`]: the engine on a thread of its own, the one engine loop in the
//! repository. The CLI, the HTTP server, the desktop chat example and the bindings all run
//! the engine through it; none of them steps an engine by hand.
//!
//! The thread owns the [`Engine`]: it loads the model (on its own device or on one the
//! application shares), then sleeps until requests come and steps while any is pending.
//! Everything else talks to it through a channel of commands and each request's own
//! channel of events, so no caller ever waits for the GPU: [`EngineHandle::submit`] checks
//! and prepares the request on the caller's thread (tokenizing, compiling a constraint) and
//! returns at once with a [`RequestStream`], whose events can be read blocking, with a
//! timeout, or awaited in async code. Statistics are published after steps for callers to
//! read at any time, and a [`Notice`] callback tells an event loop (a UI's repaint) that
//! something changed.

mod driver;
mod stream;

use crate::engine::{Engine, EngineConfig, EngineError, EngineStats, Intake, Request, RequestId};
use crate::gpu::GpuContext;
use crate::mapped::ModelSource;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

pub use stream::RequestStream;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Longest a busy engine goes without publishing its statistics, by default.
const STATS_EVERY: Duration = Duration::from_millis(50);

/// Where the engine thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineState {
    /// Loading the model.
    Loading {
        /// Bytes of weights uploaded.
        done: u64,
        /// Bytes of weights in all (0 until known).
        total: u64,
    },
    /// Taking requests.
    Ready,
    /// Loading failed, or the device was lost; the reason. Requests are refused.
    Failed(String),
    /// Shut down.
    Stopped,
}

/// What the engine thread tells an application's callback, on the engine thread; keep the
/// callback short (wake a UI, signal a condition), since the engine waits for it.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// Upload progress (at most once per percent).
    Loading {
        /// Bytes of weights uploaded.
        done: u64,
        /// Bytes of weights in all.
        total: u64,
    },
    /// The model is loaded; requests are taken.
    Ready(ModelInfo),
    /// The model did not load (the reason); every request is refused.
    LoadFailed(String),
    /// The device was lost and the engine recovered on a new one: the requests in flight
    /// were requeued (recomputed, or swapped back in) and go on. Sent after the step that
    /// met the loss.
    Recovered {
        /// The adapter the engine runs on now.
        adapter: String,
        /// How long the recovery took (new device, weights, pools).
        took: Duration,
    },
    /// A step ended: tokens may have arrived on request streams. `error` is set when the
    /// step failed for a reason no single request caused; every pending request has been
    /// failed with it, and the engine takes new requests unless its state says otherwise.
    Stepped {
        /// Tokens the step computed (prompt chunks and generated tokens).
        tokens: usize,
        /// How long it took.
        took: Duration,
        /// Why it failed, if it did.
        error: Option<String>,
    },
}

/// The loaded model, as the engine runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// The folder or file it was loaded from (for files in memory, their name).
    pub path: PathBuf,
    /// The context length requests are checked against (prompt and output together).
    pub max_model_len: usize,
    /// The vocabulary's size: token ids are below it.
    pub vocab_size: usize,
    /// The adapter, as `pagellm devices` names it.
    pub adapter: String,
    /// Seconds from the start of loading to the first request it could take.
    pub load_seconds: f64,
}

/// The engine's statistics after a recent step, with its recent throughput.
#[derive(Clone, Debug)]
pub struct StatsSnapshot {
    /// The engine's own statistics.
    pub engine: EngineStats,
    /// Steps run since loading.
    pub steps: u64,
    /// Tokens computed (prompt and generated) since loading.
    pub tokens_computed: u64,
    /// Tokens computed per second over about the last second of steps.
    pub computed_per_s: f64,
    /// Duration of the latest step.
    pub last_step: Duration,
}

type NoticeFn = Box<dyn FnMut(Notice) + Send>;

/// How to start an [`EngineHandle`]: the model, the engine's configuration, the device,
/// and an optional callback.
pub struct EngineBuilder {
    model: ModelSource,
    config: EngineConfig,
    context: Option<Arc<GpuContext>>,
    notice: Option<NoticeFn>,
    stats_every: Duration,
    on_lost: Option<crate::engine::DeviceLostFn>,
}

impl EngineBuilder {
    /// An engine for `model` (a Hugging Face folder or a GGUF file, or its files in memory:
    /// [`MemoryFiles`](crate::MemoryFiles)) with the default configuration, on a device of its own.
    pub fn new(model: impl Into<ModelSource>) -> Self {
        EngineBuilder {
            model: model.into(),
            config: EngineConfig::default(),
            context: None,
            notice: None,
            stats_every: STATS_EVERY,
            on_lost: None,
        }
    }

    /// What gives the engine a new device when its device is lost, during the load or
    /// while it runs (see [`Engine::on_device_lost`]): an application that shares its
    /// device ([`Self::device`], [`Self::context`]) registers this, makes a new device of
    /// its own in the callback and returns it wrapped by [`GpuContext::from_existing`] (or
    /// `None` to decline: the pending requests then fail). It also forwards its device's
    /// lost callback to [`GpuContext::report_device_lost`], since that callback is the
    /// application's. Without this, an engine on its own device re-creates the device
    /// itself.
    pub fn on_device_lost(
        mut self,
        f: impl FnMut(&str) -> Option<Arc<GpuContext>> + Send + 'static,
    ) -> Self {
        self.on_lost = Some(Box::new(f));
        self
    }

    /// The engine's configuration (the default without this call).
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs on the application's own device (see [`GpuContext::from_existing`]) instead
    /// of opening one.
    pub fn context(mut self, ctx: Arc<GpuContext>) -> Self {
        self.context = Some(ctx);
        self
    }

    /// Runs on the application's wgpu device and queue, from `adapter`.
    pub fn device(self, adapter: wgpu::Adapter, device: wgpu::Device, queue: wgpu::Queue) -> Self {
        self.context(Arc::new(GpuContext::from_existing(adapter, device, queue)))
    }

    /// Calls `f` on the engine thread when its state changes and after every step.
    pub fn on_notice(mut self, f: impl FnMut(Notice) + Send + 'static) -> Self {
        self.notice = Some(Box::new(f));
        self
    }

    /// Publishes statistics at most this often while busy (always when idle; 50 ms by
    /// default). Statistics walk every block table, which costs at a high step rate.
    pub fn stats_interval(mut self, every: Duration) -> Self {
        self.stats_every = every;
        self
    }

    /// Starts the engine thread and returns at once; the model loads on the thread
    /// ([`EngineHandle::state`] tells how far, [`EngineHandle::wait_ready`] waits).
    pub fn spawn(self) -> Result<EngineHandle> {
        let (commands, rx) = flume::unbounded();
        let shared = Arc::new(Shared::new());
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pagellm-engine".into())
            .spawn(move || driver::run(self, thread_shared, rx))
            .map_err(|e| EngineError::Config(format!("starting the engine thread: {e}")))?;
        Ok(EngineHandle {
            commands,
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Starts the engine thread and waits until the model is loaded.
    pub fn load(self) -> Result<EngineHandle> {
        let handle = self.spawn()?;
        handle.wait_ready()?;
        Ok(handle)
    }
}

/// What a caller asks of the engine thread.
pub(crate) enum Command {
    /// Queue prepared requests together, before the next step.
    Add(Vec<Submission>),
    Abort(RequestId),
    AbortAll,
    /// Statistics as they are now, after the step in progress.
    Stats(flume::Sender<StatsSnapshot>),
    /// Resize the device KV pool after the step in progress.
    SetKvBudget(
        crate::pool::PoolSize,
        flume::Sender<Result<crate::engine::PoolResize>>,
    ),
    /// Abort what is pending and end the thread.
    Stop,
}

pub(crate) struct Submission {
    pub id: RequestId,
    pub prepared: crate::engine::Prepared,
    pub events: flume::Sender<crate::engine::RequestEvent>,
}

/// What the engine thread publishes for its handle.
pub(crate) struct Shared {
    state: Mutex<EngineState>,
    changed: Condvar,
    intake: OnceLock<Arc<Intake>>,
    info: OnceLock<ModelInfo>,
    stats: Mutex<Option<StatsSnapshot>>,
    closed: AtomicBool,
    next_id: AtomicU64,
}

impl Shared {
    fn new() -> Self {
        Shared {
            state: Mutex::new(EngineState::Loading { done: 0, total: 0 }),
            changed: Condvar::new(),
            intake: OnceLock::new(),
            info: OnceLock::new(),
            stats: Mutex::new(None),
            closed: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
        }
    }

    pub(crate) fn set_state(&self, state: EngineState) {
        if let Ok(mut s) = self.state.lock() {
            // A failure stays: only a stop replaces it.
            if !matches!(*s, EngineState::Failed(_)) || state == EngineState::Stopped {
                *s = state;
            }
        }
        self.changed.notify_all();
    }

    pub(crate) fn publish(&self, snapshot: StatsSnapshot) {
        if let Ok(mut s) = self.stats.lock() {
            *s = Some(snapshot);
        }
    }

    pub(crate) fn loaded(&self, intake: Arc<Intake>, info: ModelInfo) {
        let _ = self.intake.set(intake);
        let _ = self.info.set(info);
        self.set_state(EngineState::Ready);
    }
}

/// The engine on a thread of its own. Cheap to share (`Arc<EngineHandle>`): every method
/// takes `&self` and may be called from any thread. Dropping the handle aborts what is
/// pending and ends the thread.
///
/// ```no_run
/// use pagellm::{EngineBuilder, EngineConfig, Event, Request, SamplingParams};
///
/// let engine = EngineBuilder::new("models/fortunes-llama")
///     .config(EngineConfig::default())
///     .load()?;
/// let params = SamplingParams { max_tokens: 32, temperature: 0.0, ..Default::default() };
/// let stream = engine.submit(Request::text("A wise man once said").with_params(params))?;
/// for event in stream {
///     if let Event::Token { text, .. } = event {
///         print!("{text}");
///     }
/// }
/// # Ok::<(), pagellm::Error>(())
/// ```
pub struct EngineHandle {
    commands: flume::Sender<Command>,
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<Option<String>>>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Loads the model in `model` with `config` on a device of its own and returns once it
    /// takes requests. See [`EngineBuilder`] for a shared device, progress and notices.
    pub fn load(model: impl Into<ModelSource>, config: EngineConfig) -> Result<Self> {
        EngineBuilder::new(model).config(config).load()
    }

    /// Where the engine thread is now.
    pub fn state(&self) -> EngineState {
        self.shared
            .state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|_| EngineState::Failed("the engine thread panicked".into()))
    }

    /// Waits until the model is loaded; the error says why it is not.
    pub fn wait_ready(&self) -> Result<&ModelInfo> {
        let mut state = self
            .shared
            .state
            .lock()
            .map_err(|_| EngineError::Internal("the engine thread panicked".into()))?;
        while matches!(*state, EngineState::Loading { .. }) {
            state = self
                .shared
                .changed
                .wait(state)
                .map_err(|_| EngineError::Internal("the engine thread panicked".into()))?;
        }
        drop(state);
        self.ready()
    }

    /// The loaded model, once it is loaded.
    pub fn info(&self) -> Option<&ModelInfo> {
        self.shared.info.get()
    }

    /// What checks requests for this engine, once the model is loaded: the tokenizer and
    /// the limits requests are held to.
    pub fn intake(&self) -> Option<&Arc<Intake>> {
        self.shared.intake.get()
    }

    /// The model's info if the engine takes requests now, else why not.
    fn ready(&self) -> Result<&ModelInfo> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(EngineError::Closed);
        }
        match self.state() {
            EngineState::Ready => {}
            EngineState::Loading { .. } => return Err(EngineError::NotReady),
            EngineState::Failed(why) => return Err(EngineError::Unavailable(why)),
            EngineState::Stopped => return Err(EngineError::Closed),
        }
        self.info()
            .ok_or_else(|| EngineError::Internal("ready without a model".into()))
    }

    /// Checks and prepares `request` on this thread, then queues it; its events arrive on
    /// the returned stream. Refused with an error when the request is invalid (a prompt
    /// longer than the context, impossible sampling parameters, a constraint that does not
    /// compile) or the engine takes no requests (loading, failed, closed).
    pub fn submit(&self, request: Request) -> Result<RequestStream> {
        self.submit_all(vec![request])
            .pop()
            .unwrap_or_else(|| Err(EngineError::Internal("no request".into())))
    }

    /// Submits `requests` together: the engine sees all of them before its next step, so
    /// they are batched from the first. Each gets its own result, in order.
    pub fn submit_all(
        &self,
        requests: impl IntoIterator<Item = Request>,
    ) -> Vec<Result<RequestStream>> {
        let intake = self.ready().and_then(|_| {
            self.intake()
                .cloned()
                .ok_or_else(|| EngineError::Internal("ready without an intake".into()))
        });
        let intake = match intake {
            Ok(intake) => intake,
            Err(e) => return requests.into_iter().map(|_| Err(refusal(&e))).collect(),
        };
        let mut batch = Vec::new();
        let results: Vec<Result<RequestStream>> = requests
            .into_iter()
            .map(|r| {
                let prepared = intake.prepare(r)?;
                let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
                let (events, rx) = flume::unbounded();
                batch.push(Submission {
                    id,
                    prepared,
                    events,
                });
                Ok(RequestStream::new(id, rx, self.commands.clone()))
            })
            .collect();
        if !batch.is_empty() && self.commands.send(Command::Add(batch)).is_err() {
            return results
                .into_iter()
                .map(|r| {
                    r.and(Err(EngineError::Unavailable(
                        "the engine has stopped".into(),
                    )))
                })
                .collect();
        }
        results
    }

    /// Aborts request `id` (its stream ends with finish reason `abort`); nothing happens
    /// for an unknown or finished request.
    pub fn abort(&self, id: RequestId) {
        let _ = self.commands.send(Command::Abort(id));
    }

    /// Aborts every pending request.
    pub fn abort_all(&self) {
        let _ = self.commands.send(Command::AbortAll);
    }

    /// Refuses new requests from now on ([`EngineError::Closed`]); pending ones go on. A
    /// server closes before its grace period, then aborts what is left.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
    }

    /// The statistics after a recent step (published at most every 50 ms while busy, and
    /// whenever the engine runs out of work), once the model is loaded.
    pub fn stats(&self) -> Option<StatsSnapshot> {
        self.shared.stats.lock().ok().and_then(|s| s.clone())
    }

    /// The statistics as they are now: waits for the step in progress to end (a step's
    /// time at most). `None` before the model is loaded and after the thread ended.
    pub fn stats_now(&self) -> Option<StatsSnapshot> {
        self.info()?;
        let (tx, rx) = flume::bounded(1);
        self.commands.send(Command::Stats(tx)).ok()?;
        rx.recv().ok()
    }

    /// Changes the KV budget, the device pool's size, while the engine runs (see
    /// [`Engine::set_kv_budget`]): after the step in progress, the pool shrinks (the
    /// running groups holding blocks beyond the new size are preempted, newest first, and
    /// come back into what is left) or grows (waiting requests are let in at the next
    /// step), and its device memory is given back or taken. Waits for that and returns
    /// what it did; no request's output changes.
    pub fn set_kv_budget(&self, size: crate::pool::PoolSize) -> Result<crate::engine::PoolResize> {
        self.ready()?;
        let (tx, rx) = flume::bounded(1);
        self.commands
            .send(Command::SetKvBudget(size, tx))
            .map_err(|_| EngineError::Unavailable("the engine has stopped".into()))?;
        rx.recv()
            .map_err(|_| EngineError::Unavailable("the engine has stopped".into()))?
    }

    /// Aborts what is pending, ends the engine thread and waits for it. Returns the
    /// profiling report when profiling was on (`EngineConfig::profile`).
    /// Later calls (and the drop) do nothing more.
    pub fn shutdown(&self) -> Option<String> {
        let _ = self.commands.send(Command::Stop);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take())?;
        thread.join().ok().flatten()
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Another copy of a refusal of [`EngineHandle::ready`], for each request of a batch.
fn refusal(e: &EngineError) -> EngineError {
    match e {
        EngineError::NotReady => EngineError::NotReady,
        EngineError::Closed => EngineError::Closed,
        EngineError::Unavailable(why) => EngineError::Unavailable(why.clone()),
        other => EngineError::Internal(other.to_string()),
    }
}

/// Builds the engine on the thread: on the given context, or on the adapter the
/// environment chooses.
pub(crate) fn open_engine(
    context: Option<Arc<GpuContext>>,
    model: &ModelSource,
    config: EngineConfig,
    on_lost: Option<crate::engine::DeviceLostFn>,
    progress: impl FnMut(u64, u64),
) -> Result<Engine> {
    let ctx = match context {
        Some(ctx) => ctx,
        None => Arc::new(GpuContext::from_env()?),
    };
    Engine::open(ctx, model.clone(), config, on_lost, progress)
}
