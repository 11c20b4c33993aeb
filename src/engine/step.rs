//! The step's lifecycle. [`Engine::begin_step`] drops requests whose caller has gone,
//! lets speculating sequences propose, reads the next requests' prompt blocks from the disk
//! tier, schedules, and submits the step's block operations and forward pass without
//! waiting for them; [`Engine::end_step`] takes the read-backs, writes newly named blocks to
//! the disk tier, samples and streams (`advance.rs`), and feeds the cost models. In between
//! the caller may do anything but step again: a native driver waits on its own thread
//! ([`Engine::wait_step`]), a browser lets its event loop run and polls
//! ([`Engine::step_ready`]) or awaits ([`Engine::step_async`]). Requests may be added
//! meanwhile; aborts wait for the step's end.
//!
//! With a draft model, `begin_step` submits the draft's first pass and schedules nothing
//! yet: each poll (or wait) lands a pass and submits the next, and once the proposals are
//! made the step is scheduled and submitted as above. So no part of a step waits unless
//! its caller asks it to. The one wait left is [`Engine::step`]'s (and so the engine
//! thread's): when the engine runs out of work it copies the blocks the last step named to
//! the disk tier (native only) at once, where [`Engine::end_step`] leaves them for the next
//! step or an explicit [`Engine::flush_prefix_tiers`].

use super::core::Engine;
use super::draft::DraftJob;
use super::error::Result;
use super::output::{RequestEvent, RequestId};
use super::request::{RequestSide, SeqOutput};
use super::scheduler::SchedulerOutput;
use crate::cache::BlockOps;
use crate::runner::{PendingStep, StepPlan};
use std::time::Duration;
use web_time::Instant;

/// A step the engine has submitted and not yet finished.
#[must_use = "finish the step with Engine::end_step"]
pub struct StepInFlight {
    work: Work,
    start: Instant,
    /// Pipelines compiled before the step (see `compiled_since`).
    compiled: u64,
    /// The context's compile time before the step (`GpuContext::compile_time`).
    compile_time: Duration,
    /// Held while the step lives: an engine whose step was dropped unfinished sees it gone.
    _alive: std::sync::Arc<()>,
}

enum Work {
    /// The draft model is making the step's proposals; nothing is scheduled yet.
    Drafting { job: Box<DraftJob> },
    /// Nothing was submitted: no group could be scheduled.
    Nothing { ops: BlockOps },
    /// Block operations alone (a swap-only step).
    Ops { ops: BlockOps, pending: PendingStep },
    /// A forward pass (and the block operations before it).
    Forward {
        sched: Box<SchedulerOutput<SeqOutput, RequestSide>>,
        pending: PendingStep,
    },
    /// The step ended before its work did: it failed (every pending request failed with
    /// it), or the device was lost and the engine recovered on a new one (`recover.rs`),
    /// its groups requeued. It computed nothing.
    Ended,
}

impl StepInFlight {
    /// Resolves once the GPU work submitted for the step so far (a draft pass, or the step
    /// itself) has landed; then [`Engine::step_ready`] moves it on. Woken by the GPU's map
    /// callback, so a driver that awaits this between polls never spins (see
    /// [`Engine::step_async`]).
    pub async fn landed(&self) {
        match &self.work {
            Work::Drafting { job } => job.landed().await,
            Work::Nothing { .. } | Work::Ended => {}
            Work::Ops { pending, .. } | Work::Forward { pending, .. } => pending.landed().await,
        }
    }

    fn pending(&self) -> Option<&PendingStep> {
        match &self.work {
            Work::Drafting { .. } | Work::Nothing { .. } | Work::Ended => None,
            Work::Ops { pending, .. } | Work::Forward { pending, .. } => Some(pending),
        }
    }
}

impl Engine {
    /// Runs steps until every request has finished.
    pub fn run_to_completion(&mut self) -> Result<()> {
        while self.has_unfinished() {
            self.step()?;
        }
        Ok(())
    }

    /// One engine step, waiting for the GPU on this thread. Returns the number of tokens
    /// computed. An error here was caused by no single request: every pending request has
    /// then been failed with it, and the engine is empty and can take new requests.
    ///
    /// When the engine runs out of work, the blocks the last step named are copied to the
    /// disk tier now (waiting for the copy), rather than with a next step that may not come;
    /// a caller of [`Self::end_step`] does that with [`Self::flush_prefix_tiers`].
    pub fn step(&mut self) -> Result<usize> {
        let mut step = self.begin_step()?;
        self.wait_step(&mut step)?;
        let n = self.end_step(step)?;
        if !self.has_unfinished() {
            if let Err(e) = self.flush_prefix_tiers() {
                self.on_fault(e)?;
            }
        }
        Ok(n)
    }

    /// One engine step for a driver that awaits rather than waits (a browser's): the step
    /// is begun, awaited until what it submitted lands, moved on, and ended. The browser's
    /// event loop lands GPU read-backs by itself; natively something must poll the device
    /// meanwhile ([`crate::GpuContext::poll`] on another thread), or the future never
    /// resolves. Errors as [`Self::step`]; dropping the future drops the step (see
    /// [`Self::begin_step`]).
    pub async fn step_async(&mut self) -> Result<usize> {
        let mut step = self.begin_step()?;
        while !self.step_ready(&mut step)? {
            step.landed().await;
        }
        self.end_step(step)
    }

    /// Schedules a step and submits its GPU work without waiting for it. Refused while
    /// another step is in flight. On an error every pending request has been failed.
    pub fn begin_step(&mut self) -> Result<StepInFlight> {
        if self.in_flight && self.step_alive.strong_count() > 0 {
            return Err(super::EngineError::Internal(
                "a step is already in flight; end it first".into(),
            ));
        }
        if self.in_flight {
            // The last step was dropped unfinished: what it scheduled cannot be trusted, so
            // its requests fail (with the reason) rather than leave the engine wedged.
            self.in_flight = false;
            self.fail_all("the engine step failed: a step was dropped before it ended");
            self.apply_deferred();
        }
        self.drop_abandoned();
        let step = match self.try_begin() {
            Ok(step) => step,
            Err(e) => {
                self.end_profile();
                self.on_fault(e)?;
                StepInFlight {
                    work: Work::Ended,
                    start: Instant::now(),
                    compiled: self.ctx.pipelines_compiled(),
                    compile_time: self.ctx.compile_time(),
                    _alive: std::sync::Arc::new(()),
                }
            }
        };
        self.in_flight = true;
        self.step_alive = std::sync::Arc::downgrade(&step._alive);
        self.step_begun();
        Ok(step)
    }

    /// Whether `step`'s GPU work has run and its read-backs have landed (this polls the
    /// device without waiting). With a draft model this also moves the step on: a landed
    /// draft pass is taken and the next one (or the step itself) submitted. On an error
    /// every pending request has been failed and the step is over (ending it does nothing).
    pub fn step_ready(&mut self, step: &mut StepInFlight) -> Result<bool> {
        self.drive(step, false)?;
        let ready = match step.pending() {
            Some(p) => self.runner.is_ready(p),
            None => return Ok(!matches!(step.work, Work::Drafting { .. })),
        };
        match ready {
            Ok(ready) => Ok(ready),
            Err(e) => self.step_failed(step, e.into()).map(|()| true),
        }
    }

    /// Waits on this thread until `step` is ready (native drivers; a browser never waits).
    /// Errors as [`Self::step_ready`].
    pub fn wait_step(&mut self, step: &mut StepInFlight) -> Result<()> {
        self.drive(step, true)?;
        let waited = match step.pending() {
            Some(p) => self.runner.wait(p),
            None => return Ok(()),
        };
        waited.or_else(|e| self.step_failed(step, e.into()))
    }

    /// Moves a drafting step on (waiting for each draft pass when `wait`): once the
    /// proposals are made, the step is scheduled and submitted.
    fn drive(&mut self, step: &mut StepInFlight, wait: bool) -> Result<()> {
        let Work::Drafting { job } = &mut step.work else {
            return Ok(());
        };
        if !self.advance_draft(job, wait) {
            return Ok(());
        }
        let nothing = Work::Nothing {
            ops: BlockOps::default(),
        };
        if let Work::Drafting { job } = std::mem::replace(&mut step.work, nothing) {
            self.set_draft_proposals(*job);
        }
        match self.schedule_and_submit() {
            Ok(work) => {
                step.work = work;
                Ok(())
            }
            Err(e) => self.step_failed(step, e),
        }
    }

    /// A step that failed before its end, and is over: a lost device is recovered from
    /// (`Ok`, the step computed nothing); otherwise every pending request fails with `e`.
    fn step_failed(&mut self, step: &mut StepInFlight, e: super::EngineError) -> Result<()> {
        step.work = Work::Ended;
        self.in_flight = false;
        self.end_profile();
        let handled = self.on_fault(e);
        self.apply_deferred();
        handled
    }

    /// Requests added and aborts asked for while a step was in flight, applied now that
    /// none is: the additions first, so that an abort can reach a request added meanwhile.
    fn apply_deferred(&mut self) {
        for (id, prepared, events) in std::mem::take(&mut self.deferred_adds) {
            if let Err(e) = self.enqueue(id, prepared, events.clone()) {
                let _ = events.send(RequestEvent::Failed(e.to_string()));
            }
        }
        for id in std::mem::take(&mut self.deferred_aborts) {
            self.abort(id);
        }
    }

    /// Finishes `step`: its read-backs are taken (waited for if not ready), sampled and
    /// streamed. Returns the number of tokens computed; on an error every pending request
    /// has been failed. Aborts asked for during the step happen now.
    pub fn end_step(&mut self, step: StepInFlight) -> Result<usize> {
        let ended = matches!(step.work, Work::Ended);
        let result = self.try_end(step);
        self.in_flight = false;
        self.end_profile();
        let result = match result {
            Ok(n) => {
                if !ended {
                    self.step_completed();
                }
                Ok(n)
            }
            Err(e) => self.on_fault(e).map(|()| 0),
        };
        self.apply_deferred();
        result
    }

    fn try_begin(&mut self) -> Result<StepInFlight> {
        let start = Instant::now();
        let compiled = self.ctx.pipelines_compiled();
        let compile_time = self.ctx.compile_time();
        let work = match self.propose() {
            Some(job) => Work::Drafting { job: Box::new(job) },
            None => self.schedule_and_submit()?,
        };
        Ok(StepInFlight {
            work,
            start,
            compiled,
            compile_time,
            _alive: std::sync::Arc::new(()),
        })
    }

    /// Schedules the step (after reading the next requests' blocks from the disk tier) and
    /// submits its work.
    fn schedule_and_submit(&mut self) -> Result<Work> {
        self.load_waiting_from_disk();
        self.scheduler.step_token_limit = self.pacer.as_ref().map(super::StepPacer::limit);
        let mut sched = self.scheduler.schedule()?;
        for f in std::mem::take(&mut sched.failed) {
            f.group.send(RequestEvent::Failed(f.reason));
        }
        let work = if !sched.scheduled.is_empty() {
            self.idle_steps = 0;
            let pending = self.submit_forward(&sched)?;
            Work::Forward {
                sched: Box::new(sched),
                pending,
            }
        } else if !sched.ops.is_empty() {
            let pending = self.runner.submit(&StepPlan {
                ops: &sched.ops,
                forward: None,
                read_argmax: false,
                read_logits: false,
                label: "block ops",
            })?;
            Work::Ops {
                ops: sched.ops,
                pending,
            }
        } else {
            Work::Nothing { ops: sched.ops }
        };
        Ok(work)
    }

    fn try_end(&mut self, mut step: StepInFlight) -> Result<usize> {
        if !self.in_flight {
            return Ok(0); // the step failed before its end (`step_failed`)
        }
        self.drive(&mut step, true)?;
        let StepInFlight {
            work,
            start,
            compiled,
            compile_time,
            ..
        } = step;
        let (sched, pending) = match work {
            Work::Drafting { .. } => unreachable!("driven to its schedule above"),
            Work::Ended => return Ok(0),
            Work::Nothing { ops } => {
                let n = self.idle_step(&ops, None, start)?;
                self.store_to_disk(&ops);
                return Ok(n);
            }
            Work::Ops { ops, pending } => {
                let n = self.idle_step(&ops, Some(pending), start)?;
                self.store_to_disk(&ops);
                return Ok(n);
            }
            Work::Forward { sched, pending } => (sched, pending),
        };
        let read = self.runner.finish(pending)?;
        self.store_to_disk(&sched.ops);
        self.advance(&sched, &read)?;
        self.record_costs(&sched, start, compiled, compile_time);
        Ok(sched.scheduled.iter().map(|s| s.len).sum())
    }

    /// Feeds the step's time to the cost models (prefill throughput for automatic
    /// preemption, or the decode step cost at its row count for the adaptive `k`) and to
    /// the throughput the stats report (less what the step spent compiling pipelines).
    fn record_costs(
        &mut self,
        sched: &SchedulerOutput<SeqOutput, RequestSide>,
        start: Instant,
        compiled: u64,
        compile_time: Duration,
    ) {
        let rows: usize = sched.scheduled.iter().map(|s| s.len).sum();
        let prefill = sched.scheduled.iter().any(|s| s.own_len() > 1);
        let compiling = self.ctx.compile_time().saturating_sub(compile_time);
        self.throughput
            .record(prefill, rows, start.elapsed(), compiling);
        let compiled = self.compiled_since(compiled);
        if let Some(p) = self.pacer.as_mut().filter(|_| !compiled) {
            p.record(rows, start.elapsed().as_secs_f64());
        }
        if sched.scheduled.iter().any(|s| s.own_len() > 1) {
            self.scheduler
                .costs
                .record_prefill(rows, start.elapsed().as_secs_f64());
        } else if self.config.speculative.is_some() && !compiled {
            self.step_costs.record(rows, start.elapsed().as_secs_f64());
        }
    }

    /// Whether the step just run compiled a pipeline (the context had compiled `before` of
    /// them before it): the first step of each kernel variant does, once per process, and
    /// that step's time (tens of milliseconds on a CPU adapter) says nothing about what its
    /// row count costs. Bind groups made for a row count are left in: the cache drops those
    /// unused for a few steps, so a row count seen only now and then pays for them each
    /// time, and that is part of what it costs.
    fn compiled_since(&self, before: u64) -> bool {
        self.ctx.pipelines_compiled() != before
    }

    /// A step that computes nothing: it may still move blocks (a swap-only step, which is
    /// timed for the cost model, less the fixed cost of its submit). Several in a row with
    /// requests pending would mean the scheduler lost liveness; rather than loop, every
    /// pending request fails.
    fn idle_step(
        &mut self,
        ops: &BlockOps,
        pending: Option<PendingStep>,
        start: Instant,
    ) -> Result<usize> {
        if let Some(pending) = pending {
            self.runner.finish(pending)?;
            let blocks = ops.swap_out.len() + ops.swap_in.len();
            let moved = blocks as u64 * self.scheduler.costs.block_bytes;
            let seconds = start.elapsed().as_secs_f64() - self.swap_latency_s;
            self.scheduler.costs.record_swap(moved, seconds);
            self.idle_steps = 0;
        } else if self.has_unfinished() {
            self.idle_steps += 1;
            if self.idle_steps > 3 {
                self.idle_steps = 0;
                let msg = "the engine step failed: requests are pending but none can be \
                           scheduled (a scheduler fault)";
                self.fail_all(msg);
                return Err(super::EngineError::Internal(msg.into()));
            }
        }
        Ok(0)
    }

    fn end_profile(&self) {
        if let Some(p) = self.ctx.profiler() {
            p.end_step();
        }
    }

    /// Fails every pending request with `e` (a step's error no single request caused)
    /// and returns it.
    pub(super) fn failed(&mut self, e: super::EngineError) -> super::EngineError {
        self.fail_all(&format!("the engine step failed: {e}"));
        e
    }

    /// Aborts requests whose caller dropped the event receiver, freeing their blocks.
    fn drop_abandoned(&mut self) {
        let gone: Vec<RequestId> = self
            .scheduler
            .groups()
            .filter(|g| g.abandoned())
            .map(|g| g.request_id)
            .collect();
        for id in gone {
            tracing::debug!(request = id, "caller went away; aborting");
            self.scheduler.remove(id);
            self.abandoned += 1;
        }
    }

    /// Fails every pending request with `reason` and frees everything they held.
    pub(super) fn fail_all(&mut self, reason: &str) {
        for g in self.scheduler.remove_all() {
            g.send(RequestEvent::Failed(reason.to_string()));
        }
    }
}
