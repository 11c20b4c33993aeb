// paged_attention_reduce: merges the per-shard partial results of paged_attention.
// With partial s = (acc_s, m_s, l_s) and M = max_s m_s:
//   out = sum_s acc_s * exp(m_s - M) / sum_s l_s * exp(m_s - M)
// Grid: one workgroup per (query head, query token) = (x, y); threads cover head_dim.

struct Params {
    num_tokens: u32,
    num_heads: u32,
    head_dim: u32,
    num_shards: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> partial: array<f32>;    // [num_shards, num_tokens, num_heads, head_dim + 2]
@group(0) @binding(2) var<storage, read_write> out: array<f32>;  // [num_tokens, num_heads, head_dim]

@compute @workgroup_size(64)
fn paged_attention_reduce(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let h = wg.x;
    let t = wg.y;
    let stride = p.head_dim + 2u;
    let shard_stride = p.num_tokens * p.num_heads * stride;
    let base = (t * p.num_heads + h) * stride;
    var big = NEG_BIG;
    for (var s = 0u; s < p.num_shards; s++) {
        big = max(big, partial[s * shard_stride + base + p.head_dim]);
    }
    var denom = 0.0;
    for (var s = 0u; s < p.num_shards; s++) {
        let o = s * shard_stride + base;
        denom += partial[o + p.head_dim + 1u] * exp(partial[o + p.head_dim] - big);
    }
    let inv = select(0.0, 1.0 / denom, denom > 0.0);
    for (var d = tid; d < p.head_dim; d += 64u) {
        var v = 0.0;
        for (var s = 0u; s < p.num_shards; s++) {
            let o = s * shard_stride + base;
            v += partial[o + d] * exp(partial[o + p.head_dim] - big);
        }
        out[(t * p.num_heads + h) * p.head_dim + d] = v * inv;
    }
}
