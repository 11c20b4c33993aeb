//! The GPU layer: context creation or adoption, pipelines, buffers, command batches.

mod batch;
mod bindings;
mod buffer;
mod context;
mod memory;
mod pipeline;
pub mod profile;
pub mod select;

pub use batch::{grid_2d, Batch, Bind};
pub use bindings::{BindGroupStats, STALE_AFTER, UNIFORM_ARENA_BYTES};
pub use buffer::{InFlightRead, PendingRead, Readback, STORAGE};
pub use context::{
    enumerate_adapters, AdapterReport, Capabilities, GpuContext, ALLOCATION_LIMIT_VAR,
    SHARED_GL_WAIT_SLICE, SPARE_BUFFERS,
};
pub use memory::{adapter_memory, DeviceMemory, MemorySource, DEVICE_MEMORY_VAR};
pub use pipeline::{reflect_layout, CompiledKernel, KernelSource, PRELUDE};
pub use profile::{Profiler, TimingMethod};
pub use select::AdapterRequest;
pub use wgpu::AdapterInfo;
