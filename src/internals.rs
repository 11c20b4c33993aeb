//! The engine's parts, bottom up, for kernel research, benchmarks and this project's
//! own tests; nothing here is a stable API. (The parts live in folders of their own beside
//! this file; `lib.rs` imports them under their short names for the rest of the crate.)
//!
//! - [`formats`]: the weight and KV formats with their plain-Rust reference encoders and
//!   decoders (no GPU, no containers);
//! - [`gpu`]: the wgpu context, pipelines, buffers and command batches; [`error`]: its
//!   typed errors;
//! - [`nn`]: plain definitions of the network's parts (activations, rotary
//!   embeddings);
//! - [`kernels`]: the WGSL compute kernels with typed launchers, and the kernel plan;
//! - [`reference`](mod@reference): plain-Rust versions of every kernel, the oracle the GPU is tested
//!   against;
//! - [`gguf`]: GGUF files: the reader, the metadata as a config, the tokenizer;
//! - [`pool`]: GPU storage of the KV blocks (f16, f32, int8, int4);
//! - [`cache`]: the block manager (block tables, reference counts, copy-on-write, swap,
//!   prefix caching and its host tier), plain Rust; [`cache_engine`] carries out its
//!   plans on the GPU; [`disk_tier`] keeps prefix blocks in files across restarts;
//! - [`mapped`]: where a model comes from (a path, or files in memory) and a file's bytes
//!   (memory-mapped natively);
//! - [`model`]: checkpoints, the architecture registry, the GPU model and its forward
//!   pass, and a plain-Rust reference forward pass;
//! - [`tokenizer`] and [`sampling`]: text in and out, and the next token from logits;
//! - [`constrain`]: constrained decoding (JSON schemas, regexes, choices, grammars) as
//!   per-sequence token masks, with llguidance;
//! - [`spec`]: speculative decoding's proposers and step-cost model, plain Rust;
//! - [`runner`]: a model with its KV pools and workspace, executing step plans (the
//!   engine, the draft model and the scorer each have one), and the pools' sizing;
//! - [`config`]: the engine's options (plain data); [`faults`]: the switch that destroys
//!   the device on purpose, to check recovery from a lost device;
//! - [`engine`]: requests, the scheduler and the step loop; [`eval`]: teacher-forced
//!   scoring (perplexity, KL divergence against a baseline).

#[path = "cache/mod.rs"]
pub mod cache;
#[path = "cache_engine.rs"]
pub mod cache_engine;
#[path = "config.rs"]
pub mod config;
#[path = "constrain/mod.rs"]
pub mod constrain;
#[path = "disk_tier/mod.rs"]
pub mod disk_tier;
#[path = "engine/mod.rs"]
pub mod engine;
#[path = "error.rs"]
pub mod error;
#[path = "eval.rs"]
pub mod eval;
#[path = "faults.rs"]
pub mod faults;
#[path = "formats/mod.rs"]
pub mod formats;
#[path = "gguf/mod.rs"]
pub mod gguf;
#[path = "gpu/mod.rs"]
pub mod gpu;
#[path = "kernels/mod.rs"]
pub mod kernels;
#[path = "mapped.rs"]
pub mod mapped;
#[path = "model/mod.rs"]
pub mod model;
#[path = "nn/mod.rs"]
pub mod nn;
#[path = "pool/mod.rs"]
pub mod pool;
#[path = "reference/mod.rs"]
pub mod reference;
#[path = "runner/mod.rs"]
pub mod runner;
#[path = "sampling/mod.rs"]
pub mod sampling;
#[path = "spec/mod.rs"]
pub mod spec;
#[path = "tokenizer/mod.rs"]
pub mod tokenizer;
