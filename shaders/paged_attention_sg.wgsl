// paged_attention_sg: paged_attention.wgsl for devices with subgroups of at least 8
// invocations and head_dim % 8 == 0 (paged_attention_kv.wgsl holds the arithmetic).
// Grid: one workgroup per (query head, query token) = (x, y); 64 threads.
// Values every lane needs (q elements, a tile's probabilities and value-row offsets) are
// loaded 8 at a time, one per lane of each group of 8, and handed round with
// subgroupBroadcast: CPU adapters turn every load whose address they cannot prove uniform
// into a per-lane gather. Terms are added in the same order as paged_attention.wgsl.

// q · K[pool row `base`] (q already scaled).
fn score(base: u32, lane: u32) -> f32 {
    var dot = 0.0;
    for (var e8 = 0u; e8 < p.head_dim / 8u; e8++) {
        let ql = q_s[8u * e8 + (lane & 7u)];
        if KV_DTYPE == DTYPE_INT8 || KV_DTYPE == DTYPE_INT4 {
            let k = load_oct(0u, base, e8);
            dot += subgroupBroadcast(ql, 0u) * k[0].x + subgroupBroadcast(ql, 1u) * k[0].y;
            dot += subgroupBroadcast(ql, 2u) * k[0].z + subgroupBroadcast(ql, 3u) * k[0].w;
            dot += subgroupBroadcast(ql, 4u) * k[1].x + subgroupBroadcast(ql, 5u) * k[1].y;
            dot += subgroupBroadcast(ql, 6u) * k[1].z + subgroupBroadcast(ql, 7u) * k[1].w;
            continue;
        }
        let k0 = load_pair(0u, base, 4u * e8);
        dot += subgroupBroadcast(ql, 0u) * k0.x + subgroupBroadcast(ql, 1u) * k0.y;
        let k1 = load_pair(0u, base, 4u * e8 + 1u);
        dot += subgroupBroadcast(ql, 2u) * k1.x + subgroupBroadcast(ql, 3u) * k1.y;
        let k2 = load_pair(0u, base, 4u * e8 + 2u);
        dot += subgroupBroadcast(ql, 4u) * k2.x + subgroupBroadcast(ql, 5u) * k2.y;
        let k3 = load_pair(0u, base, 4u * e8 + 3u);
        dot += subgroupBroadcast(ql, 6u) * k3.x + subgroupBroadcast(ql, 7u) * k3.y;
    }
    return dot;
}

// One position's term: a + pr * V[row rb], pair e, when the position exists and has a row.
fn value_term(a: vec2<f32>, ok: bool, pr: f32, rb: u32, v_half: u32, e: u32) -> vec2<f32> {
    if ok && rb != NO_ROW {
        return a + pr * load_pair(v_half, rb, e);
    }
    return a;
}

// The sum over the tile's positions j < n_valid that have a row of prob[j] * V[row j],
// pair e, in increasing j. The trip count is the same for the whole workgroup (positions
// past n_valid run masked), so the loop stays uniform.
fn values(e: u32, n_valid: u32, v_half: u32, lane: u32) -> vec2<f32> {
    var a = vec2<f32>(0.0);
    let trips = (n_valid + 7u) / 8u;
    for (var t8 = 0u; t8 < trips; t8++) {
        let j0 = 8u * t8;
        let jl = min(j0 + (lane & 7u), WG - 1u);
        let pl = prob[jl];
        let rl = row[jl];
        a = value_term(a, j0 < n_valid, subgroupBroadcast(pl, 0u), subgroupBroadcast(rl, 0u), v_half, e);
        a = value_term(a, j0 + 1u < n_valid, subgroupBroadcast(pl, 1u), subgroupBroadcast(rl, 1u), v_half, e);
        a = value_term(a, j0 + 2u < n_valid, subgroupBroadcast(pl, 2u), subgroupBroadcast(rl, 2u), v_half, e);
        a = value_term(a, j0 + 3u < n_valid, subgroupBroadcast(pl, 3u), subgroupBroadcast(rl, 3u), v_half, e);
        a = value_term(a, j0 + 4u < n_valid, subgroupBroadcast(pl, 4u), subgroupBroadcast(rl, 4u), v_half, e);
        a = value_term(a, j0 + 5u < n_valid, subgroupBroadcast(pl, 5u), subgroupBroadcast(rl, 5u), v_half, e);
        a = value_term(a, j0 + 6u < n_valid, subgroupBroadcast(pl, 6u), subgroupBroadcast(rl, 6u), v_half, e);
        a = value_term(a, j0 + 7u < n_valid, subgroupBroadcast(pl, 7u), subgroupBroadcast(rl, 7u), v_half, e);
    }
    return a;
}

// The sum of the tile's probabilities, in increasing position: read eight at a time, one
// per lane of each group of 8, and broadcast.
fn tile_sum(lane: u32) -> f32 {
    var l = 0.0;
    for (var j0 = 0u; j0 < WG; j0 += 8u) {
        let pl = prob[j0 + (lane & 7u)];
        l += subgroupBroadcast(pl, 0u);
        l += subgroupBroadcast(pl, 1u);
        l += subgroupBroadcast(pl, 2u);
        l += subgroupBroadcast(pl, 3u);
        l += subgroupBroadcast(pl, 4u);
        l += subgroupBroadcast(pl, 5u);
        l += subgroupBroadcast(pl, 6u);
        l += subgroupBroadcast(pl, 7u);
    }
    return l;
}

// The tile's largest score: each subgroup's maximum, then the maximum of those (exact in
// any order). Subgroups are contiguous runs of at least 8 invocations, so every eighth
// entry of red[] covers them all.
fn tile_max(tid: u32, lane: u32, v: f32) -> f32 {
    red[tid] = subgroupMax(v);
    workgroupBarrier();
    var r = red[0];
    for (var i = 8u; i < WG; i += 8u) {
        r = max(r, red[i]);
    }
    return r;
}

@compute @workgroup_size(WG)
fn paged_attention_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    attention_body(wg, tid, lane);
}
