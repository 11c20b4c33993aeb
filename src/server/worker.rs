//! The engine thread: it alone owns the [`Engine`], loads the model, and steps it while
//! requests are pending. HTTP handlers talk to it only through a channel of [`Command`]s
//! and each request's own event channel, so no async task ever waits on the GPU.

use crate::engine::{Engine, EngineConfig, EngineStats, Prompt, RequestHandle};
use crate::sampling::SamplingParams;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Longest a busy engine goes without publishing its statistics for `/metrics`.
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// What a handler asks of the engine thread.
pub enum Command {
    /// Queue a request; the reply carries its handle or the reason it was refused.
    Add {
        prompt: Prompt,
        /// Boxed: the parameters (a constraint's schema among them) dwarf every other command.
        params: Box<SamplingParams>,
        reply: oneshot::Sender<Result<RequestHandle, crate::engine::EngineError>>,
    },
    /// Abort every pending request (the end of a graceful shutdown's grace period).
    AbortAll,
    /// Finish: abort what is pending and end the thread.
    Stop,
}

/// Where the engine is, as `/health` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Loading = 0,
    Ready = 1,
    Failed = 2,
}

/// What the engine thread publishes for the HTTP side.
pub struct Shared {
    health: AtomicU8,
    /// Why loading failed or the device was lost.
    pub failure: Mutex<Option<String>>,
    /// Statistics after the latest step.
    pub stats: Mutex<Option<EngineStats>>,
    /// The context length requests are checked against, once loaded.
    pub max_model_len: Mutex<Option<usize>>,
}

impl Shared {
    pub fn new() -> Self {
        Shared {
            health: AtomicU8::new(Health::Loading as u8),
            failure: Mutex::new(None),
            stats: Mutex::new(None),
            max_model_len: Mutex::new(None),
        }
    }

    pub fn health(&self) -> Health {
        match self.health.load(Ordering::Acquire) {
            0 => Health::Loading,
            1 => Health::Ready,
            _ => Health::Failed,
        }
    }

    fn set_failed(&self, reason: String) {
        if let Ok(mut f) = self.failure.lock() {
            *f = Some(reason);
        }
        self.health.store(Health::Failed as u8, Ordering::Release);
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts the engine thread: it loads the model from `dir`, then serves `commands` until
/// [`Command::Stop`] or until every sender is gone.
pub fn spawn(
    dir: PathBuf,
    config: EngineConfig,
    shared: Arc<Shared>,
) -> (flume::Sender<Command>, std::thread::JoinHandle<()>) {
    let (tx, rx) = flume::unbounded();
    let thread = std::thread::Builder::new()
        .name("pagellm-engine".into())
        .spawn(move || run(dir, config, shared, rx))
        .expect("spawning the engine thread");
    (tx, thread)
}

/// Marks the engine failed if its thread ends by panicking, so `/health` tells.
struct PanicGuard(Arc<Shared>);

impl Drop for PanicGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.set_failed("the engine thread panicked".into());
        }
    }
}

fn run(dir: PathBuf, config: EngineConfig, shared: Arc<Shared>, rx: flume::Receiver<Command>) {
    let _guard = PanicGuard(shared.clone());
    let mut engine = match Engine::new(&dir, config) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("loading {}: {e}", dir.display());
            shared.set_failed(format!("loading {}: {e}", dir.display()));
            // Refuse whatever arrives until the server stops.
            for cmd in rx.iter() {
                match cmd {
                    Command::Add { reply, .. } => {
                        let _ = reply.send(Err(crate::engine::EngineError::Config(
                            "the model failed to load".into(),
                        )));
                    }
                    Command::Stop => break,
                    Command::AbortAll => {}
                }
            }
            return;
        }
    };
    if let Ok(mut m) = shared.max_model_len.lock() {
        *m = Some(engine.max_model_len());
    }
    publish(&engine, &shared);
    shared.health.store(Health::Ready as u8, Ordering::Release);
    tracing::info!(adapter = %engine.ctx.describe(), "model loaded");
    let mut aborting = false;
    let mut published = std::time::Instant::now();
    loop {
        // Block for work when idle; otherwise take what has arrived and step.
        if !engine.has_unfinished() {
            match rx.recv() {
                Ok(cmd) => {
                    if !handle(&mut engine, cmd, &mut aborting) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let mut stop = false;
        while let Ok(cmd) = rx.try_recv() {
            if !handle(&mut engine, cmd, &mut aborting) {
                stop = true;
                break;
            }
        }
        if stop {
            break;
        }
        if engine.has_unfinished() {
            if let Err(e) = engine.step() {
                // Every pending request has been failed with the error; a lost device
                // makes the engine unusable for good.
                tracing::error!("engine step failed: {e}");
                if engine.ctx.check_health().is_err() {
                    shared.set_failed(format!("the GPU failed: {e}"));
                }
            }
        }
        // Statistics walk every block table: publish them at most every 50 ms while busy,
        // and always before waiting idle.
        if !engine.has_unfinished() || published.elapsed() >= PUBLISH_EVERY {
            publish(&engine, &shared);
            published = std::time::Instant::now();
        }
    }
    engine.abort_all();
    publish(&engine, &shared);
    if let Some(report) = engine.ctx.take_profile_report() {
        eprintln!("\n{report}");
    }
}

/// Carries out one command; false to stop. After `AbortAll` (the end of a shutdown's
/// grace period) new requests are refused too.
fn handle(engine: &mut Engine, cmd: Command, aborting: &mut bool) -> bool {
    match cmd {
        Command::Add { reply, .. } if *aborting => {
            let _ = reply.send(Err(crate::engine::EngineError::Config(
                "the server is shutting down".into(),
            )));
            true
        }
        Command::Add {
            prompt,
            params,
            reply,
        } => {
            let _ = reply.send(engine.add_request(prompt, *params));
            true
        }
        Command::AbortAll => {
            *aborting = true;
            let n = engine.abort_all();
            tracing::info!("aborted {n} requests");
            true
        }
        Command::Stop => false,
    }
}

fn publish(engine: &Engine, shared: &Shared) {
    if let Ok(mut s) = shared.stats.lock() {
        *s = Some(engine.stats());
    }
}
