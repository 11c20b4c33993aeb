//! The engine thread: load, then take commands and step while anything is pending.

use super::{Command, EngineBuilder, EngineState, ModelInfo, Notice, Shared, StatsSnapshot};
use crate::engine::{Engine, RequestEvent};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Marks the engine failed if its thread ends by panicking, so callers are told.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .set_state(EngineState::Failed("the engine thread panicked".into()));
        }
    }
}

/// The thread's body; returns the profiling report, if profiling was on.
pub(super) fn run(
    builder: EngineBuilder,
    shared: Arc<Shared>,
    rx: flume::Receiver<Command>,
) -> Option<String> {
    let _guard = PanicGuard(shared.clone());
    let EngineBuilder {
        model,
        config,
        context,
        notice,
        stats_every,
        on_lost,
    } = builder;
    let mut notify = notice.unwrap_or_else(|| Box::new(|_| {}));
    let start = Instant::now();
    let mut last_percent = u64::MAX;
    let opened = super::open_engine(context, &model, config, on_lost, |done, total| {
        shared.set_state(EngineState::Loading { done, total });
        let percent = done * 100 / total.max(1);
        if percent != last_percent {
            last_percent = percent;
            notify(Notice::Loading { done, total });
        }
    });
    let engine = match opened {
        Ok(engine) => engine,
        Err(e) => {
            let why = format!("loading {}: {e}", model.display_path().display());
            tracing::error!("{why}");
            shared.set_state(EngineState::Failed(why.clone()));
            notify(Notice::LoadFailed(why.clone()));
            refuse_all(&rx, &why);
            shared.set_state(EngineState::Stopped);
            return None;
        }
    };
    let info = ModelInfo {
        path: model.display_path(),
        max_model_len: engine.max_model_len(),
        vocab_size: engine.intake().vocab_size(),
        adapter: engine.context().describe(),
        load_seconds: start.elapsed().as_secs_f64(),
    };
    tracing::info!(adapter = %info.adapter, "model loaded");
    let mut lp = Loop {
        engine,
        shared,
        notify,
        meter: Meter::default(),
        stats_every,
        published: Instant::now(),
    };
    lp.publish();
    lp.shared.loaded(lp.engine.intake().clone(), info.clone());
    (lp.notify)(Notice::Ready(info));
    lp.serve(&rx);
    lp.engine.abort_all();
    lp.publish();
    lp.shared.set_state(EngineState::Stopped);
    lp.engine.context().take_profile_report()
}

/// Answers every request with the load failure until the handle stops the thread.
fn refuse_all(rx: &flume::Receiver<Command>, why: &str) {
    for cmd in rx.iter() {
        match cmd {
            Command::Add(batch) => {
                for s in batch {
                    let _ = s.events.send(RequestEvent::Failed(why.to_string()));
                }
            }
            Command::Stop => break,
            Command::SetKvBudget(_, reply) => {
                let _ = reply.send(Err(crate::engine::EngineError::Unavailable(why.into())));
            }
            Command::Abort(_) | Command::AbortAll | Command::Stats(_) => {}
        }
    }
}

/// The loaded engine's loop state.
struct Loop {
    engine: Engine,
    shared: Arc<Shared>,
    notify: super::NoticeFn,
    meter: Meter,
    stats_every: Duration,
    published: Instant,
}

impl Loop {
    /// Sleeps while idle, takes what has arrived, steps while anything is pending; returns
    /// at `Stop` or when every handle is gone.
    fn serve(&mut self, rx: &flume::Receiver<Command>) {
        loop {
            if !self.engine.has_unfinished() {
                let Ok(cmd) = rx.recv() else {
                    return;
                };
                if !self.handle(cmd) {
                    return;
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                if !self.handle(cmd) {
                    return;
                }
            }
            if self.engine.has_unfinished() {
                self.step();
                self.yield_to_the_application();
            }
            // Statistics walk every block table: publish them at most every
            // `stats_every` while busy, and always before waiting idle.
            if !self.engine.has_unfinished() || self.published.elapsed() >= self.stats_every {
                self.publish();
            }
        }
    }

    /// Carries out one command; false to stop.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(batch) => {
                for s in batch {
                    if let Err(e) = self.engine.enqueue(s.id, s.prepared, s.events.clone()) {
                        let _ = s.events.send(RequestEvent::Failed(e.to_string()));
                    }
                }
            }
            Command::Abort(id) => {
                self.engine.abort(id);
            }
            Command::AbortAll => {
                let n = self.engine.abort_all();
                tracing::info!("aborted {n} requests");
            }
            Command::Stats(reply) => {
                let snapshot = self.meter.snapshot(self.engine.stats());
                let _ = reply.send(snapshot);
            }
            Command::SetKvBudget(size, reply) => {
                // Publish before replying: a caller that reads the statistics as soon as the
                // resize returns sees the new pool, not the one before it.
                let resized = self.engine.set_kv_budget(size);
                self.publish();
                let _ = reply.send(resized);
            }
            Command::Stop => return false,
        }
        true
    }

    fn step(&mut self) {
        let t = Instant::now();
        let recoveries = self.engine.device_stats().recoveries;
        let result = self.engine.step();
        let took = t.elapsed();
        let device = self.engine.device_stats();
        if device.recoveries > recoveries {
            (self.notify)(Notice::Recovered {
                adapter: self.engine.context().describe(),
                took: device.last_recovery,
            });
        }
        let (tokens, error) = match result {
            Ok(n) => (n, None),
            Err(e) => {
                // Every pending request has been failed with the error. A lost device
                // leaves the engine unusable for good.
                tracing::error!("engine step failed: {e}");
                if self.engine.context().check_health().is_err() {
                    self.shared
                        .set_state(EngineState::Failed(format!("the GPU failed: {e}")));
                }
                (0, Some(e.to_string()))
            }
        };
        self.meter.record(tokens, took);
        (self.notify)(Notice::Stepped {
            tokens,
            took,
            error,
        });
    }

    /// Under a frame-time budget on an application's device, lets the application's
    /// threads (its render thread's submit) in between two steps.
    fn yield_to_the_application(&self) {
        if self.engine.config().max_step_ms.is_some() && !self.engine.context().is_own() {
            std::thread::yield_now();
        }
    }

    fn publish(&mut self) {
        self.shared
            .publish(self.meter.snapshot(self.engine.stats()));
        self.published = Instant::now();
    }
}

/// Steps and tokens, and the throughput of about the last second of steps.
#[derive(Default)]
struct Meter {
    steps: u64,
    tokens: u64,
    last: Duration,
    /// (end of step, tokens computed) of the last second of steps.
    recent: std::collections::VecDeque<(Instant, usize)>,
}

impl Meter {
    fn record(&mut self, tokens: usize, took: Duration) {
        let now = Instant::now();
        self.steps += 1;
        self.tokens += tokens as u64;
        self.last = took;
        self.recent.push_back((now, tokens));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.recent.pop_front();
        }
    }

    fn snapshot(&self, engine: crate::engine::EngineStats) -> StatsSnapshot {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        let recent = self
            .recent
            .iter()
            .filter(|(t, _)| now.duration_since(*t) < second);
        let computed: usize = recent.clone().map(|(_, n)| n).sum();
        let span = recent
            .map(|(t, _)| now.duration_since(*t).as_secs_f64())
            .fold(0.0, f64::max)
            .max(self.last.as_secs_f64());
        StatsSnapshot {
            engine,
            steps: self.steps,
            tokens_computed: self.tokens,
            computed_per_s: if span > 0.0 {
                computed as f64 / span
            } else {
                0.0
            },
            last_step: self.last,
        }
    }
}
