// Shared by paged_attention.wgsl and paged_attention_sg.wgsl, which are compiled with this
// text prepended and differ only in score() and values(): how a key row is dotted with q, and
// how a tile's probabilities and value rows are accumulated.
//
// Causal attention of a flat batch of query tokens over the paged KV pool.
// Prefill chunks and decode steps are the same thing here: token t belongs to sequence
// seq(t) at position pos(t) and attends to positions 0..=pos(t) of its own sequence, read
// through that sequence's block table. Grouped-query and multi-query attention map query
// head h to KV head h / (num_heads / num_kv_heads). Softmax is computed online (running
// max and sum, rescaling the accumulator when the max grows), one tile of 64 positions at a
// time.
//
// A pool split over several buffers ("shards" of blocks) is handled one shard per dispatch:
// with num_shards > 1 each dispatch writes its unnormalised partial result (acc, max, sum)
// and paged_attention_reduce.wgsl merges them.
// Grid: one workgroup per (query head, query token) = (x, y); 64 threads. In the score
// phase a thread owns one key position of the tile; in the value phase it owns pairs of
// output elements.

override KV_DTYPE: u32 = 1u;  // DTYPE_F32, DTYPE_F16, DTYPE_INT8 or DTYPE_INT4
override KV_GROUP: u32 = 64u; // values per scale (quantized pools)
// Benchmark baseline: the cache is contiguous per sequence (sequence s owns "block" s, whose
// block_size is the longest context) and no block table is read.
override CONTIGUOUS: bool = false;

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks_per_seq: u32,
    shard_first_block: u32,
    shard_num_blocks: u32,
    scale: f32,
    num_shards: u32,
    shard_index: u32,
    // Position groups of the value phase: 1, or with head_dim / 2 pairs that fit a group of
    // WG / value_groups threads, that many groups each summing its own share of every
    // tile's positions (see attention_body). A group is a power-of-two run of
    // local_invocation_index at least as long as the adapter's largest subgroup, which
    // assumes subgroups are contiguous runs of it (as on every Vulkan, Metal and D3D12
    // implementation in use; the subgroup kernel's bitwise agreement with the plain one in
    // tests/kernels_attention.rs would show otherwise).
    value_groups: u32,
    // Sliding window: with window > 0, a query at position p sees positions
    // p - window + 1 ..= p only (and the block table is not read below them, so freed
    // blocks there may be holes).
    window: u32,
    // Soft-capping of scores, cap * tanh(score / cap), when softcap > 0 (Gemma 2).
    softcap: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;               // [num_tokens, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> kv: array<u32>;              // [2, shard_num_blocks, num_kv_heads, tile]: float rows, or quantized tiles (pool::quant)
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;    // [num_seqs, max_blocks_per_seq]
@group(0) @binding(4) var<storage, read> token_pos: array<vec2<u32>>; // [num_tokens] (sequence index, position)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;       // [num_tokens, num_heads, head_dim], or with num_shards > 1
                                                                      // [num_shards, num_tokens, num_heads, head_dim + 2] partials

const WG: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const PAIRS_PER_THREAD: u32 = 2u;  // MAX_HEAD_DIM / 2 / WG
const NO_ROW: u32 = 0xffffffffu;

var<workgroup> q_s: array<f32, MAX_HEAD_DIM>;
var<workgroup> prob: array<f32, WG>;
var<workgroup> row: array<u32, WG>;  // pool row index of each tile position, or NO_ROW
var<workgroup> red: array<f32, WG>;
var<workgroup> comb: array<vec2<f32>, WG>;  // the value groups' partial sums
// u32 words of one row's values (one token, one KV head), scales not counted.
fn kv_row_words() -> u32 {
    switch KV_DTYPE {
        case DTYPE_F32: { return p.head_dim; }
        case DTYPE_INT8: { return p.head_dim / 4u; }
        case DTYPE_INT4: { return p.head_dim / 8u; }
        default: { return p.head_dim / 2u; }
    }
}

// u32 words of one (block, KV head) tile: block_size rows, then (quantized) their scales.
fn kv_tile_words() -> u32 {
    let values = p.block_size * kv_row_words();
    if KV_DTYPE == DTYPE_INT8 || KV_DTYPE == DTYPE_INT4 {
        return values + (p.block_size * (p.head_dim / KV_GROUP) + 1u) / 2u;
    }
    return values;
}

// Where row r ((local block, KV head) tile r / block_size, row r % block_size) of a
// quantized pool's half starting at word `half` lives: (word of its first codes, f16 index
// of its first scale). The layout is src/pool/quant.rs's.
fn quant_row(half: u32, r: u32) -> vec2<u32> {
    let tile = r / p.block_size;
    let off = r - tile * p.block_size;
    let rw = kv_row_words();
    let tb = half + tile * kv_tile_words();
    return vec2<u32>(tb + off * rw, 2u * (tb + p.block_size * rw) + off * (p.head_dim / KV_GROUP));
}

// The f16 at f16 index `si` of the pool.
fn scale_at(si: u32) -> f32 {
    let sw = unpack2x16float(kv[si >> 1u]);
    return select(sw.x, sw.y, (si & 1u) == 1u);
}

// Elements 2e and 2e+1 of pool row r ((local block, KV head) tile r / block_size, row
// r % block_size) of the half starting at word `half` (0 for K, v_half for V), decoded.
// The quantized layout is src/pool/quant.rs's.
fn load_pair(half: u32, r: u32, e: u32) -> vec2<f32> {
    if KV_DTYPE == DTYPE_F32 {
        let base = half + r * p.head_dim;
        return vec2<f32>(bitcast<f32>(kv[base + 2u * e]), bitcast<f32>(kv[base + 2u * e + 1u]));
    }
    if KV_DTYPE == DTYPE_F16 {
        return unpack2x16float(kv[half + r * (p.head_dim / 2u) + e]);
    }
    let q = quant_row(half, r);
    let s = scale_at(q.y + (2u * e) / KV_GROUP);
    var c: vec2<i32>;
    if KV_DTYPE == DTYPE_INT8 {
        let w = bitcast<i32>(kv[q.x + e / 2u]);
        let sh = 16u * (e & 1u);
        c = vec2<i32>(extractBits(w, sh, 8u), extractBits(w, sh + 8u, 8u));
    } else {
        let w = bitcast<i32>(kv[q.x + e / 4u]);
        let sh = 8u * (e & 3u);
        c = vec2<i32>(extractBits(w, sh, 4u), extractBits(w, sh + 4u, 4u));
    }
    return vec2<f32>(c) * s;
}

// Elements 8o .. 8o+7 of pool row r of the half starting at word `half`, decoded, for
// quantized pools: one or two code words and one scale (a group is a whole number of
// eights), where load_pair would fetch them once per pair.
fn load_oct(half: u32, r: u32, o: u32) -> array<vec4<f32>, 2> {
    let q = quant_row(half, r);
    let s = scale_at(q.y + (8u * o) / KV_GROUP);
    var lo: vec4<i32>;
    var hi: vec4<i32>;
    if KV_DTYPE == DTYPE_INT8 {
        let w0 = bitcast<i32>(kv[q.x + 2u * o]);
        let w1 = bitcast<i32>(kv[q.x + 2u * o + 1u]);
        lo = vec4<i32>(extractBits(w0, 0u, 8u), extractBits(w0, 8u, 8u), extractBits(w0, 16u, 8u), extractBits(w0, 24u, 8u));
        hi = vec4<i32>(extractBits(w1, 0u, 8u), extractBits(w1, 8u, 8u), extractBits(w1, 16u, 8u), extractBits(w1, 24u, 8u));
    } else {
        let w = bitcast<i32>(kv[q.x + o]);
        lo = vec4<i32>(extractBits(w, 0u, 4u), extractBits(w, 4u, 4u), extractBits(w, 8u, 4u), extractBits(w, 12u, 4u));
        hi = vec4<i32>(extractBits(w, 16u, 4u), extractBits(w, 20u, 4u), extractBits(w, 24u, 4u), extractBits(w, 28u, 4u));
    }
    return array<vec4<f32>, 2>(vec4<f32>(lo) * s, vec4<f32>(hi) * s);
}

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

fn reduce_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            red[tid] += red[tid + stride];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// The kernel body, for workgroup `wg`, invocation `tid`, subgroup lane `lane`. Control flow
// around score() and values() is uniform, so they may use subgroup operations.
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

    var m = NEG_BIG;
    var l = 0.0;
    var acc: array<vec2<f32>, PAIRS_PER_THREAD>;
    for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
        acc[i] = vec2<f32>(0.0);
    }

    var win_start = 0u;
    if p.window > 0u && ctx_len > p.window {
        win_start = ctx_len - p.window;
    }
    for (var tile0 = win_start; tile0 < ctx_len; tile0 += WG) {
        let pos = tile0 + tid;
        var base = NO_ROW;
        if pos < ctx_len {
            var block = seq;
            if !CONTIGUOUS {
                block = block_tables[seq * p.max_blocks_per_seq + pos / p.block_size];
            }
            if block >= p.shard_first_block && block - p.shard_first_block < p.shard_num_blocks {
                let local_block = block - p.shard_first_block;
                base = (local_block * p.num_kv_heads + kvh) * p.block_size + pos % p.block_size;
            }
        }
        // Every lane scores a row (row 0 stands in for a missing one) so that score() runs
        // in uniform control flow.
        var s_raw = score(select(0u, base, base != NO_ROW), lane);
        if p.softcap > 0.0 {
            // tanh's argument is clamped where tanh is 1 to f32 precision (some drivers'
            // tanh overflows for large inputs).
            s_raw = p.softcap * tanh(clamp(s_raw / p.softcap, -15.0, 15.0));
        }
        let s = select(NEG_BIG, s_raw, base != NO_ROW);
        row[tid] = base;
        let m_new = max(m, reduce_max(tid, s));
        let pr = select(0.0, exp(s - m_new), base != NO_ROW);
        prob[tid] = pr;
        let tile_sum = reduce_sum(tid, pr);  // its barriers also publish prob[] and row[]
        let corr = exp(m - m_new);
        l = l * corr + tile_sum;
        let n_valid = min(WG, ctx_len - tile0);
        if p.value_groups > 1u {
            // Group g of `size` threads sums positions [g * size, (g + 1) * size) of the
            // tile for its thread's pair; the groups' sums are added after the last tile.
            // Every thread loops as often as every other, so the loop stays uniform.
            let size = WG / p.value_groups;
            let g = tid / size;
            let e = tid - g * size;
            acc[0] = values(acc[0] * corr, min(e, half_dim - 1u), g * size, size, n_valid, v_half, lane);
        } else {
            for (var i = 0u; i < PAIRS_PER_THREAD; i++) {
                // Uniform: every lane runs values() when any lane of the workgroup has pair e.
                if i * WG < half_dim {
                    let e = tid + i * WG;
                    let a = values(acc[i] * corr, min(e, half_dim - 1u), 0u, WG, n_valid, v_half, lane);
                    if e < half_dim {
                        acc[i] = a;
                    }
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    if p.value_groups > 1u {
        // The groups' partial sums, added in group order, end with the first group's threads.
        comb[tid] = acc[0];
        workgroupBarrier();
        let size = WG / p.value_groups;
        if tid < size {
            var a = comb[tid];
            for (var g = 1u; g < p.value_groups; g++) {
                a += comb[g * size + tid];
            }
            acc[0] = a;
        }
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
