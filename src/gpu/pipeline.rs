//! Compute pipelines compiled once per (kernel, override constants) and cached, so launchers
//! can ask for a pipeline on every dispatch without recompiling.
//!
//! Bind group layouts are explicit, reflected from the kernel's WGSL: every group-0 binding
//! the entry point uses, uniforms with a dynamic offset (a batch's parameter blocks share
//! one persistent buffer per 64 KiB, see `bindings.rs`), storage buffers read-only unless
//! declared `read_write`. A derived layout (`layout: None`) cannot take dynamic offsets, and
//! without them a bind group would name a fresh parameter offset every step and could never
//! be reused.

use super::GpuContext;
use crate::error::{GpuError, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A WGSL kernel: the file under `shaders/` and its source. The entry point carries the
/// kernel's name; [`KernelSource::full_source`] prepends the shared prelude.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub name: &'static str,
    pub body: &'static str,
}

/// Helpers every kernel may use (storage-format unpacking), prepended to each kernel.
pub const PRELUDE: &str = include_str!("../../shaders/common.wgsl");

impl KernelSource {
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n{}", self.body)
    }
}

type Key = (&'static str, Vec<(&'static str, u64)>);

/// A compiled kernel: its pipeline and the layout of its bind group 0.
#[derive(Debug)]
pub struct CompiledKernel {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// Storage bindings the kernel takes after its parameter block (bindings 1..=n).
    pub storage_bindings: usize,
    /// Per storage binding (1..=n), whether the kernel may write through it.
    pub writable: Arc<[bool]>,
}

/// A parsed kernel: the module and its bind group layout, shared by every specialisation.
struct Module {
    module: wgpu::ShaderModule,
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    storage_bindings: usize,
    writable: Arc<[bool]>,
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    map: Mutex<HashMap<Key, Arc<CompiledKernel>>>,
    modules: Mutex<HashMap<&'static str, Arc<Module>>>,
    /// Pipelines compiled so far (a step that compiled one paid a one-time cost).
    compiled: AtomicU64,
    /// Nanoseconds spent compiling them (their modules' parsing included).
    compile_nanos: AtomicU64,
}

/// The group-0 bindings the entry point `entry` of `source` uses, as layout entries (see
/// the module docs). Binding 0 must be the uniform parameter block and the storage buffers
/// must follow it without gaps, as [`super::Batch::dispatch`] binds them.
pub fn reflect_layout(
    name: &'static str,
    source: &str,
    entry: &str,
) -> Result<Vec<wgpu::BindGroupLayoutEntry>> {
    let bad = |message: String| GpuError::invalid(name, message);
    let module = naga::front::wgsl::parse_str(source).map_err(|e| bad(e.emit_to_string(source)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| bad(e.emit_to_string(source)))?;
    let index = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| bad(format!("no entry point named {entry}")))?;
    let uses = info.get_entry_point(index);
    let mut entries = Vec::new();
    for (handle, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        if binding.group != 0 || uses[handle].is_empty() {
            continue;
        }
        let ty = match var.space {
            naga::AddressSpace::Uniform => wgpu::BufferBindingType::Uniform,
            naga::AddressSpace::Storage { access } => wgpu::BufferBindingType::Storage {
                read_only: !access.contains(naga::StorageAccess::STORE),
            },
            other => {
                return Err(bad(format!(
                    "binding {} is in address space {other:?}; kernels bind buffers only",
                    binding.binding
                )))
            }
        };
        entries.push(wgpu::BindGroupLayoutEntry {
            binding: binding.binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: ty == wgpu::BufferBindingType::Uniform,
                min_binding_size: None,
            },
            count: None,
        });
    }
    entries.sort_by_key(|e| e.binding);
    for (i, e) in entries.iter().enumerate() {
        let uniform = matches!(
            e.ty,
            wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                ..
            }
        );
        if e.binding != i as u32 || uniform != (i == 0) {
            return Err(bad(format!(
                "bindings must be the uniform parameters at 0 and storage buffers at 1, 2, ... \
                 without gaps; binding {} breaks that",
                e.binding
            )));
        }
    }
    if entries.is_empty() {
        return Err(bad("the kernel uses no parameter block at binding 0".into()));
    }
    Ok(entries)
}

impl GpuContext {
    /// The pipeline for `kernel` specialised by `constants` (WGSL `override`s), compiled on
    /// first use, with the bind group layout reflected from its source.
    pub fn pipeline(
        &self,
        kernel: KernelSource,
        constants: &[(&'static str, f64)],
    ) -> Result<Arc<CompiledKernel>> {
        let key: Key = (
            kernel.name,
            constants.iter().map(|&(k, v)| (k, v.to_bits())).collect(),
        );
        if let Some(p) = self
            .pipelines
            .map
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(p);
        }
        let started = web_time::Instant::now();
        let module = self.module(kernel)?;
        let pipeline = self.scoped(&format!("compiling kernel {}", kernel.name), || {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.name),
                    layout: Some(&module.pipeline_layout),
                    module: &module.module,
                    entry_point: Some(kernel.name),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants,
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                })
        })?;
        let pipeline = Arc::new(CompiledKernel {
            pipeline,
            layout: module.layout.clone(),
            storage_bindings: module.storage_bindings,
            writable: module.writable.clone(),
        });
        if let Ok(mut m) = self.pipelines.map.lock() {
            m.insert(key, pipeline.clone());
        }
        self.pipelines.compiled.fetch_add(1, Ordering::Relaxed);
        let took = started.elapsed();
        self.pipelines.compile_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if let Some(p) = self.profiler() {
            p.compile(took);
        }
        Ok(pipeline)
    }

    /// Pipelines this context has compiled so far: a step that compiled one paid a one-time
    /// cost, which a timing of its row count should not count.
    pub fn pipelines_compiled(&self) -> u64 {
        self.pipelines.compiled.load(Ordering::Relaxed)
    }

    /// Time this context has spent compiling pipelines, their shader modules included: a
    /// one-time cost per kernel variant that a step's time should not count (a CPU adapter
    /// takes tens of milliseconds per variant).
    pub fn compile_time(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.pipelines.compile_nanos.load(Ordering::Relaxed))
    }

    fn module(&self, kernel: KernelSource) -> Result<Arc<Module>> {
        if let Some(m) = self
            .pipelines
            .modules
            .lock()
            .ok()
            .and_then(|m| m.get(kernel.name).cloned())
        {
            return Ok(m);
        }
        let source = kernel.full_source();
        let entries = reflect_layout(kernel.name, &source, kernel.name)?;
        let writable: Arc<[bool]> = entries[1..]
            .iter()
            .map(|e| {
                matches!(
                    e.ty,
                    wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        ..
                    }
                )
            })
            .collect();
        let module = self.scoped(&format!("parsing kernel {}", kernel.name), || {
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.name),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
            let layout = self
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(kernel.name),
                    entries: &entries,
                });
            let pipeline_layout =
                self.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(kernel.name),
                        bind_group_layouts: &[Some(&layout)],
                        immediate_size: 0,
                    });
            Module {
                module,
                layout,
                pipeline_layout,
                storage_bindings: entries.len() - 1,
                writable,
            }
        })?;
        let module = Arc::new(module);
        if let Ok(mut m) = self.pipelines.modules.lock() {
            m.insert(kernel.name, module.clone());
        }
        Ok(module)
    }
}
