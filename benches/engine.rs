//! The engine end to end on a model of realistic layer shapes, with ratios measured side by
//! side in one run.
//!
//! Method. The bench writes a Hugging Face folder into a temporary directory: `config.json`
//! (model type `llama`), `model.safetensors` with random bf16 weights drawn from N(0, 0.02)
//! (norm weights 1.0, so activations stay finite; speed does not depend on the values), and
//! the 512-token tokenizer of `tests/fixtures/llama-gqa`. The model's vocabulary may be larger
//! than the tokenizer's; requests are token ids below 512. The default shapes are half-width
//! Llama-3.2-1B layers (hidden 1024, intermediate 4096, 16 heads, 4 KV heads, head size 64),
//! 2 layers, vocabulary 4096 (40-350 ms per decode step on lavapipe); the full-width
//! layers (`--shapes 1b`, vocabulary 8192) cost about four times as much per step.
//! Every figure is the wall time of `Engine::step` calls, each of which submits once and
//! waits for the read-back, so a step's time is its GPU time plus the host bookkeeping. A
//! warm-up request compiles the pipelines (cached per context) before anything is timed.
//!
//! 1. Decode throughput: N = 1, 8, 32, 64 concurrent greedy requests (16-token prompts, 9
//!    tokens each, `ignore_eos`). Steps run untimed until every request has streamed its
//!    first token (all prompts fit one step's token budget, so the sequences then move in
//!    lockstep); the remaining pure decode steps are timed. Ratio: N = 32 over N = 1.
//! 2. Prefill: one request with max_tokens 1; time to first token, from `add_request` to
//!    the first `Token` event, for 128- and 512-token prompts (each one step).
//! 3. Preemption of a 512-token sequence (32 blocks of 16 tokens), through the engine: a
//!    16-token and a 512-token request fill a 33-block pool, the 512-token one is preempted
//!    in the next step and resumes after the other finishes, once with
//!    `PreemptionMode::Swap` and once with `Recompute`; per-step times and the engine's
//!    counters. Directly: a swap-out then a swap-in of 32 blocks through
//!    `CacheEngine::execute` on a pool of the same layout, against the recompute run's
//!    resume step (a 513-token prefill).
//!
//! 4. Decode first: inter-token latency of a 4-sample group while an older request's prompt
//!    is prefilled again after a recompute preemption, with `decode_first` on and off.
//! 5. A preemption-heavy workload (twelve requests, a 24-block pool) in swap, recompute and
//!    automatic mode: wall time, preemptions by mode, and whether outputs match.
//!
//! Run: `cargo bench --bench engine` (adapter chosen as usual, e.g. `PAGELLM_BACKEND=gl`).
//! `-- --quick` uses tiny shapes; `-- --shapes NAME` (or `PAGELLM_BENCH_SHAPES=NAME`) picks
//! a preset: `1b-half` (the default), `1b`, `quick`, `tiny15m` (the stories15M shape with a
//! 32k vocabulary), `m110` (stories110M), `llama-3.2-1b` (all 16 layers and the 128k
//! vocabulary). A full run of the default takes under a minute on lavapipe on an idle
//! 2-core machine.
//!
//! `-- --f16` stores the weights as f16 instead of bf16. `-- --profile` runs only the
//! profile section instead: per-kernel GPU time of decode
//! (1 and 16 sequences, 128-token prompts, 64 tokens each) and of one 128-token prefill,
//! with the host's recording, submit and wait per step (`GpuContext::enable_profiling`);
//! `--profile-seqs 1,16` and `--profile-tokens 64` change the decode runs, and
//! `--profile-weights q4_k` converts the weights to that format as they load.
//!
//! `-- --tiers` runs only the prefix-cache tier section instead (`engine/tiers.rs`): time to
//! first token of a 2047-token prompt after a restart from the disk tier against computing
//! it, and the prompt tokens a multi-turn conversation workload computes with and without
//! the host and disk tiers.
//!
//! `-- --weights f16,q8_0,q4_k` runs only the weight-format section instead: one engine per
//! format (`EngineConfig::weight_dtype`, the bf16 weights converted as they load), decode
//! steps of 1 and 16 sequences and a 128-token prefill on each, formats alternating within
//! each of five rounds; median step time and its ratio to the first format's.
//! `-- --models A,B,...` runs the same section over model files or folders as they are
//! stored (e.g. GGUF files llama.cpp quantized, `tools/make_bench_gguf.py`), and
//! `-- --model PATH` runs any section on that model instead of a generated one (the shapes
//! line then describes the preset, not the model).

use pagellm::internals::cache::{BlockOps, DeviceBlockId, HostBlockId};
use pagellm::internals::cache_engine::CacheEngine;
use pagellm::internals::engine::{
    Engine, EngineConfig, EngineStats, PreemptionMode, Prompt, RequestEvent, RequestHandle,
};
use pagellm::internals::kernels::WeightDtype;
use pagellm::internals::pool::{KvDtype, KvLayout, KvPool, PoolSize};
use pagellm::internals::sampling::SamplingParams;
use pagellm::GpuContext;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;
#[path = "engine/tiers.rs"]
mod tiers;

use common::TempDir;

const BLOCK: usize = 16;
/// Token ids of requests stay inside the fixture tokenizer's vocabulary.
const TOKENIZER_VOCAB: u32 = 512;
/// Decode section: prompt length and tokens per request (the first is untimed).
const DECODE_PROMPT: usize = 16;
const DECODE_TOKENS: usize = 9;

/// Layer shapes of the generated model.
#[derive(Clone, Copy, Debug)]
struct Shapes {
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    vocab: usize,
}

const PRESETS: [Shapes; 6] = [
    // The stories15M shape (llama2.c) with a 32k vocabulary, as issue reports use.
    Shapes {
        name: "tiny15m",
        hidden: 288,
        intermediate: 768,
        heads: 6,
        kv_heads: 6,
        head_dim: 48,
        layers: 6,
        vocab: 32000,
    },
    // The stories110M shape.
    Shapes {
        name: "m110",
        hidden: 768,
        intermediate: 2048,
        heads: 12,
        kv_heads: 12,
        head_dim: 64,
        layers: 12,
        vocab: 32000,
    },
    // Llama-3.2-1B whole: 16 layers and its 128256-token vocabulary (2.5 GB of weights).
    Shapes {
        name: "llama-3.2-1b",
        hidden: 2048,
        intermediate: 8192,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        layers: 16,
        vocab: 128256,
    },
    // Llama-3.2-1B layers (its vocabulary is 128256 and it has 16 layers).
    Shapes {
        name: "1b",
        hidden: 2048,
        intermediate: 8192,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        layers: 2,
        vocab: 8192,
    },
    // The default: half the width of Llama-3.2-1B's layers, same head size and GQA ratio.
    Shapes {
        name: "1b-half",
        hidden: 1024,
        intermediate: 4096,
        heads: 16,
        kv_heads: 4,
        head_dim: 64,
        layers: 2,
        vocab: 4096,
    },
    Shapes {
        name: "quick",
        hidden: 256,
        intermediate: 1024,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        layers: 2,
        vocab: 1024,
    },
];

impl Shapes {
    fn params(&self) -> usize {
        let per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
            + self.heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.intermediate
            + 2 * self.hidden;
        self.layers * per_layer + self.vocab * self.hidden + self.hidden
    }

    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            num_layers: self.layers,
            num_kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            block_size: BLOCK,
            dtype: KvDtype::F16,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The model folder
// ---------------------------------------------------------------------------------------

fn config_json(s: &Shapes) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_hidden_layers": s.layers,
        "vocab_size": s.vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": true,
        "bos_token_id": 0,
        "eos_token_id": 1,
    })
}

/// The random model of `s` (`common::write_random_model`); `f16` stores its weights as f16
/// instead of bf16.
fn write_model(s: &Shapes, f16: bool) -> TempDir {
    common::write_random_model("engine", config_json(s), f16)
}

// ---------------------------------------------------------------------------------------
// Driving the engine
// ---------------------------------------------------------------------------------------

fn engine(ctx: &Arc<GpuContext>, dir: &Path, cfg: EngineConfig) -> Engine {
    Engine::with_context(ctx.clone(), dir, cfg, |_, _| {}).expect("engine")
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// `len` token ids in `2..512` (0 and 1 are BOS and EOS), distinct per seed.
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(1000 + seed);
    (0..len)
        .map(|_| rng.random_range(2..TOKENIZER_VOCAB))
        .collect()
}

/// Counts the `Token` events waiting on a handle.
fn drain(h: &RequestHandle) -> usize {
    h.events
        .try_iter()
        .filter(|e| matches!(e, RequestEvent::Token { .. }))
        .count()
}

fn step(e: &mut Engine) -> Duration {
    let t = Instant::now();
    e.step().expect("engine step");
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Decode {
    tokens: usize,
    time: Duration,
    steps: Vec<Duration>,
}

/// N concurrent greedy requests; times only the steps after every request's first token.
fn decode(e: &mut Engine, n: usize, prompt_len: usize, max_tokens: usize) -> Decode {
    let hs: Vec<RequestHandle> = (0..n)
        .map(|i| {
            e.add_request(
                Prompt::Tokens(prompt(i as u64, prompt_len)),
                greedy(max_tokens),
            )
            .expect("add request")
        })
        .collect();
    let mut seen = vec![0usize; n];
    while seen.contains(&0) {
        step(e);
        for (s, h) in seen.iter_mut().zip(&hs) {
            *s += drain(h);
        }
    }
    let before: usize = seen.iter().sum();
    let mut steps = Vec::new();
    while e.has_unfinished() {
        steps.push(step(e));
    }
    let after: usize = before + hs.iter().map(drain).sum::<usize>();
    Decode {
        tokens: after - before,
        time: steps.iter().sum(),
        steps,
    }
}

/// Time from `add_request` to the first `Token` event, driving `step()` here; also the
/// duration of the step that produced it.
fn first_token(e: &mut Engine, seed: u64, len: usize) -> (Duration, Duration) {
    let start = Instant::now();
    let h = e
        .add_request(Prompt::Tokens(prompt(seed, len)), greedy(1))
        .expect("add request");
    let mut last = Duration::ZERO;
    while drain(&h) == 0 {
        last = step(e);
    }
    let ttft = start.elapsed();
    e.run_to_completion().expect("finish");
    (ttft, last)
}

/// Swap-out then swap-in of `blocks` blocks through the cache engine; median of `reps`.
fn swap_direct(ctx: &GpuContext, layout: KvLayout, blocks: usize, reps: usize) -> [Duration; 2] {
    let pool = KvPool::new(ctx, layout, PoolSize::Blocks(2 * blocks)).expect("pool");
    let mut ce = CacheEngine::new(pool, blocks);
    // Out of the first half of the pool, back into the second half (as after a reshuffle).
    let out = BlockOps {
        swap_out: (0..blocks as u32)
            .map(|i| (DeviceBlockId(i), HostBlockId(i)))
            .collect(),
        ..BlockOps::default()
    };
    let back = BlockOps {
        swap_in: (0..blocks as u32)
            .map(|i| (HostBlockId(i), DeviceBlockId(blocks as u32 + i)))
            .collect(),
        ..BlockOps::default()
    };
    let mut times = [Vec::new(), Vec::new()];
    for rep in 0..=reps {
        for (ops, t) in [&out, &back].into_iter().zip(times.iter_mut()) {
            let start = Instant::now();
            ce.execute(ctx, ops).expect("swap");
            // Repetition 0 is a warm-up.
            if rep > 0 {
                t.push(start.elapsed());
            }
        }
    }
    let [a, b] = times;
    [median(a), median(b)]
}

struct Scenario {
    wall: Duration,
    steps: Vec<Duration>,
    stats: EngineStats,
    outputs: Vec<Vec<u32>>,
}

/// A 16-token request and a 512-token request fill a 33-block pool exactly (1 + 32 blocks)
/// in one prefill step; in step 2 the older request needs a second block, so the newer one
/// is preempted; the older one finishes (2 tokens), and in step 3 the newer one resumes: by
/// a swap-in of its 32 blocks plus a 1-token decode, or by a 513-token prefill.
fn preemption_scenario(ctx: &Arc<GpuContext>, dir: &Path, mode: PreemptionMode) -> Scenario {
    let cfg = EngineConfig {
        num_gpu_blocks: Some(33),
        num_cpu_blocks: Some(64),
        preemption_mode: Some(mode),
        enable_prefix_caching: false,
        max_num_batched_tokens: 1024,
        max_model_len: Some(33 * BLOCK),
        ..EngineConfig::default()
    };
    // Pipelines are cached per context and were compiled by the earlier sections.
    let mut e = engine(ctx, dir, cfg);
    let start = Instant::now();
    let hs: Vec<RequestHandle> = [(200, 16), (201, 512)]
        .into_iter()
        .map(|(seed, len)| {
            e.add_request(Prompt::Tokens(prompt(seed, len)), greedy(2))
                .expect("add")
        })
        .collect();
    let mut steps = Vec::new();
    while e.has_unfinished() {
        steps.push(step(&mut e));
    }
    let wall = start.elapsed();
    let outputs = hs
        .iter()
        .map(|h| h.wait().expect("output").outputs[0].token_ids.clone())
        .collect();
    Scenario {
        wall,
        steps,
        stats: e.stats(),
        outputs,
    }
}

/// Section 4: an older request's prompt is prefilled again while a newer group decodes.
/// A (160-token prompt, 40 tokens) is oldest; L (96-token prompt, 40 tokens) next; S (a
/// 16-token prompt, 4 samples of 40 tokens) newest. In a 20-block pool with an 8-block host
/// pool and a 16-token step budget, their growth preempts S (swapped: it fits the host
/// pool) and then L (recomputed: the host pool is full); S swaps back in and decodes while
/// L's 96+ tokens are prefilled again in chunks. Returns the gaps between S's consecutive
/// tokens (per sample) from L's recompute preemption on (the gap across S's own stay in
/// host memory is left out: it is the same under both policies), the wall time and the
/// stats.
fn decode_first_scenario(
    ctx: &Arc<GpuContext>,
    dir: &Path,
    decode_first: bool,
) -> (Vec<Duration>, Duration, EngineStats) {
    let cfg = EngineConfig {
        num_gpu_blocks: Some(20),
        num_cpu_blocks: Some(8),
        max_num_batched_tokens: 16,
        max_model_len: Some(256),
        enable_prefix_caching: false,
        decode_first,
        ..EngineConfig::default()
    };
    let mut e = engine(ctx, dir, cfg);
    let start = Instant::now();
    let _a = e
        .add_request(Prompt::Tokens(prompt(400, 160)), greedy(40))
        .expect("add");
    let _l = e
        .add_request(Prompt::Tokens(prompt(401, 96)), greedy(40))
        .expect("add");
    let s = e
        .add_request(Prompt::Tokens(prompt(402, 16)), sampled(4, 5, 40))
        .expect("add");
    let mut last: Vec<Option<Instant>> = vec![None; 4];
    let mut gaps = Vec::new();
    let mut timing = false;
    while e.has_unfinished() {
        step(&mut e);
        let now = Instant::now();
        if !timing && e.stats().scheduler.preempted_by_recompute > 0 {
            timing = true;
            last = vec![None; 4];
        }
        for ev in s.events.try_iter() {
            if let RequestEvent::Token { index, .. } = ev {
                if !timing {
                    continue;
                }
                if let Some(t) = last[index] {
                    gaps.push(now - t);
                }
                last[index] = Some(now);
            }
        }
    }
    (gaps, start.elapsed(), e.stats())
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn sampled(n: usize, seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        n,
        temperature: 1.0,
        seed: Some(seed),
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Section 5: twelve requests (prompts of 24-87 tokens, 48 tokens each; every fourth one
/// draws 2 samples) in a 24-block pool, so preemption is constant. Returns the wall time,
/// the stats and every request's output.
fn pressure_workload(
    ctx: &Arc<GpuContext>,
    dir: &Path,
    mode: Option<PreemptionMode>,
) -> (
    Duration,
    EngineStats,
    Vec<pagellm::internals::engine::RequestOutput>,
) {
    let cfg = EngineConfig {
        num_gpu_blocks: Some(24),
        num_cpu_blocks: Some(256),
        max_num_batched_tokens: 128,
        max_model_len: Some(256),
        preemption_mode: mode,
        enable_prefix_caching: false,
        ..EngineConfig::default()
    };
    let mut e = engine(ctx, dir, cfg);
    let start = Instant::now();
    let hs: Vec<RequestHandle> = (0..12u64)
        .map(|i| {
            let params = if i % 4 == 0 {
                sampled(2, i, 48)
            } else {
                greedy(48)
            };
            let len = 24 + (i as usize * 13) % 64;
            e.add_request(Prompt::Tokens(prompt(500 + i, len)), params)
                .expect("add")
        })
        .collect();
    e.run_to_completion().expect("run");
    let wall = start.elapsed();
    let outs = hs.iter().map(|h| h.wait().expect("output")).collect();
    (wall, e.stats(), outs)
}

// ---------------------------------------------------------------------------------------

/// The profile section: decode at each of `seqs` sequences, then one prefill, each profiled
/// alone.
fn profile_section(ctx: &GpuContext, e: &mut Engine, seqs: &[usize], tokens: usize) {
    const PROMPT: usize = 128;
    // First without the profiler: the engine's own count of host time per forward step
    // (recording and submit, not the wait), which profiling would inflate. A short run
    // first compiles every kernel a prefill and a decode step use (pipelines are compiled
    // on first use; on CPU adapters a prefill's attention kernel is not a decode's), so
    // that no compile lands in the steps timed.
    decode(e, 1, PROMPT, 2);
    for &n in seqs {
        let before = e.stats().host;
        let groups = ctx.bind_group_stats();
        let d = decode(e, n, PROMPT, tokens);
        let after = e.stats().host;
        let groups_after = ctx.bind_group_stats();
        let steps = after.decode_steps - before.decode_steps;
        let host = (after.decode_total - before.decode_total).as_secs_f64() / steps.max(1) as f64;
        println!();
        println!(
            "Unprofiled decode, {n} sequence(s): {:.1} tokens/s (median step {:.1} ms); host per \
             decode step (recording + submit, no wait): {:.3} ms, mean of {steps} steps; bind \
             groups reused {} times, created {} times",
            d.tokens as f64 / d.time.as_secs_f64(),
            ms(median(d.steps)),
            host * 1e3,
            groups_after.hits - groups.hits,
            groups_after.misses - groups.misses,
        );
    }
    // One prompt prefilled alone (the step that samples its first token), three times.
    let mut prefills: Vec<Duration> = (0..3)
        .map(|i| {
            let t = Instant::now();
            let h = e
                .add_request(Prompt::Tokens(prompt(7000 + i, PROMPT)), greedy(1))
                .expect("add");
            e.run_to_completion().expect("prefill");
            drain(&h);
            t.elapsed()
        })
        .collect();
    prefills.sort();
    println!();
    println!(
        "Unprofiled prefill, 1 x {PROMPT} tokens: median {:.1} ms ({:.0} tokens/s) of 3, \
         fastest {:.1} ms",
        ms(prefills[1]),
        PROMPT as f64 / prefills[1].as_secs_f64(),
        ms(prefills[0])
    );
    let profiler = ctx.enable_profiling();
    println!();
    println!(
        "## Profile ({:?}; {PROMPT}-token prompts, greedy, {tokens} tokens each)",
        profiler.method()
    );
    for &n in seqs {
        profiler.take();
        let t = Instant::now();
        let d = decode(e, n, PROMPT, tokens);
        let wall = t.elapsed();
        let phases = profiler.take();
        println!();
        println!(
            "### Decode, {n} sequence(s): {:.1} tokens/s over the timed steps (median step {:.1} ms, profiling on), {:.1} s in all",
            d.tokens as f64 / d.time.as_secs_f64(),
            ms(median(d.steps)),
            wall.as_secs_f64()
        );
        print_profile(ctx, profiler, &phases);
    }
    profiler.take();
    let t = Instant::now();
    let h = e
        .add_request(Prompt::Tokens(prompt(7777, PROMPT)), greedy(1))
        .expect("add");
    e.run_to_completion().expect("prefill");
    drain(&h);
    let took = t.elapsed();
    let phases = profiler.take();
    println!();
    println!(
        "### Prefill, 1 x {PROMPT} tokens: {:.1} ms ({:.0} tokens/s, profiling on)",
        ms(took),
        PROMPT as f64 / took.as_secs_f64()
    );
    print_profile(ctx, profiler, &phases);
}

/// One profile table as a fenced block.
fn print_profile(
    ctx: &GpuContext,
    profiler: &pagellm::internals::gpu::Profiler,
    phases: &std::collections::BTreeMap<
        &'static str,
        pagellm::internals::gpu::profile::PhaseProfile,
    >,
) {
    println!();
    println!("```");
    print!(
        "{}",
        pagellm::internals::gpu::profile::report(profiler.method(), &ctx.describe(), phases)
    );
    println!("```");
}

/// One column of the `--weights` table: a label, the model's path, and the format its
/// weights are converted to as they load (`None`: as stored).
struct WeightRun {
    label: String,
    model: std::path::PathBuf,
    dtype: Option<WeightDtype>,
}

/// The `--weights` list: formats the generated model at `dir` is converted to.
fn weight_formats(dir: &Path, list: &str) -> Vec<WeightRun> {
    list.split(',')
        .map(|s| WeightRun {
            label: s.trim().to_string(),
            model: dir.to_path_buf(),
            dtype: Some(s.trim().parse().unwrap_or_else(|e| panic!("{e}"))),
        })
        .collect()
}

/// The `--models` list: model files or folders as they are stored (e.g. GGUF files of
/// llama.cpp's format mixes), each labelled by its file name.
fn weight_models(list: &str) -> Vec<WeightRun> {
    list.split(',')
        .map(|s| {
            let model = std::path::PathBuf::from(s.trim());
            let label = model
                .file_name()
                .map_or(s.to_string(), |n| n.to_string_lossy().into_owned());
            WeightRun {
                label,
                model,
                dtype: None,
            }
        })
        .collect()
}

/// The `--weights` (or `--models`) section: decode and prefill steps per weight format,
/// side by side.
fn weights_section(ctx: &Arc<GpuContext>, formats: &[WeightRun]) {
    let mut engines: Vec<Engine> = formats
        .iter()
        .map(|run| {
            let cfg = EngineConfig {
                enable_prefix_caching: false,
                max_num_batched_tokens: 1024,
                weight_dtype: run.dtype,
                ..EngineConfig::default()
            };
            let mut e = engine(ctx, &run.model, cfg);
            e.add_request(Prompt::Tokens(prompt(999, 8)), greedy(2))
                .expect("add");
            e.run_to_completion().expect("warm-up");
            e
        })
        .collect();
    println!();
    println!("## Weight formats (decode: {DECODE_PROMPT}-token prompts, {DECODE_TOKENS} tokens; prefill: 128 tokens)");
    println!();
    let names: Vec<String> = formats
        .iter()
        .map(|d| format!("{} (ms)", d.label))
        .collect();
    let ratios: Vec<String> = formats[1..]
        .iter()
        .map(|d| format!("{} / {}", d.label, formats[0].label))
        .collect();
    println!("| step | {} | {} |", names.join(" | "), ratios.join(" | "));
    println!("|---|{}", "---:|".repeat(2 * formats.len() - 1));
    for (label, n) in [
        ("decode, 1 sequence", 1),
        ("decode, 16 sequences", 16),
        ("prefill, 128 tokens", 0),
    ] {
        let mut steps = vec![Vec::new(); formats.len()];
        for _round in 0..5 {
            for (e, s) in engines.iter_mut().zip(&mut steps) {
                if n == 0 {
                    s.push(first_token(e, 7, 128).1);
                    e.run_to_completion().expect("drain");
                } else {
                    s.extend(decode(e, n, DECODE_PROMPT, DECODE_TOKENS).steps);
                }
            }
        }
        let med: Vec<f64> = steps.into_iter().map(|s| ms(median(s))).collect();
        let cells: Vec<String> = med.iter().map(|t| format!("{t:.2}")).collect();
        let rel: Vec<String> = med[1..]
            .iter()
            .map(|t| format!("{:.2}x", t / med[0]))
            .collect();
        println!("| {label} | {} | {} |", cells.join(" | "), rel.join(" | "));
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let quick = args.iter().any(|a| a == "--quick");
    let flag = args
        .iter()
        .position(|a| a == "--shapes")
        .and_then(|i| args.get(i + 1).cloned());
    let env = std::env::var("PAGELLM_BENCH_SHAPES").ok();
    let name = flag
        .or(env.clone())
        .unwrap_or_else(|| (if quick { "quick" } else { "1b-half" }).to_string());
    let Some(shapes) = PRESETS.iter().copied().find(|s| s.name == name) else {
        let names: Vec<_> = PRESETS.iter().map(|s| s.name).collect();
        eprintln!("unknown shapes {name:?}; presets: {names:?}");
        std::process::exit(2);
    };
    let run_start = Instant::now();
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    println!("# pagellm engine benchmark");
    println!();
    println!(
        "command: {}cargo bench --bench engine{}",
        env.map_or(String::new(), |v| format!("PAGELLM_BENCH_SHAPES={v} ")),
        if args.is_empty() {
            String::new()
        } else {
            format!(" -- {}", args.join(" "))
        }
    );
    println!("adapter: {}", ctx.describe());
    println!(
        "shapes ({}): hidden {}, intermediate {}, {} heads, {} KV heads, head size {}, {} layers, \
         vocab {} (tied embeddings), {:.1} M parameters; {} weights ~ N(0, 0.02), norms 1.0; \
         f16 KV cache, block size {BLOCK}",
        shapes.name,
        shapes.hidden,
        shapes.intermediate,
        shapes.heads,
        shapes.kv_heads,
        shapes.head_dim,
        shapes.layers,
        shapes.vocab,
        shapes.params() as f64 / 1e6,
        if args.iter().any(|a| a == "--f16") {
            "f16"
        } else {
            "bf16"
        },
    );
    if let Some(list) = args
        .iter()
        .position(|a| a == "--models")
        .and_then(|i| args.get(i + 1))
    {
        weights_section(&ctx, &weight_models(list));
        return;
    }
    let t = Instant::now();
    let f16 = args.iter().any(|a| a == "--f16");
    // `--model PATH` benches that model (a folder or a GGUF file) instead of a generated one.
    let given = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let generated = given.is_none().then(|| write_model(&shapes, f16));
    let model_dir = given.unwrap_or_else(|| generated.as_ref().expect("generated").0.clone());
    let gen_time = t.elapsed();
    let t = Instant::now();
    // `--profile-weights DTYPE` profiles the weights converted to DTYPE as they load.
    let weight_dtype = args
        .iter()
        .position(|a| a == "--profile-weights")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse::<WeightDtype>().unwrap_or_else(|e| panic!("{e}")));
    let cfg = EngineConfig {
        enable_prefix_caching: false,
        max_num_seqs: 64,
        // 64 prompts of 16 tokens prefill in one step, and so does a 512-token prompt.
        max_num_batched_tokens: 1024,
        weight_dtype,
        ..EngineConfig::default()
    };
    let mut e = engine(&ctx, &model_dir, cfg);
    e.add_request(Prompt::Tokens(prompt(999, 8)), greedy(2))
        .expect("add");
    e.run_to_completion().expect("warm-up");
    println!(
        "setup: weights generated in {:.1} s; engine loaded and warmed up in {:.1} s",
        gen_time.as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    if args.iter().any(|a| a == "--tiers") {
        drop(e);
        tiers::tiers_section(&ctx, &model_dir, quick);
        return;
    }
    if let Some(list) = args
        .iter()
        .position(|a| a == "--weights")
        .and_then(|i| args.get(i + 1))
    {
        drop(e);
        weights_section(&ctx, &weight_formats(&model_dir, list));
        return;
    }
    if args.iter().any(|a| a == "--profile") {
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
        };
        let seqs: Vec<usize> = value("--profile-seqs")
            .map_or("1,16", |s| s.as_str())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        let tokens = value("--profile-tokens")
            .and_then(|n| n.parse().ok())
            .unwrap_or(64);
        profile_section(&ctx, &mut e, &seqs, tokens.max(2));
        return;
    }

    // 1. Decode.
    println!();
    println!(
        "## 1. Decode throughput (greedy, {DECODE_PROMPT}-token prompts, {DECODE_TOKENS} tokens \
         per request; only the steps after every request's first token are timed)"
    );
    println!();
    println!("| concurrent sequences N | decode tokens timed | decode steps | median step (ms) | tokens/s | vs N=1 |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut rates = Vec::new();
    for n in [1, 8, 32, 64] {
        let d = decode(&mut e, n, DECODE_PROMPT, DECODE_TOKENS);
        let rate = d.tokens as f64 / d.time.as_secs_f64();
        rates.push((n, rate));
        let base = rates[0].1;
        println!(
            "| {n} | {} | {} | {:.1} | {:.2} | {:.2}x |",
            d.tokens,
            d.steps.len(),
            ms(median(d.steps)),
            rate,
            rate / base
        );
    }
    let r = |n| {
        rates
            .iter()
            .find(|(m, _)| *m == n)
            .map_or(f64::NAN, |x| x.1)
    };
    println!();
    println!(
        "**N=32 / N=1 decode throughput: {:.2}x** (the issue's target: >= 8x, what batching buys).",
        r(32) / r(1)
    );
    println!();
    println!(
        "Caveat: on a CPU adapter every row of a step costs its own arithmetic (a software \
         adapter reaches some tens of GFLOP/s), so batching buys only what the weight reads and the \
         per-step overhead cost; `cargo bench --bench matmul` shows that ceiling kernel by \
         kernel. On a GPU a decode step is dominated by reading the weights once, whatever \
         the number of rows, which is where the 8x aim applies: measure the ratio there."
    );

    // 2. Prefill.
    println!();
    println!("## 2. Prefill and time to first token (one request, max_tokens 1)");
    println!();
    println!("| prompt tokens | time to first token (ms) | prefill step (ms) | prompt tokens/s |");
    println!("|---:|---:|---:|---:|");
    let mut prefill_512 = Duration::ZERO;
    for (seed, len) in [(300, 128), (301, 512)] {
        let (ttft, last) = first_token(&mut e, seed, len);
        if len == 512 {
            prefill_512 = last;
        }
        println!(
            "| {len} | {:.1} | {:.1} | {:.1} |",
            ms(ttft),
            ms(last),
            len as f64 / last.as_secs_f64()
        );
    }
    drop(e);

    // 3. Preemption.
    println!();
    println!("## 3. Cost of one preemption of a 512-token sequence (32 blocks)");
    println!();
    println!(
        "Through the engine: a 16-token and a 512-token greedy request (2 tokens each) fill a \
         33-block pool in one prefill step (step 1); in step 2 the older request needs a new \
         block, so the 512-token one is preempted (swap-out of its 32 blocks, or freeing them) \
         while the older one decodes and finishes; in step 3 it resumes: swap-in of 32 blocks \
         plus a 1-token decode, or recomputation = a 513-token prefill (512 + the token it \
         generated)."
    );
    println!();
    println!("| mode | wall (ms) | step 1: prefill (ms) | step 2: preempt (ms) | step 3: resume (ms) | preemptions (swap / recompute) | recomputed tokens | blocks swapped out / in |");
    println!("|---|---:|---:|---:|---:|---|---:|---|");
    let mut results = Vec::new();
    for mode in [PreemptionMode::Swap, PreemptionMode::Recompute] {
        let s = preemption_scenario(&ctx, &model_dir, mode);
        let st = &s.stats.scheduler;
        let steps: Vec<String> = s.steps.iter().map(|d| format!("{:.1}", ms(*d))).collect();
        let col = |i: usize| steps.get(i).cloned().unwrap_or_else(|| "-".into());
        println!(
            "| {mode:?} | {:.1} | {} | {} | {} | {} ({} / {}) | {} | {} / {} |",
            ms(s.wall),
            col(0),
            col(1),
            col(2),
            st.preemptions,
            st.preempted_by_swap,
            st.preempted_by_recompute,
            st.recomputed_tokens,
            s.stats.blocks_swapped_out(),
            s.stats.blocks_swapped_in(),
        );
        if s.steps.len() != 3 {
            println!("(unexpected: {mode:?} took {} steps)", s.steps.len());
        }
        results.push(s);
    }
    let (swap_run, recompute_run) = (&results[0], &results[1]);
    println!();
    println!(
        "Recompute - swap wall time: {:.1} ms; greedy outputs identical in both modes: {}.",
        ms(recompute_run.wall.saturating_sub(swap_run.wall)),
        if swap_run.outputs == recompute_run.outputs {
            "yes"
        } else {
            "NO"
        }
    );

    println!();
    let layout = shapes.kv_layout();
    let blocks = 512 / BLOCK;
    let [out, back] = swap_direct(&ctx, layout, blocks, 5);
    let swap = out + back;
    let recompute = recompute_run
        .steps
        .get(2)
        .copied()
        .unwrap_or(Duration::ZERO);
    println!(
        "Direct: swap = `CacheEngine::execute` of a swap-out, then a swap-in, of {blocks} blocks \
         ({} KiB each way: {} layers x K,V x {} KV heads x {BLOCK} tokens x head size {} x f16) \
         on a pool of the same layout, median of 5 after a warm-up; recompute = step 3 of the \
         Recompute run above (the 513-token prefill resuming the sequence).",
        layout.block_bytes_all_layers() * blocks as u64 / 1024,
        layout.num_layers,
        layout.num_kv_heads,
        layout.head_dim,
    );
    println!();
    println!("| cost of one preemption | ms |");
    println!("|---|---:|");
    println!("| swap-out, {blocks} blocks | {:.2} |", ms(out));
    println!("| swap-in, {blocks} blocks | {:.2} |", ms(back));
    println!("| swap, total | {:.2} |", ms(swap));
    println!(
        "| recompute: 513-token prefill step | {:.1} |",
        ms(recompute)
    );
    println!(
        "| (for comparison: 512-token prefill step, section 2) | {:.1} |",
        ms(prefill_512)
    );
    println!();
    println!(
        "**recompute / swap: {:.0}x** (on a software adapter \"device\" memory is host memory, \
         so a swap is two memcpys while the prefill is slow CPU compute; on a discrete GPU the \
         swap crosses PCIe and the prefill is far faster, so the ratio is much smaller there. \
         Both grow about linearly with the number of layers, so the ratio hardly depends on it.)",
        recompute.as_secs_f64() / swap.as_secs_f64()
    );

    // 4. Decode first.
    println!();
    println!("## 4. Inter-token latency while an older prompt is prefilled again (decode first vs oldest first)");
    println!();
    println!(
        "Three requests in a 20-block pool, 8 host blocks, 16-token step budget (see \
         `decode_first_scenario`): the newest, 4 samples of 40 tokens, is swapped out and back \
         in, and decodes while an older request, preempted by recomputation, prefills its \
         96+ tokens again in chunks. Gaps between consecutive tokens of the 4 samples from \
         that recompute preemption on (wall time of the steps in between)."
    );
    println!();
    println!("| policy | tokens timed | p50 gap (ms) | p99 gap (ms) | max gap (ms) | wall (s) | steps | preemptions (swap / recompute) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let mut p99s = Vec::new();
    for decode_first in [true, false] {
        let (gaps, wall, st) = decode_first_scenario(&ctx, &model_dir, decode_first);
        let n = gaps.len();
        let (p50, p99, max) = (
            percentile(gaps.clone(), 0.5),
            percentile(gaps.clone(), 0.99),
            percentile(gaps, 1.0),
        );
        p99s.push(p99);
        println!(
            "| {} | {n} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} / {} |",
            if decode_first {
                "decode first"
            } else {
                "oldest first"
            },
            ms(p50),
            ms(p99),
            ms(max),
            wall.as_secs_f64(),
            st.scheduler.steps,
            st.scheduler.preempted_by_swap,
            st.scheduler.preempted_by_recompute,
        );
    }
    println!();
    println!(
        "**p99 inter-token gap, oldest first / decode first: {:.2}x**",
        p99s[1].as_secs_f64() / p99s[0].as_secs_f64()
    );

    // 5. Preemption modes.
    println!();
    println!("## 5. A preemption-heavy workload under swap, recompute and automatic preemption");
    println!();
    println!(
        "Twelve requests (prompts of 24-87 tokens, 48 tokens each, every fourth one 2 samples) \
         in a 24-block pool with a 256-block host pool and a 128-token step budget."
    );
    println!();
    println!("| mode | wall (s) | steps | preemptions (swap / recompute) | chosen by measured cost | recomputed tokens | blocks swapped out / in | outputs equal to the swap run |");
    println!("|---|---:|---:|---|---:|---:|---|---|");
    let mut first: Option<Vec<pagellm::internals::engine::RequestOutput>> = None;
    let mut auto_stats = None;
    for mode in [
        Some(PreemptionMode::Swap),
        Some(PreemptionMode::Recompute),
        None,
    ] {
        let (wall, st, outs) = pressure_workload(&ctx, &model_dir, mode);
        let same = first.as_ref().map_or("(reference)".to_string(), |f| {
            if *f == outs {
                "yes".into()
            } else {
                "NO".into()
            }
        });
        let sc = &st.scheduler;
        println!(
            "| {} | {:.2} | {} | {} ({} / {}) | {} | {} | {} / {} | {same} |",
            mode.map_or("automatic".to_string(), |m| format!("{m:?}")),
            wall.as_secs_f64(),
            sc.steps,
            sc.preemptions,
            sc.preempted_by_swap,
            sc.preempted_by_recompute,
            sc.chosen_by_cost,
            sc.recomputed_tokens,
            st.blocks_swapped_out(),
            st.blocks_swapped_in(),
        );
        if first.is_none() {
            first = Some(outs);
        }
        if mode.is_none() {
            auto_stats = Some(st);
        }
    }
    if let Some(st) = auto_stats {
        let c = st.costs;
        println!();
        println!(
            "Automatic mode measured swap at {:.0} MiB/s and prefill at {:.0} tokens/s; its last \
             estimate for a victim: swap {:.2} ms, recompute {:.2} ms.",
            c.swap_bytes_per_s.unwrap_or(0.0) / (1 << 20) as f64,
            c.prefill_tokens_per_s.unwrap_or(0.0),
            st.scheduler
                .last_estimate
                .map_or(f64::NAN, |e| e.swap_s * 1e3),
            st.scheduler
                .last_estimate
                .map_or(f64::NAN, |e| e.recompute_s * 1e3),
        );
    }
    drop(generated);
    println!();
    println!("total run time: {:.1} s", run_start.elapsed().as_secs_f64());
}
