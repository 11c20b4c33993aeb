//! What every handler shares: the engine's handle (its state, statistics and requests), the
//! tokenizer (for logprob token strings and echo), the metrics, and the limits.

use super::error::ApiError;
use super::metrics::Metrics;
use crate::engine::{Prompt, Request};
use crate::handle::{EngineHandle, EngineState, RequestStream};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct AppState {
    pub engine: Arc<EngineHandle>,
    pub tokenizer: Tokenizer,
    /// The model's chat template, or why there is none.
    pub chat_template: Result<ChatTemplate, String>,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Most requests (prompts) admitted and not yet answered.
    pub max_queued: usize,
    /// Most of those one peer (IP address) may have.
    pub max_queued_per_peer: usize,
    /// How `tool_choice: auto` is read.
    pub auto_tools: super::tools::AutoToolChoice,
    in_flight: Arc<AtomicUsize>,
    /// Admitted requests per peer.
    per_peer: PeerCounts,
    pub draining: AtomicBool,
    ids: AtomicU64,
}

/// Admitted requests per peer.
type PeerCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// A slot among the admitted requests, released when the response is done (or dropped).
pub struct InFlight {
    count: Arc<AtomicUsize>,
    n: usize,
    /// The peer's count, when the peer is known.
    peer: Option<(IpAddr, PeerCounts)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::AcqRel);
        if let Some((peer, counts)) = self.peer.take() {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = counts.get_mut(&peer) {
                *c = c.saturating_sub(self.n);
                if *c == 0 {
                    counts.remove(&peer);
                }
            }
        }
    }
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: Arc<EngineHandle>,
        tokenizer: Tokenizer,
        chat_template: Result<ChatTemplate, String>,
        model_name: String,
        api_key: Option<String>,
        max_body_bytes: usize,
        max_queued: usize,
        max_queued_per_peer: usize,
        auto_tools: super::tools::AutoToolChoice,
    ) -> Self {
        AppState {
            engine,
            tokenizer,
            chat_template,
            metrics: Arc::new(Metrics::new()),
            model_name,
            api_key,
            max_body_bytes,
            max_queued,
            max_queued_per_peer,
            auto_tools,
            in_flight: Arc::new(AtomicUsize::new(0)),
            per_peer: Arc::default(),
            draining: AtomicBool::new(false),
            ids: AtomicU64::new(0),
        }
    }

    pub fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes `n` request slots for `peer`, or refuses with 503 when the queue is full, the
    /// model is not loaded, or the server is shutting down, and with 429 when the peer has
    /// its share of the queue.
    pub fn admit(&self, n: usize, peer: Option<IpAddr>) -> Result<InFlight, ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        match self.engine.state() {
            EngineState::Ready => {}
            EngineState::Loading { .. } => {
                return Err(ApiError::unavailable("the model is still loading"))
            }
            EngineState::Failed(why) => {
                return Err(ApiError::unavailable(format!(
                    "the engine is unusable: {why}"
                )));
            }
            EngineState::Stopped => return Err(ApiError::unavailable("the engine has stopped")),
        }
        if n > self.max_queued {
            return Err(ApiError::invalid(format!(
                "{n} prompts in one request exceed --max-queued-requests {}",
                self.max_queued
            ))
            .with_param("prompt"));
        }
        let before = self.in_flight.fetch_add(n, Ordering::AcqRel);
        let mut slot = InFlight {
            count: self.in_flight.clone(),
            n,
            peer: None,
        };
        if before + n > self.max_queued {
            return Err(ApiError::unavailable(format!(
                "{before} requests are queued, the limit is {} (--max-queued-requests); retry later",
                self.max_queued
            )));
        }
        if let Some(peer) = peer {
            let mut counts = self.per_peer.lock().unwrap_or_else(|e| e.into_inner());
            let mine = counts.get(&peer).copied().unwrap_or(0);
            if mine + n > self.max_queued_per_peer {
                self.metrics.cut(super::metrics::cut::PEER_QUEUE);
                let mut e = ApiError::unavailable(format!(
                    "{peer} has {mine} requests queued, the most one address may have is {} \
                     (--max-queued-per-peer); retry later",
                    self.max_queued_per_peer
                ));
                e.status = axum::http::StatusCode::TOO_MANY_REQUESTS;
                e.kind = "rate_limit_error";
                return Err(e);
            }
            *counts.entry(peer).or_default() += n;
            slot.peer = Some((peer, self.per_peer.clone()));
        }
        Ok(slot)
    }

    /// Parses a JSON body, mapping every failure to an OpenAI-style 4xx.
    pub fn parse_body<T: DeserializeOwned>(
        &self,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<T, ApiError> {
        let bytes = body.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(self.max_body_bytes)
            } else {
                ApiError::invalid(format!("reading the request body: {e}"))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}")))
    }

    /// A request naming a model must name this one.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model_name => Err(ApiError::model_not_found(m, &self.model_name)),
            _ => Ok(()),
        }
    }

    /// Submits a request to the engine, off the async threads: checking it may compile a
    /// constraint, which takes a while for a large schema.
    pub async fn submit(self: &Arc<Self>, request: Request) -> Result<RequestStream, ApiError> {
        let app = self.clone();
        let stream = tokio::task::spawn_blocking(move || app.engine.submit(request))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
        Ok(stream)
    }

    /// The context length requests are checked against, once the model is loaded.
    pub fn max_model_len(&self) -> Option<usize> {
        self.engine.info().map(|i| i.max_model_len)
    }

    /// Token ids of a prompt, tokenized off the async threads (and off the engine thread,
    /// which would otherwise stall every stream on a long prompt).
    pub async fn tokenize(self: &Arc<Self>, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
        match prompt {
            Prompt::Tokens(ids) => Ok(ids),
            Prompt::Text(text) => {
                self.check_text_length(text.len())?;
                let app = self.clone();
                tokio::task::spawn_blocking(move || app.tokenizer.encode(&text))
                    .await
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .map_err(|e| ApiError::invalid(e.to_string()).with_param("prompt"))
            }
        }
    }

    /// Refuses a prompt of `bytes` bytes that has more tokens than the context holds for
    /// certain, before spending time on tokenizing it (a 4 MiB prompt takes seconds).
    pub fn check_text_length(&self, bytes: usize) -> Result<(), ApiError> {
        let context = self.max_model_len();
        let (Some(context), Some(per_token)) = (context, self.tokenizer.max_bytes_per_token())
        else {
            return Ok(());
        };
        if bytes <= context.saturating_mul(per_token) {
            return Ok(());
        }
        Err(ApiError::invalid(format!(
            "the prompt is {bytes} bytes: at least {} tokens however it is tokenized (a token \
             of this model covers at most {per_token} bytes), more than the model's context \
             of {context} tokens",
            bytes.div_ceil(per_token)
        ))
        .with_param("prompt"))
    }

    /// The text of one token, as the logprobs of the completions API list it.
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer
            .decode(&[id], false)
            .unwrap_or_else(|_| format!("<{id}>"))
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }
}
