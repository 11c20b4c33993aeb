//! Chat templates: the Jinja template a model ships (`chat_template` in
//! `tokenizer_config.json`, or a `chat_template.jinja` file) turning a list of messages
//! into the prompt text, rendered with `minijinja` the way transformers renders it
//! (`apply_chat_template`: blocks trimmed and left-stripped, `bos_token`, `eos_token`,
//! `add_generation_prompt`, `raise_exception`, Python string methods). Checked against
//! transformers' own renderings in `tests/fixtures/chat`.

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The message names files relative to the model folder (a server sends it to clients,
    /// which have no business knowing the server's paths); `dir` is the folder, for logs.
    #[error(
        "the model has no chat template: its folder has neither chat_template.jinja nor a \
         \"chat_template\" in tokenizer_config.json"
    )]
    Missing { dir: String },
    #[error("reading the chat template: {0}")]
    Io(String),
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    #[error("the chat template refused the messages: {0}")]
    Render(String),
}

/// One message as chat templates see it.
#[derive(Clone, Debug, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

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
        let config: serde_json::Value =
            match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
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
        let file = dir.join("chat_template.jinja");
        let source = if file.exists() {
            std::fs::read_to_string(&file).map_err(|e| ChatTemplateError::Io(e.to_string()))?
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
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| {
            // The template's own message, without minijinja's location noise.
            let msg = match e.detail() {
                Some(d) => d.to_string(),
                None => e.to_string(),
            };
            ChatTemplateError::Render(msg)
        })
    }
}
