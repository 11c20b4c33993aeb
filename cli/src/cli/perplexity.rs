//! `pagellm perplexity`: teacher-forced scoring of a text file (see [`pagellm::internals::eval`]).

use super::engine_args::{KvDtypeArg, KvRotationArg};
use super::generate::default_model_dir;
use anyhow::{Context, Result};
use clap::Args;
use pagellm::internals::eval::{score, Report, Scorer};
use pagellm::EngineConfig;
use pagellm::KvRotation;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// Hugging Face model folder; defaults to the small model shipped in the repository.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text to score (UTF-8), tokenized as a whole with the tokenizer's special tokens.
    #[arg(long)]
    file: PathBuf,
    /// Tokens per window; each window is scored from its own start.
    #[arg(long, default_value_t = 256)]
    context: usize,
    /// Tokens per prefill chunk, so that later chunks attend to the cache earlier ones left.
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, value_enum, default_value = "f16")]
    kv_dtype: KvDtypeArg,
    /// auto: Hadamard for int8/int4, none for f16/f32.
    #[arg(long, value_enum, default_value = "auto")]
    kv_rotation: KvRotationArg,
    /// Convert the weights as they load (see `generate --help`): compare a quantization's
    /// KL divergence with a baseline saved without it.
    #[arg(long, value_name = "FORMAT")]
    weight_dtype: Option<pagellm::WeightDtype>,
    /// Save every scored token's log-probabilities (f32, whole vocabulary) as a baseline.
    #[arg(long, value_name = "PATH", conflicts_with = "kl_divergence")]
    save_logits: Option<PathBuf>,
    /// Compare with a baseline saved by --save-logits over the same text and --context:
    /// mean and 99th-percentile KL divergence, and top-1 agreement.
    #[arg(long, value_name = "PATH")]
    kl_divergence: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Time every GPU kernel and print a table at the end (as `PAGELLM_PROFILE=1` does).
    #[arg(long)]
    profile: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let dir = match args.model.clone() {
        Some(d) => d,
        None => default_model_dir()?,
    };
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let config = EngineConfig {
        block_size: args.block_size,
        kv_dtype: args.kv_dtype.into(),
        kv_rotation: args.kv_rotation.into(),
        weight_dtype: args.weight_dtype,
        ..EngineConfig::default()
    };
    let ctx = Arc::new(pagellm::GpuContext::from_env()?);
    if args.profile {
        ctx.enable_profiling();
    }
    let mut scorer = Scorer::new(
        ctx.clone(),
        &dir,
        &config,
        args.context,
        args.chunk,
        |_, _| {},
    )
    .with_context(|| format!("loading the model in {}", dir.display()))?;
    let tokens = scorer
        .tokenizer()
        .encode(&text)
        .with_context(|| format!("tokenizing {}", args.file.display()))?;
    let report = score_with_progress(&mut scorer, &tokens, &args)?;
    let kv = KvSetting {
        dtype: config.kv_dtype.to_string(),
        rotation: config
            .kv_rotation
            .unwrap_or(KvRotation::default_for(config.kv_dtype))
            .to_string(),
    };
    if args.json {
        print_json(&args, tokens.len(), &report, &kv);
    } else {
        print_text(&args, tokens.len(), &report, &kv);
    }
    if let Some(report) = ctx.take_profile_report() {
        eprintln!("\n{report}");
    }
    Ok(())
}

/// Scores `tokens` window by window with a progress bar on stderr.
fn score_with_progress(
    scorer: &mut Scorer,
    tokens: &[u32],
    args: &PerplexityArgs,
) -> Result<Report> {
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("scoring {bar:30} {pos}/{len} windows {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = score(
        scorer,
        tokens,
        args.save_logits.as_deref(),
        args.kl_divergence.as_deref(),
        |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    )?;
    bar.finish_and_clear();
    Ok(report)
}

fn print_json(args: &PerplexityArgs, num_tokens: usize, report: &Report, kv: &KvSetting) {
    let mut v = serde_json::json!({
        "file": args.file.display().to_string(),
        "tokens": num_tokens,
        "context": args.context,
        "windows": report.windows,
        "tokens_scored": report.tokens_scored,
        "kv_dtype": kv.dtype,
        "kv_rotation": kv.rotation,
        "weight_dtype": args.weight_dtype.map_or("as stored".to_string(), |d| d.to_string()),
        "mean_nll": report.mean_nll,
        "perplexity": report.perplexity(),
    });
    if let Some(d) = &report.divergence {
        v["mean_kld"] = d.mean_kld.into();
        v["p99_kld"] = d.p99_kld.into();
        v["max_kld"] = d.max_kld.into();
        v["top1_agreement"] = d.top1_agreement.into();
        v["base_perplexity"] = d.base_perplexity.into();
    }
    println!("{v}");
}

fn print_text(args: &PerplexityArgs, num_tokens: usize, report: &Report, kv: &KvSetting) {
    println!(
        "{}: {} tokens, {} windows of {} ({} scored); KV cache {}, rotation {}; weights {}",
        args.file.display(),
        num_tokens,
        report.windows,
        args.context,
        report.tokens_scored,
        kv.dtype,
        kv.rotation,
        args.weight_dtype
            .map_or("as stored".to_string(), |d| d.to_string())
    );
    println!("mean NLL:        {:.5} nats", report.mean_nll);
    println!("perplexity:      {:.4}", report.perplexity());
    if let Some(d) = &report.divergence {
        println!("baseline PPL:    {:.4}", d.base_perplexity);
        println!(
            "KL divergence:   mean {:.6}, p99 {:.6}, max {:.6} nats",
            d.mean_kld, d.p99_kld, d.max_kld
        );
        println!("top-1 agreement: {:.2}%", 100.0 * d.top1_agreement);
    }
    if let Some(p) = &args.save_logits {
        println!("saved log-probabilities to {}", p.display());
    }
}

struct KvSetting {
    dtype: String,
    rotation: String,
}
