// gather_rows: out[r, :] = x[rows[r], :], picking the last position of each sequence that
// samples this step before the LM head, so logits are computed for those rows only.
// Grid: x covers the row (256 per workgroup), y = output row.

struct Params {
    num_rows: u32,
    width: u32,
    num_src_rows: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> rows: array<u32>;       // [num_rows]
@group(0) @binding(2) var<storage, read> x: array<f32>;          // [num_src_rows, width]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [num_rows, width]

@compute @workgroup_size(256)
fn gather_rows(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let r = gid.y;
    if i >= p.width || r >= p.num_rows {
        return;
    }
    let src = rows[r];
    if src >= p.num_src_rows {
        return;
    }
    out[r * p.width + i] = x[src * p.width + i];
}
