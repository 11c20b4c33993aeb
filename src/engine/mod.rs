//! The serving engine: sequence groups, the continuous-batching scheduler, and the step loop
//! that drives the KV cache manager, the cache engine and the GPU model.

pub mod config;
mod core;
pub mod output;
pub mod scheduler;
pub mod sequence;

pub use self::core::{Engine, EngineError, EngineStats, Prompt, RequestHandle};
pub use config::{EngineConfig, PreemptionMode};
pub use output::{
    CompletionOutput, FinishReason, RequestEvent, RequestId, RequestOutput, TokenLogprob,
};
