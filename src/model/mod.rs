//! Decoder-only models from Hugging Face folders: `config.json` ([`config`]) read through the
//! architecture registry ([`arch`]: Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3),
//! safetensors weights or a GGUF file ([`checkpoint`], [`crate::gguf`]) validated against the tensor list the config implies
//! ([`spec`]), a plain-Rust reference forward pass ([`reference`](mod@reference)) and the GPU model
//! ([`gpu`]), both following the architecture's recipe; the GPU forward pass ([`forward`])
//! and one step of it over a flat batch ([`step`]).

pub mod arch;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod error;
pub mod forward;
pub mod gguf;
pub mod gpu;
mod parse;
pub mod recipe;
pub mod reference;
pub mod spec;
pub mod step;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::{Architecture, ModelConfig};
pub use error::ModelError;

use crate::tokenizer::{ChatTemplate, ChatTemplateError, Tokenizer, TokenizerError};
use std::path::{Path, PathBuf};

/// A validated model: its config and memory-mapped weights.
#[derive(Debug)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub checkpoint: Checkpoint,
}

impl ModelFiles {
    /// Reads a model and checks every tensor's presence, shape and dtype before anything is
    /// uploaded. `path` is a Hugging Face folder (`config.json` and safetensors weights), a
    /// GGUF file (config from its metadata), or a folder with `config.json` and one GGUF file
    /// and no safetensors (config from the folder, weights from the file). `dir` is the
    /// folder, where the tokenizer is looked for.
    pub fn open(path: &Path) -> error::Result<Self> {
        let (dir, config, checkpoint) = if is_gguf(path) {
            let (config, ck) = gguf::open(path, None)?;
            (model_folder(path).to_path_buf(), config, ck)
        } else if !path.is_dir() {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                error: std::io::Error::new(std::io::ErrorKind::NotFound, "not a model folder"),
            });
        } else if let Some(gguf) = lone_gguf(path)? {
            let config = ModelConfig::from_dir(path)?;
            let (config, ck) = gguf::open(&gguf, Some(config))?;
            (path.to_path_buf(), config, ck)
        } else {
            let config = ModelConfig::from_dir(path)?;
            (path.to_path_buf(), config, Checkpoint::open(path)?)
        };
        spec::validate(&config, &checkpoint)?;
        Ok(ModelFiles {
            dir,
            config,
            checkpoint,
        })
    }
}

/// The tokenizer of the model at `path` (a folder or a GGUF file, as [`ModelFiles::open`]
/// takes): the folder's `tokenizer.json` where there is one (the model's own), else the one
/// the GGUF file's metadata describes ([`crate::gguf::tokenizer`]).
pub fn open_tokenizer(path: &Path) -> Result<Tokenizer, TokenizerError> {
    let folder = model_folder(path);
    if folder.join("tokenizer.json").exists() {
        return Tokenizer::from_dir(folder);
    }
    let Some(gguf) = gguf_of(path) else {
        return Tokenizer::from_dir(folder);
    };
    let fail = |message: String| TokenizerError::Gguf {
        path: gguf.clone(),
        message,
    };
    let file = crate::gguf::file::GgufFile::open(&gguf).map_err(|e| fail(e.to_string()))?;
    crate::gguf::tokenizer::tokenizer(&file).map_err(fail)
}

/// The chat template of the model at `path`: the folder's (`chat_template.jinja` or
/// `tokenizer_config.json`) where it has one, else a GGUF file's `tokenizer.chat_template`,
/// with the file's BOS and EOS tokens.
pub fn open_chat_template(path: &Path) -> Result<ChatTemplate, ChatTemplateError> {
    let folder = model_folder(path);
    let from_folder = ChatTemplate::from_dir(folder);
    let (Err(ChatTemplateError::Missing { .. }), Some(gguf)) = (&from_folder, gguf_of(path)) else {
        return from_folder;
    };
    let file = crate::gguf::file::GgufFile::open(&gguf)
        .map_err(|e| ChatTemplateError::Io(e.to_string()))?;
    let token = |key: &str| -> String {
        let id = file.get(key).and_then(|v| v.as_u64());
        let tokens = file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array());
        id.and_then(|id| tokens?.get(id as usize)?.as_str().map(String::from))
            .unwrap_or_default()
    };
    match file.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        Some(source) => ChatTemplate::new(
            source,
            &token("tokenizer.ggml.bos_token_id"),
            &token("tokenizer.ggml.eos_token_id"),
        ),
        None => from_folder,
    }
}

/// The GGUF file of the model at `path`: the path itself, or a folder's one GGUF file.
fn gguf_of(path: &Path) -> Option<PathBuf> {
    if is_gguf(path) {
        return Some(path.to_path_buf());
    }
    lone_gguf(path).ok().flatten()
}

/// The folder of the model at `path`, where its tokenizer and chat template are: `path`
/// itself, or for a GGUF file the folder holding it.
pub fn model_folder(path: &Path) -> &Path {
    match is_gguf(path) {
        true => path.parent().unwrap_or(Path::new(".")),
        false => path,
    }
}

/// Whether `path` names a GGUF file (by its extension).
fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        && !path.is_dir()
}

/// The GGUF file of a folder with `config.json`, one `*.gguf` and no safetensors weights;
/// `None` for any other folder. Two GGUF files are an error naming them (which to load is
/// the user's choice: pass the file).
fn lone_gguf(dir: &Path) -> error::Result<Option<PathBuf>> {
    let has = |name: &str| dir.join(name).exists();
    if !has("config.json") || has("model.safetensors") || has("model.safetensors.index.json") {
        return Ok(None);
    }
    let io = |error| ModelError::Io {
        path: dir.to_path_buf(),
        error,
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| is_gguf(p))
        .collect();
    found.sort();
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(ModelError::Unsupported(format!(
            "{} holds {} GGUF files ({}); pass the one to load",
            dir.display(),
            found.len(),
            found
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
