//! pagellm: Llama-family inference on any GPU wgpu reaches, around a paged KV cache.
//!
//! Layers, bottom up: [`gpu`] (context, pipelines, buffers, command batches), [`kernels`]
//! (WGSL compute kernels with typed launchers), [`pool`] (GPU storage of the KV blocks), and
//! [`reference`] (plain-Rust versions of every kernel, the oracle the GPU is tested against).

pub mod cache;
pub mod cache_engine;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gpu;
pub mod kernels;
pub mod model;
pub mod nn;
pub mod pool;
pub mod reference;
pub mod sampling;
pub mod server;
pub mod tokenizer;

pub use error::{GpuError, Result};
pub use gpu::GpuContext;
