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
    /// `cost[k]`: a step with `k` proposals in one-row steps (`cost[0] = 1`).
    cost: Vec<f64>,
    /// Steps between probes while off: doubles after each rejected probe, up to
    /// [`MAX_PROBE_EVERY`], and starts over when a probe is accepted.
    probe_every: usize,
    probing: bool,
    /// The request's own acceptance rate.
    rate: AcceptanceRate,
    /// Steps since the last proposal while switched off.
    idle: usize,
}

/// Weight kept by the counts at each record: a memory of about 20 steps.
const DECAY: f64 = 0.95;
/// Speculation must promise this much more throughput than plain decoding.
const MARGIN: f64 = 1.05;
/// While off, one step in this many proposes a single token to re-measure...
const PROBE_EVERY: usize = 16;
/// ...backing off to one in this many while probes keep failing (a probe's extra row is
/// not free: on lavapipe a two-row step costs about 1.5 one-row steps).
const MAX_PROBE_EVERY: usize = 256;
/// No probes where one proposal would not pay even at this acceptance rate.
const PROBE_RATE: f64 = 0.8;

impl AdaptiveK {
    /// At most `max_k` proposals; `row_cost` as in the module docs (clamped to 0..=1). The
    /// counts start at one acceptance and one rejection (a rate of one half), which lets a
    /// cheap adapter start speculating and a costly one start measuring.
    pub fn new(max_k: usize, row_cost: f64) -> Self {
        Self::starting_at(max_k, row_cost, 0.5)
    }

    /// [`AdaptiveK::new`] with the counts starting at `rate` (weighing two proposals, as
    /// one acceptance and one rejection do): the engine passes the rate its recent requests
    /// had, so in a workload that never repeats itself a new request starts switched off
    /// and probing rather than paying for a few rejected proposals first.
    pub fn starting_at(max_k: usize, row_cost: f64, rate: f64) -> Self {
        let mut k = AdaptiveK {
            max_k,
            cost: Vec::new(),
            probe_every: PROBE_EVERY,
            probing: false,
            rate: AcceptanceRate::starting_at(rate, DECAY),
            idle: 0,
        };
        k.set_row_cost(row_cost);
        k
    }

    /// The estimated acceptance rate of one proposal.
    pub fn rate(&self) -> f64 {
        self.rate.rate()
    }

    /// Expected tokens per cost of one-row steps, for `k` proposals at acceptance `a`.
    pub fn gain(a: f64, k: usize, row_cost: f64) -> f64 {
        let tokens: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
        tokens / (1.0 + row_cost * k as f64)
    }

    /// The best `k` for the current estimate, or 0 when none pays.
    pub fn best(&self) -> usize {
        self.best_at(self.rate())
    }

    /// The best `k` at acceptance rate `a`, or 0 when none pays.
    fn best_at(&self, a: f64) -> usize {
        let mut tokens = 1.0;
        let mut best = (0, 1.0);
        for k in 1..=self.max_k {
            tokens += a.powi(k as i32);
            let gain = tokens / self.cost[k];
            if gain > best.1 {
                best = (k, gain);
            }
        }
        if best.1 >= MARGIN {
            best.0
        } else {
            0
        }
    }

    /// Sets the cost of an extra row (clamped to 0..=1; a NaN counts as 1): a step with `k`
    /// proposals costs `1 + row_cost * k` one-row steps.
    pub fn set_row_cost(&mut self, row_cost: f64) {
        let c = if row_cost.is_finite() {
            row_cost.clamp(0.0, 1.0)
        } else {
            1.0
        };
        self.cost = (0..=self.max_k).map(|k| 1.0 + c * k as f64).collect();
    }

    /// Sets what a step with `k` proposals costs, in one-row steps, for each `k` from 0
    /// (as the engine measures it, [`StepCostFit::relative_costs`]). An entry missing,
    /// non-finite or below 1 (a row count not measured yet) is the last good entry below it
    /// plus `prior_row_cost` a proposal: optimistic, so that the untried `k` gets tried and
    /// measured rather than ruled out by a guess.
    pub fn set_costs(&mut self, cost: &[f64], prior_row_cost: f64) {
        let prior = if prior_row_cost.is_finite() {
            prior_row_cost.clamp(0.0, 1.0)
        } else {
            1.0
        };
        let mut last = (0, 1.0);
        self.cost = (0..=self.max_k)
            .map(|k| match cost.get(k) {
                _ if k == 0 => 1.0,
                Some(&c) if c.is_finite() && c >= 1.0 => {
                    last = (k, c);
                    c
                }
                _ => last.1 + prior * (k - last.0) as f64,
            })
            .collect();
    }

    /// Proposals to make this step: [`AdaptiveK::best`], or a one-token probe now and then
    /// while that is 0.
    pub fn next_k(&mut self) -> usize {
        let k = self.best();
        if k > 0 || self.max_k == 0 {
            self.idle = 0;
            self.probe_every = PROBE_EVERY;
            return k;
        }
        // A probe proposes one token to measure whether speculation would pay again: where
        // that one token would not pay for its row even at a high acceptance rate (many
        // sequences on a CPU adapter, where rows cost their share of the step; a draft
        // model that must first catch up on every token it skipped), the probe is pure
        // cost. Judged on the measured cost of one proposal only: larger k not timed yet
        // are guessed optimistically, which would let every probe through. Costs are
        // re-measured (a row count not seen for a while is guessed optimistically again,
        // see `StepCostFit`), so this holds only while it is true.
        if (1.0 + PROBE_RATE) / self.cost[1] < MARGIN {
            self.idle = 0;
            return 0;
        }
        self.idle += 1;
        if self.idle >= self.probe_every {
            self.idle = 0;
            self.probing = true;
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
        if std::mem::take(&mut self.probing) {
            self.probe_every = match accepted {
                0 => (self.probe_every * 2).min(MAX_PROBE_EVERY),
                _ => PROBE_EVERY,
            };
        }
        self.rate.record(proposed, accepted);
    }
}

/// A decaying estimate of the rate at which proposals are accepted, given the ones before
/// them were: decayed counts of accepted proposals and of rejections (at most one per
/// verified step, since the first rejection ends it).
#[derive(Clone, Copy, Debug)]
pub struct AcceptanceRate {
    accepted: f64,
    rejected: f64,
    /// Weight the counts keep at each record.
    decay: f64,
}

impl AcceptanceRate {
    /// Counts weighing two proposals at `rate` (clamped to 0..=1; a NaN counts as one
    /// half), kept at `decay` (0..1) a record.
    pub fn starting_at(rate: f64, decay: f64) -> Self {
        let rate = if rate.is_nan() {
            0.5
        } else {
            rate.clamp(0.0, 1.0)
        };
        AcceptanceRate {
            accepted: 2.0 * rate,
            rejected: 2.0 * (1.0 - rate),
            decay: decay.clamp(0.0, 1.0),
        }
    }

    /// The estimate: accepted over accepted plus rejections.
    pub fn rate(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }

    /// Records a verified step: `accepted` of `proposed` proposals kept. A step without
    /// proposals records nothing.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let accepted = accepted.min(proposed);
        self.accepted = self.accepted * self.decay + accepted as f64;
        self.rejected = self.rejected * self.decay + f64::from(u8::from(accepted < proposed));
    }
}

/// What extra query rows cost on this adapter, measured from the decode steps the engine
/// runs: the mean step time at each row count seen (exponentially weighted, so it follows
/// the machine's load), and a least-squares line `t = fixed + per_row * rows` through them
/// for row counts not yet seen. A sequence's share of a step of `s` rows (one per sequence)
/// is `t(s) / s`, so `k` proposals cost it `1 + (t(s + k) - t(s)) / (t(s) / s)` of its
/// share ([`StepCostFit::relative_costs`], what [`AdaptiveK`] weighs). The table matters:
/// costs are not linear in rows. On lavapipe a two-row step costs about 1.5 one-row steps
/// (another pass of every projection for the remainder rows) while five rows cost not much
/// more than two; on a GPU rows are nearly free against reading the weights once; on a CPU
/// adapter with many sequences every row pays its own arithmetic and speculation turns
/// itself off.
#[derive(Clone, Debug, Default)]
pub struct StepCostFit {
    /// Decayed sums of weight, rows, time, rows squared and rows times time.
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// Per row count: steps seen (capped), their running mean time, and the step of the
    /// latest.
    by_rows: Vec<(u32, f64, u64)>,
    /// Steps recorded.
    steps: u64,
}

/// Weight kept by the sums at each step: a memory of about 50 steps.
const FIT_DECAY: f64 = 0.98;
/// The row counts seen must vary by about this much (their variance) to fit a slope.
const MIN_ROW_VARIANCE: f64 = 0.2;
/// A row count's mean weighs the last this many steps about equally.
const ROWS_MEMORY: u32 = 16;
/// Row counts tabulated (more fall back on the line).
const MAX_TABLE_ROWS: usize = 1024;
/// A row count not seen for this many steps is timed again: its mean is forgotten, so a
/// cost measured under other conditions (a loaded machine, a noisy step) cannot keep
/// proposals and probes off for good.
const STALE_STEPS: u64 = 512;

impl StepCostFit {
    /// Records a decode step of `rows` query rows that took `seconds`.
    pub fn record(&mut self, rows: usize, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let x = rows as f64;
        self.w = self.w * FIT_DECAY + 1.0;
        self.x = self.x * FIT_DECAY + x;
        self.y = self.y * FIT_DECAY + seconds;
        self.xx = self.xx * FIT_DECAY + x * x;
        self.xy = self.xy * FIT_DECAY + x * seconds;
        self.steps += 1;
        if rows < MAX_TABLE_ROWS {
            if self.by_rows.len() <= rows {
                self.by_rows.resize(rows + 1, (0, 0.0, 0));
            }
            let steps = self.steps;
            let (n, mean, seen) = &mut self.by_rows[rows];
            if steps - *seen > STALE_STEPS {
                *n = 0;
            }
            *n = (*n + 1).min(ROWS_MEMORY);
            *mean += (seconds - *mean) / f64::from(*n);
            *seen = steps;
        }
    }

    /// The fitted `(fixed, per_row)` seconds, once the row counts have varied enough; both
    /// at least 0 (a negative slope is noise: rows never make a step faster).
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w < 2.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        if var < MIN_ROW_VARIANCE {
            return None;
        }
        let per_row = ((self.xy / self.w - mx * my) / var).max(0.0);
        let fixed = (my - per_row * mx).max(0.0);
        Some((fixed, per_row))
    }

    /// The expected time of a step of `rows` rows: the mean of those seen (the latest
    /// within `STALE_STEPS`; steps that compiled a pipeline are not recorded, so one
    /// step is enough), else the line's, else (the line needs row counts
    /// that varied lately) a straight line between the nearest row counts timed below and
    /// above.
    pub fn time(&self, rows: usize) -> Option<f64> {
        if let Some(t) = self.timed(rows) {
            return Some(t);
        }
        if let Some((fixed, per_row)) = self.fit() {
            return Some(fixed + per_row * rows as f64);
        }
        let below = (1..rows).rev().find_map(|r| Some((r, self.timed(r)?)))?;
        let above = (rows + 1..self.by_rows.len()).find_map(|r| Some((r, self.timed(r)?)))?;
        let w = (rows - below.0) as f64 / (above.0 - below.0) as f64;
        Some(below.1 + w * (above.1 - below.1))
    }

    /// The mean time of `rows`-row steps, if seen lately.
    fn timed(&self, rows: usize) -> Option<f64> {
        match self.by_rows.get(rows) {
            Some(&(n, mean, seen)) if n >= 1 && self.steps - seen <= STALE_STEPS => Some(mean),
            _ => None,
        }
    }

    /// What one more row costs a sequence of a step of `seqs` sequences, relative to its
    /// share of the step (0..=1), by the line; `None` before [`StepCostFit::fit`] has one.
    pub fn row_cost(&self, seqs: usize) -> Option<f64> {
        let (fixed, per_row) = self.fit()?;
        let rows = per_row * seqs.max(1) as f64;
        match fixed + rows {
            t if t > 0.0 => Some((rows / t).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// For `k` in `0..=max_k`: what `k` proposals of one sequence cost it, in its shares of
    /// a step of `seqs` sequences (1 for `k = 0`; never less, since rows never make a step
    /// faster); `None` before the plain step's time is known. Unknown entries are NaN
    /// (left to [`AdaptiveK::set_costs`]).
    ///
    /// The cost is the larger of two views. Alone: the step grows by this sequence's `k`
    /// rows, `1 + (t(s + k) - t(s)) / (t(s) / s)`. Together: every sequence of the step
    /// proposes as many, and the step of `s (1 + k)` rows costs each its share,
    /// `t(s (1 + k)) / t(s)`. The views differ where costs are not linear in rows: on a
    /// CPU adapter one extra row of a 16-row step adds a small remainder pass, so each
    /// sequence alone would find a proposal cheap, while all of them proposing double the
    /// step. Taking the larger keeps a batch from speculating its way into a slower step.
    pub fn relative_costs(&self, seqs: usize, max_k: usize) -> Option<Vec<f64>> {
        let seqs = seqs.max(1);
        let base = self.time(seqs).filter(|&t| t > 0.0)?;
        let share = base / seqs as f64;
        let alone = |k: usize| {
            self.time(seqs + k)
                .map(|t| 1.0 + (t - base).max(0.0) / share)
        };
        let together = |k: usize| self.time(seqs * (1 + k)).map(|t| (t / base).max(1.0));
        Some(
            (0..=max_k)
                .map(|k| match (alone(k), together(k)) {
                    _ if k == 0 => 1.0,
                    (Some(a), Some(b)) => a.max(b),
                    (Some(c), None) | (None, Some(c)) => c,
                    (None, None) => f64::NAN,
                })
                .collect(),
        )
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

    #[test]
    fn the_step_fit_recovers_a_line_and_the_row_cost_follows() {
        let mut f = StepCostFit::default();
        assert_eq!(f.row_cost(1), None);
        // 10 ms fixed, 2 ms a row, at rows 1..=5 in turn.
        for i in 0..100 {
            let rows = 1 + i % 5;
            f.record(rows, 0.010 + 0.002 * rows as f64);
        }
        let (fixed, per_row) = f.fit().unwrap();
        assert!((fixed - 0.010).abs() < 1e-9 && (per_row - 0.002).abs() < 1e-9);
        // One sequence: a row is 2 of its 12 ms; sixteen: 32 of 42 ms.
        assert!((f.row_cost(1).unwrap() - 2.0 / 12.0).abs() < 1e-9);
        assert!((f.row_cost(16).unwrap() - 32.0 / 42.0).abs() < 1e-9);
        // A machine where rows cost nothing of their own.
        let mut g = StepCostFit::default();
        for i in 0..50 {
            g.record(1 + i % 3, 0.02);
        }
        assert_eq!(g.row_cost(8), Some(0.0));
    }

    #[test]
    fn the_step_fit_needs_varied_rows_and_ignores_nonsense() {
        let mut f = StepCostFit::default();
        for _ in 0..100 {
            f.record(4, 0.01);
        }
        assert_eq!(f.fit(), None, "a constant row count has no slope");
        f.record(4, f64::NAN);
        f.record(4, -1.0);
        assert_eq!(f.fit(), None);
        // Time falling with rows is noise, not a negative cost: the slope is 0.
        let mut g = StepCostFit::default();
        for i in 0..40 {
            let rows = 1 + i % 4;
            g.record(rows, 0.05 - 0.001 * rows as f64);
        }
        let (_, per_row) = g.fit().unwrap();
        assert_eq!(per_row, 0.0);
        let mut k = AdaptiveK::new(4, 0.0);
        k.set_row_cost(f64::NAN);
        assert_eq!(k.best(), 0);
    }

    #[test]
    fn measured_costs_follow_the_row_counts_seen() {
        let mut f = StepCostFit::default();
        assert_eq!(f.relative_costs(1, 4), None);
        // As on lavapipe: one row 4 ms, two 6 ms, five 6.5 ms.
        for _ in 0..10 {
            f.record(1, 0.004);
            f.record(2, 0.006);
            f.record(5, 0.0065);
        }
        assert_eq!(f.time(2), Some(0.006));
        let c = f.relative_costs(1, 4).unwrap();
        assert_eq!(c[0], 1.0);
        assert!(
            (c[1] - 1.5).abs() < 1e-9 && (c[4] - 1.625).abs() < 1e-9,
            "{c:?}"
        );
        // Three rows were never seen: the line through all steps answers.
        let (fixed, per_row) = f.fit().unwrap();
        assert!((f.time(3).unwrap() - (fixed + 3.0 * per_row)).abs() < 1e-12);
        // With those costs four proposals at a 75% acceptance rate are best, where a linear
        // cost of 0.7 a row would rule speculation out.
        let mut k = AdaptiveK::new(4, 0.7);
        for _ in 0..50 {
            k.record(4, 3);
        }
        assert_eq!(k.best(), 0);
        k.set_costs(&c, 0.7);
        assert_eq!(k.best(), 4);
        // Missing and bad entries are the last good one plus the prior a proposal.
        k.set_costs(&[1.0, 1.2, f64::NAN, 0.5], 0.1);
        assert!((k.cost[4] - 1.5).abs() < 1e-12, "{:?}", k.cost);
        k.set_costs(&[], 0.25);
        assert_eq!(k.cost, vec![1.0, 1.25, 1.5, 1.75, 2.0]);
    }

    #[test]
    fn failed_probes_back_off_and_an_accepted_one_resets() {
        // A row costing half a step: speculation would pay at a high acceptance rate (1.8 /
        // 1.5 at 80%), so probes are made, but rejections keep it off.
        let mut k = AdaptiveK::new(2, 0.5);
        let mut gaps = Vec::new();
        let mut since = 0;
        for _ in 0..(16 + 32 + 64) {
            since += 1;
            if k.next_k() == 1 {
                gaps.push(since);
                since = 0;
                k.record(1, 0);
            }
        }
        assert_eq!(gaps, vec![16, 32, 64], "{gaps:?}");
        // An accepted probe brings the interval back to 16 steps.
        let mut since = 0;
        loop {
            since += 1;
            if k.next_k() == 1 {
                break;
            }
        }
        assert_eq!(since, 128);
        k.record(1, 1);
        let mut since = 0;
        loop {
            since += 1;
            if k.next_k() > 0 {
                break;
            }
        }
        assert_eq!(since, 16);
    }

    #[test]
    fn no_probe_where_a_sure_proposal_would_not_pay() {
        // Measured: one proposal costs a sequence 1.9 of its shares (16 sequences on a CPU
        // adapter, where a step of 32 rows takes 1.9 of one of 16); even at an 80%
        // acceptance rate (1.8 tokens for 1.9) a probe would not pay, so none is made,
        // whatever the untimed larger k are guessed at.
        let mut k = AdaptiveK::new(4, 0.15);
        k.set_costs(&[1.0, 1.9], 0.15);
        for _ in 0..60 {
            k.record(1, 0);
        }
        assert!((0..1000).all(|_| k.next_k() == 0));
        // Cheaper again (the batch shrank, or the entry went stale and is guessed): probes
        // resume.
        k.set_costs(&[1.0, 1.3], 0.15);
        assert!((0..PROBE_EVERY).any(|_| k.next_k() == 1));
    }

    #[test]
    fn a_new_request_starts_from_the_rate_it_is_given() {
        // From the engine's recent rate of 2%: off from the first step, probing at 16.
        let mut k = AdaptiveK::starting_at(4, 0.05, 0.02);
        assert!(k.rate() < 0.03);
        let first = (1..=100).find(|_| k.next_k() > 0);
        assert_eq!(first, Some(PROBE_EVERY));
        // From 90%: speculating at once, fully on cheap rows.
        let mut k = AdaptiveK::starting_at(4, 0.05, 0.9);
        assert_eq!(k.next_k(), 4);
        // The start weighs two proposals: two accepted steps of four bring 2% up past 2/3.
        let mut k = AdaptiveK::starting_at(4, 0.05, 0.02);
        k.record(4, 4);
        k.record(4, 4);
        assert!(k.rate() > 2.0 / 3.0, "{}", k.rate());
        // Nonsense rates are clamped, a NaN is one half.
        assert_eq!(AcceptanceRate::starting_at(3.0, 0.9).rate(), 1.0);
        assert_eq!(AcceptanceRate::starting_at(f64::NAN, 0.9).rate(), 0.5);
        let mut r = AcceptanceRate::starting_at(0.0, 0.5);
        r.record(2, 1);
        // Counts halved to 0 and 1, then 1 acceptance and 1 rejection: 1 / 3.
        assert!((r.rate() - 1.0 / 3.0).abs() < 1e-12, "{}", r.rate());
    }

    #[test]
    fn a_batch_proposing_together_pays_for_the_whole_step() {
        // A CPU adapter: rows cost 0.5 ms each in passes of 8, plus 4 ms a step; a pass of
        // 1-7 remainder rows costs as much as a whole one.
        let t = |rows: usize| 0.004 + 0.004 * rows.div_ceil(8) as f64;
        let mut f = StepCostFit::default();
        for _ in 0..4 {
            for rows in [16, 17, 32, 48, 80] {
                f.record(rows, t(rows));
            }
        }
        let c = f.relative_costs(16, 4).unwrap();
        // Alone, one more row adds a pass, 4 of a 12 ms step's 0.75 ms shares: 1 + 5.33;
        // together, 32 rows take 20 ms against 12: 1.67. The larger counts.
        assert!(
            (c[1] - (1.0 + 0.004 / (0.012 / 16.0))).abs() < 1e-9,
            "{c:?}"
        );
        // Four proposals each: alone 21 rows were never timed (the line answers), together
        // 80 rows take 44 ms, 3.67 steps.
        assert!(c[4] >= 44.0 / 12.0 - 1e-9, "{c:?}");
        // One sequence: both views are the same.
        let mut g = StepCostFit::default();
        for _ in 0..4 {
            g.record(1, 0.004);
            g.record(2, 0.006);
        }
        assert_eq!(g.relative_costs(1, 1).unwrap(), vec![1.0, 1.5]);
    }

    #[test]
    fn a_row_count_not_seen_for_long_is_timed_again() {
        let mut f = StepCostFit::default();
        // Two-row steps timed once under load, then only one-row steps for a long while.
        for _ in 0..2 {
            f.record(2, 0.050);
        }
        for _ in 0..STALE_STEPS {
            f.record(1, 0.004);
        }
        assert_eq!(f.time(2), Some(0.050));
        f.record(1, 0.004);
        // Stale: no mean, and the line has forgotten its slope (only one-row steps now).
        assert_eq!(f.time(2), None);
        let c = f.relative_costs(1, 1).unwrap();
        assert!(c[1].is_nan(), "left to the optimistic guess: {c:?}");
        // Timed again, the old mean does not come back.
        f.record(2, 0.006);
        f.record(2, 0.006);
        assert!((f.time(2).unwrap() - 0.006).abs() < 1e-12);
    }

    #[test]
    fn a_row_count_between_two_timed_ones_is_interpolated() {
        let mut f = StepCostFit::default();
        // 1 and 16 rows timed long ago, then only 16-row steps: the line has no slope left.
        for _ in 0..3 {
            f.record(1, 0.004);
        }
        for _ in 0..300 {
            f.record(16, 0.012);
        }
        assert_eq!(f.fit(), None);
        // 12 rows: between 4 ms and 12 ms, 11/15 of the way.
        let t = f.time(12).unwrap();
        assert!((t - (0.004 + 0.008 * 11.0 / 15.0)).abs() < 1e-12, "{t}");
        // Beyond the largest timed count there is nothing to go by.
        assert_eq!(f.time(17), None);
    }
}
