//! Models from bytes in memory (what a browser fetched; it has no paths), on the GPU
//! (lavapipe and llvmpipe): a safetensors folder (sharded too) and a lone GGUF file given as
//! `MemoryFiles` load into engines whose outputs equal those loaded from disk, field by
//! field, with the same tokenizer, chat template and config; the disk tier gives files in
//! memory the identity of the same files on disk; files that are missing, ambiguous or
//! malformed are errors naming the model's name and file.

mod common;
use common::outputs::{assert_same, engine, greedy, prompt, run, sampled};
use common::{arc, contexts, golden};
use pagellm::internals::engine::{Engine, EngineConfig};
use pagellm::internals::model::{open_chat_template, open_tokenizer, ModelFiles};
use pagellm::internals::sampling::SamplingParams;
use pagellm::{EngineBuilder, MemoryFiles, Request};
use std::path::Path;

/// Every file of `dir`, in memory under the name `name`.
fn in_memory(dir: &Path, name: &str) -> MemoryFiles {
    let mut files = MemoryFiles::new(name);
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            let file = p.file_name().unwrap().to_string_lossy().into_owned();
            files = files.with_file(file, std::fs::read(&p).unwrap());
        }
    }
    files
}

fn work() -> Vec<(Vec<u32>, SamplingParams)> {
    vec![
        (prompt(17, 1), greedy(8)),
        (prompt(11, 2), sampled(2, 3, 6)),
    ]
}

fn memory_engine(ctx: &pagellm::GpuContext, files: MemoryFiles, cfg: EngineConfig) -> Engine {
    Engine::with_context(arc(ctx), files, cfg, |_, _| {}).unwrap()
}

#[test]
fn safetensors_folders_in_memory_load_as_from_disk() {
    let cfg = EngineConfig::default;
    for ctx in contexts() {
        for name in ["llama-gqa", "qwen2-sharded-untied", "gemma3-local-rope"] {
            let dir = golden::fixture_dir(name);
            let want = run(&mut engine(ctx, &dir, cfg()), &work());
            let files = in_memory(&dir, name);
            let got = run(&mut memory_engine(ctx, files.clone(), cfg()), &work());
            assert_same(name, &got, &want);
            // What the loaders read agrees too: config, tokenizer, chat template.
            let (a, b) = (
                ModelFiles::open(files.clone()).unwrap(),
                ModelFiles::open(&dir).unwrap(),
            );
            assert_eq!(a.config, b.config, "{name}");
            assert_eq!(a.dir, Path::new(name));
            let (ta, tb) = (
                open_tokenizer(files.clone()).unwrap(),
                open_tokenizer(&dir).unwrap(),
            );
            let text = "The sky holds the sea";
            assert_eq!(ta.encode(text).unwrap(), tb.encode(text).unwrap(), "{name}");
            assert_eq!(ta.eos_token_ids(), tb.eos_token_ids(), "{name}");
            let (ca, cb) = (open_chat_template(files), open_chat_template(&dir));
            assert_eq!(ca.is_ok(), cb.is_ok(), "{name}");
        }
    }
}

#[test]
fn a_lone_gguf_file_in_memory_loads_as_from_disk() {
    for ctx in contexts() {
        let path = common::repo_root().join("tests/fixtures/gguf/llama-gqa-q8_0.gguf");
        let want = run(&mut engine(ctx, &path, EngineConfig::default()), &work());
        let files =
            MemoryFiles::new("fetched").with_file("model.gguf", std::fs::read(&path).unwrap());
        let got = run(
            &mut memory_engine(ctx, files.clone(), EngineConfig::default()),
            &work(),
        );
        assert_same("gguf", &got, &want);
        // Its tokenizer comes from the file's metadata, as it does from disk.
        let text = "a b c";
        assert_eq!(
            open_tokenizer(files).unwrap().encode(text).unwrap(),
            open_tokenizer(&path).unwrap().encode(text).unwrap()
        );
    }
}

#[test]
fn the_handle_loads_files_in_memory_and_the_disk_tier_knows_them() {
    for ctx in contexts() {
        let dir = golden::fixture_dir("llama-gqa");
        let tmp = tempfile::TempDir::new().unwrap();
        let cfg = EngineConfig {
            block_size: 4,
            kv_cache_dir: Some(tmp.path().to_path_buf()),
            ..EngineConfig::default()
        };
        // Written by an engine loaded from disk...
        let p = prompt(33, 5);
        let want = run(
            &mut engine(ctx, &dir, cfg.clone()),
            &[(p.clone(), greedy(6))],
        );
        // ... read by a handle loaded from memory: the same model, the same records.
        let h = EngineBuilder::new(in_memory(&dir, "llama-gqa"))
            .config(cfg)
            .context(arc(ctx))
            .load()
            .unwrap();
        assert_eq!(h.info().unwrap().path, Path::new("llama-gqa"));
        let got = h
            .submit(Request::tokens(p).with_params(greedy(6)))
            .unwrap()
            .wait()
            .unwrap();
        assert_same("from memory", &[got], &want);
        let disk = h.stats_now().unwrap().engine.disk.unwrap();
        assert!(disk.hits >= 8, "{disk:?}");
    }
}

#[test]
fn missing_ambiguous_or_broken_files_are_named() {
    let dir = golden::fixture_dir("llama-gqa");
    let all = in_memory(&dir, "remote/llama");
    let config = std::fs::read(dir.join("config.json")).unwrap();
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let err = |files: MemoryFiles| ModelFiles::open(files).unwrap_err().to_string();
    // No weights at all.
    let e = err(MemoryFiles::new("remote/llama").with_file("config.json", config.clone()));
    assert!(e.contains("remote/llama"), "{e}");
    // Weights cut short.
    let cut = weights[..weights.len() / 2].to_vec();
    let e = err(MemoryFiles::new("remote/llama")
        .with_file("config.json", config.clone())
        .with_file("model.safetensors", cut));
    assert!(e.contains("remote/llama/model.safetensors"), "{e}");
    // Two GGUF files beside a config: which one is the caller's choice.
    let gguf =
        std::fs::read(common::repo_root().join("tests/fixtures/gguf/llama-gqa.gguf")).unwrap();
    let e = err(MemoryFiles::new("two")
        .with_file("config.json", config)
        .with_file("a.gguf", gguf.clone())
        .with_file("b.gguf", gguf));
    assert!(e.contains("a.gguf") && e.contains("b.gguf"), "{e}");
    // No tokenizer.json and no GGUF to take one from.
    let e = open_tokenizer(MemoryFiles::new("bare").with_file("model.safetensors", weights))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bare"), "{e}");
    // The whole folder is fine.
    assert!(ModelFiles::open(all).is_ok());
}
