//! How many tokens to propose: per request, from what its proposals have earned so far.
//!
//! If each proposal is accepted with probability `a` (given the ones before it were), a step
//! with `k` proposals emits `1 + a + a^2 + ... + a^k` tokens on average, and costs
//! `1 + c * k` one-row steps, where `c` is what an extra query row costs on this adapter
//! relative to a whole one-row step (a few hundredths on a GPU, where a step reads the
//! weights once whatever the rows; close to one on a CPU adapter, where each row pays its
//! own arithmetic). [`AdaptiveK`] proposes the `k` that maximizes tokens per cost, and none
//! when no `k` beats plain decoding by a margin, so a workload that does not repeat itself
//! is not slowed down. The acceptance rate is a decaying count of accepted and rejected
//! proposals; while speculation is off, one proposal every so many steps keeps measuring it.

/// Per-request choice of the number of proposals.
#[derive(Clone, Debug)]
pub struct AdaptiveK {
    max_k: usize,
    row_cost: f64,
    /// Decayed counts of accepted proposals and of rejections.
    accepted: f64,
    rejected: f64,
    /// Steps since the last proposal while switched off.
    idle: usize,
}

/// Weight kept by the counts at each record: a memory of about 20 steps.
const DECAY: f64 = 0.95;
/// Speculation must promise this much more throughput than plain decoding.
const MARGIN: f64 = 1.05;
/// While off, one step in this many proposes a single token to re-measure.
const PROBE_EVERY: usize = 16;

impl AdaptiveK {
    /// At most `max_k` proposals; `row_cost` as in the module docs (clamped to 0..=1). The
    /// counts start at one acceptance and one rejection (a rate of one half), which lets a
    /// cheap adapter start speculating and a costly one start measuring.
    pub fn new(max_k: usize, row_cost: f64) -> Self {
        AdaptiveK {
            max_k,
            row_cost: if row_cost.is_finite() {
                row_cost.clamp(0.0, 1.0)
            } else {
                1.0
            },
            accepted: 1.0,
            rejected: 1.0,
            idle: 0,
        }
    }

    /// The running estimate of the per-proposal acceptance probability.
    pub fn rate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Expected tokens per cost of one-row steps, for `k` proposals at acceptance `a`.
    pub fn gain(a: f64, k: usize, row_cost: f64) -> f64 {
        let tokens: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
        tokens / (1.0 + row_cost * k as f64)
    }

    /// The best `k` for the current estimate, or 0 when none pays.
    pub fn best(&self) -> usize {
        let a = self.rate();
        let (k, gain) = (1..=self.max_k)
            .map(|k| (k, Self::gain(a, k, self.row_cost)))
            .fold((0, 1.0), |best, c| if c.1 > best.1 { c } else { best });
        if gain >= MARGIN {
            k
        } else {
            0
        }
    }

    /// Proposals to make this step: [`AdaptiveK::best`], or a one-token probe now and then
    /// while that is 0.
    pub fn next_k(&mut self) -> usize {
        let k = self.best();
        if k > 0 || self.max_k == 0 {
            self.idle = 0;
            return k;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY {
            self.idle = 0;
            1
        } else {
            0
        }
    }

    /// Records a verified step: `accepted` of `proposed` proposals were kept (the first
    /// rejection ends a step, so at most one rejection per step). A step without proposals
    /// (nothing matched) records nothing.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let accepted = accepted.min(proposed);
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.rejected = self.rejected * DECAY + f64::from(u8::from(accepted < proposed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gain_is_tokens_per_cost() {
        // a = 0.5, k = 2: 1 + 0.5 + 0.25 tokens for 1 + 2c.
        assert!((AdaptiveK::gain(0.5, 2, 0.1) - 1.75 / 1.2).abs() < 1e-12);
        assert_eq!(AdaptiveK::gain(0.9, 0, 0.5), 1.0);
        // Every proposal accepted on a free row: k + 1 tokens.
        assert_eq!(AdaptiveK::gain(1.0, 4, 0.0), 5.0);
    }

    #[test]
    fn cheap_rows_and_good_acceptance_speculate_fully() {
        let mut k = AdaptiveK::new(5, 0.02);
        for _ in 0..50 {
            k.record(5, 5);
        }
        assert!(k.rate() > 0.95);
        assert_eq!(k.next_k(), 5);
    }

    #[test]
    fn costly_rows_never_pay_and_rejections_switch_off() {
        // A CPU adapter's row costs nearly a whole step: 90% acceptance gives
        // 1.9 / 1.9 = 1.0 at k = 1 and less beyond, under the margin...
        let mut k = AdaptiveK::new(10, 0.9);
        for _ in 0..100 {
            k.record(10, 9);
        }
        assert!((k.rate() - 0.9).abs() < 0.01, "{}", k.rate());
        assert_eq!(k.best(), 0);
        // ...while every proposal accepted still pays a little at k = 10: 11 / 10.
        for _ in 0..200 {
            k.record(10, 10);
        }
        assert_eq!(k.best(), 10);
        // On a GPU, a run of rejections turns speculation off...
        let mut k = AdaptiveK::new(4, 0.05);
        assert!(k.best() > 0, "a fresh estimate of 1/2 pays on cheap rows");
        for _ in 0..60 {
            k.record(4, 0);
        }
        assert!(k.rate() < 0.05);
        assert_eq!(k.best(), 0);
        // ...and one probe per PROBE_EVERY steps measures again; accepted probes turn it
        // back on.
        let ks: Vec<usize> = (0..2 * PROBE_EVERY).map(|_| k.next_k()).collect();
        assert_eq!(ks.iter().filter(|&&n| n == 1).count(), 2, "{ks:?}");
        assert!(ks.iter().all(|&n| n <= 1));
        for _ in 0..40 {
            k.record(1, 1);
        }
        assert!(k.next_k() > 1);
    }

    #[test]
    fn steps_without_proposals_and_odd_settings() {
        let mut k = AdaptiveK::new(3, 0.1);
        let before = k.rate();
        k.record(0, 0);
        assert_eq!(k.rate(), before);
        assert_eq!(AdaptiveK::new(0, 0.0).next_k(), 0);
        // A NaN cost counts as the worst case.
        assert_eq!(AdaptiveK::new(4, f64::NAN).best(), 0);
    }
}
