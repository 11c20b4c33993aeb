// argmax: out[r] = the index of the largest logit of row r (the first one on ties, as
// torch.argmax), and out[num_rows + r] = the bits of that token's log-probability
// (log_softmax, as f32), so greedy decoding reads back 8 bytes per sequence, not a
// vocabulary row, and still knows its cumulative logprob.
// Grid: one workgroup per row; its 256 threads reduce the row (argmax_tree.wgsl) in a fixed
// tree order, so a row's result never depends on other rows.

@group(0) @binding(1) var<storage, read> logits: array<f32>;     // [num_rows, width]
@group(0) @binding(2) var<storage, read_write> out: array<u32>;  // [2, num_rows]

const WG: u32 = 256u;

@compute @workgroup_size(WG)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let r = wg.x;
    let red = reduce_range(r * p.width, 0u, p.width, tid);
    if tid == 0u {
        out[r] = red.index;
        out[p.num_rows + r] = bitcast<u32>(-log(red.sum));
    }
}
