//! A stand-in for the engine around the real `Scheduler` and `BlockManager`, with no GPU:
//! there is no forward pass, and "sampling" draws each next token from a hash of the
//! sequence's own history, so a request's output depends on nothing but the request. The
//! samples go through `Scheduler::commit`, the same code the engine runs after sampling
//! (progress, sliding-window release, forks, beams, finishing, freeing). Preemption,
//! batching, windows or pool size must never change an output; the driver checks the
//! scheduler's promises after every step and returns the first one broken.

#![allow(dead_code)]

use pagellm::internals::cache::{BlockManager, CacheConfig, KvGroups, SeqId};
use pagellm::internals::engine::scheduler::{
    BeamChild, Fork, NextToken, Queue, SampleOutcome, Sampled, Scheduler, SchedulerOutput,
};
use pagellm::internals::engine::sequence::{GroupShape, Sequence, SequenceGroup};
use pagellm::internals::engine::{EngineConfig, FinishReason, RequestId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A request: its prompt, how it multiplies, its output length, and the seed its tokens
/// are drawn with.
#[derive(Clone, Debug)]
pub struct Req {
    pub prompt: Vec<u32>,
    pub shape: GroupShape,
    pub max_tokens: usize,
    pub seed: u64,
    /// Never draw an "EOS": every sequence runs to `max_tokens`.
    pub ignore_eos: bool,
}

impl Req {
    /// An upper bound of the blocks the request can ever need: every sequence at its full
    /// length, nothing shared.
    pub fn worst_blocks(&self, block_size: usize) -> usize {
        self.shape.width() * (self.prompt.len() + self.max_tokens).div_ceil(block_size)
    }
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Output tokens of each sample, or of each surviving beam (best first).
    Finished(Vec<Vec<u32>>),
    Failed(String),
    Aborted,
}

/// Per request: the request, and beam hypotheses that ended early.
pub struct Side {
    pub req: Req,
    pub ended: Vec<(Vec<u32>, f64)>,
}

/// Per sequence: the beam's cumulative score.
type Score = f64;

pub struct Driver {
    pub sched: Scheduler<Score, Side>,
    pub outcomes: BTreeMap<RequestId, Outcome>,
    pub steps: u64,
    pub tokens_computed: u64,
    /// The sliding window every layer has, if any (blocks that left it are released).
    window: Option<usize>,
    /// The windows of the block manager's KV cache groups, if it has groups.
    groups: Option<Vec<Option<usize>>>,
    /// Consecutive steps in which nothing was computed and no block moved.
    idle: u32,
    /// Speculative decoding (with `config.speculative` set): the percentage of proposed
    /// tokens that are the sequence's true next ones; the rest are wrong, so both paths of
    /// verification run.
    pub proposal_accuracy: u64,
    /// Proposals verified and accepted so far.
    pub proposals_accepted: u64,
}

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The next token of a sequence with this history: a function of the history alone.
fn draw(seed: u64, index: u64, history: &[u32], k: u64) -> u64 {
    let mut h = splitmix(seed ^ index.wrapping_mul(0x1000_0001) ^ k.wrapping_mul(77));
    for &t in history.iter().rev().take(4) {
        h = splitmix(h ^ t as u64);
    }
    splitmix(h ^ history.len() as u64)
}

const VOCAB: u64 = 1000;
/// Tokens below this end a sample (its "EOS"), so lengths vary.
const EOS_BELOW: u64 = 15;

impl Driver {
    pub fn new(config: EngineConfig, cache: CacheConfig) -> Self {
        Self::with_window(config, cache, None)
    }

    /// A driver whose model has a sliding window of `window` tokens in every layer.
    pub fn with_window(config: EngineConfig, cache: CacheConfig, window: Option<usize>) -> Self {
        let blocks = BlockManager::new(cache).expect("valid cache configuration");
        Driver {
            sched: Scheduler::new(config, blocks).with_window(window),
            groups: None,
            outcomes: BTreeMap::new(),
            steps: 0,
            tokens_computed: 0,
            window,
            idle: 0,
            proposal_accuracy: 70,
            proposals_accepted: 0,
        }
    }

    /// A driver whose block manager keeps KV cache groups with these windows (as the
    /// engine does for a model that mixes windowed and global layers, or, with one
    /// windowed group, for a model whose layers all slide).
    pub fn with_groups(
        config: EngineConfig,
        cache: CacheConfig,
        windows: Vec<Option<usize>>,
    ) -> Self {
        let chunk = config.max_num_batched_tokens;
        let groups = KvGroups::new(windows.clone(), chunk);
        let blocks = BlockManager::new(cache)
            .expect("valid cache configuration")
            .with_groups(groups);
        let mut d = Self::new(config, cache);
        d.sched = Scheduler::new(d.sched.config.clone(), blocks);
        d.groups = Some(windows);
        d
    }

    pub fn add(&mut self, id: RequestId, req: Req) {
        let first = Sequence::new(self.sched.new_seq_id(), 0, &req.prompt, 0.0);
        let g = SequenceGroup::new(
            id,
            req.shape,
            req.prompt.len() + req.max_tokens,
            first,
            Side {
                req,
                ended: Vec::new(),
            },
        );
        self.sched.add(g);
    }

    pub fn abort(&mut self, id: RequestId) {
        if self.sched.remove(id).is_some() {
            self.outcomes.insert(id, Outcome::Aborted);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.sched.is_empty()
    }

    /// Requests not yet ended.
    pub fn pending(&self) -> usize {
        self.sched.num_groups()
    }

    /// One step: schedule, check, "compute", sample. Errors name the broken promise.
    pub fn step(&mut self) -> Result<SchedulerOutput<Score, Side>, String> {
        self.steps += 1;
        self.propose();
        let oldest = self.oldest_running_decode();
        let preemptions = self.sched.stats.preemptions;
        let mut out = self
            .sched
            .schedule()
            .map_err(|e| format!("step {}: schedule failed: {e}", self.steps))?;
        let failed_any = !out.failed.is_empty();
        for f in std::mem::take(&mut out.failed) {
            let id = f.group.request_id;
            if f.reason.is_empty() {
                return Err(format!("request {id} failed without a reason"));
            }
            if self.outcomes.contains_key(&id) {
                return Err(format!("request {id} failed but had already ended"));
            }
            if self.sched.contains(id) {
                return Err(format!("failed request {id} is still queued"));
            }
            if f.group
                .seqs
                .iter()
                .any(|s| self.sched.blocks().contains(s.id))
            {
                return Err(format!("failed request {id} still holds blocks"));
            }
            self.outcomes.insert(id, Outcome::Failed(f.reason));
        }
        // Progress by age: the oldest running decode is served first, so it computes in
        // every step unless it failed or was itself preempted.
        if let Some(id) = oldest {
            let running = self.sched.queue_of(id) == Some(Queue::Running);
            if running && !out.scheduled.iter().any(|s| s.request_id == id) {
                return Err(format!(
                    "step {}: the oldest running decode {id} was not served",
                    self.steps
                ));
            }
        }
        // Blocks freed by a preemption or a failure in this step.
        let preempted = self.sched.stats.preemptions > preemptions || failed_any;
        self.check_step(&out, preempted)
            .map_err(|e| format!("step {}: {e}", self.steps))?;
        self.sched
            .blocks()
            .check_invariants()
            .map_err(|e| format!("step {}: block manager: {e}", self.steps))?;
        // Scheduled proposals have slots: the blocks hold them after the tokens.
        let tokens: HashMap<SeqId, Vec<u32>> = self
            .sched
            .groups()
            .flat_map(|g| {
                g.seqs
                    .iter()
                    .map(|s| (s.id, [&s.tokens[..], &s.proposed[..]].concat()))
            })
            .collect();
        self.sched
            .blocks()
            .check_contents(|id| tokens.get(&id).map(Vec::as_slice))
            .map_err(|e| format!("step {}: block contents: {e}", self.steps))?;
        let bm = self.sched.blocks();
        if bm.num_used_device_blocks() != bm.stats().device.used {
            return Err(format!(
                "step {}: used-block count disagrees with stats",
                self.steps
            ));
        }
        if out.scheduled.is_empty() && out.ops.is_empty() && !self.is_idle() {
            self.idle += 1;
            if self.idle > 2 {
                return Err(format!(
                    "step {}: {} requests pending, nothing scheduled for 3 steps",
                    self.steps,
                    self.pending()
                ));
            }
        } else {
            self.idle = 0;
        }
        self.compute(&out)
            .map_err(|e| format!("step {}: {e}", self.steps))?;
        Ok(out)
    }

    /// Speculative decoding: every live decoding sample proposes up to `k` tokens, each
    /// its true next token with `proposal_accuracy` percent chance (continuing the history
    /// the earlier proposals make), else a wrong one.
    fn propose(&mut self) {
        let k = self.sched.config.num_speculative_tokens();
        let (step, accuracy) = (self.steps, self.proposal_accuracy);
        let computed: Vec<Vec<usize>> = self
            .sched
            .running()
            .iter()
            .map(|g| {
                g.seqs
                    .iter()
                    .map(|s| s.num_computed(self.sched.blocks()))
                    .collect()
            })
            .collect();
        for (g, computed) in self.sched.running_mut().iter_mut().zip(computed) {
            let GroupShape::Samples(_) = g.shape else {
                continue;
            };
            let req = &g.data.req;
            for (s, computed) in g.seqs.iter_mut().zip(computed) {
                s.proposed.clear();
                if s.is_finished() || computed + 1 != s.tokens.len() {
                    continue;
                }
                let mut h = s.tokens.clone();
                let mut r = splitmix(step ^ s.id.0.wrapping_mul(0x9e37));
                for _ in 0..splitmix(r) as usize % (k + 1) {
                    r = splitmix(r);
                    let t = if r % 100 < accuracy {
                        next_sample(req, s.index, &h, s.prompt_len).0
                    } else {
                        (r % VOCAB) as u32
                    };
                    s.proposed.push(t);
                    h.push(t);
                }
            }
        }
    }

    /// The oldest running group that decodes (with `decode_first` off, the oldest running
    /// group), if its width fits the budget.
    fn oldest_running_decode(&self) -> Option<RequestId> {
        let cfg = &self.sched.config;
        self.sched
            .running()
            .iter()
            .min_by_key(|g| g.arrival)
            .filter(|g| {
                (g.is_decoding(self.sched.blocks()) || !cfg.decode_first)
                    && g.shape.width() <= cfg.max_num_batched_tokens
            })
            .filter(|g| cfg.decode_first || g.is_decoding(self.sched.blocks()))
            .map(|g| g.request_id)
    }

    /// Runs until every request has ended, at most `max_steps` steps.
    pub fn run(&mut self, max_steps: u64) -> Result<(), String> {
        let start = self.steps;
        while !self.is_idle() {
            if self.steps - start >= max_steps {
                return Err(format!(
                    "liveness: {} requests still pending after {max_steps} steps",
                    self.pending()
                ));
            }
            self.step()?;
        }
        Ok(())
    }

    /// Everything is back: no sequence in the block manager, no used device or host block.
    pub fn check_drained(&self) -> Result<(), String> {
        let st = self.sched.blocks().stats();
        if st.device.used != 0 || st.host.used != 0 || self.sched.blocks().sequences().count() != 0
        {
            return Err(format!("leak after all requests ended: {st:?}"));
        }
        if self.sched.num_waiting() + self.sched.num_running() + self.sched.num_swapped() != 0 {
            return Err("the scheduler still queues ended requests".into());
        }
        self.sched.blocks().check_invariants()
    }

    fn check_step(
        &mut self,
        out: &SchedulerOutput<Score, Side>,
        preempted: bool,
    ) -> Result<(), String> {
        let cfg = &self.sched.config;
        let mut seen = HashSet::new();
        let mut tokens = 0;
        let mut rows = 0;
        let mut by_group: BTreeMap<RequestId, Vec<(usize, bool)>> = BTreeMap::new();
        if out.tables.len() != out.scheduled.len() {
            return Err(format!(
                "{} tables for {} scheduled sequences",
                out.tables.len(),
                out.scheduled.len()
            ));
        }
        for (s, tables) in out.scheduled.iter().zip(&out.tables) {
            if !seen.insert(s.id) {
                return Err(format!("{} scheduled twice", s.id));
            }
            // The step's tables are the block manager's, group by group, holes included.
            let blocks = self.sched.blocks();
            for (g, t) in tables.iter().enumerate() {
                let live = blocks.block_table_in(s.id, g).map_err(|e| e.to_string())?;
                let holes = blocks
                    .released_blocks_in(s.id, g)
                    .map_err(|e| e.to_string())?;
                if t.blocks != live || t.holes != holes {
                    return Err(format!(
                        "{} group {g}: the step's table is not its table",
                        s.id
                    ));
                }
            }
            if tables.len() != blocks.groups().len() {
                return Err(format!("{}: tables for {} groups", s.id, tables.len()));
            }
            let g = self
                .sched
                .get(s.request_id)
                .ok_or_else(|| format!("request {} scheduled but unknown", s.request_id))?;
            let queue = self.sched.queue_of(s.request_id);
            if queue != Some(Queue::Running) {
                return Err(format!(
                    "request {} scheduled while {queue:?}",
                    s.request_id
                ));
            }
            let seq = &g.seqs[s.seq];
            if seq.id != s.id || seq.is_finished() {
                return Err(format!("{} is not a live sequence of its group", s.id));
            }
            let own = s.len - s.proposed;
            if s.len == 0
                || s.proposed > s.len
                || s.start != seq.num_computed(self.sched.blocks())
                || s.start + own > seq.tokens.len()
            {
                return Err(format!(
                    "{}: bad range {}+{} of {:?}",
                    s.id,
                    s.start,
                    s.len,
                    seq.tokens.len()
                ));
            }
            if s.sample != (s.start + own == seq.tokens.len()) {
                return Err(format!("{}: sample flag wrong", s.id));
            }
            // Proposals ride only on a decode, and the sequence keeps exactly those given
            // slots.
            if s.proposed > 0 && (own != 1 || !s.sample) || seq.proposed.len() != s.proposed {
                return Err(format!(
                    "{}: {} proposals scheduled on {own} own tokens, {} kept",
                    s.id,
                    s.proposed,
                    seq.proposed.len()
                ));
            }
            // Slots cover what is computed this step; a sequence that samples has slots for
            // all its tokens (and its proposals); a prompt's later chunks have none yet.
            let bm = self.sched.blocks();
            let slots = bm.num_tokens(s.id).map_err(|e| e.to_string())?;
            let exact = s.sample && slots != seq.tokens.len() + s.proposed;
            if slots < s.start + s.len || slots > seq.tokens.len() + s.proposed || exact {
                return Err(format!(
                    "{}: {slots} slots for {}+{} of {} tokens",
                    s.id,
                    s.start,
                    s.len,
                    seq.tokens.len()
                ));
            }
            let windows = self.groups.clone().unwrap_or_else(|| vec![self.window]);
            for (g, window) in windows.into_iter().enumerate() {
                let table = bm.block_table_in(s.id, g).map_err(|e| e.to_string())?;
                let holes = bm.released_blocks_in(s.id, g).map_err(|e| e.to_string())?;
                if holes + table.len() != slots.div_ceil(bm.block_size()) {
                    return Err(format!(
                        "{}: block table of KV cache group {g} does not cover its tokens",
                        s.id
                    ));
                }
                // Only blocks every future query's window has left may be released.
                let unseen = match window {
                    Some(w) => (seq.num_computed(bm) + 1).saturating_sub(w),
                    None => 0,
                };
                if holes * bm.block_size() > unseen {
                    return Err(format!(
                        "{}: {holes} blocks released in KV cache group {g}, but position \
                         {unseen} on is still seen",
                        s.id
                    ));
                }
            }
            tokens += s.len;
            rows += s.rows();
            by_group
                .entry(s.request_id)
                .or_default()
                .push((s.seq, s.sample));
        }
        if tokens > cfg.max_num_batched_tokens {
            return Err(format!(
                "{tokens} tokens over a budget of {}",
                cfg.max_num_batched_tokens
            ));
        }
        let running = self.sched.running();
        let live: usize = running.iter().map(|g| g.live().count()).sum();
        let slots: usize = running.iter().map(|g| g.slots()).sum();
        let unscheduled = self
            .sched
            .groups()
            .flat_map(|g| g.seqs.iter())
            .find(|q| !q.proposed.is_empty() && !seen.contains(&q.id));
        if let Some(q) = unscheduled {
            return Err(format!("{} keeps proposals it was not scheduled", q.id));
        }
        if live > cfg.max_num_seqs || slots > cfg.max_num_seqs || rows > cfg.max_sampled_rows() {
            return Err(format!(
                "{live} live sequences, {slots} slots, {rows} rows over max_num_seqs {} \
                 (rows: {})",
                cfg.max_num_seqs,
                cfg.max_sampled_rows()
            ));
        }
        for g in running {
            let live: Vec<usize> = g
                .seqs
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.is_finished())
                .map(|(i, _)| i)
                .collect();
            let got = by_group.get(&g.request_id);
            let sampled: Vec<usize> = got
                .map(|v| v.iter().filter(|x| x.1).map(|x| x.0).collect())
                .unwrap_or_default();
            // Gang scheduling: a group samples with all its live sequences or with none.
            if !sampled.is_empty() && sampled != live {
                return Err(format!(
                    "request {}: {} of {} live sequences sample this step",
                    g.request_id,
                    sampled.len(),
                    live.len()
                ));
            }
            // Decode first: a running decode is left out only when the budget is spent, or
            // when it waits for blocks it cannot have now (in a step that preempted or failed
            // a group, that group may have made room after it was passed over).
            if g.is_decoding(self.sched.blocks()) && got.is_none() && cfg.decode_first && !preempted
            {
                let k = live.len();
                let bm = self.sched.blocks();
                let appending: Vec<SeqId> = g
                    .live()
                    .filter(|s| bm.num_tokens(s.id).is_ok_and(|n| n < s.tokens.len()))
                    .map(|s| s.id)
                    .collect();
                if tokens + k <= cfg.max_num_batched_tokens && bm.can_append_slots(&appending) {
                    return Err(format!(
                        "request {} decodes but was left out with {} of {} tokens used",
                        g.request_id, tokens, cfg.max_num_batched_tokens
                    ));
                }
            }
        }
        Ok(())
    }

    /// "Sampling", then the scheduler's own commit of the step.
    fn compute(&mut self, out: &SchedulerOutput<Score, Side>) -> Result<(), String> {
        let mut sampled: Vec<(RequestId, Vec<(usize, usize)>)> = Vec::new();
        for s in &out.scheduled {
            self.tokens_computed += s.len as u64;
            if s.sample {
                match sampled.last_mut() {
                    Some((id, v)) if *id == s.request_id => v.push((s.seq, s.proposed)),
                    _ => sampled.push((s.request_id, vec![(s.seq, s.proposed)])),
                }
            }
        }
        let mut results = Vec::with_capacity(sampled.len());
        for (id, seqs) in sampled {
            let g = self
                .sched
                .get_mut(id)
                .ok_or_else(|| format!("sampled request {id} is not held"))?;
            let outcome = match g.shape {
                GroupShape::Samples(n) => sample(g, n, &seqs),
                GroupShape::Beams(width) => {
                    let seqs: Vec<usize> = seqs.iter().map(|x| x.0).collect();
                    beam_step(g, width, &seqs)
                }
            };
            if let SampleOutcome::Tokens { tokens, .. } = &outcome {
                self.proposals_accepted += tokens.iter().map(|t| t.accepted as u64).sum::<u64>();
            }
            results.push(Sampled {
                request_id: id,
                outcome,
            });
        }
        let done = self
            .sched
            .commit(out, results)
            .map_err(|e| format!("commit failed: {e}"))?;
        if let Some(f) = done.failed.first() {
            return Err(format!(
                "commit failed request {}: {}",
                f.group.request_id, f.reason
            ));
        }
        for g in done.finished {
            if g.seqs.iter().any(|s| self.sched.blocks().contains(s.id)) {
                return Err(format!(
                    "finished request {} still holds blocks",
                    g.request_id
                ));
            }
            let outs = match g.shape {
                GroupShape::Samples(_) => {
                    let mut outs: Vec<(usize, Vec<u32>)> = g
                        .seqs
                        .iter()
                        .map(|s| (s.index, s.output_ids().to_vec()))
                        .collect();
                    outs.sort();
                    outs.into_iter().map(|o| o.1).collect()
                }
                GroupShape::Beams(_) => {
                    let mut all: Vec<(Vec<u32>, f64)> = g.data.ended.clone();
                    all.extend(g.seqs.iter().map(|s| (s.output_ids().to_vec(), s.data)));
                    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    all.into_iter().map(|a| a.0).collect()
                }
            };
            self.outcomes.insert(g.request_id, Outcome::Finished(outs));
        }
        Ok(())
    }
}

/// A sample's next token and whether it ends the sample.
fn next_sample(req: &Req, index: usize, history: &[u32], prompt_len: usize) -> NextTokenOf {
    let t = draw(req.seed, index as u64, history, 0) % VOCAB;
    let finish = if !req.ignore_eos && t < EOS_BELOW {
        Some(FinishReason::Stop)
    } else if history.len() + 1 - prompt_len >= req.max_tokens {
        Some(FinishReason::Length)
    } else {
        None
    };
    (t as u32, finish)
}

type NextTokenOf = (u32, Option<FinishReason>);

/// Parallel samples: each sequence that sampled draws its next token; the first time, a
/// group of `n > 1` also draws for its `n - 1` forks, from the shared history.
fn sample(
    g: &SequenceGroup<Score, Side>,
    n: usize,
    seqs: &[(usize, usize)],
) -> SampleOutcome<Score> {
    let req = &g.data.req;
    let tokens = seqs
        .iter()
        .map(|&(si, proposed)| {
            let s = &g.seqs[si];
            // Verification: draw from each row in turn; a proposal is accepted while the
            // draw equals it, the first that does not (or that ends the sample) is last.
            let mut h = s.tokens.clone();
            for j in 0..=proposed {
                let (token, finish) = next_sample(req, s.index, &h, s.prompt_len);
                if finish.is_some() || j == proposed || s.proposed[j] != token {
                    return NextToken {
                        seq: si,
                        accepted: j,
                        token,
                        finish,
                    };
                }
                h.push(token);
            }
            unreachable!("the last row always ends verification")
        })
        .collect();
    let mut forks = Vec::new();
    if !g.forked && n > 1 {
        let s = &g.seqs[seqs[0].0];
        for index in 1..n {
            let (token, finish) = next_sample(req, index, &s.tokens, s.prompt_len);
            forks.push(Fork {
                index,
                token,
                finish,
                data: 0.0,
            });
        }
    }
    SampleOutcome::Tokens { tokens, forks }
}

/// Each live beam proposes two continuations; the best `width` survive, and a
/// continuation whose token is an "EOS" ends its hypothesis.
fn beam_step(
    g: &mut SequenceGroup<Score, Side>,
    width: usize,
    seqs: &[usize],
) -> SampleOutcome<Score> {
    let (seed, max_tokens, eos) = (
        g.data.req.seed,
        g.data.req.max_tokens,
        !g.data.req.ignore_eos,
    );
    let mut cands: Vec<(f64, usize, u32)> = Vec::new();
    for &si in seqs {
        let s = &g.seqs[si];
        for k in 0..2 {
            let h = draw(seed, 0, &s.tokens, k);
            let lp = -((h >> 40) as f64) / (1u64 << 24) as f64;
            cands.push((s.data + lp, si, (h % VOCAB) as u32));
        }
    }
    cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    cands.truncate(width);
    let mut children = Vec::new();
    for &(score, parent, token) in &cands {
        if eos && (token as u64) < EOS_BELOW {
            let mut toks = g.seqs[parent].output_ids().to_vec();
            toks.push(token);
            g.data.ended.push((toks, score));
        } else {
            children.push(BeamChild {
                parent,
                token,
                data: score,
            });
        }
    }
    let s = &g.seqs[seqs[0]];
    let done = s.tokens.len() + 1 - s.prompt_len >= max_tokens;
    SampleOutcome::Beams { children, done }
}
