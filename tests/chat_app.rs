//! The desktop chat example (`examples/chat`) under a virtual X display (Xvfb), on every
//! backend with an adapter: the window opens its device with pagellm's descriptor, the
//! engine shares it, two conversations stream at once, the second is stopped with its Stop
//! button, and the window is captured before and after. The check:
//!
//! - the screenshot has the window's size and is not blank;
//! - where the reply is drawn, the pixels changed from the screenshot before generation;
//! - the replies equal what the engine generates for the same prompts in this process
//!   (the stopped one for as many tokens as it got before the abort), so streaming into the
//!   widgets lost nothing;
//! - a folder that is not a model fails with a message naming it, and a reply too long for
//!   the context is refused with the engine's reason; neither panics.
//!
//! This is a test without the libtest harness: winit must own the main thread, so the test
//! re-runs its own binary as the app (`--child-app`), compiled from the example's sources,
//! which keeps it from ever testing a stale example build. Needs `xvfb-run` (Debian: xvfb,
//! xauth); without it the test skips unless `PAGELLM_REQUIRE_XVFB=1` (CI sets it).

#[allow(dead_code)]
#[path = "../examples/chat/app.rs"]
mod app;
#[allow(dead_code)]
#[path = "../examples/chat/launch.rs"]
mod launch;
#[allow(dead_code)]
#[path = "../examples/chat/script.rs"]
mod script;
#[allow(dead_code)]
#[path = "../examples/chat/worker.rs"]
mod worker;

mod common;

use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::sampling::SamplingParams;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WIDTH: u32 = 960;
const HEIGHT: u32 = 600;
const PROMPTS: [&str; 2] = ["A wise man once said", "The secret of life is"];
const TOKENS: usize = 20;
const STOP_AFTER: usize = 4;

/// What libtest would do with this test given its command line: list it (`--list`), skip
/// it (a filter that does not match, `--skip`, `--ignored`), or run it.
fn selected(args: &[String]) -> Option<bool> {
    const NAME: &str = "chat_app";
    if args.iter().any(|a| a == "--list") {
        println!("{NAME}: test");
        return None;
    }
    if args.iter().any(|a| a == "--ignored") {
        return Some(false);
    }
    let exact = args.iter().any(|a| a == "--exact");
    // libtest's options that take a value; the other positional arguments are filters.
    const VALUED: [&str; 6] = [
        "--skip",
        "--test-threads",
        "--format",
        "--color",
        "--logfile",
        "-Z",
    ];
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--skip" {
            skips.extend(it.next());
        } else if VALUED.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') {
            filters.push(a);
        }
    }
    let hit = |f: &String| {
        if exact {
            NAME == f
        } else {
            NAME.contains(f.as_str())
        }
    };
    Some((filters.is_empty() || filters.iter().any(|f| hit(f))) && !skips.iter().any(|f| hit(f)))
}

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "--child-app") {
        let rest = args[..1].iter().chain(&args[2..]).cloned();
        std::process::exit(launch::main_with(rest));
    }
    let text: Vec<String> = args[1..]
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match selected(&text) {
        None => return,
        Some(false) => return println!("test chat_app ... filtered out"),
        Some(true) => {}
    }
    let (Some(xvfb_run), Some(_)) = (find_on_path("xvfb-run"), find_on_path("xauth")) else {
        if std::env::var("PAGELLM_REQUIRE_XVFB").is_ok_and(|v| v == "1") {
            panic!("xvfb-run and xauth are required (PAGELLM_REQUIRE_XVFB=1): apt-get install xvfb xauth");
        }
        eprintln!(
            "\n*** SKIPPED chat_app: no xvfb-run or xauth (apt-get install xvfb xauth) ***\n"
        );
        return;
    };
    for ctx in common::contexts() {
        let backend = match ctx.info.backend {
            wgpu::Backend::Vulkan => "vulkan",
            wgpu::Backend::Gl => "gl",
            other => panic!("no test set-up for {other:?}"),
        };
        let t = std::time::Instant::now();
        let app = App::new(xvfb_run.clone(), ctx, backend);
        chat_window_streams_two_conversations(&app);
        bad_folders_and_requests_fail_with_their_reason(&app);
        println!(
            "test chat_app on {} ... ok ({:.1} s)",
            ctx.describe(),
            t.elapsed().as_secs_f64()
        );
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn shipped_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama")
}

/// Longest one run of the app may take before the test kills it.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Runs of the app on one adapter, each in its own scratch folder (removed afterwards).
struct App<'a> {
    xvfb_run: PathBuf,
    ctx: &'a pagellm::GpuContext,
    backend: &'static str,
    scratch: PathBuf,
}

impl Drop for App<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

impl<'a> App<'a> {
    fn new(xvfb_run: PathBuf, ctx: &'a pagellm::GpuContext, backend: &'static str) -> Self {
        let scratch =
            std::env::temp_dir().join(format!("pagellm-chat-{}-{backend}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(scratch.join("xdg")).unwrap();
        // XDG_RUNTIME_DIR must be private to its user.
        std::fs::set_permissions(scratch.join("xdg"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        App {
            xvfb_run,
            ctx,
            backend,
            scratch,
        }
    }

    /// Runs the app under Xvfb with `args` on this adapter (a window on any other could not
    /// be compared with the engine here); returns (exit code, stdout, stderr).
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let screen = format!("-screen 0 {}x{}x24", WIDTH + 100, HEIGHT + 100);
        // The X authority file in our scratch folder: without one, xvfb-run makes a temporary
        // folder for it and removes that while Xvfb still runs, which now and then fails
        // ("problem while cleaning up temporary directory") and turns the app's exit status
        // into xvfb-run's 5.
        let auth = self.scratch.join("xauthority");
        let mut child = Command::new(&self.xvfb_run)
            .args(["-a", "-s", &screen, "-f"])
            .arg(&auth)
            .arg(std::env::current_exe().unwrap())
            .arg("--child-app")
            .args(args)
            .env("WGPU_BACKEND", self.backend)
            .env("PAGELLM_BACKEND", self.backend)
            .env("WGPU_ADAPTER_NAME", &self.ctx.info.name)
            .env("XDG_RUNTIME_DIR", self.scratch.join("xdg"))
            // winit would take a Wayland session over the virtual X display.
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("WAYLAND_SOCKET")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running xvfb-run");
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_string(&mut text);
                }
                text
            })
        };
        let out = drain(child.stdout.take().map(|r| Box::new(r) as _));
        let err = drain(child.stderr.take().map(|r| Box::new(r) as _));
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > RUN_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the app ran past {RUN_LIMIT:?} on {}: {args:?}\nstderr:\n{}",
                    self.backend,
                    err.join().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (
            status.code().unwrap_or(-1),
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        )
    }
}

fn read_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgba, "{}", path.display());
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// What the engine itself generates for `prompt` with `params`, on `ctx`.
fn engine_reply(ctx: &pagellm::GpuContext, prompt: &str, params: SamplingParams) -> String {
    let shared = pagellm::GpuContext::from_existing(
        ctx.adapter.clone(),
        ctx.device.clone(),
        ctx.queue.clone(),
    );
    let mut engine = Engine::with_context(
        Arc::new(shared),
        shipped_model(),
        EngineConfig::default(),
        |_, _| {},
    )
    .unwrap();
    let h = engine
        .add_request(Prompt::Text(prompt.into()), params)
        .unwrap();
    engine.run_to_completion().unwrap();
    h.wait().unwrap().outputs[0].text.clone()
}

fn rect_px(v: &serde_json::Value) -> [u32; 4] {
    let f = |i: usize| v[i].as_f64().unwrap().round().max(0.0) as u32;
    [f(0), f(1), f(2), f(3)]
}

fn chat_window_streams_two_conversations(app: &App) {
    let (ctx, backend) = (app.ctx, app.backend);
    let dir = &app.scratch;
    let shot = dir.join("chat.png");
    let (width, height) = (WIDTH.to_string(), HEIGHT.to_string());
    let (tokens, stop) = (TOKENS.to_string(), STOP_AFTER.to_string());
    let model = shipped_model();
    let (code, stdout, stderr) = app.run(&[
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        PROMPTS[0],
        "--prompt",
        PROMPTS[1],
        "--temperature",
        "0",
        "--exit-after",
        &tokens,
        "--stop-after",
        &stop,
        "--width",
        &width,
        "--height",
        &height,
        "--screenshot",
        shot.to_str().unwrap(),
        "--timeout-s",
        "240",
    ]);
    assert_eq!(
        code, 0,
        "the app failed on {backend}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let desc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chat.json")).unwrap()).unwrap();
    let ppp = desc["pixels_per_point"].as_f64().unwrap();
    assert_eq!(
        desc["adapter"].as_str().unwrap(),
        ctx.describe(),
        "the window ran on another adapter"
    );

    // The right size, and not blank.
    let (w, h, after) = read_png(&shot);
    let (bw, bh, before) = read_png(&dir.join("chat.before.png"));
    let want = (
        (f64::from(WIDTH) * ppp).round() as u32,
        (f64::from(HEIGHT) * ppp).round() as u32,
    );
    assert_eq!((w, h), want, "screenshot size");
    assert_eq!((bw, bh), want, "screenshot before generation");
    let px = |img: &[u8], x: u32, y: u32| -> [u8; 4] {
        let i = ((y * w + x) * 4) as usize;
        [img[i], img[i + 1], img[i + 2], img[i + 3]]
    };
    let mut colors = std::collections::HashSet::new();
    for y in (0..h).step_by(3) {
        for x in (0..w).step_by(3) {
            colors.insert(px(&after, x, y));
        }
    }
    assert!(colors.len() > 20, "a blank window: {} colors", colors.len());

    let convs = desc["conversations"].as_array().unwrap();
    assert_eq!(convs.len(), 2);
    for (k, c) in convs.iter().enumerate() {
        // The reply is drawn inside its conversation's transcript, and where it is drawn the
        // window changed: text appeared on what was empty background before generation.
        let [x0, y0, x1, y1] = rect_px(&c["reply_px"]);
        let [tx0, ty0, tx1, ty1] = rect_px(&c["transcript_px"]);
        assert!(
            x1 > x0 && y1 > y0 && x0 + 1 >= tx0 && y0 + 1 >= ty0 && x1 <= tx1 + 1 && y1 <= ty1 + 1,
            "conversation {k}: the reply at {:?} is not inside its transcript {:?}",
            [x0, y0, x1, y1],
            [tx0, ty0, tx1, ty1]
        );
        assert!(x1 <= w && y1 <= h);
        let area = (x1 - x0) * (y1 - y0);
        let changed = (y0..y1)
            .flat_map(|y| (x0..x1).map(move |x| (x, y)))
            .filter(|&(x, y)| {
                let (a, b) = (px(&after, x, y), px(&before, x, y));
                (0..3).any(|i| a[i].abs_diff(b[i]) > 40)
            })
            .count() as u32;
        assert!(
            changed * 20 > area && changed > 50,
            "conversation {k}: only {changed} of {area} pixels changed where the reply is drawn"
        );
    }

    // What the widgets show is what the engine generates: the first reply whole, the
    // stopped one (which the script let run to the end of the context, ignoring EOS, so
    // that it was still running when Stop was pressed) as many tokens as it got.
    let greedy = SamplingParams {
        temperature: 0.0,
        max_tokens: TOKENS,
        ..SamplingParams::default()
    };
    let first = engine_reply(ctx, PROMPTS[0], greedy.clone());
    assert_eq!(convs[0]["reply"].as_str().unwrap(), first, "{stdout}");
    assert_eq!(convs[0]["tokens"].as_u64().unwrap(), TOKENS as u64);
    assert_eq!(convs[0]["note"].as_str().unwrap(), "finished: max tokens");
    let stopped = convs[1]["reply"].as_str().unwrap();
    let n = convs[1]["tokens"].as_u64().unwrap() as usize;
    assert_eq!(convs[1]["note"].as_str().unwrap(), "stopped", "{stdout}");
    assert!(
        (STOP_AFTER..400).contains(&n),
        "stopped after {n} tokens, asked after {STOP_AFTER}"
    );
    let second = engine_reply(
        ctx,
        PROMPTS[1],
        SamplingParams {
            max_tokens: n,
            ignore_eos: true,
            ..greedy
        },
    );
    assert_eq!(stopped, second, "the stopped reply");
}

fn bad_folders_and_requests_fail_with_their_reason(app: &App) {
    let dir = app.scratch.join("not-a-model");
    std::fs::create_dir_all(&dir).unwrap();
    let (code, stdout, stderr) = app.run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hello",
        "--exit-after",
        "4",
    ]);
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("loading the model failed") && stderr.contains(dir.to_str().unwrap()),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A reply that cannot fit the context is refused with the engine's reason, shown under
    // the conversation; the app goes on and the scripted run reports the failure.
    let (code, stdout, stderr) = app.run(&[
        "--model",
        shipped_model().to_str().unwrap(),
        "--prompt",
        "hello",
        "--exit-after",
        "100000",
    ]);
    assert_eq!(code, 1, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("refused: invalid request") && stdout.contains("more than the context"),
        "{stdout}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
