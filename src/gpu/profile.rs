//! Per-kernel GPU timing: `PAGELLM_PROFILE=1`, `--profile`, or
//! [`GpuContext::enable_profiling`].
//!
//! With profiling on, every [`Batch`](super::Batch) times each of its dispatches:
//!
//! - where the device has timestamp queries, by a timestamp at the start and the end of the
//!   dispatch's compute pass, resolved and read back after the batch's submit;
//! - elsewhere (GL), by submitting each dispatch on its own and timing the submit and the
//!   wait for it on the host, after first flushing what was recorded before it. That adds a
//!   round trip per dispatch, so it measures each kernel alone rather than the step as it
//!   runs; the shares stay meaningful, the step total does not.
//!
//! Host time is split into recording (from the batch's creation to its submit, less the
//! time the fallback spent waiting), submitting (`queue.submit`), and waiting for the GPU
//! (every wait of the context). Figures are grouped by the phase the caller names
//! ([`Profiler::begin_step`]: the engine says `prefill` or `decode`), so a report can set
//! decode steps apart from prompt processing. With profiling off, a batch checks one
//! `OnceLock` and nothing else changes.

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
}

#[derive(Debug, Default)]
struct State {
    phase: Option<&'static str>,
    step_started: Option<std::time::Instant>,
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
        }
    }

    pub fn method(&self) -> TimingMethod {
        self.method
    }

    pub(crate) fn period_ns(&self) -> f64 {
        self.period_ns
    }

    fn with<R>(&self, f: impl FnOnce(&mut PhaseProfile) -> R) -> R {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let phase = s.phase.unwrap_or(DEFAULT_PHASE);
        f(s.phases.entry(phase).or_default())
    }

    /// Starts a step of `phase`: what follows is counted under it.
    pub fn begin_step(&self, phase: &'static str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.close_step();
        s.phase = Some(phase);
        s.step_started = Some(std::time::Instant::now());
        s.phases.entry(phase).or_default().steps += 1;
    }

    pub(crate) fn kernel(&self, name: &str, gpu: Duration) {
        self.with(|p| {
            let k = match p.kernels.get_mut(name) {
                Some(k) => k,
                None => p.kernels.entry(name.to_string()).or_default(),
            };
            k.calls += 1;
            k.gpu += gpu;
        });
    }

    pub(crate) fn host(&self, record: Duration, submit: Duration, wait: Duration) {
        self.with(|p| {
            p.record += record;
            p.submit += submit;
            p.wait += wait;
        });
    }

    /// The figures so far, by phase; the profile starts again empty.
    pub fn take(&self) -> BTreeMap<&'static str, PhaseProfile> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.close_step();
        s.phase = None;
        std::mem::take(&mut s.phases)
    }

    /// A copy of the figures so far.
    pub fn snapshot(&self) -> BTreeMap<&'static str, PhaseProfile> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.phases.clone()
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
        out.push_str(&format!(
            "  host per step: recording {:.3} ms, submitting {:.3} ms, waiting {:.3} ms\n",
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
