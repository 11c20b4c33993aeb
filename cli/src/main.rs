//! The `pagellm` command line.

// Every function fits on a screen (../clippy.toml sets the limit: 80 lines of code).
#![warn(clippy::too_many_lines)]

use anyhow::Result;
use clap::{Parser, Subcommand};
mod cli;

#[derive(Parser)]
#[command(
    name = "pagellm",
    version,
    about = "LLM inference with a paged KV cache on any GPU wgpu reaches"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every GPU adapter with its backend, type, driver and the limits that matter.
    Devices,
    /// Generate text with a model (by default the small one shipped in the repository).
    Generate(Box<cli::generate::GenerateArgs>),
    /// Serve a model over the OpenAI HTTP API (completions, streaming, metrics, health).
    Serve(Box<cli::serve::ServeArgs>),
    /// Score a text teacher-forced: perplexity, and with a saved baseline the KL divergence
    /// and top-1 agreement of a KV cache setting.
    Perplexity(Box<cli::perplexity::PerplexityArgs>),
}

fn main() -> Result<()> {
    quiet_device_select();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,wgpu_hal::gles::egl=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Devices => cli::devices::run(),
        Command::Generate(args) => cli::generate::run(*args),
        Command::Serve(args) => cli::serve::run(*args),
        Command::Perplexity(args) => cli::perplexity::run(*args),
    }
}

/// Mesa's Vulkan device-select layer asks the desktop's compositor which GPU it draws on.
/// Without a desktop session (no `XDG_RUNTIME_DIR`: a server, a container, SSH) there is
/// nothing to ask, and the attempt prints `error: XDG_RUNTIME_DIR is invalid or not set`
/// for every Vulkan instance, which reads as a failure of a command that works. The layer
/// is turned off then (its own switch, `NODEVICE_SELECT`), before any thread starts; a
/// value the user set is kept.
fn quiet_device_select() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
