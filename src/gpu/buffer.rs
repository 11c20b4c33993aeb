//! Buffer creation, upload and read-back, each checked against the adapter's limits and run
//! inside error scopes so a failure is an error, not a panic.

use super::GpuContext;
use crate::error::{GpuError, Result};
use wgpu::util::DeviceExt;

/// Usage of every storage buffer pagellm creates: bindable, writable from the queue, and
/// copyable in both directions (for read-back, swapping and splitting).
pub const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl GpuContext {
    fn check_size(&self, what: &str, bytes: u64) -> Result<()> {
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

    /// A storage buffer holding `data` (at least 4 bytes; an empty slice gives one zero word).
    pub fn upload<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if bytes.is_empty() || bytes.len() % 4 != 0 {
            let mut padded = bytes.to_vec();
            padded.resize(bytes.len().max(4).next_multiple_of(4), 0);
            return self.upload_bytes(label, &padded);
        }
        self.upload_bytes(label, bytes)
    }

    fn upload_bytes(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        self.check_size(label, bytes.len() as u64)?;
        self.scoped(
            &format!("uploading {label} ({} bytes)", bytes.len()),
            || {
                self.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some(label),
                        contents: bytes,
                        usage: STORAGE,
                    })
            },
        )
    }

    /// Copies `bytes` bytes from `offset` of `buffer` to the host, waiting for the GPU.
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        if offset % 4 != 0 || bytes % 4 != 0 || offset + bytes > buffer.size() {
            return Err(GpuError::Readback(format!(
                "range {offset}+{bytes} is unaligned or outside a buffer of {} bytes",
                buffer.size()
            )));
        }
        let staging = self.scoped("creating a read-back buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        self.scoped("copying for read-back", || {
            let mut enc = self.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, bytes);
            self.queue.submit([enc.finish()]);
        })?;
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let data = staging
            .get_mapped_range(..)
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .to_vec();
        staging.unmap();
        Ok(data)
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
