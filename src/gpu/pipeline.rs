//! Compute pipelines compiled once per (kernel, override constants) and cached, so launchers
//! can ask for a pipeline on every dispatch without recompiling.

use super::GpuContext;
use crate::error::Result;
use std::collections::HashMap;
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

/// A compiled kernel: its pipeline and the layout of its bind group 0, looked up once
/// (`get_bind_group_layout` registers a new handle on every call).
#[derive(Debug)]
pub struct CompiledKernel {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

#[derive(Default)]
pub(crate) struct PipelineCache {
    map: Mutex<HashMap<Key, Arc<CompiledKernel>>>,
    modules: Mutex<HashMap<&'static str, Arc<wgpu::ShaderModule>>>,
}

impl GpuContext {
    /// The pipeline for `kernel` specialised by `constants` (WGSL `override`s), compiled on
    /// first use. Bind group layouts are derived from the shader (`layout: None`).
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
        let module = self.module(kernel)?;
        let pipeline = self.scoped(&format!("compiling kernel {}", kernel.name), || {
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.name),
                    layout: None,
                    module: &module,
                    entry_point: Some(kernel.name),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants,
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                })
        })?;
        let layout = pipeline.get_bind_group_layout(0);
        let pipeline = Arc::new(CompiledKernel { pipeline, layout });
        if let Ok(mut m) = self.pipelines.map.lock() {
            m.insert(key, pipeline.clone());
        }
        Ok(pipeline)
    }

    fn module(&self, kernel: KernelSource) -> Result<Arc<wgpu::ShaderModule>> {
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
        let module = self.scoped(&format!("parsing kernel {}", kernel.name), || {
            self.device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.name),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                })
        })?;
        let module = Arc::new(module);
        if let Ok(mut m) = self.pipelines.modules.lock() {
            m.insert(kernel.name, module.clone());
        }
        Ok(module)
    }
}
