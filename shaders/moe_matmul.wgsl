// moe_matmul: one projection of every expert of a mixture, over the slots routed to each
// (moe_route.wgsl's offsets and list): y[s, n_offset + c] = x[s / in_div] · W_e[c] for each
// slot s that chose expert e, where W_e is rows e * n .. (e + 1) * n of the weight binding
// (experts expert_first .. of the layer; a weight in several buffers gets a dispatch per
// buffer). in_div is top_k where the input is per token (gate and up read the token's normed
// hidden state) and 1 where it is per slot (down reads the slot's activation).
//
// Grid: x covers the n output columns, 64 per workgroup, one per invocation; y is the expert.
// A workgroup walks its expert's slots ROWS at a time and decodes each group of eight weights
// once for all of them, so an expert's weights are read once per ROWS tokens that chose it,
// and not at all when none did. Each output is one invocation's sum over k in increasing k,
// as in the dense column kernels: a slot's result does not depend on the others.

override WEIGHT_DTYPE: u32 = 0u;
const ROWS: u32 = 8u;

struct Params {
    n: u32,
    k: u32,
    ldy: u32,
    n_offset: u32,
    expert_first: u32,
    in_div: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;          // [rows, k]
@group(0) @binding(2) var<storage, read> w: array<u32>;          // [experts * n, k] in WEIGHT_DTYPE
@group(0) @binding(3) var<storage, read> offsets: array<u32>;    // [experts + 1]
@group(0) @binding(4) var<storage, read> list: array<u32>;       // slots by expert
@group(0) @binding(5) var<storage, read_write> y: array<f32>;    // [slots, ldy]

// Word i of the weights (for weight_blocks.wgsl).
fn wword(i: u32) -> u32 {
    return w[i];
}

@compute @workgroup_size(64)
fn moe_matmul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let column = wg.x * 64u + tid;
    let c = min(column, p.n - 1u);
    let e = p.expert_first + wg.y;
    let first = offsets[e];
    let end = offsets[e + 1u];
    let wrow = wg.y * p.n + c;
    for (var r0 = first; r0 < end; r0 += ROWS) {
        var acc: array<f32, ROWS>;
        var xrow: array<u32, ROWS>;
        for (var r = 0u; r < ROWS; r++) {
            acc[r] = 0.0;
            xrow[r] = (list[min(r0 + r, end - 1u)] / p.in_div) * p.k;
        }
        if is_block_dtype() {
            // Whole blocks, so k % 8 == 0; eight weights decoded at a time.
            for (var j = 0u; j < p.k / 8u; j++) {
                var b = block8(wrow * row_words(p.k), j);
                for (var r = 0u; r < ROWS; r++) {
                    for (var i = 0u; i < 8u; i++) {
                        acc[r] += x[xrow[r] + 8u * j + i] * b[i / 4u][i % 4u];
                    }
                }
            }
        } else if WEIGHT_DTYPE == DTYPE_F32 {
            for (var k = 0u; k < p.k; k++) {
                let b = bitcast<f32>(w[wrow * p.k + k]);
                for (var r = 0u; r < ROWS; r++) {
                    acc[r] += x[xrow[r] + k] * b;
                }
            }
        } else {
            let words = p.k / 2u;
            for (var j = 0u; j < words; j++) {
                let b = unpack_pair(w[wrow * words + j], WEIGHT_DTYPE);
                for (var r = 0u; r < ROWS; r++) {
                    acc[r] += x[xrow[r] + 2u * j] * b.x;
                    acc[r] += x[xrow[r] + 2u * j + 1u] * b.y;
                }
            }
        }
        if column < p.n {
            for (var r = 0u; r < ROWS && r0 + r < end; r++) {
                y[list[r0 + r] * p.ldy + p.n_offset + c] = acc[r];
            }
        }
    }
}
