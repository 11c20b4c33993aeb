//! Decoder-only models from Hugging Face folders: `config.json` ([`config`]) read through the
//! architecture registry ([`arch`]: Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3),
//! safetensors weights ([`checkpoint`]) validated against the tensor list the config implies
//! ([`spec`]), a plain-Rust reference forward pass ([`reference`]) and the GPU model
//! ([`gpu`]), both following the architecture's recipe; the GPU forward pass ([`forward`])
//! and one step of it over a flat batch ([`step`]).

pub mod arch;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod forward;
pub mod gpu;
pub mod reference;
pub mod spec;
pub mod step;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::{Architecture, ModelConfig};
pub use error::ModelError;

use std::path::{Path, PathBuf};

/// A validated model folder: its config and memory-mapped weights.
#[derive(Debug)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub checkpoint: Checkpoint,
}

impl ModelFiles {
    /// Reads `config.json`, maps the safetensors files and checks every tensor's presence,
    /// shape and dtype before anything is uploaded.
    pub fn open(dir: &Path) -> error::Result<Self> {
        if !dir.is_dir() {
            return Err(ModelError::Io {
                path: dir.to_path_buf(),
                error: std::io::Error::new(std::io::ErrorKind::NotFound, "not a model folder"),
            });
        }
        let config = ModelConfig::from_dir(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        spec::validate(&config, &checkpoint)?;
        Ok(ModelFiles {
            dir: dir.to_path_buf(),
            config,
            checkpoint,
        })
    }
}
