// rope: rotary position embedding in the Hugging Face layout (rotate_half): element i of a
// head pairs with element i + head_dim/2. Applied in place to q and k.
//   x1' = x1 * cos - x2 * sin;  x2' = x2 * cos + x1 * sin
// cos/sin come from a table built on the host ([max_positions, head_dim]: cos in the first
// half of a row, sin in the second), which carries rope_theta and any frequency scaling
// (linear, Llama-3) and avoids evaluating sin/cos of large arguments on the GPU.
// Grid: x covers (head, pair) for q heads then k heads (64 per workgroup), y = token.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    max_positions: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> positions: array<u32>;   // [num_tokens]
@group(0) @binding(2) var<storage, read> cos_sin: array<f32>;     // [max_positions, head_dim]
@group(0) @binding(3) var<storage, read_write> q: array<f32>;     // [num_tokens, num_heads, head_dim]
@group(0) @binding(4) var<storage, read_write> k: array<f32>;     // [num_tokens, num_kv_heads, head_dim]

@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_dim = p.head_dim / 2u;
    let t = gid.y;
    let head = gid.x / half_dim;
    let i = gid.x % half_dim;
    if t >= p.num_tokens || head >= p.num_heads + p.num_kv_heads {
        return;
    }
    let pos = min(positions[t], p.max_positions - 1u);
    let c = cos_sin[pos * p.head_dim + i];
    let s = cos_sin[pos * p.head_dim + half_dim + i];
    if head < p.num_heads {
        let o = (t * p.num_heads + head) * p.head_dim + i;
        let x1 = q[o];
        let x2 = q[o + half_dim];
        q[o] = x1 * c - x2 * s;
        q[o + half_dim] = x2 * c + x1 * s;
    } else {
        let o = (t * p.num_kv_heads + head - p.num_heads) * p.head_dim + i;
        let x1 = k[o];
        let x2 = k[o + half_dim];
        k[o] = x1 * c - x2 * s;
        k[o + half_dim] = x2 * c + x1 * s;
    }
}
