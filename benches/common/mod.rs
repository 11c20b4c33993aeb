//! Helpers shared by the benches (each bench includes this file as a module).

use pagellm::internals::engine::Engine;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A temporary directory removed on drop.
#[allow(dead_code)] // not every bench that includes this file makes one
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh temporary directory named after `tag` and this process.
#[allow(dead_code)]
pub fn temp_dir(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("pagellm-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the temp dir");
    TempDir(dir)
}

/// Writes a Hugging Face folder into a fresh temporary directory: `config` as
/// config.json, every tensor the loader's spec implies for it with random weights drawn from
/// N(0, 0.02) (norm weights 1.0, so activations stay finite; speed does not depend on the
/// values) in bf16, or f16 with `f16`, and the 512-token tokenizer of
/// `tests/fixtures/llama-gqa` (requests use token ids below 512).
#[allow(dead_code)]
pub fn write_random_model(tag: &str, config: serde_json::Value, f16: bool) -> TempDir {
    use pagellm::internals::model::{spec::expected_tensors, ModelConfig};
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    use safetensors::tensor::{Dtype, TensorView};
    let tmp = temp_dir(tag);
    let dir = &tmp.0;
    let mut config = config;
    config["torch_dtype"] = if f16 { "float16" } else { "bfloat16" }.into();
    let encode = move |x: f32| -> [u8; 2] {
        if f16 {
            half::f16::from_f32(x).to_le_bytes()
        } else {
            half::bf16::from_f32(x).to_le_bytes()
        }
    };
    let text = serde_json::to_string_pretty(&config).expect("json");
    std::fs::write(dir.join("config.json"), text).expect("write config.json");
    let fixture = Path::new("tests/fixtures/llama-gqa");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture.join(f), dir.join(f)).expect("copy the tokenizer");
    }
    // The tensor list comes from the loader's own spec, so the bench cannot drift from it.
    let cfg = ModelConfig::parse(&dir.join("config.json"), &config).expect("config");
    let tensors = expected_tensors(&cfg);
    let normal = Normal::new(0.0f32, 0.02).expect("normal");
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = std::thread::scope(|scope| {
        let jobs: Vec<_> = tensors
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                scope.spawn(move || {
                    let count: usize = shape.iter().product();
                    let mut bytes = Vec::with_capacity(count * 2);
                    if name.ends_with("norm.weight") {
                        let one = encode(1.0);
                        (0..count).for_each(|_| bytes.extend_from_slice(&one));
                    } else {
                        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
                        for _ in 0..count {
                            bytes.extend_from_slice(&encode(normal.sample(&mut rng)));
                        }
                    }
                    (name, shape, bytes)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("weight generation"))
            .collect()
    });
    let dtype = if f16 { Dtype::F16 } else { Dtype::BF16 };
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(name, shape, bytes)| {
            let v = TensorView::new(dtype, shape.clone(), bytes).expect("tensor view");
            (name.clone(), v)
        })
        .collect();
    let file = safetensors::serialize(views, None).expect("serialize");
    std::fs::write(dir.join("model.safetensors"), file).expect("write model.safetensors");
    tmp
}

/// Steps every engine in turn, one step each per round, until all are done, so that the
/// configurations compared see the same machine conditions; `times[i]` gets engine `i`'s
/// step durations after its first `skip` steps (the prefill).
#[allow(dead_code)] // not every bench that includes this file keeps a fixed order
pub fn alternate_steps(engines: &mut [Engine], skip: usize, times: &mut [Vec<Duration>]) {
    alternate_steps_in(engines, skip, times, None);
}

/// [`alternate_steps`] with the engines' order drawn anew each round (seeded), so that no
/// engine always steps right after the same other one: on a CPU adapter a step runs a
/// little slower after a heavy step of another engine (caches, the driver's threads), which
/// in a fixed order always falls on the same engine.
#[allow(dead_code)] // not every bench that includes this file shuffles
pub fn alternate_steps_shuffled(
    engines: &mut [Engine],
    skip: usize,
    times: &mut [Vec<Duration>],
    seed: u64,
) {
    alternate_steps_in(engines, skip, times, Some(seed));
}

fn alternate_steps_in(
    engines: &mut [Engine],
    skip: usize,
    times: &mut [Vec<Duration>],
    seed: Option<u64>,
) {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.unwrap_or(0));
    let mut order: Vec<usize> = (0..engines.len()).collect();
    let mut step = 0;
    while engines.iter().any(|e| e.has_unfinished()) {
        if seed.is_some() {
            order.shuffle(&mut rng);
        }
        for &i in &order {
            let (e, t) = (&mut engines[i], &mut times[i]);
            if !e.has_unfinished() {
                continue;
            }
            let start = Instant::now();
            e.step().expect("step");
            if step >= skip {
                t.push(start.elapsed());
            }
        }
        step += 1;
    }
}
