//! A desktop chat window that embeds pagellm on the window's own wgpu device.
//!
//! eframe opens the window and its device (with the limits and features pagellm asks for,
//! `GpuContext::device_descriptor`); the app hands that adapter, device and queue to
//! `GpuContext::from_existing`, so egui's renderer and the model share one device. The
//! engine runs on the library's `EngineHandle` (`worker.rs` adapts it to the UI); the UI
//! submits replies and drains each conversation's token stream every frame without waiting
//! (`app.rs`). Several conversations stream at once, batched by the engine; each has a Stop
//! button.
//!
//! Run: `cargo run --release --example chat` (add `-- --help` for the options). Without a
//! display, the scripted check runs under Xvfb:
//! `xvfb-run -a cargo run --release --example chat -- --prompt "A wise man" --exit-after 24 --screenshot chat.png`

mod app;
mod launch;
mod script;
mod worker;

fn main() -> std::process::ExitCode {
    let code = launch::main_with(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
