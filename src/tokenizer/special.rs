//! BOS and EOS token ids of a model folder.
//!
//! Hugging Face spreads these over three files, and real checkpoints disagree between them
//! (Llama 3 instruct: `config.json` says `<|end_of_text|>`, `generation_config.json` lists
//! `<|eot_id|>` too, `tokenizer_config.json` names `<|eot_id|>`). We read, in this order:
//!
//! 1. `generation_config.json`: `bos_token_id`, `eos_token_id` (an int or a list),
//! 2. `config.json`: the same fields,
//! 3. `tokenizer_config.json`: `bos_token` / `eos_token`, a string or `{"content": ...}`,
//!    resolved to ids through the vocabulary.
//!
//! BOS is the first one found. EOS ids are the union of all three in that order, without
//! duplicates: generation should stop on any token one of the files calls end-of-sequence,
//! which is what vLLM does when it adds `generation_config.json`'s ids to the tokenizer's own.
//! Missing files and `null` fields are simply absent; unreadable files, malformed JSON and
//! fields of the wrong type are errors naming the file and field.

use super::TokenizerError;
use crate::mapped::Folder;
use serde_json::{Map, Value};
use std::path::Path;

/// The special token ids the engine needs: where a prompt may start and where output ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence id, if any file declares one.
    pub bos: Option<u32>,
    /// Every end-of-sequence id declared by any of the files, first source first.
    pub eos: Vec<u32>,
}

/// Reads the special tokens of `dir`; `resolve` maps a token string to its id.
pub(crate) fn read_special_tokens(
    folder: Folder<'_>,
    resolve: impl Fn(&str) -> Option<u32>,
) -> Result<SpecialTokens, TokenizerError> {
    let mut special = SpecialTokens::default();

    for name in ["generation_config.json", "config.json"] {
        let path = folder.path(name);
        let Some(obj) = read_json_object(folder, name)? else {
            continue;
        };
        let bos = id_field(&path, &obj, "bos_token_id")?;
        if special.bos.is_none() {
            special.bos = bos.into_iter().next();
        }
        add_unique(&mut special.eos, id_field(&path, &obj, "eos_token_id")?);
    }

    let path = folder.path("tokenizer_config.json");
    if let Some(obj) = read_json_object(folder, "tokenizer_config.json")? {
        if special.bos.is_none() {
            special.bos = token_field(&path, &obj, "bos_token", &resolve)?;
        }
        add_unique(
            &mut special.eos,
            token_field(&path, &obj, "eos_token", &resolve)?,
        );
    }
    Ok(special)
}

fn add_unique(ids: &mut Vec<u32>, new: impl IntoIterator<Item = u32>) {
    for id in new {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
}

/// `Ok(None)` when the file does not exist: every one of these files is optional.
fn read_json_object(
    folder: Folder<'_>,
    name: &str,
) -> Result<Option<Map<String, Value>>, TokenizerError> {
    let path = &folder.path(name);
    let text = match folder.read_to_string(name) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let value: Value =
        serde_json::from_str(&text).map_err(|source| TokenizerError::ConfigJson {
            path: path.to_path_buf(),
            source,
        })?;
    match value {
        Value::Object(obj) => Ok(Some(obj)),
        other => Err(TokenizerError::ConfigField {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            problem: format!("must be a JSON object, found {}", kind(&other)),
        }),
    }
}

/// A token id field: absent, `null`, an integer, or a list of integers.
fn id_field(
    path: &Path,
    obj: &Map<String, Value>,
    field: &str,
) -> Result<Vec<u32>, TokenizerError> {
    let bad = |problem: String| TokenizerError::ConfigField {
        path: path.to_path_buf(),
        field: field.to_string(),
        problem,
    };
    let one = |v: &Value| -> Result<u32, TokenizerError> {
        v.as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| {
                bad(format!(
                    "must hold token ids (integers from 0 to 2^32-1), found {v}"
                ))
            })
    };
    match obj.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// A token given by its text: absent, `null`, a string, or an object with a `content`
/// string (the serialised `AddedToken` form).
fn token_field(
    path: &Path,
    obj: &Map<String, Value>,
    field: &str,
    resolve: &impl Fn(&str) -> Option<u32>,
) -> Result<Option<u32>, TokenizerError> {
    let token = match obj.get(field) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => s.as_str(),
            _ => {
                return Err(TokenizerError::ConfigField {
                    path: path.to_path_buf(),
                    field: field.to_string(),
                    problem: "is an object without a \"content\" string".into(),
                })
            }
        },
        Some(other) => {
            return Err(TokenizerError::ConfigField {
                path: path.to_path_buf(),
                field: field.to_string(),
                problem: format!(
                    "must be a token string or {{\"content\": ...}}, found {}",
                    kind(other)
                ),
            })
        }
    };
    resolve(token)
        .map(Some)
        .ok_or_else(|| TokenizerError::UnknownSpecialToken {
            path: path.to_path_buf(),
            field: field.to_string(),
            token: token.to_string(),
        })
}

/// What a JSON value is, with its article, for error messages ("an array").
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
