//! A frame-time budget for engine steps: on a GPU shared with an application's window, one
//! step holds the queue for as long as its work runs, so a long prefill chunk makes a frame
//! late. With `max_step_ms` set, the engine measures how long steps of each size take and
//! caps the tokens of the next step at what fits the budget. The cap cuts prefill chunks,
//! not streams: the scheduler always gives every decoding sequence its token and a prompt
//! at least `MIN_PACED_PREFILL` tokens, so every request still progresses where even the
//! decodes overrun the budget. Kernels compute a row the same whatever
//! batch it is in, so the budget changes how work is cut, never what it produces.
//!
//! Step time is the engine's wall time from the step's start to its results (so it covers
//! the GPU's work and the read-back; a profiled context's timestamps are not needed), fitted
//! against tokens by a decayed least-squares line (`spec::StepCostFit`, which speculative
//! decoding also uses). Until the line has tokens that varied enough, the cap starts small
//! and doubles after each step within the budget, and any step over the budget cuts it to
//! the share of its tokens that would have fitted.

use crate::spec::StepCostFit;

/// Tokens the first step under a budget may hold, before any step has been timed.
pub const START_TOKENS: usize = 16;

/// What pacing did, for statistics and the chat window's panel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PacingStats {
    /// The budget of one step, in milliseconds.
    pub budget_ms: f64,
    /// Tokens the next step may hold.
    pub token_limit: usize,
    /// Steps timed, and of those over the budget.
    pub steps: u64,
    pub over_budget: u64,
    /// The latest step's time, in milliseconds.
    pub last_ms: f64,
}

/// The step-size cap under a time budget (see the module docs).
#[derive(Clone, Debug)]
pub struct StepPacer {
    budget_s: f64,
    max_tokens: usize,
    limit: usize,
    fit: StepCostFit,
    stats: PacingStats,
}

impl StepPacer {
    /// A pacer holding steps to `budget_ms` milliseconds and at most `max_tokens` tokens.
    pub fn new(budget_ms: f64, max_tokens: usize) -> Self {
        let limit = START_TOKENS.min(max_tokens).max(1);
        StepPacer {
            budget_s: budget_ms / 1e3,
            max_tokens: max_tokens.max(1),
            limit,
            fit: StepCostFit::default(),
            stats: PacingStats {
                budget_ms,
                token_limit: limit,
                ..PacingStats::default()
            },
        }
    }

    /// Tokens the next step may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn stats(&self) -> PacingStats {
        self.stats
    }

    /// Records a step of `tokens` tokens that took `seconds` and sets the next cap.
    pub fn record(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 || !seconds.is_finite() {
            return;
        }
        self.fit.record(tokens, seconds);
        let over = seconds > self.budget_s;
        self.stats.steps += 1;
        self.stats.over_budget += u64::from(over);
        self.stats.last_ms = seconds * 1e3;
        let mut limit = match self.fit.fit() {
            Some((fixed, per_token)) if per_token > 0.0 => {
                // (A hair over, so that a step the line puts exactly at the budget fits.)
                ((self.budget_s - fixed) / per_token + 1e-6)
                    .floor()
                    .max(1.0) as usize
            }
            // No line yet: grow while steps that used the cap stay within the budget.
            _ if !over && tokens >= self.limit => self.limit.saturating_mul(2),
            _ => self.limit,
        };
        if over {
            // What this step shows fits, whatever the line says.
            let share = (tokens as f64 * self.budget_s / seconds).floor() as usize;
            limit = limit.min(share.max(1));
        }
        self.limit = limit.clamp(1, self.max_tokens);
        self.stats.token_limit = self.limit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of `t` tokens takes 2 ms plus 0.25 ms a token.
    fn cost(t: usize) -> f64 {
        0.002 + 0.00025 * t as f64
    }

    #[test]
    fn the_cap_grows_to_what_fits_the_budget_and_no_further() {
        // 10 ms fits 32 tokens.
        let mut p = StepPacer::new(10.0, 512);
        assert_eq!(p.limit(), START_TOKENS);
        for _ in 0..40 {
            let t = p.limit();
            p.record(t, cost(t));
            assert!(p.limit() <= 512);
        }
        // Decodes of 1 to 4 tokens between the chunks give the line its slope.
        for i in 0..40 {
            p.record(1 + i % 4, cost(1 + i % 4));
            let t = p.limit();
            p.record(t, cost(t));
        }
        assert_eq!(p.limit(), 32, "{:?}", p.stats());
        assert!(cost(p.limit()) <= 0.010);
    }

    #[test]
    fn a_step_over_the_budget_cuts_the_cap_at_once() {
        let mut p = StepPacer::new(8.0, 512);
        p.record(16, 0.032); // four times the budget
        assert_eq!(p.limit(), 4);
        assert_eq!(p.stats().over_budget, 1);
        // Nothing fits: one token a step, never zero.
        p.record(4, 0.5);
        assert_eq!(p.limit(), 1);
        p.record(1, 0.5);
        assert_eq!(p.limit(), 1);
    }

    #[test]
    fn the_cap_stays_within_the_step_token_budget() {
        let mut p = StepPacer::new(1000.0, 24);
        for _ in 0..10 {
            let t = p.limit();
            p.record(t, 0.001);
        }
        assert_eq!(p.limit(), 24);
    }
}
