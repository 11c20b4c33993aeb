// paged_attention_lanes: attention with one invocation per (query token, query head),
// compiled with paged_attention_kv.wgsl prepended, whose arithmetic it follows term for
// term (so it agrees bit for bit with paged_attention.wgsl and paged_attention_sg.wgsl).
//
// Made for CPU adapters. There a workgroup's invocations are the lanes of one SIMD
// register, so the per-(token, head) kernels, whose 64 invocations split a tile's
// positions or head elements, leave most lanes idle on short contexts and small heads and
// pay for barriers and broadcasts; and every storage read is a loop over the lanes
// whatever its address (lavapipe does not prove addresses uniform inside loops), so
// sharing a key row between lanes saves nothing. Here every lane runs a whole query on its
// own: no barriers, no subgroup operations, lanes busy whenever the batch holds QT
// (token, head) pairs. Item i of the flat list of num_tokens * num_heads pairs, token-major,
// is invocation i % QT of workgroup i / QT (the grid's x then y).
//
// The scores of a tile and the running output live in workgroup memory, one slot per
// invocation: a private array indexed by a loop counter whose trip count is not fixed is
// read and written one lane at a time on every access there (so is workgroup memory, and
// every storage read), so the kernel touches them as seldom as it can: a position's score
// is summed over a slab of chunks (below) in a register and stored once per slab, and its
// probability is read once per slab for the value terms, which are summed over the tile in
// registers. Measured on lavapipe (docs/BENCHMARKS.md): 1.4-1.5x faster for decoding 16
// sequences of tiny15m's heads, and 1.7-1.9x on Llama-3-8B's at 512-2,048 positions, than
// the earlier order (chunk by chunk, each position's score read and written per chunk).
// No invocation reads another's slots, so no barrier is needed.

override HD: u32 = 64u;  // = p.head_dim, a multiple of 8: loops with fixed trip counts
const QT: u32 = 8u;      // invocations per workgroup

// Chunks of eight head elements per slab: the largest divisor of HD / 8 up to MAX_SLAB, a
// constant per pipeline. A slab's loops have that fixed trip count and unroll, so the
// slab's query chunks and value sums are indexed by constants and stay in registers; the
// loop over slabs reads the head size from the parameters, so it stays a loop, and the
// code, which an unrolled loop over every chunk made large enough to slow compilation on
// large heads, stays the size of one slab.
const MAX_SLAB: u32 = 8u;
fn slab() -> u32 {
    let c = HD / 8u;
    return select(select(select(select(select(select(select(1u, 2u, c % 2u == 0u), 3u, c % 3u == 0u), 4u, c % 4u == 0u), 5u, c % 5u == 0u), 6u, c % 6u == 0u), 7u, c % 7u == 0u), 8u, c % 8u == 0u);
}

// The pool again, as 16-byte words: an f16 pool's eight elements of a chunk in one read.
@group(0) @binding(6) var<storage, read> kv4: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> sinks: array<f32>;  // [num_heads] with has_sinks

var<workgroup> score_w: array<f32, 512>;   // [TILE][QT]: the tile's scores, then probabilities
var<workgroup> acc_w: array<f32, 2048>;    // [MAX_HEAD_DIM][QT]: the running A

// Elements 8c .. 8c + 8 of pool row `r` of the half starting at `half`.
fn row8(half: u32, r: u32, c: u32) -> array<vec4<f32>, 2> {
    if KV_DTYPE == DTYPE_F16 {
        let w = kv4[(half + r * (HD / 2u)) / 4u + c];
        return array<vec4<f32>, 2>(
            vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
            vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
        );
    }
    if KV_DTYPE == DTYPE_INT8 || KV_DTYPE == DTYPE_INT4 {
        return load_oct(half, r, c);  // one or two code words and one scale
    }
    let e0 = load_pair(half, r, 4u * c);
    let e1 = load_pair(half, r, 4u * c + 1u);
    let e2 = load_pair(half, r, 4u * c + 2u);
    let e3 = load_pair(half, r, 4u * c + 3u);
    return array<vec4<f32>, 2>(vec4<f32>(e0, e1), vec4<f32>(e2, e3));
}

// The pool row of position `pos` when the query sees it (from `win_start`, below
// `ctx_len`) and this dispatch's shard holds it, else NO_ROW. The block table is not read
// for positions the query does not see (below a window they may be freed blocks' holes).
fn seen_row(seq: u32, kvh: u32, pos: u32, win_start: u32, ctx_len: u32) -> u32 {
    var rb = NO_ROW;
    if pos >= win_start && pos < ctx_len {
        rb = pool_row(seq, kvh, pos);
    }
    return rb;
}

@compute @workgroup_size(QT)
fn paged_attention_lanes(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let item = (wg.y * nwg.x + wg.x) * QT + tid;
    let it = min(item, p.num_tokens * p.num_heads - 1u);
    lane_query(it / p.num_heads, it % p.num_heads, item < p.num_tokens * p.num_heads, tid);
}

// Query token t, head h, run by invocation `tid` alone; written out when `live`.
fn lane_query(t: u32, h: u32, live: bool, tid: u32) {
    let tp = token_pos[t];
    let seq = tp.x;
    let ctx_len = tp.y + 1u;
    let win_start = window_start(ctx_len);
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let v_half = p.shard_num_blocks * p.num_kv_heads * kv_tile_words();
    let qb = (t * p.num_heads + h) * HD;

    var st = initial_state(h);  // (M, L)
    clear_acc(tid);
    for (var tile0 = win_start - win_start % TILE; tile0 < ctx_len; tile0 += TILE) {
        let n = min(TILE, ctx_len - tile0);
        // Scores: a position's terms of a slab of chunks (four pairs each, in order) in a
        // register, then into score_w, the next slab going on from there.
        for (var j = 0u; j < n; j++) {
            score_w[j * QT + tid] = 0.0;
        }
        for (var s0 = 0u; s0 < p.head_dim / 8u; s0 += slab()) {
            var qs: array<array<vec4<f32>, 2>, MAX_SLAB>;
            for (var i = 0u; i < slab(); i++) {
                qs[i] = q8(qb, s0 + i);
            }
            for (var j = 0u; j < n; j++) {
                let rb = seen_row(seq, kvh, tile0 + j, win_start, ctx_len);
                let r = select(0u, rb, rb != NO_ROW);
                var s = score_w[j * QT + tid];
                for (var i = 0u; i < slab(); i++) {
                    let k = row8(0u, r, s0 + i);
                    s = dot8(s, qs[i], k[0], k[1]);
                }
                score_w[j * QT + tid] = s;
            }
        }
        let sc = merge_tile(st, tile_probabilities(seq, kvh, tile0, n, win_start, ctx_len, tid));
        st = sc.xy;
        // The tile's weighted values of a slab of chunks, position by position, then merged
        // into A. Zeroed by a store at every slab (a translator may hoist a var's implicit
        // zero out of the loop).
        for (var s0 = 0u; s0 < p.head_dim / 8u; s0 += slab()) {
            var a: array<array<vec4<f32>, 2>, MAX_SLAB>;
            a = array<array<vec4<f32>, 2>, MAX_SLAB>();
            for (var j = 0u; j < n; j++) {
                let rb = seen_row(seq, kvh, tile0 + j, win_start, ctx_len);
                let r = select(0u, rb, rb != NO_ROW);
                let pr = score_w[j * QT + tid];
                for (var i = 0u; i < slab(); i++) {
                    let v = row8(v_half, r, s0 + i);
                    a[i] = value_term(a[i], rb != NO_ROW, pr, v[0], v[1]);
                }
            }
            for (var i = 0u; i < slab(); i++) {
                merge_values(s0 + i, a[i], sc.zw, tid);
            }
        }
    }
    if live {
        write_out(t, h, st, tid);
    }
}

// The pieces below are shared with paged_attention_tiles.wgsl.

// q[qb + 8c .. qb + 8c + 8], scaled.
fn q8(qb: u32, c: u32) -> array<vec4<f32>, 2> {
    let b = qb + 8u * c;
    return array<vec4<f32>, 2>(
        vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale,
        vec4<f32>(q[b + 4u], q[b + 5u], q[b + 6u], q[b + 7u]) * p.scale,
    );
}

// A score's terms of one chunk of eight head elements (four pairs, in order) added to `s`.
fn dot8(s: f32, qc: array<vec4<f32>, 2>, k0: vec4<f32>, k1: vec4<f32>) -> f32 {
    var dot = s;
    dot += qc[0].x * k0.x + qc[0].y * k0.y;
    dot += qc[0].z * k0.z + qc[0].w * k0.w;
    dot += qc[1].x * k1.x + qc[1].y * k1.y;
    dot += qc[1].z * k1.z + qc[1].w * k1.w;
    return dot;
}

// One position's weighted value row added to `a` when the query sees the position.
fn value_term(a: array<vec4<f32>, 2>, seen: bool, pr: f32, v0: vec4<f32>, v1: vec4<f32>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(select(a[0], a[0] + pr * v0, seen), select(a[1], a[1] + pr * v1, seen));
}

fn clear_acc(tid: u32) {
    for (var d = 0u; d < HD; d++) {
        acc_w[d * QT + tid] = 0.0;
    }
}

// The tile's scores (positions tile0 .. tile0 + n, in score_w) soft-capped and masked to
// what the query sees, its maximum m_T, the probabilities (in place) and their sum l_T:
// (m_T, l_T).
fn tile_probabilities(seq: u32, kvh: u32, tile0: u32, n: u32, win_start: u32, ctx_len: u32, tid: u32) -> vec2<f32> {
    var m_tile = NEG_BIG;
    for (var j = 0u; j < n; j++) {
        let seen = seen_row(seq, kvh, tile0 + j, win_start, ctx_len) != NO_ROW;
        let sc = select(NEG_BIG, capped(score_w[j * QT + tid]), seen);
        score_w[j * QT + tid] = sc;
        m_tile = max(m_tile, sc);
    }
    var l_tile = 0.0;
    for (var j = 0u; j < n; j++) {
        let seen = seen_row(seq, kvh, tile0 + j, win_start, ctx_len) != NO_ROW;
        let pr = select(0.0, exp(score_w[j * QT + tid] - m_tile), seen);
        score_w[j * QT + tid] = pr;
        l_tile += pr;
    }
    return vec2<f32>(m_tile, l_tile);
}

// The running (M, L) after a tile of (m_T, l_T), and the factors A and the tile's values
// are scaled by: (M', L', c_old, c_tile).
fn merge_tile(st: vec2<f32>, tile: vec2<f32>) -> vec4<f32> {
    let m_new = max(st.x, tile.x);
    let c_old = exp(st.x - m_new);
    let c_tile = exp(tile.x - m_new);
    return vec4<f32>(m_new, st.y * c_old + tile.y * c_tile, c_old, c_tile);
}

// A[8c .. 8c + 8] = A * c_old + a * c_tile, with f = (c_old, c_tile).
fn merge_values(c: u32, a: array<vec4<f32>, 2>, f: vec2<f32>, tid: u32) {
    let o = 8u * c * QT + tid;
    let old0 = vec4<f32>(acc_w[o], acc_w[o + QT], acc_w[o + 2u * QT], acc_w[o + 3u * QT]);
    let old1 = vec4<f32>(acc_w[o + 4u * QT], acc_w[o + 5u * QT], acc_w[o + 6u * QT], acc_w[o + 7u * QT]);
    let new0 = old0 * f.x + a[0] * f.y;
    let new1 = old1 * f.x + a[1] * f.y;
    acc_w[o] = new0.x;
    acc_w[o + QT] = new0.y;
    acc_w[o + 2u * QT] = new0.z;
    acc_w[o + 3u * QT] = new0.w;
    acc_w[o + 4u * QT] = new1.x;
    acc_w[o + 5u * QT] = new1.y;
    acc_w[o + 6u * QT] = new1.z;
    acc_w[o + 7u * QT] = new1.w;
}

// Query token t, head h's result from A and st = (M, L): A / L, or with a split pool the
// shard's partial (A, M, L).
fn write_out(t: u32, h: u32, st: vec2<f32>, tid: u32) {
    if p.num_shards == 1u {
        let qb = (t * p.num_heads + h) * HD;
        let inv = select(0.0, 1.0 / st.y, st.y > 0.0);
        for (var d = 0u; d < HD; d++) {
            out[qb + d] = acc_w[d * QT + tid] * inv;
        }
    } else {
        let stride = HD + 2u;
        let o = ((p.shard_index * p.num_tokens + t) * p.num_heads + h) * stride;
        for (var d = 0u; d < HD; d++) {
            out[o + d] = acc_w[d * QT + tid];
        }
        out[o + HD] = st.x;
        out[o + HD + 1u] = st.y;
    }
}
