//! `pagellm serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of one engine.
//!
//! The engine runs on its own thread behind an [`EngineHandle`]; handlers submit requests
//! to it and read each request's events from its own async-capable stream, so the async
//! runtime never waits on the GPU. Endpoints: `POST /v1/completions`
//! (`completions.rs`, streamed as Server-Sent Events on request), `POST
//! /v1/chat/completions` (`chat.rs`: the model's chat template, then the same path; tool
//! definitions rendered into the prompt and tool calls parsed out of the reply, `tools.rs`),
//! `POST /tokenize` and `POST /detokenize` (`tokens.rs`), `GET /v1/models`, `GET /health`
//! (200 once the model is loaded, 503 while loading or after the engine failed), `GET
//! /metrics` (Prometheus text, `metrics.rs`). Errors are OpenAI-shaped
//! (`error.rs`), for refusals before routing too: `guard.rs` checks `Host`, `Origin`,
//! the content type and how the body arrives, and `listen.rs` bounds connections and how
//! long a request head may take. SIGINT or SIGTERM refuses new requests with 503 (`/health`
//! answers 503 too) while running ones finish for a grace period, then aborts the rest
//! (their non-streamed responses are 503s), stops accepting and returns.

mod admin;
mod chat;
mod completions;
mod error;
mod fields;
pub mod guard;
pub mod listen;
pub mod metrics;
mod rejections;
mod state;
mod structured;
mod timing;
mod tokens;
mod tools;

pub use error::ApiError;
pub use state::AppState;
pub use tools::{AutoToolChoice, ToolParser};

use crate::engine::EngineConfig;
use crate::handle::{EngineBuilder, EngineHandle, EngineState};
use crate::tokenizer::ChatTemplate;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use guard::GuardConfig;
pub use guard::{BodyLimits, BODY_RATE_GRACE};
use listen::ConnLimits;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Everything `pagellm serve` is told.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub model_dir: PathBuf,
    pub host: String,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on `/v1/*` when set.
    pub api_key: Option<String>,
    /// The name clients use in `model`; defaults to the model folder's name.
    pub served_model_name: Option<String>,
    pub engine: EngineConfig,
    /// Prompts admitted and not yet answered before new requests get 503.
    pub max_queued_requests: usize,
    /// Of those, most from one peer (IP address) before its new requests get 429.
    pub max_queued_per_peer: usize,
    pub max_body_bytes: usize,
    /// How long running requests may finish after SIGINT/SIGTERM before they are aborted.
    pub shutdown_grace: Duration,
    /// Host names served besides loopback ones (see `guard.rs`); empty: loopback names
    /// only when bound to a loopback address, any otherwise.
    pub allowed_hosts: Vec<String>,
    /// Origins whose pages may call the server, besides loopback pages; `*`: any.
    pub allowed_origins: Vec<String>,
    /// How a request body must arrive: its longest pause, its longest time in all, its
    /// slowest average pace.
    pub body: BodyLimits,
    pub connections: ConnLimits,
    /// A Jinja chat template file used instead of the model's own.
    pub chat_template: Option<PathBuf>,
    /// How `tool_choice: auto` is read (`--tool-call-parser`, `--enable-auto-tool-choice`).
    pub auto_tools: AutoToolChoice,
}

impl ServerConfig {
    pub fn model_name(&self) -> String {
        self.served_model_name.clone().unwrap_or_else(|| {
            self.model_dir
                .file_name()
                .map_or("model".into(), |n| n.to_string_lossy().into_owned())
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
}

/// Builds the router over `app`, behind `guard`'s checks and CORS.
pub fn router(app: Arc<AppState>, guard: Arc<GuardConfig>) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/admin/kv_budget", post(admin::kv_budget))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(app.max_body_bytes))
        .layer(middleware::from_fn_with_state(guard.clone(), guard::check))
        .layer(guard.cors())
        .with_state(app)
}

/// The model's chat template, or `--chat-template`'s (with the model's BOS and EOS
/// strings); a template file that does not compile stops the start, a model without a
/// template only refuses chat requests.
fn chat_template(
    config: &ServerConfig,
    tokenizer: &crate::tokenizer::Tokenizer,
) -> Result<Result<ChatTemplate, String>, ServerError> {
    let own = crate::model::open_chat_template(&config.model_dir);
    let Some(file) = &config.chat_template else {
        return Ok(own.map_err(|e| {
            tracing::warn!(
                "chat completions will be refused for {}: {e}",
                config.model_dir.display()
            );
            e.to_string()
        }));
    };
    let source = std::fs::read_to_string(file)
        .map_err(|e| ServerError::Config(format!("--chat-template {}: {e}", file.display())))?;
    let token = |id: Option<u32>| {
        id.and_then(|i| tokenizer.id_to_token(i))
            .unwrap_or_default()
    };
    let (bos, eos) = match &own {
        Ok(t) => {
            let (b, e) = t.special_tokens();
            (b.to_string(), e.to_string())
        }
        Err(_) => (
            token(tokenizer.bos_token_id()),
            token(tokenizer.eos_token_ids().first().copied()),
        ),
    };
    ChatTemplate::new(&source, &bos, &eos)
        .map(Ok)
        .map_err(|e| ServerError::Config(format!("--chat-template {}: {e}", file.display())))
}

/// What the server tells its caller once it takes connections.
#[derive(Clone, Copy, Debug)]
pub struct Listening {
    /// The bound address (the port chosen where the config asked for port 0).
    pub addr: SocketAddr,
    /// The model's weights on the device.
    pub weights: crate::model::gpu::WeightBytes,
}

/// Runs the server until SIGINT or SIGTERM; `on_listening` gets the bound address (the
/// port may have been 0).
pub fn run(config: ServerConfig, on_listening: impl FnOnce(Listening)) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagellm-http")
        .build()?;
    runtime.block_on(serve(config, on_listening))
}

async fn serve(
    config: ServerConfig,
    on_listening: impl FnOnce(Listening),
) -> Result<(), ServerError> {
    if config.api_key.as_deref() == Some("") {
        return Err(ServerError::Config(
            "--api-key is empty; give a key, or leave the option out to serve without one".into(),
        ));
    }
    let tokenizer = crate::model::open_tokenizer(&config.model_dir)?;
    let chat_template = chat_template(&config, &tokenizer)?;
    let engine = Arc::new(
        EngineBuilder::new(config.model_dir.clone())
            .config(config.engine.clone())
            .spawn()?,
    );
    let app = Arc::new(AppState::new(
        engine.clone(),
        tokenizer,
        chat_template,
        config.model_name(),
        config.api_key.clone(),
        config.max_body_bytes,
        config.max_queued_requests,
        config.max_queued_per_peer,
        config.auto_tools,
    ));
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let weights = engine
        .stats_now()
        .map(|s| s.engine.weights)
        .unwrap_or_default();
    on_listening(Listening {
        addr: listener.local_addr()?,
        weights,
    });
    let guard = Arc::new(GuardConfig {
        allowed_hosts: GuardConfig::hosts_for(&config.host, &config.allowed_hosts),
        allowed_origins: config.allowed_origins.clone(),
        max_body_bytes: config.max_body_bytes,
        body: config.body,
        api_key: config.api_key.clone(),
        metrics: app.metrics.clone(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let router = router(app.clone(), guard);
    let accepting = tokio::spawn(listen::accept(
        listener,
        router,
        config.connections,
        app.metrics.clone(),
        stopped,
    ));
    shutdown_signal().await;
    drain(&app, &engine, config.shutdown_grace).await;
    let _ = stop.send(true);
    if let Ok(open) = accepting.await {
        // Aborted streams end at once; a client that stopped reading is not waited for
        // long.
        let closing = open.shutdown();
        if tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the grace period; closing them");
        }
    }
    drop(app);
    if let Ok(Some(report)) = tokio::task::spawn_blocking(move || engine.shutdown()).await {
        eprintln!("\n{report}");
    }
    Ok(())
}

/// The grace period of a shutdown: new requests get 503 (and `/health` says so) while the
/// admitted ones run, for at most `grace`; then the rest are aborted.
async fn drain(app: &AppState, engine: &EngineHandle, grace: Duration) {
    tracing::info!("shutting down: finishing running requests for up to {grace:?}");
    app.draining.store(true, Ordering::Release);
    engine.close();
    let start = tokio::time::Instant::now();
    while app.in_flight() > 0 && start.elapsed() < grace {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if app.in_flight() > 0 {
        engine.abort_all();
        // Let the aborted requests' responses go out before connections close.
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while app.in_flight() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// `/v1/*` needs the API key when one is set (see [`guard::key_matches`]).
async fn authorize(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if !guard::key_matches(app.api_key.as_deref(), &headers) {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

async fn models(State(app): State<Arc<AppState>>) -> Response {
    let max_len = app.max_model_len();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "pagellm",
            "max_model_len": max_len,
        }],
    }))
    .into_response()
}

async fn health(State(app): State<Arc<AppState>>) -> Response {
    match app.engine.state() {
        EngineState::Ready if !app.draining.load(Ordering::Acquire) => {
            (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
        }
        EngineState::Ready => ApiError::unavailable("shutting down").into_response(),
        EngineState::Loading { .. } => ApiError::unavailable("loading the model").into_response(),
        EngineState::Failed(why) => ApiError::unavailable(why).into_response(),
        EngineState::Stopped => ApiError::unavailable("the engine has stopped").into_response(),
    }
}

async fn metrics_text(State(app): State<Arc<AppState>>) -> Response {
    if let Some(s) = app.engine.stats() {
        app.metrics.observe_engine(&s.engine);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    let mut e = ApiError::invalid(format!(
        "{} is not allowed on {}",
        req.method(),
        req.uri().path()
    ));
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e.into_response()
}

async fn not_found() -> Response {
    let mut e =
        ApiError::invalid("no such endpoint; see /v1/completions, /v1/models, /health, /metrics");
    e.status = StatusCode::NOT_FOUND;
    e.into_response()
}
