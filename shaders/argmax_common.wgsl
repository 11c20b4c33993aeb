// Shared by every arg-max kernel (argmax.wgsl, argmax_lanes.wgsl and the two passes of the
// split one, argmax_slices.wgsl and argmax_merge.wgsl): the parameters and the rule by
// which one (value, index) candidate takes over from another.

struct Params {
    num_rows: u32,
    width: u32,
    slices: u32,  // the split kernel: slices of SLICE logits per row
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// Logits per slice in the split kernel (src/kernels/logits.rs mirrors it).
const SLICE: u32 = 2048u;

// The index of no candidate yet.
const NONE: u32 = 0xffffffffu;

// Whether candidate (ov, oi) replaces (mv, mi): it exists, and either there was none or it
// is larger, or equal at a lower index (the first of equal maxima wins, as torch.argmax).
fn takes_over(ov: f32, oi: u32, mv: f32, mi: u32) -> bool {
    return oi != NONE && (mi == NONE || ov > mv || (ov == mv && oi < mi));
}
