//! pagellm: Llama-family inference on any GPU wgpu reaches, around a paged KV cache.
//!
//! Modules, bottom up:
//! - [`gpu`]: the wgpu context, pipelines, buffers and command batches;
//! - [`nn`]: plain definitions of the network's parts (activations, rotary embeddings);
//! - [`kernels`]: the WGSL compute kernels with typed launchers;
//! - [`reference`]: plain-Rust versions of every kernel, the oracle the GPU is tested
//!   against;
//! - [`gguf`]: GGUF checkpoints; so far, reference (de)quantizers of GGML block formats;
//! - [`pool`]: GPU storage of the KV blocks (f16, f32, int8, int4);
//! - [`cache`]: the block manager (block tables, reference counts, copy-on-write, swap,
//!   prefix caching and its host tier), plain Rust; [`cache_engine`] carries out its plans
//!   on the GPU; [`disk_tier`] keeps prefix blocks in files across restarts;
//! - [`model`]: checkpoints, the architecture registry, the GPU model and its forward pass,
//!   and a plain-Rust reference forward pass;
//! - [`tokenizer`] and [`sampling`]: text in and out, and the next token from logits;
//! - [`constrain`]: constrained decoding (JSON schemas, regexes, choices, grammars) as
//!   per-sequence token masks, with llguidance;
//! - [`engine`]: requests, the scheduler and the step loop; [`eval`]: teacher-forced
//!   scoring (perplexity, KL against a baseline);
//! - [`server`]: the OpenAI-compatible HTTP server;
//! - [`spec`]: speculative decoding's proposers and verification, plain Rust;
//! - [`error`]: the GPU layer's typed errors (each other module has its own).

pub mod cache;
pub mod cache_engine;
pub mod constrain;
pub mod disk_tier;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod gpu;
#[cfg(feature = "native")]
pub mod handle;
pub mod kernels;
pub mod model;
pub mod nn;
pub mod pool;
pub mod reference;
pub mod sampling;
#[cfg(feature = "server")]
pub mod server;
pub mod spec;
pub mod tokenizer;

pub use engine::{
    CompletionOutput, Engine, EngineConfig, EngineError as Error, EngineStats, FinishReason,
    Prompt, Request, RequestEvent as Event, RequestId, RequestOutput as Output,
};
pub use error::GpuError;
pub use gpu::GpuContext;
#[cfg(feature = "native")]
pub use handle::{
    EngineBuilder, EngineHandle, EngineState, ModelInfo, Notice, RequestStream, StatsSnapshot,
};
pub use sampling::SamplingParams;
