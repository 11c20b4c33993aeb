// argmax_lanes: argmax.wgsl's contract (the first index of the largest logit of each row,
// and the bits of its log-probability) with eight invocations per row, for CPU adapters.
// There a workgroup's invocations are the lanes of one SIMD register, so argmax.wgsl's
// 256 threads run as 32 register-wide groups and pay for sixteen barrier rounds. Here lane
// l scans elements l, l + 8, l + 16, ... (the eight lanes read eight consecutive logits at
// each step), keeping the first of equal maxima; the lanes' results meet in workgroup
// memory and are merged in lane order by (value, lowest index); each lane then sums
// exp(logit - max) over its elements in order, and the eight sums are added in lane order.
// Grid: one workgroup per row. A row's result never depends on other rows.

@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [2, num_rows]

const LANES: u32 = 8u;
var<workgroup> best_v: array<f32, LANES>;
var<workgroup> best_i: array<u32, LANES>;
var<workgroup> sums: array<f32, LANES>;

@compute @workgroup_size(LANES)
fn argmax_lanes(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let r = wg.x;
    let base = r * p.width;
    var bv = NEG_BIG;
    var bi = NONE;
    for (var i = tid; i < p.width; i += LANES) {
        let v = logits[base + i];
        if v > bv || bi == NONE {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    workgroupBarrier();
    // Every lane merges the eight results the same way, so all hold the row's maximum.
    var m = best_v[0];
    var mi = best_i[0];
    for (var l = 1u; l < LANES; l++) {
        let ov = best_v[l];
        let oi = best_i[l];
        if takes_over(ov, oi, m, mi) {
            m = ov;
            mi = oi;
        }
    }
    var acc = 0.0;
    for (var i = tid; i < p.width; i += LANES) {
        acc += exp(logits[base + i] - m);
    }
    sums[tid] = acc;
    workgroupBarrier();
    if tid == 0u {
        var total = 0.0;
        for (var l = 0u; l < LANES; l++) {
            total += sums[l];
        }
        out[r] = mi;
        out[p.num_rows + r] = bitcast<u32>(-log(total));
    }
}
