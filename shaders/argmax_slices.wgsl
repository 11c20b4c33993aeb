// argmax_slices: the first pass of the split arg-max (argmax.wgsl's contract in two
// dispatches). A workgroup per (slice, row), grid [slices, rows]: slice s holds logits
// s * SLICE .. (s + 1) * SLICE of its row, and its 64 threads reduce them as argmax.wgsl
// reduces a row (argmax_tree.wgsl: strided scans, then fixed trees over (value, lowest
// index) and over exp(logit - slice maximum)), writing the slice's maximum, its index and
// that sum to out[(row * slices + s) * 3 ..] (the floats as their bits). argmax_merge.wgsl
// combines a row's slices. One workgroup per row leaves a GPU idle at a decode step of one
// sequence (a single workgroup scanning 32,000-128,000 logits); here a row spreads over
// 16-63 workgroups for those vocabularies. A row's result never depends on other rows.

@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [num_rows, slices, 3]

const WG: u32 = 64u;

@compute @workgroup_size(WG)
fn argmax_slices(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let s = wg.x;
    let r = wg.y;
    let start = s * SLICE;
    let red = reduce_range(r * p.width, start, min(start + SLICE, p.width), tid);
    if tid == 0u {
        let o = (r * p.slices + s) * 3u;
        out[o] = bitcast<u32>(red.value);
        out[o + 1u] = red.index;
        out[o + 2u] = bitcast<u32>(red.sum);
    }
}
