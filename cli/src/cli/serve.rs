//! `pagellm serve`: the OpenAI-compatible HTTP server (see `pagellm::server`).

use super::engine_args::EngineArgs;
use super::generate::default_model_dir;
use anyhow::{Context, Result};
use clap::Args;
use pagellm::server::listen::ConnLimits;
use pagellm::server::{self, AutoToolChoice, BodyLimits, ServerConfig, ToolParser};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Hugging Face model folder; defaults to the small model shipped in the repository.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on (loopback by default; 0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one (printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* requests.
    #[arg(long, env = "PAGELLM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients send (default: the model folder's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Prompts admitted and not yet answered before new requests get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_queued_requests: usize,
    /// Of those, most from one client address before its new requests get 429 with
    /// Retry-After (all programs on this machine are one address, 127.0.0.1).
    #[arg(long, default_value_t = 128)]
    max_queued_per_peer: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds running requests may take to finish after SIGINT/SIGTERM before they are
    /// aborted.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_secs: u64,
    /// Host names to serve (the request's `Host` header) besides loopback names, comma
    /// separated; `*` for any. By default a server on a loopback address serves only
    /// loopback names (against DNS rebinding) and one on another address serves any.
    #[arg(long, value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Web origins (`https://app.example`) whose pages may call the server, comma separated,
    /// besides pages on localhost; `*` for any. Requests carrying another `Origin` are refused.
    #[arg(long, value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Seconds a client may take to send a request's headers; also how long an idle
    /// keep-alive connection stays open.
    #[arg(long, default_value_t = 10.0)]
    header_timeout_secs: f64,
    /// Seconds a client may pause while sending a request body before it gets 408.
    #[arg(long, default_value_t = 30.0)]
    body_timeout_secs: f64,
    /// Seconds a client may take to send a whole request body before it gets 408 (the
    /// default fits the largest body, --max-body-bytes, at about 35 KB/s).
    #[arg(long, default_value_t = 120.0)]
    body_deadline_secs: f64,
    /// Fewest bytes a second a request body must average once its first 5 seconds have
    /// passed, or it gets 408 (a "slow POST" holding its connection); 0: no minimum.
    #[arg(long, default_value_t = 1024)]
    min_body_rate: u64,
    /// Most connections open at once. A client arriving at the limit takes the place of the
    /// connection that has waited longest for a request head; when every connection is in
    /// the middle of a request, it waits to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Most connections one client address may hold; past it, its own longest-waiting
    /// connection is closed to make room, or the new one gets 429 when all are busy.
    #[arg(long, default_value_t = 256)]
    max_connections_per_peer: usize,
    /// Seconds a response may be unable to write anything (its client stopped reading)
    /// before the connection is closed and the request aborted.
    #[arg(long, default_value_t = 30.0)]
    write_timeout_secs: f64,
    /// A Jinja chat template file to use instead of the model's own (the model's BOS and
    /// EOS strings are kept).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Let the model decide when to call tools (`tool_choice: auto`, the default when a
    /// request sends `tools`); needs --tool-call-parser.
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// How calls are read from what the model writes under `tool_choice: auto`: hermes
    /// (`<tool_call>` blocks: Hermes, Qwen2.5, Qwen3), llama3_json (Llama 3.1-3.3) or
    /// mistral (`[TOOL_CALLS]`).
    #[arg(long)]
    tool_call_parser: Option<ToolParser>,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.enable_auto_tool_choice && args.tool_call_parser.is_none() {
        anyhow::bail!(
            "--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or mistral) \
             to read the model's calls"
        );
    }
    let config = ServerConfig {
        model_dir: match args.model.clone() {
            Some(d) => d,
            None => default_model_dir()?,
        },
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        served_model_name: args.served_model_name.clone(),
        engine: args.engine.config(),
        max_queued_requests: args.max_queued_requests,
        max_queued_per_peer: args.max_queued_per_peer.max(1),
        max_body_bytes: args.max_body_bytes,
        shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        allowed_hosts: args.allowed_hosts.clone(),
        allowed_origins: args.allowed_origins.clone(),
        body: BodyLimits {
            idle: seconds("--body-timeout-secs", args.body_timeout_secs)?,
            deadline: seconds("--body-deadline-secs", args.body_deadline_secs)?,
            min_rate: args.min_body_rate,
        },
        connections: ConnLimits {
            header_timeout: seconds("--header-timeout-secs", args.header_timeout_secs)?,
            max_connections: args.max_connections.max(1),
            max_per_peer: args.max_connections_per_peer.max(1),
            write_timeout: seconds("--write-timeout-secs", args.write_timeout_secs)?,
        },
        chat_template: args.chat_template.clone(),
        auto_tools: AutoToolChoice {
            parser: args.tool_call_parser,
            enabled: args.enable_auto_tool_choice,
        },
    };
    let name = config.model_name();
    let dir = config.model_dir.clone();
    server::run(config, |on| {
        // Tests and scripts read this line for the port.
        eprintln!(
            "pagellm serve: model `{name}` from {} ({}), listening on http://{}",
            dir.display(),
            super::generate::describe_weights(&on.weights),
            on.addr
        );
    })
    .context("pagellm serve")
}

/// A positive, finite number of seconds.
fn seconds(flag: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("{flag} must be a positive number of seconds, not {s}"))
}
