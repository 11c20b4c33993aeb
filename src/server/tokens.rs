//! `POST /tokenize` and `POST /detokenize` (vLLM's): what a prompt or a conversation costs
//! in tokens before it is sent, and the text of token ids.
//!
//! `/tokenize` takes `{"prompt": "...", "add_special_tokens": true}` or a chat request's
//! `messages` (with `add_generation_prompt`, `tools` and `chat_template_kwargs`, rendered
//! exactly as `/v1/chat/completions` renders them) and answers `{"count", "max_model_len",
//! "tokens"}`, with `"token_strs"` when `return_token_strs` is set. `/detokenize` takes
//! `{"tokens": [...]}` and answers `{"prompt"}`; an id outside the vocabulary is a 400.

use super::chat::{chat_messages, render_ids, Message};
use super::error::ApiError;
use super::state::AppState;
use super::tools::{self, Tool};
use crate::tokenizer::RenderOptions;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    /// Default: true for a prompt, false for messages (the template writes its own).
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    tools: Option<Vec<Tool>>,
    chat_template_kwargs: Option<Map<String, Value>>,
    return_token_strs: Option<bool>,
}

pub async fn tokenize(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = app.parse_body(body)?;
    app.check_model(req.model.as_deref())?;
    let ids = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => {
            let (worker, prompt) = (app.clone(), prompt.clone());
            let special = req.add_special_tokens.unwrap_or(true);
            tokio::task::spawn_blocking(move || prompt_ids(&worker, &prompt, special))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))??
        }
        (None, Some(messages)) => {
            if req.add_special_tokens == Some(true) {
                return Err(ApiError::invalid(
                    "add_special_tokens with messages would write a second BOS before the \
                     template's own; leave it out",
                )
                .with_param("add_special_tokens"));
            }
            // `tool_choice` does not change the prompt; the template sees the tools.
            let plan = tools::plan(
                req.tools.as_deref(),
                Some(&tools::ToolChoice::Mode("none".into())),
                None,
                app.auto_tools,
            )?;
            let options = RenderOptions {
                add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                tools: plan.template_tools,
                kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
            };
            render_ids(&app, chat_messages(messages)?, options).await?
        }
        _ => {
            return Err(
                ApiError::invalid("send exactly one of `prompt` and `messages`")
                    .with_param("prompt"),
            )
        }
    };
    let max_len = app.max_model_len();
    let mut body = json!({"count": ids.len(), "max_model_len": max_len, "tokens": ids});
    if req.return_token_strs.unwrap_or(false) {
        let strs: Vec<Value> = ids
            .iter()
            .map(|&id| json!(app.tokenizer.id_to_token(id)))
            .collect();
        body["token_strs"] = Value::Array(strs);
    }
    Ok(axum::Json(body).into_response())
}

fn prompt_ids(app: &AppState, prompt: &str, special: bool) -> Result<Vec<u32>, ApiError> {
    app.check_text_length(prompt.len())
        .map_err(|e| e.with_param("prompt"))?;
    let ids = if special {
        app.tokenizer.encode(prompt)
    } else {
        app.tokenizer.encode_plain(prompt)
    };
    ids.map_err(|e| ApiError::invalid(e.to_string()).with_param("prompt"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = app.parse_body(body)?;
    app.check_model(req.model.as_deref())?;
    let vocab = app.tokenizer.vocab_size();
    if let Some((i, id)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= vocab)
    {
        return Err(ApiError::invalid(format!(
            "tokens[{i}] is {id}, outside the vocabulary of {vocab} tokens"
        ))
        .with_param("tokens"));
    }
    let text = app
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid(e.to_string()).with_param("tokens"))?;
    Ok(axum::Json(json!({"prompt": text})).into_response())
}
