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
// invocation: a private array indexed by a loop counter is read and written one lane at a
// time on every access there, while these are touched once per position and chunk of eight
// head elements. No invocation reads another's slots, so no barrier is needed.

override HD: u32 = 64u;  // = p.head_dim, a multiple of 8: loops with fixed trip counts
const QT: u32 = 8u;      // invocations per workgroup

// The pool again, as 16-byte words: an f16 pool's eight elements of a chunk in one read.
@group(0) @binding(6) var<storage, read> kv4: array<vec4<u32>>;

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
    let live = item < p.num_tokens * p.num_heads;
    let it = min(item, p.num_tokens * p.num_heads - 1u);
    let t = it / p.num_heads;
    let h = it % p.num_heads;
    let tp = token_pos[t];
    let seq = tp.x;
    let ctx_len = tp.y + 1u;
    let win_start = window_start(ctx_len);
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let v_half = p.shard_num_blocks * p.num_kv_heads * kv_tile_words();
    let qb = (t * p.num_heads + h) * HD;

    var m = NEG_BIG;
    var l = 0.0;
    for (var d = 0u; d < HD; d++) {
        acc_w[d * QT + tid] = 0.0;
    }

    for (var tile0 = win_start - win_start % TILE; tile0 < ctx_len; tile0 += TILE) {
        let n = min(TILE, ctx_len - tile0);
        // Scores, eight head elements (four pairs, in order) at a time.
        for (var j = 0u; j < n; j++) {
            score_w[j * QT + tid] = 0.0;
        }
        for (var c = 0u; c < HD / 8u; c++) {
            let q0 = vec4<f32>(q[qb + 8u * c], q[qb + 8u * c + 1u], q[qb + 8u * c + 2u], q[qb + 8u * c + 3u]) * p.scale;
            let q1 = vec4<f32>(q[qb + 8u * c + 4u], q[qb + 8u * c + 5u], q[qb + 8u * c + 6u], q[qb + 8u * c + 7u]) * p.scale;
            for (var j = 0u; j < n; j++) {
                let rb = seen_row(seq, kvh, tile0 + j, win_start, ctx_len);
                let k = row8(0u, select(0u, rb, rb != NO_ROW), c);
                var dot = score_w[j * QT + tid];
                dot += q0.x * k[0].x + q0.y * k[0].y;
                dot += q0.z * k[0].z + q0.w * k[0].w;
                dot += q1.x * k[1].x + q1.y * k[1].y;
                dot += q1.z * k[1].z + q1.w * k[1].w;
                score_w[j * QT + tid] = dot;
            }
        }
        // The tile's maximum, the probabilities and their sum.
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
        let m_new = max(m, m_tile);
        let c_old = exp(m - m_new);
        let c_tile = exp(m_tile - m_new);
        l = l * c_old + l_tile * c_tile;
        m = m_new;
        // The weighted values, eight head elements at a time, merged into A.
        for (var c = 0u; c < HD / 8u; c++) {
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            for (var j = 0u; j < n; j++) {
                let rb = seen_row(seq, kvh, tile0 + j, win_start, ctx_len);
                let pr = score_w[j * QT + tid];
                let v = row8(v_half, select(0u, rb, rb != NO_ROW), c);
                a0 = select(a0, a0 + pr * v[0], rb != NO_ROW);
                a1 = select(a1, a1 + pr * v[1], rb != NO_ROW);
            }
            let o = 8u * c * QT + tid;
            let old0 = vec4<f32>(acc_w[o], acc_w[o + QT], acc_w[o + 2u * QT], acc_w[o + 3u * QT]);
            let old1 = vec4<f32>(acc_w[o + 4u * QT], acc_w[o + 5u * QT], acc_w[o + 6u * QT], acc_w[o + 7u * QT]);
            let new0 = old0 * c_old + a0 * c_tile;
            let new1 = old1 * c_old + a1 * c_tile;
            acc_w[o] = new0.x;
            acc_w[o + QT] = new0.y;
            acc_w[o + 2u * QT] = new0.z;
            acc_w[o + 3u * QT] = new0.w;
            acc_w[o + 4u * QT] = new1.x;
            acc_w[o + 5u * QT] = new1.y;
            acc_w[o + 6u * QT] = new1.z;
            acc_w[o + 7u * QT] = new1.w;
        }
    }

    if !live {
        return;
    }
    if p.num_shards == 1u {
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var d = 0u; d < HD; d++) {
            out[qb + d] = acc_w[d * QT + tid] * inv;
        }
    } else {
        let stride = HD + 2u;
        let o = ((p.shard_index * p.num_tokens + t) * p.num_heads + h) * stride;
        for (var d = 0u; d < HD; d++) {
            out[o + d] = acc_w[d * QT + tid];
        }
        out[o + HD] = m;
        out[o + HD + 1u] = l;
    }
}
