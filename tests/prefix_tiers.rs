//! The prefix cache's lower tiers on the GPU (lavapipe and llvmpipe): prompt blocks the
//! device pool evicted come back from the host tier, and blocks written to the disk tier by
//! one engine are read by the next (a restart), each giving exactly the outputs of a cold
//! run, field by field. Damaged records and records of another cache layout are misses;
//! the tiers keep their outputs under forced preemption, where swapping competes with the
//! host tier for the host pool. A pinned prefix outlasts a flood on the device; a forgotten
//! one is found in no tier; a disk that fails every write changes no output.

mod common;
use common::outputs::{assert_same, engine, greedy, prompt, run, sampled};
use common::{contexts, golden};
use pagellm::internals::engine::{EngineConfig, PreemptionMode};
use pagellm::internals::pool::KvDtype;
use pagellm::internals::sampling::SamplingParams;
use std::path::Path;

/// The request under test: a 41-token prompt (ten full blocks of 4) greedy with
/// logprobs, and n = 2 samples of a prompt that shares its first 32 tokens.
fn target() -> Vec<(Vec<u32>, SamplingParams)> {
    let mut g = greedy(8);
    g.logprobs = Some(3);
    let shared = [&prompt(41, 1)[..32], &prompt(6, 9)[..]].concat();
    vec![(prompt(41, 1), g), (shared, sampled(2, 5, 8))]
}

/// Other prompts, enough to push the target's blocks out of a 24-block pool.
fn flood() -> Vec<(Vec<u32>, SamplingParams)> {
    (2..5).map(|salt| (prompt(44, salt), greedy(4))).collect()
}

/// A 64-token context in blocks of 4 over a 24-block device pool.
fn config(host_tier: Option<usize>, dir: Option<&Path>) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(24),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        host_tier_blocks: host_tier,
        kv_cache_dir: dir.map(Path::to_path_buf),
        ..EngineConfig::default()
    }
}

#[test]
fn evicted_blocks_come_back_from_the_host_tier() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());

        let mut e = engine(ctx, &dir, config(Some(48), None));
        assert_same("first run", &run(&mut e, &target()), &want);
        for w in flood() {
            run(&mut e, &[w]);
        }
        let before = e.stats().cache;
        assert!(before.evictions > 0, "nothing was evicted: {before:?}");
        assert!(before.host_tier.saves > 0, "{:?}", before.host_tier);
        assert_same("from the host tier", &run(&mut e, &target()), &want);
        let after = e.stats().cache;
        let hits = after.host_tier.hits - before.host_tier.hits;
        assert!(hits >= 8, "{hits} blocks came up: {:?}", after.host_tier);
        assert_eq!((after.device.used, after.host.used), (0, 0));
    }
}

/// Paths of every disk-tier record under `dir`.
fn records(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "kvb") {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_restarted_engine_reads_the_prefix_from_disk() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());
        {
            let mut first = engine(ctx, &dir, config(None, Some(tmp.path())));
            assert_same("writing", &run(&mut first, &target()), &want);
            let d = first.stats().disk.unwrap();
            // Every full block computed: the prompts', and the generated ones'.
            assert!(d.writes >= 10, "{d:?}");
            assert_eq!(d.write_errors, 0);
        }
        assert!(records(tmp.path()).len() >= 10);

        let mut second = engine(ctx, &dir, config(None, Some(tmp.path())));
        assert_same("after a restart", &run(&mut second, &target()), &want);
        let s = second.stats();
        let d = s.disk.unwrap();
        // The greedy prompt's ten full blocks are read; the samples share eight of them.
        assert!(d.hits >= 10, "{d:?}");
        assert_eq!(d.corrupt, 0);
        assert!(s.cache.host_tier.hits >= 10, "{:?}", s.cache.host_tier);

        // Another KV dtype is another namespace: nothing read, the same tokens.
        let int8 = EngineConfig {
            kv_dtype: KvDtype::Int8,
            ..config(None, Some(tmp.path()))
        };
        let want8 = run(
            &mut engine(
                ctx,
                &dir,
                EngineConfig {
                    kv_dtype: KvDtype::Int8,
                    ..config(None, None)
                },
            ),
            &target(),
        );
        let mut e8 = engine(ctx, &dir, int8);
        assert_same("int8", &run(&mut e8, &target()), &want8);
        assert_eq!(e8.stats().disk.unwrap().hits, 0);
    }
}

#[test]
fn damaged_records_are_recomputed() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());
        run(
            &mut engine(ctx, &dir, config(None, Some(tmp.path()))),
            &target(),
        );
        // Records cut short (a torn copy): each is a miss, and the recomputed block is
        // written again whole.
        damage(tmp.path(), |bytes| bytes.truncate(bytes.len() - 7));
        let mut e = engine(ctx, &dir, config(None, Some(tmp.path())));
        assert_same("truncated records", &run(&mut e, &target()), &want);
        let d = e.stats().disk.unwrap();
        assert_eq!(d.hits, 0, "{d:?}");
        assert!(d.corrupt > 0 && d.writes >= 10, "{d:?}");
        let mut again = engine(ctx, &dir, config(None, Some(tmp.path())));
        assert_same("rewritten", &run(&mut again, &target()), &want);
        assert!(again.stats().disk.unwrap().hits >= 10);
        // A flipped bit in every record: misses, the same outputs.
        damage(tmp.path(), |bytes| {
            let at = bytes.len() / 2;
            bytes[at] ^= 1;
        });
        let mut e = engine(ctx, &dir, config(None, Some(tmp.path())));
        assert_same("flipped bits", &run(&mut e, &target()), &want);
        let d = e.stats().disk.unwrap();
        assert_eq!(d.hits, 0, "{d:?}");
        assert!(d.corrupt > 0, "{d:?}");
    }
}

fn damage(dir: &Path, f: impl Fn(&mut Vec<u8>)) {
    for path in records(dir) {
        let mut bytes = std::fs::read(&path).unwrap();
        f(&mut bytes);
        std::fs::write(&path, bytes).unwrap();
    }
}

#[test]
fn the_tiers_keep_outputs_under_forced_preemption() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        // Short prompts that grow past their blocks, beside the target's.
        let growers = (6..10).map(|salt| (prompt(10, salt), greedy(24)));
        let work: Vec<_> = target().into_iter().chain(growers).collect();
        let want = run(&mut engine(ctx, &dir, config(None, None)), &work);
        for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
            let tmp = tempfile::TempDir::new().unwrap();
            // A small pool and a host pool the tier fills: swapping must take tier blocks.
            let cfg = EngineConfig {
                num_gpu_blocks: Some(18),
                num_cpu_blocks: Some(24),
                max_num_batched_tokens: 24,
                preemption_mode: Some(mode),
                ..config(Some(24), Some(tmp.path()))
            };
            let mut e = engine(ctx, &dir, cfg);
            for round in 0..2 {
                let got = run(&mut e, &work);
                assert_same(&format!("{mode:?} round {round}"), &got, &want);
            }
            let s = e.stats();
            assert!(s.scheduler.preemptions > 0, "{mode:?}: {:?}", s.scheduler);
            assert!(s.cache.host_tier.saves > 0, "{:?}", s.cache.host_tier);
            assert_eq!((s.cache.device.used, s.cache.host.used), (0, 0));
        }
    }
}

#[test]
fn a_pinned_prefix_stays_and_a_forgotten_one_is_gone_from_every_tier() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());
        let cfg = EngineConfig {
            num_gpu_blocks: Some(40),
            ..config(Some(48), Some(tmp.path()))
        };
        let mut e = engine(ctx, &dir, cfg);
        run(&mut e, &target());
        let sys = &prompt(41, 1)[..40];
        let (pin, held) = e.pin_prefix(sys).unwrap();
        assert_eq!(held, 40);
        assert_eq!(e.stats().cache.pinned_blocks, 10);
        for w in flood() {
            run(&mut e, &[w]);
        }
        assert!(e.stats().cache.evictions > 0);
        let before = e.stats().cache;
        assert_same("pinned", &run(&mut e, &target()), &want);
        let after = e.stats().cache;
        // Every pinned block was hit on the device: ten by the greedy prompt, eight by the
        // samples' (whose own ninth block may come up from the host tier).
        let device_hits =
            |c: &pagellm::internals::cache::CacheStats| c.prefix_hits - c.host_tier.hits;
        assert!(
            device_hits(&after) - device_hits(&before) >= 18,
            "{after:?}"
        );
        // A pin that would leave less than one full-context sequence is refused.
        let mut small = engine(
            ctx,
            &dir,
            EngineConfig {
                num_gpu_blocks: Some(24),
                ..config(None, None)
            },
        );
        run(&mut small, &target());
        let err = small.pin_prefix(sys).unwrap_err().to_string();
        assert!(err.contains("one sequence of 64 tokens"), "{err}");
        assert_eq!(small.stats().cache.pinned_blocks, 0);

        // Forgotten: its disk records go, and nothing of it is found again anywhere.
        e.unpin_prefix(pin).unwrap();
        assert!(e.unpin_prefix(pin).is_err());
        let removed = e.forget_prefix(&prompt(41, 1));
        assert!(removed >= 10, "{removed} records removed");
        let before = e.stats();
        assert_same("forgotten", &run(&mut e, &target()), &want);
        let after = e.stats();
        // (The samples' own blocks after the shared 32 tokens are another prefix, and may
        // still come up from the host tier once the greedy request has recomputed those.)
        assert_eq!(after.disk.unwrap().hits, before.disk.unwrap().hits);
        assert_eq!(after.cache.device.used, 0);
    }
}

#[test]
fn a_disk_that_fails_every_write_changes_nothing_but_the_counters() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());
        let mut e = engine(ctx, &dir, config(None, Some(tmp.path())));
        // The namespace folder becomes a file under the running engine: as a full disk or
        // a deleted cache folder would, every write fails (as root too).
        let ns = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.file_name().is_some_and(|n| n != "model-ids"))
            .unwrap();
        std::fs::remove_dir_all(&ns).unwrap();
        std::fs::write(&ns, b"not a folder").unwrap();
        assert_same("failing disk", &run(&mut e, &target()), &want);
        let d = e.stats().disk.unwrap();
        assert!(d.write_errors >= 10 && d.writes == 0, "{d:?}");
        assert_same("failing disk, again", &run(&mut e, &target()), &want);
        assert_eq!(e.stats().cache.device.used, 0);
    }
}

/// The disk tier kept in a host's record store (the browser build's way: it persists the
/// store in the Origin Private File System) holds the very records the folder does, under
/// the same names with the same bytes; a store refilled from what the first engine handed
/// back (a page reloaded) gives the next engine its prefix, and damaged records are misses.
#[test]
fn a_record_store_holds_what_the_folder_holds_and_survives_a_reload() {
    use pagellm::RecordStore;
    let with_store = |store: &RecordStore| EngineConfig {
        kv_cache_store: Some(store.clone()),
        ..config(None, None)
    };
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let want = run(&mut engine(ctx, &dir, config(None, None)), &target());
        let tmp = tempfile::TempDir::new().unwrap();
        run(
            &mut engine(ctx, &dir, config(None, Some(tmp.path()))),
            &target(),
        );
        let first = RecordStore::new();
        assert_same(
            "writing",
            &run(&mut engine(ctx, &dir, with_store(&first)), &target()),
            &want,
        );
        let kept = first.take_changes();
        assert!(kept.len() >= 10, "{} records", kept.len());
        assert!(
            first.take_changes().is_empty(),
            "changes are handed back once"
        );
        let files = records(tmp.path());
        assert_eq!(files.len(), kept.len());
        for (name, bytes) in &kept {
            let bytes = bytes.as_ref().expect("written, not deleted");
            let file = std::fs::read(tmp.path().join(name)).unwrap();
            assert_eq!(&file[..], &bytes[..], "{name}: the file's bytes");
        }

        let reloaded = RecordStore::new();
        for (name, bytes) in &kept {
            reloaded.insert(name.clone(), bytes.clone().unwrap());
        }
        // Another model's record in the host's storage: not held in memory, not deleted.
        let foreign = format!("0123456789abcdef/ab/{}.kvb", "ab".repeat(32));
        reloaded.insert(foreign.clone(), vec![7u8; 64]);
        let mut second = engine(ctx, &dir, with_store(&reloaded));
        assert_eq!(
            reloaded.size().0,
            kept.len(),
            "only this engine's records are held"
        );
        assert_same("after a reload", &run(&mut second, &target()), &want);
        let d = second.stats().disk.unwrap();
        assert!(d.hits >= 10 && d.corrupt == 0, "{d:?}");
        assert!(reloaded.take_changes().iter().all(|(n, _)| *n != foreign));

        let damaged = RecordStore::new();
        for (name, bytes) in &kept {
            let mut b = bytes.clone().unwrap().to_vec();
            let at = b.len() / 2;
            b[at] ^= 1;
            damaged.insert(name.clone(), b);
        }
        let mut third = engine(ctx, &dir, with_store(&damaged));
        assert_same("damaged records", &run(&mut third, &target()), &want);
        let d = third.stats().disk.unwrap();
        assert_eq!(d.hits, 0, "{d:?}");
        assert!(d.corrupt > 0, "{d:?}");
        // The damaged records were dropped and the recomputed blocks written again whole.
        let rewritten = damaged.take_changes();
        assert!(
            rewritten.iter().any(|(_, b)| b.is_some()),
            "{}",
            rewritten.len()
        );
    }
}

#[test]
fn a_folder_and_a_record_store_together_are_refused() {
    let Some(ctx) = contexts().into_iter().next() else {
        return;
    };
    let tmp = tempfile::TempDir::new().unwrap();
    let cfg = EngineConfig {
        kv_cache_store: Some(pagellm::RecordStore::new()),
        ..config(None, Some(tmp.path()))
    };
    let dir = golden::fixture_dir("llama-gqa");
    let err = pagellm::Engine::with_context(common::arc(ctx), &dir, cfg, |_, _| {})
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("kv_cache_dir") && err.contains("kv_cache_store"),
        "{err}"
    );
}
