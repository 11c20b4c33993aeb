// Shared by every attention kernel (paged_attention.wgsl, paged_attention_sg.wgsl,
// paged_attention_lanes.wgsl): parameters, bindings, and the reads of the paged KV pool.
//
// Causal attention of a flat batch of query tokens over the paged KV pool. Prefill chunks
// and decode steps are the same thing here: token t belongs to sequence seq(t) at position
// pos(t) and attends to positions 0..=pos(t) of its own sequence (with a sliding window,
// the last `window` of them), read through that sequence's block table. Grouped-query and
// multi-query attention map query head h to KV head h / (num_heads / num_kv_heads).
//
// The arithmetic, which every kernel follows term for term so that they agree bit for bit
// and a token's result never depends on which kernel ran or what else was in the batch:
// positions are taken in tiles of TILE, tile k holding positions [k * TILE, (k + 1) * TILE);
// a query visits the tiles that hold any position it sees, in increasing order. In tile T,
// for the positions j the query sees (and, with a split pool, that the dispatch's shard
// holds):
//   s_j  = sum over pairs e, in increasing e, of (q[2e] * k_j[2e] + q[2e+1] * k_j[2e+1]),
//          q pre-multiplied by the scale, then soft-capped when softcap > 0;
//   m_T  = max_j s_j (NEG_BIG when the tile holds none);
//   p_j  = exp(s_j - m_T), 0 for the positions not seen;
//   l_T  = sum of p_j in increasing j;   a_T = sum of p_j * v_j in increasing j.
// The running state (M, L, A), starting at (NEG_BIG, 0, 0), takes each tile in turn:
//   M' = max(M, m_T);  L = L * exp(M - M') + l_T * exp(m_T - M');  likewise A;  M = M'.
// The output is A / L, or with a pool split over several buffers ("shards" of blocks) the
// partial (A, M, L) of each shard's dispatch, which paged_attention_reduce.wgsl merges.

override KV_DTYPE: u32 = 1u;  // DTYPE_F32, DTYPE_F16, DTYPE_INT8 or DTYPE_INT4
override KV_GROUP: u32 = 64u; // values per scale (quantized pools)
// Benchmark baseline: the cache is contiguous per sequence (sequence s owns "block" s, whose
// block_size is the longest context) and no block table is read.
override CONTIGUOUS: bool = false;
// = p.block_size. A constant of the pipeline, so that the divisions by it in every
// position's block-table lookup compile to shifts or multiplications (CPU adapters turn a
// division by a uniform value into one division per lane).
override BLOCK_SIZE: u32 = 16u;

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
    // With has_sinks = 1 (gpt-oss), sinks[h] is head h's learned logit: one more score in
    // the softmax's sum with no value (the kernel declares the sinks binding).
    has_sinks: u32,
    // Sliding window: with window > 0, a query at position p sees positions
    // p - window + 1 ..= p only (and the block table is not read below them, so freed
    // blocks there may be holes).
    window: u32,
    // Soft-capping of scores, cap * tanh(score / cap), when softcap > 0 (Gemma 2).
    softcap: f32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;               // [num_tokens, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> kv: array<u32>;              // [2, shard_num_blocks, num_kv_heads, tile]: float rows, or quantized tiles (pool::quant)
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;    // [num_seqs, max_blocks_per_seq]
@group(0) @binding(4) var<storage, read> token_pos: array<vec2<u32>>; // [num_tokens] (sequence index, position)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;       // [num_tokens, num_heads, head_dim], or with num_shards > 1
                                                                      // [num_shards, num_tokens, num_heads, head_dim + 2] partials

const MAX_HEAD_DIM: u32 = 256u;
const NO_ROW: u32 = 0xffffffffu;
const TILE: u32 = 64u;  // positions per tile of the arithmetic above

// The online softmax's starting state (M, L) for query head h: empty, or with sinks the
// head's sink as a score already seen (M = sink, L = exp(sink - M) = 1) whose value is zero;
// shard 0's partial alone carries it, so the merge of shards counts it once.
fn initial_state(h: u32) -> vec2<f32> {
    if p.has_sinks == 1u && p.shard_index == 0u {
        return vec2<f32>(sinks[h], 1.0);
    }
    return vec2<f32>(NEG_BIG, 0.0);
}

// The first position a query with `ctx_len` positions sees.
fn window_start(ctx_len: u32) -> u32 {
    if p.window > 0u && ctx_len > p.window {
        return ctx_len - p.window;
    }
    return 0u;
}

// The pool row (of this dispatch's shard) holding position `pos` of sequence `seq` for KV
// head `kvh`, or NO_ROW when its block is in another shard. Reads the block table.
fn pool_row(seq: u32, kvh: u32, pos: u32) -> u32 {
    var block = seq;
    if !CONTIGUOUS {
        block = block_tables[seq * p.max_blocks_per_seq + pos / BLOCK_SIZE];
    }
    let local_block = block - p.shard_first_block;
    let mine = block >= p.shard_first_block && local_block < p.shard_num_blocks;
    return select(NO_ROW, (local_block * p.num_kv_heads + kvh) * BLOCK_SIZE + pos % BLOCK_SIZE, mine);
}

// A score soft-capped when softcap > 0. tanh's argument is clamped where tanh is 1 to f32
// precision (some drivers' tanh overflows for large inputs).
fn capped(s: f32) -> f32 {
    return select(s, p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0)), p.softcap > 0.0);
}

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
    let values = BLOCK_SIZE * kv_row_words();
    if KV_DTYPE == DTYPE_INT8 || KV_DTYPE == DTYPE_INT4 {
        return values + (BLOCK_SIZE * (p.head_dim / KV_GROUP) + 1u) / 2u;
    }
    return values;
}

// Where row r ((local block, KV head) tile r / block_size, row r % block_size) of a
// quantized pool's half starting at word `half` lives: (word of its first codes, f16 index
// of its first scale). The layout is src/pool/quant.rs's.
fn quant_row(half: u32, r: u32) -> vec2<u32> {
    let tile = r / BLOCK_SIZE;
    let off = r - tile * BLOCK_SIZE;
    let rw = kv_row_words();
    let tb = half + tile * kv_tile_words();
    return vec2<u32>(tb + off * rw, 2u * (tb + BLOCK_SIZE * rw) + off * (p.head_dim / KV_GROUP));
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
