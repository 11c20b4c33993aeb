//! Errors of the tokenizer module. Each names the file (or the operation) and the problem, so
//! a user with a broken model folder can see what to fix.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer folder or running the tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The folder has no `tokenizer.json` (pagellm reads only the fast-tokenizer format).
    #[error("no tokenizer.json in {dir}: pagellm needs the Hugging Face fast-tokenizer file, or a GGUF file whose metadata holds the tokenizer")]
    MissingTokenizerJson { dir: PathBuf },

    /// A GGUF file's tokenizer metadata cannot be built into a tokenizer.
    #[error("{path}: no tokenizer can be built from its metadata: {message}")]
    Gguf { path: PathBuf, message: String },

    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// `tokenizer.json` is not something the `tokenizers` crate can load.
    #[error("{path} is not a valid tokenizer file: {message}")]
    InvalidTokenizerJson { path: PathBuf, message: String },

    /// A config file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A config file is JSON but a field has an unusable value.
    #[error("{path}: field {field:?} {problem}")]
    ConfigField {
        path: PathBuf,
        field: String,
        problem: String,
    },

    /// `tokenizer_config.json` names a special token that is not in the vocabulary.
    #[error("{path}: {field} is {token:?}, which is not in the tokenizer's vocabulary")]
    UnknownSpecialToken {
        path: PathBuf,
        field: String,
        token: String,
    },

    /// The `tokenizers` crate failed to encode a text.
    #[error("encoding failed: {0}")]
    Encode(String),

    /// The `tokenizers` crate failed to decode token ids.
    #[error("decoding failed: {0}")]
    Decode(String),
}
