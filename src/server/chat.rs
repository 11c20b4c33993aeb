//! `POST /v1/chat/completions`: `messages` rendered with the model's own chat template
//! (`tokenizer/chat_template.rs`), then generated like a completion of one prompt. OpenAI's
//! fields (`max_tokens` or `max_completion_tokens`, `temperature`, `top_p`, `n`, `stop`,
//! `seed`, `logprobs` with `top_logprobs`, the penalties, `stream`, `stream_options`) and
//! vLLM's (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`,
//! `add_generation_prompt`, `chat_template_kwargs`), and tools (`tools`, `tool_choice`,
//! `parallel_tool_calls`; see `tools.rs`). Streaming sends the assistant role in each
//! choice's first chunk, then content (or tool-call) deltas.

use super::completions::{now_secs, stream_response, whole_response, Api, Ctx};
use super::error::ApiError;
use super::fields::Common;
use super::listen::Peer;
use super::state::AppState;
use super::tools::{self, Tool, ToolChoice};
use crate::sampling::SamplingParams;
use crate::tokenizer::{ChatMessage, RenderOptions};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{Map, Value};
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
    /// An assistant turn's calls (OpenAI's shape, `arguments` a JSON string).
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
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
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// vLLM: extra template variables (Qwen3's `enable_thinking`, ...).
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// The request's messages as the template sees them; content parts other than text are a
/// 400.
pub(super) fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("`messages` is empty").with_param("messages"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => text_parts(i, parts)?,
            };
            Ok(ChatMessage {
                tool_calls: m.tool_calls.as_deref().map(tools::template_calls),
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                ..ChatMessage::new(&m.role, &content)
            })
        })
        .collect()
}

fn text_parts(i: usize, parts: &[Part]) -> Result<String, ApiError> {
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
    Ok(text)
}

/// The token ids of `messages` rendered with the chat template, off the async threads.
pub(super) async fn render_ids(
    app: &Arc<AppState>,
    messages: Vec<ChatMessage>,
    options: RenderOptions,
) -> Result<Vec<u32>, ApiError> {
    if let Err(why) = &app.chat_template {
        return Err(ApiError::invalid(why.clone()).with_param("messages"));
    }
    let worker = app.clone();
    tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        let template = worker
            .chat_template
            .as_ref()
            .map_err(|w| ApiError::invalid(w.clone()))?;
        let text = template
            .render_with(&messages, &options)
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
    .map_err(|e| ApiError::internal(e.to_string()))?
}

impl ChatRequest {
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
    peer: Option<Extension<Peer>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = app.parse_body(body)?;
    app.check_model(req.common.model.as_deref())?;
    let messages = chat_messages(&req.messages)?;
    let mut params = req.sampling_params()?;
    let plan = tools::plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        app.auto_tools,
    )?;
    if let Some(c) = plan.constraint {
        if params.structured_output.is_some() {
            return Err(ApiError::invalid(
                "tool_choice `required` or a named function constrains the output itself; \
                 send it without response_format, structured_outputs or guided_*",
            )
            .with_param("tool_choice"));
        }
        params.structured_output = Some(c);
    }
    let options = RenderOptions {
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        tools: plan.template_tools,
        kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
    };
    let ids = render_ids(&app, messages, options).await?;
    if req.max_completion_tokens.or(req.max_tokens).is_none() {
        let context = app.max_model_len();
        params.max_tokens = context.map_or(16, |c| c.saturating_sub(ids.len()).max(1));
    }
    let guard = app.admit(1, peer.map(|Extension(Peer(ip))| ip))?;
    let handle = app.submit(req.common.request(ids, params.clone())?).await?;
    let ctx = Ctx {
        api: Api::Chat,
        app: app.clone(),
        id: format!("chatcmpl-{}", app.next_id()),
        created: now_secs(),
        n: params.n,
        echoes: vec![String::new()],
        logprobs: params.logprobs.is_some(),
        tools: plan.mode,
    };
    if req.common.streamed() {
        let usage = req.common.include_usage();
        Ok(stream_response(ctx, vec![handle], usage, guard).into_response())
    } else {
        whole_response(ctx, vec![handle], guard).await
    }
}
