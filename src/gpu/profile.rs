//! Per-kernel GPU timing: `PAGELLM_PROFILE=1`, `--profile`, or
//! [`crate::gpu::GpuContext::enable_profiling`].
//!
//! With profiling on, every [`Batch`](super::Batch) times each of its dispatches:
//!
//! - where the device has timestamp queries (Vulkan, Metal, DX12 and desktop GL mostly do,
//!   lavapipe and llvmpipe included), by a timestamp at the start and the end of the
//!   dispatch's compute pass, resolved and read back after the batch's submit (the submit
//!   then waits for the batch; query sets and buffers are pooled and reused);
//! - elsewhere (GLES, WebGL, or an adopted device opened without `TIMESTAMP_QUERY`), by
//!   submitting each dispatch on its own and timing the submit and the wait for it on the
//!   host, after first flushing what was recorded before it. Each figure then includes a
//!   round trip (a submit and a device-wide wait), which inflates kernels of many small
//!   calls against large ones, and on a shared device the wait includes other users' work.
//!
//! Host time is split into recording (from the batch's creation to its submit, less the
//! time the fallback spent waiting; of it, the time spent compiling pipelines on first use
//! is also shown alone), submitting (`queue.submit`), and waiting for the GPU (every wait
//! of the context; with timestamps the kernels' time is inside it). Figures are
//! grouped by the phase the caller names ([`Profiler::begin_step`] to
//! [`Profiler::end_step`]: the engine says `prefill` or `decode`); a batch keeps the phase
//! it was created in, and work outside a step is `other`. With profiling off, a batch and a
//! dispatch each check one `Option`.
//!
//! Profiling changes what it measures: the per-step read-back (or the fallback's round
//! trips) lengthens steps, and the engine's cost model, which learns prefill throughput from
//! step times, sees those longer steps, so preemption choices under profiling may differ.
//! Timestamps are taken as the device reports them: a pair that wraps its counter (Vulkan
//! guarantees 36 valid bits) counts as zero time.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Time and calls of one kernel within a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelTime {
    pub calls: u64,
    pub gpu: Duration,
}

/// What one phase (prefill, decode, ...) spent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseProfile {
    /// Steps begun in this phase ([`Profiler::begin_step`]).
    pub steps: u64,
    /// By kernel, or `kernel @ site` where the caller named the call site
    /// ([`Batch::profile_site`](super::Batch::profile_site)).
    pub kernels: BTreeMap<String, KernelTime>,
    /// Host time recording batches.
    pub record: Duration,
    /// Host time compiling pipelines, on the first use of each kernel variant in a context
    /// (part of `record` when a batch's recording asks for the pipeline, as it does): a
    /// step that compiles shows a recording time that later steps do not pay.
    pub compile: Duration,
    /// Host time in `queue.submit`.
    pub submit: Duration,
    /// Host time waiting for the GPU.
    pub wait: Duration,
    /// Wall time of the phase's steps, each from its [`Profiler::begin_step`] to the next
    /// step's (or to [`Profiler::take`]): kernels, host work and sampling together.
    pub wall: Duration,
}

impl PhaseProfile {
    pub fn gpu_total(&self) -> Duration {
        self.kernels.values().map(|k| k.gpu).sum()
    }

    pub fn calls(&self) -> u64 {
        self.kernels.values().map(|k| k.calls).sum()
    }
}

/// How the dispatches are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimingMethod {
    /// GPU timestamps around each dispatch's compute pass.
    Timestamps,
    /// One submit and wait per dispatch, timed on the host.
    SubmitPerDispatch,
}

/// The profile of one context, accumulated across batches until [`Profiler::take`].
#[derive(Debug)]
pub struct Profiler {
    method: TimingMethod,
    /// Nanoseconds per timestamp tick.
    period_ns: f64,
    state: Mutex<State>,
    /// Query sets with their resolve and read-back buffers, for reuse by later batches.
    pool: Mutex<Vec<QueryBlock>>,
}

/// One query set of [`QUERIES_PER_SET`] timestamps and the buffers its results pass through.
#[derive(Debug)]
pub(crate) struct QueryBlock {
    pub set: wgpu::QuerySet,
    pub resolve: wgpu::Buffer,
    pub staging: wgpu::Buffer,
}

/// Timestamp queries one query set holds: a start and an end per dispatch.
pub(crate) const QUERIES_PER_SET: u32 = 4096;

#[derive(Debug, Default)]
struct State {
    phase: Option<&'static str>,
    step_started: Option<web_time::Instant>,
    phases: BTreeMap<&'static str, PhaseProfile>,
}

impl State {
    /// Ends the running step, adding its wall time to its phase.
    fn close_step(&mut self) {
        if let (Some(phase), Some(t)) = (self.phase, self.step_started.take()) {
            self.phases.entry(phase).or_default().wall += t.elapsed();
        }
    }
}

/// The phase figures go to before any step names one.
const DEFAULT_PHASE: &str = "other";

impl Profiler {
    pub(crate) fn new(method: TimingMethod, period_ns: f32) -> Self {
        Profiler {
            method,
            period_ns: f64::from(period_ns),
            state: Mutex::new(State::default()),
            pool: Mutex::new(Vec::new()),
        }
    }

    /// A query block from the pool, or a new one.
    pub(crate) fn query_block(&self, device: &wgpu::Device) -> QueryBlock {
        if let Some(b) = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return b;
        }
        let bytes = u64::from(QUERIES_PER_SET) * 8;
        QueryBlock {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kernel timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES_PER_SET,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("resolved timestamps"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamps read-back"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        }
    }

    /// Returns a block whose results have been read (its staging buffer unmapped).
    pub(crate) fn return_block(&self, b: QueryBlock) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(b);
    }

    /// The phase figures recorded now go to.
    pub(crate) fn current_phase(&self) -> &'static str {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.phase.unwrap_or(DEFAULT_PHASE)
    }

    pub fn method(&self) -> TimingMethod {
        self.method
    }

    pub(crate) fn period_ns(&self) -> f64 {
        self.period_ns
    }

    fn with<R>(&self, phase: Option<&'static str>, f: impl FnOnce(&mut PhaseProfile) -> R) -> R {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let phase = phase.or(s.phase).unwrap_or(DEFAULT_PHASE);
        f(s.phases.entry(phase).or_default())
    }

    /// Starts a step of `phase`: what follows is counted under it.
    pub fn begin_step(&self, phase: &'static str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.close_step();
        s.phase = Some(phase);
        s.step_started = Some(web_time::Instant::now());
        s.phases.entry(phase).or_default().steps += 1;
    }

    /// Ends the running step: its wall time stops, and what follows is `other` until the
    /// next [`Self::begin_step`].
    pub fn end_step(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.close_step();
        s.phase = None;
    }

    pub(crate) fn kernel(&self, phase: &'static str, name: &str, gpu: Duration) {
        self.with(Some(phase), |p| {
            let k = match p.kernels.get_mut(name) {
                Some(k) => k,
                None => p.kernels.entry(name.to_string()).or_default(),
            };
            k.calls += 1;
            k.gpu += gpu;
        });
    }

    /// Host time; `phase` `None` is the current one.
    pub(crate) fn host(
        &self,
        phase: Option<&'static str>,
        record: Duration,
        submit: Duration,
        wait: Duration,
    ) {
        self.with(phase, |p| {
            p.record += record;
            p.submit += submit;
            p.wait += wait;
        });
    }

    /// Host time compiling a pipeline, in the current phase.
    pub(crate) fn compile(&self, d: Duration) {
        self.with(None, |p| p.compile += d);
    }

    /// The figures so far, by phase; the profile starts again empty.
    pub fn take(&self) -> BTreeMap<&'static str, PhaseProfile> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.close_step();
        s.phase = None;
        std::mem::take(&mut s.phases)
    }
}

/// The profile as a text table per phase: kernels by total time, with calls, mean and
/// share of the phase's kernel time, then the host's time per step.
pub fn report(
    method: TimingMethod,
    adapter: &str,
    phases: &BTreeMap<&'static str, PhaseProfile>,
) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut out = format!(
        "GPU profile on {adapter} ({})\n",
        match method {
            TimingMethod::Timestamps => "GPU timestamps around each dispatch",
            TimingMethod::SubmitPerDispatch =>
                "no timestamp queries: each dispatch submitted and timed alone",
        }
    );
    // The engine's phases first, then the rest (loading, calibration: "other").
    let rank = |n: &str| match n {
        "prefill" => 0,
        "decode" => 1,
        "score" => 2,
        DEFAULT_PHASE => 4,
        _ => 3,
    };
    let mut order: Vec<_> = phases.iter().filter(|(_, p)| p.calls() > 0).collect();
    order.sort_by_key(|(n, _)| (rank(n), **n));
    for (name, p) in order {
        let total = p.gpu_total();
        let steps = p.steps.max(1) as f64;
        let wall = if p.steps > 0 {
            format!(", wall {:.3} ms per step", ms(p.wall) / steps)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "\n{name}: {} steps, {} dispatches, kernels {:.2} ms in all ({:.3} ms per step{wall})\n",
            p.steps,
            p.calls(),
            ms(total),
            ms(total) / steps
        ));
        let compiling = match p.compile.is_zero() {
            true => String::new(),
            false => format!(
                " ({:.3} ms of it compiling pipelines on first use)",
                ms(p.compile) / steps
            ),
        };
        out.push_str(&format!(
            "  host per step: recording {:.3} ms{compiling}, submitting {:.3} ms, waiting {:.3} ms\n",
            ms(p.record) / steps,
            ms(p.submit) / steps,
            ms(p.wait) / steps
        ));
        out.push_str(&format!(
            "  {:<34} {:>11} {:>8} {:>10} {:>7}\n",
            "kernel", "total ms", "calls", "mean us", "share"
        ));
        let mut rows: Vec<_> = p.kernels.iter().collect();
        rows.sort_by(|a, b| b.1.gpu.cmp(&a.1.gpu).then(a.0.cmp(b.0)));
        for (k, t) in rows {
            let share = if total.is_zero() {
                0.0
            } else {
                t.gpu.as_secs_f64() / total.as_secs_f64() * 100.0
            };
            out.push_str(&format!(
                "  {:<34} {:>11.3} {:>8} {:>10.1} {:>6.1}%\n",
                k,
                ms(t.gpu),
                t.calls,
                t.gpu.as_secs_f64() * 1e6 / t.calls.max(1) as f64,
                share
            ));
        }
    }
    out
}
