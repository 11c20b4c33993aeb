// argmax_merge: the second pass of the split arg-max. One invocation per row merges the
// row's slices (argmax_slices.wgsl) in slice order: the largest maximum, the lowest index
// among equal ones (so the first of equal maxima wins, as torch.argmax), and the sum of
// exp(logit - row maximum) as each slice's sum times exp(slice maximum - row maximum),
// added in slice order; it writes argmax.wgsl's output, the token and the bits of its
// log-probability.

@group(0) @binding(1) var<storage, read> partials: array<u32>;   // [num_rows, slices, 3]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [2, num_rows]

@compute @workgroup_size(64)
fn argmax_merge(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if r >= p.num_rows {
        return;
    }
    let base = r * p.slices * 3u;
    var m = NEG_BIG;
    var mi = NONE;
    for (var s = 0u; s < p.slices; s++) {
        let ov = bitcast<f32>(partials[base + 3u * s]);
        let oi = partials[base + 3u * s + 1u];
        if takes_over(ov, oi, m, mi) {
            m = ov;
            mi = oi;
        }
    }
    // A slice whose logits are all -inf has the sum NaN (exp(-inf - -inf)); its terms are
    // 0 in the one-pass kernels, and skipping it keeps them 0 here.
    var total = 0.0;
    for (var s = 0u; s < p.slices; s++) {
        let f = exp(bitcast<f32>(partials[base + 3u * s]) - m);
        if f > 0.0 {
            total += bitcast<f32>(partials[base + 3u * s + 2u]) * f;
        }
    }
    out[r] = mi;
    out[p.num_rows + r] = bitcast<u32>(-log(total));
}
