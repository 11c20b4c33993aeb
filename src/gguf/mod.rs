//! GGUF support: reading llama.cpp's single-file checkpoints and keeping their weights in the
//! GGML block formats they are stored in. So far: [`file`], a reader of the file's header,
//! metadata and tensor directory, and [`quant`], plain-Rust reference (de)quantizers for
//! the block formats, the oracle that GPU kernels and load-time quantization are tested
//! against.

pub mod checkpoint;
pub mod config;
pub mod file;
pub mod quant;
