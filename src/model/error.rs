//! Errors of model loading: every message names the file or tensor and what is wrong.

use crate::error::GpuError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("{path} is not valid JSON: {message}")]
    Json { path: PathBuf, message: String },

    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },

    #[error("unknown architecture: model_type {model_type:?} (architectures {architectures:?}); supported: {supported}")]
    UnknownArchitecture {
        model_type: String,
        architectures: Vec<String>,
        supported: String,
    },

    #[error("unsupported model setting: {0}")]
    Unsupported(String),

    #[error("{path} is not a valid safetensors file (truncated or malformed?): {message}")]
    Malformed { path: PathBuf, message: String },

    /// A GGUF file that is truncated, malformed, or holds what pagellm cannot read (a tensor
    /// type it has no decoder for).
    #[error("{path}: cannot read it as a GGUF model: {message}")]
    Gguf { path: PathBuf, message: String },

    #[error("no weights found in {0}: expected model.safetensors or model.safetensors.index.json")]
    NoWeights(PathBuf),

    #[error("tensor {name} is missing from the checkpoint")]
    MissingTensor { name: String },

    #[error("the checkpoint has tensors this architecture does not use: {}", .names.join(", "))]
    UnexpectedTensors { names: Vec<String> },

    #[error("tensor {name} has shape {found:?}, but config.json implies {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("tensor {name} has dtype {dtype}; supported: F32, F16, BF16 (safetensors); also Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (GGUF)")]
    Dtype { name: String, dtype: String },

    #[error("tensor {name} is stored as {dtype} but {other} is {other_dtype}: all weights must share one dtype")]
    MixedDtypes {
        name: String,
        dtype: String,
        other: String,
        other_dtype: String,
    },

    #[error("the tokenizer has {tokenizer} tokens but the model's vocabulary has only {model}")]
    VocabMismatch { tokenizer: usize, model: usize },

    #[error(transparent)]
    Gpu(#[from] GpuError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
