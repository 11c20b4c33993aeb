//! `pagellm serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of one engine.
//!
//! One thread owns the engine and steps it while work exists (`worker.rs`); handlers send it
//! add and abort commands and read each request's events from its own async-capable
//! channel, so the async runtime never waits on the GPU. Endpoints: `POST /v1/completions`
//! (`completions.rs`, streamed as Server-Sent Events on request), `POST
//! /v1/chat/completions` (`chat.rs`: the model's chat template, then the same path),
//! `GET /v1/models`,
//! `GET /health` (200 once the model is loaded, 503 while loading or after the engine
//! failed), `GET /metrics` (Prometheus text, `metrics.rs`). Errors are OpenAI-shaped
//! (`error.rs`). SIGINT or SIGTERM stops accepting, lets running requests finish for a grace
//! period, aborts the rest and returns.

mod chat;
mod completions;
mod error;
mod fields;
mod metrics;
mod state;
mod timing;
pub mod worker;

pub use error::ApiError;
pub use state::AppState;

use crate::engine::EngineConfig;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use subtle::ConstantTimeEq;
use worker::{Command, Health, Shared};

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
    pub max_body_bytes: usize,
    /// How long running requests may finish after SIGINT/SIGTERM before they are aborted.
    pub shutdown_grace: Duration,
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
}

/// Builds the router over `app`.
pub fn router(app: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(app.max_body_bytes))
        .with_state(app)
}

/// Runs the server until SIGINT or SIGTERM; `on_listening` gets the bound address (the
/// port may have been 0).
pub fn run(config: ServerConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<(), ServerError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("pagellm-http")
        .build()?;
    runtime.block_on(serve(config, on_listening))
}

async fn serve(
    config: ServerConfig,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    if config.api_key.as_deref() == Some("") {
        return Err(ServerError::Config(
            "--api-key is empty; give a key, or leave the option out to serve without one".into(),
        ));
    }
    let tokenizer = crate::model::open_tokenizer(&config.model_dir)?;
    let chat_template =
        crate::model::open_chat_template(&config.model_dir).map_err(|e| e.to_string());
    let shared = Arc::new(Shared::new());
    let (engine, thread) = worker::spawn(
        config.model_dir.clone(),
        config.engine.clone(),
        shared.clone(),
    );
    let app = Arc::new(AppState::new(
        engine.clone(),
        shared,
        tokenizer,
        chat_template,
        config.model_name(),
        config.api_key.clone(),
        config.max_body_bytes,
        config.max_queued_requests,
    ));
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    on_listening(listener.local_addr()?);
    let grace = config.shutdown_grace;
    let draining = app.clone();
    let stopper = engine.clone();
    let (signalled, mut deadline) = tokio::sync::watch::channel(false);
    // Per-token SSE writes are small: send each at once.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing running requests for up to {grace:?}");
        draining.draining.store(true, Ordering::Release);
        let _ = signalled.send(true);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let _ = stopper.send(Command::AbortAll);
        });
    });
    // The grace period bounds the shutdown: once it is over (and aborted streams have had
    // a moment to end), connections still open, say to a client that stopped reading,
    // are dropped.
    let bounded = async move {
        let _ = deadline.wait_for(|&s| s).await;
        tokio::time::sleep(grace + Duration::from_secs(5)).await;
    };
    tokio::select! {
        r = server => r?,
        _ = bounded => tracing::warn!("connections still open after the grace period; closing them"),
    }
    let _ = engine.send(Command::Stop);
    drop(engine);
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    Ok(())
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

/// `/v1/*` needs the API key when one is set, compared in constant time.
async fn authorize(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    req: Request,
    next: Next,
) -> Response {
    if let Some(key) = &app.api_key {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, key) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(key.trim())
            })
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn models(State(app): State<Arc<AppState>>) -> Response {
    let max_len = app.shared.max_model_len.lock().ok().and_then(|m| *m);
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
    match app.shared.health() {
        Health::Ready if !app.draining.load(Ordering::Acquire) => {
            (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response()
        }
        Health::Ready => ApiError::unavailable("shutting down").into_response(),
        Health::Loading => ApiError::unavailable("loading the model").into_response(),
        Health::Failed => {
            let why = app.shared.failure.lock().ok().and_then(|f| f.clone());
            ApiError::unavailable(why.unwrap_or_else(|| "the engine failed".into())).into_response()
        }
    }
}

async fn metrics_text(State(app): State<Arc<AppState>>) -> Response {
    let stats = app.shared.stats.lock().ok().and_then(|s| s.clone());
    if let Some(s) = stats {
        app.metrics.observe_engine(&s);
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

async fn not_found() -> Response {
    let mut e =
        ApiError::invalid("no such endpoint; see /v1/completions, /v1/models, /health, /metrics");
    e.status = StatusCode::NOT_FOUND;
    e.into_response()
}
