//! A stand-in for the engine around the real `Scheduler` and `BlockManager`, with no GPU:
//! the "forward pass" marks tokens computed, and "sampling" draws each next token from a
//! hash of the sequence's own history, so a request's output depends on nothing but the
//! request. Preemption, batching or pool size must therefore never change it; the driver
//! checks the scheduler's promises after every step and returns the first one broken.

#![allow(dead_code)]

use pagellm::cache::{BlockManager, CacheConfig, SeqId};
use pagellm::engine::scheduler::{Groups, Scheduler, SchedulerOutput};
use pagellm::engine::sequence::{GroupShape, GroupState, Sequence, SequenceGroup};
use pagellm::engine::{EngineConfig, FinishReason, RequestId};
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
    pub sched: Scheduler,
    pub groups: Groups<Score, Side>,
    pub outcomes: BTreeMap<RequestId, Outcome>,
    pub steps: u64,
    pub tokens_computed: u64,
    next_seq: u64,
    /// Consecutive steps in which nothing was computed and no block moved.
    idle: u32,
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
        let blocks = BlockManager::new(cache).expect("valid cache configuration");
        Driver {
            sched: Scheduler::new(config, blocks),
            groups: HashMap::new(),
            outcomes: BTreeMap::new(),
            steps: 0,
            tokens_computed: 0,
            next_seq: 0,
            idle: 0,
        }
    }

    pub fn add(&mut self, id: RequestId, req: Req) {
        self.next_seq += 1;
        let first = Sequence::new(SeqId(self.next_seq), 0, &req.prompt, 0.0);
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
        self.groups.insert(id, g);
        self.sched.add(id);
    }

    pub fn abort(&mut self, id: RequestId) {
        if self.groups.contains_key(&id) {
            self.sched.remove(id, &self.groups);
            self.groups.remove(&id);
            self.outcomes.insert(id, Outcome::Aborted);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.groups.is_empty()
    }

    /// One step: schedule, check, "compute", sample. Errors name the broken promise.
    pub fn step(&mut self) -> Result<SchedulerOutput, String> {
        self.steps += 1;
        let oldest = self.oldest_running_decode();
        let out = self
            .sched
            .schedule(&mut self.groups)
            .map_err(|e| format!("step {}: schedule failed: {e}", self.steps))?;
        for (id, reason) in &out.failed {
            if reason.is_empty() {
                return Err(format!("request {id} failed without a reason"));
            }
            if self.groups.remove(id).is_none() {
                return Err(format!("request {id} failed but was not pending"));
            }
            if self.sched.contains(*id) {
                return Err(format!("failed request {id} is still queued"));
            }
            self.outcomes.insert(*id, Outcome::Failed(reason.clone()));
        }
        // Progress by age: the oldest running decode is served first, so it computes in
        // every step unless it failed or was itself preempted.
        if let Some(id) = oldest {
            let running = self
                .groups
                .get(&id)
                .is_some_and(|g| g.state == GroupState::Running);
            if running && !out.scheduled.iter().any(|s| s.request_id == id) {
                return Err(format!(
                    "step {}: the oldest running decode {id} was not served",
                    self.steps
                ));
            }
        }
        self.check_step(&out)
            .map_err(|e| format!("step {}: {e}", self.steps))?;
        self.sched
            .blocks
            .check_invariants()
            .map_err(|e| format!("step {}: block manager: {e}", self.steps))?;
        let bm = &self.sched.blocks;
        if bm.num_used_device_blocks() != bm.stats().device.used {
            return Err(format!(
                "step {}: used-block count disagrees with stats",
                self.steps
            ));
        }
        if out.scheduled.is_empty() && out.ops.is_empty() && !self.groups.is_empty() {
            self.idle += 1;
            if self.idle > 2 {
                return Err(format!(
                    "step {}: {} requests pending, nothing scheduled for 3 steps",
                    self.steps,
                    self.groups.len()
                ));
            }
        } else {
            self.idle = 0;
        }
        self.compute(&out);
        Ok(out)
    }

    /// The oldest running group that decodes (with `decode_first` off, the oldest running
    /// group), if its width fits the budget.
    fn oldest_running_decode(&self) -> Option<RequestId> {
        let cfg = &self.sched.config;
        self.groups
            .values()
            .filter(|g| g.state == GroupState::Running)
            .min_by_key(|g| g.arrival)
            .filter(|g| {
                (g.is_decoding() || !cfg.decode_first)
                    && g.shape.width() <= cfg.max_num_batched_tokens
            })
            .filter(|g| cfg.decode_first || g.is_decoding())
            .map(|g| g.request_id)
    }

    /// Runs until every request has ended, at most `max_steps` steps.
    pub fn run(&mut self, max_steps: u64) -> Result<(), String> {
        let start = self.steps;
        while !self.is_idle() {
            if self.steps - start >= max_steps {
                return Err(format!(
                    "liveness: {} requests still pending after {max_steps} steps",
                    self.groups.len()
                ));
            }
            self.step()?;
        }
        Ok(())
    }

    /// Everything is back: no sequence in the block manager, no used device or host block.
    pub fn check_drained(&self) -> Result<(), String> {
        let st = self.sched.blocks.stats();
        if st.device.used != 0 || st.host.used != 0 || self.sched.blocks.sequences().count() != 0 {
            return Err(format!("leak after all requests ended: {st:?}"));
        }
        if self.sched.num_waiting() + self.sched.num_running() + self.sched.num_swapped() != 0 {
            return Err("the scheduler still queues ended requests".into());
        }
        self.sched.blocks.check_invariants()
    }

    fn check_step(&mut self, out: &SchedulerOutput) -> Result<(), String> {
        let cfg = &self.sched.config;
        let mut seen = HashSet::new();
        let mut tokens = 0;
        let mut rows = 0;
        let mut by_group: BTreeMap<RequestId, Vec<(usize, bool)>> = BTreeMap::new();
        for s in &out.scheduled {
            if !seen.insert(s.id) {
                return Err(format!("{} scheduled twice", s.id));
            }
            let g = self
                .groups
                .get(&s.request_id)
                .ok_or_else(|| format!("request {} scheduled but unknown", s.request_id))?;
            if g.state != GroupState::Running {
                return Err(format!(
                    "request {} scheduled while {:?}",
                    s.request_id, g.state
                ));
            }
            let seq = &g.seqs[s.seq];
            if seq.id != s.id || seq.is_finished() {
                return Err(format!("{} is not a live sequence of its group", s.id));
            }
            if s.len == 0 || s.start != seq.num_computed || s.start + s.len > seq.tokens.len() {
                return Err(format!(
                    "{}: bad range {}+{} of {:?}",
                    s.id,
                    s.start,
                    s.len,
                    seq.tokens.len()
                ));
            }
            if s.sample != (s.start + s.len == seq.tokens.len()) {
                return Err(format!("{}: sample flag wrong", s.id));
            }
            let bm = &self.sched.blocks;
            if bm.num_tokens(s.id).ok() != Some(seq.tokens.len()) {
                return Err(format!("{}: tokens without slots", s.id));
            }
            let table = bm.block_table(s.id).map_err(|e| e.to_string())?;
            if table.len() != seq.tokens.len().div_ceil(bm.block_size()) {
                return Err(format!("{}: block table does not cover its tokens", s.id));
            }
            tokens += s.len;
            rows += s.sample as usize;
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
        let running: Vec<&SequenceGroup<Score, Side>> = self
            .groups
            .values()
            .filter(|g| g.state == GroupState::Running)
            .collect();
        let live: usize = running.iter().map(|g| g.live().count()).sum();
        let slots: usize = running.iter().map(|g| g.slots()).sum();
        if live > cfg.max_num_seqs || slots > cfg.max_num_seqs || rows > cfg.max_num_seqs {
            return Err(format!(
                "{live} live sequences, {slots} slots, {rows} rows over max_num_seqs {}",
                cfg.max_num_seqs
            ));
        }
        for g in &running {
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
            // when it waits for blocks it cannot have now.
            if g.is_decoding() && got.is_none() && cfg.decode_first {
                let k = live.len();
                let bm = &self.sched.blocks;
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

    /// The "forward pass" and sampling.
    fn compute(&mut self, out: &SchedulerOutput) {
        let mut sampled: Vec<(RequestId, Vec<usize>)> = Vec::new();
        for s in &out.scheduled {
            let g = self.groups.get_mut(&s.request_id).expect("checked");
            let seq = &mut g.seqs[s.seq];
            seq.num_computed = s.start + s.len;
            self.sched
                .blocks
                .mark_computed(s.id, seq.num_computed)
                .expect("marking computed tokens");
            self.tokens_computed += s.len as u64;
            if s.sample {
                match sampled.last_mut() {
                    Some((id, v)) if *id == s.request_id => v.push(s.seq),
                    _ => sampled.push((s.request_id, vec![s.seq])),
                }
            }
        }
        for (id, seqs) in sampled {
            match self.groups[&id].shape {
                GroupShape::Samples(_) => self.sample(id, seqs),
                GroupShape::Beams(_) => self.beam_step(id, seqs),
            }
        }
    }

    fn sample(&mut self, id: RequestId, mut seqs: Vec<usize>) {
        let g = self.groups.get_mut(&id).expect("sampled group");
        let GroupShape::Samples(n) = g.shape else {
            unreachable!()
        };
        if !g.forked && n > 1 {
            for index in 1..n {
                self.next_seq += 1;
                let si = self
                    .sched
                    .fork_seq(g, seqs[0], SeqId(self.next_seq))
                    .expect("fork");
                g.seqs[si].index = index;
                seqs.push(si);
            }
        }
        g.forked = true;
        let (seed, max_tokens, eos) = (
            g.data.req.seed,
            g.data.req.max_tokens,
            !g.data.req.ignore_eos,
        );
        for si in seqs {
            let s = &mut g.seqs[si];
            let t = draw(seed, s.index as u64, &s.tokens, 0) % VOCAB;
            s.tokens.push(t as u32);
            if eos && t < EOS_BELOW {
                s.finish = Some(FinishReason::Stop);
            } else if s.tokens.len() - s.prompt_len >= max_tokens {
                s.finish = Some(FinishReason::Length);
            }
            if s.is_finished() {
                self.sched.free_seq(s.id);
            }
        }
        if g.is_finished() {
            let mut outs: Vec<(usize, Vec<u32>)> = g
                .seqs
                .iter()
                .map(|s| (s.index, s.output_ids().to_vec()))
                .collect();
            outs.sort();
            self.finish(id, outs.into_iter().map(|o| o.1).collect());
        }
    }

    /// Each live beam proposes two continuations; the best `width` survive, and a
    /// continuation whose token is an "EOS" ends its hypothesis.
    fn beam_step(&mut self, id: RequestId, seqs: Vec<usize>) {
        let g = self.groups.get_mut(&id).expect("beam group");
        let GroupShape::Beams(width) = g.shape else {
            unreachable!()
        };
        let (seed, max_tokens, eos) = (
            g.data.req.seed,
            g.data.req.max_tokens,
            !g.data.req.ignore_eos,
        );
        let mut cands: Vec<(f64, usize, u32)> = Vec::new();
        for (p, &si) in seqs.iter().enumerate() {
            let s = &g.seqs[si];
            for k in 0..2 {
                let h = draw(seed, 0, &s.tokens, k);
                let lp = -((h >> 40) as f64) / (1u64 << 24) as f64;
                cands.push((s.data + lp, p, (h % VOCAB) as u32));
            }
        }
        cands.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        cands.truncate(width);
        let mut kids = Vec::new();
        let mut scores = Vec::new();
        for &(score, p, t) in &cands {
            if eos && (t as u64) < EOS_BELOW {
                let mut toks = g.seqs[seqs[p]].output_ids().to_vec();
                toks.push(t);
                g.data.ended.push((toks, score));
            } else {
                kids.push((p, t));
                scores.push(score);
            }
        }
        let mut next = self.next_seq;
        self.sched
            .replace_beams(g, &seqs, &kids, || {
                next += 1;
                SeqId(next)
            })
            .expect("replace beams");
        self.next_seq = next;
        for (s, sc) in g.seqs.iter_mut().zip(scores) {
            s.data = sc;
        }
        let done = g.seqs.is_empty() || g.seqs[0].tokens.len() - g.seqs[0].prompt_len >= max_tokens;
        if done {
            let mut all: Vec<(Vec<u32>, f64)> = g.data.ended.clone();
            all.extend(g.seqs.iter().map(|s| (s.output_ids().to_vec(), s.data)));
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let outs = all.into_iter().map(|a| a.0).collect();
            self.finish(id, outs);
        }
    }

    fn finish(&mut self, id: RequestId, outs: Vec<Vec<u32>>) {
        self.sched.remove(id, &self.groups);
        self.groups.remove(&id);
        self.outcomes.insert(id, Outcome::Finished(outs));
    }
}
