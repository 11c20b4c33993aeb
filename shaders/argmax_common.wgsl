// Shared by argmax.wgsl and argmax_lanes.wgsl: the parameters, the bindings, and the rule
// by which one (value, index) candidate takes over from another.

struct Params {
    num_rows: u32,
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [2, num_rows]

// The index of no candidate yet.
const NONE: u32 = 0xffffffffu;

// Whether candidate (ov, oi) replaces (mv, mi): it exists, and either there was none or it
// is larger, or equal at a lower index (the first of equal maxima wins, as torch.argmax).
fn takes_over(ov: f32, oi: u32, mv: f32, mi: u32) -> bool {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}
