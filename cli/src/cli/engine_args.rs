//! The engine options `generate` and `serve` share: KV cache layout and sizes, scheduler
//! limits, preemption mode, KV precision, prefix caching, the weights' format.

use clap::{Args, ValueEnum};
use pagellm::WeightDtype;
use pagellm::{EngineConfig, PreemptionMode, SpeculativeConfig};
use pagellm::{KvDtype, KvRotation};

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
    Int8,
    Int4,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvRotationArg {
    /// Hadamard for int8/int4 caches, none for f16/f32 (measured: docs/BENCHMARKS.md).
    Auto,
    None,
    Hadamard,
}

impl From<KvDtypeArg> for KvDtype {
    fn from(a: KvDtypeArg) -> Self {
        match a {
            KvDtypeArg::F16 => KvDtype::F16,
            KvDtypeArg::F32 => KvDtype::F32,
            KvDtypeArg::Int8 => KvDtype::Int8,
            KvDtypeArg::Int4 => KvDtype::Int4,
        }
    }
}

impl From<KvRotationArg> for Option<KvRotation> {
    fn from(a: KvRotationArg) -> Self {
        match a {
            KvRotationArg::Auto => None,
            KvRotationArg::None => Some(KvRotation::None),
            KvRotationArg::Hadamard => Some(KvRotation::Hadamard),
        }
    }
}

/// How proposals for speculative decoding are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpeculativeArg {
    /// Prompt lookup: the tokens that followed the latest earlier match of the newest
    /// n-gram in the sequence's own prompt and output.
    Ngram,
    /// A draft model (a model folder with the target's vocabulary) decoding ahead.
    Draft(std::path::PathBuf),
}

fn parse_speculative(s: &str) -> Result<SpeculativeArg, String> {
    match s {
        "ngram" => Ok(SpeculativeArg::Ngram),
        d if d.starts_with("draft:") => match &d["draft:".len()..] {
            "" => Err("`draft:` needs the draft model's folder, as in `draft:models/small`".into()),
            dir => Ok(SpeculativeArg::Draft(dir.into())),
        },
        other => Err(format!(
            "unknown method `{other}`; expected `ngram` or `draft:DIR`"
        )),
    }
}

fn parse_row_cost(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(c) if (0.0..=1.0).contains(&c) => Ok(c),
        Ok(c) => Err(format!("{c} is not a cost between 0 and 1")),
        Err(e) => Err(format!("`{s}` is not a number: {e}")),
    }
}

fn parse_step_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(ms),
        Ok(ms) => Err(format!("{ms} is not a positive number of milliseconds")),
        Err(e) => Err(format!("`{s}` is not a number: {e}")),
    }
}

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Device KV blocks (default: see --kv-cache-bytes).
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    /// Bytes of the device KV pool (default: fitted to the device, --kv-memory-fraction of
    /// the memory it reports free once the weights are on it, between one and
    /// --max-num-seqs sequences at the full context; at most 256 MiB where it reports none,
    /// and at most that of a software or integrated adapter's host memory).
    #[arg(long, value_name = "BYTES", conflicts_with = "num_gpu_blocks")]
    pub kv_cache_bytes: Option<u64>,
    /// The share of the device memory free after the weights that a KV pool given no size
    /// takes.
    #[arg(long, value_name = "F", default_value_t = 0.8)]
    pub kv_memory_fraction: f64,
    /// Host blocks for swapping (default: as many as fit in 256 MiB).
    #[arg(long)]
    pub num_cpu_blocks: Option<usize>,
    /// How preempted requests recover: `auto` picks swap or recompute per preemption by
    /// measured cost (swap bandwidth against prefill throughput).
    #[arg(long, value_enum, default_value = "auto")]
    pub preemption_mode: PreemptionArg,
    /// Cap the context below the model's own, so a small KV pool is a valid
    /// configuration (the pool must hold one sequence of this length). LongRoPE models
    /// (Phi-3) default to their original context; a longer one, up to
    /// max_position_embeddings, switches to the long rope factors.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Token budget of one step (prefill chunks plus decodes).
    #[arg(long, default_value_t = 512)]
    pub max_batched_tokens: usize,
    /// A frame-time budget: the most milliseconds one engine step should take (8 or 16 on
    /// a GPU that also draws a desktop). Steps are timed and prefill chunks cut to what
    /// fits; outputs do not change. Default: no budget beyond --max-batched-tokens.
    #[arg(long, value_name = "MS", value_parser = parse_step_ms)]
    pub max_step_ms: Option<f64>,
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Storage of the KV cache: f16, f32, or int8 / int4 codes with f16 scales per group of
    /// 64 / 32 values (1.94x / 3.56x the tokens of f16 in the same bytes for head sizes
    /// that are multiples of 64 / 32).
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_dtype: KvDtypeArg,
    /// Rotate each head's keys (and the queries that meet them) by a random-signed Hadamard
    /// transform before the cache stores them, spreading outlier channels before
    /// quantization.
    #[arg(long, value_enum, default_value = "auto")]
    pub kv_rotation: KvRotationArg,
    /// Time every GPU kernel and the host's share of each step; print a table per step kind
    /// (prefill, decode) at the end (as `PAGELLM_PROFILE=1` does).
    #[arg(long)]
    pub profile: bool,
    /// Keep KV blocks that every layer's sliding window has left (by default a model whose
    /// layers all slide, such as Mistral, gives them back to the pool as it generates).
    #[arg(long)]
    pub keep_out_of_window_blocks: bool,
    /// Convert the weights that matmuls and the embedding read as they load: q8_0, q4_k,
    /// q5_k, q6_k, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, iq4_nl, iq4_xs or mxfp4 quantize a
    /// safetensors model (Q4_K takes 0.28x the memory of f16); f32, f16 or bf16 widen a GGUF
    /// model's blocks. Default: as stored on disk.
    #[arg(long, value_name = "FORMAT")]
    pub weight_dtype: Option<WeightDtype>,
    /// Speculative decoding: `ngram` proposes the tokens that followed the newest n-gram's
    /// latest earlier occurrence in the sequence's prompt and output, and each step verifies
    /// them at once. Outputs are exactly those without it (greedy and seeded); faster where
    /// the output repeats its context (editing, quoting, code), and each request turns it off
    /// where its proposals are rarely accepted. `draft:DIR` proposes with the draft model
    /// in DIR instead (a smaller model with the same vocabulary, decoding greedily ahead).
    #[arg(long, value_name = "METHOD", value_parser = parse_speculative)]
    pub speculative: Option<SpeculativeArg>,
    /// Most tokens proposed per sequence and step (the adaptive k proposes fewer where
    /// fewer pay).
    #[arg(long, value_name = "K", default_value_t = 7, requires = "speculative",
          value_parser = clap::value_parser!(u16).range(1..=16))]
    pub num_speculative_tokens: u16,
    /// Shortest n-gram prompt lookup matches.
    #[arg(long, default_value_t = 1, requires = "speculative")]
    pub ngram_min: usize,
    /// Longest n-gram prompt lookup matches (the longest match found wins).
    #[arg(long, default_value_t = 4, requires = "speculative")]
    pub ngram_max: usize,
    /// What a proposed token's row costs, relative to a sequence's share of a decode step,
    /// which the adaptive k weighs against the acceptance rate (0 to 1). Default: measured
    /// as the engine runs. A fixed value makes the choice of k independent of timing; 0
    /// speculates wherever the acceptance rate stays above 5%.
    #[arg(long, value_name = "COST", requires = "speculative", value_parser = parse_row_cost)]
    pub speculative_row_cost: Option<f64>,
    /// Host blocks the prefix cache may keep prompt blocks in once the device pool evicts
    /// them (copied back up on a later hit instead of recomputed); they share the host pool
    /// with swapping, which comes first. Default: none, or half the host pool with
    /// --kv-cache-dir.
    #[arg(long, value_name = "N")]
    pub kv_cache_host_blocks: Option<usize>,
    /// Keep computed prompt blocks in this folder too, so that a later run (or another
    /// process of the same model and settings) reads a long shared prefix instead of
    /// recomputing it. Records are checked on every read; a bad one is recomputed.
    #[arg(long, value_name = "DIR")]
    pub kv_cache_dir: Option<std::path::PathBuf>,
    /// Most bytes the --kv-cache-dir folder may hold for this model; older records go first.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 30, requires = "kv_cache_dir")]
    pub kv_cache_disk_bytes: u64,
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            block_size: self.block_size,
            num_gpu_blocks: self.num_gpu_blocks,
            kv_cache_bytes: self.kv_cache_bytes,
            kv_memory_fraction: self.kv_memory_fraction,
            num_cpu_blocks: self.num_cpu_blocks,
            preemption_mode: match self.preemption_mode {
                PreemptionArg::Auto => None,
                PreemptionArg::Swap => Some(PreemptionMode::Swap),
                PreemptionArg::Recompute => Some(PreemptionMode::Recompute),
            },
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_batched_tokens,
            max_step_ms: self.max_step_ms,
            enable_prefix_caching: !self.no_prefix_caching,
            kv_dtype: self.kv_dtype.into(),
            kv_rotation: self.kv_rotation.into(),
            profile: self.profile,
            free_out_of_window_blocks: !self.keep_out_of_window_blocks,
            weight_dtype: self.weight_dtype,
            speculative: self.speculative.as_ref().map(|_| SpeculativeConfig {
                num_tokens: self.num_speculative_tokens.into(),
                ngram_min: self.ngram_min,
                ngram_max: self.ngram_max,
                row_cost: self.speculative_row_cost,
            }),
            draft_model: match &self.speculative {
                Some(SpeculativeArg::Draft(dir)) => Some(dir.clone()),
                _ => None,
            },
            host_tier_blocks: self.kv_cache_host_blocks,
            kv_cache_dir: self.kv_cache_dir.clone(),
            kv_cache_disk_bytes: self.kv_cache_disk_bytes,
            ..EngineConfig::default()
        }
    }
}
