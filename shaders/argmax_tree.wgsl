// Shared by argmax.wgsl and argmax_slices.wgsl, each of which defines WG (threads per
// workgroup) and the logits binding: a workgroup's reduction of the logits start .. end of
// the row that starts at `base`. Thread t scans start + t, start + t + WG, ... keeping the
// first of equal maxima; (value, index) pairs are merged in a fixed tree (the lower index
// wins a tie); then each thread sums exp(logit - maximum) over the same elements in order
// and the sums are added in a fixed tree. Every thread must call it (it has barriers), and
// every thread gets the result.

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;

struct Reduced {
    value: f32,  // the maximum
    index: u32,  // its first index in the row
    sum: f32,    // the sum of exp(logit - value) over start .. end
}

fn reduce_range(base: u32, start: u32, end: u32, tid: u32) -> Reduced {
    var bv = NEG_BIG;
    var bi = NONE;
    for (var i = start + tid; i < end; i += WG) {
        let v = logits[base + i];
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
    for (var i = start + tid; i < end; i += WG) {
        acc += exp(logits[base + i] - m);
    }
    sums[tid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if tid < stride {
            sums[tid] += sums[tid + stride];
        }
        workgroupBarrier();
    }
    return Reduced(m, best_i[0], sums[0]);
}
