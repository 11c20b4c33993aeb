// silu_mul: out[r, i] = act(gate[r, i]) * up[r, i], the gated activation of the MLP: silu
// (Llama and most families) or, with ACTIVATION = 1, GELU with the tanh approximation
// (Gemma), or with ACTIVATION = 2 gpt-oss's clamped SwiGLU. Row r of gate and up starts at r * ld of their buffers (up at up_offset more), so
// the two may be one buffer holding each row's gate then its up (the stacked gate-up
// projection's output); out is [rows, width].
// Grid: x covers a row's width, 256 invocations per workgroup; y and z the rows.

override ACTIVATION: u32 = 0u;

struct Params {
    rows: u32,
    width: u32,
    ld: u32,
    up_offset: u32,
    // ACTIVATION = 2 (gpt-oss's clamped SwiGLU): its alpha and limit.
    alpha: f32,
    limit: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;       // [rows, ld]
@group(0) @binding(2) var<storage, read> up: array<f32>;         // [rows, ld], from up_offset
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [rows, width]

@compute @workgroup_size(256)
fn silu_mul(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let col = wg.x * 256u + tid;
    let r = wg.z * nwg.y + wg.y;
    if col >= p.width || r >= p.rows {
        return;
    }
    let i = r * p.width + col;
    let g = gate[r * p.ld + col];
    let u_at = r * p.ld + p.up_offset + col;
    if ACTIVATION == 2u {
        // gpt-oss: (clamp(up) + 1) * g * sigmoid(alpha * g) with g = min(gate, limit), in the
        // order transformers computes it.
        let gc = min(g, p.limit);
        let uc = clamp(up[u_at], -p.limit, p.limit);
        let glu = gc * (1.0 / (1.0 + exp(-(gc * p.alpha))));
        out[i] = (uc + 1.0) * glu;
        return;
    }
    if ACTIVATION == 1u {
        // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))); tanh's argument is clamped where
        // it is 1 to f32 precision, since some drivers' tanh overflows for large inputs.
        let u = clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0);
        out[i] = 0.5 * g * (1.0 + tanh(u)) * up[u_at];
    } else {
        out[i] = g / (1.0 + exp(-g)) * up[u_at];
    }
}
