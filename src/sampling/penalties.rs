//! Penalties on tokens already seen, applied to a logits row before temperature and the
//! filters, as vLLM applies them (and as the OpenAI API defines the first two):
//!
//! - `repetition_penalty` (Keskar et al. 2019, CTRL; transformers'
//!   `RepetitionPenaltyLogitsProcessor`): every token that occurs in the prompt or the
//!   output has its logit divided by the penalty when positive, multiplied when negative.
//! - `frequency_penalty`: the logit drops by the penalty times the token's count in the
//!   output.
//! - `presence_penalty`: the logit drops by the penalty once if the token occurs in the
//!   output at all.
//!
//! Log-probabilities reported to the client stay those of the raw logits.

use super::SamplingParams;
use std::collections::HashMap;

/// Applies `params`' penalties to `logits` (`[vocab]`) given the sequence's prompt and
/// output so far. Tokens outside the row are ignored.
pub fn apply_penalties(
    logits: &mut [f32],
    params: &SamplingParams,
    prompt: &[u32],
    output: &[u32],
) {
    if !params.has_penalties() {
        return;
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in output {
        *counts.entry(t).or_default() += 1;
    }
    if params.repetition_penalty != 1.0 {
        let rp = params.repetition_penalty;
        let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for t in seen {
            if let Some(l) = logits.get_mut(t as usize) {
                // A penalty far from 1 may take a finite logit past f32's range; it then
                // saturates at the largest finite value, which ranks the token as the
                // infinite result would, so every penalty validation accepts is computable.
                let penalized = if *l > 0.0 { *l / rp } else { *l * rp };
                *l = penalized.clamp(f32::MIN, f32::MAX);
            }
        }
    }
    for (&t, &c) in &counts {
        if let Some(l) = logits.get_mut(t as usize) {
            let penalized = *l - (params.frequency_penalty * c as f32 + params.presence_penalty);
            *l = penalized.clamp(f32::MIN, f32::MAX);
        }
    }
}
