//! A mixture of experts against a dense model of the same active parameter count, decoding
//! side by side in one run.
//!
//! Method. Two random-weight Hugging Face folders (`common::write_random_model`, bf16): a
//! `qwen3_moe` model whose layers each hold `--experts` experts (16) of width `--expert-width`
//! (512), `--top-k` (4) of them per token, and a dense `qwen3` model whose MLP is `top_k` times
//! as wide (2048), so that a token's forward pass multiplies by the same number of weights in
//! both (plus the router's 16 x 1024 in the mixture). Everything else is shared: hidden 1024,
//! 16 heads of 64, 4 KV heads, 2 layers, a 4096-token vocabulary. For each batch size (1
//! and 16 concurrent greedy requests, 16-token prompts, 33 tokens each), the two engines step
//! alternately in shuffled order (`common::alternate_steps_shuffled`) after their prefills;
//! each figure is the median decode step's wall time (the step submits once and waits).
//!
//! At one sequence the mixture reads its chosen experts' weights, the same bytes the dense
//! model reads, plus its router and the routing passes; at 16 sequences the tokens choose
//! most experts between them, and the mixture reads up to `experts / top_k` times the dense
//! MLP's bytes.
//!
//! Run: `cargo bench --bench moe` (adapter chosen as usual). `-- --quick` runs smaller shapes;
//! `-- --profile` prints each model's per-kernel GPU time instead (`GpuContext::enable_profiling`).

#[path = "common/mod.rs"]
mod common;

use pagellm::internals::engine::{Engine, EngineConfig, Prompt};
use pagellm::internals::sampling::SamplingParams;
use pagellm::GpuContext;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;

fn arg(name: &str) -> Option<usize> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

struct Shapes {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    vocab: usize,
    experts: usize,
    top_k: usize,
    expert_width: usize,
}

fn config(s: &Shapes, moe: bool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "architectures": [if moe { "Qwen3MoeForCausalLM" } else { "Qwen3ForCausalLM" }],
        "model_type": if moe { "qwen3_moe" } else { "qwen3" },
        "hidden_act": "silu",
        "hidden_size": s.hidden,
        "intermediate_size": s.top_k * s.expert_width,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "num_hidden_layers": s.layers,
        "vocab_size": s.vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": true,
        "bos_token_id": 0,
        "eos_token_id": 1,
    });
    if moe {
        v["num_experts"] = s.experts.into();
        v["num_experts_per_tok"] = s.top_k.into();
        v["moe_intermediate_size"] = s.expert_width.into();
        v["norm_topk_prob"] = true.into();
    }
    v
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median decode step of each engine with `n` concurrent greedy requests.
fn decode(engines: &mut [Engine], n: usize, tokens: usize) -> Vec<Duration> {
    let mut handles = Vec::new();
    for e in engines.iter_mut() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..n {
            let prompt: Vec<u32> = (0..16).map(|_| rng.random_range(2..512)).collect();
            let params = SamplingParams {
                max_tokens: tokens,
                ignore_eos: true,
                ..SamplingParams::greedy()
            };
            let h = e.add_request(Prompt::Tokens(prompt), params);
            handles.push(h.expect("add request"));
        }
    }
    let mut times = vec![Vec::new(); engines.len()];
    // The first step prefills every prompt (16 x 16 tokens fit one step's budget).
    common::alternate_steps_shuffled(engines, 1, &mut times, n as u64);
    for h in handles {
        let out = h.wait().expect("a finished request");
        assert_eq!(
            out.outputs[0].token_ids.len(),
            tokens,
            "every token generated"
        );
    }
    times.into_iter().map(median).collect()
}

fn main() {
    let quick = flag("--quick");
    let s = Shapes {
        hidden: if quick { 256 } else { 1024 },
        heads: if quick { 4 } else { 16 },
        kv_heads: if quick { 2 } else { 4 },
        head_dim: 64,
        layers: 2,
        vocab: 4096,
        experts: arg("--experts").unwrap_or(16),
        top_k: arg("--top-k").unwrap_or(4),
        expert_width: arg("--expert-width").unwrap_or(if quick { 128 } else { 512 }),
    };
    let ctx = Arc::new(GpuContext::from_env().expect("GPU context"));
    println!("adapter: {}", ctx.describe());
    println!(
        "shapes: hidden {}, {} layers, {} experts of {} ({} per token) against a dense MLP of {}",
        s.hidden,
        s.layers,
        s.experts,
        s.expert_width,
        s.top_k,
        s.top_k * s.expert_width
    );
    let moe_dir = common::write_random_model("moe", config(&s, true), false);
    let dense_dir = common::write_random_model("moe-dense", config(&s, false), false);
    let engine = |dir: &std::path::Path| {
        Engine::with_context(ctx.clone(), dir, EngineConfig::default(), |_, _| {}).expect("engine")
    };
    let mut engines = vec![engine(&moe_dir.0), engine(&dense_dir.0)];
    for (name, e) in ["mixture", "dense"].iter().zip(&engines) {
        let w = e.stats().weights;
        println!(
            "{name}: weights {:.1} MiB, a token reads {:.1} MiB",
            w.total as f64 / (1 << 20) as f64,
            w.active as f64 / (1 << 20) as f64
        );
    }
    // Warm-up: compiles every pipeline of both models.
    decode(&mut engines, 2, 3);
    if flag("--profile") {
        let profiler = ctx.enable_profiling();
        for n in [1, 16] {
            for (name, e) in ["mixture", "dense"].iter().zip(engines.iter_mut()) {
                profiler.take();
                decode(std::slice::from_mut(e), n, 17);
                let phases = profiler.take();
                println!("\n### {name}, {n} sequence(s)\n\n```");
                let report = pagellm::internals::gpu::profile::report(
                    profiler.method(),
                    &ctx.describe(),
                    &phases,
                );
                print!("{report}");
                println!("```");
            }
        }
        return;
    }
    println!("| sequences | mixture step (ms) | dense step (ms) | mixture / dense |");
    println!("|---:|---:|---:|---:|");
    for n in [1, 16] {
        let t = decode(&mut engines, n, 33);
        println!(
            "| {n} | {:.2} | {:.2} | {:.2} |",
            ms(t[0]),
            ms(t[1]),
            t[0].as_secs_f64() / t[1].as_secs_f64()
        );
    }
}
