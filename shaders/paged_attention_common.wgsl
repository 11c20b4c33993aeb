// The per-(query head, query token) kernels, paged_attention.wgsl and
// paged_attention_sg.wgsl, compiled with paged_attention_kv.wgsl and this text prepended.
// They differ only in score(), tile_max(), tile_sum() and values(): how a key row is dotted
// with q, how a tile's largest score and its probabilities' sum are found, and how its
// value rows are accumulated. The arithmetic is paged_attention_kv.wgsl's.
// Grid: one workgroup per (query head, query token) = (x, y); 64 threads. In the score
// phase a thread owns one position of the tile; in the value phase it owns pairs of output
// elements and sums over the tile's positions.

@group(0) @binding(6) var<storage, read> sinks: array<f32>;         // [num_heads] with has_sinks

const WG: u32 = 64u;                // = TILE
const PAIRS_PER_THREAD: u32 = 2u;   // MAX_HEAD_DIM / 2 / WG

var<workgroup> q_s: array<f32, MAX_HEAD_DIM>;
var<workgroup> prob: array<f32, WG>;
var<workgroup> row: array<u32, WG>;  // pool row index of each tile position, or NO_ROW
var<workgroup> red: array<f32, WG>;

fn reduce_max(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            red[tid] = max(red[tid], red[tid + stride]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The kernel body, for workgroup `wg`, invocation `tid`, subgroup lane `lane`. Control flow
// around score(), tile_max(), tile_sum() and values() is uniform, so they may use subgroup operations.
fn attention_body(wg: vec3<u32>, tid: u32, lane: u32) {
    let h = wg.x;
    let t = wg.y;
    let tp = token_pos[t];
    let seq = tp.x;
    let ctx_len = tp.y + 1u;
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let v_half = p.shard_num_blocks * p.num_kv_heads * kv_tile_words();
    let half_dim = p.head_dim / 2u;

    for (var i = tid; i < p.head_dim; i += WG) {
        q_s[i] = q[(t * p.num_heads + h) * p.head_dim + i] * p.scale;
    }
    workgroupBarrier();

    let start = initial_state(h);
    var m = start.x;
    var l = start.y;
    var acc: array<vec2<f32>, PAIRS_PER_THREAD>;
    for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
        acc[i] = vec2<f32>(0.0);
    }

    let win_start = window_start(ctx_len);
    for (var tile0 = win_start - win_start % TILE; tile0 < ctx_len; tile0 += TILE) {
        let pos = tile0 + tid;
        var base = NO_ROW;
        if pos >= win_start && pos < ctx_len {
            base = pool_row(seq, kvh, pos);
        }
        // Every lane scores a row (row 0 stands in for a missing one) so that score() runs
        // in uniform control flow.
        let s = select(NEG_BIG, capped(score(select(0u, base, base != NO_ROW), lane)), base != NO_ROW);
        row[tid] = base;
        let m_tile = tile_max(tid, lane, s);
        prob[tid] = select(0.0, exp(s - m_tile), base != NO_ROW);
        workgroupBarrier();
        let l_tile = tile_sum(lane);
        let m_new = max(m, m_tile);
        let c_old = exp(m - m_new);
        let c_tile = exp(m_tile - m_new);
        l = l * c_old + l_tile * c_tile;
        let n_valid = min(WG, ctx_len - tile0);
        for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
            // Uniform: every lane runs values() when any lane of the workgroup has pair e.
            if i * WG < half_dim {
                let e = tid + i * WG;
                let a_tile = values(min(e, half_dim - 1u), n_valid, v_half, lane);
                if e < half_dim {
                    acc[i] = acc[i] * c_old + a_tile * c_tile;
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }

    if p.num_shards == 1u {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        let o = (t * p.num_heads + h) * p.head_dim;
        for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
            let e = tid + i * WG;
            if e < half_dim {
                out[o + 2u * e] = acc[i].x * inv;
                out[o + 2u * e + 1u] = acc[i].y * inv;
            }
        }
    } else {
        let stride = p.head_dim + 2u;
        let o = ((p.shard_index * p.num_tokens + t) * p.num_heads + h) * stride;
        for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
            let e = tid + i * WG;
            if e < half_dim {
                out[o + 2u * e] = acc[i].x;
                out[o + 2u * e + 1u] = acc[i].y;
            }
        }
        if tid == 0u {
            out[o + p.head_dim] = m;
            out[o + p.head_dim + 1u] = l;
        }
    }
}
