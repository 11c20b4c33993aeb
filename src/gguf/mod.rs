//! GGUF support: reading llama.cpp's single-file checkpoints and keeping their weights in the
//! GGML block formats they are stored in: `file`, a reader of the file's header, metadata
//! and tensor directory; [`config`], the metadata as a model config; [`checkpoint`], the
//! tensors under their Hugging Face names; [`tokenizer`], the tokenizer its metadata
//! describes; and [`quant`], plain-Rust reference
//! (de)quantizers for the block formats, the oracle that the GPU's decoding
//! (`shaders/weight_blocks.wgsl`) and load-time quantization are tested against.

pub mod checkpoint;
pub mod config;
pub mod file;
pub mod quant;
pub mod tokenizer;
