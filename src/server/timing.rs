//! Per-request latency as a client sees it, recorded into the server's histograms: time
//! to first token (from arrival to the first streamed token), the gap between consecutive
//! tokens of each sample, and end to end; and the request's prompt and generated tokens.

use super::metrics::Metrics;
use crate::engine::RequestOutput;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

pub struct Timing {
    metrics: Arc<Metrics>,
    start: Instant,
    first: bool,
    /// Per sample: when its last token came and how many came.
    last: HashMap<usize, (Instant, usize)>,
    streamed: usize,
}

impl Timing {
    pub fn start(metrics: &Arc<Metrics>) -> Self {
        Timing {
            metrics: metrics.clone(),
            start: Instant::now(),
            first: true,
            last: HashMap::new(),
            streamed: 0,
        }
    }

    /// A token of sample `index` arrived.
    pub fn token(&mut self, index: usize) {
        let now = Instant::now();
        if std::mem::take(&mut self.first) {
            self.metrics
                .time_to_first_token
                .observe((now - self.start).as_secs_f64());
        }
        let e = self.last.entry(index).or_insert((now, 0));
        if e.1 > 0 {
            self.metrics
                .inter_token_latency
                .observe((now - e.0).as_secs_f64());
        }
        *e = (now, e.1 + 1);
        self.streamed += 1;
    }

    /// Tokens sample `index` has streamed.
    pub fn tokens_of(&self, index: usize) -> usize {
        self.last.get(&index).map_or(0, |e| e.1)
    }

    /// Tokens streamed over all samples (beam search streams none).
    pub fn streamed(&self) -> usize {
        self.streamed
    }

    pub fn finish(&mut self, out: &RequestOutput) {
        self.metrics
            .e2e_latency
            .observe(self.start.elapsed().as_secs_f64());
        self.metrics
            .prompt_tokens
            .inc_by(out.prompt_token_ids.len() as u64);
        let generated: usize = out.outputs.iter().map(|o| o.token_ids.len()).sum();
        self.metrics.generation_tokens.inc_by(generated as u64);
    }
}
