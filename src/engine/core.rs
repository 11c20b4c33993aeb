//! The engine: requests in, token streams out. Each [`Engine::step`] drops requests whose
//! caller has gone; lets speculating sequences propose tokens (n-gram lookup, or the draft
//! model, `draft.rs`); reads the prompt blocks of the requests next in line from the disk
//! tier of the prefix cache (`tiers.rs`); schedules; records the block operations and the
//! forward pass into one command buffer, submits it once and reads back what sampling needs
//! (`step_batch.rs`: the arg-max and its logprob of every row, plus logits where a request
//! samples or reports logprobs); samples and verifies proposals (`advance.rs`); streams the
//! new tokens; writes newly named blocks to the disk tier; and feeds its timings to the
//! scheduler's cost model and the adaptive number of proposals. Requests are checked and
//! prepared before they arrive (`intake.rs`).
//!
//! Failures stay where they belong: a request that can never run, or whose sampling fails,
//! fails alone; a lost device is a preemption of everything, recovered from on a new device
//! (`recover.rs`); any other error no single request caused (a GPU error, a bookkeeping
//! fault) fails every pending request with the reason and leaves the engine empty and
//! usable, so no caller ever waits forever and no step loops. The device pool can change
//! size between steps (`budget.rs`), and a frame-time budget caps each step's tokens
//! (`pacing.rs`).

use super::error::{EngineError, Result};
use super::intake::{Intake, Prepared, Request};
use super::output::{FinishReason, RequestEvent, RequestId};
use super::recovery::{DeviceLostFn, RebuildSpec, Recovery};
use super::request::{completion, Prompt, RequestHandle, RequestSide, SeqOutput, SpecState};
use super::scheduler::{PreemptionCosts, Scheduler, SchedulerStats};
use super::sequence::{Sequence, SequenceGroup};
use super::tiers::Disk;
use crate::cache::{BlockManager, BlockOps, CacheConfig, CacheStats};
use crate::cache::{DeviceBlockId, HostBlockId};
use crate::config::EngineConfig;
use crate::disk_tier::DiskStats;
use crate::faults::DeviceLossInjection;
use crate::gpu::GpuContext;
use crate::mapped::ModelSource;
use crate::pool::{KvLayout, KvPool, KvRotation};
use crate::runner::fit::fallback_pool_bytes;
use crate::runner::plan::PoolPlan;
use crate::runner::{open_model, ModelRunner};
use crate::spec::{AcceptanceRate, AdaptiveK, NgramIndex, StepCostFit};
use crate::tokenizer::Tokenizer;

use std::sync::Arc;
use web_time::Instant;

/// Weight the engine's acceptance rate keeps at each verified step: a memory of about a
/// hundred steps of proposals, across requests.
const ENGINE_RATE_DECAY: f64 = 0.99;

/// Statistics of the KV cache and the scheduler (their parts are in [`crate::stats`]).
#[derive(Clone, Debug)]
pub struct EngineStats {
    /// The block manager's: pools, prefix cache and its tiers, copy-on-write, swaps.
    pub cache: CacheStats,
    /// The scheduler's: steps, preemptions, speculation.
    pub scheduler: SchedulerStats,
    /// Requests the engine holds, in any queue.
    pub pending_requests: usize,
    /// Requests waiting for admission.
    pub num_waiting: usize,
    /// Requests running (their KV blocks on the device).
    pub num_running: usize,
    /// Requests preempted to host memory.
    pub num_swapped: usize,
    /// Requests aborted because their caller dropped the event receiver.
    pub abandoned_requests: u64,
    /// The measurements automatic preemption weighs.
    pub costs: PreemptionCosts,
    /// The device pool's layout (dtype included).
    pub kv_layout: KvLayout,
    /// The rotation keys and values are stored under.
    pub kv_rotation: KvRotation,
    /// Blocks of the device pool.
    pub kv_blocks: usize,
    /// Bytes of the device pool.
    pub kv_pool_bytes: u64,
    /// Bytes of the model's weights on the device (the experts of a mixture among them).
    pub weights: crate::model::gpu::WeightBytes,
    /// The window of each KV cache group (one group, `[None]`, keeps every block; a model
    /// whose layers all slide has one windowed group; one that mixes windowed and global
    /// layers has a global group first, then windowed ones). A block of the pool holds
    /// `kv_layout.num_layers` layers of one group.
    pub kv_groups: Vec<Option<usize>>,
    /// The draft model's work, if one proposes for speculative decoding.
    pub draft: Option<super::DraftStats>,
    /// Host time recording and submitting forward steps (not waiting for the adapter).
    pub host: HostTime,
    /// The disk tier of the prefix cache, if there is one.
    pub disk: Option<DiskStats>,
    /// Lost devices and recoveries.
    pub device: super::DeviceStats,
    /// The frame-time budget's pacing, when `max_step_ms` is set.
    pub pacing: Option<super::PacingStats>,
    /// Tokens per second of the forward steps, prefill and decode apart.
    pub throughput: StepThroughput,
}

impl EngineStats {
    /// Blocks copied because a sequence wrote into a block it shared.
    pub fn copy_on_write_copies(&self) -> u64 {
        self.cache.cow_copies
    }

    /// Blocks preemption moved to host memory.
    pub fn blocks_swapped_out(&self) -> u64 {
        self.cache.swapped_out_blocks
    }

    /// Blocks brought back from host memory.
    pub fn blocks_swapped_in(&self) -> u64 {
        self.cache.swapped_in_blocks
    }

    /// Tokens the device pool holds when full, with every KV cache group holding every
    /// token (windowed groups let longer sequences hold more).
    pub fn kv_pool_tokens(&self) -> usize {
        self.kv_blocks * self.kv_layout.block_size / self.kv_groups.len().max(1)
    }

    /// Bytes of cache one token takes in every KV cache group, K and V, scales included:
    /// every layer's K/V (and, with groups, the unused slabs of a group with fewer layers).
    pub fn kv_bytes_per_token(&self) -> f64 {
        self.kv_layout.bytes_per_token() * self.kv_groups.len().max(1) as f64
    }
}

/// The engine stepped by its caller: requests in, token streams out, one [`Engine::step`]
/// at a time. Applications run it on a thread of its own through
/// [`crate::EngineHandle`]; tests and benchmarks step it by hand.
pub struct Engine {
    pub(super) ctx: Arc<GpuContext>,
    pub(super) tokenizer: Arc<Tokenizer>,
    pub(super) config: EngineConfig,
    /// Checks, tokenizes and compiles requests (shared with the engine's handle).
    intake: Arc<Intake>,
    /// The model with its KV pools and workspace: runs what the scheduler plans.
    pub(super) runner: ModelRunner,
    /// Owns the requests' sequence groups, in its waiting, running and swapped queues.
    pub(super) scheduler: Scheduler<SeqOutput, RequestSide>,
    next_request: RequestId,
    /// Consecutive steps that computed nothing while requests were pending.
    pub(super) idle_steps: u32,
    pub(super) abandoned: u64,
    /// Fixed cost of a submit of its own, measured with the swap path (`calibrate_swap`).
    pub(super) swap_latency_s: f64,
    pub(super) host: HostTime,
    /// Whether a step is submitted and not yet finished ([`Engine::begin_step`]); requests
    /// added and aborts asked for meanwhile wait in `deferred_adds` and `deferred_aborts`
    /// until it is.
    pub(super) in_flight: bool,
    pub(super) deferred_adds: Vec<(RequestId, Prepared, flume::Sender<RequestEvent>)>,
    pub(super) deferred_aborts: Vec<RequestId>,
    /// Alive while the step in flight has not been dropped.
    pub(super) step_alive: std::sync::Weak<()>,
    /// Decode step time against rows, for the cost of a proposed token's row.
    pub(super) step_costs: StepCostFit,
    /// The acceptance rate of recent requests' proposals: where a new request's starts.
    pub(super) spec_rate: AcceptanceRate,
    /// The disk tier of the prefix cache (`tiers.rs`).
    pub(super) disk: Option<Disk>,
    /// The draft model proposing for speculative decoding, if one is configured.
    pub(super) draft: Option<super::draft::DraftModel>,
    /// What rebuilding on a new device takes, and the losses so far (`recover.rs`).
    pub(super) recovery: Recovery,
    /// Device blocks one sequence of the full context needs: the smallest pool allowed.
    pub(super) pool_needed: usize,
    /// The step-size cap under `config.max_step_ms`, if set (`pacing.rs`).
    pub(super) pacer: Option<super::StepPacer>,
    /// Forward steps' tokens and times, for the stats.
    pub(super) throughput: StepThroughput,
}

/// The host's share of the engine's forward steps: from the start of a step's recording
/// (metadata, block operations, the forward pass) to the return of its one submit, without
/// the wait for the adapter.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTime {
    /// Steps recorded.
    pub steps: u64,
    /// Their host time, together.
    pub total: std::time::Duration,
    /// Of which decode-only steps (no prompt chunk).
    pub decode_steps: u64,
    /// Their host time, together.
    pub decode_total: std::time::Duration,
    /// The latest step's.
    pub last: std::time::Duration,
    /// Bind groups the steps created because the context had none cached for their
    /// bindings (`gpu/bindings.rs`): all of a step's on the first step, then only those of
    /// buffers that changed (metadata that outgrew its buffer, block copy lists).
    pub bind_groups_created: u64,
    /// The latest step's.
    pub last_bind_groups_created: usize,
}

impl HostTime {
    pub(super) fn record(&mut self, d: std::time::Duration, decode: bool, bind_groups: usize) {
        self.steps += 1;
        self.total += d;
        self.bind_groups_created += bind_groups as u64;
        self.last_bind_groups_created = bind_groups;
        if decode {
            self.decode_steps += 1;
            self.decode_total += d;
        }
        self.last = d;
    }

    /// Mean per step (zero before the first).
    pub fn mean(&self) -> std::time::Duration {
        mean(self.total, self.steps)
    }

    /// Mean per decode-only step.
    pub fn decode_mean(&self) -> std::time::Duration {
        mean(self.decode_total, self.decode_steps)
    }
}

/// What the engine's forward steps computed and how long they took, a step's time being
/// its wall time from its start to its outputs taken (what a caller of [`Engine::step`]
/// waits), less the time it spent compiling pipelines (each kernel variant's first use pays
/// that once). Steps that computed part of a prompt count as prefill, their decode rows
/// included; the others as decode, where a token is a sequence's position computed (with
/// speculative decoding, every position verified, accepted or not).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepThroughput {
    /// Steps that computed part of a prompt.
    pub prefill_steps: u64,
    /// Tokens those steps computed.
    pub prefill_tokens: u64,
    /// Their time, together.
    pub prefill_time: std::time::Duration,
    /// Steps without a prompt chunk.
    pub decode_steps: u64,
    /// Tokens those steps computed.
    pub decode_tokens: u64,
    /// Their time, together.
    pub decode_time: std::time::Duration,
    /// Time the steps spent compiling pipelines, not counted above.
    pub compile_time: std::time::Duration,
}

impl StepThroughput {
    pub(super) fn record(
        &mut self,
        prefill: bool,
        tokens: usize,
        wall: std::time::Duration,
        compiling: std::time::Duration,
    ) {
        let compiling = compiling.min(wall);
        let took = wall - compiling;
        self.compile_time += compiling;
        if prefill {
            self.prefill_steps += 1;
            self.prefill_tokens += tokens as u64;
            self.prefill_time += took;
        } else {
            self.decode_steps += 1;
            self.decode_tokens += tokens as u64;
            self.decode_time += took;
        }
    }

    /// What was counted after `earlier` (an earlier reading of the same engine's).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            prefill_steps: self.prefill_steps.saturating_sub(earlier.prefill_steps),
            prefill_tokens: self.prefill_tokens.saturating_sub(earlier.prefill_tokens),
            prefill_time: self.prefill_time.saturating_sub(earlier.prefill_time),
            decode_steps: self.decode_steps.saturating_sub(earlier.decode_steps),
            decode_tokens: self.decode_tokens.saturating_sub(earlier.decode_tokens),
            decode_time: self.decode_time.saturating_sub(earlier.decode_time),
            compile_time: self.compile_time.saturating_sub(earlier.compile_time),
        }
    }

    /// Prompt tokens per second over the prefill steps (`None` before the first).
    pub fn prefill_tokens_per_s(&self) -> Option<f64> {
        rate(self.prefill_tokens, self.prefill_time)
    }

    /// Tokens per second over the decode steps (`None` before the first).
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        rate(self.decode_tokens, self.decode_time)
    }
}

fn rate(tokens: u64, time: std::time::Duration) -> Option<f64> {
    (tokens > 0 && !time.is_zero()).then(|| tokens as f64 / time.as_secs_f64())
}

fn mean(total: std::time::Duration, n: u64) -> std::time::Duration {
    total.checked_div(n.max(1) as u32).unwrap_or_default()
}

/// Speculation settings that cannot work, refused before any weights are uploaded: a
/// draft model without `speculative`, impossible n-gram sizes.
fn check_speculation(config: &EngineConfig) -> Result<()> {
    if config.draft_model.is_some() && config.speculative.is_none() {
        return Err(EngineError::Config(
            "a draft model proposes for speculative decoding: set `speculative` too".into(),
        ));
    }
    if let Some(spec) = config.speculative {
        NgramIndex::new(spec.ngram_min, spec.ngram_max)
            .map_err(|e| EngineError::Config(format!("speculative decoding: {e}")))?;
    }
    Ok(())
}

/// The context the engine serves: `config.max_model_len`, checked against the model's, or
/// the model's default; the other sizes are checked to be positive.
fn context_length(c: &crate::model::ModelConfig, config: &EngineConfig) -> Result<usize> {
    if config.block_size == 0 || config.max_num_seqs == 0 || config.max_num_batched_tokens == 0 {
        return Err(EngineError::Config(
            "block size, max_num_seqs and max_num_batched_tokens must be positive".into(),
        ));
    }
    Ok(match config.max_model_len {
        Some(n) if n < 2 => {
            return Err(EngineError::Config(format!(
                "max_model_len {n} leaves no room for a prompt and a generated token; it \
                     must be at least 2"
            )))
        }
        Some(n) if n > c.max_model_len() => {
            return Err(EngineError::Config(format!(
                "max_model_len {n} exceeds the model's context of {} tokens",
                c.max_model_len()
            )))
        }
        Some(n) => n,
        None => c.default_context(),
    })
}

/// The context to serve: `context`, or where neither it nor the pool's size was given, the
/// longest one sequence of which fits the pool the device's `memory` gives once the
/// weights are on it (`runner::plan::fit_context`).
fn fitted_context(
    files: &crate::model::ModelFiles,
    config: &EngineConfig,
    context: usize,
    memory: Option<crate::gpu::DeviceMemory>,
    fallback: u64,
) -> Result<usize> {
    let f = config.kv_memory_fraction;
    if !(f > 0.0 && f <= 1.0) {
        return Err(EngineError::Config(format!(
            "kv_memory_fraction {f} must be above 0 and at most 1"
        )));
    }
    if config.max_model_len.is_some()
        || config.num_gpu_blocks.is_some()
        || config.kv_cache_bytes.is_some()
    {
        return Ok(context);
    }
    let weights = crate::model::gpu::GpuModel::estimate_bytes(files, context, config.weight_dtype)?;
    let fit = crate::runner::fit::PoolFit {
        memory,
        fraction: f,
        max_blocks: usize::MAX,
        fallback,
    };
    let (bytes, _) = fit.pool_bytes(weights, None);
    Ok(crate::runner::plan::fit_context(
        &files.config,
        config,
        context,
        bytes,
    )?)
}

/// The prefix cache's lower tiers `config` asks for.
struct Tiers {
    /// The disk tier, if any.
    disk: Option<Disk>,
    /// Host blocks the host tier may hold.
    host_blocks: usize,
}

/// The tiers `config` asks for: the disk tier, if any, and the host tier's blocks (by
/// default none without a disk tier, half the host pool with one).
fn tiers(
    model: &ModelSource,
    c: &crate::model::ModelConfig,
    max_model_len: usize,
    config: &EngineConfig,
    pool: &KvPool,
    plan: &PoolPlan,
) -> Result<Tiers> {
    if cfg!(not(feature = "native")) && config.kv_cache_dir.is_some() {
        return Err(EngineError::Config(
            "the disk tier of the prefix cache (kv_cache_dir) keeps files, which this build \
             (without the `native` feature) does not"
                .into(),
        ));
    }
    if config.kv_cache_dir.is_some() && config.kv_cache_store.is_some() {
        return Err(EngineError::Config(
            "the disk tier of the prefix cache goes in a folder (kv_cache_dir) or in a record \
             store (kv_cache_store), not both"
                .into(),
        ));
    }
    let dir = match (&config.kv_cache_dir, &config.kv_cache_store) {
        (Some(dir), _) => Some(dir.clone()),
        (None, Some(_)) => Some(std::path::PathBuf::new()),
        (None, None) => None,
    };
    let disk = match dir {
        Some(dir) => {
            let pool = (&pool.layout, pool.rotation());
            let disk = Disk::open(model, &dir, c, max_model_len, config, pool);
            Some(disk.map_err(EngineError::Config)?)
        }
        None => None,
    };
    let host_blocks = match config.host_tier_blocks {
        Some(n) => n,
        None if disk.is_some() => plan.cpu_blocks / 2,
        None => 0,
    };
    if disk.is_some() && (host_blocks == 0 || !config.enable_prefix_caching) {
        return Err(EngineError::Config(
            "the disk tier of the prefix cache needs prefix caching and a host tier of at \
             least one block (host blocks: --num-cpu-blocks, --kv-cache-host-blocks)"
                .into(),
        ));
    }
    Ok(Tiers { disk, host_blocks })
}

/// The scheduler and its block manager over the pools of `plan`, keeping a watermark of
/// 1% of the device pool (less where the pool barely holds one sequence).
fn scheduler(
    config: &EngineConfig,
    plan: &PoolPlan,
    tiers: &Tiers,
) -> Result<Scheduler<SeqOutput, RequestSide>> {
    let watermark = watermark(plan.gpu_blocks, plan.needed);
    let cache_cfg = CacheConfig::new(config.block_size, plan.gpu_blocks, plan.cpu_blocks)
        .with_watermark_blocks(watermark)
        .with_prefix_caching(config.enable_prefix_caching)
        .with_host_tier(tiers.host_blocks)
        .with_tier_write_through(tiers.disk.is_some());
    let blocks = BlockManager::new(cache_cfg)?.with_groups(plan.kv_groups.clone());
    let mut scheduler = Scheduler::new(config.clone(), blocks);
    scheduler.costs = PreemptionCosts::new(plan.layout.block_bytes_all_layers());
    Ok(scheduler)
}

/// The step pacer `config.max_step_ms` asks for; a budget that is not a positive number
/// of milliseconds is refused.
fn pacer(config: &EngineConfig) -> Result<Option<super::StepPacer>> {
    match config.max_step_ms {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(super::StepPacer::new(
            ms,
            config.max_num_batched_tokens,
        ))),
        Some(ms) => Err(EngineError::Config(format!(
            "max_step_ms {ms} is not a positive number of milliseconds"
        ))),
    }
}

/// The watermark of a device pool of `blocks`: 1% of it, less where the pool barely holds
/// the `needed` blocks of one sequence.
pub(super) fn watermark(blocks: usize, needed: usize) -> usize {
    (blocks / 100).min(blocks.saturating_sub(needed))
}

/// The draft model `config` names, if any, with a pool within the bytes of the target's.
fn open_draft(
    ctx: &Arc<GpuContext>,
    c: &crate::model::ModelConfig,
    config: &EngineConfig,
    max_model_len: usize,
    plan: &PoolPlan,
) -> Result<Option<super::draft::DraftModel>> {
    let Some(dir) = &config.draft_model else {
        return Ok(None);
    };
    let pool_bytes = plan.gpu_blocks as u64 * plan.layout.block_bytes_all_layers();
    let draft =
        super::draft::DraftModel::open(ctx.clone(), dir, c, config, max_model_len, pool_bytes)?;
    Ok(Some(draft))
}

impl Engine {
    /// Opens the model folder on the adapter chosen by the environment.
    pub fn new(model: impl Into<ModelSource>, config: EngineConfig) -> Result<Self> {
        let ctx = Arc::new(GpuContext::from_env()?);
        Self::with_context(ctx, model, config, |_, _| {})
    }

    /// Opens the model folder on an existing context (for instance an application's own
    /// device, see [`GpuContext::from_existing`]). `progress(done, total)` reports the
    /// weight upload in bytes.
    pub fn with_context(
        ctx: Arc<GpuContext>,
        model: impl Into<ModelSource>,
        config: EngineConfig,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        Self::open(ctx, model.into(), config, None, progress)
    }

    /// [`Self::with_context`], with what gives a new device when the device is lost
    /// ([`Self::on_device_lost`]). A device lost while the weights upload is replaced (by
    /// `on_lost`, or re-created when pagellm opened it) and the load starts again, up to
    /// [`MAX_CONSECUTIVE_LOSSES`](super::recovery::MAX_CONSECUTIVE_LOSSES) times.
    pub(crate) fn open(
        mut ctx: Arc<GpuContext>,
        model: ModelSource,
        config: EngineConfig,
        mut on_lost: Option<DeviceLostFn>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let inject = super::recovery::injection(&config)?;
        let mut inject_load = inject.load;
        let mut losses = 0;
        loop {
            let mut report = |done, total| progress(done, total);
            let mut destroy = super::recovery::destroy_halfway(&ctx, inject_load);
            let upload = |done, total| {
                destroy(done, total);
                report(done, total);
            };
            let opened = Self::build(ctx.clone(), &model, &config, inject.clone(), upload);
            let e = match opened {
                Ok(mut engine) => {
                    engine.recovery.set_handler(on_lost);
                    return Ok(engine);
                }
                Err(e) => e,
            };
            let Some(reason) = super::recovery::lost_reason(&ctx, &e) else {
                return Err(e);
            };
            losses += 1;
            inject_load = false;
            if losses >= super::recovery::MAX_CONSECUTIVE_LOSSES {
                return Err(e);
            }
            tracing::warn!("the GPU device was lost while loading ({reason}); loading again");
            ctx = super::recovery::new_device(on_lost.as_mut(), &ctx, &reason)?;
        }
    }

    fn build(
        ctx: Arc<GpuContext>,
        model: &ModelSource,
        config: &EngineConfig,
        inject: DeviceLossInjection,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let config = config.clone();
        let (files, tokenizer) = open_model(model)?;
        let c = files.config.clone();
        if config.profile {
            ctx.enable_profiling();
        }
        check_speculation(&config)?;
        let pacer = pacer(&config)?;
        let (memory, fallback) = (ctx.memory(), fallback_pool_bytes(&ctx.limits));
        let context = context_length(&c, &config)?;
        let max_model_len = fitted_context(&files, &config, context, memory, fallback)?;
        let mut plan = PoolPlan::for_engine(&c, &config, max_model_len, memory, fallback)?;
        let (rows, tokens) = (config.max_sampled_rows(), config.max_num_batched_tokens);
        let mut spec = plan.runner_spec(&config, max_model_len, tokens, rows);
        let runner = ModelRunner::load(ctx.clone(), &files, &spec, progress)?;
        // The device may have given a smaller pool than planned, and a pool fitted to free
        // memory is settled only now (`runner/fit.rs`); a reload asks for the same.
        plan.gpu_blocks = runner.pool().num_blocks;
        spec.gpu_blocks = plan.gpu_blocks;
        spec.fit = None;
        let tiers = tiers(model, &c, max_model_len, &config, runner.pool(), &plan)?;
        let draft = open_draft(&ctx, &c, &config, max_model_len, &plan)?;
        let rebuild = RebuildSpec {
            model: model.clone(),
            spec,
            draft_pool_bytes: plan.gpu_blocks as u64 * plan.layout.block_bytes_all_layers(),
            target: c.clone(),
            max_model_len,
        };
        let tokenizer = Arc::new(tokenizer);
        let intake = Intake::new(tokenizer.clone(), c.vocab_size, max_model_len, &config);
        let mut engine = Engine {
            scheduler: scheduler(&config, &plan, &tiers)?,
            runner,
            intake: Arc::new(intake),
            tokenizer,
            config,
            ctx,
            next_request: 0,
            idle_steps: 0,
            abandoned: 0,
            swap_latency_s: 0.0,
            host: HostTime::default(),
            throughput: StepThroughput::default(),
            in_flight: false,
            deferred_adds: Vec::new(),
            deferred_aborts: Vec::new(),
            step_alive: std::sync::Weak::new(),
            step_costs: StepCostFit::default(),
            spec_rate: AcceptanceRate::starting_at(0.5, ENGINE_RATE_DECAY),
            disk: tiers.disk,
            draft,
            recovery: Recovery::new(rebuild, inject, None),
            pool_needed: plan.needed,
            pacer,
        };
        engine.calibrate_swap()?;
        Ok(engine)
    }

    /// Measures the swap path before the first swap: round trips of 1 and of `k` (still
    /// empty) blocks, best of three each. The difference is the cost per block, which is
    /// what a swap adds to the step it rides in; the rest is the fixed cost of a submit of
    /// its own, which swap-only steps subtract before they update the bandwidth.
    /// Not in a browser, which cannot wait for the round trips: the static rule serves
    /// there until a real swap is timed.
    fn calibrate_swap(&mut self) -> Result<()> {
        if cfg!(target_arch = "wasm32") {
            return Ok(());
        }
        let k = self
            .runner
            .host_pool()
            .num_blocks
            .min(self.runner.pool().num_blocks)
            .min(32) as u32;
        if k < 2 {
            return Ok(());
        }
        // On a busy machine one measurement can come out inverted; a few more usually
        // settle it.
        let mut measured = None;
        for _ in 0..4 {
            let one = self.time_round_trip(1)?;
            let many = self.time_round_trip(k)?;
            let per_block = (many - one) / f64::from(k - 1);
            if per_block > 0.0 {
                measured = Some((one, per_block));
                break;
            }
        }
        let Some((one, per_block)) = measured else {
            return Ok(()); // too noisy to tell; the static rule serves until a real swap
        };
        self.swap_latency_s = ((one - per_block) / 2.0).max(0.0);
        let bytes = 2 * self.scheduler.costs.block_bytes;
        self.scheduler.costs.record_swap(bytes, per_block);
        Ok(())
    }

    /// Seconds a swap-out then swap-in of blocks `0..n` takes, best of three.
    fn time_round_trip(&mut self, n: u32) -> Result<f64> {
        let out = BlockOps {
            swap_out: (0..n).map(|i| (DeviceBlockId(i), HostBlockId(i))).collect(),
            ..BlockOps::default()
        };
        let back = BlockOps {
            swap_in: (0..n).map(|i| (HostBlockId(i), DeviceBlockId(i))).collect(),
            ..BlockOps::default()
        };
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            self.runner.execute(&out)?;
            self.runner.execute(&back)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// The context length: prompt and output of a sequence together.
    pub fn max_model_len(&self) -> usize {
        self.intake.max_model_len()
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The GPU context the engine runs on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The configuration the engine was opened with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request after checking it; its events arrive on the returned handle.
    pub fn add_request(
        &mut self,
        prompt: Prompt,
        params: crate::sampling::SamplingParams,
    ) -> Result<RequestHandle> {
        self.add(Request::new(prompt).with_params(params))
    }

    /// Queues `request` after checking it; its events arrive on the returned handle. While
    /// a step is in flight (between [`Self::begin_step`] and [`Self::end_step`]) the request
    /// joins the queues when the step ends; an error it meets then arrives as its `Failed`
    /// event.
    pub fn add(&mut self, request: Request) -> Result<RequestHandle> {
        let prepared = self.intake.prepare(request)?;
        let id = self.next_request;
        let (tx, rx) = flume::unbounded();
        if self.in_flight {
            self.next_request += 1;
            self.deferred_adds.push((id, prepared, tx));
        } else {
            self.enqueue(id, prepared, tx)?;
        }
        Ok(RequestHandle { id, events: rx })
    }

    /// What checks and prepares requests for this engine; it may be used on any thread.
    pub fn intake(&self) -> &Arc<Intake> {
        &self.intake
    }

    /// Queues a request `intake` prepared, as request `id` (not pending already), with its
    /// events going to `events`.
    pub(crate) fn enqueue(
        &mut self,
        id: RequestId,
        prepared: Prepared,
        events: flume::Sender<RequestEvent>,
    ) -> Result<()> {
        if self.scheduler.contains(id) {
            return Err(EngineError::InvalidRequest(format!(
                "request {id} is already pending"
            )));
        }
        self.next_request = self.next_request.max(id + 1);
        let Prepared {
            ids,
            params,
            beam,
            shape,
            constraint,
            keys,
        } = prepared;
        let mut out = SeqOutput::new(&ids, &params, 0, constraint);
        if beam.is_none() {
            out.spec = self.spec_state()?;
        }
        let first = Sequence::new(self.scheduler.new_seq_id(), 0, &ids, out);
        let max_len = ids.len().saturating_add(params.max_tokens);
        let side = RequestSide {
            params,
            prompt_ids: ids,
            beam,
            events,
        };
        let group = SequenceGroup::new(id, shape, max_len, first, side).with_keys(keys);
        self.scheduler.add(group);
        Ok(())
    }

    /// A new (non-beam) request's speculation state, when speculation is on. A measured row
    /// cost starts its acceptance rate from the engine's recent one; a fixed one (tests,
    /// forced speculation) from one half, as each request did before.
    fn spec_state(&self) -> Result<Option<SpecState>> {
        let Some(spec) = self.config.speculative else {
            return Ok(None);
        };
        Ok(Some(SpecState {
            index: NgramIndex::new(spec.ngram_min, spec.ngram_max)
                .map_err(|e| EngineError::Config(e.to_string()))?,
            k: AdaptiveK::starting_at(
                spec.num_tokens,
                spec.row_cost.unwrap_or(crate::config::DEFAULT_ROW_COST),
                match spec.row_cost {
                    None => self.spec_rate.rate(),
                    Some(_) => 0.5,
                },
            ),
        }))
    }

    /// Aborts a request at any point, freeing everything it holds. Returns false for an
    /// unknown or already finished request.
    pub fn abort(&mut self, id: RequestId) -> bool {
        if self.in_flight {
            // The step in flight computes its rows; the abort happens at its end.
            let pending =
                self.scheduler.contains(id) || self.deferred_adds.iter().any(|a| a.0 == id);
            if pending {
                self.deferred_aborts.push(id);
            }
            return pending;
        }
        let Some(mut g) = self.scheduler.remove(id) else {
            return false;
        };
        for s in g.seqs.iter_mut().filter(|s| !s.is_finished()) {
            s.finish = Some(FinishReason::Abort);
        }
        let outputs = g.seqs.iter().map(completion).collect();
        g.send(RequestEvent::Finished(g.output(id, outputs)));
        true
    }

    /// Aborts every pending request (each gets its `Finished` event with finish reason
    /// `Abort`); returns how many there were.
    pub fn abort_all(&mut self) -> usize {
        let ids: Vec<RequestId> = self.scheduler.groups().map(|g| g.request_id).collect();
        for &id in &ids {
            self.abort(id);
        }
        ids.len()
    }

    /// Whether any request is pending (waiting, running or swapped, or added during the
    /// step in flight).
    pub fn has_unfinished(&self) -> bool {
        !self.scheduler.is_empty() || !self.deferred_adds.is_empty()
    }

    /// The statistics as they are now (this walks every block table).
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            cache: self.scheduler.cache_stats(),
            scheduler: self.scheduler.stats,
            pending_requests: self.scheduler.num_groups(),
            num_waiting: self.scheduler.num_waiting(),
            num_running: self.scheduler.num_running(),
            num_swapped: self.scheduler.num_swapped(),
            abandoned_requests: self.abandoned,
            costs: self.scheduler.costs,
            kv_layout: self.runner.pool().layout,
            kv_rotation: self.runner.pool().rotation(),
            kv_blocks: self.runner.pool().num_blocks,
            kv_pool_bytes: self.runner.pool().total_bytes(),
            weights: self.runner.weight_bytes(),
            kv_groups: self.scheduler.kv_groups().windows().to_vec(),
            draft: self.draft.as_ref().map(|d| d.stats),
            host: self.host,
            disk: self.disk.as_ref().map(Disk::stats),
            device: self.recovery.stats,
            pacing: self.pacer.as_ref().map(super::StepPacer::stats),
            throughput: self.throughput,
        }
    }
}

#[cfg(test)]
mod throughput_tests {
    use super::StepThroughput;
    use std::time::Duration;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn steps_count_by_kind_less_their_compile_time() {
        let mut t = StepThroughput::default();
        assert_eq!(t.prefill_tokens_per_s(), None);
        assert_eq!(t.decode_tokens_per_s(), None);
        // A 128-token prefill of 300 ms wall, 100 of them compiling: 200 ms, 640 tokens/s.
        t.record(true, 128, ms(300), ms(100));
        // Four decode steps of 16 rows, 20 ms each, one of which compiled for 5 ms.
        for compiling in [5, 0, 0, 0] {
            t.record(false, 16, ms(20), ms(compiling));
        }
        assert_eq!((t.prefill_steps, t.prefill_tokens), (1, 128));
        assert_eq!(t.prefill_time, ms(200));
        assert_eq!((t.decode_steps, t.decode_tokens), (4, 64));
        assert_eq!(t.decode_time, ms(75));
        assert_eq!(t.compile_time, ms(105));
        assert!((t.prefill_tokens_per_s().unwrap() - 640.0).abs() < 1e-9);
        assert!((t.decode_tokens_per_s().unwrap() - 64.0 / 0.075).abs() < 1e-6);
        // Compile time beyond the step's own wall time (it cannot be) counts the step as 0.
        let mut odd = StepThroughput::default();
        odd.record(false, 1, ms(3), ms(10));
        assert_eq!((odd.decode_time, odd.compile_time), (ms(0), ms(3)));
        assert_eq!(odd.decode_tokens_per_s(), None);
    }

    #[test]
    fn since_leaves_out_an_earlier_reading() {
        let mut t = StepThroughput::default();
        t.record(true, 10, ms(50), ms(40));
        t.record(false, 2, ms(8), ms(0));
        let warm = t;
        t.record(true, 128, ms(100), ms(0));
        t.record(false, 1, ms(4), ms(0));
        t.record(false, 1, ms(6), ms(0));
        let d = t.since(&warm);
        assert_eq!(
            (d.prefill_steps, d.prefill_tokens, d.prefill_time),
            (1, 128, ms(100))
        );
        assert_eq!(
            (d.decode_steps, d.decode_tokens, d.decode_time),
            (2, 2, ms(10))
        );
        assert_eq!(d.compile_time, ms(0));
        assert_eq!(t.since(&t), StepThroughput::default());
    }
}
