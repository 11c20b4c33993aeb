//! Errors of the GPU layer ([`GpuError`]), which the kernels, the pool, the cache engine and
//! the forward pass return. Every other module has its own typed error (`ModelError`,
//! `CacheError`, `SamplingError`, `TokenizerError`, `EngineError`); the command line wraps
//! them in `anyhow`. The library never panics on input a user controls (environment variables,
//! kernel arguments, model files).

/// Errors from the GPU layer: adapter choice, device creation, wgpu validation and memory
/// errors, lost devices, and kernel arguments that do not describe a valid launch.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// An environment variable named a backend that does not exist.
    #[error("unknown GPU backend {name:?} in {var}: expected a comma-separated list of vulkan, metal, dx12, gl")]
    UnknownBackend { var: String, name: String },

    /// An environment variable named a power preference that does not exist.
    #[error("unknown power preference {name:?} in {var}: expected low, high or none")]
    UnknownPowerPreference { var: String, name: String },

    /// No adapter on the backends asked for (with a hint of what to install).
    #[error("no GPU adapter found for backends {backends}{hint}")]
    NoAdapter { backends: String, hint: String },

    /// No adapter's name contains the one asked for.
    #[error("no GPU adapter name contains {wanted:?} (from {var}); adapters found: {}", list_or_none(.available))]
    AdapterNotFound {
        var: String,
        wanted: String,
        available: Vec<String>,
    },

    /// The adapter refused to create a device.
    #[error("creating a device on {adapter} failed: {message}")]
    RequestDevice { adapter: String, message: String },

    /// wgpu found a call invalid (a fault of pagellm's, or limits it did not expect).
    #[error("GPU validation error while {context}: {message}")]
    Validation { context: String, message: String },

    /// The device ran out of memory.
    #[error("GPU out of memory while {context}")]
    OutOfMemory { context: String },

    /// The driver failed.
    #[error("GPU internal error while {context}: {message}")]
    Internal { context: String, message: String },

    /// A call that waits for the GPU where no thread may wait (a browser's): the work
    /// lands only once control returns to the event loop, so the wait would never end.
    #[error("{0} waits for the GPU, which this platform cannot do; use an awaiting call (Engine::step_async)")]
    CannotWait(String),

    /// The device was lost (a driver reset, a removed GPU).
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),

    /// A buffer larger than the adapter allows.
    #[error("{what} needs {needed} bytes but the adapter allows at most {limit} bytes")]
    TooLarge {
        what: String,
        needed: u64,
        limit: u64,
    },

    /// A kernel launch with arguments that do not describe a valid launch.
    #[error("invalid arguments to {kernel}: {message}")]
    InvalidArgument {
        kernel: &'static str,
        message: String,
    },

    /// Mapping a buffer to read it back failed.
    #[error("reading a buffer back from the GPU failed: {0}")]
    Readback(String),
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join("; ")
    }
}

impl GpuError {
    /// Shorthand for an [`GpuError::InvalidArgument`] raised by a kernel launcher.
    pub fn invalid(kernel: &'static str, message: impl Into<String>) -> Self {
        GpuError::InvalidArgument {
            kernel,
            message: message.into(),
        }
    }
}

/// The GPU layer's results.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;
