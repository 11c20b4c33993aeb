// Shared by every matmul kernel (matmul.wgsl and the column kernels): the parameters, the
// bias and output bindings, and the store of one output element.
//
// The weight may be several projections stacked (q, k and v): with split1 > 0 its columns
// [0, split1) go to y, [split1, split2) to y1 and [split2, ldy) to y2, each [m, its own
// width], so one dispatch fills three buffers. Without splits y1 and y2 are y again and
// never written through.

// The input: x is [m, k] (GATED = 0), or [m, 2k], each row's gate then its up (the stacked
// gate-up projection's output), and the product's input is act(gate) * up, computed as it is
// read: SiLU (GATED = 1) or GELU with the tanh approximation (GATED = 2), as in
// silu_mul.wgsl. That fuses the MLP's gated activation into the down projection.
override GATED: u32 = 0u;

// f32 words from one input row to the next.
fn x_stride() -> u32 {
    return select(p.k, 2u * p.k, GATED != 0u);
}

// act(g) * u, with the expressions of silu_mul.wgsl (tanh's argument clamped where tanh is
// 1 to f32 precision, since some drivers' tanh overflows for large inputs).
fn gated4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    if GATED == 2u {
        let t = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), vec4<f32>(-15.0), vec4<f32>(15.0));
        return 0.5 * g * (1.0 + tanh(t)) * u;
    }
    return g / (1.0 + exp(-g)) * u;
}

// The input's RMSNorm (NORM): the product's input is x[r, e] * s_r * norm_w[e], s_r being
// the row's 1 / sqrt(mean(x[r, :]^2) + eps) with its squares summed as common.wgsl's inv_rms
// sums them, which is rms_norm_lanes.wgsl's output to the bit, computed as the kernel reads
// x. That fuses the norm before a projection (the q k v, gate-up and LM head inputs) into
// it. Needs k % 8 == 0; never with GATED.
override NORM: bool = false;
override NORM_DTYPE: u32 = 0u;

// norm_w[4i .. 4i + 4].
fn norm4(i: u32) -> vec4<f32> {
    if NORM_DTYPE == DTYPE_F32 {
        return bitcast<vec4<f32>>(vec4<u32>(norm_w[4u * i], norm_w[4u * i + 1u], norm_w[4u * i + 2u], norm_w[4u * i + 3u]));
    }
    return vec4<f32>(unpack_pair(norm_w[2u * i], NORM_DTYPE), unpack_pair(norm_w[2u * i + 1u], NORM_DTYPE));
}

// norm_w[e].
fn norm_at(e: u32) -> f32 {
    if NORM_DTYPE == DTYPE_F32 {
        return bitcast<f32>(norm_w[e]);
    }
    let pair = unpack_pair(norm_w[e / 2u], NORM_DTYPE);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

struct Params {
    m: u32,
    n: u32,          // rows of this weight chunk
    k: u32,
    n_offset: u32,   // first output column written by this chunk
    ldy: u32,        // output columns of the whole (stacked) weight
    _pad2: u32,
    _pad3: u32,
    first_row: u32,  // column kernels: this dispatch computes rows first_row .. m; 0 in matmul.wgsl
    split1: u32,     // 0, or the first column that goes to y1
    split2: u32,     // with split1 > 0: the first column that goes to y2 (ldy when none does)
    eps: f32,        // with NORM: the norm's epsilon
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> bias: array<f32>;        // [ldy] (unused without STORE_BIAS)
@group(0) @binding(4) var<storage, read_write> y: array<f32>;     // [m, ldy], or [m, split1]
@group(0) @binding(5) var<storage, read_write> y1: array<f32>;    // [m, split2 - split1]
@group(0) @binding(6) var<storage, read_write> y2: array<f32>;    // [m, ldy - split2]
@group(0) @binding(7) var<storage, read> norm_w: array<u32>;      // [k] in NORM_DTYPE (unused unless NORM)

// What a store does besides writing the sum, fixed per pipeline: add the bias
// (STORE_BIAS), add what the output holds (STORE_ACCUMULATE: the residual connection), and
// send columns past split1 to y1 and y2 (STORE_SPLIT: the stacked q k v). Constants, not
// parameters: a CPU adapter runs every side of a branch whose condition differs between
// lanes, and the split's does, so with parameters every store of every projection paid for
// three outputs' address arithmetic and per-lane store loops. Measured on lavapipe
// (docs/BENCHMARKS.md): a 16-row LM head (32,000 x 288) took 1.36-1.42x the time of one
// whose store is a plain write, the split's branches two thirds of that.
override STORE: u32 = 0u;
const STORE_BIAS: u32 = 1u;
const STORE_ACCUMULATE: u32 = 2u;
const STORE_SPLIT: u32 = 4u;

// Output row r, column col of the whole weight: acc, then + bias, then + what the output
// holds when accumulating (the order every kernel keeps, for batch invariance).
fn store_output(r: u32, col: u32, acc: f32) {
    var v = acc;
    if (STORE & STORE_BIAS) != 0u {
        v += bias[col];
    }
    let accumulate = (STORE & STORE_ACCUMULATE) != 0u;
    if (STORE & STORE_SPLIT) == 0u {
        let o = r * p.ldy + col;
        if accumulate {
            v += y[o];
        }
        y[o] = v;
    } else if col < p.split1 {
        let o = r * p.split1 + col;
        if accumulate {
            v += y[o];
        }
        y[o] = v;
    } else if col < p.split2 {
        let o = r * (p.split2 - p.split1) + col - p.split1;
        if accumulate {
            v += y1[o];
        }
        y1[o] = v;
    } else {
        let o = r * (p.ldy - p.split2) + col - p.split2;
        if accumulate {
            v += y2[o];
        }
        y2[o] = v;
    }
}
