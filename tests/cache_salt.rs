//! Cache salts on the GPU (lavapipe and llvmpipe): a request hits only prompt blocks that
//! were cached under its own salt, on the device and in the disk tier (a restarted engine
//! reads records written under the same salt and no others), while every request's tokens
//! stay those of a cold run: a salt changes what is shared, never what is computed. An
//! empty salt is refused.

mod common;
use common::outputs::{assert_same, engine, greedy, prompt};
use common::{contexts, golden};
use pagellm::internals::engine::{Engine, EngineConfig, Request, RequestOutput};
use std::path::Path;

/// A 64-token context in blocks of 4 over a 48-block device pool.
fn config(dir: Option<&Path>) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: Some(48),
        num_cpu_blocks: Some(64),
        max_model_len: Some(64),
        kv_cache_dir: dir.map(Path::to_path_buf),
        ..EngineConfig::default()
    }
}

/// Runs the 41-token greedy request (ten full blocks) with `salt`; returns its output and
/// the prefix hits and disk hits it made.
fn run_salted(e: &mut Engine, salt: Option<&str>) -> (RequestOutput, u64, u64) {
    let before = e.stats();
    let mut r = Request::tokens(prompt(41, 1)).with_params(greedy(8));
    r.cache_salt = salt.map(str::to_string);
    let h = e.add(r).unwrap();
    e.run_to_completion().unwrap();
    let after = e.stats();
    let disk = |s: &pagellm::internals::engine::EngineStats| s.disk.map_or(0, |d| d.hits);
    (
        h.wait().unwrap(),
        after.cache.prefix_hits - before.cache.prefix_hits,
        disk(&after) - disk(&before),
    )
}

#[test]
fn salted_requests_hit_only_blocks_of_their_own_salt() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let (want, ..) = run_salted(&mut engine(ctx, &dir, config(None)), None);
        let mut e = engine(ctx, &dir, config(None));
        let runs = [
            (Some("alice"), 0),
            (Some("bob"), 0),
            (None, 0),
            (Some("alice"), 10),
            (Some("bob"), 10),
            (None, 10),
        ];
        for (salt, hits) in runs {
            let (out, got, _) = run_salted(&mut e, salt);
            assert_eq!(got, hits, "{salt:?}");
            assert_same(&format!("{salt:?}"), &[out], std::slice::from_ref(&want));
        }
        let err = e
            .add(Request::tokens(prompt(8, 1)).with_cache_salt(""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cache_salt"), "{err}");
        assert!(!e.has_unfinished());
    }
}

#[test]
fn a_restarted_engine_reads_only_its_own_salt_from_disk() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let (want, ..) = run_salted(&mut engine(ctx, &dir, config(None)), None);
        {
            let mut first = engine(ctx, &dir, config(Some(tmp.path())));
            let (out, ..) = run_salted(&mut first, Some("alice"));
            assert_same("writing", &[out], std::slice::from_ref(&want));
        }
        let mut second = engine(ctx, &dir, config(Some(tmp.path())));
        for (salt, disk_hits) in [(Some("bob"), 0), (None, 0)] {
            let (out, _, got) = run_salted(&mut second, salt);
            assert_eq!(got, disk_hits, "{salt:?}");
            assert_same(&format!("{salt:?}"), &[out], std::slice::from_ref(&want));
        }
        let (out, hits, disk) = run_salted(&mut second, Some("alice"));
        assert!(disk >= 10 && hits >= 10, "disk {disk}, prefix {hits}");
        assert_same("alice again", &[out], std::slice::from_ref(&want));
    }
}
