//! The cache engine: carries out the block manager's plans on the GPU. It owns the device
//! pool ([`KvPool`]) and the host pool ([`HostPool`]) and executes, in this order inside one
//! command encoder:
//!
//! 1. swap-out: device blocks are copied into one mappable staging buffer, then (after the
//!    submit) into their host blocks;
//! 2. swap-in: host blocks are written into one staging buffer, then copied into their
//!    device blocks;
//! 3. copies (copy-on-write) through the `copy_blocks` kernel.
//!
//! Swap-out goes first because a device block freed by a swap-out may be handed to a
//! swap-in or a copy in the same step; GPU commands in one encoder run in order. Many blocks
//! move per submit, never one submit per block.

use crate::cache::BlockOps;
use crate::error::{GpuError, Result};
use crate::gpu::{Batch, GpuContext, InFlightRead, PendingRead};
use crate::kernels::copy_blocks::copy_blocks;
use crate::pool::{KvLayout, KvPool};

/// Host memory for swapped-out blocks, in blocks of the device pool's byte size. A block is
/// stored `[num_layers, 2 (K, V), num_kv_heads, block_size, head_dim]` in the pool's format.
#[derive(Debug)]
pub struct HostPool {
    pub layout: KvLayout,
    pub num_blocks: usize,
    data: Vec<u8>,
}

impl HostPool {
    pub fn new(layout: KvLayout, num_blocks: usize) -> Self {
        HostPool {
            layout,
            num_blocks,
            data: vec![0; num_blocks * layout.block_bytes_all_layers() as usize],
        }
    }

    pub fn block(&self, id: usize) -> Option<&[u8]> {
        let n = self.layout.block_bytes_all_layers() as usize;
        self.data.get(id * n..(id + 1) * n)
    }

    pub(crate) fn block_mut(&mut self, id: usize) -> Option<&mut [u8]> {
        let n = self.layout.block_bytes_all_layers() as usize;
        self.data.get_mut(id * n..(id + 1) * n)
    }
}

/// Swap-outs recorded in a batch, to be landed in host memory once the batch is submitted.
#[must_use = "call CacheEngine::finish after submitting the batch"]
#[derive(Debug)]
pub struct PendingSwapOut {
    staging: Option<wgpu::Buffer>,
    host_blocks: Vec<u32>,
}

impl PendingSwapOut {
    /// Asks for the swapped-out bytes once the batch has been submitted, without waiting
    /// (see [`PendingRead::begin`]); [`CacheEngine::land`] puts them in the host pool.
    pub fn begin(self) -> InFlightSwapOut {
        InFlightSwapOut {
            read: self.staging.map(|s| PendingRead::of_staging(s).begin()),
            host_blocks: self.host_blocks,
        }
    }
}

/// Swap-outs whose bytes are on their way to host memory.
#[must_use = "land the swap-outs in the host pool (CacheEngine::land)"]
#[derive(Debug)]
pub struct InFlightSwapOut {
    read: Option<InFlightRead>,
    host_blocks: Vec<u32>,
}

impl InFlightSwapOut {
    /// Whether the bytes have arrived (or there are none).
    pub fn is_ready(&self) -> bool {
        self.read.as_ref().is_none_or(InFlightRead::is_ready)
    }

    /// The read the bytes arrive by, if any.
    pub fn read(&self) -> Option<&InFlightRead> {
        self.read.as_ref()
    }
}

#[derive(Debug)]
pub struct CacheEngine {
    pub device: KvPool,
    pub host: HostPool,
    /// Host blocks whose swap-out was recorded and has not landed: if the device is lost
    /// now, their content never arrives.
    unlanded: Vec<u32>,
}

impl CacheEngine {
    pub fn new(device: KvPool, num_host_blocks: usize) -> Self {
        let host = HostPool::new(device.layout, num_host_blocks);
        CacheEngine {
            device,
            host,
            unlanded: Vec::new(),
        }
    }

    /// Host blocks recorded as swap-out destinations whose bytes have not arrived (see
    /// [`Self::land`]).
    pub fn unlanded(&self) -> &[u32] {
        &self.unlanded
    }

    /// Takes over `other`'s host pool (the blocks swapped out and the host tier) in place
    /// of this one's, which `other` gets: for a cache engine rebuilt on a new device after
    /// the old one was lost, since host memory survives a device. Blocks that had not
    /// landed in `other` are the caller's to account for; none are pending here.
    pub fn adopt_host_pool(&mut self, other: &mut CacheEngine) {
        std::mem::swap(&mut self.host, &mut other.host);
        self.unlanded.clear();
    }

    fn check(&self, ops: &BlockOps) -> Result<()> {
        ops.check()
            .map_err(|e| GpuError::invalid("cache engine", e))?;
        let (nd, nh) = (self.device.num_blocks as u32, self.host.num_blocks as u32);
        let out = ops.swap_out.iter().map(|&(d, h)| (d.0, h.0));
        let bad = out
            .chain(ops.swap_in.iter().map(|&(h, d)| (d.0, h.0)))
            .find(|&(d, h)| d >= nd || h >= nh);
        if let Some((d, h)) = bad {
            return Err(GpuError::invalid(
                "cache engine",
                format!("device block {d} / host block {h} outside pools of {nd} / {nh} blocks"),
            ));
        }
        Ok(())
    }

    /// Records `ops` into `batch`. Host data for swap-ins is read now; swapped-out data
    /// reaches the host pool in [`Self::finish`], after the batch is submitted.
    pub fn encode(&mut self, batch: &mut Batch, ops: &BlockOps) -> Result<PendingSwapOut> {
        self.check(ops)?;
        let ctx = batch.ctx();
        let layout = self.device.layout;
        let bb = layout.block_bytes();
        let per_block = layout.block_bytes_all_layers();

        // 1. Swap-out: device -> staging.
        let mut pending = PendingSwapOut {
            staging: None,
            host_blocks: ops.swap_out.iter().map(|&(_, h)| h.0).collect(),
        };
        self.unlanded.extend_from_slice(&pending.host_blocks);
        if !ops.swap_out.is_empty() {
            let staging = ctx.scoped("creating the swap-out staging buffer", || {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("swap-out staging"),
                    size: per_block * ops.swap_out.len() as u64,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })?;
            for (i, &(dev, _)) in ops.swap_out.iter().enumerate() {
                for layer in 0..layout.num_layers {
                    let (buf, k, v) = self.device.block_location(layer, dev.0 as usize);
                    let dst = i as u64 * per_block + layer as u64 * 2 * bb;
                    batch.copy(buf, k, &staging, dst, bb);
                    batch.copy(buf, v, &staging, dst + bb, bb);
                }
            }
            pending.staging = Some(staging);
        }

        // 2. Swap-in: host -> staging -> device.
        if !ops.swap_in.is_empty() {
            let staging = ctx.scoped("creating the swap-in staging buffer", || {
                ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("swap-in staging"),
                    size: per_block * ops.swap_in.len() as u64,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                })
            })?;
            {
                let mut view = staging
                    .get_mapped_range_mut(..)
                    .map_err(|e| GpuError::Readback(e.to_string()))?;
                for (i, &(host, _)) in ops.swap_in.iter().enumerate() {
                    let src = self.host.block(host.0 as usize).unwrap_or_default();
                    let start = i * per_block as usize;
                    view.slice(start..start + src.len()).copy_from_slice(src);
                }
            }
            staging.unmap();
            for (i, &(_, dev)) in ops.swap_in.iter().enumerate() {
                for layer in 0..layout.num_layers {
                    let (buf, k, v) = self.device.block_location(layer, dev.0 as usize);
                    let src = i as u64 * per_block + layer as u64 * 2 * bb;
                    batch.copy(&staging, src, buf, k, bb);
                    batch.copy(&staging, src + bb, buf, v, bb);
                }
            }
        }

        // 3. Copy-on-write copies.
        if !ops.copies.is_empty() {
            copy_blocks(batch, &self.device, &ops.copy_pairs())?;
        }
        Ok(pending)
    }

    /// Waits for the submitted batch and moves swapped-out blocks into the host pool.
    pub fn finish(&mut self, ctx: &GpuContext, pending: PendingSwapOut) -> Result<()> {
        let swap = pending.begin();
        if let Some(read) = swap.read() {
            ctx.wait_for(read)?;
        }
        self.land(swap)
    }

    /// Moves swapped-out blocks that have arrived into the host pool.
    pub fn land(&mut self, swap: InFlightSwapOut) -> Result<()> {
        let Some(read) = swap.read else {
            return Ok(());
        };
        let bytes = read.take()?;
        self.unlanded.retain(|h| !swap.host_blocks.contains(h));
        let per_block = self.device.layout.block_bytes_all_layers() as usize;
        for (i, &host) in swap.host_blocks.iter().enumerate() {
            if let Some(dst) = self.host.block_mut(host as usize) {
                dst.copy_from_slice(&bytes[i * per_block..(i + 1) * per_block]);
            }
        }
        Ok(())
    }

    /// Encodes, submits and finishes `ops` on their own.
    pub fn execute(&mut self, ctx: &GpuContext, ops: &BlockOps) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new(ctx, "block ops");
        let pending = self.encode(&mut batch, ops)?;
        batch.submit()?;
        self.finish(ctx, pending)
    }
}
