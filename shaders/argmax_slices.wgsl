// argmax_slices: the first pass of the split arg-max (argmax.wgsl's contract in two
// dispatches). A workgroup per (slice, row), grid [slices, rows]: slice s holds logits
// s * SLICE .. (s + 1) * SLICE of its row, and its 64 threads reduce them as argmax.wgsl
// reduces a row (strided scans, then fixed trees over (value, lowest index) and over
// exp(logit - slice maximum)), writing the slice's maximum, its index and that sum to
// out[(row * slices + s) * 3 ..] (the floats as their bits). argmax_merge.wgsl combines a
// row's slices. One workgroup per row leaves a GPU idle at a decode step of one sequence (a
// single workgroup scanning 32,000-128,000 logits); here a row spreads over 16-63
// workgroups for those vocabularies. A row's result never depends on other rows.

@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [num_rows, slices, 3]

const WG: u32 = 64u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> sums: array<f32, WG>;

@compute @workgroup_size(WG)
fn argmax_slices(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let s = wg.x;
    let r = wg.y;
    let base = r * p.width;
    let start = s * SLICE;
    let end = min(start + SLICE, p.width);
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
    if tid == 0u {
        let o = (r * p.slices + s) * 3u;
        out[o] = bitcast<u32>(m);
        out[o + 1u] = best_i[0];
        out[o + 2u] = bitcast<u32>(sums[0]);
    }
}
