//! The engine's errors: what went wrong for the engine as a whole or for one request.

use crate::cache::CacheError;
use crate::constrain::ConstraintError;
use crate::error::GpuError;
use crate::model::ModelError;
use crate::runner::RunnerError;
use crate::sampling::SamplingError;
use crate::tokenizer::TokenizerError;

/// Why the engine, or one request, could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model's files: missing, malformed, or of an unsupported architecture.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The GPU: no adapter, out of memory, a lost device.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The tokenizer could not load, or could not encode a prompt.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Sampling parameters that cannot work (each names the parameter).
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The block manager refused an operation (a fault of the engine's own bookkeeping).
    #[error("KV cache bookkeeping: {0}")]
    Cache(#[from] CacheError),
    /// The model or its KV cache does not fit the device's memory: what was needed, and the
    /// options that would make it fit.
    #[error("the model does not fit the GPU: {0}")]
    DoesNotFit(String),
    /// The engine's configuration cannot work with this model or adapter: why.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The request cannot run (a prompt longer than the context, an empty prompt, token
    /// ids outside the vocabulary...): why.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request's constraint does not compile (or cannot be set up for this model).
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    /// The request was accepted but could not complete (it can never fit, or a step failed).
    #[error("request failed: {0}")]
    RequestFailed(String),
    /// A fault of the engine itself; every pending request has been failed with it.
    #[error("engine fault: {0}")]
    Internal(String),
    /// The model is still loading; requests are taken once it is.
    #[error("the model is still loading")]
    NotReady,
    /// The engine was closed or shut down and takes no more requests.
    #[error("the engine is shutting down and takes no more requests")]
    Closed,
    /// The engine cannot take requests: the reason (the model did not load, the device was
    /// lost, the engine thread stopped).
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
}

impl From<RunnerError> for EngineError {
    fn from(e: RunnerError) -> Self {
        match e {
            RunnerError::Model(e) => EngineError::Model(e),
            RunnerError::Gpu(e) => EngineError::Gpu(e),
            RunnerError::Tokenizer(e) => EngineError::Tokenizer(e),
            RunnerError::Config(why) => EngineError::Config(why),
            RunnerError::DoesNotFit(why) => EngineError::DoesNotFit(why),
        }
    }
}

/// The engine's results.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
