//! Beam search on the CPU, following Hugging Face transformers' `generate(num_beams=...)`.
//!
//! One step: every live beam is expanded by every token (`cum_logprob + logprob[token]`), and
//! all (beam, token) candidates are ranked together by cumulative log-probability. Walking
//! down that ranking:
//!
//! - a candidate ending in an end token (EOS unless `ignore_eos`, or a stop token id) becomes
//!   a finished hypothesis, but only if it ranks within the top `beam_width` (transformers
//!   discards lower-ranked finished candidates: they lost to `beam_width` others);
//! - any other candidate becomes a live beam, until there are `beam_width` of them.
//!
//! Finished hypotheses are scored `cum_logprob / length^length_penalty`, where `length`
//! counts the generated tokens including the end token and excluding the prompt. That is
//! transformers' current definition (`cur_len + 1 - prompt_len`); with it the score does not
//! depend on prompt length, so it ranks continuations of one prompt fairly. (vLLM's own beam
//! search counts the prompt and leaves out the EOS instead.) Beams cut off at `max_tokens`
//! are scored with their full generated length. Only the best `beam_width` finished
//! hypotheses are kept.
//!
//! Each new live beam reports its parent's index, so the engine can fork the parent's block
//! table (sharing the KV prefix copy-on-write) and free parents no child continues.
//!
//! Stopping: the search is done when no beam is live, when the beams reached `max_tokens`, or
//! when `beam_width` hypotheses are finished and no live beam can still beat the worst of
//! them. The last condition uses an exact bound (transformers' `early_stopping="never"`
//! behaviour): log-probabilities are at most 0, so a live beam's cumulative log-probability
//! can only fall, and its best possible score is `cum / L^length_penalty` at the most
//! favourable final length `L` between the next step and `max_tokens`.

use super::logprobs::top_k_indices;
use super::{SamplingError, SamplingParams};
use std::cmp::Ordering;

/// What beam search needs from a request.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamSearchConfig {
    pub beam_width: usize,
    pub length_penalty: f64,
    pub max_tokens: usize,
    /// Tokens that finish a hypothesis: EOS ids (unless `ignore_eos`) and `stop_token_ids`.
    pub end_token_ids: Vec<u32>,
}

impl BeamSearchConfig {
    /// The beam search settings of a validated request; `None` if it does not use beams.
    pub fn from_params(params: &SamplingParams, eos_token_ids: &[u32]) -> Option<Self> {
        let beam_width = params.beam_width?;
        let mut end_token_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            end_token_ids.extend(
                eos_token_ids
                    .iter()
                    .filter(|id| !params.stop_token_ids.contains(id)),
            );
        }
        Some(Self {
            beam_width,
            length_penalty: f64::from(params.length_penalty),
            max_tokens: params.max_tokens,
            end_token_ids,
        })
    }

    fn is_end(&self, token: u32) -> bool {
        self.end_token_ids.contains(&token)
    }
}

/// A live hypothesis: the tokens generated so far (prompt excluded) and their summed
/// log-probability.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Beam {
    pub tokens: Vec<u32>,
    pub cum_logprob: f64,
}

/// A new live beam: `live[parent]` extended by `token`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BeamChild {
    pub parent: usize,
    pub token: u32,
    pub cum_logprob: f64,
}

/// A completed hypothesis (ended by an end token, or cut at `max_tokens`).
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedBeam {
    /// Generated tokens, including the end token if it ended with one.
    pub tokens: Vec<u32>,
    pub cum_logprob: f64,
    /// `cum_logprob / tokens.len()^length_penalty`.
    pub score: f64,
}

/// Result of one [`beam_step`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeamStep {
    /// The next live beams, best first (at most `beam_width`).
    pub children: Vec<BeamChild>,
    /// Hypotheses finished at this step, best first.
    pub finished: Vec<FinishedBeam>,
}

/// Score of a hypothesis of `length` generated tokens.
pub fn beam_score(cum_logprob: f64, length: usize, length_penalty: f64) -> f64 {
    cum_logprob / libm::pow(length.max(1) as f64, length_penalty)
}

/// Ranks all expansions of `live` by `rows` (`rows[i]`: log-probabilities `[vocab]` of the
/// next token after `live[i]`) and picks the next beams and newly finished hypotheses.
/// Equal cumulative log-probabilities rank by parent index, then token id.
pub fn beam_step<R: AsRef<[f64]>>(
    config: &BeamSearchConfig,
    live: &[Beam],
    rows: &[R],
) -> Result<BeamStep, SamplingError> {
    if rows.len() != live.len() {
        return Err(SamplingError::BeamRowCount {
            beams: live.len(),
            rows: rows.len(),
        });
    }
    let width = config.beam_width;
    // A token ranked below `width + #end tokens` within its own row has at least `width`
    // better non-end siblings, so it can neither become live nor finish within the top
    // `width`: only that many per row need ranking.
    let per_row = width + config.end_token_ids.len();
    let expected = rows.first().map_or(0, |r| r.as_ref().len());

    let mut candidates = Vec::new();
    for (parent, (beam, row)) in live.iter().zip(rows).enumerate() {
        let row = row.as_ref();
        if row.len() != expected {
            return Err(SamplingError::BeamRowLength {
                row: parent,
                len: row.len(),
                expected,
            });
        }
        if let Some(index) = row.iter().position(|x| x.is_nan() || *x == f64::INFINITY) {
            return Err(SamplingError::NonFiniteLogit {
                index,
                value: row[index],
            });
        }
        for token in top_k_indices(row.len(), per_row, |i| row[i]) {
            if row[token] == f64::NEG_INFINITY {
                break; // sorted: the rest are impossible too
            }
            candidates.push(BeamChild {
                parent,
                token: token as u32,
                cum_logprob: beam.cum_logprob + row[token],
            });
        }
    }
    candidates.sort_by(|a, b| {
        b.cum_logprob
            .partial_cmp(&a.cum_logprob)
            .unwrap_or(Ordering::Equal)
            .then(a.parent.cmp(&b.parent))
            .then(a.token.cmp(&b.token))
    });

    let mut step = BeamStep::default();
    for (rank, cand) in candidates.into_iter().enumerate() {
        if step.children.len() == width {
            break;
        }
        if config.is_end(cand.token) {
            if rank < width {
                let mut tokens = live[cand.parent].tokens.clone();
                tokens.push(cand.token);
                step.finished.push(FinishedBeam {
                    score: beam_score(cand.cum_logprob, tokens.len(), config.length_penalty),
                    tokens,
                    cum_logprob: cand.cum_logprob,
                });
            }
        } else {
            step.children.push(cand);
        }
    }
    Ok(step)
}

/// A whole beam search for one request: live beams, the best finished hypotheses so far, and
/// the stopping rule.
#[derive(Clone, Debug)]
pub struct BeamSearch {
    config: BeamSearchConfig,
    live: Vec<Beam>,
    /// Best first, at most `beam_width`.
    finished: Vec<FinishedBeam>,
}

impl BeamSearch {
    /// Starts with one empty live beam (the prompt).
    pub fn new(config: BeamSearchConfig) -> Self {
        Self {
            config,
            live: vec![Beam::default()],
            finished: Vec::new(),
        }
    }

    pub fn config(&self) -> &BeamSearchConfig {
        &self.config
    }

    /// Live beams, in the order of the last step's children (index = position in the next
    /// step's `rows`).
    pub fn live(&self) -> &[Beam] {
        &self.live
    }

    /// Finished hypotheses kept so far, best first.
    pub fn finished(&self) -> &[FinishedBeam] {
        &self.finished
    }

    /// Advances every live beam by one token. Returns the new beams' parents and tokens, in
    /// the order of the new `live()`; parents that appear in none of them can be freed.
    pub fn step<R: AsRef<[f64]>>(&mut self, rows: &[R]) -> Result<Vec<BeamChild>, SamplingError> {
        let step = beam_step(&self.config, &self.live, rows)?;
        self.live = step
            .children
            .iter()
            .map(|c| {
                let mut tokens = self.live[c.parent].tokens.clone();
                tokens.push(c.token);
                Beam {
                    tokens,
                    cum_logprob: c.cum_logprob,
                }
            })
            .collect();
        self.add_finished(step.finished);
        Ok(step.children)
    }

    /// Whether further steps cannot change the result (see the module docs).
    pub fn is_done(&self) -> bool {
        let Some(first) = self.live.first() else {
            return true;
        };
        if first.tokens.len() >= self.config.max_tokens {
            return true;
        }
        if self.finished.len() < self.config.beam_width {
            return false;
        }
        let worst = self.finished.last().map_or(f64::NEG_INFINITY, |f| f.score);
        let best_possible = self
            .live
            .iter()
            .map(|b| self.best_possible_score(b))
            .fold(f64::NEG_INFINITY, f64::max);
        worst >= best_possible
    }

    /// Upper bound on any score a continuation of `beam` can reach. The score
    /// `c / L^lp` is monotone in `L` for fixed `c`, so the bound is at one end of the range
    /// of final lengths.
    fn best_possible_score(&self, beam: &Beam) -> f64 {
        let lp = self.config.length_penalty;
        let shortest = beam.tokens.len() + 1;
        let longest = self.config.max_tokens.max(shortest);
        beam_score(beam.cum_logprob, shortest, lp).max(beam_score(beam.cum_logprob, longest, lp))
    }

    /// Ends the search: live beams count as finished at their current length, and the best
    /// `beam_width` hypotheses come back, best first (ties: earlier finished first).
    pub fn finish(mut self) -> Vec<FinishedBeam> {
        let lp = self.config.length_penalty;
        let cut: Vec<FinishedBeam> = std::mem::take(&mut self.live)
            .into_iter()
            .filter(|b| !b.tokens.is_empty())
            .map(|b| FinishedBeam {
                score: beam_score(b.cum_logprob, b.tokens.len(), lp),
                tokens: b.tokens,
                cum_logprob: b.cum_logprob,
            })
            .collect();
        self.add_finished(cut);
        self.finished
    }

    fn add_finished(&mut self, new: Vec<FinishedBeam>) {
        self.finished.extend(new);
        // Stable: on equal scores the hypothesis that finished first stays ahead.
        self.finished
            .sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap_or(Ordering::Equal));
        self.finished.truncate(self.config.beam_width);
    }
}
