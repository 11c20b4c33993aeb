// paged_attention_tiles: paged_attention_lanes.wgsl with a sequence's queries taken eight
// at a time, so that a key or value row is loaded once per eight queries instead of once
// per query. For CPU adapters with subgroups of at least 8 invocations. Compiled with
// paged_attention_kv.wgsl and paged_attention_lanes.wgsl prepended; it adds the lane
// kernel's terms in the lane kernel's order, so the two agree bit for bit.
//
// Grid: workgroup w takes query tokens QT * (w / num_heads) + tid, tid < QT, for head
// w % num_heads. When those QT tokens are consecutive queries of one sequence (the flat
// batch lists each sequence's query tokens together at consecutive positions,
// AttentionMetadata::build, so its first and last token say so), the workgroup walks the
// positions any of them sees, from the first query's window start to the last query's
// position, in groups of eight: lane l loads the key (then value) row of position
// j0 + l, eight head elements at a time, and subgroupBroadcast hands row r to every lane,
// which masks what its own query does not see (past its position, before its window, in
// another shard). Otherwise (a block that holds decode tokens or a sequence's start or
// end) each invocation runs its own query alone, as the lane kernel does.
//
// Why the results match the lane kernel's: a lane merges only the tiles the lane kernel
// visits for its query (from its window start's tile to its position), the others being
// only there for the other lanes; within a tile, masked positions add 0 to l_T and nothing
// to A, and scores are summed per position over the chunks in the same order.
//
// Broadcasts name their lane as a constant, so the eight positions of a group are spelled
// out. Invocation tid's subgroup lane must lie in 0 .. QT (a workgroup of QT invocations
// in one subgroup of at least QT).

// q again, as 16-byte words (head_dim % 8 == 0): a chunk's eight elements in two reads.
@group(0) @binding(8) var<storage, read> q4: array<vec4<f32>>;

@compute @workgroup_size(QT)
fn paged_attention_tiles(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let w = wg.y * nwg.x + wg.x;
    let t0 = (w / p.num_heads) * QT;
    let h = w % p.num_heads;
    let t = min(t0 + tid, p.num_tokens - 1u);
    let first = token_pos[min(t0, p.num_tokens - 1u)];
    let last = token_pos[min(t0 + QT - 1u, p.num_tokens - 1u)];
    if t0 + QT > p.num_tokens || first.x != last.x || last.y != first.y + QT - 1u {
        lane_query(t, h, t0 + tid < p.num_tokens, tid);
        return;
    }
    let seq = first.x;
    let ctx_len = first.y + tid + 1u;
    let win_start = window_start(ctx_len);
    // The positions some query of the block sees.
    let u_start = window_start(first.y + 1u);
    let u_end = last.y + 1u;
    let kvh = h / (p.num_heads / p.num_kv_heads);
    let v_half = p.shard_num_blocks * p.num_kv_heads * kv_tile_words();
    let qb = (t * p.num_heads + h) * HD;

    var st = initial_state(h);  // (M, L)
    clear_acc(tid);
    for (var tile0 = u_start - u_start % TILE; tile0 < u_end; tile0 += TILE) {
        let n = min(TILE, u_end - tile0);
        let groups = (n + 7u) / 8u;
        // Scores: group g's eight in registers over all chunks, then into score_w.
        for (var g = 0u; g < groups; g++) {
            let j0 = tile0 + 8u * g;
            let rb = seen_row(seq, kvh, j0 + lane, u_start, u_end);
            let rl = select(0u, rb, rb != NO_ROW);
            var s0 = 0.0;
            var s1 = 0.0;
            var s2 = 0.0;
            var s3 = 0.0;
            var s4 = 0.0;
            var s5 = 0.0;
            var s6 = 0.0;
            var s7 = 0.0;
            for (var c = 0u; c < HD / 8u; c++) {
                let qc = array<vec4<f32>, 2>(q4[qb / 4u + 2u * c] * p.scale, q4[qb / 4u + 2u * c + 1u] * p.scale);
                let k = row8(0u, rl, c);
                s0 = dot8(s0, qc, subgroupBroadcast(k[0], 0u), subgroupBroadcast(k[1], 0u));
                s1 = dot8(s1, qc, subgroupBroadcast(k[0], 1u), subgroupBroadcast(k[1], 1u));
                s2 = dot8(s2, qc, subgroupBroadcast(k[0], 2u), subgroupBroadcast(k[1], 2u));
                s3 = dot8(s3, qc, subgroupBroadcast(k[0], 3u), subgroupBroadcast(k[1], 3u));
                s4 = dot8(s4, qc, subgroupBroadcast(k[0], 4u), subgroupBroadcast(k[1], 4u));
                s5 = dot8(s5, qc, subgroupBroadcast(k[0], 5u), subgroupBroadcast(k[1], 5u));
                s6 = dot8(s6, qc, subgroupBroadcast(k[0], 6u), subgroupBroadcast(k[1], 6u));
                s7 = dot8(s7, qc, subgroupBroadcast(k[0], 7u), subgroupBroadcast(k[1], 7u));
            }
            let o = 8u * g * QT + tid;
            score_w[o] = s0;
            score_w[o + QT] = s1;
            score_w[o + 2u * QT] = s2;
            score_w[o + 3u * QT] = s3;
            score_w[o + 4u * QT] = s4;
            score_w[o + 5u * QT] = s5;
            score_w[o + 6u * QT] = s6;
            score_w[o + 7u * QT] = s7;
        }
        let tile = tile_probabilities(seq, kvh, tile0, n, win_start, ctx_len, tid);
        // Whether the lane kernel visits this tile for this lane's query.
        let seen = tile0 >= win_start - win_start % TILE && tile0 < ctx_len;
        let sc = merge_tile(st, tile);
        st = select(st, sc.xy, seen);
        // The weighted values, eight head elements at a time, merged into A (the loop runs
        // on every lane for the broadcasts).
        for (var c = 0u; c < HD / 8u; c++) {
            var a = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
            for (var g = 0u; g < groups; g++) {
                let j0 = tile0 + 8u * g;
                let rb = seen_row(seq, kvh, j0 + lane, u_start, u_end);
                let v = row8(v_half, select(0u, rb, rb != NO_ROW), c);
                let o = 8u * g * QT + tid;
                a = group_term(a, j0, subgroupBroadcast(rb, 0u), score_w[o], subgroupBroadcast(v[0], 0u), subgroupBroadcast(v[1], 0u), win_start, ctx_len);
                a = group_term(a, j0 + 1u, subgroupBroadcast(rb, 1u), score_w[o + QT], subgroupBroadcast(v[0], 1u), subgroupBroadcast(v[1], 1u), win_start, ctx_len);
                a = group_term(a, j0 + 2u, subgroupBroadcast(rb, 2u), score_w[o + 2u * QT], subgroupBroadcast(v[0], 2u), subgroupBroadcast(v[1], 2u), win_start, ctx_len);
                a = group_term(a, j0 + 3u, subgroupBroadcast(rb, 3u), score_w[o + 3u * QT], subgroupBroadcast(v[0], 3u), subgroupBroadcast(v[1], 3u), win_start, ctx_len);
                a = group_term(a, j0 + 4u, subgroupBroadcast(rb, 4u), score_w[o + 4u * QT], subgroupBroadcast(v[0], 4u), subgroupBroadcast(v[1], 4u), win_start, ctx_len);
                a = group_term(a, j0 + 5u, subgroupBroadcast(rb, 5u), score_w[o + 5u * QT], subgroupBroadcast(v[0], 5u), subgroupBroadcast(v[1], 5u), win_start, ctx_len);
                a = group_term(a, j0 + 6u, subgroupBroadcast(rb, 6u), score_w[o + 6u * QT], subgroupBroadcast(v[0], 6u), subgroupBroadcast(v[1], 6u), win_start, ctx_len);
                a = group_term(a, j0 + 7u, subgroupBroadcast(rb, 7u), score_w[o + 7u * QT], subgroupBroadcast(v[0], 7u), subgroupBroadcast(v[1], 7u), win_start, ctx_len);
            }
            if seen {
                merge_values(c, a, sc.zw, tid);
            }
        }
    }
    write_out(t, h, st, tid);
}

// Position `pos`'s term (row `rb` of the block's union, NO_ROW when in another shard or
// past the union) when this lane's query sees it.
fn group_term(a: array<vec4<f32>, 2>, pos: u32, rb: u32, pr: f32, v0: vec4<f32>, v1: vec4<f32>, win_start: u32, ctx_len: u32) -> array<vec4<f32>, 2> {
    return value_term(a, rb != NO_ROW && pos >= win_start && pos < ctx_len, pr, v0, v1);
}
