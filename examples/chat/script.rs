//! Scripted runs of the window, for CI and for measuring: `--prompt` opens conversations
//! and sends them once the model has loaded; `--screenshot` writes the window before and
//! after the replies (with a JSON description of what was drawn where) and exits;
//! `--bench-frames` measures frame times with the UI idle and while the replies generate.

use crate::app::{percentile, ChatApp, ModelState};
use crate::launch::Args;
use eframe::egui::{self, ColorImage};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The prompts a frame measurement uses when none are given: two conversations.
const BENCH_PROMPTS: [&str; 2] = ["A wise man once said", "The secret of life is"];

/// Exit code of a run whose window closed before its script finished.
const UNFINISHED: i32 = 4;

/// The exit code a scripted run leaves for `main`: [`UNFINISHED`] until the script ends.
#[derive(Clone)]
pub struct ExitCode(Arc<AtomicI32>);

impl ExitCode {
    fn new(exits: bool) -> Self {
        ExitCode(Arc::new(AtomicI32::new(if exits { UNFINISHED } else { 0 })))
    }
    pub fn get(&self) -> i32 {
        self.0.load(Ordering::Relaxed)
    }
    /// The script ended: success unless a failure was recorded.
    fn done(&self) {
        let _ = self
            .0
            .compare_exchange(UNFINISHED, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
    /// The first failure names the run.
    fn fail(&self, code: i32) {
        let cur = self.get();
        if cur == 0 || cur == UNFINISHED {
            self.0.store(code, Ordering::Relaxed);
        }
    }
}

enum State {
    WaitLoad,
    /// Frame measurement: redrawing with nothing to do.
    Idle,
    /// Waiting for the screenshot taken before generation.
    Before,
    Generating,
    /// A few frames more, so that the last tokens are drawn.
    Settle(u32),
    After,
    Done,
}

pub struct Script {
    prompts: Vec<String>,
    /// Ids of the conversations the prompts went to.
    convs: Vec<u64>,
    exit_after: Option<usize>,
    stop_after: Option<usize>,
    screenshot: Option<PathBuf>,
    bench_frames: Option<usize>,
    frame_log: Option<PathBuf>,
    exits: bool,
    deadline: Instant,
    state: State,
    shots_tx: flume::Sender<Arc<ColorImage>>,
    shots: flume::Receiver<Arc<ColorImage>>,
    before: Option<Arc<ColorImage>>,
    idle_ms: Vec<f64>,
    busy_ms: Vec<f64>,
    /// Time the app's own ui code took per frame (layout; not tessellation or rendering).
    idle_ui_ms: Vec<f64>,
    busy_ui_ms: Vec<f64>,
    started: Option<Instant>,
    stopped: bool,
    exit: ExitCode,
}

impl Script {
    /// The script the arguments ask for, if any.
    pub fn from_args(a: &Args) -> Result<Option<Script>, String> {
        let exits = a.screenshot.is_some() || a.exit_after.is_some() || a.bench_frames.is_some();
        if a.stop_after == Some(0) {
            return Err("--stop-after must be at least 1 token".into());
        }
        if a.frame_log.is_some() && a.bench_frames.is_none() {
            return Err("--frame-log needs --bench-frames".into());
        }
        if a.bench_frames.is_some() && a.screenshot.is_some() {
            return Err("--bench-frames and --screenshot are separate runs".into());
        }
        if !exits && a.prompt.is_empty() {
            if a.stop_after.is_some() {
                return Err("--stop-after needs --prompt".into());
            }
            return Ok(None);
        }
        let mut prompts = a.prompt.clone();
        if prompts.is_empty() {
            if a.bench_frames.is_none() {
                return Err("--screenshot and --exit-after need at least one --prompt".into());
            }
            prompts = BENCH_PROMPTS.iter().map(|s| s.to_string()).collect();
        }
        if prompts.iter().any(|p| p.trim().is_empty()) {
            return Err("a --prompt is empty".into());
        }
        if a.exit_after == Some(0) {
            return Err("--exit-after must be at least 1 token".into());
        }
        let (shots_tx, shots) = flume::unbounded();
        Ok(Some(Script {
            prompts,
            convs: Vec::new(),
            exit_after: a.exit_after,
            stop_after: a.stop_after,
            screenshot: a.screenshot.clone(),
            bench_frames: a.bench_frames,
            frame_log: a.frame_log.clone(),
            exits,
            deadline: Instant::now() + Duration::from_secs(a.timeout_s),
            state: State::WaitLoad,
            shots_tx,
            shots,
            before: None,
            idle_ms: Vec::new(),
            busy_ms: Vec::new(),
            idle_ui_ms: Vec::new(),
            busy_ui_ms: Vec::new(),
            started: None,
            stopped: false,
            exit: ExitCode::new(exits),
        }))
    }

    pub fn exit_code(&self) -> ExitCode {
        self.exit.clone()
    }

    /// Ends the process at the deadline even if no frame comes any more (a wedged GPU, a
    /// lost display): the deadline is otherwise only checked when a frame is drawn.
    pub fn start_watchdog(&self) {
        if !self.exits {
            return;
        }
        let deadline = self.deadline;
        let _ = std::thread::Builder::new()
            .name("chat-watchdog".into())
            .spawn(move || {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                // A grace second for the frame-driven check to end the run cleanly.
                std::thread::sleep(Duration::from_secs(1));
                eprintln!("chat: the scripted run timed out (no frame reached the deadline)");
                std::process::exit(3);
            });
    }

    pub fn measures_frames(&self) -> bool {
        self.bench_frames.is_some()
    }

    fn request_shot(&self, ctx: &egui::Context) {
        let tx = self.shots_tx.clone();
        let wake = ctx.clone();
        ctx.request_screenshot(move |image| {
            let _ = tx.send(image);
            wake.request_repaint();
        });
    }

    fn finish(&mut self, ctx: &egui::Context) {
        self.state = State::Done;
        self.exit.done();
        if self.exits {
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        }
    }

    fn fail(&mut self, ctx: &egui::Context, code: i32, why: &str) {
        eprintln!("chat: {why}");
        self.exit.fail(code);
        self.finish(ctx);
    }

    fn send_all(&mut self, app: &mut ChatApp) {
        let last = self.convs.len().saturating_sub(1);
        for (k, &id) in self.convs.iter().enumerate() {
            let Some(i) = app.index_of(id) else { continue };
            let mut params = app.params();
            if k == last && self.stop_after.is_some() {
                // The reply to be stopped must still be running when Stop is pressed, however
                // fast the adapter: let it run to the end of the context.
                params.ignore_eos = true;
                params.max_tokens = app.context_left(i).max(params.max_tokens);
            }
            app.send_with(i, params);
        }
        self.started = Some(Instant::now());
        self.state = State::Generating;
    }

    /// One frame of the script; `dt` is the interval since the previous frame and `ui_ms`
    /// the time the app's ui code took in this one, in ms.
    pub fn frame(&mut self, app: &mut ChatApp, ctx: &egui::Context, dt: Option<f64>, ui_ms: f64) {
        if !matches!(self.state, State::Done) && Instant::now() > self.deadline {
            return self.fail(ctx, 3, "the scripted run timed out");
        }
        let measuring = self.bench_frames.is_some();
        if measuring {
            ctx.request_repaint();
        } else if matches!(self.state, State::Before | State::After) {
            // A screenshot arrives a frame or two after it is asked for; keep frames coming.
            ctx.request_repaint_after(Duration::from_millis(16));
        }
        match self.state {
            State::WaitLoad => match &app.model {
                ModelState::Failed(e) => {
                    let e = e.clone();
                    self.fail(ctx, 1, &format!("loading the model failed: {e}"));
                }
                ModelState::Ready(_) => {
                    if let Some(n) = self.exit_after {
                        app.settings.max_tokens = n;
                    }
                    for (k, p) in self.prompts.iter().enumerate() {
                        let i = if k < app.convs.len() {
                            k
                        } else {
                            app.new_conversation()
                        };
                        app.convs[i].input = p.clone();
                        self.convs.push(app.convs[i].id);
                    }
                    if measuring {
                        self.state = State::Idle;
                    } else if self.screenshot.is_some() {
                        self.request_shot(ctx);
                        self.state = State::Before;
                    } else {
                        self.send_all(app);
                    }
                }
                _ => {}
            },
            State::Idle => {
                self.idle_ms.extend(dt);
                self.idle_ui_ms.push(ui_ms);
                if self.idle_ms.len() >= self.bench_frames.unwrap_or(0) {
                    self.send_all(app);
                }
            }
            State::Before => {
                if let Ok(img) = self.shots.try_recv() {
                    self.before = Some(img);
                    self.send_all(app);
                }
            }
            State::Generating => {
                if measuring {
                    self.busy_ms.extend(dt);
                    self.busy_ui_ms.push(ui_ms);
                }
                // The Stop button of the last conversation, pressed after K tokens.
                let last = self.convs.last().and_then(|&id| app.index_of(id));
                if let (Some(k), Some(i)) = (self.stop_after, last) {
                    let c = &app.convs[i];
                    let streamed = c.turns.last().map_or(0, |t| t.tokens);
                    if c.live.is_some() && streamed >= k && !self.stopped {
                        self.stopped = true;
                        app.stop(i);
                    }
                }
                // A conversation the user closed counts as done, not as failed.
                let open: Vec<usize> = self
                    .convs
                    .iter()
                    .filter_map(|&id| app.index_of(id))
                    .collect();
                if open.iter().all(|&i| app.convs[i].live.is_none()) {
                    if open.iter().any(|&i| app.convs[i].failed) {
                        eprintln!("chat: a reply failed (see the screenshot)");
                        self.exit.fail(1);
                    }
                    self.state = State::Settle(3);
                    ctx.request_repaint();
                }
            }
            State::Settle(n) => {
                ctx.request_repaint();
                if n > 0 {
                    self.state = State::Settle(n - 1);
                } else if self.screenshot.is_some() {
                    self.request_shot(ctx);
                    self.state = State::After;
                } else {
                    self.report(app);
                    if self.exits {
                        self.finish(ctx);
                    } else {
                        self.state = State::Done;
                    }
                }
            }
            State::After => {
                if let Ok(img) = self.shots.try_recv() {
                    if let Err(e) = self.write_shots(app, ctx, &img) {
                        return self.fail(ctx, 1, &format!("writing the screenshot: {e}"));
                    }
                    self.report(app);
                    self.finish(ctx);
                }
            }
            State::Done => {}
        }
    }

    /// Prints what was generated and, when measuring, the frame times.
    fn report(&self, app: &ChatApp) {
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        for (k, &id) in self.convs.iter().enumerate() {
            let i = app.index_of(id);
            if let Some(t) = i.and_then(|i| app.convs[i].turns.last()) {
                let note = t.note.as_ref().map_or("", |(n, _)| n.as_str());
                println!(
                    "conversation {}: {} tokens ({note}): {:?}",
                    k + 1,
                    t.tokens,
                    t.text
                );
            }
        }
        let tokens: usize = self
            .convs
            .iter()
            .filter_map(|&id| app.index_of(id).and_then(|i| app.convs[i].turns.last()))
            .map(|t| t.tokens)
            .sum();
        println!(
            "generated {tokens} tokens in {secs:.2} s over {} conversations ({:.1} tokens/s)",
            self.convs.len(),
            tokens as f64 / secs.max(1e-9)
        );
        if self.bench_frames.is_none() {
            return;
        }
        let row = |name: &str, v: &[f64]| {
            println!(
                "{name:>22}: n {:>5}  p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
                v.len(),
                percentile(v, 0.5),
                percentile(v, 0.99),
                v.iter().copied().fold(0.0, f64::max)
            );
        };
        println!("adapter: {}", app.adapter);
        row("frame interval, idle", &self.idle_ms);
        row("frame interval, busy", &self.busy_ms);
        row("ui code, idle", &self.idle_ui_ms);
        row("ui code, busy", &self.busy_ui_ms);
        if let Some(p) = app.snapshot.as_ref().and_then(|s| s.stats.pacing) {
            println!(
                "step budget {:.0} ms: {} of {} steps over, last step {:.1} ms, cap {} tokens",
                p.budget_ms, p.over_budget, p.steps, p.last_ms, p.token_limit
            );
        }
        if let Some(path) = &self.frame_log {
            let mut text = String::new();
            for ms in &self.idle_ms {
                text.push_str(&format!("idle {ms:.3}\n"));
            }
            for ms in &self.busy_ms {
                text.push_str(&format!("generating {ms:.3}\n"));
            }
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("chat: writing {}: {e}", path.display());
            }
        }
    }

    /// Writes NAME.png (after), NAME.before.png and NAME.json.
    fn write_shots(
        &self,
        app: &ChatApp,
        ctx: &egui::Context,
        after: &ColorImage,
    ) -> Result<(), String> {
        let path = self.screenshot.as_ref().ok_or("no --screenshot path")?;
        write_png(path, after)?;
        let before_path = path.with_extension("before.png");
        let before = match &self.before {
            Some(b) => {
                write_png(&before_path, b)?;
                before_path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            }
            None => None,
        };
        let ppp = ctx.pixels_per_point();
        let convs: Vec<serde_json::Value> = self
            .convs
            .iter()
            .zip(&self.prompts)
            .filter_map(|(&id, prompt)| {
                let c = &app.convs[app.index_of(id)?];
                let reply = c.turns.last()?;
                let r = c.transcript_rect;
                let t = reply.rect;
                Some(serde_json::json!({
                    "prompt": prompt,
                    "reply": reply.text,
                    "tokens": reply.tokens,
                    "note": reply.note.as_ref().map(|(n, _)| n.clone()),
                    "transcript_px": [r.min.x * ppp, r.min.y * ppp, r.max.x * ppp, r.max.y * ppp],
                    "reply_px": [t.min.x * ppp, t.min.y * ppp, t.max.x * ppp, t.max.y * ppp],
                }))
            })
            .collect();
        let screen = ctx.content_rect();
        let desc = serde_json::json!({
            "adapter": app.adapter,
            "pixels_per_point": ppp,
            "window_points": [screen.width(), screen.height()],
            "image_size": after.size,
            "before": before,
            "conversations": convs,
        });
        let json_path = path.with_extension("json");
        std::fs::write(
            &json_path,
            serde_json::to_string_pretty(&desc).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{}: {e}", json_path.display()))
    }
}

fn write_png(path: &Path, img: &ColorImage) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::create(path).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(
        std::io::BufWriter::new(file),
        img.size[0] as u32,
        img.size[1] as u32,
    );
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| err(&e))?;
    w.write_image_data(img.as_raw()).map_err(|e| err(&e))?;
    w.finish().map_err(|e| err(&e))?;
    std::io::stdout().flush().ok();
    Ok(())
}
