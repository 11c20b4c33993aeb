//! The serving engine: sequence groups, the continuous-batching scheduler, and the step loop
//! that drives the KV cache manager, the cache engine and the GPU model. The scheduler and
//! the sequence types are plain Rust and run without a GPU (see `scheduler`).

mod advance;
mod budget;
mod core;
mod draft;
mod error;
mod intake;
mod json_request;
mod local;
pub mod output;
mod pacing;
mod prefix;
mod propose;
mod recover;
mod recovery;
pub mod request;
pub mod scheduler;
pub mod sequence;
mod step;
mod step_batch;
mod tiers;

pub use self::core::{Engine, EngineStats, HostTime, StepThroughput};
pub use crate::config::{EngineConfig, PreemptionMode, SpeculativeConfig, MAX_SPECULATIVE_ROWS};
pub use budget::PoolResize;
pub use draft::DraftStats;
pub use error::{EngineError, Result};
#[cfg(feature = "native")]
pub(crate) use intake::Prepared;
pub use intake::{Intake, Request};
pub use json_request::{JsonRequest, OneOrMany};
pub use local::{LocalEngine, StepReport};
pub use output::{
    CompletionOutput, FinishReason, RequestEvent, RequestId, RequestOutput, TokenLogprob,
};
pub use pacing::{PacingStats, StepPacer};
pub use recovery::{DeviceLostFn, DeviceStats, MAX_CONSECUTIVE_LOSSES};
pub use request::{Prompt, RequestHandle};
pub use step::StepInFlight;
