//! Chat templates: the Jinja template a model ships (`chat_template` in
//! `tokenizer_config.json`, or a `chat_template.jinja` file) turning a list of messages
//! into the prompt text, rendered with `minijinja` the way transformers renders it
//! (`apply_chat_template`: blocks trimmed and left-stripped, `bos_token`, `eos_token`,
//! `add_generation_prompt`, `tools`, extra keyword arguments such as `enable_thinking`,
//! `raise_exception`, Python string methods, and a `tojson` that writes what Python's
//! `json.dumps` writes). Checked against transformers' own renderings in
//! `tests/fixtures/chat`.

use crate::mapped::Folder;
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use std::path::Path;

/// Why a chat template could not be had or used.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The message names files relative to the model folder (a server sends it to clients,
    /// which have no business knowing the server's paths); `dir` is the folder, for logs.
    #[error(
        "the model has no chat template: its folder has neither chat_template.jinja nor a \
         \"chat_template\" in tokenizer_config.json"
    )]
    Missing {
        /// The model's folder.
        dir: String,
    },
    /// Its file could not be read.
    #[error("reading the chat template: {0}")]
    Io(String),
    /// It is not a valid template.
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    /// It raised an error for these messages (many templates refuse some role orders).
    #[error("the chat template refused the messages: {0}")]
    Render(String),
}

/// One message as chat templates see it. The tool fields are left out of the template's
/// view when absent, so that `message.tool_calls is defined` means what it says. Read from
/// JSON, an unknown field is an error.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message's text.
    pub content: String,
    /// An assistant turn's calls, OpenAI-shaped (`{"id", "type", "function": {"name",
    /// "arguments"}}`), with `arguments` as a JSON object where it parses, as transformers'
    /// templates expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the name of the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of `role` with `content`.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// What a rendering is given besides the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// Open the assistant's turn.
    pub add_generation_prompt: bool,
    /// The tools the model may call, OpenAI-shaped (`{"type": "function", "function":
    /// {...}}`); the template sees `none` without them, as under transformers.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Extra variables (`chat_template_kwargs`, e.g. Qwen3's `enable_thinking`).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// Names a rendering sets itself, which `chat_template_kwargs` may not replace.
pub const RESERVED_TEMPLATE_NAMES: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// A model's chat template (Jinja, as transformers renders it with minijinja): turns
/// messages into the prompt the model was trained on.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

impl ChatTemplate {
    /// The template of the model folder `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, ChatTemplateError> {
        Self::from_folder(Folder::Disk(dir))
    }

    /// [`Self::from_dir`] for a model folder on disk or in memory.
    pub fn from_folder(folder: Folder<'_>) -> Result<Self, ChatTemplateError> {
        let config: serde_json::Value = match folder.read_to_string("tokenizer_config.json") {
            Ok(text) => serde_json::from_str(&text).unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let token = |key: &str| -> String {
            match &config[key] {
                serde_json::Value::String(s) => s.clone(),
                // The older spelling: {"content": "<s>", ...}.
                v => v["content"].as_str().unwrap_or_default().to_string(),
            }
        };
        let dir = folder.display_path();
        let source = if folder.exists("chat_template.jinja") {
            folder
                .read_to_string("chat_template.jinja")
                .map_err(|e| ChatTemplateError::Io(e.to_string()))?
        } else {
            match &config["chat_template"] {
                serde_json::Value::String(s) => s.clone(),
                // A list of named templates: take "default".
                serde_json::Value::Array(list) => list
                    .iter()
                    .find(|t| t["name"] == "default")
                    .and_then(|t| t["template"].as_str())
                    .map(String::from)
                    .ok_or_else(|| ChatTemplateError::Missing {
                        dir: dir.display().to_string(),
                    })?,
                _ => {
                    return Err(ChatTemplateError::Missing {
                        dir: dir.display().to_string(),
                    })
                }
            }
        };
        Self::new(&source, &token("bos_token"), &token("eos_token"))
    }

    /// The template of Jinja source `source`, with the model's BOS and EOS tokens' text.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", py_tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` the template opens the
    /// assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let options = RenderOptions {
            add_generation_prompt,
            ..RenderOptions::default()
        };
        self.render_with(messages, &options)
    }

    /// The prompt text for `messages` with tools and extra variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String, ChatTemplateError> {
        if let Some(k) = options
            .kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_NAMES.contains(&k.as_str()))
        {
            return Err(ChatTemplateError::Render(format!(
                "`{k}` is set by the request itself and cannot be a template keyword argument"
            )));
        }
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        let own = minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(messages)),
            tools => minijinja::Value::from(minijinja::value::Serde(&options.tools)),
            add_generation_prompt => options.add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let extra = minijinja::Value::from(minijinja::value::Serde(&options.kwargs));
        tmpl.render(minijinja::context! { ..own, ..extra })
            .map_err(|e| {
                // The template's own message, without minijinja's location noise.
                let msg = match e.detail() {
                    Some(d) => d.to_string(),
                    None => e.to_string(),
                };
                ChatTemplateError::Render(msg)
            })
    }

    /// The template's BOS and EOS token strings.
    pub fn special_tokens(&self) -> (&str, &str) {
        (&self.bos_token, &self.eos_token)
    }
}

/// Jinja's `tojson` as transformers defines it: Python's `json.dumps` with non-ASCII kept,
/// `", "` and `": "` separators, keys in their given order, and `indent` for pretty output
/// (minijinja's own filter writes compact JSON with HTML escapes, which would change the
/// prompt a model was trained on).
fn py_tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
            serde::Serialize::serialize(
                &json,
                &mut serde_json::Serializer::with_formatter(&mut out, fmt),
            )
        }
        None => serde::Serialize::serialize(
            &json,
            &mut serde_json::Serializer::with_formatter(&mut out, PySpaced),
        ),
    };
    written.map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(minijinja::Value::from_safe_string(
        String::from_utf8(out)
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?,
    ))
}

/// `json.dumps`'s default layout: one space after each `,` and `:`.
struct PySpaced;

impl serde_json::ser::Formatter for PySpaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
