// moe_route: a mixture of experts' routing for every token of a step, on the GPU (no read-back
// between the router and the experts). One workgroup of 256 invocations:
//
// 1. Token t's router logits [t, experts] pick its top_k experts: the largest logit first,
//    the lower expert index first among equal logits (src/reference's `route` orders them
//    the same way). Slot s = t * top_k + j holds the j-th choice: its expert and its weight,
//    with ROUTING = 0 a softmax over every logit, the chosen probabilities kept (RENORMALIZE
//    = 1: divided by their sum); with ROUTING = 1 (gpt-oss) a softmax over the chosen logits
//    alone. Each softmax is exp(l - max) / sum, as the reference computes it (in f32 here).
// 2. The slots grouped by expert: offsets[e] .. offsets[e + 1] of `list` are the slots that
//    chose expert e, in increasing slot order, so each expert's rows are a list the expert
//    matmul (moe_matmul.wgsl) walks with one read of the expert's weights per group of rows.
//    Invocation e counts and lists expert e's slots itself (no atomics): the lists come out
//    the same on every run.

override ROUTING: u32 = 0u;
override RENORMALIZE: u32 = 1u;

struct Params {
    tokens: u32,
    experts: u32,
    top_k: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;            // [tokens, experts]
@group(0) @binding(2) var<storage, read_write> slot_expert: array<u32>; // [tokens * top_k]
@group(0) @binding(3) var<storage, read_write> slot_weight: array<f32>; // [tokens * top_k]
@group(0) @binding(4) var<storage, read_write> offsets: array<u32>;     // [experts + 1]
@group(0) @binding(5) var<storage, read_write> list: array<u32>;        // [tokens * top_k]

const MAX_TOP_K: u32 = 16u;
var<workgroup> counts: array<u32, 257>;

@compute @workgroup_size(256)
fn moe_route(@builtin(local_invocation_index) tid: u32) {
    let n = p.experts;
    for (var t = tid; t < p.tokens; t += 256u) {
        let row = t * n;
        var chosen: array<u32, MAX_TOP_K>;
        var big = logits[row];
        for (var e = 1u; e < n; e++) {
            big = max(big, logits[row + e]);
        }
        // Selection: the j-th choice is the largest logit below (or equal to, at a higher
        // index than) the (j-1)-th.
        var prev_v = 0.0;
        var prev_e = 0u;
        for (var j = 0u; j < p.top_k; j++) {
            var best_e = n;
            var best_v = 0.0;
            for (var e = 0u; e < n; e++) {
                let v = logits[row + e];
                let after_prev = j == 0u || v < prev_v || (v == prev_v && e > prev_e);
                if after_prev && (best_e == n || v > best_v) {
                    best_e = e;
                    best_v = v;
                }
            }
            chosen[j] = best_e;
            prev_v = best_v;
            prev_e = best_e;
        }
        var all = 0.0;
        if ROUTING == 1u {
            // Over the chosen alone, from the first (the largest).
            big = logits[row + chosen[0]];
            for (var j = 0u; j < p.top_k; j++) {
                all += exp(logits[row + chosen[j]] - big);
            }
        } else {
            for (var e = 0u; e < n; e++) {
                all += exp(logits[row + e] - big);
            }
        }
        var kept = 0.0;
        for (var j = 0u; j < p.top_k; j++) {
            kept += exp(logits[row + chosen[j]] - big) / all;
        }
        let scale = select(1.0, kept, RENORMALIZE == 1u && ROUTING == 0u);
        for (var j = 0u; j < p.top_k; j++) {
            let s = t * p.top_k + j;
            slot_expert[s] = chosen[j];
            slot_weight[s] = exp(logits[row + chosen[j]] - big) / all / scale;
        }
    }
    storageBarrier();
    workgroupBarrier();
    let slots = p.tokens * p.top_k;
    for (var e = tid; e < n; e += 256u) {
        var c = 0u;
        for (var s = 0u; s < slots; s++) {
            c += u32(slot_expert[s] == e);
        }
        counts[e] = c;
    }
    workgroupBarrier();
    if tid == 0u {
        var at = 0u;
        for (var e = 0u; e < n; e++) {
            let c = counts[e];
            counts[e] = at;
            offsets[e] = at;
            at += c;
        }
        offsets[n] = at;
    }
    workgroupBarrier();
    for (var e = tid; e < n; e += 256u) {
        var at = counts[e];
        for (var s = 0u; s < slots; s++) {
            if slot_expert[s] == e {
                list[at] = s;
                at++;
            }
        }
    }
}
