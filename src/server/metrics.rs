//! `GET /metrics`: Prometheus text exposition (through the `prometheus-client` crate).
//! Engine figures come from the engine thread's latest statistics; latencies and token
//! counts from the handlers (`timing.rs`). Names follow vLLM's, under `pagellm_`.

use crate::engine::EngineStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: &'static str,
}

/// Which bytes of the model's weights: all, a mixture's experts, what one token reads.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WeightLabel {
    pub part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CutLabel {
    pub kind: &'static str,
}

/// The kinds of connection and request the server cuts or refuses to protect itself from a
/// client (the `kind` label of `pagellm_http_cuts_total`).
pub mod cut {
    /// A request head not complete within `--header-timeout-secs` (an idle keep-alive
    /// connection included).
    pub const HEAD_DEADLINE: &str = "head_deadline";
    /// A request body that paused for `--body-timeout-secs`.
    pub const BODY_STALL: &str = "body_stall";
    /// A request body not complete within `--body-deadline-secs`.
    pub const BODY_DEADLINE: &str = "body_deadline";
    /// A request body slower than `--min-body-rate`.
    pub const BODY_RATE: &str = "body_rate";
    /// A response that could not be written for `--write-timeout-secs` (a client that
    /// stopped reading).
    pub const WRITE_STALL: &str = "write_stall";
    /// A connection waiting for a request head, closed to let a new one in at
    /// `--max-connections` (or at its peer's limit).
    pub const EVICTED: &str = "evicted";
    /// A connection refused at `--max-connections-per-peer`.
    pub const PEER_CONNECTIONS: &str = "peer_connections";
    /// A request refused at `--max-queued-per-peer`.
    pub const PEER_QUEUE: &str = "peer_queue";
    /// Every kind, for exporting zeros before the first cut.
    pub const ALL: [&str; 8] = [
        HEAD_DEADLINE,
        BODY_STALL,
        BODY_DEADLINE,
        BODY_RATE,
        WRITE_STALL,
        EVICTED,
        PEER_CONNECTIONS,
        PEER_QUEUE,
    ];
}

pub struct Metrics {
    registry: Registry,
    running: Gauge,
    waiting: Gauge,
    swapped: Gauge,
    kv_usage: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    kv_bytes_per_token: Gauge<f64, AtomicU64>,
    kv_capacity_tokens: Gauge,
    weight_bytes: Family<WeightLabel, Gauge>,
    preemptions: Family<ModeLabel, Counter>,
    prefix_queries: Counter,
    prefix_hits: Counter,
    tier_hits: Family<TierLabel, Counter>,
    tier_evictions: Family<TierLabel, Counter>,
    tier_bytes: Family<TierLabel, Gauge>,
    abandoned: Counter,
    device_losses: Counter,
    device_recoveries: Counter,
    cuts: Family<CutLabel, Counter>,
    pub connections_open: Gauge,
    spec_drafts: Counter,
    spec_draft_tokens: Counter,
    spec_accepted_tokens: Counter,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_latency: Histogram,
    /// Engine counters as last exported, to turn totals into increments.
    last: Mutex<[u64; ENGINE_COUNTERS]>,
}

/// Engine totals [`Metrics::observe_engine`] turns into counter increments.
const ENGINE_COUNTERS: usize = 16;

fn seconds() -> impl Iterator<Item = f64> {
    // 1 ms to ~65 s.
    exponential_buckets(0.001, 2.0, 17)
}

impl Metrics {
    pub fn new() -> Self {
        let mut m = Metrics {
            running: Gauge::default(),
            waiting: Gauge::default(),
            swapped: Gauge::default(),
            kv_usage: Family::default(),
            kv_bytes_per_token: Gauge::default(),
            kv_capacity_tokens: Gauge::default(),
            weight_bytes: Family::default(),
            preemptions: Family::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            tier_hits: Family::default(),
            tier_evictions: Family::default(),
            tier_bytes: Family::default(),
            abandoned: Counter::default(),
            device_losses: Counter::default(),
            device_recoveries: Counter::default(),
            cuts: Family::default(),
            connections_open: Gauge::default(),
            spec_drafts: Counter::default(),
            spec_draft_tokens: Counter::default(),
            spec_accepted_tokens: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            time_to_first_token: Histogram::new(seconds()),
            inter_token_latency: Histogram::new(seconds()),
            e2e_latency: Histogram::new(seconds()),
            last: Mutex::new([0; ENGINE_COUNTERS]),
            registry: Registry::default(),
        };
        for kind in cut::ALL {
            let _ = m.cuts.get_or_create(&CutLabel { kind });
        }
        m.registry = m.registered();
        m
    }

    /// A registry exporting every metric under its Prometheus name (prefixed `pagellm_`).
    fn registered(&self) -> Registry {
        let mut registry = Registry::with_prefix("pagellm");
        macro_rules! register {
            ($($field:ident: $name:literal, $help:literal;)*) => {
                $(registry.register($name, $help, self.$field.clone());)*
            };
        }
        register! {
            running: "num_requests_running",
                "Requests running on the device";
            waiting: "num_requests_waiting",
                "Requests waiting for admission";
            swapped: "num_requests_swapped",
                "Requests swapped out to host memory";
            kv_usage: "kv_cache_usage_ratio",
                "Fraction of KV blocks in use, per pool";
            kv_bytes_per_token: "kv_cache_bytes_per_token",
                "Bytes of device KV cache one token takes, all layers, scales included";
            kv_capacity_tokens: "kv_cache_capacity_tokens",
                "Tokens the device KV pool holds when full";
            weight_bytes: "model_weight_bytes",
                "Bytes of the model's weights on the device: all, a mixture's experts, what one token reads";
            preemptions: "preemptions",
                "Preemptions by recovery mode";
            prefix_queries: "prefix_cache_queries",
                "Prompt blocks looked up in the prefix cache";
            prefix_hits: "prefix_cache_hits",
                "Prompt blocks found in the prefix cache";
            tier_hits: "prefix_cache_tier_hits",
                "Prompt blocks found per tier: device, host (copied up), disk (read into host)";
            tier_evictions: "prefix_cache_tier_evictions",
                "Cached blocks reclaimed for other data, per tier";
            tier_bytes: "prefix_cache_tier_bytes",
                "Bytes of cached prefix blocks not in use, per tier";
            abandoned: "requests_abandoned",
                "Requests aborted because the client went away";
            device_losses: "device_losses",
                "Times the GPU device was found lost while serving";
            device_recoveries: "device_recoveries",
                "Times the engine resumed its requests on a new device after a loss";
            cuts: "http_cuts",
                "Connections and requests cut or refused to protect the server, per kind";
            connections_open: "http_connections_open",
                "HTTP connections open";
            spec_drafts: "spec_decode_num_drafts",
                "Speculative decoding: sequence steps that verified proposed tokens";
            spec_draft_tokens: "spec_decode_num_draft_tokens",
                "Speculative decoding: proposed tokens verified";
            spec_accepted_tokens: "spec_decode_num_accepted_tokens",
                "Speculative decoding: proposed tokens accepted";
            prompt_tokens: "prompt_tokens",
                "Prompt tokens of finished requests";
            generation_tokens: "generation_tokens",
                "Generated tokens of finished requests";
            time_to_first_token: "time_to_first_token_seconds",
                "Time from arrival to the first token";
            inter_token_latency: "inter_token_latency_seconds",
                "Time between consecutive tokens of a sequence";
            e2e_latency: "e2e_request_latency_seconds",
                "Time from arrival to the last token";
        }
        registry
    }

    /// The model's weight bytes, by part.
    fn observe_weights(&self, w: &crate::model::gpu::WeightBytes) {
        for (part, bytes) in [
            ("total", w.total),
            ("experts", w.experts),
            ("active", w.active),
        ] {
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.weight_bytes
                .get_or_create(&WeightLabel { part })
                .set(bytes);
        }
    }

    /// Updates the engine figures from `s`.
    pub fn observe_engine(&self, s: &EngineStats) {
        self.kv_bytes_per_token.set(s.kv_bytes_per_token());
        self.kv_capacity_tokens.set(s.kv_pool_tokens() as i64);
        self.observe_weights(&s.weights);
        self.running.set(s.num_running as i64);
        self.waiting.set(s.num_waiting as i64);
        self.swapped.set(s.num_swapped as i64);
        let frac = |p: &crate::cache::PoolStats| {
            if p.total == 0 {
                0.0
            } else {
                p.used as f64 / p.total as f64
            }
        };
        self.kv_usage
            .get_or_create(&PoolLabel { pool: "device" })
            .set(frac(&s.cache.device));
        self.kv_usage
            .get_or_create(&PoolLabel { pool: "host" })
            .set(frac(&s.cache.host));
        let block = s.kv_layout.block_bytes_all_layers() as i64;
        let tier_bytes = [
            ("device", s.cache.device.cached as i64 * block),
            ("host", s.cache.host.cached as i64 * block),
            ("disk", s.disk.map_or(0, |d| d.bytes as i64)),
        ];
        for (tier, bytes) in tier_bytes {
            self.tier_bytes
                .get_or_create(&TierLabel { tier })
                .set(bytes);
        }
        self.count_engine(s);
    }

    /// Adds what the engine's totals in `s` grew by since the last call.
    fn count_engine(&self, s: &EngineStats) {
        let now: [u64; ENGINE_COUNTERS] = [
            s.scheduler.preempted_by_swap,
            s.scheduler.preempted_by_recompute,
            s.cache.prefix_hits + s.cache.prefix_misses,
            s.cache.prefix_hits,
            s.abandoned_requests,
            s.scheduler.spec_drafts,
            s.scheduler.spec_proposed,
            s.scheduler.spec_accepted,
            s.cache.prefix_hits - s.cache.host_tier.hits,
            s.cache.host_tier.hits,
            s.disk.map_or(0, |d| d.hits),
            s.cache.evictions,
            s.cache.host_tier.evictions,
            s.disk.map_or(0, |d| d.evictions),
            s.device.losses,
            s.device.recoveries,
        ];
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        // A scrape that read older statistics than the previous one adds nothing.
        let delta = |i: usize| now[i].saturating_sub(last[i]);
        self.preemptions
            .get_or_create(&ModeLabel { mode: "swap" })
            .inc_by(delta(0));
        self.preemptions
            .get_or_create(&ModeLabel { mode: "recompute" })
            .inc_by(delta(1));
        self.prefix_queries.inc_by(delta(2));
        self.prefix_hits.inc_by(delta(3));
        self.abandoned.inc_by(delta(4));
        self.spec_drafts.inc_by(delta(5));
        self.spec_draft_tokens.inc_by(delta(6));
        self.spec_accepted_tokens.inc_by(delta(7));
        for (i, tier) in ["device", "host", "disk"].into_iter().enumerate() {
            let label = TierLabel { tier };
            self.tier_hits.get_or_create(&label).inc_by(delta(8 + i));
            self.tier_evictions
                .get_or_create(&label)
                .inc_by(delta(11 + i));
        }
        self.device_losses.inc_by(delta(14));
        self.device_recoveries.inc_by(delta(15));
        for (l, n) in last.iter_mut().zip(now) {
            *l = (*l).max(n);
        }
    }

    /// Counts one cut of `kind` (one of [`cut::ALL`]).
    pub fn cut(&self, kind: &'static str) {
        self.cuts.get_or_create(&CutLabel { kind }).inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
