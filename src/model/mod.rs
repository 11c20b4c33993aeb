//! Decoder-only models from Hugging Face folders: `config.json` ([`config`]) read through the
//! architecture registry ([`arch`]: Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3,
//! and the mixtures of experts Mixtral, Qwen3-MoE and gpt-oss),
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

use crate::mapped::{FileBytes, Folder, ModelSource};
use crate::tokenizer::{ChatTemplate, ChatTemplateError, Tokenizer, TokenizerError};
use std::path::{Path, PathBuf};

/// A validated model: its config and memory-mapped weights.
#[derive(Debug)]
pub struct ModelFiles {
    /// The model's folder (for files in memory, their name), where its tokenizer is.
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub checkpoint: Checkpoint,
}

/// Where a model's weights are, in its folder.
enum Weights {
    /// `model.safetensors`, or the shards of `model.safetensors.index.json`.
    Safetensors,
    /// One GGUF file beside `config.json` (the folder's config wins).
    GgufWithConfig(String),
    /// One GGUF file and no `config.json` (files in memory only; on disk, pass the file).
    GgufAlone(String),
}

impl ModelFiles {
    /// Reads a model and checks every tensor's presence, shape and dtype before anything is
    /// uploaded. The model is a Hugging Face folder (`config.json` and safetensors weights),
    /// a GGUF file (config from its metadata), or a folder with `config.json` and one GGUF
    /// file and no safetensors (config from the folder, weights from the file), on disk or
    /// as files in memory ([`crate::mapped::MemoryFiles`]; there one GGUF file alone also
    /// serves). `dir` is the folder, where the tokenizer is looked for.
    pub fn open(model: impl Into<ModelSource>) -> error::Result<Self> {
        let source = model.into();
        let folder = source.folder();
        let (config, checkpoint) = match source.gguf_file() {
            Some(path) => gguf::open(path, None)?,
            None => open_folder(&source, folder)?,
        };
        spec::validate(&config, &checkpoint)?;
        Ok(ModelFiles {
            dir: folder.display_path(),
            config,
            checkpoint,
        })
    }
}

/// The config and tensors of a model folder (on disk or in memory).
fn open_folder(
    source: &ModelSource,
    folder: Folder<'_>,
) -> error::Result<(ModelConfig, Checkpoint)> {
    if let (ModelSource::Path(path), Folder::Disk(dir)) = (source, folder) {
        if !dir.is_dir() {
            return Err(ModelError::Io {
                path: path.clone(),
                error: std::io::Error::new(std::io::ErrorKind::NotFound, "not a model folder"),
            });
        }
    }
    let open_gguf = |name: &str, config: Option<ModelConfig>| {
        let bytes = folder.open(name).map_err(|error| ModelError::Io {
            path: folder.path(name),
            error,
        })?;
        gguf::open_bytes(&folder.path(name), bytes, config)
    };
    match weights_of(source, folder)? {
        Weights::GgufAlone(name) => open_gguf(&name, None),
        Weights::GgufWithConfig(name) => open_gguf(&name, Some(ModelConfig::from_folder(folder)?)),
        Weights::Safetensors => {
            let config = ModelConfig::from_folder(folder)?;
            let mut checkpoint = Checkpoint::open_in(folder)?;
            arch::prepare_checkpoint(&config, &mut checkpoint)?;
            Ok((config, checkpoint))
        }
    }
}

/// Where a folder's weights are. Two GGUF files are an error naming them (which to load is
/// the user's choice: pass the file).
fn weights_of(source: &ModelSource, folder: Folder<'_>) -> error::Result<Weights> {
    let has = |name: &str| folder.exists(name);
    if has("model.safetensors") || has("model.safetensors.index.json") {
        return Ok(Weights::Safetensors);
    }
    let names = folder.file_names().map_err(|error| ModelError::Io {
        path: folder.display_path(),
        error,
    })?;
    let mut found: Vec<String> = names
        .into_iter()
        .filter(|n| crate::mapped::is_gguf_file(Path::new(n)))
        .collect();
    let in_memory = matches!(source, ModelSource::Memory(_));
    match (found.len(), has("config.json")) {
        (1, true) => Ok(Weights::GgufWithConfig(found.remove(0))),
        (1, false) if in_memory => Ok(Weights::GgufAlone(found.remove(0))),
        (n, true) if n > 1 => Err(ModelError::Unsupported(format!(
            "{} holds {n} GGUF files ({}); pass the one to load",
            folder.display_path().display(),
            found.join(", ")
        ))),
        _ => Ok(Weights::Safetensors),
    }
}

/// The GGUF file of a model, if its weights are one: the file the source names, or the
/// folder's one GGUF file; with its bytes and how messages name it.
fn gguf_of(source: &ModelSource) -> Option<(PathBuf, FileBytes)> {
    if let Some(path) = source.gguf_file() {
        return crate::mapped::open(path)
            .ok()
            .map(|b| (path.to_path_buf(), b));
    }
    let folder = source.folder();
    match weights_of(source, folder).ok()? {
        Weights::GgufAlone(name) | Weights::GgufWithConfig(name) => {
            Some((folder.path(&name), folder.open(&name).ok()?))
        }
        Weights::Safetensors => None,
    }
}

/// The tokenizer of a model (as [`ModelFiles::open`] takes one): the folder's
/// `tokenizer.json` where there is one (the model's own), else the one the GGUF file's
/// metadata describes ([`crate::gguf::tokenizer`]).
pub fn open_tokenizer(model: impl Into<ModelSource>) -> Result<Tokenizer, TokenizerError> {
    let source = model.into();
    let folder = source.folder();
    if folder.exists("tokenizer.json") {
        return Tokenizer::from_folder(folder);
    }
    let Some((path, bytes)) = gguf_of(&source) else {
        return Tokenizer::from_folder(folder);
    };
    let fail = |message: String| TokenizerError::Gguf {
        path: path.clone(),
        message,
    };
    let file = crate::gguf::file::GgufFile::parse(bytes).map_err(fail)?;
    crate::gguf::tokenizer::tokenizer(&file).map_err(fail)
}

/// The chat template of a model: the folder's (`chat_template.jinja` or
/// `tokenizer_config.json`) where it has one, else a GGUF file's `tokenizer.chat_template`,
/// with the file's BOS and EOS tokens.
pub fn open_chat_template(
    model: impl Into<ModelSource>,
) -> Result<ChatTemplate, ChatTemplateError> {
    let source = model.into();
    let from_folder = ChatTemplate::from_folder(source.folder());
    let Err(ChatTemplateError::Missing { .. }) = &from_folder else {
        return from_folder;
    };
    let Some((_, bytes)) = gguf_of(&source) else {
        return from_folder;
    };
    let file = crate::gguf::file::GgufFile::parse(bytes).map_err(ChatTemplateError::Io)?;
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
