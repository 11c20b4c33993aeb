//! The engine's options (plain data, below everything that reads them): KV cache size and
//! precision, scheduler limits, preemption policy, the weights' format, speculative
//! decoding, the prefix cache's tiers.

use crate::formats::{KvDtype, KvRotation, WeightDtype};

/// How a preempted sequence group gets its KV cache back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreemptionMode {
    /// Free the blocks; recompute them from the tokens when the group is resumed.
    Recompute,
    /// Copy the blocks to host memory; copy them back when the group is resumed.
    Swap,
}

/// Speculative decoding by prompt lookup: each decoding sequence looks up its latest
/// `ngram_max`..`ngram_min` tokens earlier in its own prompt and output, proposes the tokens
/// that followed there, and the step verifies them all at once (`crate::spec`). Every
/// emitted token is still the one the sampler picks from the target model's logits, so
/// outputs are those of plain decoding (greedy and seeded alike), only faster where the
/// output repeats its context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeculativeConfig {
    /// Most tokens proposed per sequence and step (`k`); each request adapts its own `k`
    /// to its acceptance rate, down to 0 where speculating does not pay. The default, 7,
    /// makes a one-sequence step 8 rows, which a CPU adapter's column kernels run in one
    /// 8-row pass for about what 5 rows cost, and which a GPU reads the weights once for.
    pub num_tokens: usize,
    /// Shortest n-gram looked up.
    pub ngram_min: usize,
    /// Longest n-gram looked up (tried first).
    pub ngram_max: usize,
    /// What proposals cost a sequence, which the adaptive `k` weighs against the
    /// acceptance rate. `None` (the default): measured as the engine runs, as the mean
    /// decode step time at each row count (`crate::spec::StepCostFit`), with
    /// [`DEFAULT_ROW_COST`] per extra row for counts not timed yet, and each new request's
    /// acceptance rate starts from the engine's recent one. `Some(c)` fixes it at `c` a
    /// row relative to a sequence's share of a step, and each request starts at one half;
    /// 0 makes every request speculate while its acceptance rate stays above 5% (tests use
    /// it to run every path).
    pub row_cost: Option<f64>,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig {
            num_tokens: 7,
            ngram_min: 1,
            ngram_max: 4,
            row_cost: None,
        }
    }
}

/// The cost of a proposed token's row assumed before it is measured: about what lavapipe's
/// projection kernels show per extra row for one sequence (docs/BENCHMARKS.md, projection
/// kernels by row count).
pub const DEFAULT_ROW_COST: f64 = 0.15;

/// Extra sampled rows the step workspace holds for proposed tokens, at most: with a large
/// vocabulary every row is a `[vocab]` logits row in memory.
pub const MAX_SPECULATIVE_ROWS: usize = 128;

#[allow(unused_imports)] // for the docs
use crate::disk_tier::RecordStore;

/// The engine's options: the KV cache's size and format, the scheduler's limits, the
/// preemption policy, the weights' format, speculative decoding and the prefix cache's
/// tiers. `EngineConfig::default()` suits the shipped model and most small ones.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Device KV blocks; `None` sizes the pool from `kv_cache_bytes`.
    pub num_gpu_blocks: Option<usize>,
    /// Byte budget of the device KV pool when `num_gpu_blocks` is not given. `None` fits
    /// the pool to the device: `kv_memory_fraction` of the memory the driver reports free
    /// once the weights are on it, at least one sequence at the full context and at most
    /// `max_num_seqs` of them; where the driver reports nothing, half the device's largest
    /// buffer, 256 MiB at most, and at most that on an adapter whose memory is the host's
    /// (software and integrated adapters). With no `max_model_len` either, a model whose
    /// context does not fit is served a shorter one, with a warning.
    pub kv_cache_bytes: Option<u64>,
    /// The share of the device memory free after the weights that a pool given no size
    /// takes (see `kv_cache_bytes`), in (0, 1].
    pub kv_memory_fraction: f64,
    /// Host blocks for swapping; `None` sizes the host pool from `swap_space_bytes`.
    pub num_cpu_blocks: Option<usize>,
    /// Byte budget of the host pool when `num_cpu_blocks` is not given.
    pub swap_space_bytes: u64,
    /// What the KV cache stores: f16 (the default), f32, int8 or int4.
    pub kv_dtype: KvDtype,
    /// Rotation of cached keys and values before they are stored (see [`KvRotation`]);
    /// `None` picks [`KvRotation::default_for`] the dtype: Hadamard for int8 and int4, none
    /// for float caches (measured, docs/BENCHMARKS.md).
    pub kv_rotation: Option<KvRotation>,
    /// `None` (automatic): for each victim, swap or recompute, whichever the engine's own
    /// measurements (swap bandwidth, prefill throughput) say is cheaper; before both are
    /// measured, swap groups of several sequences and recompute single ones. Recompute
    /// whenever the host pool is full. See `scheduler/cost.rs`.
    pub preemption_mode: Option<PreemptionMode>,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens (prefill chunks plus decode tokens) in one step.
    pub max_num_batched_tokens: usize,
    /// Reuse the KV blocks of earlier prompts that start the same way (on by default).
    pub enable_prefix_caching: bool,
    /// Context limit, at most the model's `max_position_embeddings`; `None` uses the
    /// model's default context (`ModelConfig::default_context`: the same, except the
    /// original context of LongRoPE models). Lowering it lets a small pool serve (the pool
    /// must hold one sequence of this length).
    pub max_model_len: Option<usize>,
    /// Serve running decodes before prefill chunks, so a long prompt never holds up other
    /// requests' token streams. Off serves running groups strictly oldest first (kept to
    /// measure the difference).
    pub decode_first: bool,
    /// Time every kernel and the host's share of each step (`GpuContext::enable_profiling`;
    /// `PAGELLM_PROFILE=1` does the same for every context).
    pub profile: bool,
    /// When every layer of the model has the same sliding window (Mistral, Phi-3 with
    /// `sliding_window`), give back each sequence's KV blocks once every token in them
    /// has left the window, so a long generation holds at most `window / block_size + 2`
    /// blocks (rounded up). Off keeps every block (the benchmark's baseline).
    pub free_out_of_window_blocks: bool,
    /// The format the weights that matmuls and the embedding read are converted to as they
    /// upload: a block format (`Q8_0`, `Q4_K`, ...) to quantize a safetensors model, or a
    /// float one to widen a GGUF model's blocks (`pagellm::model::convert`). `None`
    /// (the default) keeps what is on disk.
    pub weight_dtype: Option<WeightDtype>,
    /// Speculative decoding by n-gram lookup (or by `draft_model`); `None` (the default)
    /// decodes one token per sequence and step.
    pub speculative: Option<SpeculativeConfig>,
    /// A draft model (a folder, as the target's) that proposes instead of the n-gram
    /// lookup: a smaller model with the target's vocabulary (`super::draft`). Needs
    /// `speculative`, whose `num_tokens` and adaptive `k` apply.
    pub draft_model: Option<std::path::PathBuf>,
    /// Most host blocks the host tier of the prefix cache may hold: prefix blocks the
    /// device pool evicts are copied there and copied back up on a later hit instead of
    /// being recomputed. It shares the host pool with swapping, which comes first. `None`:
    /// no host tier without a disk tier, half the host pool with one.
    pub host_tier_blocks: Option<usize>,
    /// Folder of the disk tier of the prefix cache (`None`: no disk tier). Every computed
    /// full block is written there, keyed by its tokens and everything else its KV depends
    /// on, and a later prompt (in this process or another, after a restart) that starts
    /// with it reads it instead of recomputing it. Several processes may share the folder.
    pub kv_cache_dir: Option<std::path::PathBuf>,
    /// The disk tier's records in memory instead of files in `kv_cache_dir` (which must then
    /// be unset): the host persists them in storage of its own, filling the store before
    /// the engine opens and saving what [`RecordStore::take_changes`] hands back. The
    /// browser build keeps them in the Origin Private File System this way.
    pub kv_cache_store: Option<crate::disk_tier::RecordStore>,
    /// Most bytes the disk tier keeps (least recently used records go first).
    pub kv_cache_disk_bytes: u64,
    /// A frame-time budget: the most milliseconds one step should take. The engine times
    /// its steps and caps the tokens of the next one at what fits (prefill chunks shrink;
    /// see `engine::pacing`), for a GPU shared with an application's window. Outputs do
    /// not change. `None` (the default): only `max_num_batched_tokens` bounds a step.
    pub max_step_ms: Option<f64>,
    /// Destroys the device on purpose at these moments, to check recovery from a lost
    /// device (see [`crate::faults`]); `None` (the default) reads
    /// `PAGELLM_INJECT_DEVICE_LOSS` when the engine opens.
    pub inject_device_loss: Option<crate::faults::DeviceLossInjection>,
}

impl EngineConfig {
    /// Tokens a sequence may propose per step (0 without speculation).
    pub fn num_speculative_tokens(&self) -> usize {
        self.speculative.map_or(0, |s| s.num_tokens)
    }

    /// Rows beyond one per sequence that proposed tokens may take in one step.
    pub fn speculative_rows(&self) -> usize {
        (self.max_num_seqs * self.num_speculative_tokens()).min(MAX_SPECULATIVE_ROWS)
    }

    /// Most sampled rows in one step: one per running sequence plus the proposals'.
    pub fn max_sampled_rows(&self) -> usize {
        self.max_num_seqs + self.speculative_rows()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_gpu_blocks: None,
            kv_cache_bytes: None,
            kv_memory_fraction: 0.8,
            num_cpu_blocks: None,
            swap_space_bytes: 256 << 20,
            kv_dtype: KvDtype::F16,
            kv_rotation: None,
            preemption_mode: None,
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            enable_prefix_caching: true,
            max_model_len: None,
            decode_first: true,
            profile: false,
            free_out_of_window_blocks: true,
            weight_dtype: None,
            speculative: None,
            host_tier_blocks: None,
            kv_cache_dir: None,
            kv_cache_store: None,
            kv_cache_disk_bytes: 4 << 30,
            draft_model: None,
            inject_device_loss: None,
            max_step_ms: None,
        }
    }
}
