//! `POST /v1/chat/completions`: `messages` rendered with the model's own chat template
//! (`tokenizer/chat_template.rs`), then generated like a completion of one prompt. OpenAI's
//! fields (`max_tokens` or `max_completion_tokens`, `temperature`, `top_p`, `n`, `stop`,
//! `seed`, `logprobs` with `top_logprobs`, the penalties, `stream`, `stream_options`) and
//! vLLM's (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
//! `add_generation_prompt`). Streaming sends the assistant role in each choice's first
//! chunk, then content deltas.

use super::completions::{
    now_secs, stream_response, whole_response, Api, Ctx, StopInput, StreamOptions,
};
use super::error::ApiError;
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

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<usize>,
    pub stop: Option<StopInput>,
    pub seed: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
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
                Ok(ChatMessage {
                    role: m.role.clone(),
                    content,
                })
            })
            .collect()
    }

    fn sampling_params(&self) -> Result<SamplingParams, ApiError> {
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(format!(
                    "top_k must be -1 (off) or positive, got {k}"
                ))
                .with_param("top_k"))
            }
        };
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, Some(_)) => {
                return Err(ApiError::invalid("top_logprobs needs logprobs: true")
                    .with_param("top_logprobs"))
            }
            (false, None) => None,
        };
        Ok(SamplingParams {
            n: self.n.unwrap_or(1),
            temperature: self.temperature.unwrap_or(1.0),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            seed: self.seed,
            // Without a limit a reply may use the rest of the context (set by the handler
            // once the prompt's length is known).
            max_tokens: self.max_completion_tokens.or(self.max_tokens).unwrap_or(0),
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(v)) => v.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            ..SamplingParams::default()
        })
    }
}

pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = app.parse_body(body)?;
    app.check_model(req.model.as_deref())?;
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
    if req.stream.unwrap_or(false) {
        let usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(stream_response(ctx, vec![handle], usage, guard).into_response())
    } else {
        whole_response(ctx, vec![handle], guard).await
    }
}
