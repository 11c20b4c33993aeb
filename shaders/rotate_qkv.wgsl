// rotate_qkv: rotates the rows of a step's q, k and v by R = H D in place, in one dispatch
// (rotate_common.wgsl has the transform): rows 0..rows_q are q's, then k's, then v's.
// Grid: one workgroup of 64 per 256 / head_dim rows, 2-D when there are many.

struct Params {
    rows_q: u32,
    rows_kv: u32,  // rows of k, and of v
    head_dim: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;  // [rows_q, head_dim]
@group(0) @binding(2) var<storage, read_write> k: array<f32>;  // [rows_kv, head_dim]
@group(0) @binding(3) var<storage, read_write> v: array<f32>;  // [rows_kv, head_dim]

fn load(which: u32, i: u32) -> f32 {
    switch which {
        case 0u: { return q[i]; }
        case 1u: { return k[i]; }
        default: { return v[i]; }
    }
}

fn store(which: u32, i: u32, x: f32) {
    switch which {
        case 0u: { q[i] = x; }
        case 1u: { k[i] = x; }
        default: { v[i] = x; }
    }
}

@compute @workgroup_size(WG)
fn rotate_qkv(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let hd = p.head_dim;
    let total = p.rows_q + 2u * p.rows_kv;
    let first = row_index(wg, nwg) * rows_per_group(hd);
    if first >= total {
        return;
    }
    let n = min(rows_per_group(hd), total - first) * hd;
    for (var i = tid; i < n; i += WG) {
        let at = locate(first * hd + i);
        r[i] = load(at.x, at.y) * flip(i % hd);
    }
    workgroupBarrier();
    hadamard_shared(tid, hd);
    for (var i = tid; i < n; i += WG) {
        let at = locate(first * hd + i);
        store(at.x, at.y, r[i]);
    }
}

// (buffer, index) of element e of the concatenation q ++ k ++ v.
fn locate(e: u32) -> vec2<u32> {
    let nq = p.rows_q * p.head_dim;
    let nkv = p.rows_kv * p.head_dim;
    if e < nq {
        return vec2<u32>(0u, e);
    }
    if e < nq + nkv {
        return vec2<u32>(1u, e - nq);
    }
    return vec2<u32>(2u, e - nq - nkv);
}
