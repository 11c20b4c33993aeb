//! GPU storage of the paged KV cache: the pool of fixed-size blocks for every layer.
//!
//! Logical layout per layer: K and V each `[num_blocks, num_kv_heads,
//! block_size, head_dim]`, f16 (packed two per u32) by default, f32, or quantized to 8 or 4
//! bits with the scales inside each (block, KV head) tile (see [`quant`]), so that a block
//! stays one self-contained run of bytes whatever the dtype. Physically the pool
//! is a grid of buffers ("arenas"): blocks are split into shards so that one layer's K and V
//! for a shard fit one storage binding, and consecutive layers share an arena when they fit
//! together, so that `copy_blocks` can serve every layer of an arena in one dispatch. An
//! arena of shard `s` holding layers `l0..l1` is laid out `[l1 - l0, 2 (K, V),
//! shard_blocks(s), num_kv_heads, block_size, head_dim]`; the `[2, shard_blocks, ...]` part
//! of one layer is that layer's "slab", which attention and reshape_and_cache bind.

mod resize;

use crate::error::{GpuError, Result};
use crate::gpu::{Bind, GpuContext};

/// The KV formats, defined with the other formats (`crate::formats`), under their old path.
pub use crate::formats::kv::{KvDtype, KvLayout, KvRotation};
/// The quantized block format's codec, under its old path.
pub use crate::formats::kv_blocks as quant;

/// How big the pool should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSize {
    Blocks(usize),
    /// As many blocks as fit in this many bytes (all layers, K and V).
    Bytes(u64),
}

/// The KV pool's buffers.
#[derive(Debug)]
pub struct KvPool {
    pub layout: KvLayout,
    pub num_blocks: usize,
    /// Blocks per shard (the last shard may hold fewer).
    pub blocks_per_shard: usize,
    /// Layers per arena (the last group may hold fewer).
    pub layers_per_arena: usize,
    /// How what the pool holds was rotated before it was stored: the forward pass applies
    /// it (the `reshape_and_cache` and `paged_attention` launchers do not). Fixed when the
    /// pool is made, so rotated and unrotated rows can never mix.
    rotation: KvRotation,
    /// Arenas indexed `[shard * num_groups + group]`.
    arenas: Vec<wgpu::Buffer>,
    /// Per model layer: (KV cache group, slab). Without groups, `(0, layer)`: every layer
    /// has a slab of its own in every block. With groups a block holds `layout.num_layers`
    /// slabs, and each group's layers take them in turn (see [`crate::cache::LayerGroups`]).
    layer_slots: Vec<(usize, usize)>,
    /// Scratch for the per-shard attention partials of a sharded pool, kept across calls
    /// (grown when a call needs more) so that steps bind the same buffer.
    partials: std::sync::Mutex<Option<wgpu::Buffer>>,
    /// The cap on one arena's bytes the pool was made with (a resized pool keeps it).
    arena_limit: u64,
}

impl KvPool {
    pub fn new(ctx: &GpuContext, layout: KvLayout, size: PoolSize) -> Result<Self> {
        Self::with_arena_limit(ctx, layout, size, ctx.max_binding_bytes())
    }

    /// Like [`Self::new`] with an explicit cap on one arena's bytes (tests use a small cap to
    /// exercise sharding on adapters whose real limit is large).
    pub fn with_arena_limit(
        ctx: &GpuContext,
        layout: KvLayout,
        size: PoolSize,
        max_arena_bytes: u64,
    ) -> Result<Self> {
        layout
            .validate()
            .map_err(|e| GpuError::invalid("kv pool", e.to_string()))?;
        let num_blocks = match size {
            PoolSize::Blocks(n) => n,
            PoolSize::Bytes(b) => (b / layout.block_bytes_all_layers()) as usize,
        };
        if num_blocks == 0 {
            return Err(GpuError::TooLarge {
                what: "one KV block for every layer".into(),
                needed: layout.block_bytes_all_layers(),
                limit: match size {
                    PoolSize::Bytes(b) => b,
                    PoolSize::Blocks(_) => 0,
                },
            });
        }
        let block = layout.block_bytes();
        let max_arena = max_arena_bytes.min(ctx.limits.max_buffer_size);
        let max_blocks_per_slab = (max_arena / (2 * block)) as usize;
        if max_blocks_per_slab == 0 {
            return Err(GpuError::TooLarge {
                what: "one KV block (K and V) of one layer".into(),
                needed: 2 * block,
                limit: max_arena,
            });
        }
        let blocks_per_shard = num_blocks.min(max_blocks_per_slab);
        let slab_bytes = 2 * block * blocks_per_shard as u64;
        let align = ctx.limits.min_storage_buffer_offset_alignment as u64;
        let layers_per_arena = if slab_bytes.is_multiple_of(align) {
            ((max_arena / slab_bytes) as usize).clamp(1, layout.num_layers)
        } else {
            1
        };
        let num_shards = num_blocks.div_ceil(blocks_per_shard);
        let num_groups = layout.num_layers.div_ceil(layers_per_arena);
        let mut pool = KvPool {
            layout,
            num_blocks,
            blocks_per_shard,
            layers_per_arena,
            rotation: KvRotation::None,
            arenas: Vec::with_capacity(num_shards * num_groups),
            partials: std::sync::Mutex::new(None),
            layer_slots: (0..layout.num_layers).map(|l| (0, l)).collect(),
            arena_limit: max_arena_bytes,
        };
        for s in 0..num_shards {
            for g in 0..num_groups {
                let bytes = pool.group_layers(g).len() as u64 * pool.slab_bytes(s);
                let buf =
                    ctx.storage_buffer(&format!("kv pool shard {s} layers group {g}"), bytes)?;
                pool.arenas.push(buf);
            }
        }
        Ok(pool)
    }

    /// A scratch buffer of at least `bytes` for attention partials, the same one from call
    /// to call until a call needs more (work already recorded keeps the old one alive).
    /// Every call in a batch gets the same buffer, so the batch orders its users.
    pub fn partials(&self, ctx: &GpuContext, bytes: u64) -> Result<wgpu::Buffer> {
        let mut kept = self.partials.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = kept.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(b.clone());
        }
        let size = bytes
            .next_power_of_two()
            .min(ctx.max_binding_bytes())
            .max(bytes);
        let b = ctx.storage_buffer("attention partials", size)?;
        *kept = Some(b.clone());
        Ok(b)
    }

    /// The same pool storing rows rotated by `rotation` (for a pool not yet written).
    pub fn with_rotation(mut self, rotation: KvRotation) -> Self {
        self.rotation = rotation;
        self
    }

    pub fn rotation(&self) -> KvRotation {
        self.rotation
    }

    /// The same pool with the model's layers mapped onto KV cache groups: layer `l` keeps
    /// its K/V in slab `layer_slots[l].1` of the blocks of group `layer_slots[l].0`. Every
    /// slab must exist (`< layout.num_layers`), and no two layers may share a (group, slab).
    pub fn with_layer_slots(mut self, layer_slots: Vec<(usize, usize)>) -> Result<Self> {
        let mut seen = std::collections::HashSet::new();
        for (l, &(g, slab)) in layer_slots.iter().enumerate() {
            if slab >= self.layout.num_layers || !seen.insert((g, slab)) {
                return Err(GpuError::invalid(
                    "kv pool",
                    format!(
                        "layer {l} mapped to group {g} slab {slab} of {} (or twice)",
                        self.layout.num_layers
                    ),
                ));
            }
        }
        self.layer_slots = layer_slots;
        Ok(self)
    }

    /// (KV cache group, slab) of model layer `layer`: which block tables it reads, and
    /// which slab of their blocks holds its K/V (the `layer` the kernels take).
    pub fn layer_slot(&self, layer: usize) -> (usize, usize) {
        self.layer_slots.get(layer).copied().unwrap_or((0, layer))
    }

    /// KV cache groups the layers are spread over.
    pub fn num_kv_groups(&self) -> usize {
        self.layer_slots.iter().map(|s| s.0 + 1).max().unwrap_or(1)
    }

    pub fn num_shards(&self) -> usize {
        self.num_blocks.div_ceil(self.blocks_per_shard)
    }

    pub fn num_groups(&self) -> usize {
        self.layout.num_layers.div_ceil(self.layers_per_arena)
    }

    /// Total bytes of GPU memory the pool holds.
    pub fn total_bytes(&self) -> u64 {
        self.arenas.iter().map(|a| a.size()).sum()
    }

    /// (first global block id, block count) of shard `s`.
    pub fn shard_range(&self, s: usize) -> (usize, usize) {
        let first = s * self.blocks_per_shard;
        (first, self.blocks_per_shard.min(self.num_blocks - first))
    }

    /// (shard, local index) of a global block id.
    pub fn locate(&self, block: usize) -> (usize, usize) {
        (block / self.blocks_per_shard, block % self.blocks_per_shard)
    }

    /// Layers held by layer group `g`.
    pub fn group_layers(&self, g: usize) -> std::ops::Range<usize> {
        let start = g * self.layers_per_arena;
        start..(start + self.layers_per_arena).min(self.layout.num_layers)
    }

    fn slab_bytes(&self, shard: usize) -> u64 {
        2 * self.layout.block_bytes() * self.shard_range(shard).1 as u64
    }

    /// The arena of (shard, layer group).
    pub fn arena(&self, shard: usize, group: usize) -> &wgpu::Buffer {
        &self.arenas[shard * self.num_groups() + group]
    }

    /// (buffer, byte offset, byte size) of layer `layer`'s slab in shard `shard`.
    fn slab_parts(&self, layer: usize, shard: usize) -> (&wgpu::Buffer, u64, u64) {
        let group = layer / self.layers_per_arena;
        let slab = self.slab_bytes(shard);
        let offset = (layer - group * self.layers_per_arena) as u64 * slab;
        (self.arena(shard, group), offset, slab)
    }

    /// The binding of layer `layer`'s K and V for shard `shard`:
    /// `[2, shard_blocks, num_kv_heads, tile_words]` (float rows, or quantized tiles: see
    /// [`quant`]).
    pub fn slab(&self, layer: usize, shard: usize) -> Bind<'_> {
        let (buffer, offset, size) = self.slab_parts(layer, shard);
        Bind::Range {
            buffer,
            offset,
            size,
        }
    }

    /// Where block `block` of layer `layer` lives: (buffer, byte offset of its K part, byte
    /// offset of its V part). Each part is [`KvLayout::block_bytes`] long.
    pub fn block_location(&self, layer: usize, block: usize) -> (&wgpu::Buffer, u64, u64) {
        let (shard, local) = self.locate(block);
        let (buffer, offset, _) = self.slab_parts(layer, shard);
        let bb = self.layout.block_bytes();
        let k = offset + local as u64 * bb;
        let v = offset + (self.shard_range(shard).1 + local) as u64 * bb;
        (buffer, k, v)
    }

    /// Reads one block back for every layer: `[num_layers, 2, num_kv_heads, block_size,
    /// head_dim]` in the pool's storage format. For tests and debugging; waits for the GPU.
    pub fn read_block(&self, ctx: &GpuContext, block: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for layer in 0..self.layout.num_layers {
            let (buf, k, v) = self.block_location(layer, block);
            out.extend(ctx.read_bytes(buf, k, self.layout.block_bytes())?);
            out.extend(ctx.read_bytes(buf, v, self.layout.block_bytes())?);
        }
        Ok(out)
    }
}
