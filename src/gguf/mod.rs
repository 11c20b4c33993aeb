//! GGUF support: reading llama.cpp's single-file checkpoints, whose weights stay in the GGML
//! block formats they are stored in: `file`, a reader of the file's header, metadata and
//! tensor directory; [`config`], the metadata as a model config; [`tokenizer`], the tokenizer
//! its metadata describes. The block formats and their reference (de)quantizers are
//! `crate::formats::ggml` (also here as [`quant`]); the file as a model checkpoint is
//! `crate::model::gguf`.

pub mod config;
pub mod file;
pub mod tokenizer;

/// The GGML block formats (`crate::formats::ggml`), under their old path.
pub use crate::formats::ggml as quant;
