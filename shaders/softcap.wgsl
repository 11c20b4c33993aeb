// softcap: x[i] = cap * tanh(x[i] / cap), Gemma 2's soft-capping of the final logits.
// tanh's argument is clamped where tanh is 1 to f32 precision (some drivers' tanh overflows
// for large inputs). Grid: one invocation per element, 256 per workgroup, 2-D when large.

struct Params {
    len: u32,
    cap: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;  // [len]

@compute @workgroup_size(256)
fn softcap(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = (wg.y * nwg.x + wg.x) * 256u + tid;
    if i >= p.len {
        return;
    }
    x[i] = p.cap * tanh(clamp(x[i] / p.cap, -15.0, 15.0));
}
