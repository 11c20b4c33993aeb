//! `POST /v1/chat/completions`: `messages` rendered with the model's own chat template
//! (`tokenizer/chat_template.rs`), then generated like a completion of one prompt. OpenAI's
//! fields (`max_tokens` or `max_completion_tokens`, `temperature`, `top_p`, `n`, `stop`,
//! `seed`, `logprobs` with `top_logprobs`, the penalties, `stream`, `stream_options`) and
//! vLLM's (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
//! `add_generation_prompt`). Streaming sends the assistant role in each choice's first
//! chunk, then content deltas.

use super::completions::{now_secs, stream_response, whole_response, Api, Ctx};
use super::error::ApiError;
use super::fields::Common;
use super::state::AppState;
use crate::engine::Prompt;
use crate::sampling::SamplingParams;
use crate::tokenizer::ChatMessage;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

/// Message content: a string, or OpenAI's list of parts (text parts are joined).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
}

/// The request body: the shared fields, and the chat API's own.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<Message>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    /// vLLM: open the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
}

impl ChatRequest {
    fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid("`messages` is empty").with_param("messages"));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let content = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut text = String::new();
                        for p in parts {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => text.push_str(t),
                                (kind, _) => {
                                    return Err(ApiError::invalid(format!(
                                        "message {i}: content parts of type `{kind}` are not supported (text only)"
                                    ))
                                    .with_param("messages"))
                                }
                            }
                        }
                        text
                    }
                };
                Ok(ChatMessage::new(&m.role, &content))
            })
            .collect()
    }

    /// The engine's parameters; without a token limit, 0 stands for "the rest of the
    /// context", which the handler sets once it knows the prompt's length.
    fn sampling_params(&self) -> Result<SamplingParams, ApiError> {
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, Some(_)) => {
                return Err(ApiError::invalid("top_logprobs needs logprobs: true")
                    .with_param("top_logprobs"))
            }
            (false, None) => None,
        };
        let max_tokens = self.max_completion_tokens.or(self.max_tokens).unwrap_or(0);
        self.common.params(max_tokens, logprobs, 1.0)
    }
}

pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = app.parse_body(body)?;
    app.check_model(req.common.model.as_deref())?;
    if let Err(why) = &app.chat_template {
        return Err(ApiError::invalid(why.clone()).with_param("messages"));
    }
    let messages = req.messages()?;
    let mut params = req.sampling_params()?;
    // Rendering and tokenizing run off the async threads.
    let agp = req.add_generation_prompt.unwrap_or(true);
    let worker = app.clone();
    let ids = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let template = worker
            .chat_template
            .as_ref()
            .map_err(|w| ApiError::invalid(w.clone()))?;
        let text = template
            .render(&messages, agp)
            .map_err(|e| ApiError::invalid(e.to_string()).with_param("messages"))?;
        worker
            .check_text_length(text.len())
            .map_err(|e| e.with_param("messages"))?;
        worker
            .tokenizer
            .encode_plain(&text)
            .map_err(|e| ApiError::invalid(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    if req.max_completion_tokens.or(req.max_tokens).is_none() {
        let context = app.shared.max_model_len.lock().ok().and_then(|m| *m);
        params.max_tokens = context.map_or(16, |c| c.saturating_sub(ids.len()).max(1));
    }
    let guard = app.admit(1)?;
    let handle = app.add_request(Prompt::Tokens(ids), params.clone()).await?;
    let ctx = Ctx {
        api: Api::Chat,
        app: app.clone(),
        id: format!("chatcmpl-{}", app.next_id()),
        created: now_secs(),
        n: params.n,
        echoes: vec![String::new()],
        logprobs: params.logprobs.is_some(),
    };
    if req.common.streamed() {
        let usage = req.common.include_usage();
        Ok(stream_response(ctx, vec![handle], usage, guard).into_response())
    } else {
        whole_response(ctx, vec![handle], guard).await
    }
}
