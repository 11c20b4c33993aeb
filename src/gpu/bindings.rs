//! What recording a dispatch reuses from earlier batches instead of creating anew: the
//! buffers that hold parameter blocks (uniform arenas) and the bind groups themselves.
//!
//! A batch copies each dispatch's parameter block into the host image of an arena taken
//! from the context's free list; when it submits, one staging buffer carries the images
//! and copies into the arenas run ahead of the batch's own commands, in the same submit
//! (`Batch::staged_copies`). The queue runs submissions in order, so an arena goes back on
//! the free list as soon as its batch is submitted, while that batch may still be running.
//!
//! Bind groups are cached by what they bind: the kernel's layout, the arena (the parameter
//! block's place in it is a dynamic offset, so it is not part of the bind group) and each
//! storage buffer with its range. Across engine steps those are the same buffers (model
//! weights, the workspace, the KV pool, the step metadata written in place), so a decode
//! step creates no bind group after its first. A cached group keeps the buffers it binds
//! alive, so entries that no batch has used for [`STALE_AFTER`] submits are dropped (at the
//! next sweep, which runs every [`STALE_AFTER`] submits), and
//! [`super::GpuContext::release_bind_groups`] drops them all (an engine does that when it
//! is dropped, so its KV pool is freed at once). Each [`super::GpuContext`] has its own
//! arenas and cache, also when two of them share a device.

use super::Bind;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Bytes of each buffer that holds a batch's uniform parameter blocks.
pub const UNIFORM_ARENA_BYTES: u64 = 64 * 1024;

/// Submits after which a bind group no batch used is dropped from the cache, at the next
/// sweep (every this many submits): it survives between this many and twice as many.
pub const STALE_AFTER: u64 = 16;

/// A persistent uniform buffer and the host image of what the batch holding it will
/// write there.
pub(crate) struct Arena {
    pub buffer: wgpu::Buffer,
    pub image: Vec<u8>,
}

/// One storage binding as the cache keeps it: the buffer and its byte range (`None` for
/// the whole buffer).
#[derive(Clone, PartialEq, Eq)]
struct BindingKey {
    buffer: wgpu::Buffer,
    range: Option<(u64, u64)>,
}

/// A binding's buffer and range, as the cache compares and hashes them (without cloning the
/// buffer handle: lookups that hit create nothing).
fn parts<'a>(b: &Bind<'a>) -> (&'a wgpu::Buffer, Option<(u64, u64)>) {
    match *b {
        Bind::Whole(buffer) => (buffer, None),
        Bind::Range {
            buffer,
            offset,
            size,
        } => (buffer, Some((offset, size))),
    }
}

struct Entry {
    layout: wgpu::BindGroupLayout,
    params: (wgpu::Buffer, u64),
    storage: Vec<BindingKey>,
    group: wgpu::BindGroup,
    last_used: u64,
}

impl Entry {
    fn matches(
        &self,
        layout: &wgpu::BindGroupLayout,
        params: &wgpu::Buffer,
        size: u64,
        storage: &[Bind<'_>],
    ) -> bool {
        self.layout == *layout
            && self.params.0 == *params
            && self.params.1 == size
            && self.storage.len() == storage.len()
            && self.storage.iter().zip(storage).all(|(k, b)| {
                let (buffer, range) = parts(b);
                k.buffer == *buffer && k.range == range
            })
    }
}

#[derive(Default)]
struct Cache {
    /// Entries by the hash of what they bind (collisions share a bucket).
    buckets: HashMap<u64, Vec<Entry>>,
    len: usize,
    /// Submits so far.
    generation: u64,
    hits: u64,
    misses: u64,
}

/// Hit and miss counts of the bind group cache, and how many groups it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindGroupStats {
    pub hits: u64,
    pub misses: u64,
    pub cached: usize,
}

/// The context's arenas and bind groups.
#[derive(Default)]
pub(crate) struct Bindings {
    arenas: Mutex<Vec<Arena>>,
    cache: Mutex<Cache>,
}

fn key_hash(
    layout: &wgpu::BindGroupLayout,
    params: &wgpu::Buffer,
    size: u64,
    storage: &[Bind<'_>],
) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    layout.hash(&mut h);
    params.hash(&mut h);
    size.hash(&mut h);
    for b in storage {
        let (buffer, range) = parts(b);
        buffer.hash(&mut h);
        range.hash(&mut h);
    }
    h.finish()
}

impl Bindings {
    /// An arena from the free list, or a new one.
    pub fn take_arena(&self, device: &wgpu::Device) -> Arena {
        if let Some(a) = self.arenas.lock().ok().and_then(|mut v| v.pop()) {
            return a;
        }
        Arena {
            buffer: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kernel parameters"),
                size: UNIFORM_ARENA_BYTES,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            image: Vec::with_capacity(UNIFORM_ARENA_BYTES as usize),
        }
    }

    /// Puts arenas back on the free list once their copies are submitted (or abandoned).
    pub fn return_arenas(&self, arenas: impl IntoIterator<Item = Arena>) {
        if let Ok(mut v) = self.arenas.lock() {
            v.extend(arenas.into_iter().map(|mut a| {
                a.image.clear();
                a
            }));
        }
    }

    /// The cached bind group for these bindings, or the one `create` makes (then cached);
    /// with whether it was created.
    pub fn bind_group<E>(
        &self,
        layout: &wgpu::BindGroupLayout,
        params: &wgpu::Buffer,
        size: u64,
        storage: &[Bind<'_>],
        create: impl FnOnce() -> Result<wgpu::BindGroup, E>,
    ) -> Result<(wgpu::BindGroup, bool), E> {
        let hash = key_hash(layout, params, size, storage);
        if let Ok(mut cache) = self.cache.lock() {
            let generation = cache.generation;
            if let Some(e) = cache.buckets.get_mut(&hash).and_then(|bucket| {
                bucket
                    .iter_mut()
                    .find(|e| e.matches(layout, params, size, storage))
            }) {
                e.last_used = generation;
                let group = e.group.clone();
                cache.hits += 1;
                return Ok((group, false));
            }
        }
        // Created outside the lock: creation may take a while and may fail.
        let group = create()?;
        if let Ok(mut cache) = self.cache.lock() {
            let generation = cache.generation;
            cache.misses += 1;
            cache.len += 1;
            cache.buckets.entry(hash).or_default().push(Entry {
                layout: layout.clone(),
                params: (params.clone(), size),
                storage: storage
                    .iter()
                    .map(|b| {
                        let (buffer, range) = parts(b);
                        BindingKey {
                            buffer: buffer.clone(),
                            range,
                        }
                    })
                    .collect(),
                group: group.clone(),
                last_used: generation,
            });
        }
        Ok((group, true))
    }

    /// Counts a batch's submit; every [`STALE_AFTER`] submits drops the groups no batch has
    /// used for [`STALE_AFTER`] submits.
    pub fn submitted(&self) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        cache.generation += 1;
        let generation = cache.generation;
        if generation.is_multiple_of(STALE_AFTER) {
            let mut len = 0;
            cache.buckets.retain(|_, bucket| {
                bucket.retain(|e| e.last_used + STALE_AFTER >= generation);
                len += bucket.len();
                !bucket.is_empty()
            });
            cache.len = len;
        }
    }

    /// Drops every cached bind group (and with them the buffers only they kept alive).
    pub fn release(&self) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.buckets.clear();
            cache.len = 0;
        }
    }

    pub fn stats(&self) -> BindGroupStats {
        self.cache
            .lock()
            .map(|c| BindGroupStats {
                hits: c.hits,
                misses: c.misses,
                cached: c.len,
            })
            .unwrap_or_default()
    }
}
