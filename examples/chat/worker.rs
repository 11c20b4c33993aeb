//! The engine thread. It alone owns the [`Engine`]: it loads models (reporting upload
//! progress), queues and aborts requests, and steps the engine while anything is pending.
//! The UI talks to it only through [`Command`]s, [`Update`]s and each request's own event
//! channel, and reads the latest statistics from a mutex the thread holds only to swap a
//! value in, so the UI code never waits for a step or for a result from the GPU. (Its frames
//! still share the device's one queue with the steps: a frame's GPU work runs after the
//! step work submitted before it. On GL, pagellm waits in short slices so that the
//! backend's context lock is not held for a whole step; see `GpuContext::from_existing`.)

use pagellm::engine::{Engine, EngineConfig, EngineStats, Prompt, RequestEvent};
use pagellm::gpu::GpuContext;
use pagellm::sampling::SamplingParams;
use pagellm::tokenizer::{ChatMessage, ChatTemplate};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the UI asks of the engine thread. Conversations are named by the UI's own ids.
pub enum Command {
    /// Drop the current model (aborting what it runs) and load the one in `dir`.
    Load { dir: PathBuf, config: EngineConfig },
    /// Start the model's reply to a conversation's messages.
    Send {
        conv: u64,
        messages: Vec<ChatMessage>,
        params: SamplingParams,
    },
    /// Stop a conversation's reply; its `Finished` event says `abort`.
    Abort { conv: u64 },
}

/// How soon the UI should look at what is new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A state change (loaded, a request started or refused): at once.
    Now,
    /// A step ended, so tokens may have arrived: by the next frame of the streaming rate.
    /// Coalescing these keeps the UI from redrawing once per step, which matters where a
    /// frame costs as much as a step (software adapters share one queue and the CPU).
    Tokens,
}

/// What the engine thread tells the UI, in order.
pub enum Update {
    Loading {
        done: u64,
        total: u64,
    },
    Loaded(ModelInfo),
    LoadFailed(String),
    /// A reply started: its tokens and its end arrive on `events`.
    Started {
        conv: u64,
        events: flume::Receiver<RequestEvent>,
    },
    /// The engine refused the request (a prompt too long, bad settings...).
    Refused {
        conv: u64,
        reason: String,
    },
    /// A step failed for a reason no single request caused; every pending request has
    /// been failed with it (each conversation gets its own `Failed` event) and the engine
    /// takes new requests.
    StepFailed(String),
}

#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub dir: PathBuf,
    pub max_model_len: usize,
    /// Whether the model ships a chat template; without one a conversation is a text the
    /// model continues.
    pub chat_template: bool,
    pub load_seconds: f64,
}

/// The engine's state after its latest step, for the live panel.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub stats: EngineStats,
    /// Tokens computed per second (prefill and decode) over the last second or so of steps.
    pub computed_per_s: f64,
    /// Duration of the latest step.
    pub last_step: Duration,
}

pub struct Worker {
    /// Dropped first on drop: a closed channel ends the thread.
    commands: Option<flume::Sender<Command>>,
    pub updates: flume::Receiver<Update>,
    pub snapshot: Arc<Mutex<Option<Snapshot>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Starts the engine thread on `ctx` (the application's own device). `wake(Wake)` is
    /// called whenever there is something new for the UI (an egui repaint request).
    pub fn spawn(
        ctx: Arc<GpuContext>,
        wake: impl Fn(Wake) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (commands, rx) = flume::unbounded();
        let (tx, updates) = flume::unbounded();
        let snapshot = Arc::new(Mutex::new(None));
        let shared = snapshot.clone();
        let thread = std::thread::Builder::new()
            .name("pagellm-engine".into())
            .spawn(move || {
                Thread {
                    ctx,
                    engine: None,
                    template: None,
                    requests: HashMap::new(),
                    rx,
                    tx,
                    stats: Publisher {
                        snapshot: shared,
                        recent: Vec::new(),
                    },
                    wake: Box::new(wake),
                }
                .run()
            })?;
        Ok(Worker {
            commands: Some(commands),
            updates,
            snapshot,
            thread: Some(thread),
        })
    }

    /// Queues a command; false when the engine thread is gone (it panicked).
    pub fn send(&self, cmd: Command) -> bool {
        self.commands.as_ref().is_some_and(|c| c.send(cmd).is_ok())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the command channel ends the thread after it aborts what is pending.
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Thread {
    ctx: Arc<GpuContext>,
    engine: Option<Engine>,
    template: Option<ChatTemplate>,
    /// The engine's request id of each conversation's latest reply.
    requests: HashMap<u64, u64>,
    rx: flume::Receiver<Command>,
    tx: flume::Sender<Update>,
    stats: Publisher,
    wake: Box<dyn Fn(Wake) + Send>,
}

/// Publishes the engine's statistics after each step.
struct Publisher {
    snapshot: Arc<Mutex<Option<Snapshot>>>,
    /// (end of step, tokens computed) of the last second of steps.
    recent: Vec<(Instant, usize)>,
}

impl Thread {
    fn run(mut self) {
        loop {
            let busy = self.engine.as_ref().is_some_and(Engine::has_unfinished);
            // Idle: sleep until a command comes. Busy: take what has come, then step.
            let first = if busy {
                match self.rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(flume::TryRecvError::Empty) => None,
                    Err(flume::TryRecvError::Disconnected) => break,
                }
            } else {
                match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            };
            if let Some(c) = first {
                self.handle(c);
                while let Ok(c) = self.rx.try_recv() {
                    self.handle(c);
                }
            }
            self.step();
        }
        if let Some(e) = self.engine.as_mut() {
            e.abort_all();
        }
    }

    fn say(&self, u: Update) {
        let _ = self.tx.send(u);
        (self.wake)(Wake::Now);
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Load { dir, config } => self.load(dir, config),
            Command::Send {
                conv,
                messages,
                params,
            } => {
                let Some(engine) = self.engine.as_mut() else {
                    return self.say(Update::Refused {
                        conv,
                        reason: "no model is loaded".into(),
                    });
                };
                let prompt = match prompt_of(engine, self.template.as_ref(), &messages) {
                    Ok(p) => p,
                    Err(reason) => return self.say(Update::Refused { conv, reason }),
                };
                match engine.add_request(prompt, params) {
                    Ok(h) => {
                        self.requests.insert(conv, h.id);
                        self.say(Update::Started {
                            conv,
                            events: h.events,
                        });
                    }
                    Err(e) => self.say(Update::Refused {
                        conv,
                        reason: e.to_string(),
                    }),
                }
            }
            Command::Abort { conv } => {
                if let (Some(engine), Some(id)) =
                    (self.engine.as_mut(), self.requests.remove(&conv))
                {
                    engine.abort(id);
                }
            }
        }
    }

    fn load(&mut self, dir: PathBuf, config: EngineConfig) {
        if let Some(mut old) = self.engine.take() {
            old.abort_all();
        }
        self.requests.clear();
        self.template = None;
        self.stats.clear();
        let t = Instant::now();
        let mut last_percent = u64::MAX;
        let tx = self.tx.clone();
        let wake = &self.wake;
        let opened = Engine::with_context(self.ctx.clone(), &dir, config, |done, total| {
            let percent = done * 100 / total.max(1);
            if percent != last_percent {
                last_percent = percent;
                let _ = tx.send(Update::Loading { done, total });
                wake(Wake::Now);
            }
        });
        match opened {
            Ok(engine) => {
                // A missing template is normal (base models); a broken one is worth saying.
                let template = match pagellm::model::open_chat_template(&dir) {
                    Ok(t) => Some(t),
                    Err(pagellm::tokenizer::ChatTemplateError::Missing { .. }) => None,
                    Err(e) => {
                        self.say(Update::LoadFailed(format!("{}: {e}", dir.display())));
                        return;
                    }
                };
                let info = ModelInfo {
                    dir,
                    max_model_len: engine.max_model_len(),
                    chat_template: template.is_some(),
                    load_seconds: t.elapsed().as_secs_f64(),
                };
                self.template = template;
                self.stats.publish(&engine, Duration::ZERO);
                self.engine = Some(engine);
                self.say(Update::Loaded(info));
            }
            Err(e) => self.say(Update::LoadFailed(format!("{}: {e}", dir.display()))),
        }
    }

    fn step(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        if !engine.has_unfinished() {
            return;
        }
        let t = Instant::now();
        let result = engine.step();
        let took = t.elapsed();
        match result {
            Ok(n) => self.stats.recent.push((Instant::now(), n)),
            Err(e) => {
                let _ = self.tx.send(Update::StepFailed(e.to_string()));
            }
        }
        self.stats.publish(engine, took);
        (self.wake)(Wake::Tokens);
    }
}

impl Publisher {
    fn clear(&mut self) {
        self.recent.clear();
        if let Ok(mut s) = self.snapshot.lock() {
            *s = None;
        }
    }

    fn publish(&mut self, engine: &Engine, last_step: Duration) {
        let now = Instant::now();
        self.recent
            .retain(|(t, _)| now.duration_since(*t) < Duration::from_secs(1));
        let computed: usize = self.recent.iter().map(|(_, n)| n).sum();
        let span = self
            .recent
            .first()
            .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64())
            .max(last_step.as_secs_f64());
        let snap = Snapshot {
            stats: engine.stats(),
            computed_per_s: if span > 0.0 {
                computed as f64 / span
            } else {
                0.0
            },
            last_step,
        };
        if let Ok(mut s) = self.snapshot.lock() {
            *s = Some(snap);
        }
    }
}

/// The prompt of a conversation: the chat template's rendering where the model has one,
/// else the turns joined into one text for the model to continue.
fn prompt_of(
    engine: &Engine,
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
) -> Result<Prompt, String> {
    match template {
        Some(t) => {
            let text = t.render(messages, true).map_err(|e| e.to_string())?;
            // The template writes the special tokens itself.
            let ids = engine
                .tokenizer
                .encode_plain(&text)
                .map_err(|e| e.to_string())?;
            Ok(Prompt::Tokens(ids))
        }
        None => Ok(Prompt::Text(
            messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .concat(),
        )),
    }
}
