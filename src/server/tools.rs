//! Tool calling for chat completions: OpenAI's `tools`, `tool_choice` and
//! `parallel_tool_calls`, turned into what the template is given, what the output is
//! constrained to, and how the output is read back as `tool_calls`.
//!
//! - `none`: the template still sees the tools (as vLLM does by default); the output is text.
//! - `required`: the output is constrained to a JSON array of `{"name", "parameters"}`
//!   objects, one per call, each valid for its function's schema (at most one with
//!   `parallel_tool_calls: false`); `finish_reason` is `tool_calls`.
//! - a named function: the output is constrained to that function's arguments; the reply
//!   is one call, streamed argument piece by argument piece.
//! - `auto` (needs `--enable-auto-tool-choice` and `--tool-call-parser`): the model writes
//!   freely and its text is read by the chosen [`ToolParser`]; text before the first call
//!   is the message content. Streaming sends content as it comes and holds back text from
//!   the point a call may begin, sending each call whole once the output ends.

use super::error::ApiError;
use crate::constrain::StructuredOutput;
use serde::Deserialize;
use serde_json::{json, Value};

/// How `auto` reads calls out of what a model writes (vLLM's `--tool-call-parser` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen2.5,
    /// Qwen3).
    Hermes,
    /// The output is one or more `{"name": ..., "parameters": {...}}` objects separated by
    /// `;`, optionally after `<|python_tag|>` (Llama 3.1-3.3).
    Llama3Json,
    /// `[TOOL_CALLS]` followed by a JSON array of `{"name", "arguments"}` objects, or by
    /// `name[ARGS]{...}` (Mistral).
    Mistral,
}

impl std::str::FromStr for ToolParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" => Ok(ToolParser::Hermes),
            "llama3_json" => Ok(ToolParser::Llama3Json),
            "mistral" => Ok(ToolParser::Mistral),
            other => Err(format!(
                "unknown tool-call parser `{other}`; choose hermes, llama3_json or mistral"
            )),
        }
    }
}

impl ToolParser {
    /// Text anywhere in the output that opens a call.
    fn marker(self) -> Option<&'static str> {
        match self {
            ToolParser::Hermes => Some("<tool_call>"),
            ToolParser::Llama3Json => None,
            ToolParser::Mistral => Some("[TOOL_CALLS]"),
        }
    }

    /// Text that opens a call when the output (after white space) begins with it. Mistral's
    /// `[TOOL_CALLS]` is a special token that decoding drops, so a bare array counts too.
    fn openings(self) -> &'static [&'static str] {
        match self {
            ToolParser::Hermes => &[],
            ToolParser::Llama3Json => &["{", "<|python_tag|>"],
            ToolParser::Mistral => &["[{"],
        }
    }
}

/// One entry of `tools`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Clone, Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode's name or `{"type": "function", "function": {"name": ...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(String),
    Named {
        #[serde(rename = "type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// What the server was told about `auto` at start.
#[derive(Clone, Copy, Debug, Default)]
pub struct AutoToolChoice {
    pub parser: Option<ToolParser>,
    pub enabled: bool,
}

/// What a request's tools mean for its output.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolMode {
    Required { parallel: bool },
    Named(String),
    Auto { parser: ToolParser, parallel: bool },
}

/// A request's tool settings, resolved.
#[derive(Debug, Default)]
pub struct ToolPlan {
    /// `None`: the reply is plain text.
    pub mode: Option<ToolMode>,
    /// What the template's `tools` is.
    pub template_tools: Option<Vec<Value>>,
    /// The constraint `required` and a named function put on the output.
    pub constraint: Option<StructuredOutput>,
}

fn invalid(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(msg).with_param(param)
}

/// Resolves `tools`, `tool_choice` and `parallel_tool_calls` (OpenAI's defaults: `auto`
/// with tools, `none` without; parallel calls allowed).
pub fn plan(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    auto: AutoToolChoice,
) -> Result<ToolPlan, ApiError> {
    let tools = tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        check_tool(i, t)?;
    }
    let parallel = parallel.unwrap_or(true);
    let template_tools = (!tools.is_empty()).then(|| {
        tools
            .iter()
            .map(|t| json!({"type": "function", "function": t.function}))
            .collect::<Vec<_>>()
    });
    let mode = match choice {
        None if tools.is_empty() => "none",
        None => "auto",
        Some(ToolChoice::Mode(m)) => m.as_str(),
        Some(ToolChoice::Named { kind, function }) => {
            let t = named_tool(tools, kind, &function.name)?;
            return Ok(ToolPlan {
                mode: Some(ToolMode::Named(function.name.clone())),
                template_tools,
                constraint: Some(StructuredOutput::JsonSchema(arguments_schema(&t.function))),
            });
        }
    };
    let mode = tool_mode(mode, !tools.is_empty(), parallel, auto)?;
    let constraint = match &mode {
        Some(ToolMode::Required { parallel }) => Some(required_schema(tools, *parallel)),
        _ => None,
    };
    Ok(ToolPlan {
        mode,
        template_tools,
        constraint,
    })
}

/// The tool a named `tool_choice` picks.
fn named_tool<'a>(tools: &'a [Tool], kind: &str, name: &str) -> Result<&'a Tool, ApiError> {
    if kind != "function" {
        return Err(invalid(
            format!("tool_choice has type `{kind}`; only `function` is supported"),
            "tool_choice",
        ));
    }
    tools
        .iter()
        .find(|t| t.function.name == name)
        .ok_or_else(|| {
            invalid(
                format!("tool_choice names `{name}`, which is not in `tools`"),
                "tool_choice",
            )
        })
}

/// The mode a `tool_choice` string asks for (`None`: no tool calls), where it can work.
fn tool_mode(
    mode: &str,
    has_tools: bool,
    parallel: bool,
    auto: AutoToolChoice,
) -> Result<Option<ToolMode>, ApiError> {
    Ok(match mode {
        "none" => None,
        _ if !has_tools => {
            return Err(invalid(
                format!("tool_choice `{mode}` needs `tools`"),
                "tool_choice",
            ))
        }
        "required" => Some(ToolMode::Required { parallel }),
        "auto" => match (auto.enabled, auto.parser) {
            (true, Some(parser)) => Some(ToolMode::Auto { parser, parallel }),
            _ => {
                return Err(invalid(
                    "tool_choice `auto` (the default when `tools` are given) needs the server \
                     started with --enable-auto-tool-choice and --tool-call-parser; or send \
                     tool_choice `required`, `none` or a named function",
                    "tool_choice",
                ))
            }
        },
        other => {
            return Err(invalid(
                format!("tool_choice must be none, auto, required or a function, not `{other}`"),
                "tool_choice",
            ))
        }
    })
}

fn check_tool(i: usize, t: &Tool) -> Result<(), ApiError> {
    if t.kind != "function" {
        return Err(invalid(
            format!(
                "tools[{i}] has type `{}`; only `function` is supported",
                t.kind
            ),
            "tools",
        ));
    }
    let name = &t.function.name;
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if !ok {
        return Err(invalid(
            format!(
                "tools[{i}] has the name `{name}`; names are 1-64 letters, digits, `_`, `-` or `.`"
            ),
            "tools",
        ));
    }
    match &t.function.parameters {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => Err(invalid(
            format!("tools[{i}] ({name}): `parameters` must be a JSON schema object"),
            "tools",
        )),
    }
}

/// A function's arguments: its schema, or any object when it declares none.
fn arguments_schema(f: &FunctionDef) -> Value {
    f.parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}))
}

/// `required`: a non-empty array of calls, each naming one of the tools with valid
/// arguments.
fn required_schema(tools: &[Tool], parallel: bool) -> StructuredOutput {
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": t.function.name},
                    "parameters": arguments_schema(&t.function),
                },
                "required": ["name", "parameters"],
                "additionalProperties": false,
            })
        })
        .collect();
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    StructuredOutput::JsonSchema(schema)
}

/// One call read from the output.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's shape).
    pub arguments: String,
}

/// An output read as a reply: the content before any call, and the calls.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

impl ToolMode {
    /// The reply a finished output `text` makes.
    pub fn reply(&self, text: &str) -> Reply {
        let plain = || Reply {
            content: Some(text.to_string()),
            calls: Vec::new(),
        };
        match self {
            ToolMode::Named(name) => Reply {
                content: None,
                calls: vec![Call {
                    name: name.clone(),
                    arguments: text.trim().to_string(),
                }],
            },
            ToolMode::Required { .. } => match required_calls(text) {
                Some(calls) => Reply {
                    content: None,
                    calls,
                },
                None => plain(),
            },
            ToolMode::Auto { parser, parallel } => match parse_calls(*parser, text) {
                Some((content, mut calls)) => {
                    if !parallel {
                        calls.truncate(1);
                    }
                    Reply {
                        content: (!content.trim().is_empty()).then_some(content),
                        calls,
                    }
                }
                None => plain(),
            },
        }
    }

    /// OpenAI's finish reason for a reply that ended for `engine` (`stop`, `length`, ...).
    pub fn finish_reason(&self, had_calls: bool, engine: &'static str) -> &'static str {
        match self {
            ToolMode::Named(_) => engine,
            _ if had_calls && engine == "stop" => "tool_calls",
            _ => engine,
        }
    }
}

/// A call object's name and arguments (under `arguments`, or Llama's `parameters`).
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        // Some models write the arguments as a JSON string already.
        Value::String(s) if serde_json::from_str::<Value>(&s).is_ok() => s,
        Value::Object(_) => args.to_string(),
        _ => return None,
    };
    Some(Call { name, arguments })
}

fn required_calls(text: &str) -> Option<Vec<Call>> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    v.as_array()?.iter().map(call_of).collect()
}

/// The content before the first call and the calls, or `None` when the output holds no
/// call or one that does not parse (then the whole output is content, as in vLLM).
pub fn parse_calls(parser: ToolParser, text: &str) -> Option<(String, Vec<Call>)> {
    match parser {
        ToolParser::Hermes => {
            let start = text.find("<tool_call>")?;
            let calls = text[start..]
                .split("<tool_call>")
                .skip(1)
                .map(|block| {
                    let inner = block.split("</tool_call>").next().unwrap_or(block);
                    call_of(&serde_json::from_str(inner.trim()).ok()?)
                })
                .collect::<Option<Vec<_>>>()?;
            Some((text[..start].to_string(), calls))
        }
        ToolParser::Llama3Json => {
            let body = text.trim_start();
            let body = body.strip_prefix("<|python_tag|>").unwrap_or(body);
            if !body.trim_start().starts_with('{') {
                return None;
            }
            Some((String::new(), json_sequence(body, ';')?))
        }
        ToolParser::Mistral => {
            let (content, rest) = match text.find("[TOOL_CALLS]") {
                Some(p) => (text[..p].to_string(), &text[p + "[TOOL_CALLS]".len()..]),
                None if text.trim_start().starts_with("[{") => (String::new(), text),
                None => return None,
            };
            let calls = if rest.trim_start().starts_with('[') {
                required_calls(rest)?
            } else {
                // Newer tokenizers: `name[ARGS]{...}`, calls separated by `[TOOL_CALLS]`.
                rest.split("[TOOL_CALLS]")
                    .map(|c| {
                        let (name, args) = c.split_once("[ARGS]")?;
                        let args: Value = serde_json::from_str(args.trim()).ok()?;
                        call_of(&json!({"name": name.trim(), "arguments": args}))
                    })
                    .collect::<Option<Vec<_>>>()?
            };
            Some((content, calls))
        }
    }
}

/// JSON objects one after another, separated by white space and optional `sep`.
fn json_sequence(text: &str, sep: char) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = it.next()?.ok()?;
        calls.push(call_of(&v)?);
        rest = rest[it.byte_offset()..].trim_start();
        rest = rest.strip_prefix(sep).unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// A fresh call id: `call_` and 24 letters or digits, or 9 for Mistral, whose templates
/// accept no other.
pub fn call_id(mode: &ToolMode) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mistral = matches!(
        mode,
        ToolMode::Auto {
            parser: ToolParser::Mistral,
            ..
        }
    );
    if mistral {
        Alphanumeric.sample_string(&mut rand::rng(), 9)
    } else {
        format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
    }
}

/// The `tool_calls` array of a reply's message (whole responses).
pub fn calls_json(mode: &ToolMode, calls: &[Call]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({
                "id": call_id(mode),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect()
}

/// One streamed choice's reading of its output, token by token: which text goes out as
/// content now, and which is held as a possible call.
#[derive(Debug)]
pub struct ToolStream {
    mode: ToolMode,
    held: String,
    /// A call has begun (or, for `required`, the whole output is one).
    in_call: bool,
    /// `auto`: the output's start is past, so only the marker can open a call.
    started: bool,
    /// Named: the call's header (id, name) has been sent.
    opened: bool,
}

impl ToolStream {
    pub fn new(mode: ToolMode) -> Self {
        let in_call = matches!(mode, ToolMode::Required { .. });
        ToolStream {
            mode,
            held: String::new(),
            in_call,
            started: false,
            opened: false,
        }
    }

    /// The deltas (`delta` objects) the next piece of text sends now.
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        match &self.mode {
            ToolMode::Named(name) => {
                let mut out = Vec::new();
                if !self.opened {
                    self.opened = true;
                    out.push(self.header(0, name.clone(), String::new()));
                }
                if !text.is_empty() {
                    out.push(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": text}}]}),
                    );
                }
                out
            }
            ToolMode::Required { .. } => {
                self.held.push_str(text);
                Vec::new()
            }
            ToolMode::Auto { parser, .. } => {
                let parser = *parser;
                self.held.push_str(text);
                self.auto_content(parser)
                    .map(|c| vec![json!({"content": c})])
                    .unwrap_or_default()
            }
        }
    }

    /// `auto`: the held text that can no longer begin a call, taken out of `held`.
    fn auto_content(&mut self, parser: ToolParser) -> Option<String> {
        if self.in_call {
            return None;
        }
        if !self.started {
            let lead = self.held.trim_start();
            if lead.is_empty() {
                return None;
            }
            let openings = parser.openings();
            if openings.iter().any(|o| lead.starts_with(o)) {
                self.in_call = true;
                return None;
            }
            if openings.iter().any(|o| o.starts_with(lead)) {
                return None;
            }
            self.started = true;
        }
        let send = match parser.marker() {
            Some(m) => match self.held.find(m) {
                Some(p) => {
                    self.in_call = true;
                    p
                }
                // Hold back a tail that may be the marker's beginning.
                None => self.held.len() - partial_suffix(&self.held, m),
            },
            None => self.held.len(),
        };
        let content: String = self.held.drain(..send).collect();
        (!content.is_empty()).then_some(content)
    }

    /// The deltas that end the output, and whether it made calls.
    pub fn finish(&mut self) -> (Vec<Value>, bool) {
        if let ToolMode::Named(name) = &self.mode {
            let out = if self.opened {
                Vec::new()
            } else {
                vec![self.header(0, name.clone(), String::new())]
            };
            return (out, true);
        }
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return (Vec::new(), false);
        }
        let reply = self.mode.reply(&held);
        let mut out = Vec::new();
        if let Some(c) = reply.content.filter(|c| !c.is_empty()) {
            out.push(json!({"content": c}));
        }
        for (i, call) in reply.calls.iter().enumerate() {
            out.push(self.header(i, call.name.clone(), call.arguments.clone()));
        }
        (out, !reply.calls.is_empty())
    }

    fn header(&self, index: usize, name: String, arguments: String) -> Value {
        json!({"tool_calls": [{
            "index": index,
            "id": call_id(&self.mode),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }]})
    }

    pub fn mode(&self) -> &ToolMode {
        &self.mode
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `marker`.
fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&k| text.is_char_boundary(text.len() - k) && text.ends_with(&marker[..k]))
        .unwrap_or(0)
}

/// A message's `tool_calls` as the template sees them: `arguments` parsed from its JSON
/// string into an object (templates write it with `tojson`), as vLLM passes them.
pub fn template_calls(calls: &[Value]) -> Vec<Value> {
    calls
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let Some(args) = c.pointer_mut("/function/arguments") {
                if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                    *args = parsed;
                }
            }
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> Call {
        Call {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn hermes_reads_blocks_and_the_content_before_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>";
        let (content, calls) = parse_calls(ToolParser::Hermes, text).unwrap();
        assert_eq!(content, "Let me check.\n");
        assert_eq!(
            calls,
            [
                call("get_weather", r#"{"city":"Oslo"}"#),
                call("search", "{}")
            ]
        );
        // An unterminated last block (cut at a stop token) still parses.
        let (_, calls) = parse_calls(
            ToolParser::Hermes,
            "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}",
        )
        .unwrap();
        assert_eq!(calls, [call("a", r#"{"x":1}"#)]);
        assert!(parse_calls(ToolParser::Hermes, "no calls here").is_none());
        assert!(parse_calls(
            ToolParser::Hermes,
            "<tool_call>{\"name\": oops}</tool_call>"
        )
        .is_none());
    }

    #[test]
    fn llama3_json_reads_objects_separated_by_semicolons() {
        let text = "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}";
        let (content, calls) = parse_calls(ToolParser::Llama3Json, text).unwrap();
        assert_eq!(content, "");
        assert_eq!(calls, [call("a", r#"{"q":"x;y"}"#), call("b", "{}")]);
        assert!(parse_calls(ToolParser::Llama3Json, "Hello {\"name\": \"a\"}").is_none());
    }

    #[test]
    fn mistral_reads_both_formats() {
        let text = "Sure.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 2}}]";
        let (content, calls) = parse_calls(ToolParser::Mistral, text).unwrap();
        assert_eq!(content, "Sure.");
        assert_eq!(calls, [call("a", r#"{"n":2}"#)]);
        let text = "[TOOL_CALLS]a[ARGS]{\"n\": 1}[TOOL_CALLS]b[ARGS]{}";
        let (_, calls) = parse_calls(ToolParser::Mistral, text).unwrap();
        assert_eq!(calls, [call("a", r#"{"n":1}"#), call("b", "{}")]);
        // The marker is a special token decoding may drop.
        let (_, calls) = parse_calls(
            ToolParser::Mistral,
            " [{\"name\": \"c\", \"arguments\": {}}]",
        )
        .unwrap();
        assert_eq!(calls, [call("c", "{}")]);
    }

    /// Streaming sends exactly what the whole reply holds: the same content and calls,
    /// whichever way the output is cut into pieces.
    #[test]
    fn streaming_matches_the_whole_reply_for_every_cut() {
        let outputs = [
            (ToolParser::Hermes, "Checking <tool_call> now.\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"Zürich\"}}\n</tool_call>"),
            (ToolParser::Hermes, "Just text with a < and <tool and <tool_cal"),
            (ToolParser::Llama3Json, "  {\"name\": \"w\", \"parameters\": {}}"),
            (ToolParser::Llama3Json, "{not json"),
            (ToolParser::Llama3Json, "Plain answer {with braces}"),
            (ToolParser::Mistral, "[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {}}]"),
            (ToolParser::Mistral, "[not a call"),
        ];
        for (parser, text) in outputs {
            let mode = ToolMode::Auto {
                parser,
                parallel: true,
            };
            let whole = mode.reply(text);
            let chars: Vec<(usize, char)> = text.char_indices().collect();
            for step in 1..=4 {
                let mut s = ToolStream::new(mode.clone());
                let mut deltas = Vec::new();
                for piece in chars.chunks(step) {
                    let (a, c) = (piece[0].0, piece.last().unwrap());
                    deltas.extend(s.push(&text[a..c.0 + c.1.len_utf8()]));
                }
                let (end, had_calls) = s.finish();
                deltas.extend(end);
                let content: String = deltas
                    .iter()
                    .filter_map(|d| d["content"].as_str())
                    .collect();
                let calls: Vec<Call> = deltas
                    .iter()
                    .filter_map(|d| d["tool_calls"][0]["function"].as_object())
                    .map(|f| {
                        call(
                            f["name"].as_str().unwrap(),
                            f["arguments"].as_str().unwrap(),
                        )
                    })
                    .collect();
                assert_eq!(had_calls, !whole.calls.is_empty(), "{text}");
                assert_eq!(calls, whole.calls, "{text} in pieces of {step}");
                let whole_content = whole.content.clone().unwrap_or_default();
                assert_eq!(content, whole_content, "{text} in pieces of {step}");
            }
        }
    }

    #[test]
    fn named_streams_arguments_as_they_come() {
        let mut s = ToolStream::new(ToolMode::Named("w".into()));
        let first = s.push("{\"c\"");
        assert_eq!(first.len(), 2);
        assert_eq!(first[0]["tool_calls"][0]["function"]["name"], "w");
        assert!(first[0]["tool_calls"][0]["id"]
            .as_str()
            .unwrap()
            .starts_with("call_"));
        assert_eq!(first[1]["tool_calls"][0]["function"]["arguments"], "{\"c\"");
        assert_eq!(s.push(": 1}").len(), 1);
        assert_eq!(s.finish(), (Vec::new(), true));
    }

    fn tool(name: &str, params: Option<Value>) -> Tool {
        Tool {
            kind: "function".into(),
            function: FunctionDef {
                name: name.into(),
                description: None,
                parameters: params,
                strict: None,
            },
        }
    }

    #[test]
    fn plans_follow_openai_defaults_and_refuse_what_cannot_work() {
        let tools = [tool("a", Some(json!({"type": "object"}))), tool("b", None)];
        let off = AutoToolChoice::default();
        let on = AutoToolChoice {
            parser: Some(ToolParser::Hermes),
            enabled: true,
        };
        // No tools: plain text; tools with no choice: auto, which needs the server flags.
        assert_eq!(plan(None, None, None, off).unwrap().mode, None);
        let e = plan(Some(&tools), None, None, off).unwrap_err();
        assert!(
            e.message.contains("--enable-auto-tool-choice"),
            "{}",
            e.message
        );
        let p = plan(Some(&tools), None, Some(false), on).unwrap();
        assert_eq!(
            p.mode,
            Some(ToolMode::Auto {
                parser: ToolParser::Hermes,
                parallel: false
            })
        );
        assert_eq!(p.template_tools.unwrap().len(), 2);
        assert!(p.constraint.is_none());
        let none = ToolChoice::Mode("none".into());
        let p = plan(Some(&tools), Some(&none), None, off).unwrap();
        assert!(p.mode.is_none() && p.template_tools.is_some());
        let req = ToolChoice::Mode("required".into());
        let p = plan(Some(&tools), Some(&req), Some(false), off).unwrap();
        let Some(StructuredOutput::JsonSchema(s)) = p.constraint else {
            panic!()
        };
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["items"]["anyOf"][1]["properties"]["name"]["const"], "b");
        let named = ToolChoice::Named {
            kind: "function".into(),
            function: NamedFunction { name: "c".into() },
        };
        let e = plan(Some(&tools), Some(&named), None, off).unwrap_err();
        assert!(e.message.contains("`c`"), "{}", e.message);
        assert!(plan(None, Some(&req), None, on).is_err());
        let bad = [tool("has space", None)];
        assert!(plan(Some(&bad), Some(&none), None, on).is_err());
    }

    #[test]
    fn template_calls_get_parsed_arguments() {
        let calls = [
            json!({"id": "x", "type": "function", "function": {"name": "a", "arguments": "{\"k\": [1]}"}}),
        ];
        let t = template_calls(&calls);
        assert_eq!(t[0]["function"]["arguments"], json!({"k": [1]}));
        let raw = [json!({"function": {"name": "a", "arguments": "not json"}})];
        assert_eq!(template_calls(&raw)[0]["function"]["arguments"], "not json");
    }

    #[test]
    fn partial_suffix_respects_char_boundaries() {
        assert_eq!(partial_suffix("abc<tool", "<tool_call>"), 5);
        assert_eq!(partial_suffix("abc", "<tool_call>"), 0);
        assert_eq!(partial_suffix("é<", "<tool_call>"), 1);
    }
}
