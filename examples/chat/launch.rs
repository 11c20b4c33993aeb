//! Command line and window set-up: eframe opens the window's device with the descriptor
//! pagellm asks for (its adapter's full limits and the optional features its kernels use),
//! picks the adapter by pagellm's rules among those that can present to the window, and the
//! app hands that same adapter, device and queue to `GpuContext::from_existing`.

use crate::app::ChatApp;
use crate::script::Script;
use clap::Parser;
use eframe::egui;
use eframe::egui_wgpu::{WgpuConfiguration, WgpuSetup};
use pagellm::{AdapterRequest, GpuContext, KvDtype};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "chat",
    about = "A desktop chat window on pagellm, sharing the window's wgpu device"
)]
pub struct Args {
    /// Model folder to load at start (config.json, *.safetensors, tokenizer.json).
    /// [default: models/fortunes-llama, the model that ships in the repository]
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Sampling temperature (0 is greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Tokens per reply.
    #[arg(long, default_value_t = 96)]
    pub max_tokens: usize,
    /// Fixed seed for every reply (random when unset).
    #[arg(long)]
    pub seed: Option<u64>,
    /// KV cache size in MiB (default: fitted to the GPU's free memory; 256 MiB at most
    /// on a software adapter or one that reports none).
    #[arg(long)]
    pub kv_cache_mib: Option<u64>,
    #[arg(long, default_value = "f16")]
    pub kv_dtype: KvDtype,
    /// Convert the weights as they load (q8_0, q4_k, ... quantize; f16 widens a GGUF's);
    /// default: as stored.
    #[arg(long)]
    pub weight_dtype: Option<pagellm::WeightDtype>,
    /// Keep computed prompt blocks in this folder as well, so a conversation reopened after
    /// a restart reads its history instead of recomputing it.
    #[arg(long)]
    pub kv_cache_dir: Option<std::path::PathBuf>,
    /// Tokens one engine step may compute: long prompts are prefilled in chunks of this
    /// size, which bounds how long one step holds the shared queue.
    #[arg(long, default_value_t = 128)]
    pub max_batched_tokens: usize,
    /// The frame-time budget of one engine step in milliseconds: steps are timed and
    /// prompt chunks cut to what fits, so that the window's frames are not held up behind
    /// a long step on the queue they share; 0 turns it off (only --max-batched-tokens
    /// bounds a step). Replies are the same either way.
    #[arg(long, default_value_t = 16.0)]
    pub max_step_ms: f64,
    /// Most redraws per second while replies stream (each shows every token that arrived
    /// since the last).
    #[arg(long, default_value_t = 30.0)]
    pub stream_fps: f64,
    /// Window size in points.
    #[arg(long, default_value_t = 1100.0)]
    pub width: f32,
    #[arg(long, default_value_t = 680.0)]
    pub height: f32,

    // --- the headless check and the frame-time measurement ---
    /// Open one conversation per --prompt and send it once the model has loaded.
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Write a screenshot of the window here once the replies are done (and one taken
    /// before they started next to it, NAME.before.png, plus NAME.json describing both),
    /// then exit.
    #[arg(long)]
    pub screenshot: Option<PathBuf>,
    /// With --prompt: generate N tokens per reply, then finish (screenshot, exit).
    #[arg(long)]
    pub exit_after: Option<usize>,
    /// Press the last conversation's Stop button once its reply has K tokens.
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Measure frame times: N frames with the UI idle, then while every --prompt (two by
    /// default) generates; print p50/p99 of both and exit. Redraws continuously without
    /// vsync so that the figures are what a frame costs.
    #[arg(long)]
    pub bench_frames: Option<usize>,
    /// Also write every frame time (phase, milliseconds) to this file.
    #[arg(long)]
    pub frame_log: Option<PathBuf>,
    /// Give up (exit 3) if a scripted run has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// Parses `args`, runs the window until it closes, and returns the process exit code:
/// 0, or for a scripted run 1 when a step failed, 2 for bad arguments, 3 on timeout.
pub fn main_with(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let mut args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    if args.model.is_none() {
        args.model = Some(shipped_model());
    }
    let script = match Script::from_args(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("chat: {e}");
            return 2;
        }
    };
    let exit = script.as_ref().map(Script::exit_code);
    if let Some(s) = &script {
        s.start_watchdog();
    }
    let req = match AdapterRequest::from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chat: {e}");
            return 2;
        }
    };
    let mut wgpu_options = WgpuConfiguration::default();
    if script.as_ref().is_some_and(Script::measures_frames) {
        wgpu_options.surface.present_mode = eframe::wgpu::PresentMode::AutoNoVsync;
    }
    if let WgpuSetup::CreateNew(setup) = &mut wgpu_options.wgpu_setup {
        setup.instance_descriptor.backends = req.backends;
        let pick = req.clone();
        setup.native_adapter_selector = Some(Arc::new(move |adapters, surface| {
            let fit: Vec<_> = adapters
                .iter()
                .filter(|a| surface.is_none_or(|s| a.is_surface_supported(s)))
                .cloned()
                .collect();
            let i = pick.choose(&fit).map_err(|e| {
                let all: Vec<String> = adapters
                    .iter()
                    .map(|a| {
                        let i = a.get_info();
                        format!("{} ({:?})", i.name, i.backend)
                    })
                    .collect();
                format!(
                    "among the adapters that can present to this window: {e} (all adapters: {})",
                    all.join(", ")
                )
            })?;
            Ok(fit[i].clone())
        }));
        setup.device_descriptor = Arc::new(GpuContext::device_descriptor);
    }
    let options = eframe::NativeOptions {
        viewport: egui::ViewportBuilder::default()
            .with_title("pagellm chat")
            .with_inner_size([args.width, args.height]),
        renderer: eframe::Renderer::Wgpu,
        wgpu_options,
        ..Default::default()
    };
    let result = eframe::run_native(
        "pagellm chat",
        options,
        Box::new(move |cc| {
            let rs = cc
                .wgpu_render_state
                .as_ref()
                .ok_or("eframe opened no wgpu device")?;
            let ctx = Arc::new(GpuContext::from_existing(
                rs.adapter.clone(),
                rs.device.clone(),
                rs.queue.clone(),
            ));
            Ok(Box::new(ChatApp::new(&cc.egui_ctx, ctx, &args, script)?))
        }),
    );
    match result {
        Ok(()) => exit.map_or(0, |e| e.get()),
        Err(e) => {
            eprintln!("chat: {e}");
            1
        }
    }
}

/// The shipped model: relative to the working directory when run from the repository (so
/// that the window shows a short path), else where the repository was when this was built.
fn shipped_model() -> PathBuf {
    let relative = PathBuf::from("models/fortunes-llama");
    if relative.join("config.json").is_file() {
        relative
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama")
    }
}
