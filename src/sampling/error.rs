//! Errors of the sampling module: rejected request parameters (each naming the parameter, the
//! value and what is allowed) and logits a sampler cannot use.

/// Everything that can go wrong in sampling.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A parameter outside its allowed range.
    #[error("invalid {param} = {value}: {allowed}")]
    Invalid {
        param: &'static str,
        value: String,
        allowed: String,
    },

    /// A parameter that beam search cannot honour.
    #[error("beam search (beam_width = {beam_width}) does not allow {param} = {value}: {allowed}")]
    BeamSearchConflict {
        beam_width: usize,
        param: &'static str,
        value: String,
        allowed: String,
    },

    /// A logits row with no entries.
    #[error("cannot sample from an empty logits row")]
    EmptyLogits,

    /// NaN or +inf in a logits (or logprob) row: the model produced garbage, and any token
    /// chosen from it would be arbitrary.
    #[error("logit {index} is {value}: the row must hold finite values or -inf")]
    NonFiniteLogit { index: usize, value: f64 },

    /// Every entry is -inf, so no token has any probability.
    #[error("every logit is -inf: no token can be chosen")]
    NoCandidates,

    /// A beam search step got a different number of rows than there are live beams.
    #[error("beam search step got {rows} logprob rows for {beams} live beams")]
    BeamRowCount { beams: usize, rows: usize },

    /// Beam search rows of different lengths.
    #[error("beam search logprob row {row} has {len} entries, row 0 has {expected}")]
    BeamRowLength {
        row: usize,
        len: usize,
        expected: usize,
    },
}
