//! The UI's side of the engine: an [`EngineHandle`] on the application's own device. The
//! handle's thread owns the engine, loads models (reporting upload progress) and steps
//! while anything is pending; this file turns the UI's commands into submissions and
//! aborts, and the handle's notices into [`Update`]s and repaint requests, so the UI code
//! never waits for a step or for a result from the GPU. (Its frames still share the
//! device's one queue with the steps: a frame's GPU work runs after the step work submitted
//! before it. On GL, pagellm waits in short slices so that the backend's context lock is not
//! held for a whole step; see `GpuContext::from_existing`.)

use pagellm::{ChatMessage, ChatTemplate, SamplingParams};
use pagellm::{EngineBuilder, EngineHandle, Notice, RequestStream};
use pagellm::{EngineConfig, EngineStats, GpuContext, Prompt, Request};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the UI asks of the engine. Conversations are named by the UI's own ids.
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

/// What the engine tells the UI, in order.
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
        events: RequestStream,
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

/// The engine's state after a recent step, for the live panel.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub stats: EngineStats,
    /// Tokens computed per second (prefill and decode) over the last second or so of steps.
    pub computed_per_s: f64,
    /// Duration of the latest step.
    pub last_step: Duration,
}

type WakeFn = Arc<dyn Fn(Wake) + Send + Sync>;

pub struct Worker {
    ctx: Arc<GpuContext>,
    engine: Option<EngineHandle>,
    /// The loaded model's chat template (set on the engine thread once it has loaded).
    template: Arc<Mutex<Option<ChatTemplate>>>,
    /// The engine's request id of each conversation's latest reply.
    requests: HashMap<u64, u64>,
    tx: flume::Sender<Update>,
    pub updates: flume::Receiver<Update>,
    wake: WakeFn,
}

impl Worker {
    /// The engine's side on `ctx` (the application's own device). `wake(Wake)` is called
    /// whenever there is something new for the UI (an egui repaint request).
    pub fn spawn(
        ctx: Arc<GpuContext>,
        wake: impl Fn(Wake) + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let (tx, updates) = flume::unbounded();
        Ok(Worker {
            ctx,
            engine: None,
            template: Arc::new(Mutex::new(None)),
            requests: HashMap::new(),
            tx,
            updates,
            wake: Arc::new(wake),
        })
    }

    /// Carries out a command; false when the engine is gone (its thread panicked).
    pub fn send(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Load { dir, config } => self.load(dir, config),
            Command::Send {
                conv,
                messages,
                params,
            } => self.start(conv, &messages, params),
            Command::Abort { conv } => {
                if let (Some(engine), Some(id)) = (&self.engine, self.requests.remove(&conv)) {
                    engine.abort(id);
                }
            }
        }
        !matches!(
            self.engine.as_ref().map(EngineHandle::state),
            Some(pagellm::EngineState::Failed(why)) if why.contains("panicked")
        )
    }

    /// The latest statistics the engine published.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let s = self.engine.as_ref()?.stats()?;
        Some(Snapshot {
            stats: s.engine,
            computed_per_s: s.computed_per_s,
            last_step: s.last_step,
        })
    }

    fn say(&self, u: Update) {
        let _ = self.tx.send(u);
        (self.wake)(Wake::Now);
    }

    /// Drops the current engine (aborting what it runs, freeing its memory) and starts one
    /// on the model in `dir`; progress and the outcome arrive as updates.
    fn load(&mut self, dir: PathBuf, config: EngineConfig) {
        self.engine = None;
        self.requests.clear();
        if let Ok(mut t) = self.template.lock() {
            *t = None;
        }
        let (tx, wake, template) = (self.tx.clone(), self.wake.clone(), self.template.clone());
        let model_dir = dir.clone();
        let spawned = EngineBuilder::new(dir.clone())
            .config(config)
            .context(self.ctx.clone())
            .on_notice(move |n| {
                let update = match n {
                    Notice::Loading { done, total } => Update::Loading { done, total },
                    Notice::Ready(info) => loaded(&model_dir, &template, &info),
                    Notice::LoadFailed(why) => Update::LoadFailed(why),
                    Notice::Stepped { error: None, .. } | Notice::Recovered { .. } => {
                        return wake(Wake::Tokens)
                    }
                    Notice::Stepped { error: Some(e), .. } => Update::StepFailed(e),
                };
                let _ = tx.send(update);
                wake(Wake::Now);
            })
            .spawn();
        match spawned {
            Ok(engine) => self.engine = Some(engine),
            Err(e) => self.say(Update::LoadFailed(format!("{}: {e}", dir.display()))),
        }
    }

    /// Submits a conversation's reply; it starts or is refused at once.
    fn start(&mut self, conv: u64, messages: &[ChatMessage], params: SamplingParams) {
        let Some(engine) = self.engine.as_ref() else {
            return self.say(Update::Refused {
                conv,
                reason: "no model is loaded".into(),
            });
        };
        let prompt = match self.template.lock() {
            Ok(t) => prompt_of(engine, t.as_ref(), messages),
            Err(_) => Err("the chat template is unavailable".into()),
        };
        let submitted = prompt.and_then(|p| {
            engine
                .submit(Request::new(p).with_params(params))
                .map_err(|e| e.to_string())
        });
        match submitted {
            Ok(events) => {
                self.requests.insert(conv, events.id());
                self.say(Update::Started { conv, events });
            }
            Err(reason) => self.say(Update::Refused { conv, reason }),
        }
    }
}

/// The update for a model the engine has loaded: its chat template read (a missing one is
/// normal for base models; a broken one is a failure to load).
fn loaded(
    dir: &std::path::Path,
    template: &Mutex<Option<ChatTemplate>>,
    info: &pagellm::ModelInfo,
) -> Update {
    let found = match pagellm::open_chat_template(dir) {
        Ok(t) => Some(t),
        Err(pagellm::ChatTemplateError::Missing { .. }) => None,
        Err(e) => return Update::LoadFailed(format!("{}: {e}", dir.display())),
    };
    let chat_template = found.is_some();
    if let Ok(mut t) = template.lock() {
        *t = found;
    }
    Update::Loaded(ModelInfo {
        dir: dir.to_path_buf(),
        max_model_len: info.max_model_len,
        chat_template,
        load_seconds: info.load_seconds,
    })
}

/// The prompt of a conversation: the chat template's rendering where the model has one,
/// else the turns joined into one text for the model to continue.
fn prompt_of(
    engine: &EngineHandle,
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
) -> Result<Prompt, String> {
    match template {
        Some(t) => {
            let text = t.render(messages, true).map_err(|e| e.to_string())?;
            let tokenizer = engine
                .intake()
                .ok_or("the model is still loading")?
                .tokenizer();
            // The template writes the special tokens itself.
            let ids = tokenizer.encode_plain(&text).map_err(|e| e.to_string())?;
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
