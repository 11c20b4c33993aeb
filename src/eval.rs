//! Teacher-forced scoring of a text: perplexity, and how far a KV cache setting moves the
//! next-token distributions from a baseline (KL divergence, top-1 agreement).
//!
//! The text is cut into windows of `context` tokens. Each window is prefilled in chunks of
//! `chunk` tokens through the same forward pass, paged KV pool and kernels as the engine, so
//! a later chunk attends to the keys and values an earlier one left in the (possibly
//! quantized, possibly rotated) cache; every token of a window but the first is scored
//! given the ones before it in the window. Scores are computed in f64 from the logits.
//!
//! Baseline log-probabilities can be saved (`LogprobFile`, f32 values) and compared with a
//! later run over the same tokens: mean and 99th-percentile KL(base || this), and how often
//! both put the same token first.

use crate::cache::BlockOps;
use crate::config::EngineConfig;
use crate::engine::EngineError;
use crate::gpu::GpuContext;
use crate::model::step::{FlatBatch, SeqSlice};
use crate::pool::KvPool;
use crate::runner::plan::PoolPlan;
use crate::runner::{open_model, ModelRunner, StepPlan};
use crate::tokenizer::Tokenizer;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Why a scoring run failed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Reading or writing a log-probability file: what was being done, and the error.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The text or the files do not fit the run: the reason.
    #[error("{0}")]
    Invalid(String),
}

impl EvalError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EvalError {
        let what = what.into();
        move |source| EvalError::Io { what, source }
    }
}

/// Scores windows of tokens with one model and one KV cache setting.
pub struct Scorer {
    /// The model with its pool (one window) and workspace.
    runner: ModelRunner,
    tokenizer: Tokenizer,
    context: usize,
    chunk: usize,
}

impl Scorer {
    /// Loads `model_dir` for windows of `context` tokens prefilled `chunk` at a time; the KV
    /// block size, dtype and rotation come from `config`.
    pub fn new(
        ctx: Arc<GpuContext>,
        model_dir: &Path,
        config: &EngineConfig,
        context: usize,
        chunk: usize,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self> {
        let (files, tokenizer) = open_model(&model_dir.into())?;
        let c = files.config.clone();
        if context < 2 || context > c.max_model_len() {
            return Err(EngineError::Config(format!(
                "a scoring window of {context} tokens: it must hold at least 2 and at most the \
                 model's context of {} tokens",
                c.max_model_len()
            )));
        }
        if chunk == 0 || config.block_size == 0 {
            return Err(EngineError::Config(
                "the prefill chunk and the block size must be positive".into(),
            ));
        }
        let chunk = chunk.min(context);
        let plan = PoolPlan::for_window(&c, config, context)?;
        let spec = plan.runner_spec(config, context, chunk, chunk);
        let runner = ModelRunner::load(ctx, &files, &spec, progress)?;
        Ok(Scorer {
            runner,
            tokenizer,
            context,
            chunk,
        })
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn context(&self) -> usize {
        self.context
    }

    /// The KV pool: after [`Self::score_window`] it holds the window's keys and values in
    /// blocks `ceil(len / block_size) - 1` down to 0 (the window's first block is the last).
    pub fn pool(&self) -> &KvPool {
        self.runner.pool()
    }

    pub fn vocab_size(&self) -> usize {
        self.runner.config().vocab_size
    }

    /// Runs one window (at most `context` tokens) and calls `f(position, logprobs)` for
    /// every position but the last: the log-softmax of the logits that predict token
    /// `position + 1`.
    pub fn score_window(&mut self, tokens: &[u32], mut f: impl FnMut(usize, &[f32])) -> Result<()> {
        if tokens.len() > self.context {
            return Err(EngineError::InvalidRequest(format!(
                "a window of {} tokens exceeds the scorer's {}",
                tokens.len(),
                self.context
            )));
        }
        let vocab = self.vocab_size();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        let bs = self.pool().layout.block_size;
        // Blocks in reverse order, so that the window is read through a real block table.
        let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32).rev().collect();
        let mut logprobs = vec![0f32; vocab];
        let ctx = self.runner.context().clone();
        for start in (0..tokens.len()).step_by(self.chunk) {
            let end = (start + self.chunk).min(tokens.len());
            let slice = SeqSlice {
                query_len: end - start,
                context_len: end,
                block_table: &table,
            };
            let rows: Vec<u32> = (0..(end - start) as u32).collect();
            if let Some(p) = ctx.profiler() {
                p.begin_step("score");
            }
            let read = self.runner.run(&StepPlan {
                ops: &BlockOps::default(),
                forward: Some(FlatBatch {
                    seqs: &[slice],
                    tokens: &tokens[start..end],
                    rows: &rows,
                    argmax: false,
                    group_tables: &[],
                }),
                read_argmax: false,
                read_logits: true,
                label: "score",
            })?;
            if let Some(p) = ctx.profiler() {
                p.end_step();
            }
            for (i, row) in read.logits.chunks(vocab).enumerate() {
                let pos = start + i;
                if pos + 1 >= tokens.len() {
                    break;
                }
                log_softmax_into(row, &mut logprobs);
                f(pos, &logprobs);
            }
        }
        Ok(())
    }
}

fn log_softmax_into(logits: &[f32], out: &mut [f32]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &v) in out.iter_mut().zip(logits) {
        *o = (v as f64 - lse) as f32;
    }
}

/// What one scoring run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub windows: usize,
    pub tokens_scored: usize,
    /// Mean negative log-likelihood of the scored tokens, in nats.
    pub mean_nll: f64,
    /// Against a saved baseline, when one was given.
    pub divergence: Option<Divergence>,
}

impl Report {
    pub fn perplexity(&self) -> f64 {
        self.mean_nll.exp()
    }
}

/// Distance of a run's next-token distributions from a baseline's, over the same tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Divergence {
    /// KL(base || this) per scored token, in nats: mean and 99th percentile.
    pub mean_kld: f64,
    pub p99_kld: f64,
    pub max_kld: f64,
    /// Fraction of scored tokens whose most likely next token is the same in both runs.
    pub top1_agreement: f64,
    /// The baseline's own perplexity over the same tokens.
    pub base_perplexity: f64,
}

const MAGIC: &[u8; 8] = b"PGLLOGP2";

/// A file of per-token log-probabilities over the whole vocabulary, with the tokens and
/// window size they were computed for, so a later run can check it scores the same. The
/// values are f32: stored as f16, their rounding alone would read as a KL divergence of
/// ~4e-5 nats, as large as an f16 cache's own.
pub struct LogprobFile;

impl LogprobFile {
    /// Opens a saved file and checks that it was saved for the same `header` (tokens,
    /// window size and vocabulary); the reader is left at the first row.
    fn open(p: &Path, header: &[u8]) -> Result<BufReader<std::fs::File>, EvalError> {
        let f =
            std::fs::File::open(p).map_err(EvalError::io(format!("opening {}", p.display())))?;
        let mut r = BufReader::new(f);
        let mut magic = [0u8; 8];
        if r.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(EvalError::Invalid(format!(
                "{} is not a pagellm log-probability file",
                p.display()
            )));
        }
        let mut got = vec![0u8; header.len() - MAGIC.len()];
        r.read_exact(&mut got).map_err(EvalError::io(format!(
            "{} ends inside its header",
            p.display()
        )))?;
        if got[..] != header[MAGIC.len()..] {
            return Err(EvalError::Invalid(format!(
                "{} was saved for other tokens, another window size or another vocabulary \
                 (the text, --context and the model must be the same as when it was saved)",
                p.display()
            )));
        }
        Ok(r)
    }

    /// Creates a file for rows of log-probabilities under `header`.
    fn create(p: &Path, header: &[u8]) -> Result<BufWriter<std::fs::File>, EvalError> {
        let what = format!("creating {}", p.display());
        let f = std::fs::File::create(p).map_err(EvalError::io(what.clone()))?;
        let mut w = BufWriter::new(f);
        w.write_all(header).map_err(EvalError::io(what))?;
        Ok(w)
    }

    fn header(vocab: usize, context: usize, tokens: &[u32]) -> Vec<u8> {
        let mut h = MAGIC.to_vec();
        for v in [vocab as u32, context as u32, tokens.len() as u32] {
            h.extend(v.to_le_bytes());
        }
        for t in tokens {
            h.extend(t.to_le_bytes());
        }
        h
    }
}

/// Scores `tokens` in windows of the scorer's context. With `save`, writes every scored
/// token's log-probabilities there; with `base`, reads a saved file's and measures the
/// divergence from it. `progress(windows done, windows)` is called after each window.
pub fn score(
    scorer: &mut Scorer,
    tokens: &[u32],
    save: Option<&Path>,
    base: Option<&Path>,
    mut progress: impl FnMut(usize, usize),
) -> Result<Report, EvalError> {
    let vocab = scorer.vocab_size();
    let context = scorer.context();
    let windows: Vec<&[u32]> = tokens.chunks(context).filter(|w| w.len() >= 2).collect();
    if windows.is_empty() {
        return Err(EvalError::Invalid(format!(
            "the text has {} tokens; scoring needs at least 2",
            tokens.len()
        )));
    }
    let header = LogprobFile::header(vocab, context, tokens);
    if let (Some(sp), Some(bp)) = (save, base) {
        let same =
            sp == bp || matches!((sp.canonicalize(), bp.canonicalize()), (Ok(a), Ok(b)) if a == b);
        if same {
            return Err(EvalError::Invalid(format!(
                "{} cannot be both the baseline read and the file saved",
                bp.display()
            )));
        }
    }
    // The baseline is checked before anything is written.
    let reader = base.map(|p| LogprobFile::open(p, &header)).transpose()?;
    let writer = save.map(|p| LogprobFile::create(p, &header)).transpose()?;
    let mut tally = Tally::new(vocab, reader, writer);
    for (wi, w) in windows.iter().enumerate() {
        scorer.score_window(w, |pos, lp| tally.add(lp, w[pos + 1] as usize))?;
        if let Some(e) = tally.io_error.take() {
            return Err(e);
        }
        progress(wi + 1, windows.len());
    }
    tally.finish(windows.len())
}

/// What a scoring run adds up, token by token.
struct Tally {
    nll: f64,
    scored: usize,
    base_nll: f64,
    agree: usize,
    klds: Vec<f64>,
    base_row: Vec<f32>,
    raw: Vec<u8>,
    reader: Option<BufReader<std::fs::File>>,
    writer: Option<BufWriter<std::fs::File>>,
    /// The first read or write that failed; scoring stops after the window.
    io_error: Option<EvalError>,
}

impl Tally {
    fn new(
        vocab: usize,
        reader: Option<BufReader<std::fs::File>>,
        writer: Option<BufWriter<std::fs::File>>,
    ) -> Self {
        Tally {
            nll: 0.0,
            scored: 0,
            base_nll: 0.0,
            agree: 0,
            klds: Vec::new(),
            base_row: vec![0f32; vocab],
            raw: vec![0u8; vocab * 4],
            reader,
            writer,
            io_error: None,
        }
    }

    /// Scores `next` under log-probabilities `lp`: saved, and compared with the baseline.
    fn add(&mut self, lp: &[f32], next: usize) {
        if self.io_error.is_some() {
            return;
        }
        self.nll -= lp[next] as f64;
        self.scored += 1;
        if let Some(out) = self.writer.as_mut() {
            let bytes: Vec<u8> = lp.iter().flat_map(|&v| v.to_le_bytes()).collect();
            if let Err(e) = out.write_all(&bytes) {
                self.io_error = Some(EvalError::io("writing the log-probabilities")(e));
            }
        }
        let Some(r) = self.reader.as_mut() else {
            return;
        };
        if let Err(e) = r.read_exact(&mut self.raw) {
            self.io_error = Some(EvalError::io("the baseline file ends early")(e));
            return;
        }
        for (b, c) in self.base_row.iter_mut().zip(self.raw.chunks_exact(4)) {
            *b = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        self.base_nll -= self.base_row[next] as f64;
        let kld: f64 = self
            .base_row
            .iter()
            .zip(lp)
            .map(|(&b, &q)| {
                let p = (b as f64).exp();
                if p > 0.0 {
                    p * (b as f64 - q as f64)
                } else {
                    0.0
                }
            })
            .sum();
        self.klds.push(kld.max(0.0));
        if crate::reference::argmax(&self.base_row) == crate::reference::argmax(lp) {
            self.agree += 1;
        }
    }

    fn finish(self, windows: usize) -> Result<Report, EvalError> {
        if let Some(mut w) = self.writer {
            w.flush()
                .map_err(EvalError::io("writing the log-probabilities"))?;
        }
        let klds = &self.klds;
        let divergence = self.reader.map(|_| {
            let n = klds.len().max(1) as f64;
            let mut sorted = klds.clone();
            sorted.sort_by(f64::total_cmp);
            let p99 =
                sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
            Divergence {
                mean_kld: klds.iter().sum::<f64>() / n,
                p99_kld: p99,
                max_kld: *sorted.last().unwrap_or(&0.0),
                top1_agreement: self.agree as f64 / n,
                base_perplexity: (self.base_nll / n).exp(),
            }
        });
        Ok(Report {
            windows,
            tokens_scored: self.scored,
            mean_nll: self.nll / self.scored as f64,
            divergence,
        })
    }
}
