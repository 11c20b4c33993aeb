//! KV cache groups on the GPU (lavapipe and llvmpipe): the fixtures whose layers mix
//! sliding-window and global attention (Gemma 2: window, global, window; Gemma 3: window,
//! window, global; Qwen3 with `max_window_layers`: global, window, window; window 8, context
//! 256) keep one block table per layer group, and give exactly the outputs of the same
//! engine keeping one table for all layers, field by field: greedy with logprobs, n = 2
//! samples and a beam search, batched and chunked, with prefix-cache hits whose leading
//! blocks the windowed groups leave as holes, and under forced swap and recompute
//! preemption. A long generation holds at most the global layers' blocks plus a window's
//! worth per windowed group, checked against the hand-computed bound.

mod common;
use common::outputs::{assert_same, beams, engine, greedy, prompt, run, sampled};
use common::{contexts, golden};
use pagellm::internals::engine::{EngineConfig, PreemptionMode};
use pagellm::internals::sampling::SamplingParams;

const FIXTURES: [&str; 3] = [
    "gemma2-softcap-window",
    "gemma3-local-rope",
    "qwen3-qknorm-window",
];
const BLOCK: usize = 4;
const WINDOW: usize = 8;

/// Blocks of 4, a 128-token context, steps of at most 16 tokens (so prompts are chunked and
/// a windowed group holds at most a window and a chunk); `grouped` off keeps one table.
fn config(grouped: bool, blocks: usize, mode: Option<PreemptionMode>) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: Some(blocks),
        num_cpu_blocks: Some(256),
        max_model_len: Some(128),
        max_num_batched_tokens: 16,
        free_out_of_window_blocks: grouped,
        preemption_mode: mode,
        ..EngineConfig::default()
    }
}

/// Greedy with logprobs over a 41-token prompt, a prompt sharing its first 36 tokens (ten
/// cached blocks: a windowed group's first query at 40 sees 33..=40, so blocks 0..=7 are
/// holes from the start), n = 2 samples, and a 2-beam search.
fn workload() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut g = greedy(12);
    g.logprobs = Some(3);
    let shared = [&prompt(41, 1)[..36], &prompt(9, 7)[..]].concat();
    vec![
        (prompt(41, 1), g.clone()),
        (shared, g),
        (prompt(23, 3), sampled(2, 11, 10)),
        (prompt(17, 4), beams(2, 8)),
    ]
}

#[test]
fn grouped_tables_give_the_outputs_of_one_table() {
    for ctx in contexts() {
        for name in FIXTURES {
            let dir = golden::fixture_dir(name);
            // The reference: one block table for all layers, an ample pool, one request at
            // a time, no prefix caching.
            let mut plain = EngineConfig {
                enable_prefix_caching: false,
                ..config(false, 400, None)
            };
            plain.max_num_seqs = 8;
            let mut one = engine(ctx, &dir, plain);
            let want: Vec<_> = workload()
                .into_iter()
                .flat_map(|w| run(&mut one, &[w]))
                .collect();
            assert_eq!(one.stats().kv_groups, vec![None], "{name}");

            // Grouped, batched, with prefix caching: the second prompt hits the first's
            // blocks once it has run.
            let mut e = engine(ctx, &dir, config(true, 400, None));
            let st = e.stats();
            assert_eq!(
                st.kv_groups,
                vec![None, Some(WINDOW), Some(WINDOW)],
                "{name}"
            );
            assert_eq!(st.kv_layout.num_layers, 1, "{name}: one layer per group");
            let w = workload();
            let first = run(&mut e, &w[..1]);
            let rest = run(&mut e, &w[1..]);
            let got: Vec<_> = first.into_iter().chain(rest).collect();
            assert_same(&format!("{name} grouped"), &got, &want);
            let c = e.stats().cache;
            assert!(c.prefix_hits >= 9, "{name}: {} prefix hits", c.prefix_hits);
            assert!(
                c.window_released_blocks > 0,
                "{name}: no block left a window"
            );
            assert_eq!(
                (c.device.used, c.host.used),
                (0, 0),
                "{name}: blocks leaked"
            );

            // Grouped under a pool too small for the workload at once, in every preemption
            // mode.
            for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
                let mut e = engine(ctx, &dir, config(true, 64, Some(mode)));
                let got = run(&mut e, &workload());
                let what = format!("{name} grouped, {mode:?} preemption");
                assert_same(&what, &got, &want);
                let st = e.stats();
                assert!(
                    st.scheduler.preemptions > 0,
                    "{what}: nothing was preempted"
                );
                assert_eq!((st.cache.device.used, st.cache.host.used), (0, 0), "{what}");
            }
        }
    }
}

#[test]
fn a_long_generation_holds_the_global_blocks_and_a_window_per_windowed_group() {
    for ctx in contexts() {
        for name in FIXTURES {
            let dir = golden::fixture_dir(name);
            let work = [(prompt(40, 5), greedy(80))];
            let mut one = engine(ctx, &dir, config(false, 200, None));
            let want = run(&mut one, &work);
            let mut e = engine(ctx, &dir, config(true, 200, None));
            assert_same(name, &run(&mut e, &work), &want);
            let (a, b) = (one.stats(), e.stats());
            // 120 tokens: 30 blocks of all three layers without groups.
            let total = 120usize.div_ceil(BLOCK);
            assert_eq!(a.scheduler.peak_blocks_used, total, "{name}");
            // With groups: the global layer's 30 blocks, and per windowed group at most
            // the blocks that a window of 8 and a chunk of 16 span (23 positions: 7).
            let per_window = (WINDOW + 16 - 2).div_ceil(BLOCK) + 1;
            let peak = b.scheduler.peak_blocks_used;
            assert!(
                peak <= total + 2 * per_window,
                "{name}: {peak} blocks at the peak"
            );
            // A block of one group holds one layer of three.
            let bytes = |s: &pagellm::internals::engine::EngineStats, blocks: usize| {
                blocks as u64 * s.kv_layout.block_bytes_all_layers()
            };
            let (bytes_a, bytes_b) = (bytes(&a, total), bytes(&b, peak));
            assert_eq!(
                3 * b.kv_layout.block_bytes_all_layers(),
                a.kv_layout.block_bytes_all_layers()
            );
            assert!(
                (bytes_b as f64) < 0.6 * bytes_a as f64,
                "{name}: {bytes_b} bytes grouped, {bytes_a} in one table"
            );
        }
    }
}

/// The tiered prefix cache with groups: a restarted engine reads a prompt's blocks of every
/// group from the disk tier (each group's records under its own names), copies them up,
/// and gives the outputs of a cold run; forgetting the prompt deletes every group's records.
#[test]
fn a_restarted_grouped_engine_reads_every_group_from_disk() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("gemma3-local-rope");
        let tmp = tempfile::TempDir::new().unwrap();
        let work = [
            (prompt(41, 1), greedy(8)),
            (prompt(41, 1), sampled(2, 3, 6)),
        ];
        let with_disk = || EngineConfig {
            kv_cache_dir: Some(tmp.path().to_path_buf()),
            ..config(true, 200, None)
        };
        let want = run(&mut engine(ctx, &dir, config(false, 200, None)), &work);
        {
            let mut first = engine(ctx, &dir, with_disk());
            assert_same("writing", &run(&mut first, &work[..1]), &want[..1]);
            let d = first.stats().disk.unwrap();
            // Ten full prompt blocks and two generated ones, in each of three groups.
            assert!(d.writes >= 30, "{d:?}");
        }
        let mut second = engine(ctx, &dir, with_disk());
        let got: Vec<_> = work
            .iter()
            .flat_map(|w| run(&mut second, std::slice::from_ref(w)))
            .collect();
        assert_same("after a restart", &got, &want);
        let s = second.stats();
        let d = s.disk.unwrap();
        assert!(d.hits >= 30, "{d:?}");
        assert_eq!(d.corrupt, 0);
        // Every group's ten prompt blocks came up (hits count once per sequence).
        assert!(s.cache.prefix_hits >= 10, "{:?}", s.cache);
        // Forgetting the prompt deletes every group's records: 3 groups x 10 blocks.
        let gone = second.forget_prefix(&work[0].0);
        assert!(gone >= 30, "{gone} records deleted");
        drop(second);
        let mut third = engine(ctx, &dir, with_disk());
        assert_same("forgotten", &run(&mut third, &work[..1]), &want[..1]);
        assert_eq!(third.stats().disk.unwrap().hits, 0);
    }
}
