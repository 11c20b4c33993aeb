//! Buffer creation, upload and read-back, each checked against the adapter's limits and run
//! inside error scopes so a failure is an error, not a panic.

use super::{Batch, GpuContext};
use crate::error::{GpuError, Result};
use std::sync::{Arc, Condvar, Mutex};

/// Usage of every storage buffer pagellm creates: bindable, writable from the queue, and
/// copyable in both directions (for read-back, swapping and splitting).
pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl GpuContext {
    fn check_size(&self, what: &str, bytes: u64) -> Result<()> {
        if let Some(cap) = self.allocation_limit().filter(|&cap| bytes > cap) {
            return Err(GpuError::OutOfMemory {
                context: format!(
                    "creating {what} ({bytes} bytes; buffers over {cap} bytes are refused on \
                     purpose: {})",
                    super::context::ALLOCATION_LIMIT_VAR
                ),
            });
        }
        let limit = self.limits.max_buffer_size;
        if bytes > limit {
            return Err(GpuError::TooLarge {
                what: what.to_string(),
                needed: bytes,
                limit,
            });
        }
        Ok(())
    }

    /// A buffer of `usage` holding `parts` one after the other, written straight into its
    /// mapping at creation (no joined copy on the host). Unlike wgpu's `create_buffer_init`,
    /// a device that is lost or destroyed gives an error here instead of a panic.
    fn buffer_init_parts(
        &self,
        label: &str,
        parts: &[&[u8]],
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        self.check_health()?;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: len.max(4).next_multiple_of(4) as u64,
            usage,
            mapped_at_creation: true,
        });
        {
            let mut range = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| GpuError::Internal {
                    context: format!("writing {label}"),
                    message: e.to_string(),
                })?;
            let mut at = 0;
            for part in parts {
                range.slice(at..at + part.len()).copy_from_slice(part);
                at += part.len();
            }
        }
        buffer.unmap();
        Ok(buffer)
    }

    /// A zero-filled storage buffer of `bytes` bytes (rounded up to 4, at least 4).
    pub fn storage_buffer(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).next_multiple_of(4);
        self.check_size(label, size)?;
        self.scoped(&format!("creating buffer {label} ({size} bytes)"), || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        })
    }

    /// One storage buffer holding every part, each at an offset the adapter accepts for a
    /// storage binding (and at least one zero word for an empty part), written in one
    /// upload; returns the buffer and each part's (offset, size) in bytes.
    pub fn upload_sections(
        &self,
        label: &str,
        parts: &[&[u8]],
    ) -> Result<(wgpu::Buffer, Vec<(u64, u64)>)> {
        let align = self.limits.min_storage_buffer_offset_alignment.max(4) as usize;
        let mut bytes = Vec::new();
        let mut sections = Vec::with_capacity(parts.len());
        for part in parts {
            bytes.resize(bytes.len().next_multiple_of(align), 0);
            let size = part.len().max(4).next_multiple_of(4);
            sections.push((bytes.len() as u64, size as u64));
            bytes.extend_from_slice(part);
            bytes.resize(sections.last().map_or(0, |&(o, s)| (o + s) as usize), 0);
        }
        Ok((self.upload_bytes(label, &bytes)?, sections))
    }

    /// A storage buffer holding `data` (at least 4 bytes; an empty slice gives one zero word).
    pub fn upload<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().max(4).next_multiple_of(4), 0);
            return self.upload_bytes(label, &padded);
        }
        self.upload_bytes(label, bytes)
    }

    fn upload_bytes(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        self.upload_parts(label, &[bytes])
    }

    /// A storage buffer holding `parts` one after the other (zero-padded to whole words),
    /// without joining them on the host first.
    pub fn upload_parts(&self, label: &str, parts: &[&[u8]]) -> Result<wgpu::Buffer> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.check_size(label, len as u64)?;
        self.scoped(&format!("uploading {label} ({len} bytes)"), || {
            self.buffer_init_parts(label, parts, STORAGE)
        })?
    }

    /// Copies `bytes` bytes from `offset` of `buffer` to the host, waiting for the GPU.
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        let mut batch = Batch::new(self, "read-back");
        let pending = batch.read_later(buffer, offset, bytes)?;
        batch.submit()?;
        self.complete_read(pending)
    }

    /// Waits for the batch that recorded `pending` (it must have been submitted) and returns
    /// the bytes it copied.
    pub fn complete_read(&self, pending: PendingRead) -> Result<Vec<u8>> {
        let read = pending.begin();
        self.wait_for(&read)?;
        read.take()
    }

    /// Waits on this thread until `read` has landed. After the device is idle the map's
    /// callback may still be running on another thread that polled (contexts are shared
    /// between threads), so this also waits for the callback itself.
    pub fn wait_for(&self, read: &InFlightRead) -> Result<()> {
        if read.is_ready() {
            return Ok(());
        }
        self.wait()?;
        while !read.wait_landed(std::time::Duration::from_millis(1)) {
            self.poll()?;
        }
        Ok(())
    }

    /// Reads a whole buffer back as `T`s.
    pub fn read<T: bytemuck::Pod>(&self, buffer: &wgpu::Buffer) -> Result<Vec<T>> {
        let bytes = self.read_bytes(buffer, 0, buffer.size())?;
        let n = bytes.len() / std::mem::size_of::<T>();
        Ok(bytemuck::pod_collect_to_vec(
            &bytes[..n * std::mem::size_of::<T>()],
        ))
    }
}

/// A copy to the host recorded in a [`Batch`]; [`GpuContext::complete_read`] returns the
/// bytes once the batch has been submitted.
#[must_use = "complete the read after submitting its batch"]
#[derive(Debug)]
pub struct PendingRead {
    staging: Option<wgpu::Buffer>,
    /// Bytes to read from the start of `staging` (`None`: all of it).
    len: Option<u64>,
}

impl PendingRead {
    /// A read of a whole `MAP_READ` buffer that copies in the same batch have filled.
    pub(crate) fn of_staging(staging: wgpu::Buffer) -> Self {
        PendingRead {
            staging: Some(staging),
            len: None,
        }
    }

    /// Asks for the copied bytes (the batch that recorded the read must have been
    /// submitted): the map is requested now and lands while the device is polled (natively)
    /// or when the browser gets to it, without anyone waiting here.
    pub fn begin(self) -> InFlightRead {
        let Some(staging) = self.staging else {
            return InFlightRead {
                staging: None,
                len: 0,
                state: Arc::new((Mutex::new(Landing::landed()), Condvar::new())),
            };
        };
        let len = self.len.unwrap_or(staging.size());
        let state = Arc::new((Mutex::new(Landing::default()), Condvar::new()));
        let landed = state.clone();
        staging.map_async(wgpu::MapMode::Read, ..len, move |r| {
            let (landing, signal) = &*landed;
            let waker = landing.lock().ok().and_then(|mut s| {
                s.outcome = Some(r.map_err(|e| e.to_string()));
                s.waker.take()
            });
            signal.notify_all();
            if let Some(w) = waker {
                w.wake();
            }
        });
        InFlightRead {
            staging: Some(staging),
            len,
            state,
        }
    }
}

/// A read whose map has been requested ([`PendingRead::begin`]): ready once the map has
/// landed, which [`GpuContext::poll`] (natively) or the browser's event loop brings about.
#[must_use = "take the bytes once the read is ready (or drop it to cancel)"]
#[derive(Debug)]
pub struct InFlightRead {
    staging: Option<wgpu::Buffer>,
    len: u64,
    /// The map's outcome once it has landed, and its signal.
    state: Arc<(Mutex<Landing>, Condvar)>,
}

type MapOutcome = std::result::Result<(), String>;

/// A map's outcome once it has landed, and the task to wake then (see
/// [`InFlightRead::landed`]).
#[derive(Debug, Default)]
struct Landing {
    outcome: Option<MapOutcome>,
    waker: Option<std::task::Waker>,
}

impl Landing {
    fn landed() -> Self {
        Landing {
            outcome: Some(Ok(())),
            waker: None,
        }
    }
}

impl InFlightRead {
    /// Whether the map has landed (successfully or not).
    pub fn is_ready(&self) -> bool {
        self.state.0.lock().map_or(true, |s| s.outcome.is_some())
    }

    /// Resolves once the map has landed, for a driver that awaits (the browser's event loop
    /// lands maps by itself; natively something must poll the device meanwhile).
    pub fn landed(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            let Ok(mut s) = self.state.0.lock() else {
                return std::task::Poll::Ready(());
            };
            if s.outcome.is_some() {
                return std::task::Poll::Ready(());
            }
            s.waker = Some(cx.waker().clone());
            std::task::Poll::Pending
        })
    }

    /// Waits at most `timeout` for the map to land; whether it has.
    fn wait_landed(&self, timeout: std::time::Duration) -> bool {
        let (landing, signal) = &*self.state;
        let Ok(guard) = landing.lock() else {
            return true;
        };
        signal
            .wait_timeout_while(guard, timeout, |s| s.outcome.is_none())
            .map_or(true, |(s, _)| s.outcome.is_some())
    }

    /// The bytes, once ready; an error if the map failed or has not landed. The buffer is
    /// unmapped on every path, so a kept staging buffer can take the next copy.
    pub fn take(mut self) -> Result<Vec<u8>> {
        let Some(staging) = self.staging.take() else {
            return Ok(Vec::new());
        };
        let outcome = self
            .state
            .0
            .lock()
            .map_err(|_| GpuError::Readback("poisoned".into()))?
            .outcome
            .take();
        let data = match outcome {
            Some(Ok(())) => staging
                .get_mapped_range(..self.len)
                .map(|view| view.to_vec())
                .map_err(|e| GpuError::Readback(e.to_string())),
            Some(Err(e)) => Err(GpuError::Readback(e)),
            None => Err(GpuError::Readback(
                "the read was taken before its map landed".into(),
            )),
        };
        staging.unmap();
        data
    }
}

impl Drop for InFlightRead {
    /// A read dropped before it was taken is cancelled: unmapping cancels a map still
    /// pending, and frees a landed one, so the kept buffer can be used again.
    fn drop(&mut self) {
        if let Some(s) = self.staging.take() {
            s.unmap();
        }
    }
}

/// A mappable buffer kept for reading results back step after step, instead of a new
/// one per read: it grows (to a power of two) when a read needs more room and is mapped
/// only while [`GpuContext::complete_read`] copies out of it.
#[derive(Debug, Default)]
pub struct Readback {
    staging: Option<wgpu::Buffer>,
}

impl Readback {
    /// Records a copy of `bytes` bytes at `offset` of `buffer` into the kept buffer, as
    /// [`Batch::read_later`] does into a new one. Complete each read before recording the
    /// next one through the same `Readback`.
    pub fn read_later(
        &mut self,
        batch: &mut Batch,
        buffer: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<PendingRead> {
        check_read(buffer, offset, bytes)?;
        if bytes == 0 {
            return Ok(PendingRead {
                staging: None,
                len: None,
            });
        }
        let staging = match &self.staging {
            Some(s) if s.size() >= bytes => s.clone(),
            _ => {
                let size = bytes.next_power_of_two().max(256);
                let s = batch.ctx().staging_buffer(size)?;
                self.staging = Some(s.clone());
                s
            }
        };
        batch.copy(buffer, offset, &staging, 0, bytes);
        Ok(PendingRead {
            staging: Some(staging),
            len: Some(bytes),
        })
    }
}

fn check_read(buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<()> {
    if !offset.is_multiple_of(4) || !bytes.is_multiple_of(4) || offset + bytes > buffer.size() {
        return Err(GpuError::Readback(format!(
            "range {offset}+{bytes} is unaligned or outside a buffer of {} bytes",
            buffer.size()
        )));
    }
    Ok(())
}

impl GpuContext {
    /// A `MAP_READ` buffer of `bytes` that copies can fill.
    fn staging_buffer(&self, bytes: u64) -> Result<wgpu::Buffer> {
        self.scoped("creating a read-back buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
    }
}

impl Batch<'_> {
    /// Records a copy of `bytes` bytes at `offset` of `buffer` into a mappable buffer, so a
    /// step's read-back rides in the step's own submit.
    pub fn read_later(
        &mut self,
        buffer: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<PendingRead> {
        if bytes == 0 {
            return Ok(PendingRead {
                staging: None,
                len: None,
            });
        }
        check_read(buffer, offset, bytes)?;
        let staging = self.ctx().staging_buffer(bytes)?;
        self.copy(buffer, offset, &staging, 0, bytes);
        Ok(PendingRead {
            staging: Some(staging),
            len: None,
        })
    }
}
