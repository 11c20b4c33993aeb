//! Structured output and tool calls over real HTTP, on the shipped model (which writes
//! nonsense: only the constraint makes its output valid), checked by independent parsers
//! (the `jsonschema` and `regex` crates, serde_json):
//!
//! - `response_format` (JSON schema and JSON object), vLLM's `structured_outputs` and
//!   `guided_choice`, whole and streamed, with n > 1 at temperature 1;
//! - `logit_bias` forces a token as a hand computation says; bad schemas, two constraints
//!   and unimplemented fields are 400s naming the field;
//! - `tool_choice` `required` and a named function give calls whose arguments validate
//!   against the tool's schema, whole and streamed, with `parallel_tool_calls: false`
//!   honoured; `auto` is refused unless the server enables it, and with `--tool-call-parser
//!   hermes` reads content and calls out of the model's text (forced here by a choice);
//! - `/tokenize` renders tools, tool results and `chat_template_kwargs` as transformers
//!   did (tests/fixtures/chat/tools_expected.json); `/detokenize` inverts it and refuses
//!   ids outside the vocabulary; both need the API key;
//! - a returned call round-trips: sent back with its `tool` result, the Hermes template shows
//!   the model that call's arguments and the result.

#[path = "../../tests/common/mod.rs"]
mod common;
use serde_json::{json, Value};

#[path = "../../tests/common/http.rs"]
mod http;
use http::{agent, serve, Served};

fn skip() -> bool {
    common::contexts().is_empty()
}

fn start(args: &[&str]) -> Served {
    serve(env!("CARGO_BIN_EXE_pagellm"), args)
}

fn post(s: &Served, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = agent()
        .post(&format!("{}{path}", s.base))
        .header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send(body.to_string()).expect("request");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Every `data:` payload of a stream, until `[DONE]`.
fn stream(s: &Served, path: &str, body: &Value, headers: &[(&str, &str)]) -> Vec<Value> {
    http::post_stream(&format!("{}{path}", s.base), &body.to_string(), headers)
}

/// A streamed chat choice put back together: content, calls (name, arguments), finish
/// reason, and the calls' ids.
#[derive(Default, Debug)]
struct Assembled {
    content: String,
    calls: Vec<(String, String)>,
    ids: Vec<String>,
    finish: String,
}

fn assemble(chunks: &[Value]) -> Vec<Assembled> {
    let mut v: Vec<Assembled> = Vec::new();
    for c in chunks {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            if v.len() <= i {
                v.resize_with(i + 1, Default::default);
            }
            let a = &mut v[i];
            let d = &ch["delta"];
            if let Some(t) = d["content"].as_str() {
                a.content.push_str(t);
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let k = tc["index"].as_u64().unwrap() as usize;
                if a.calls.len() <= k {
                    a.calls.resize(k + 1, Default::default());
                }
                if let Some(id) = tc["id"].as_str() {
                    a.ids.push(id.to_string());
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    a.calls[k].0.push_str(n);
                }
                if let Some(args) = tc["function"]["arguments"].as_str() {
                    a.calls[k].1.push_str(args);
                }
            }
            if let Some(r) = ch["finish_reason"].as_str() {
                a.finish = r.to_string();
            }
        }
    }
    v
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "fortune": {"type": "string", "minLength": 1, "maxLength": 20},
            "lucky": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99},
                      "minItems": 1, "maxItems": 3},
            "mood": {"enum": ["good", "bad", "strange"]}
        },
        "required": ["fortune", "lucky", "mood"],
        "additionalProperties": false
    })
}

fn assert_valid(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let validator = jsonschema::validator_for(schema).unwrap();
    assert!(validator.is_valid(&v), "{text} is not valid for {schema}");
}

#[test]
fn constraints_and_logit_bias_shape_what_the_server_returns() {
    if skip() {
        return;
    }
    let s = start(&["--model", &common::shipped_model()]);
    // A JSON schema, 3 samples at temperature 1, whole.
    let body = json!({
        "prompt": "Fortune:", "n": 3, "temperature": 1.0, "seed": 7, "max_tokens": 200,
        "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema()}},
    });
    let (st, v) = post(&s, "/v1/completions", &body, &[]);
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        assert_eq!(ch["finish_reason"], "stop", "{ch}");
        assert_valid(&schema(), ch["text"].as_str().unwrap());
    }
    // A regex through vLLM's `structured_outputs`, streamed.
    let re = r"[a-z]{3,8}( [a-z]{2,6}){1,3}\.";
    let body = json!({
        "prompt": "Say:", "n": 2, "temperature": 1.0, "seed": 3, "max_tokens": 60, "stream": true,
        "structured_outputs": {"regex": re},
    });
    let chunks = stream(&s, "/v1/completions", &body, &[]);
    let full = regex::Regex::new(&format!("^(?:{re})$")).unwrap();
    let mut texts = vec![String::new(); 2];
    for c in &chunks {
        for ch in c["choices"].as_array().unwrap() {
            texts[ch["index"].as_u64().unwrap() as usize].push_str(ch["text"].as_str().unwrap());
        }
    }
    for t in &texts {
        assert!(full.is_match(t), "{t:?} does not match {re}");
    }
    // The older guided_choice field.
    let choices = ["red moon", "blue sun", "green star"];
    let body = json!({"prompt": "Color:", "n": 4, "temperature": 1.0, "seed": 1,
                      "max_tokens": 20, "guided_choice": choices});
    let (st, v) = post(&s, "/v1/completions", &body, &[]);
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        assert!(choices.contains(&ch["text"].as_str().unwrap()), "{ch}");
    }
    logit_bias_forces_a_token(&s);
    bad_constraints_are_400s(&s);
    tokenize_round_trips(&s, &[]);
}

/// A +100 bias on one token makes greedy decoding write only it (every other logit of
/// this model is far less than 100 above it); -100 on the greedy token moves it.
fn logit_bias_forces_a_token(s: &Served) {
    let (st, t) = post(
        s,
        "/tokenize",
        &json!({"prompt": " moon", "add_special_tokens": false}),
        &[],
    );
    assert_eq!(st, 200, "{t}");
    let id = t["tokens"][0].as_u64().unwrap();
    let body = json!({"prompt": "Fortune:", "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                      "logprobs": 1, "logit_bias": {id.to_string(): 100}});
    let (st, v) = post(s, "/v1/completions", &body, &[]);
    assert_eq!(st, 200, "{v}");
    let tokens = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    let (_, d) = post(s, "/detokenize", &json!({"tokens": [id]}), &[]);
    assert_eq!(tokens.len(), 4);
    assert!(
        tokens.iter().all(|x| x == &d["prompt"]),
        "{tokens:?} vs {d}"
    );
    let bad = json!({"prompt": "x", "max_tokens": 1, "logit_bias": {id.to_string(): 101}});
    let (st, v) = post(s, "/v1/completions", &bad, &[]);
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("100"),
        "{v}"
    );
}

fn bad_constraints_are_400s(s: &Served) {
    let cases = [
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}}),
            "",
        ),
        (
            json!({"prompt": "x", "guided_regex": "a+", "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (
            json!({"prompt": "x", "guided_grammar": "root ::= \"a\""}),
            "guided_grammar",
        ),
        (json!({"prompt": "x", "frobnicate": true}), "frobnicate"),
        (
            json!({"prompt": "x", "response_format": {"type": "yaml"}}),
            "",
        ),
    ];
    for (body, param) in cases {
        let (st, v) = post(s, "/v1/completions", &body, &[]);
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        if !param.is_empty() {
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }
    }
    // The server still answers after the refusals.
    let (st, _) = post(
        s,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2}),
        &[],
    );
    assert_eq!(st, 200);
}

fn tokenize_round_trips(s: &Served, auth: &[(&str, &str)]) {
    let text = "The moon is bright tonight.";
    let (st, t) = post(
        s,
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false, "return_token_strs": true}),
        auth,
    );
    assert_eq!(st, 200, "{t}");
    let n = t["tokens"].as_array().unwrap().len();
    assert_eq!(t["count"], n);
    assert_eq!(t["token_strs"].as_array().unwrap().len(), n);
    assert!(t["max_model_len"].as_u64().unwrap() > 0, "{t}");
    let (st, d) = post(s, "/detokenize", &json!({"tokens": t["tokens"]}), auth);
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["prompt"], text);
    // With special tokens, the tokenizer's BOS comes first.
    let (_, with) = post(s, "/tokenize", &json!({"prompt": text}), auth);
    assert_eq!(with["count"].as_u64().unwrap(), n as u64 + 1, "{with}");
    let (st, v) = post(s, "/detokenize", &json!({"tokens": [1, 99999999]}), auth);
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens[1]"),
        "{v}"
    );
    let (st, v) = post(
        s,
        "/tokenize",
        &json!({"prompt": "a", "messages": []}),
        auth,
    );
    assert_eq!(st, 400, "{v}");
}

fn tool_fixture() -> Value {
    let p = common::repo_root().join("tests/fixtures/chat/tools_expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A template file for `--chat-template`: the fixture's Hermes-style one, or (for
/// generation, within the shipped model's 512 tokens) a short one naming the tools.
fn template_file(hermes: bool) -> std::path::PathBuf {
    let source = if hermes {
        tool_fixture()["templates"]["hermes"]
            .as_str()
            .unwrap()
            .to_string()
    } else {
        "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}\
         {% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
            .to_string()
    };
    let path = std::env::temp_dir().join(format!(
        "pagellm-template-{}-{hermes}.jinja",
        std::process::id()
    ));
    std::fs::write(&path, source).unwrap();
    path
}

/// A server on the shipped model with a `--chat-template` from [`template_file`] and
/// `extra` flags; the template file is removed when the server is dropped.
struct Templated {
    served: Served,
    template: std::path::PathBuf,
}

impl std::ops::Deref for Templated {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl Drop for Templated {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.template);
    }
}

fn start_templated(hermes: bool, extra: &[&str]) -> Templated {
    let template = template_file(hermes);
    let model = common::shipped_model();
    let mut args = vec![
        "--model",
        &model,
        "--chat-template",
        template.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let served = start(&args);
    Templated { served, template }
}

fn tool_schema(tools: &Value, name: &str) -> Value {
    tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("no tool {name}"))["function"]["parameters"]
        .clone()
}

/// Two small tools (the shipped model's context is 512 tokens, and its tokens are short),
/// with bounded strings so that a sampled call ends well within `max_tokens`.
fn small_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                           "unit": {"enum": ["c", "f"]}},
            "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 8},
                           "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
            "additionalProperties": false}}}
    ])
}

/// A chat request with `tools`; without `max_tokens` the reply may use the rest of the
/// context, room for some ten sampled calls (each closes the array or adds another).
fn chat(tools: &Value, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": tools, "temperature": 1.0, "seed": 11,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[test]
fn required_and_named_tool_choice_give_valid_calls() {
    if skip() {
        return;
    }
    let s = start_templated(false, &[]);
    let tools = small_tools();
    // required, whole, 3 samples. This model would rather add calls than close the array,
    // so a bias on `]` makes the replies end within the context.
    let (_, t) = post(
        &s,
        "/tokenize",
        &json!({"prompt": "]", "add_special_tokens": false}),
        &[],
    );
    assert_eq!(t["count"], 1, "{t}");
    let bias = json!({t["tokens"][0].to_string(): 6});
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        &chat(
            &tools,
            json!({"tool_choice": "required", "n": 3, "logit_bias": bias}),
        ),
        &[],
    );
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        assert_eq!(ch["finish_reason"], "tool_calls", "{ch}");
        let calls = ch["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{ch}");
        for c in calls {
            assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
            assert_eq!(c["type"], "function");
            let name = c["function"]["name"].as_str().unwrap();
            assert_valid(
                &tool_schema(&tools, name),
                c["function"]["arguments"].as_str().unwrap(),
            );
        }
    }
    // required without parallel calls, streamed: exactly one call per choice.
    let body = chat(
        &tools,
        json!({"tool_choice": "required", "parallel_tool_calls": false, "n": 2, "stream": true}),
    );
    for a in assemble(&stream(&s, "/v1/chat/completions", &body, &[])) {
        assert_eq!(a.finish, "tool_calls", "{a:?}");
        assert_eq!(a.calls.len(), 1, "{a:?}");
        assert_eq!(a.content, "", "{a:?}");
        assert_valid(&tool_schema(&tools, &a.calls[0].0), &a.calls[0].1);
    }
    // A named function, whole and streamed: its arguments, valid.
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let weather = tool_schema(&tools, "get_weather");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        &chat(&tools, json!({"tool_choice": named, "n": 2})),
        &[],
    );
    assert_eq!(st, 200, "{v}");
    for ch in v["choices"].as_array().unwrap() {
        let calls = ch["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{ch}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert!(ch["message"]["content"].is_null(), "{ch}");
        assert_valid(
            &weather,
            calls[0]["function"]["arguments"].as_str().unwrap(),
        );
    }
    named_call_streams_its_arguments(&s, &tools);
    tool_requests_that_cannot_work_are_400s(&s, &tools);
}

/// A named function streamed: one call, one id in its first delta, valid arguments sent
/// piece by piece, and every token's logprob sent once.
fn named_call_streams_its_arguments(s: &Served, tools: &Value) {
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let weather = tool_schema(tools, "get_weather");
    let body = chat(
        tools,
        json!({"tool_choice": named, "stream": true, "logprobs": true,
               "stream_options": {"include_usage": true}}),
    );
    let chunks = stream(s, "/v1/chat/completions", &body, &[]);
    let a = &assemble(&chunks)[0];
    assert_eq!(a.calls.len(), 1);
    assert_eq!(a.ids.len(), 1, "one id, in the call's first delta: {a:?}");
    assert_eq!(a.calls[0].0, "get_weather");
    assert_valid(&weather, &a.calls[0].1);
    // Arguments arrive piece by piece, and every token's logprob is sent once.
    let pieces = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .is_some_and(|a| !a.is_empty())
        })
        .count();
    assert!(pieces > 3, "{pieces} argument pieces");
    let logprobs: usize = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["logprobs"]["content"].as_array())
        .map(Vec::len)
        .sum();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        logprobs as u64,
        usage["completion_tokens"].as_u64().unwrap()
    );
}

fn tool_requests_that_cannot_work_are_400s(s: &Served, tools: &Value) {
    let cases = [
        // auto (the default with tools) needs the server flags.
        (json!({}), "--enable-auto-tool-choice"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "`nope`",
        ),
        (
            json!({"tool_choice": "required", "guided_regex": "a"}),
            "without response_format",
        ),
        (json!({"tool_choice": "sometimes"}), "sometimes"),
        (
            json!({"tool_choice": "none", "chat_template_kwargs": {"messages": []}}),
            "`messages`",
        ),
    ];
    for (extra, needle) in cases {
        let (st, v) = post(s, "/v1/chat/completions", &chat(tools, extra.clone()), &[]);
        assert_eq!(st, 400, "{extra}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{extra}: {msg}");
    }
    let bad_tools = json!([{"type": "function", "function": {"name": "has space"}}]);
    let (st, v) = post(
        s,
        "/v1/chat/completions",
        &chat(&bad_tools, json!({"tool_choice": "none"})),
        &[],
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
}

#[test]
fn auto_tool_choice_reads_hermes_calls() {
    if skip() {
        return;
    }
    let s = start_templated(
        false,
        &["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    );
    let tools = small_tools();
    // The model is forced (by a choice) to write content and then a call.
    let call = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n</tool_call>";
    let plain = "It is sunny.";
    let forced = |text: &str, stream: bool| {
        chat(
            &tools,
            json!({"guided_choice": [text], "stream": stream, "temperature": 0}),
        )
    };
    let (st, v) = post(&s, "/v1/chat/completions", &forced(call, false), &[]);
    assert_eq!(st, 200, "{v}");
    let ch = &v["choices"][0];
    assert_eq!(ch["finish_reason"], "tool_calls", "{ch}");
    assert_eq!(ch["message"]["content"], "Let me look.\n");
    let calls = ch["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo", "unit": "c"}));
    let a = &assemble(&stream(
        &s,
        "/v1/chat/completions",
        &forced(call, true),
        &[],
    ))[0];
    assert_eq!(a.content, "Let me look.\n");
    assert_eq!(a.finish, "tool_calls");
    assert_eq!(a.calls.len(), 1);
    assert_eq!(a.calls[0].0, "get_weather");
    assert_eq!(serde_json::from_str::<Value>(&a.calls[0].1).unwrap(), args);
    // Text without a call stays text.
    let (_, v) = post(&s, "/v1/chat/completions", &forced(plain, false), &[]);
    assert_eq!(v["choices"][0]["message"]["content"], plain, "{v}");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null(), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let a = &assemble(&stream(
        &s,
        "/v1/chat/completions",
        &forced(plain, true),
        &[],
    ))[0];
    assert_eq!((a.content.as_str(), a.calls.len()), (plain, 0));
}

#[test]
fn tokenize_renders_tools_as_transformers_and_needs_the_key() {
    if skip() {
        return;
    }
    let s = start_templated(true, &["--api-key", "k3y"]);
    let auth = [("Authorization", "Bearer k3y")];
    tokenize_renders_tool_conversations(&s, &tool_fixture(), &auth);
    tokenize_round_trips(&s, &auth);
    tool_calls_round_trip(&s, &auth);
    let (st, _) = post(&s, "/tokenize", &json!({"prompt": "a"}), &[]);
    assert_eq!(st, 401);
    let (st, _) = post(&s, "/detokenize", &json!({"tokens": [1]}), &[]);
    assert_eq!(st, 401);
}

/// Conversation 1 (tool calls with OpenAI's string arguments, then tool results) with
/// tools and a template keyword argument gives the ids of transformers' rendered text.
fn tokenize_renders_tool_conversations(s: &Served, f: &Value, auth: &[(&str, &str)]) {
    let case = f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "hermes"
                && c["tools"] == true
                && c["conversation"] == 1
                && c["kwargs"]["enable_thinking"] == true
                && c["add_generation_prompt"] == true
        })
        .unwrap();
    let mut messages = f["conversations"][1].clone();
    for m in messages.as_array_mut().unwrap() {
        for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
            let args = c["function"]["arguments"].to_string();
            c["function"]["arguments"] = json!(args);
        }
    }
    let body = json!({"messages": messages, "tools": f["tools"],
                      "chat_template_kwargs": case["kwargs"]});
    let (st, ours) = post(s, "/tokenize", &body, auth);
    assert_eq!(st, 200, "{ours}");
    let (st, theirs) = post(
        s,
        "/tokenize",
        &json!({"prompt": case["text"], "add_special_tokens": false}),
        auth,
    );
    assert_eq!(st, 200, "{theirs}");
    assert_eq!(ours["tokens"], theirs["tokens"]);
}

/// A call the server returned goes back in the next request as the assistant's message,
/// with a `tool` result naming its id, and the Hermes template shows the model that call
/// (its arguments as JSON, equal to those returned) and the result.
fn tool_calls_round_trip(s: &Served, auth: &[(&str, &str)]) {
    // One tool, so that the Hermes prompt leaves room in the shipped model's context.
    let tools = json!([small_tools()[0]]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let mut body = chat(&tools, json!({"tool_choice": named}));
    let (st, v) = post(s, "/v1/chat/completions", &body, auth);
    assert_eq!(st, 200, "{v}");
    let reply = v["choices"][0]["message"].clone();
    let call = &reply["tool_calls"][0];
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .expect("the arguments are a JSON string");
    let result = r#"{"temp": 4.5}"#;
    body["messages"].as_array_mut().unwrap().extend([
        reply.clone(),
        json!({"role": "tool", "tool_call_id": call["id"], "content": result}),
    ]);
    body["tool_choice"] = json!("none");
    body["max_tokens"] = json!(2);
    let (st, v) = post(s, "/v1/chat/completions", &body, auth);
    assert_eq!(st, 200, "the reply goes back as it came: {v}");
    // What the model was shown, read back through /tokenize and /detokenize.
    let (st, t) = post(
        s,
        "/tokenize",
        &json!({"messages": body["messages"], "tools": tools}),
        auth,
    );
    assert_eq!(st, 200, "{t}");
    let (_, d) = post(s, "/detokenize", &json!({"tokens": t["tokens"]}), auth);
    let text = d["prompt"].as_str().unwrap();
    let shown = text
        .split("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ")
        .nth(1)
        .and_then(|rest| rest.split("}\n</tool_call>").next())
        .unwrap_or_else(|| panic!("no get_weather call in {text:?}"));
    let shown: Value = serde_json::from_str(shown).expect("the shown arguments are JSON");
    assert_eq!(shown, args, "{text}");
    assert!(
        text.contains(&format!("<tool_response>\n{result}\n</tool_response>")),
        "{text}"
    );
}
