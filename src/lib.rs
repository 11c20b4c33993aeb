//! pagellm runs decoder-only language models (Llama, Mistral, Qwen, Gemma, Phi-3) on any
//! GPU that wgpu reaches, around a paged KV cache in the manner of vLLM's PagedAttention
//! (Kwon et al., SOSP 2023): fixed-size KV blocks in GPU storage buffers, a block table per
//! sequence, shared blocks with copy-on-write, preemption by swapping or recomputation, and
//! prefix caching over device, host and disk tiers.
//!
//! An application embeds the engine through [`EngineHandle`]: the engine runs on a thread
//! of its own (on its own device or on the application's, see [`EngineBuilder`]), requests
//! are submitted from any thread, and each request's tokens stream back as [`Event`]s,
//! read blocking, with a timeout, or awaited. This program streams a completion from the
//! small model shipped in the repository (`examples/embed.rs`, the example of the README):
//!
#![doc = concat!("```\n", include_str!("../examples/embed.rs"), "```")]
//!
//! [`Engine`] is the same engine without the thread, stepped by its caller (tests and
//! benchmarks do). Everything else the crate holds (kernels, the block manager, the model
//! code) is in [`internals`], for kernel research, benchmarks and this project's own tests,
//! with no promise of stability. With the `server` feature, `server` is the
//! OpenAI-compatible HTTP server that `pagellm serve` runs.
//!
//! Features: `native` (default) holds what a browser lacks (threads, files, memory maps,
//! the disk tier); `server` adds the HTTP server (tokio, axum).

// Every function fits on a screen (clippy.toml sets the limit: 80 lines of code).
#![warn(clippy::too_many_lines)]

pub mod internals;

#[cfg(feature = "native")]
mod handle;
#[cfg(feature = "server")]
pub mod server;

// Inside the crate the parts keep their short paths (`crate::cache`, ...).
use internals::{
    cache, cache_engine, config, constrain, disk_tier, engine, error, faults, formats, gguf, gpu,
    kernels, mapped, model, nn, pool, reference, runner, sampling, spec, tokenizer,
};

pub use constrain::StructuredOutput;
pub use disk_tier::RecordStore;
pub use engine::{
    CompletionOutput, DeviceLostFn, Engine, EngineConfig, EngineError as Error, EngineStats,
    FinishReason, Intake, JsonRequest, LocalEngine, PoolResize, PreemptionMode, Prompt, Request,
    RequestEvent as Event, RequestHandle, RequestId, RequestOutput as Output, SpeculativeConfig,
    StepInFlight, StepReport, TokenLogprob,
};
pub use error::GpuError;
pub use faults::DeviceLossInjection;
pub use gpu::{
    enumerate_adapters, AdapterReport, AdapterRequest, DeviceMemory, GpuContext, MemorySource,
};
#[cfg(feature = "native")]
pub use handle::{
    EngineBuilder, EngineHandle, EngineState, ModelInfo, Notice, RequestStream, StatsSnapshot,
};
pub use kernels::WeightDtype;
pub use mapped::{MemoryFiles, ModelSource};
pub use model::open_chat_template;
pub use pool::{KvDtype, KvRotation, PoolSize};
pub use sampling::SamplingParams;
pub use tokenizer::{ChatMessage, ChatTemplate, ChatTemplateError, Tokenizer};
/// The wgpu this crate is built on, for applications that share their device with it.
pub use wgpu;

/// The parts of [`EngineStats`]: the KV cache, the scheduler, the tiers, the draft model,
/// the weights.
pub mod stats {
    pub use crate::cache::{CacheStats, PoolStats, TierStats};
    pub use crate::disk_tier::DiskStats;
    pub use crate::engine::scheduler::{CostEstimate, PreemptionCosts, SchedulerStats};
    pub use crate::engine::{DeviceStats, DraftStats, HostTime, StepThroughput};
    pub use crate::model::gpu::WeightBytes;
    pub use crate::pool::KvLayout;
}
