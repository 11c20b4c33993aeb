//! `POST /v1/completions`: the OpenAI completions API (with vLLM's extensions: `top_k`,
//! `min_p`, `repetition_penalty`, `ignore_eos`, `use_beam_search`, `stop_token_ids`,
//! `length_penalty`), answered whole or streamed as Server-Sent Events.
//!
//! Each prompt of the request becomes one engine request with `n` samples; choice `i * n +
//! j` is sample `j` of prompt `i`. Dropping a request's event receiver aborts it in the
//! engine, so a client that disconnects (the response body or the handler future is
//! dropped) frees its blocks at the next engine step.

use super::error::ApiError;
use super::fields::Common;
use super::listen::Peer;
use super::state::{AppState, InFlight};
use super::timing::Timing;
use super::tools::{self, ToolMode, ToolStream};
use crate::engine::{FinishReason, Prompt, RequestEvent, RequestOutput, TokenLogprob};
use crate::sampling::SamplingParams;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// The request body: the shared fields, and the completions API's own.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: PromptInput,
    pub max_tokens: Option<usize>,
    pub logprobs: Option<usize>,
    pub echo: Option<bool>,
    pub use_beam_search: Option<bool>,
    pub best_of: Option<usize>,
    pub length_penalty: Option<f32>,
}

impl CompletionRequest {
    pub fn prompts(&self) -> Result<Vec<Prompt>, ApiError> {
        let v: Vec<Prompt> = match &self.prompt {
            PromptInput::Text(t) => vec![Prompt::Text(t.clone())],
            PromptInput::Texts(ts) => ts.iter().cloned().map(Prompt::Text).collect(),
            PromptInput::Tokens(ids) => vec![Prompt::Tokens(ids.clone())],
            PromptInput::TokenLists(ls) => ls.iter().cloned().map(Prompt::Tokens).collect(),
        };
        if v.is_empty() {
            return Err(ApiError::invalid("`prompt` holds no prompt").with_param("prompt"));
        }
        Ok(v)
    }

    /// OpenAI's and vLLM's defaults where the request is silent.
    pub fn sampling_params(&self) -> Result<SamplingParams, ApiError> {
        let n = self.common.n.unwrap_or(1);
        let beam = self.use_beam_search.unwrap_or(false);
        if let Some(b) = self.best_of {
            if b < n {
                return Err(
                    ApiError::invalid(format!("best_of ({b}) must be at least n ({n})"))
                        .with_param("best_of"),
                );
            }
            if !beam && b != n {
                return Err(ApiError::invalid(
                    "best_of other than n is only supported with use_beam_search",
                )
                .with_param("best_of"));
            }
        }
        let temperature = if beam { 0.0 } else { 1.0 };
        let mut p =
            self.common
                .params(self.max_tokens.unwrap_or(16), self.logprobs, temperature)?;
        p.beam_width = beam.then(|| self.best_of.unwrap_or(n));
        p.length_penalty = self.length_penalty.unwrap_or(1.0);
        Ok(p)
    }
}

pub async fn completions(
    State(app): State<Arc<AppState>>,
    peer: Option<Extension<Peer>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = app.parse_body(body)?;
    app.check_model(req.common.model.as_deref())?;
    let prompts = req.prompts()?;
    let params = req.sampling_params()?;
    let echo = req.echo.unwrap_or(false);
    if echo && params.beam_width.is_some() {
        return Err(ApiError::invalid("echo is not supported with beam search").with_param("echo"));
    }
    let guard = app.admit(prompts.len(), peer.map(|Extension(Peer(ip))| ip))?;
    // Echo returns each prompt as given (token-id prompts decoded).
    let echoes: Vec<String> = prompts
        .iter()
        .map(|p| match (echo, p) {
            (false, _) => String::new(),
            (true, Prompt::Text(t)) => t.clone(),
            (true, Prompt::Tokens(ids)) => app.decode(ids),
        })
        .collect();
    let mut handles = Vec::with_capacity(prompts.len());
    for p in prompts {
        let ids = app.tokenize(p).await?;
        handles.push(app.submit(req.common.request(ids, params.clone())?).await?);
    }
    let ctx = Ctx {
        api: Api::Completions,
        app: app.clone(),
        id: format!("cmpl-{}", app.next_id()),
        created: now_secs(),
        n: params.n,
        echoes,
        logprobs: params.logprobs.is_some(),
        tools: None,
    };
    if req.common.streamed() {
        let usage = req.common.include_usage();
        Ok(stream_response(ctx, handles, usage, guard).into_response())
    } else {
        whole_response(ctx, handles, guard).await
    }
}

/// Which API the response speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    Completions,
    Chat,
}

/// What building the response needs besides the events.
pub(super) struct Ctx {
    pub api: Api,
    pub app: Arc<AppState>,
    pub id: String,
    pub created: u64,
    pub n: usize,
    /// Per prompt: the text `echo` puts before each of its choices (empty without echo).
    pub echoes: Vec<String>,
    pub logprobs: bool,
    /// Chat: how the output is read as tool calls (`None`: plain text).
    pub tools: Option<ToolMode>,
}

impl Ctx {
    fn finish_reason(r: FinishReason) -> &'static str {
        match r {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }

    /// The legacy completions `logprobs` object for `lps`, offsets counted from `offset`.
    fn logprobs_json(&self, lps: &[TokenLogprob], mut offset: usize) -> Value {
        let tok = |id: u32| self.app.token_text(id);
        let mut tokens = Vec::with_capacity(lps.len());
        let mut offsets = Vec::with_capacity(lps.len());
        for l in lps {
            let t = tok(l.token_id);
            offsets.push(offset);
            offset += t.len();
            tokens.push(t);
        }
        json!({
            "tokens": tokens,
            "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
            "top_logprobs": lps.iter().map(|l| {
                l.top.iter().map(|&(id, lp)| (tok(id), json!(lp))).collect::<serde_json::Map<_, _>>()
            }).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    }

    /// Logprobs of `lps` in this API's shape.
    fn lp_json(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        match self.api {
            Api::Completions => self.logprobs_json(lps, offset),
            Api::Chat => {
                let entry = |id: u32, lp: f64| {
                    let t = self.app.token_text(id);
                    json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
                };
                json!({"content": lps.iter().map(|l| {
                    let mut e = entry(l.token_id, l.logprob);
                    e["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                    e
                }).collect::<Vec<_>>()})
            }
        }
    }

    /// A streamed piece of choice `c`.
    fn piece(&self, c: usize, text: &str, logprobs: Value) -> Value {
        match self.api {
            Api::Completions => {
                json!({"index": c, "text": text, "logprobs": logprobs, "finish_reason": null})
            }
            Api::Chat => json!({
                "index": c, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null,
            }),
        }
    }

    /// The last streamed chunk of choice `c` (carrying the whole text for beam search).
    fn last_piece(&self, c: usize, text: &str, reason: &str) -> Value {
        match self.api {
            Api::Completions => {
                json!({"index": c, "text": text, "logprobs": null, "finish_reason": reason})
            }
            Api::Chat => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": c, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
        }
    }

    /// Choice `c` of a whole (non-streamed) response.
    fn whole_choice(&self, c: usize, text: String, logprobs: Value, reason: &'static str) -> Value {
        match self.api {
            Api::Completions => {
                json!({"index": c, "text": text, "logprobs": logprobs, "finish_reason": reason})
            }
            Api::Chat => {
                let (message, reason) = self.chat_message(text, reason);
                json!({
                    "index": c,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
        }
    }

    /// A chat choice's message and finish reason: the text, or the calls read from it.
    fn chat_message(&self, text: String, reason: &'static str) -> (Value, &'static str) {
        let Some(mode) = &self.tools else {
            return (json!({"role": "assistant", "content": text}), reason);
        };
        let reply = mode.reply(&text);
        let mut message = json!({"role": "assistant", "content": reply.content});
        let had_calls = !reply.calls.is_empty();
        if had_calls {
            message["tool_calls"] = tools::calls_json(mode, &reply.calls);
        }
        (message, mode.finish_reason(had_calls, reason))
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        self.envelope(choices, true)
    }

    fn envelope(&self, choices: Vec<Value>, streamed: bool) -> Value {
        let object = match (self.api, streamed) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Chat, false) => "chat.completion",
        };
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.app.model_name,
            "choices": choices,
        })
    }
}

pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

/// Why a request was aborted before it finished, when a shutdown's grace period ran out.
const SHUT_DOWN: &str =
    "the server shut down before the request finished; retry on another server or later";

/// Waits for every prompt's final output, then answers in one JSON body.
pub(super) async fn whole_response(
    ctx: Ctx,
    handles: Vec<crate::handle::RequestStream>,
    _guard: InFlight,
) -> Result<Response, ApiError> {
    // All prompts at once, so that each one's latencies are its own.
    let mut timings: Vec<Timing> = handles
        .iter()
        .map(|_| Timing::start(&ctx.app.metrics))
        .collect();
    let mut slots: Vec<Option<RequestOutput>> = handles.iter().map(|_| None).collect();
    let mut events = merged(handles);
    while let Some((pi, ev)) = events.next().await {
        match ev {
            RequestEvent::Token { index, .. } => timings[pi].token(index),
            RequestEvent::Finished(out) => {
                timings[pi].finish(&out);
                slots[pi] = Some(out);
            }
            RequestEvent::Failed(msg) => return Err(failure(msg)),
        }
    }
    let outputs: Vec<RequestOutput> = slots
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| ApiError::internal("the engine stopped before the request finished"))?;
    // Only a shutdown aborts a request whose client is still waiting for it.
    let aborted = outputs
        .iter()
        .flat_map(|o| &o.outputs)
        .any(|o| o.finish_reason == FinishReason::Abort);
    if aborted {
        return Err(ApiError::unavailable(SHUT_DOWN));
    }
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (pi, out) in outputs.iter().enumerate() {
        prompt_tokens += out.prompt_token_ids.len();
        let prefix = &ctx.echoes[pi];
        for o in &out.outputs {
            completion_tokens += o.token_ids.len();
            let logprobs = if ctx.logprobs {
                ctx.lp_json(&o.logprobs, prefix.len())
            } else {
                Value::Null
            };
            choices.push(ctx.whole_choice(
                pi * ctx.n + o.index,
                format!("{prefix}{}", o.text),
                logprobs,
                Ctx::finish_reason(o.finish_reason),
            ));
        }
    }
    let mut body = ctx.envelope(choices, false);
    body["usage"] = usage(prompt_tokens, completion_tokens);
    Ok(axum::Json(body).into_response())
}

type Events = stream::SelectAll<stream::BoxStream<'static, (usize, RequestEvent)>>;

/// Every prompt's events in one stream, each tagged with its prompt's index.
fn merged(handles: Vec<crate::handle::RequestStream>) -> Events {
    stream::select_all(
        handles
            .into_iter()
            .enumerate()
            .map(|(pi, h)| h.into_stream().map(move |ev| (pi, ev)).boxed()),
    )
}

/// A request the engine accepted but could not complete.
fn failure(msg: String) -> ApiError {
    if msg.starts_with("the engine step failed") {
        ApiError::internal(msg)
    } else {
        ApiError::invalid(msg)
    }
}

/// State of a streamed response.
struct Streamed {
    ctx: Ctx,
    events: Events,
    timings: Vec<Timing>,
    /// Per choice: bytes of text sent so far (for logprob offsets).
    sent: Vec<usize>,
    /// Chat with tools, per choice: the reading of its output as calls.
    tool_streams: Vec<Option<ToolStream>>,
    /// Per choice: logprobs of tokens whose text a tool stream holds back, sent with the
    /// next delta.
    held_logprobs: Vec<Vec<TokenLogprob>>,
    open: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    include_usage: bool,
    done: bool,
    /// Whether the shutdown's error event was sent.
    shutdown_told: bool,
    _guard: InFlight,
}

pub(super) fn stream_response(
    ctx: Ctx,
    handles: Vec<crate::handle::RequestStream>,
    include_usage: bool,
    guard: InFlight,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let open = handles.len();
    let choices = open * ctx.n;
    let timings = (0..open).map(|_| Timing::start(&ctx.app.metrics)).collect();
    let events = stream::select_all(
        handles
            .into_iter()
            .enumerate()
            .map(|(pi, h)| h.into_stream().map(move |ev| (pi, ev)).boxed()),
    );
    let tool_streams = (0..choices)
        .map(|_| ctx.tools.clone().map(ToolStream::new))
        .collect();
    let state = Streamed {
        ctx,
        events,
        timings,
        sent: vec![0; choices],
        tool_streams,
        held_logprobs: vec![Vec::new(); choices],
        open,
        prompt_tokens: 0,
        completion_tokens: 0,
        include_usage,
        done: false,
        shutdown_told: false,
        _guard: guard,
    };
    let body = stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let events = next_events(&mut st).await;
        Some((stream::iter(events.into_iter().map(Ok)), st))
    })
    .flatten();
    Sse::new(body).keep_alive(KeepAlive::default())
}

impl Streamed {
    /// What goes before choice `c`'s first token: the echoed prompt (completions) or the
    /// assistant role (chat).
    fn opening(&mut self, pi: usize, c: usize) -> Vec<Value> {
        match self.ctx.api {
            Api::Completions => {
                let echo = self.ctx.echoes[pi].clone();
                if echo.is_empty() {
                    return Vec::new();
                }
                self.sent[c] += echo.len();
                vec![self.ctx.chunk(vec![self.ctx.piece(c, &echo, Value::Null)])]
            }
            Api::Chat => vec![self.ctx.chunk(vec![json!({
                "index": c,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            })])],
        }
    }
}

impl Streamed {
    /// Chat with tools: the chunks a token of choice `c` sends (none while its text is
    /// held as a possible call).
    fn tool_token(&mut self, c: usize, text: &str, logprob: Option<TokenLogprob>) -> Vec<Value> {
        if let (Some(l), true) = (logprob, self.ctx.logprobs) {
            self.held_logprobs[c].push(l);
        }
        let deltas = match &mut self.tool_streams[c] {
            Some(ts) => ts.push(text),
            None => Vec::new(),
        };
        self.tool_chunks(c, deltas)
    }

    /// Chat with tools: the chunks that end choice `c` (`text` is the whole output when
    /// nothing was streamed) and its finish reason.
    fn tool_finish(
        &mut self,
        c: usize,
        text: &str,
        reason: &'static str,
    ) -> (Vec<Value>, &'static str) {
        let Some(ts) = &mut self.tool_streams[c] else {
            return (Vec::new(), reason);
        };
        let mut deltas = ts.push(text);
        let (end, had_calls) = ts.finish();
        let reason = ts.mode().finish_reason(had_calls, reason);
        deltas.extend(end);
        (self.tool_chunks(c, deltas), reason)
    }

    /// One chunk per delta; held logprobs go with the first.
    fn tool_chunks(&mut self, c: usize, deltas: Vec<Value>) -> Vec<Value> {
        deltas
            .into_iter()
            .map(|delta| {
                let held = std::mem::take(&mut self.held_logprobs[c]);
                let logprobs = if held.is_empty() {
                    Value::Null
                } else {
                    self.ctx.lp_json(&held, 0)
                };
                self.ctx.chunk(vec![json!({
                    "index": c, "delta": delta, "logprobs": logprobs, "finish_reason": null,
                })])
            })
            .collect()
    }
}

/// The SSE events for the next engine event (several at the end of a prompt).
async fn next_events(st: &mut Streamed) -> Vec<Event> {
    let data = |v: Value| Event::default().data(v.to_string());
    let Some((pi, ev)) = st.events.next().await else {
        // Every prompt has finished, or the engine went away.
        st.done = true;
        let mut out = Vec::new();
        if st.open > 0 {
            let e = ApiError::internal("the engine stopped before the request finished");
            out.push(data(e.body()));
        }
        if st.include_usage {
            let mut u = st.ctx.chunk(Vec::new());
            u["usage"] = usage(st.prompt_tokens, st.completion_tokens);
            out.push(data(u));
        }
        out.push(Event::default().data("[DONE]"));
        return out;
    };
    let n = st.ctx.n;
    match ev {
        RequestEvent::Token {
            index,
            text,
            logprob,
            ..
        } => {
            st.timings[pi].token(index);
            let c = pi * n + index;
            let mut out = Vec::new();
            let first = st.timings[pi].tokens_of(index) == 1;
            if first {
                out.extend(st.opening(pi, c).into_iter().map(data));
            }
            if st.tool_streams[c].is_some() {
                out.extend(st.tool_token(c, &text, logprob).into_iter().map(data));
                return out;
            }
            let logprobs = match (&logprob, st.ctx.logprobs) {
                (Some(l), true) => st.ctx.lp_json(std::slice::from_ref(l), st.sent[c]),
                _ => Value::Null,
            };
            st.sent[c] += text.len();
            out.push(data(st.ctx.chunk(vec![st.ctx.piece(c, &text, logprobs)])));
            out
        }
        RequestEvent::Finished(output) => finished(st, pi, &output),
        RequestEvent::Failed(msg) => {
            st.open -= 1;
            vec![data(failure(msg).body())]
        }
    }
}

/// The SSE events that end prompt `pi`: each choice's last chunk (a beam's whole text).
fn finished(st: &mut Streamed, pi: usize, output: &RequestOutput) -> Vec<Event> {
    let data = |v: Value| Event::default().data(v.to_string());
    let n = st.ctx.n;
    st.timings[pi].finish(output);
    st.open -= 1;
    st.prompt_tokens += output.prompt_token_ids.len();
    let beams = st.timings[pi].streamed() == 0;
    let mut out = Vec::new();
    for o in &output.outputs {
        st.completion_tokens += o.token_ids.len();
        let c = pi * n + o.index;
        // Beam search streams nothing until it ends: its whole text goes here.
        let mut text = if beams {
            out.extend(st.opening(pi, c).into_iter().map(data));
            o.text.clone()
        } else {
            String::new()
        };
        let mut reason = Ctx::finish_reason(o.finish_reason);
        if st.tool_streams[c].is_some() {
            let (chunks, r) = st.tool_finish(c, &text, reason);
            out.extend(chunks.into_iter().map(data));
            (text, reason) = (String::new(), r);
        }
        out.push(data(
            st.ctx.chunk(vec![st.ctx.last_piece(c, &text, reason)]),
        ));
    }
    // Aborted by a shutdown: say so as an error too, for clients that only watch
    // for errors (once per response).
    let aborted = output
        .outputs
        .iter()
        .any(|o| o.finish_reason == FinishReason::Abort);
    if aborted && !st.shutdown_told && st.ctx.app.draining.load(Ordering::Acquire) {
        st.shutdown_told = true;
        out.push(data(ApiError::unavailable(SHUT_DOWN).body()));
    }
    out
}
