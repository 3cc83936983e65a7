//! `/metrics` in the Prometheus text format: requests, tokens, time to first token, decode rate,
//! queue, expert-cache hits and bytes read.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use strata_runtime::Engine;

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub engine_errors: AtomicU64,
    pub queued: AtomicU64,
    pub running: AtomicU64,
    /// Decoding-state positions the running sequences hold.
    pub reserved_positions: AtomicU64,
    /// Sequences that began from the prefix cache, and the prompt tokens it gave them.
    pub prefix_hits: AtomicU64,
    pub prefix_tokens: AtomicU64,
    /// Bytes the prefix cache holds.
    pub prefix_bytes: AtomicU64,
    pub prefix_disk_bytes: AtomicU64,
    pub prefix_disk_hits: AtomicU64,
    /// (sum seconds, count) of time to first token.
    ttft: Mutex<(f64, u64)>,
    /// (busy seconds, tokens) of decode steps.
    steps: Mutex<(f64, u64)>,
}

impl Metrics {
    pub fn observe_ttft(&self, s: f64) {
        let mut t = self.ttft.lock().expect("metrics lock");
        t.0 += s;
        t.1 += 1;
    }

    pub fn observe_step(&self, s: f64, tokens: u64) {
        let mut t = self.steps.lock().expect("metrics lock");
        t.0 += s;
        t.1 += tokens;
    }

    pub fn render(&self, engine: &Engine) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP strata_{name} {help}\n# TYPE strata_{name} {kind}\nstrata_{name} {value}"
            );
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            "requests_total",
            "counter",
            "HTTP completion requests received.",
            get(&self.requests),
        );
        metric(
            "requests_failed_total",
            "counter",
            "Completion requests answered with an error.",
            get(&self.requests_failed),
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests (strata_prefix_cache_tokens_total of them came from the prefix cache).",
            get(&self.prompt_tokens),
        );
        metric(
            "generation_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generated_tokens),
        );
        metric(
            "cancelled_total",
            "counter",
            "Sequences stopped because their client went away.",
            get(&self.cancelled),
        );
        metric(
            "engine_errors_total",
            "counter",
            "Sequences that failed in the engine (each ended alone).",
            get(&self.engine_errors),
        );
        metric(
            "queue_length",
            "gauge",
            "Sequences waiting to join the batch.",
            get(&self.queued),
        );
        metric(
            "running_sequences",
            "gauge",
            "Sequences in the batch.",
            get(&self.running),
        );
        metric(
            "state_positions_reserved",
            "gauge",
            "Decoding-state positions the running sequences hold (prompt + max_tokens each).",
            get(&self.reserved_positions),
        );
        metric(
            "prefix_cache_hits_total",
            "counter",
            "Sequences that began from the prefix cache (a cached prefix of their prompt).",
            get(&self.prefix_hits),
        );
        metric(
            "prefix_cache_tokens_total",
            "counter",
            "Prompt tokens taken from the prefix cache instead of processed.",
            get(&self.prefix_tokens),
        );
        metric(
            "prefix_cache_bytes",
            "gauge",
            "Bytes of decoding state the prefix cache holds (--prefix-cache bounds it).",
            get(&self.prefix_bytes),
        );
        metric(
            "prefix_cache_disk_bytes",
            "gauge",
            "Bytes of decoding state the prefix cache's disk tier holds (--prefix-cache-disk bounds it).",
            get(&self.prefix_disk_bytes),
        );
        metric(
            "prefix_cache_disk_hits_total",
            "counter",
            "Sequences that began from a state read back from the prefix cache's disk tier.",
            get(&self.prefix_disk_hits),
        );
        metric(
            "state_positions_total",
            "gauge",
            "Decoding-state positions all sequences share (--state-tokens).",
            engine.memory.state_tokens as f64,
        );
        let (ttft_sum, ttft_n) = *self.ttft.lock().expect("metrics lock");
        let _ = writeln!(
            out,
            "# HELP strata_time_to_first_token_seconds Time from arrival to the first token.\n# TYPE strata_time_to_first_token_seconds summary\nstrata_time_to_first_token_seconds_sum {ttft_sum}\nstrata_time_to_first_token_seconds_count {ttft_n}"
        );
        let (busy, tokens) = *self.steps.lock().expect("metrics lock");
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP strata_{name} {help}\n# TYPE strata_{name} {kind}\nstrata_{name} {value}"
            );
        };
        metric(
            "tokens_per_second",
            "gauge",
            "Tokens generated per second of engine time, all sequences together.",
            if busy > 0.0 { tokens as f64 / busy } else { 0.0 },
        );
        if let Some(store) = &engine.experts {
            let s = store.stats.snapshot();
            metric(
                "expert_cache_hits_total",
                "counter",
                "Routed experts found in the RAM cache.",
                s[0] as f64,
            );
            metric(
                "expert_cache_misses_total",
                "counter",
                "Routed experts read from disk.",
                s[1] as f64,
            );
            metric(
                "expert_bytes_read_total",
                "counter",
                "Expert bytes read from disk.",
                s[2] as f64,
            );
        }
        out
    }
}
