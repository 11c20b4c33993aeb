//! Formats, defined once and apart from containers and the GPU: the weight formats (GGML's
//! block formats and the float ones, [`ggml`]) and the KV cache's ([`kv`], with the
//! quantized blocks' codec in [`kv_blocks`]), each with its plain-Rust reference encoder and
//! decoder, the oracle the GPU kernels are tested against. Nothing here imports the GPU
//! layer, a checkpoint container or the engine; the GGUF reader, the kernels, the pool and
//! the engine's configuration all build on it.

pub mod ggml;
pub mod kv;
pub mod kv_blocks;

/// The format a weight is stored in on the GPU (GGML's name for the type).
pub use ggml::GgmlType as WeightDtype;
pub use ggml::{dequantize, quantize, GgmlType, QuantError};
pub use kv::{KvDtype, KvLayout, KvRotation, LayoutError};
