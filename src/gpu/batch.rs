//! A batch of GPU work recorded into one command encoder and submitted once. Kernel
//! launchers append dispatches to a batch; the engine submits one batch per step.

use super::bindings::{Arena, UNIFORM_ARENA_BYTES};
use super::profile::{Profiler, QueryBlock, TimingMethod, QUERIES_PER_SET};
use super::{CompiledKernel, GpuContext, KernelSource, PendingRead};
use crate::error::{GpuError, Result};
use std::time::Duration;
use web_time::Instant;

/// A storage binding: a whole buffer or a byte range of one.
#[derive(Clone, Copy, Debug)]
pub enum Bind<'a> {
    Whole(&'a wgpu::Buffer),
    Range {
        buffer: &'a wgpu::Buffer,
        offset: u64,
        size: u64,
    },
}

/// WebGPU's rule (which browsers enforce and wgpu's native backends do not): within one
/// dispatch, a storage binding the kernel may write must not overlap any other binding of
/// the same buffer. Checked whenever a bind group is created, on every platform, so that a
/// kernel that would fail in a browser fails its native tests too.
fn check_aliasing<'a>(name: &'static str, writable: &[bool], storage: &[Bind<'a>]) -> Result<()> {
    let span = |b: &Bind<'a>| -> (&'a wgpu::Buffer, u64, u64) {
        match *b {
            Bind::Whole(buffer) => (buffer, 0, buffer.size()),
            Bind::Range {
                buffer,
                offset,
                size,
            } => (buffer, offset, offset + size),
        }
    };
    for (i, a) in storage.iter().enumerate() {
        for (j, b) in storage.iter().enumerate().skip(i + 1) {
            let (wa, wb) = (
                writable.get(i) == Some(&true),
                writable.get(j) == Some(&true),
            );
            let ((ba, sa, ea), (bb, sb, eb)) = (span(a), span(b));
            if (wa || wb) && ba == bb && sa < eb && sb < ea {
                return Err(GpuError::invalid(
                    name,
                    format!(
                        "storage bindings {} and {} overlap in one buffer (bytes {sa}..{ea} and \
                         {sb}..{eb}) and {} is written: WebGPU forbids that",
                        i + 1,
                        j + 1,
                        if wa { i + 1 } else { j + 1 }
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl<'a> From<&'a wgpu::Buffer> for Bind<'a> {
    fn from(b: &'a wgpu::Buffer) -> Self {
        Bind::Whole(b)
    }
}

impl Bind<'_> {
    /// Bytes visible through the binding.
    pub fn size(&self) -> u64 {
        match *self {
            Bind::Whole(b) => b.size(),
            Bind::Range { size, .. } => size,
        }
    }

    fn resource(&self) -> wgpu::BindingResource<'_> {
        match *self {
            Bind::Whole(b) => b.as_entire_binding(),
            Bind::Range {
                buffer,
                offset,
                size,
            } => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset,
                size: wgpu::BufferSize::new(size),
            }),
        }
    }
}

/// Recorded GPU work not yet submitted.
pub struct Batch<'c> {
    ctx: &'c GpuContext,
    /// The compute pass consecutive dispatches share (declared before the encoder so that
    /// it ends first). WebGPU makes each dispatch of a compute pass its own usage scope,
    /// so wgpu still orders them by the buffers they touch; one pass instead of one per
    /// dispatch saves the host a pass's begin, end and tracking at record and submit time.
    /// Copies and timestamped dispatches end it.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: usize,
    /// Bind groups this batch created (the others came from the context's cache).
    bind_groups_created: usize,
    /// Persistent buffers holding the dispatches' parameter blocks (see `bindings.rs`),
    /// taken from the context's free list and written when the batch submits. The last one
    /// is being filled.
    uniforms: Vec<Arena>,
    /// [`Self::write`]s: destination, offset and the bytes' range in `staged`.
    writes: Vec<(wgpu::Buffer, u64, std::ops::Range<usize>)>,
    staged: Vec<u8>,
    /// Present while the context profiles (see `profile.rs`).
    timing: Option<Timing<'c>>,
    /// What the next dispatches are for, in a profile.
    site: Option<&'static str>,
}

/// A batch's share of the profile.
struct Timing<'c> {
    profiler: &'c Profiler,
    /// The phase the batch was created in; its figures go there.
    phase: &'static str,
    created: Instant,
    /// Host time the per-dispatch fallback spent waiting, which is not recording.
    flushing: Duration,
    /// Timestamps: the kernel (and site) of each timed pass, in order, and the query sets.
    names: Vec<String>,
    blocks: Vec<QueryBlock>,
}

impl<'c> Batch<'c> {
    pub fn new(ctx: &'c GpuContext, label: &str) -> Self {
        let encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
        Batch {
            ctx,
            pass: None,
            encoder: Some(encoder),
            dispatches: 0,
            bind_groups_created: 0,
            uniforms: Vec::new(),
            writes: Vec::new(),
            staged: Vec::new(),
            timing: ctx.profiler().map(|profiler| Timing {
                profiler,
                phase: profiler.current_phase(),
                created: Instant::now(),
                flushing: Duration::ZERO,
                names: Vec::new(),
                blocks: Vec::new(),
            }),
            site: None,
        }
    }

    /// Names what the following dispatches are for (`Some("lm head")`), so that a profile
    /// tells apart launches of one kernel from different places (`matmul @ lm head`);
    /// `None` ends it. Nothing changes unless the context profiles.
    pub fn profile_site(&mut self, site: Option<&'static str>) {
        self.site = site;
    }

    /// The name a dispatch of `kernel` is profiled under.
    fn profiled_name(&self, kernel: &'static str) -> String {
        match self.site {
            Some(site) => format!("{kernel} @ {site}"),
            None => kernel.to_string(),
        }
    }

    fn method(&self) -> Option<TimingMethod> {
        self.timing.as_ref().map(|t| t.profiler.method())
    }

    /// Writes `bytes` to `buffer` at `offset` (multiples of 4; the buffer needs
    /// `COPY_DST`) before this batch's commands run: they see the new bytes, every earlier
    /// submission the old ones. The engine rewrites its step metadata in place this way, so
    /// its bind groups stay valid across steps. Write before recording what reads the bytes:
    /// a batch profiled without timestamps submits dispatch by dispatch, and a write lands
    /// before the next of those submits.
    pub fn write(&mut self, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        let len = bytes.len() as u64;
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        if !offset.is_multiple_of(align) || !len.is_multiple_of(align) {
            return Err(GpuError::invalid(
                "buffer write",
                format!("offset {offset} and length {len} must be multiples of {align}"),
            ));
        }
        if offset + len > buffer.size() || !buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
            return Err(GpuError::invalid(
                "buffer write",
                format!(
                    "{len} bytes at {offset} do not fit a writable buffer of {} bytes",
                    buffer.size()
                ),
            ));
        }
        if len > 0 {
            let at = self.staged.len();
            self.staged.extend_from_slice(bytes);
            self.writes
                .push((buffer.clone(), offset, at..at + bytes.len()));
        }
        Ok(())
    }

    /// Records the copies that fill the arenas with the parameter blocks recorded so far and
    /// make the batch's [`Self::write`]s, from one staging buffer written at its creation,
    /// into an encoder of their own to be submitted together with, and ahead of, the
    /// batch's; returns it with the arenas, which go back to the free list once that submit
    /// is made.
    ///
    /// Copies rather than `Queue::write_buffer`: a queue write lands before the next submit
    /// of anyone on the queue, which may be another thread's batch submitted first, while
    /// these copies travel in this batch's own submit, exactly ahead of its commands.
    fn staged_copies(&mut self) -> (Result<Option<wgpu::CommandEncoder>>, Vec<Arena>) {
        let ctx = self.ctx;
        let arenas = std::mem::take(&mut self.uniforms);
        let writes = std::mem::take(&mut self.writes);
        let staged = std::mem::take(&mut self.staged);
        let mut parts: Vec<(&[u8], &wgpu::Buffer, u64)> = arenas
            .iter()
            .filter(|a| !a.image.is_empty())
            .map(|a| (a.image.as_slice(), &a.buffer, 0))
            .collect();
        parts.extend(writes.iter().map(|(b, o, r)| (&staged[r.clone()], b, *o)));
        let encoder = if parts.is_empty() {
            Ok(None)
        } else {
            Self::record_copies(ctx, &parts).map(Some)
        };
        drop(parts);
        (encoder, arenas)
    }

    fn record_copies(
        ctx: &GpuContext,
        parts: &[(&[u8], &wgpu::Buffer, u64)],
    ) -> Result<wgpu::CommandEncoder> {
        // Each part starts at a multiple of the copy alignment in the staging buffer.
        let align = wgpu::COPY_BUFFER_ALIGNMENT;
        let mut offsets = Vec::with_capacity(parts.len());
        let mut len = 0u64;
        for (p, ..) in parts {
            offsets.push(len);
            len = (len + p.len() as u64).next_multiple_of(align);
        }
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("batch writes (staging)"),
            size: len,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        let written = staging
            .slice(..)
            .get_mapped_range_mut()
            .map(|mut range| {
                for ((p, ..), &o) in parts.iter().zip(&offsets) {
                    range
                        .slice(o as usize..o as usize + p.len())
                        .copy_from_slice(p);
                }
            })
            .map_err(|e| GpuError::Internal {
                context: "writing kernel parameters".into(),
                message: e.to_string(),
            });
        staging.unmap();
        written?;
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("batch writes"),
            });
        for ((p, dst, dst_offset), &o) in parts.iter().zip(&offsets) {
            let bytes = (p.len() as u64).next_multiple_of(align);
            encoder.copy_buffer_to_buffer(&staging, o, dst, *dst_offset, bytes);
        }
        Ok(encoder)
    }

    /// Submits `encoder` behind the copies of its parameter blocks; `last` counts the
    /// batch as submitted for the bind group cache's ageing (a profiling flush does not,
    /// so that a batch flushed dispatch by dispatch ages the cache by one submit like any
    /// other).
    fn submit_encoder(
        &mut self,
        encoder: wgpu::CommandEncoder,
        last: bool,
    ) -> Result<wgpu::SubmissionIndex> {
        let ctx = self.ctx;
        let (params, arenas) = self.staged_copies();
        let submitted = params.and_then(|params| {
            ctx.scoped("submitting GPU work", || match params {
                Some(p) => ctx.queue.submit([p.finish(), encoder.finish()]),
                None => ctx.queue.submit([encoder.finish()]),
            })
        });
        // Only now may another batch fill these arenas: its copies come after this submit.
        ctx.bindings.return_arenas(arenas);
        if last {
            ctx.bindings.submitted();
        }
        submitted
    }

    /// Profiling without timestamps: submits what is recorded and waits for it; returns the
    /// time that took.
    fn flush(&mut self) -> Result<Duration> {
        let t = Instant::now();
        self.pass = None;
        if let Some(e) = self.encoder.take() {
            self.submit_encoder(e, false)?;
        }
        self.ctx.wait_untimed()?;
        let took = t.elapsed();
        if let Some(timing) = &mut self.timing {
            timing.flushing += took;
        }
        Ok(took)
    }

    /// Profiling with timestamps: the query set and indices of the next dispatch's pass.
    fn next_timestamps(&mut self, name: String) -> Result<Option<(wgpu::QuerySet, u32)>> {
        let ctx = self.ctx;
        let Some(timing) = self.timing.as_mut() else {
            return Ok(None);
        };
        let per_set = (QUERIES_PER_SET / 2) as usize;
        let j = timing.names.len();
        if j % per_set == 0 {
            let profiler = timing.profiler;
            let block = ctx.scoped("creating timestamp queries", || {
                profiler.query_block(&ctx.device)
            })?;
            timing.blocks.push(block);
        }
        timing.names.push(name);
        Ok(Some((
            timing.blocks[j / per_set].set.clone(),
            2 * (j % per_set) as u32,
        )))
    }

    /// Copies `bytes` into an arena's image; returns the arena's index in the batch and the
    /// offset the bytes will be at.
    fn uniform_slot(&mut self, bytes: &[u8]) -> Result<(usize, u64)> {
        let ctx = self.ctx;
        let len = bytes.len() as u64;
        if len > UNIFORM_ARENA_BYTES {
            return Err(GpuError::invalid(
                "kernel parameters",
                format!("a parameter block of {len} bytes exceeds {UNIFORM_ARENA_BYTES}"),
            ));
        }
        let align = u64::from(ctx.limits.min_uniform_buffer_offset_alignment).max(16);
        let fits =
            |a: &Arena| (a.image.len() as u64).next_multiple_of(align) + len <= UNIFORM_ARENA_BYTES;
        if !self.uniforms.last().is_some_and(fits) {
            let arena = ctx.bindings.take_arena(&ctx.device);
            self.uniforms.push(arena);
        }
        let index = self.uniforms.len() - 1;
        let image = &mut self.uniforms[index].image;
        let offset = (image.len() as u64).next_multiple_of(align);
        image.resize(offset as usize, 0);
        image.extend_from_slice(bytes);
        Ok((index, offset))
    }

    pub fn ctx(&self) -> &'c GpuContext {
        self.ctx
    }

    /// Number of compute dispatches recorded so far.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Number of bind groups recorded so far that were not in the context's cache.
    pub fn bind_groups_created(&self) -> usize {
        self.bind_groups_created
    }

    /// The encoder, for commands outside a compute pass: ends the shared pass.
    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder
            .get_or_insert_with(|| self.ctx.device.create_command_encoder(&Default::default()))
    }

    /// Records one dispatch of `kernel`. Binding 0 is the uniform `params`; `storage` fills
    /// bindings 1, 2, ... in order. `groups` is the workgroup grid.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        kernel: KernelSource,
        constants: &[(&'static str, f64)],
        params: &P,
        storage: &[Bind<'_>],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.ctx.limits.max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(GpuError::invalid(
                kernel.name,
                format!("workgroup grid {groups:?} exceeds the adapter's {max} per dimension"),
            ));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let pipeline = self.ctx.pipeline(kernel, constants)?;
        if storage.len() != pipeline.storage_bindings {
            return Err(GpuError::invalid(
                kernel.name,
                format!(
                    "{} storage buffers given, the kernel binds {}",
                    storage.len(),
                    pipeline.storage_bindings
                ),
            ));
        }
        let method = self.method();
        if method == Some(TimingMethod::SubmitPerDispatch) {
            // What was recorded before runs first, outside this kernel's time (and before
            // this dispatch's parameter block takes an arena: the flush hands arenas back).
            self.flush()?;
        }
        let (bind_group, offset) = self.bind(kernel.name, &pipeline, params, storage)?;
        let call = Call {
            pipeline: &pipeline.pipeline,
            bind_group: &bind_group,
            offsets: &[offset],
            groups,
        };
        match method {
            None => self.record_shared(call),
            Some(method) => self.record_profiled(kernel.name, method, call),
        }
    }

    /// The bind group of one dispatch, and the dynamic offset of its parameter block: the
    /// parameters go into a uniform arena, the group comes from the context's cache or is
    /// created for this set of buffers.
    fn bind<P: bytemuck::Pod>(
        &mut self,
        name: &'static str,
        pipeline: &CompiledKernel,
        params: &P,
        storage: &[Bind<'_>],
    ) -> Result<(wgpu::BindGroup, u32)> {
        let ctx = self.ctx;
        let (arena, offset) = self.uniform_slot(bytemuck::bytes_of(params))?;
        let params_buffer = &self.uniforms[arena].buffer;
        let params_size = std::mem::size_of::<P>() as u64;
        let (bind_group, created) = ctx.bindings.bind_group(
            &pipeline.layout,
            params_buffer,
            params_size,
            storage,
            || {
                check_aliasing(name, &pipeline.writable, storage)?;
                ctx.scoped(&format!("binding arguments of {name}"), || {
                    let params_binding = Bind::Range {
                        buffer: params_buffer,
                        offset: 0,
                        size: params_size,
                    };
                    let mut entries = vec![wgpu::BindGroupEntry {
                        binding: 0,
                        resource: params_binding.resource(),
                    }];
                    for (i, b) in storage.iter().enumerate() {
                        entries.push(wgpu::BindGroupEntry {
                            binding: i as u32 + 1,
                            resource: b.resource(),
                        });
                    }
                    ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(name),
                        layout: &pipeline.layout,
                        entries: &entries,
                    })
                })
            },
        )?;
        self.bind_groups_created += usize::from(created);
        Ok((bind_group, offset as u32))
    }

    /// Records `call` into the compute pass the batch's dispatches share, opening it first
    /// if a copy (or nothing yet) came before.
    fn record_shared(&mut self, call: Call<'_>) -> Result<()> {
        if self.pass.is_none() {
            let pass = self
                .encoder()
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("kernels"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            self.pass = Some(pass);
        }
        call.record(self.pass.as_mut().expect("just opened"));
        self.dispatches += 1;
        Ok(())
    }

    /// Profiling: `call` gets a pass of its own, for its timestamps or its own submit.
    fn record_profiled(
        &mut self,
        name: &'static str,
        method: TimingMethod,
        call: Call<'_>,
    ) -> Result<()> {
        let stamps = match method {
            TimingMethod::Timestamps => self.next_timestamps(self.profiled_name(name))?,
            _ => None,
        };
        let mut pass = self
            .encoder()
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(name),
                timestamp_writes: stamps.as_ref().map(|(set, i)| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(*i),
                        end_of_pass_write_index: Some(*i + 1),
                    }
                }),
            });
        call.record(&mut pass);
        drop(pass);
        self.dispatches += 1;
        if method == TimingMethod::SubmitPerDispatch {
            let took = self.flush()?;
            if let Some(t) = &self.timing {
                t.profiler.kernel(t.phase, &self.profiled_name(name), took);
            }
        }
        Ok(())
    }

    /// Records a buffer-to-buffer copy (distinct buffers only, as wgpu requires).
    pub fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        self.encoder()
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
    }

    /// Submits everything recorded, once. A profiled batch with timestamps also waits for
    /// its results (see `profile.rs`).
    pub fn submit(mut self) -> Result<wgpu::SubmissionIndex> {
        let ctx = self.ctx;
        self.pass = None;
        let stamps = self.resolve_timestamps();
        // Profiling without timestamps may have submitted everything already.
        let encoder = self
            .encoder
            .take()
            .unwrap_or_else(|| ctx.device.create_command_encoder(&Default::default()));
        let Some(t) = self.timing.take() else {
            return self.submit_encoder(encoder, true);
        };
        let recorded = Instant::now();
        let index = self.submit_encoder(encoder, true)?;
        let record = recorded
            .duration_since(t.created)
            .saturating_sub(t.flushing);
        t.profiler
            .host(Some(t.phase), record, recorded.elapsed(), Duration::ZERO);
        for (block, names) in stamps {
            // The work is submitted: a failed read of its timings loses only the timings.
            match ctx.complete_read(PendingRead::of_staging(block.staging.clone())) {
                Ok(bytes) => {
                    let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
                    for (pair, name) in ticks.chunks_exact(2).zip(&names) {
                        let ns = pair[1].saturating_sub(pair[0]) as f64 * t.profiler.period_ns();
                        t.profiler
                            .kernel(t.phase, name, Duration::from_nanos(ns as u64));
                    }
                    t.profiler.return_block(block);
                }
                Err(e) => tracing::warn!("reading kernel timestamps: {e}"),
            }
        }
        Ok(index)
    }

    /// Records the resolve and read-back of this batch's timestamps; returns each query
    /// block with the kernels it timed.
    fn resolve_timestamps(&mut self) -> Vec<(QueryBlock, Vec<String>)> {
        let Some(t) = self.timing.as_mut() else {
            return Vec::new();
        };
        let names = std::mem::take(&mut t.names);
        let blocks = std::mem::take(&mut t.blocks);
        let per_set = (QUERIES_PER_SET / 2) as usize;
        let mut out = Vec::new();
        for (block, names) in blocks.into_iter().zip(names.chunks(per_set)) {
            let queries = (names.len() * 2) as u32;
            let bytes = u64::from(queries) * 8;
            let encoder = self.encoder();
            encoder.resolve_query_set(&block.set, 0..queries, &block.resolve, 0);
            encoder.copy_buffer_to_buffer(&block.resolve, 0, &block.staging, 0, bytes);
            out.push((block, names.to_vec()));
        }
        out
    }
}

impl Drop for Batch<'_> {
    /// A batch dropped unsubmitted (an error while recording) hands its arenas back.
    fn drop(&mut self) {
        self.ctx.bindings.return_arenas(self.uniforms.drain(..));
    }
}

/// Splits `n` workgroups into an (x, y) grid under the per-dimension limit; kernels that use
/// it recover the linear index as `wg.y * num_workgroups.x + wg.x` and skip the overhang.
pub fn grid_2d(n: u32, max_per_dim: u32) -> [u32; 3] {
    if n <= max_per_dim {
        [n, 1, 1]
    } else {
        [max_per_dim, n.div_ceil(max_per_dim), 1]
    }
}

/// One dispatch, ready to record into a compute pass.
struct Call<'a> {
    pipeline: &'a wgpu::ComputePipeline,
    bind_group: &'a wgpu::BindGroup,
    offsets: &'a [u32],
    groups: [u32; 3],
}

impl Call<'_> {
    fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(self.pipeline);
        pass.set_bind_group(0, self.bind_group, self.offsets);
        let [x, y, z] = self.groups;
        pass.dispatch_workgroups(x, y, z);
    }
}
