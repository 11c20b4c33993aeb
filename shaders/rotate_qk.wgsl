// rotate_qk: rotates the rows of a step's queries and keys by R = H D in place, in one
// dispatch (rotate_common.wgsl has the transform): rows 0..rows_q are q's, then k's. Values
// are not rotated: on the shipped model's values a rotation leaves the int4 error where it
// is (docs/BENCHMARKS.md), so the attention output needs no rotation back.
// Grid: one workgroup of 64 per 256 / head_dim rows, 2-D when there are many.

struct Params {
    rows_q: u32,
    rows_k: u32,
    head_dim: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;  // [rows_q, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<f32>;  // [rows_k, head_dim]

@compute @workgroup_size(WG)
fn rotate_qk(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let hd = p.head_dim;
    let total = p.rows_q + p.rows_k;
    let first = row_index(wg, nwg) * rows_per_group(hd);
    if first >= total {
        return;
    }
    let n = min(rows_per_group(hd), total - first) * hd;
    let nq = p.rows_q * hd;
    for (var i = tid; i < n; i += WG) {
        let e = first * hd + i;
        var x: f32;
        if e < nq {
            x = q[e];
        } else {
            x = k[e - nq];
        }
        r[i] = x * flip(i % hd);
    }
    workgroupBarrier();
    hadamard_shared(tid, hd);
    for (var i = tid; i < n; i += WG) {
        let e = first * hd + i;
        if e < nq {
            q[e] = r[i];
        } else {
            k[e - nq] = r[i];
        }
    }
}
