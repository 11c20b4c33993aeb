//! `pagellm generate`: the engine on the command line. One prompt streams its text to the
//! terminal; `--prompts-file` submits every line's request at once so they are batched
//! together, and prints the results in input order; `--json` prints one JSON object per
//! request instead of text.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use pagellm::engine::{
    Engine, EngineConfig, PreemptionMode, Prompt, RequestEvent, RequestHandle, RequestOutput,
};
use pagellm::pool::KvDtype;
use pagellm::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// The model that ships in the repository, used when `--model` is not given.
pub fn default_model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/fortunes-llama")
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PreemptionArg {
    /// Per preemption, whichever of swapping and recomputing the engine's measurements say
    /// is cheaper.
    Auto,
    Swap,
    Recompute,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvDtypeArg {
    F16,
    F32,
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Hugging Face model folder (config.json, *.safetensors, tokenizer.json); defaults to
    /// the small model shipped in the repository.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, required_unless_present = "prompts_file")]
    prompt: Option<String>,
    /// A JSON Lines file, one request per line: {"prompt": ..., "max_tokens": ...,
    /// "temperature": ..., "seed": ..., "n": ..., "beam_width": ...}; unset fields take the
    /// command-line values.
    #[arg(long, conflicts_with = "prompt")]
    prompts_file: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 turns top-k off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Number of samples per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// Beam search with this many beams (greedy; set --temperature 0).
    #[arg(long)]
    beam_width: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    length_penalty: f32,
    /// Stop string (repeatable); the output ends before it.
    #[arg(long)]
    stop: Vec<String>,
    #[arg(long)]
    ignore_eos: bool,
    /// Report the chosen token's logprob and the top K alternatives.
    #[arg(long, value_name = "K")]
    logprobs: Option<usize>,
    /// One JSON object per line per request instead of text.
    #[arg(long)]
    json: bool,
    /// Print KV cache and scheduler statistics at the end.
    #[arg(long)]
    stats: bool,

    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Device KV blocks (default: as many as fit in 256 MiB).
    #[arg(long)]
    num_gpu_blocks: Option<usize>,
    /// Host blocks for swapping (default: as many as fit in 256 MiB).
    #[arg(long)]
    num_cpu_blocks: Option<usize>,
    /// How preempted requests recover: `auto` picks swap or recompute per preemption by
    /// measured cost (swap bandwidth against prefill throughput).
    #[arg(long, value_enum, default_value = "auto")]
    preemption_mode: PreemptionArg,
    /// Cap the context below the model's own, so a small KV pool is a valid
    /// configuration (the pool must hold one sequence of this length).
    #[arg(long)]
    max_model_len: Option<usize>,
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Token budget of one step (prefill chunks plus decodes).
    #[arg(long, default_value_t = 512)]
    max_batched_tokens: usize,
    #[arg(long)]
    no_prefix_caching: bool,
    #[arg(long, value_enum, default_value = "f16")]
    kv_dtype: KvDtypeArg,
}

/// One line of `--prompts-file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRequest {
    prompt: String,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    n: Option<usize>,
    beam_width: Option<usize>,
    stop: Option<Vec<String>>,
    logprobs: Option<usize>,
    ignore_eos: Option<bool>,
}

impl GenerateArgs {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_k: (self.top_k > 0).then_some(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            stop_token_ids: Vec::new(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            beam_width: self.beam_width,
            length_penalty: self.length_penalty,
        }
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            num_gpu_blocks: self.num_gpu_blocks,
            num_cpu_blocks: self.num_cpu_blocks,
            preemption_mode: match self.preemption_mode {
                PreemptionArg::Auto => None,
                PreemptionArg::Swap => Some(PreemptionMode::Swap),
                PreemptionArg::Recompute => Some(PreemptionMode::Recompute),
            },
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_batched_tokens,
            enable_prefix_caching: !self.no_prefix_caching,
            kv_dtype: match self.kv_dtype {
                KvDtypeArg::F16 => KvDtype::F16,
                KvDtypeArg::F32 => KvDtype::F32,
            },
            ..EngineConfig::default()
        }
    }

    fn requests(&self) -> Result<Vec<(String, SamplingParams)>> {
        let base = self.params();
        let Some(path) = &self.prompts_file else {
            return Ok(vec![(self.prompt.clone().unwrap_or_default(), base)]);
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let r: FileRequest = serde_json::from_str(line).with_context(|| {
                format!("{} line {}: not a valid request", path.display(), i + 1)
            })?;
            let p = SamplingParams {
                max_tokens: r.max_tokens.unwrap_or(base.max_tokens),
                temperature: r.temperature.unwrap_or(base.temperature),
                top_p: r.top_p.unwrap_or(base.top_p),
                top_k: r.top_k.map(|k| (k > 0).then_some(k)).unwrap_or(base.top_k),
                min_p: r.min_p.unwrap_or(base.min_p),
                seed: r.seed.or(base.seed),
                n: r.n.unwrap_or(base.n),
                beam_width: r.beam_width.or(base.beam_width),
                stop: r.stop.unwrap_or_else(|| base.stop.clone()),
                logprobs: r.logprobs.or(base.logprobs),
                ignore_eos: r.ignore_eos.unwrap_or(base.ignore_eos),
                ..base.clone()
            };
            out.push((r.prompt, p));
        }
        if out.is_empty() {
            bail!("{} holds no requests", path.display());
        }
        Ok(out)
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let dir = args.model.clone().unwrap_or_else(default_model_dir);
    let requests = args.requests()?;
    let ctx = Arc::new(pagellm::GpuContext::from_env()?);
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("loading {msg} {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(dir.display().to_string());
    let mut engine = Engine::with_context(ctx, &dir, args.engine_config(), |done, total| {
        // Only worth a bar for real models.
        if total > 64 << 20 {
            bar.set_length(total);
            bar.set_position(done);
        }
    })
    .with_context(|| format!("loading the model in {}", dir.display()))?;
    bar.finish_and_clear();

    let mut handles: Vec<RequestHandle> = Vec::new();
    for (i, (prompt, params)) in requests.iter().enumerate() {
        let h = engine
            .add_request(Prompt::Text(prompt.clone()), params.clone())
            .with_context(|| format!("request {}", i + 1))?;
        handles.push(h);
    }
    let stream = !args.json
        && handles.len() == 1
        && requests[0].1.n == 1
        && requests[0].1.beam_width.is_none();
    let mut outputs: Vec<Option<Result<RequestOutput, String>>> = vec![None; handles.len()];
    let stdout = std::io::stdout();
    if stream {
        print!("{}", requests[0].0);
        stdout.lock().flush().ok();
    }
    while engine.has_unfinished() {
        engine.step()?;
        for (i, h) in handles.iter().enumerate() {
            while let Ok(ev) = h.events.try_recv() {
                match ev {
                    RequestEvent::Token { text, .. } if stream => {
                        print!("{text}");
                        stdout.lock().flush().ok();
                    }
                    RequestEvent::Token { .. } => {}
                    RequestEvent::Finished(out) => outputs[i] = Some(Ok(out)),
                    RequestEvent::Failed(msg) => outputs[i] = Some(Err(msg)),
                }
            }
        }
    }
    for (i, h) in handles.iter().enumerate() {
        while let Ok(ev) = h.events.try_recv() {
            match ev {
                RequestEvent::Finished(out) => outputs[i] = Some(Ok(out)),
                RequestEvent::Failed(msg) => outputs[i] = Some(Err(msg)),
                RequestEvent::Token { .. } => {}
            }
        }
    }
    if stream {
        println!();
    }
    let mut failed = 0;
    for (i, out) in outputs.into_iter().enumerate() {
        match out {
            Some(Ok(out)) if args.json => println!("{}", to_json(&out)),
            Some(Ok(out)) if !stream => print_text(i, &requests[i].0, &out, handles.len() > 1),
            Some(Ok(_)) => {}
            Some(Err(msg)) => {
                failed += 1;
                eprintln!("request {}: {msg}", i + 1);
            }
            None => {
                failed += 1;
                eprintln!("request {}: no output", i + 1);
            }
        }
    }
    if args.stats {
        print_stats(&engine);
    }
    if failed > 0 {
        bail!("{failed} of {} requests failed", handles.len());
    }
    Ok(())
}

fn to_json(out: &RequestOutput) -> serde_json::Value {
    json!({
        "prompt_token_ids": out.prompt_token_ids,
        "outputs": out.outputs.iter().map(|o| {
            let mut v = json!({
                "text": o.text,
                "token_ids": o.token_ids,
                "finish_reason": o.finish_reason,
            });
            if !o.logprobs.is_empty() {
                v["logprobs"] = json!(o.logprobs.iter().map(|l| json!({
                    "token_id": l.token_id,
                    "logprob": l.logprob,
                    "top": l.top.iter().map(|&(id, lp)| json!([id, lp])).collect::<Vec<_>>(),
                })).collect::<Vec<_>>());
            }
            v
        }).collect::<Vec<_>>(),
    })
}

fn print_text(i: usize, prompt: &str, out: &RequestOutput, many: bool) {
    if many {
        println!("=== request {} ===", i + 1);
    }
    for o in &out.outputs {
        if out.outputs.len() > 1 {
            println!("--- output {} ({:?}) ---", o.index, o.finish_reason);
        }
        println!("{prompt}{}", o.text);
    }
}

fn print_stats(engine: &Engine) {
    let s = engine.stats();
    let c = &s.cache;
    eprintln!("--- statistics ---");
    eprintln!("steps:                  {}", s.scheduler.steps);
    eprintln!(
        "preemptions:            {} (swap {}, recompute {})",
        s.scheduler.preemptions, s.scheduler.preempted_by_swap, s.scheduler.preempted_by_recompute
    );
    if let Some(e) = s.scheduler.last_estimate {
        eprintln!(
            "chosen by cost:         {} (last estimate: swap {:.2} ms, recompute {:.2} ms)",
            s.scheduler.chosen_by_cost,
            e.swap_s * 1e3,
            e.recompute_s * 1e3
        );
    }
    let rate = |v: Option<f64>, unit: &str, scale: f64| {
        v.map_or("not measured".to_string(), |v| {
            format!("{:.1} {unit}", v / scale)
        })
    };
    eprintln!(
        "measured:               swap {}, prefill {}",
        rate(s.costs.swap_bytes_per_s, "MiB/s", (1 << 20) as f64),
        rate(s.costs.prefill_tokens_per_s, "tokens/s", 1.0)
    );
    eprintln!("recomputed tokens:      {}", s.scheduler.recomputed_tokens);
    eprintln!(
        "chunked prefills:       {} partial chunks",
        s.scheduler.partial_prefills
    );
    eprintln!(
        "failed / abandoned:     {} / {}",
        s.scheduler.failed_requests, s.abandoned_requests
    );
    eprintln!(
        "blocks swapped out/in:  {} / {}",
        s.blocks_swapped_out, s.blocks_swapped_in
    );
    eprintln!("copy-on-write copies:   {}", s.copy_on_write_copies);
    eprintln!(
        "prefix cache:           {} hits, {} misses ({:.1}% hit rate)",
        c.prefix_hits,
        c.prefix_misses,
        100.0 * c.prefix_hit_rate()
    );
    eprintln!(
        "peak blocks used:       {} of {}",
        s.scheduler.peak_blocks_used, c.device.total
    );
    eprintln!("peak running sequences: {}", s.scheduler.peak_running_seqs);
    eprintln!(
        "blocks now used/cached/free: {} / {} / {}",
        c.device.used, c.device.cached, c.device.free
    );
}
