// moe_combine: a mixture of experts' output added to the residual stream:
// x[t, c] += sum over j < top_k of weight[t * top_k + j] * y[t * top_k + j, c], the sum in
// increasing j (the order moe_route.wgsl ranks the experts), then added to x.
// Grid: x covers a row's width, 256 invocations per workgroup; y the tokens.

struct Params {
    tokens: u32,
    width: u32,
    top_k: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;             // [tokens * top_k, width]
@group(0) @binding(2) var<storage, read> slot_weight: array<f32>;   // [tokens * top_k]
@group(0) @binding(3) var<storage, read_write> x: array<f32>;       // [tokens, width]

@compute @workgroup_size(256)
fn moe_combine(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let c = wg.x * 256u + tid;
    let t = wg.y;
    if c >= p.width || t >= p.tokens {
        return;
    }
    var sum = 0.0;
    for (var j = 0u; j < p.top_k; j++) {
        let s = t * p.top_k + j;
        sum += slot_weight[s] * y[s * p.width + c];
    }
    x[t * p.width + c] += sum;
}
