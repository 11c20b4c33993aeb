//! The window: a model bar (adapter, folder, load progress), conversations side by side,
//! each with its own Stop button, the sampling settings, and a live panel of the KV cache
//! and the scheduler. Every frame drains what the engine thread has sent without waiting;
//! the engine thread asks for a repaint when there is something new.

use crate::launch::Args;
use crate::script::Script;
use crate::worker::{Command, ModelInfo, Snapshot, Update, Wake, Worker};
use eframe::egui::{self, Color32, RichText};
use pagellm::RequestStream;
use pagellm::{ChatMessage, SamplingParams};
use pagellm::{EngineConfig, Event, FinishReason, GpuContext};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most conversations shown side by side.
const MAX_CONVERSATIONS: usize = 4;

pub enum ModelState {
    Idle,
    Loading { done: u64, total: u64 },
    Ready(ModelInfo),
    Failed(String),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    User,
    Model,
}

pub struct Turn {
    pub role: Role,
    pub text: String,
    /// How a reply ended (or why it failed), shown under it.
    pub note: Option<(String, bool)>,
    pub tokens: usize,
    /// Where the text was drawn in the latest frame, in points.
    pub rect: egui::Rect,
}

pub struct Conversation {
    pub id: u64,
    pub turns: Vec<Turn>,
    pub input: String,
    /// The reply being generated: its event stream once the engine has queued it.
    pub live: Option<Live>,
    /// Where the transcript was drawn in the latest frame, in points.
    pub transcript_rect: egui::Rect,
    /// Whether any reply of this conversation failed.
    pub failed: bool,
}

pub enum Live {
    Queued,
    Streaming(RequestStream),
}

pub struct Settings {
    pub temperature: f32,
    pub top_p: f32,
    pub max_tokens: usize,
    pub fixed_seed: bool,
    pub seed: u64,
}

pub struct ChatApp {
    worker: Worker,
    pub adapter: String,
    pub model: ModelState,
    model_dir: String,
    config: EngineConfig,
    pub convs: Vec<Conversation>,
    next_conv: u64,
    pub settings: Settings,
    /// A fault not tied to one conversation (a failed step, the engine thread gone).
    banner: Option<String>,
    engine_gone: bool,
    pub snapshot: Option<Snapshot>,
    /// Tokens streamed into conversations, with when, over the last two seconds.
    streamed: VecDeque<(Instant, usize)>,
    pub frames: FrameTimes,
    script: Option<Script>,
}

impl ChatApp {
    pub fn new(
        egui_ctx: &egui::Context,
        ctx: Arc<GpuContext>,
        args: &Args,
        script: Option<Script>,
    ) -> std::io::Result<Self> {
        let adapter = ctx.describe();
        let wake_ctx = egui_ctx.clone();
        let frame = Duration::from_secs_f64(1.0 / args.stream_fps.max(1.0));
        let worker = Worker::spawn(ctx, move |w| match w {
            Wake::Now => wake_ctx.request_repaint(),
            Wake::Tokens => wake_ctx.request_repaint_after(frame),
        })?;
        let config = EngineConfig {
            kv_cache_bytes: args.kv_cache_mib.map(|m| m << 20),
            swap_space_bytes: args.kv_cache_mib.unwrap_or(64) << 20,
            kv_dtype: args.kv_dtype,
            weight_dtype: args.weight_dtype,
            max_num_batched_tokens: args.max_batched_tokens,
            max_step_ms: (args.max_step_ms > 0.0).then_some(args.max_step_ms),
            kv_cache_dir: args.kv_cache_dir.clone(),
            ..EngineConfig::default()
        };
        let mut app = ChatApp {
            worker,
            adapter,
            model: ModelState::Idle,
            model_dir: args
                .model
                .as_ref()
                .map(|m| m.display().to_string())
                .unwrap_or_default(),
            config,
            convs: Vec::new(),
            next_conv: 1,
            settings: Settings {
                temperature: args.temperature,
                top_p: args.top_p,
                max_tokens: args.max_tokens,
                fixed_seed: args.seed.is_some(),
                seed: args.seed.unwrap_or(1),
            },
            banner: None,
            engine_gone: false,
            snapshot: None,
            streamed: VecDeque::new(),
            frames: FrameTimes::default(),
            script,
        };
        app.new_conversation();
        app.load();
        Ok(app)
    }

    pub fn load(&mut self) {
        let dir = PathBuf::from(self.model_dir.trim());
        for c in &mut self.convs {
            if c.live.take().is_some() {
                note_last(c, "stopped: the model was reloaded".into(), true);
            }
        }
        self.banner = None;
        self.model = ModelState::Loading { done: 0, total: 0 };
        if !self.worker.send(Command::Load {
            dir,
            config: self.config.clone(),
        }) {
            self.engine_gone();
        }
    }

    pub fn new_conversation(&mut self) -> usize {
        self.convs.push(Conversation {
            id: self.next_conv,
            turns: Vec::new(),
            input: String::new(),
            live: None,
            transcript_rect: egui::Rect::NOTHING,
            failed: false,
        });
        self.next_conv += 1;
        self.convs.len() - 1
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.model, ModelState::Ready(_))
    }

    /// The sampling settings as the next reply will use them.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.settings.temperature,
            top_p: self.settings.top_p,
            max_tokens: self.settings.max_tokens,
            seed: self.settings.fixed_seed.then_some(self.settings.seed),
            ..SamplingParams::default()
        }
    }

    /// The index of the conversation with id `id`, if it is still open.
    pub fn index_of(&self, id: u64) -> Option<usize> {
        self.convs.iter().position(|c| c.id == id)
    }

    /// Tokens conversation `i` could still generate after its pending input: the context
    /// less the conversation's length in bytes and a few special tokens, which bounds the
    /// prompt for byte-level tokenizers without a chat template (the shipped model's).
    pub fn context_left(&self, i: usize) -> usize {
        let ModelState::Ready(info) = &self.model else {
            return 0;
        };
        let c = &self.convs[i];
        let chars: usize = c.turns.iter().map(|t| t.text.len()).sum::<usize>() + c.input.len();
        info.max_model_len.saturating_sub(chars + 8)
    }

    /// Sends conversation `i`'s input as a new user turn and starts the reply.
    pub fn send(&mut self, i: usize) {
        self.send_with(i, self.params());
    }

    /// Like [`Self::send`] with explicit sampling parameters.
    pub fn send_with(&mut self, i: usize, params: SamplingParams) {
        let c = &mut self.convs[i];
        if c.live.is_some() || c.input.trim().is_empty() {
            return;
        }
        // Ctrl+Enter may have left a line break that the user did not mean to send.
        let text = c.input.trim_end_matches(['\n', '\r']).to_string();
        c.input.clear();
        c.turns.push(Turn {
            role: Role::User,
            text,
            note: None,
            tokens: 0,
            rect: egui::Rect::NOTHING,
        });
        let messages = history(&c.turns);
        c.turns.push(Turn {
            role: Role::Model,
            text: String::new(),
            note: None,
            tokens: 0,
            rect: egui::Rect::NOTHING,
        });
        c.live = Some(Live::Queued);
        let conv = c.id;
        if !self.worker.send(Command::Send {
            conv,
            messages,
            params,
        }) {
            self.engine_gone();
        }
    }

    pub fn stop(&mut self, i: usize) {
        let conv = self.convs[i].id;
        if !self.worker.send(Command::Abort { conv }) {
            self.engine_gone();
        }
    }

    fn engine_gone(&mut self) {
        self.engine_gone = true;
        self.banner = Some("the engine thread stopped unexpectedly; restart the app".into());
        for c in &mut self.convs {
            if c.live.take().is_some() {
                note_last(c, "failed: the engine thread stopped".into(), true);
            }
        }
    }

    /// Everything the engine thread has sent since the last frame, without waiting.
    fn drain(&mut self) {
        loop {
            match self.worker.updates.try_recv() {
                Ok(u) => self.apply(u),
                Err(flume::TryRecvError::Empty) => break,
                Err(flume::TryRecvError::Disconnected) => {
                    if !self.engine_gone {
                        self.engine_gone();
                    }
                    break;
                }
            }
        }
        let now = Instant::now();
        for c in &mut self.convs {
            let Some(Live::Streaming(rx)) = &c.live else {
                continue;
            };
            let mut ended = None;
            let mut new_tokens = 0;
            loop {
                match rx.try_recv() {
                    Some(Event::Token { index: 0, text, .. }) => {
                        new_tokens += 1;
                        if let Some(t) = c.turns.last_mut() {
                            t.text.push_str(&text);
                            t.tokens += 1;
                        }
                    }
                    Some(Event::Token { .. }) => {}
                    Some(Event::Finished(out)) => {
                        let first = out.outputs.first();
                        // The final text is authoritative: it includes what streaming held
                        // back (an incomplete character at an abort).
                        if let (Some(o), Some(t)) = (first, c.turns.last_mut()) {
                            t.text.clone_from(&o.text);
                            t.tokens = o.token_ids.len();
                        }
                        ended = Some((finish_note(first.map(|o| o.finish_reason)), false));
                        break;
                    }
                    Some(Event::Failed(msg)) => {
                        ended = Some((format!("failed: {msg}"), true));
                        break;
                    }
                    None if rx.is_ended() => {
                        ended = Some(("failed: the engine dropped the request".into(), true));
                        break;
                    }
                    None => break,
                }
            }
            if new_tokens > 0 {
                self.streamed.push_back((now, new_tokens));
            }
            if let Some((note, failed)) = ended {
                c.live = None;
                note_last(c, note, failed);
            }
        }
        while self
            .streamed
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(2))
        {
            self.streamed.pop_front();
        }
        self.snapshot = self.worker.snapshot();
    }

    fn apply(&mut self, u: Update) {
        match u {
            Update::Loading { done, total } => self.model = ModelState::Loading { done, total },
            Update::Loaded(info) => self.model = ModelState::Ready(info),
            Update::LoadFailed(e) => self.model = ModelState::Failed(e),
            Update::Started { conv, events } => {
                // Only a reply still waiting for its start: one the user has given up on
                // meanwhile (a reload) stays given up, and dropping `events` aborts it.
                if let Some(c) = self.convs.iter_mut().find(|c| c.id == conv) {
                    if matches!(c.live, Some(Live::Queued)) {
                        c.live = Some(Live::Streaming(events));
                    }
                }
            }
            Update::Refused { conv, reason } => {
                if let Some(c) = self.convs.iter_mut().find(|c| c.id == conv) {
                    c.live = None;
                    note_last(c, format!("refused: {reason}"), true);
                }
            }
            Update::StepFailed(e) => self.banner = Some(format!("an engine step failed: {e}")),
        }
    }

    /// Tokens streamed per second over the last two seconds.
    fn streamed_per_s(&self) -> f64 {
        let n: usize = self.streamed.iter().map(|(_, n)| n).sum();
        match self.streamed.front() {
            Some((t, _)) => n as f64 / t.elapsed().as_secs_f64().max(0.5),
            None => 0.0,
        }
    }

    fn model_bar(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label(RichText::new("pagellm chat").strong());
            ui.separator();
            ui.label(format!("adapter: {}", self.adapter));
            ui.label("(one device for the window and the model)");
        });
        ui.horizontal(|ui| {
            ui.label("model folder");
            let edit = egui::TextEdit::singleline(&mut self.model_dir).desired_width(360.0);
            let r = ui.add_enabled(!matches!(self.model, ModelState::Loading { .. }), edit);
            let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let loading = matches!(self.model, ModelState::Loading { .. });
            if ui
                .add_enabled(!loading, egui::Button::new("Load"))
                .clicked()
                || enter
            {
                self.load();
            }
            match &self.model {
                ModelState::Idle => {}
                ModelState::Loading { done, total } => {
                    let f = if *total > 0 {
                        *done as f32 / *total as f32
                    } else {
                        0.0
                    };
                    ui.add(
                        egui::ProgressBar::new(f)
                            .desired_width(200.0)
                            .text(format!("uploading weights {}%", (f * 100.0) as u32)),
                    );
                }
                ModelState::Ready(info) => {
                    let name = info.dir.file_name().unwrap_or(info.dir.as_os_str());
                    ui.label(format!(
                        "ready: {}, context {} tokens, {}, loaded in {:.1} s",
                        name.to_string_lossy(),
                        info.max_model_len,
                        if info.chat_template {
                            "chat template"
                        } else {
                            "no chat template: replies continue the text"
                        },
                        info.load_seconds
                    ));
                }
                ModelState::Failed(_) => {
                    ui.colored_label(Color32::LIGHT_RED, "failed to load");
                }
            }
        });
        if let ModelState::Failed(e) = &self.model {
            ui.colored_label(Color32::LIGHT_RED, e);
        }
        if let Some(b) = &self.banner {
            ui.colored_label(Color32::LIGHT_RED, b);
        }
    }

    fn side_panel(&mut self, ui: &mut egui::Ui) {
        ui.heading("Sampling");
        let s = &mut self.settings;
        // Clamped only when edited here: values given on the command line are kept, and the
        // engine refuses impossible ones with a reason shown under the conversation.
        let clamp = egui::SliderClamping::Edits;
        ui.add(
            egui::Slider::new(&mut s.temperature, 0.0..=2.0)
                .clamping(clamp)
                .text("temperature"),
        );
        ui.add(
            egui::Slider::new(&mut s.top_p, 0.05..=1.0)
                .clamping(clamp)
                .text("top-p"),
        );
        let max = match &self.model {
            ModelState::Ready(i) => i.max_model_len.saturating_sub(1).max(1),
            _ => 4096,
        };
        ui.add(
            egui::Slider::new(&mut s.max_tokens, 1..=max)
                .clamping(clamp)
                .text("max tokens"),
        );
        ui.horizontal(|ui| {
            ui.checkbox(&mut s.fixed_seed, "seed");
            ui.add_enabled(s.fixed_seed, egui::DragValue::new(&mut s.seed));
        });
        ui.separator();
        ui.heading("KV cache and scheduler");
        let Some(snap) = &self.snapshot else {
            ui.label("no model loaded");
            return;
        };
        let st = &snap.stats;
        let d = st.cache.device;
        egui::Grid::new("stats").num_columns(2).show(ui, |ui| {
            let mut row = |k: &str, v: String| {
                ui.label(k);
                ui.label(v);
                ui.end_row();
            };
            row(
                "KV dtype",
                format!(
                    "{} ({} B/token)",
                    st.kv_layout.dtype,
                    st.kv_bytes_per_token()
                ),
            );
            row(
                "device blocks",
                format!(
                    "{} used / {} free / {} cached of {}",
                    d.used, d.free, d.cached, d.total
                ),
            );
            row(
                "pool holds",
                format!(
                    "{} tokens ({:.1} MiB)",
                    st.kv_pool_tokens(),
                    st.kv_pool_bytes as f64 / (1 << 20) as f64
                ),
            );
            row(
                "utilization",
                format!(
                    "{:.0}% of used slots filled",
                    st.cache.utilization() * 100.0
                ),
            );
            row(
                "requests",
                format!(
                    "{} running, {} waiting, {} swapped",
                    st.num_running, st.num_waiting, st.num_swapped
                ),
            );
            row(
                "preemptions",
                format!(
                    "{} ({} swap, {} recompute)",
                    st.scheduler.preemptions,
                    st.scheduler.preempted_by_swap,
                    st.scheduler.preempted_by_recompute
                ),
            );
            row(
                "blocks swapped",
                format!(
                    "{} out, {} in",
                    st.blocks_swapped_out(),
                    st.blocks_swapped_in()
                ),
            );
            row(
                "prefix cache",
                format!(
                    "{} hits, {} misses",
                    st.cache.prefix_hits, st.cache.prefix_misses
                ),
            );
            let tier = st.cache.host_tier;
            if tier.budget > 0 {
                row(
                    "host tier",
                    format!(
                        "{} hits, {} saved, {} evicted, {}/{} blocks",
                        tier.hits, tier.saves, tier.evictions, tier.blocks, tier.budget
                    ),
                );
            }
            if let Some(d) = st.disk {
                row(
                    "disk tier",
                    format!(
                        "{} hits, {} written, {} evicted, {:.1} MiB",
                        d.hits,
                        d.writes,
                        d.evictions,
                        d.bytes as f64 / (1 << 20) as f64
                    ),
                );
            }
            row("streamed", format!("{:.1} tokens/s", self.streamed_per_s()));
            row(
                "computed",
                format!("{:.1} tokens/s (prefill + decode)", snap.computed_per_s),
            );
            row(
                "last step",
                format!("{:.1} ms", snap.last_step.as_secs_f64() * 1e3),
            );
            row(
                "step budget",
                match st.pacing {
                    Some(p) => format!(
                        "{:.0} ms: next step up to {} tokens; {} of {} steps over",
                        p.budget_ms, p.token_limit, p.over_budget, p.steps
                    ),
                    None => "none (--max-step-ms 0)".into(),
                },
            );
            let (p50, p99) = self.frames.recent_p50_p99();
            row("frame time", format!("p50 {p50:.1} ms, p99 {p99:.1} ms"));
        });
    }

    fn conversations(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let can_add = self.convs.len() < MAX_CONVERSATIONS;
            if ui
                .add_enabled(can_add, egui::Button::new("+ conversation"))
                .clicked()
            {
                self.new_conversation();
            }
            ui.label("each conversation streams at once; the engine batches them");
        });
        ui.separator();
        let ready = self.is_ready();
        let mut actions = Vec::new();
        let n = self.convs.len().max(1);
        ui.columns(n, |cols| {
            for (i, (c, ui)) in self.convs.iter_mut().zip(cols.iter_mut()).enumerate() {
                if let Some(a) = conversation_pane(ui, c, ready) {
                    actions.push((i, a));
                }
            }
        });
        // Highest index first, so that closing one does not shift the others.
        actions.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, a) in actions {
            match a {
                Action::Send => self.send(i),
                Action::Stop => self.stop(i),
                Action::Close => {
                    self.stop(i);
                    self.convs.remove(i);
                }
            }
        }
    }
}

enum Action {
    Send,
    Stop,
    Close,
}

fn conversation_pane(ui: &mut egui::Ui, c: &mut Conversation, ready: bool) -> Option<Action> {
    let mut action = None;
    ui.horizontal(|ui| {
        ui.label(RichText::new(format!("Conversation {}", c.id)).strong());
        let status = match &c.live {
            Some(Live::Queued) => "queued".to_string(),
            Some(Live::Streaming(_)) => {
                format!(
                    "streaming, {} tokens",
                    c.turns.last().map_or(0, |t| t.tokens)
                )
            }
            None => String::new(),
        };
        ui.label(status);
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if ui.small_button("Close").clicked() {
                action = Some(Action::Close);
            }
            if ui
                .add_enabled(c.live.is_some(), egui::Button::new("Stop"))
                .clicked()
            {
                action = Some(Action::Stop);
            }
        });
    });
    let input_height = 64.0;
    let out = egui::ScrollArea::vertical()
        .id_salt(("transcript", c.id))
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .max_height((ui.available_height() - input_height).max(80.0))
        .show(ui, |ui| {
            for t in &mut c.turns {
                t.rect = match t.role {
                    Role::User => {
                        egui::Frame::new()
                            .fill(ui.visuals().faint_bg_color)
                            .inner_margin(4.0)
                            .corner_radius(4.0)
                            .show(ui, |ui| ui.label(RichText::new(&t.text).strong()).rect)
                            .inner
                    }
                    Role::Model => ui.label(&t.text).rect,
                };
                if let Some((note, failed)) = &t.note {
                    let color = if *failed {
                        Color32::LIGHT_RED
                    } else {
                        ui.visuals().weak_text_color()
                    };
                    ui.label(RichText::new(note).small().color(color));
                }
            }
        });
    c.transcript_rect = out.inner_rect;
    ui.horizontal(|ui| {
        let edit = egui::TextEdit::multiline(&mut c.input)
            .desired_rows(2)
            .desired_width(ui.available_width() - 60.0)
            .hint_text("type, then Ctrl+Enter or Send");
        let r = ui.add(edit);
        let ctrl_enter =
            r.has_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter) && i.modifiers.command);
        let can_send = ready && c.live.is_none();
        if (ui
            .add_enabled(can_send, egui::Button::new("Send"))
            .clicked()
            || ctrl_enter)
            && can_send
        {
            action = Some(Action::Send);
        }
    });
    action
}

/// The messages of a conversation for the model: replies that produced nothing (refused,
/// failed) are left out and what the user wrote in a row is joined, so that the roles
/// alternate as chat templates require.
fn history(turns: &[Turn]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::new();
    for t in turns.iter().filter(|t| !t.text.is_empty()) {
        let role = match t.role {
            Role::User => "user",
            Role::Model => "assistant",
        };
        match out.last_mut() {
            Some(last) if last.role == role => {
                last.content.push('\n');
                last.content.push_str(&t.text);
            }
            _ => out.push(ChatMessage::new(role, &t.text)),
        }
    }
    out
}

fn note_last(c: &mut Conversation, note: String, failed: bool) {
    c.failed |= failed;
    if let Some(t) = c.turns.last_mut() {
        t.note = Some((note, failed));
    }
}

fn finish_note(reason: Option<FinishReason>) -> String {
    match reason {
        Some(FinishReason::Stop) => "finished: end of text".into(),
        Some(FinishReason::Length) => "finished: max tokens".into(),
        Some(FinishReason::Abort) => "stopped".into(),
        None => "finished".into(),
    }
}

/// Intervals between frames, for the live panel and the frame-time measurement.
#[derive(Default)]
pub struct FrameTimes {
    last: Option<Instant>,
    recent: VecDeque<f64>,
}

impl FrameTimes {
    /// Records the start of a frame; returns the interval since the previous one in ms.
    pub fn tick(&mut self) -> Option<f64> {
        let now = Instant::now();
        let dt = self
            .last
            .replace(now)
            .map(|t| now.duration_since(t).as_secs_f64() * 1e3);
        if let Some(ms) = dt {
            if self.recent.len() == 120 {
                self.recent.pop_front();
            }
            self.recent.push_back(ms);
        }
        dt
    }

    pub fn recent_p50_p99(&self) -> (f64, f64) {
        let v: Vec<f64> = self.recent.iter().copied().collect();
        (percentile(&v, 0.50), percentile(&v, 0.99))
    }
}

/// The `q` quantile of `v` (nearest rank); 0 for no samples.
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl eframe::App for ChatApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let dt = self.frames.tick();
        let started = Instant::now();
        self.drain();
        egui::Panel::top("model").show(ui, |ui| self.model_bar(ui));
        egui::Panel::right("side")
            .default_size(330.0)
            .show(ui, |ui| self.side_panel(ui));
        egui::CentralPanel::default().show(ui, |ui| self.conversations(ui));
        if let Some(mut s) = self.script.take() {
            let ui_ms = started.elapsed().as_secs_f64() * 1e3;
            s.frame(self, ui.ctx(), dt, ui_ms);
            self.script = Some(s);
        }
    }
}
