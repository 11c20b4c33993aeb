// copy_blocks: copies whole KV blocks inside one buffer of the pool, for every layer's K and
// V held there, in one dispatch. This is copy-on-write's tool: wgpu cannot copy a buffer
// onto itself. The pairs must not chain (no destination is also a source) so that the order
// of invocations does not matter; the launcher checks this.
// Grid: x covers the words of a block (64 per workgroup), y = pair, z = slab (layer x K/V).

struct Params {
    num_pairs: u32,
    block_words: u32,   // u32 words in one block of one slab
    slab_blocks: u32,   // blocks per slab (the shard's block count)
    num_slabs: u32,     // layers held by this buffer x 2
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pairs: array<vec2<u32>>;  // [num_pairs] (src, dst) local block ids
@group(0) @binding(2) var<storage, read_write> arena: array<u32>;  // [num_slabs, slab_blocks, block_words]

@compute @workgroup_size(64)
fn copy_blocks(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = gid.x;
    let pair = gid.y;
    let slab = gid.z;
    if w >= p.block_words || pair >= p.num_pairs || slab >= p.num_slabs {
        return;
    }
    let sd = pairs[pair];
    let slab_base = slab * p.slab_blocks * p.block_words;
    arena[slab_base + sd.y * p.block_words + w] = arena[slab_base + sd.x * p.block_words + w];
}
