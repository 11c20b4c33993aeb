// rotate_rows: rotates every row of head_dim values of one buffer in place by R = H D, or
// by its inverse (rotate_common.wgsl has the transform). For tests and for callers that
// rotate other rows than a step's queries and keys.
// Grid: one workgroup of 64 per 256 / head_dim rows, 2-D when there are many.

struct Params {
    num_rows: u32,
    head_dim: u32,
    inverse: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;  // [num_rows, head_dim]

@compute @workgroup_size(WG)
fn rotate_rows(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let hd = p.head_dim;
    let first = row_index(wg, nwg) * rows_per_group(hd);
    if first >= p.num_rows {
        return;
    }
    let n = min(rows_per_group(hd), p.num_rows - first) * hd;
    let base = first * hd;
    let inverse = p.inverse == 1u;
    for (var i = tid; i < n; i += WG) {
        r[i] = x[base + i] * select(flip(i % hd), 1.0, inverse);
    }
    workgroupBarrier();
    hadamard_shared(tid, hd);
    for (var i = tid; i < n; i += WG) {
        x[base + i] = r[i] * select(1.0, flip(i % hd), inverse);
    }
}
