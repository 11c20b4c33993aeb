//! The distribution a token is drawn from: temperature, then top-k, then top-p, then min-p,
//! the order of Hugging Face's logits warpers.
//!
//! - Temperature divides the logits before the softmax.
//! - Top-k keeps every token whose logit is at least the k-th largest (so ties at the
//!   boundary survive, as with the threshold comparison of transformers and vLLM). It is
//!   decided on the raw logits, whose order temperature does not change, so that no
//!   temperature, however large, turns the top k into a tie.
//! - Top-p (nucleus) sorts the survivors by probability and keeps the shortest prefix whose
//!   renormalised mass reaches `top_p`; the most likely token always stays.
//! - Min-p drops tokens whose probability is below `min_p` times the largest one.
//!
//! Both probability thresholds carry a relative tolerance of [`TOLERANCE`]: a cut that lies
//! exactly on a boundary on paper (probabilities 0.5 + 0.3 against top_p 0.8) must not move by
//! one token because f32 logits and the softmax rounded 0.8 to 0.7999999. Logits arrive in
//! f32, whose rounding alone moves probabilities by a few parts in 10^7, so a boundary closer
//! than that is not meaningful anyway. The filters are invariant under renormalisation, so
//! they work on unnormalised weights `exp(logit/T - max)` in f64.

use super::logprobs::check_row;
use super::SamplingError;
use rand::Rng;
use std::cmp::Ordering;

/// Relative slack on the top-p and min-p thresholds (see the module docs).
const TOLERANCE: f64 = 1e-6;

/// Tokens that survived filtering, in ascending id order, with renormalised probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    entries: Vec<(u32, f64)>,
}

impl Distribution {
    /// `(token id, probability)` pairs, ascending id, probabilities summing to 1.
    pub fn entries(&self) -> &[(u32, f64)] {
        &self.entries
    }

    /// Ids of the surviving tokens, ascending.
    pub fn ids(&self) -> Vec<u32> {
        self.entries.iter().map(|&(id, _)| id).collect()
    }

    /// Probability of `id` (0 if it was filtered out).
    pub fn prob(&self, id: u32) -> f64 {
        self.entries
            .binary_search_by_key(&id, |&(i, _)| i)
            .map_or(0.0, |pos| self.entries[pos].1)
    }

    /// A distribution proportional to `weights` (any order; ids must be distinct), without
    /// the entries of weight zero or less; `None` when no weight is positive.
    pub fn from_weights(mut weights: Vec<(u32, f64)>) -> Option<Distribution> {
        weights.retain(|&(_, w)| w > 0.0);
        let total: f64 = weights.iter().map(|&(_, w)| w).sum();
        if weights.is_empty() || !total.is_finite() {
            return None;
        }
        weights.sort_unstable_by_key(|&(id, _)| id);
        for entry in &mut weights {
            entry.1 /= total;
        }
        Some(Distribution { entries: weights })
    }

    /// Draws a token: one uniform number, then a walk over the entries in id order. Walking
    /// in id order means the same kept set and seed give the same token whichever filters
    /// produced the set.
    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        let u: f64 = rng.random();
        let mut cum = 0.0;
        for &(id, p) in &self.entries {
            cum += p;
            if u < cum {
                return id;
            }
        }
        // Rounding left the total a hair below 1 and `u` fell in that gap: the last entry.
        self.entries.last().map_or(0, |&(id, _)| id)
    }
}

/// Applies temperature, top-k, top-p and min-p to a raw logits row. `temperature` must be
/// positive (greedy decoding does not come here); `top_k` of `None`/`0` or at least the row
/// length is off, `top_p = 1` and `min_p = 0` are off.
pub fn filtered_distribution(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
    min_p: f32,
) -> Result<Distribution, SamplingError> {
    check_row(logits)?;
    let temperature = f64::from(temperature);
    let max = logits
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return Err(SamplingError::NoCandidates);
    }
    // (id, weight) with weight = exp((logit - max) / T): the softmax numerator, at most 1.
    let mut kept: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, &x)| x != f32::NEG_INFINITY)
        .map(|(i, &x)| (i as u32, libm::exp((f64::from(x) - max) / temperature)))
        .collect();

    // Top-k on the raw logits: dividing by a positive temperature keeps their order, but a
    // huge one (1e30) rounds every weight to 1, which would make the whole row a tie.
    if let Some(k) = top_k.filter(|&k| k > 0 && k < kept.len()) {
        let raw = |id: u32| logits[id as usize];
        let mut order: Vec<f32> = kept.iter().map(|&(id, _)| raw(id)).collect();
        let (_, kth, _) =
            order.select_nth_unstable_by(k - 1, |a, b| b.partial_cmp(a).unwrap_or(Ordering::Equal));
        let threshold = *kth;
        kept.retain(|&(id, _)| raw(id) >= threshold);
    }

    if top_p < 1.0 {
        kept = nucleus(kept, f64::from(top_p));
    }

    if min_p > 0.0 {
        let top = kept.iter().map(|&(_, w)| w).fold(0.0, f64::max);
        let threshold = f64::from(min_p) * top * (1.0 - TOLERANCE);
        kept.retain(|&(_, w)| w >= threshold);
    }

    let total: f64 = kept.iter().map(|&(_, w)| w).sum();
    if kept.is_empty() || total <= 0.0 {
        // Every surviving weight underflowed; cannot happen while the arg-max (weight 1)
        // survives every filter, but guard rather than divide by zero.
        return Err(SamplingError::NoCandidates);
    }
    for entry in &mut kept {
        entry.1 /= total;
    }
    Ok(Distribution { entries: kept })
}

/// Keeps the most likely entries until their share of the total reaches `top_p`; returns
/// them in ascending id order.
///
/// A full sort of a 128k vocabulary per sequence per step would dominate the CPU side of a
/// step, while the nucleus is usually a few dozen tokens. So the `m` largest are selected in
/// linear time and only those sorted, with `m` growing until the nucleus fits.
fn nucleus(mut entries: Vec<(u32, f64)>, top_p: f64) -> Vec<(u32, f64)> {
    if entries.is_empty() {
        return entries;
    }
    let total: f64 = entries.iter().map(|&(_, w)| w).sum();
    let target = top_p * total * (1.0 - TOLERANCE);
    // Descending weight, ties by ascending id: a total order, so the cut is deterministic.
    let order = |a: &(u32, f64), b: &(u32, f64)| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(Ordering::Equal)
            .then(a.0.cmp(&b.0))
    };
    let mut m = entries.len().min(64);
    loop {
        if m < entries.len() {
            entries.select_nth_unstable_by(m - 1, order);
        }
        entries[..m].sort_unstable_by(order);
        let mut cum = 0.0;
        let reached = entries[..m].iter().position(|&(_, w)| {
            cum += w;
            cum >= target
        });
        // Rounding may leave the target just out of reach of the whole set: keep everything.
        if let Some(last) = reached.or((m == entries.len()).then_some(m - 1)) {
            entries.truncate(last + 1);
            break;
        }
        m = (m * 4).min(entries.len());
    }
    entries.sort_unstable_by_key(|&(id, _)| id);
    entries
}

#[cfg(test)]
mod tests {
    use super::nucleus;

    #[test]
    fn nucleus_breaks_ties_by_id_and_handles_empty_input() {
        assert!(nucleus(Vec::new(), 0.5).is_empty());
        // Four equal weights, top_p 0.5: the two lowest ids form the nucleus.
        let kept = nucleus(vec![(3, 1.0), (1, 1.0), (0, 1.0), (2, 1.0)], 0.5);
        assert_eq!(kept, [(0, 1.0), (1, 1.0)]);
    }

    #[test]
    fn nucleus_grows_its_selection_past_the_first_batch() {
        // 1000 equal weights, top_p 0.9: 900 tokens, found after widening from 64.
        let entries: Vec<(u32, f64)> = (0..1000).rev().map(|i| (i, 1.0)).collect();
        let kept = nucleus(entries, 0.9);
        assert_eq!(kept.len(), 900);
        assert_eq!(kept.last(), Some(&(899, 1.0)));
    }
}
