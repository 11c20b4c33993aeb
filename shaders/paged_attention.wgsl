// paged_attention: causal attention of a flat batch of query tokens over the paged KV pool
// (paged_attention_kv.wgsl holds the arithmetic, parameters and bindings).
// Grid: one workgroup per (query head, query token) = (x, y); 64 threads.
// This variant reads q, probabilities and value-row offsets from workgroup memory one
// element at a time; paged_attention_sg.wgsl shares them through subgroup broadcasts.

// q · K[pool row `base`] (q already scaled).
fn score(base: u32, lane: u32) -> f32 {
    var dot = 0.0;
    if KV_DTYPE == DTYPE_INT8 || KV_DTYPE == DTYPE_INT4 {
        // Eight at a time, the terms grouped in pairs as below.
        for (var o = 0u; o < p.head_dim / 8u; o++) {
            let k = load_oct(0u, base, o);
            let i = 8u * o;
            dot += q_s[i] * k[0].x + q_s[i + 1u] * k[0].y;
            dot += q_s[i + 2u] * k[0].z + q_s[i + 3u] * k[0].w;
            dot += q_s[i + 4u] * k[1].x + q_s[i + 5u] * k[1].y;
            dot += q_s[i + 6u] * k[1].z + q_s[i + 7u] * k[1].w;
        }
        return dot;
    }
    for (var e = 0u; e < p.head_dim / 2u; e++) {
        let kp = load_pair(0u, base, e);
        dot += q_s[2u * e] * kp.x + q_s[2u * e + 1u] * kp.y;
    }
    return dot;
}

// The sum over the tile's positions j < n_valid that have a row of prob[j] * V[row j],
// pair e, in increasing j.
fn values(e: u32, n_valid: u32, v_half: u32, lane: u32) -> vec2<f32> {
    var a = vec2<f32>(0.0);
    for (var j = 0u; j < n_valid; j++) {
        let rb = row[j];
        if rb != NO_ROW {
            a += prob[j] * load_pair(v_half, rb, e);
        }
    }
    return a;
}

// The sum of the tile's probabilities, in increasing position.
fn tile_sum(lane: u32) -> f32 {
    var l = 0.0;
    for (var j = 0u; j < WG; j++) {
        l += prob[j];
    }
    return l;
}

// The tile's largest score.
fn tile_max(tid: u32, lane: u32, v: f32) -> f32 {
    return reduce_max(tid, v);
}

@compute @workgroup_size(WG)
fn paged_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    attention_body(wg, tid, 0u);
}
