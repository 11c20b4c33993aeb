//! Log-probabilities of raw logits.
//!
//! Reported log-probabilities are `log_softmax` of the model's raw logits, before temperature
//! or any top-k/top-p/min-p filtering: that is what transformers' `output_scores`-based
//! references and the test fixtures contain, and it does not depend on sampling settings. All
//! arithmetic is in f64 so that a 128k-entry sum loses nothing measurable.
//!
//! Ordering of alternatives: descending log-probability, equal values by ascending id, so
//! results are deterministic.

use super::SamplingError;
use std::cmp::Ordering;

/// Rejects NaN and +inf (-inf is a legitimate mask value).
pub(crate) fn check_row(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    match logits
        .iter()
        .position(|x| x.is_nan() || *x == f32::INFINITY)
    {
        Some(index) => Err(SamplingError::NonFiniteLogit {
            index,
            value: f64::from(logits[index]),
        }),
        None => Ok(()),
    }
}

/// `log(sum(exp(logits)))`, computed stably in f64.
pub fn logsumexp(logits: &[f32]) -> Result<f64, SamplingError> {
    check_row(logits)?;
    let max = logits
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return Err(SamplingError::NoCandidates);
    }
    let sum: f64 = logits.iter().map(|&x| libm::exp(f64::from(x) - max)).sum();
    Ok(max + libm::log(sum))
}

/// `log_softmax` of a whole row (masked `-inf` entries stay `-inf`).
pub fn log_softmax(logits: &[f32]) -> Result<Vec<f64>, SamplingError> {
    let lse = logsumexp(logits)?;
    Ok(logits.iter().map(|&x| f64::from(x) - lse).collect())
}

/// The `k` most likely tokens of a raw logits row with their log-probabilities; masked
/// (`-inf`) tokens are never among them, so a row with fewer than `k` candidates gives
/// fewer.
pub fn top_logprobs(logits: &[f32], k: usize) -> Result<Vec<(u32, f64)>, SamplingError> {
    let lse = logsumexp(logits)?;
    Ok(top_k_indices(logits.len(), k, |i| f64::from(logits[i]))
        .into_iter()
        .filter(|&i| logits[i] > f32::NEG_INFINITY)
        .map(|i| (i as u32, f64::from(logits[i]) - lse))
        .collect())
}

/// Indices of the `k` largest values of `value(0..len)`, largest first, ties by ascending
/// index. Linear selection, then a sort of only the `k` winners.
pub(crate) fn top_k_indices(len: usize, k: usize, value: impl Fn(usize) -> f64) -> Vec<usize> {
    let k = k.min(len);
    if k == 0 {
        return Vec::new();
    }
    let order = |a: &usize, b: &usize| -> Ordering {
        value(*b)
            .partial_cmp(&value(*a))
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(b))
    };
    let mut idx: Vec<usize> = (0..len).collect();
    if k < len {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx
}
