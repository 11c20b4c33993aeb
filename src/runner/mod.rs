//! The model runner: a model on the GPU with everything its steps run on (the device KV
//! pool and the host pool swaps go to, the workspace, the step metadata and read-back
//! buffers), built in one place for the engine, the draft model and the scorer. It decides
//! nothing: the scheduler plans a step, the runner executes the plan (block operations,
//! then a forward pass over a flat batch, in one submit) and hands back what sampling needs
//! (nano-vllm's `model_runner.run()`).
//!
//! A step is submitted, then finished: [`ModelRunner::submit`] records and submits the
//! plan and asks for its read-backs without waiting; the [`PendingStep`] is ready once the
//! device has run it ([`ModelRunner::is_ready`] polls); [`ModelRunner::finish`] lands the
//! swapped-out blocks in host memory and returns the read-backs. Natively a driver thread
//! may wait in between ([`ModelRunner::wait`]); in a browser the event loop makes the step
//! ready. Pool sizing for every user of a runner is in [`plan`].

pub mod fit;
pub mod plan;

use crate::cache::BlockOps;
use crate::cache_engine::{CacheEngine, HostPool, InFlightSwapOut};
use crate::error::{GpuError, Result as GpuResult};
use crate::gpu::{Batch, GpuContext, InFlightRead, Readback};
use crate::kernels::logits::argmax_logprobs;
use crate::kernels::paged_attention::AttentionBuffers;
use crate::kernels::{Formats, KernelPlan, WeightDtype};
use crate::mapped::ModelSource;
use crate::model::forward::Workspace;
use crate::model::gpu::GpuModel;
use crate::model::step::{record_step, FlatBatch};
use crate::model::{ModelConfig, ModelError, ModelFiles};
use crate::pool::{KvLayout, KvPool, KvRotation};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::sync::Arc;

/// Why a runner could not be built or run a step.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The model's files.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The GPU.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// The tokenizer's file.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Pools that cannot work for this model and configuration: why.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The model or its KV cache does not fit the device's memory: what it needs, and the
    /// options that would make it fit.
    #[error("the model does not fit the GPU: {0}")]
    DoesNotFit(String),
}

/// The runner's results.
pub type Result<T, E = RunnerError> = std::result::Result<T, E>;

/// A model's checkpoint and tokenizer (from the model's folder or GGUF file, on disk or in
/// memory), checked against each other.
pub fn open_model(model: &ModelSource) -> Result<(ModelFiles, Tokenizer)> {
    let files = ModelFiles::open(model.clone())?;
    let tokenizer = crate::model::open_tokenizer(model.clone())?;
    if tokenizer.vocab_size() > files.config.vocab_size {
        return Err(ModelError::VocabMismatch {
            tokenizer: tokenizer.vocab_size(),
            model: files.config.vocab_size,
        }
        .into());
    }
    Ok((files, tokenizer))
}

/// What a runner is built with.
#[derive(Clone, Debug, PartialEq)]
pub struct RunnerSpec {
    /// Positions the model computes (the length of its rope tables).
    pub max_model_len: usize,
    /// The weights' format on the GPU; `None` keeps what is on disk.
    pub weight_dtype: Option<WeightDtype>,
    /// One block of the device pool.
    pub layout: KvLayout,
    /// Blocks of the device pool and of the host pool.
    pub gpu_blocks: usize,
    pub cpu_blocks: usize,
    /// Where the device refuses a pool of `gpu_blocks` as out of memory, try halving it
    /// down to this many blocks (`None`: the pool has exactly `gpu_blocks` or none).
    pub min_gpu_blocks: Option<usize>,
    /// Where set, `gpu_blocks` is only the plan's guess: the pool is sized from the memory
    /// the device has once the weights are on it ([`fit::PoolFit`]).
    pub fit: Option<fit::PoolFit>,
    /// How keys and values are rotated before they are stored.
    pub rotation: KvRotation,
    /// Per model layer, its (KV cache group, slab) in a block; `None`: one group, a slab
    /// per layer.
    pub layer_slots: Option<Vec<(usize, usize)>>,
    /// Most tokens one step computes, and most rows it samples.
    pub max_tokens: usize,
    pub max_rows: usize,
}

/// What one step runs: block operations first, then (unless the step only moves blocks) a
/// forward pass, and what to read back.
pub struct StepPlan<'a> {
    /// Copy-on-write copies and swaps, in the cache engine's order.
    pub ops: &'a BlockOps,
    /// The forward pass over the step's flat batch.
    pub forward: Option<FlatBatch<'a>>,
    /// Read back each sampled row's arg-max and its logprob (needs `forward.argmax`).
    pub read_argmax: bool,
    /// Read back each sampled row's logits.
    pub read_logits: bool,
    /// The command buffer's label.
    pub label: &'static str,
}

/// A submitted step: its read-backs and swapped-out blocks, landing as the device runs it.
#[must_use = "finish the step (or drop it to abandon its read-backs)"]
#[derive(Debug)]
pub struct PendingStep {
    swap: InFlightSwapOut,
    argmax: Option<InFlightRead>,
    logits: Option<InFlightRead>,
    rows: usize,
    /// Bind groups recording the step created (none cached for its bindings).
    pub bind_groups_created: usize,
}

/// What a finished step read back: per sampled row its arg-max and that token's logprob,
/// and the logits rows when they were asked for.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub argmax: Vec<u32>,
    pub argmax_logprob: Vec<f32>,
    pub logits: Vec<f32>,
    pub vocab: usize,
}

impl StepOutput {
    /// The logits of sampled row `row`, when they were read back.
    pub fn logits(&self, row: usize) -> Option<&[f32]> {
        self.logits.get(row * self.vocab..(row + 1) * self.vocab)
    }
}

/// A model and what its steps run on (see the module docs).
pub struct ModelRunner {
    ctx: Arc<GpuContext>,
    model: GpuModel,
    cache: CacheEngine,
    ws: Workspace,
    /// Kept across steps and rewritten in place: the step metadata and the read-backs.
    meta: Option<AttentionBuffers>,
    argmax: Readback,
    logits: Readback,
}

impl Drop for ModelRunner {
    /// The context's cached bind groups hold the runner's buffers (the KV pool, weights,
    /// workspace); dropping them frees those at once rather than a few submits later.
    fn drop(&mut self) {
        self.ctx.release_bind_groups();
    }
}

impl ModelRunner {
    /// Uploads the model in `files` and allocates its pools and workspace as `spec` says;
    /// `progress(done, total)` reports the weight upload in bytes.
    pub fn load(
        ctx: Arc<GpuContext>,
        files: &ModelFiles,
        spec: &RunnerSpec,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let mut progress = progress;
        let mut weights = 0;
        let model = GpuModel::upload_as(
            &ctx,
            files,
            spec.max_model_len,
            spec.weight_dtype,
            |done, total| {
                weights = total;
                progress(done, total);
            },
        )
        .map_err(|e| fit::weights_refused(e, weights, spec))?;
        let formats = Formats {
            weights: model.weight_formats(),
            kv: spec.layout.dtype,
        };
        let plan = KernelPlan::for_model(&ctx, &model.config.dims(), &formats)?;
        let ws = Workspace::with_plan(&ctx, &model.config, plan, spec.max_tokens, spec.max_rows)
            .map_err(|e| fit::workspace_refused(e, spec))?;
        // The pool last, so that a pool sized from free memory sees what the rest took.
        let spec = &fit::settle(&ctx, spec, model.weight_bytes().total);
        let mut pool = fit::allocate_pool(&ctx, spec)?.with_rotation(spec.rotation);
        if let Some(slots) = &spec.layer_slots {
            pool = pool.with_layer_slots(slots.clone())?;
        }
        Ok(ModelRunner {
            cache: CacheEngine::new(pool, spec.cpu_blocks),
            ctx,
            model,
            ws,
            meta: None,
            argmax: Readback::default(),
            logits: Readback::default(),
        })
    }

    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The model's configuration, as it computes (its context included).
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// The device KV pool.
    /// What the model's weights take on the GPU.
    pub fn weight_bytes(&self) -> crate::model::gpu::WeightBytes {
        self.model.weight_bytes()
    }

    pub fn pool(&self) -> &KvPool {
        &self.cache.device
    }

    /// The host pool: swapped-out blocks and the prefix cache's host tier.
    pub fn host_pool(&self) -> &HostPool {
        &self.cache.host
    }

    pub(crate) fn host_pool_mut(&mut self) -> &mut HostPool {
        &mut self.cache.host
    }

    /// Gives the device pool `num_blocks` blocks, keeping the content of the first ones
    /// (see [`KvPool::resized`]); the old pool's memory goes back to the device. Nothing
    /// changes on an error (an allocation the device refused).
    pub fn resize_pool(&mut self, num_blocks: usize) -> GpuResult<()> {
        let new = self.cache.device.resized(&self.ctx, num_blocks)?;
        // Cached bind groups hold the old pool's buffers alive.
        self.ctx.release_bind_groups();
        self.cache.device = new;
        Ok(())
    }

    /// Host blocks a swap-out was to fill and that have not arrived: after a lost device,
    /// what the host pool lacks.
    pub fn unlanded_host_blocks(&self) -> Vec<crate::cache::HostBlockId> {
        let ids = self.cache.unlanded().iter();
        ids.map(|&h| crate::cache::HostBlockId(h)).collect()
    }

    /// Takes over the host pool of `old`, a runner of the same model and layout whose
    /// device was lost (host memory survives it); `old` keeps this one's empty pool.
    pub fn adopt_host_pool(&mut self, old: &mut ModelRunner) -> Result<()> {
        let (mine, theirs) = (&self.cache.host, &old.cache.host);
        if mine.layout != theirs.layout || mine.num_blocks != theirs.num_blocks {
            return Err(RunnerError::Config(format!(
                "the rebuilt host pool ({} blocks of {:?}) differs from the lost one's ({} of \
                 {:?})",
                mine.num_blocks, mine.layout, theirs.num_blocks, theirs.layout
            )));
        }
        self.cache.adopt_host_pool(&mut old.cache);
        Ok(())
    }

    /// Records `plan` into one command buffer and submits it; its read-backs are asked
    /// for at once and land as the device runs it.
    pub fn submit(&mut self, plan: &StepPlan) -> GpuResult<PendingStep> {
        let mut batch = Batch::new(&self.ctx, plan.label);
        let swap = self.cache.encode(&mut batch, plan.ops)?;
        let (mut argmax, mut logits, mut rows) = (None, None, 0);
        if let Some(step) = &plan.forward {
            record_step(
                &mut batch,
                &self.model,
                &self.cache.device,
                &self.ws,
                &mut self.meta,
                step,
            )?;
            rows = step.rows.len();
            let vocab = self.model.config.vocab_size;
            if plan.read_argmax && rows > 0 {
                let bytes = (rows * 8) as u64;
                argmax = Some(
                    self.argmax
                        .read_later(&mut batch, &self.ws.argmax, 0, bytes)?,
                );
            }
            if plan.read_logits {
                let bytes = (rows * vocab * 4) as u64;
                logits = Some(
                    self.logits
                        .read_later(&mut batch, &self.ws.logits, 0, bytes)?,
                );
            }
        }
        let created = batch.bind_groups_created();
        batch.submit()?;
        Ok(PendingStep {
            swap: swap.begin(),
            argmax: argmax.map(|r| r.begin()),
            logits: logits.map(|r| r.begin()),
            rows,
            bind_groups_created: created,
        })
    }

    /// Whether `pending` has run and its read-backs have landed (this polls the device).
    pub fn is_ready(&self, pending: &PendingStep) -> GpuResult<bool> {
        self.ctx.poll()?;
        Ok(pending.is_ready())
    }

    /// Waits for `pending` on this thread (native drivers; a browser never waits).
    pub fn wait(&self, pending: &PendingStep) -> GpuResult<()> {
        let reads = [
            pending.swap.read(),
            pending.argmax.as_ref(),
            pending.logits.as_ref(),
        ];
        for read in reads.into_iter().flatten() {
            self.ctx.wait_for(read)?;
        }
        // A device lost before the step's end fails the step, even where its reads landed:
        // what it computed is not trusted (and the loss is found now, not a step later).
        self.ctx.poll()
    }

    /// Lands a submitted step: swapped-out blocks go into the host pool, and the
    /// read-backs are returned. Waits first if the step is not ready.
    pub fn finish(&mut self, pending: PendingStep) -> GpuResult<StepOutput> {
        self.wait(&pending)?;
        let PendingStep {
            swap,
            argmax,
            logits,
            rows,
            ..
        } = pending;
        self.cache.land(swap)?;
        let (argmax, argmax_logprob) = match argmax {
            Some(r) => argmax_logprobs(&bytemuck::pod_collect_to_vec(&r.take()?), rows),
            None => (Vec::new(), Vec::new()),
        };
        let logits = match logits {
            Some(r) => bytemuck::pod_collect_to_vec(&r.take()?),
            None => Vec::new(),
        };
        Ok(StepOutput {
            argmax,
            argmax_logprob,
            logits,
            vocab: self.model.config.vocab_size,
        })
    }

    /// Submits `plan` and finishes it, waiting in between.
    pub fn run(&mut self, plan: &StepPlan) -> GpuResult<StepOutput> {
        let pending = self.submit(plan)?;
        self.finish(pending)
    }

    /// Runs block operations alone (a swap-only step, the swap path's calibration).
    pub fn execute(&mut self, ops: &BlockOps) -> GpuResult<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.run(&StepPlan {
            ops,
            forward: None,
            read_argmax: false,
            read_logits: false,
            label: "block ops",
        })
        .map(|_| ())
    }
}

impl PendingStep {
    /// Resolves once every read-back has landed (see [`InFlightRead::landed`]).
    pub async fn landed(&self) {
        for read in [self.swap.read(), self.argmax.as_ref(), self.logits.as_ref()]
            .into_iter()
            .flatten()
        {
            read.landed().await;
        }
    }

    /// Whether every read-back has landed (after the device was polled).
    pub fn is_ready(&self) -> bool {
        self.swap.is_ready()
            && self.argmax.as_ref().is_none_or(InFlightRead::is_ready)
            && self.logits.as_ref().is_none_or(InFlightRead::is_ready)
    }
}
