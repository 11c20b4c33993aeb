// argmax: out[r] = the index of the largest logit of row r (the first one on ties, as
// torch.argmax), and out[num_rows + r] = the bits of that token's log-probability
// (log_softmax, as f32), so greedy decoding reads back 8 bytes per sequence, not a
// vocabulary row, and still knows its cumulative logprob.
// Grid: one workgroup per row; 256 threads reduce (value, index) pairs, then sum
// exp(logit - max) in a fixed tree order, so a row's result never depends on other rows.

@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [2, num_rows]

const WG: u32 = 256u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;

@compute @workgroup_size(WG)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let r = wg.x;
    var bv = NEG_BIG;
    var bi = NONE;
    for (var i = tid; i < p.width; i += WG) {
        let v = logits[r * p.width + i];
        if v > bv || bi == NONE {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            let ov = best_v[tid + stride];
            let oi = best_i[tid + stride];
            if takes_over(ov, oi, best_v[tid], best_i[tid]) {
                best_v[tid] = ov;
                best_i[tid] = oi;
            }
        }
        workgroupBarrier();
    }
    let m = best_v[0];
    var acc = 0.0;
    for (var i = tid; i < p.width; i += WG) {
        acc += exp(logits[r * p.width + i] - m);
    }
    sums[tid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            sums[tid] += sums[tid + stride];
        }
        workgroupBarrier();
    }
    if tid == 0u {
        out[r] = best_i[0];
        out[p.num_rows + r] = bitcast<u32>(-log(sums[0]));
    }
}
