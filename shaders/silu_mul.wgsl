// silu_mul: out[i] = act(gate[i]) * up[i], the gated activation of the MLP: silu (Llama and
// most families) or, with ACTIVATION = 1, GELU with the tanh approximation (Gemma).
// Grid: one invocation per element, 256 per workgroup, 2-D when large.

override ACTIVATION: u32 = 0u;

struct Params {
    len: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;       // [len]
@group(0) @binding(2) var<storage, read> up: array<f32>;         // [len]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [len]

@compute @workgroup_size(256)
fn silu_mul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let i = (wg.y * nwg.x + wg.x) * 256u + tid;
    if i >= p.len {
        return;
    }
    let g = gate[i];
    if ACTIVATION == 1u {
        // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))); tanh's argument is clamped where
        // it is 1 to f32 precision, since some drivers' tanh overflows for large inputs.
        let u = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0);
        out[i] = 0.5 * g * (1.0 + tanh(u)) * up[i];
    } else {
        out[i] = g / (1.0 + exp(-g)) * up[i];
    }
}
