//! Counters for `/metrics` (Prometheus text format).

use crate::events::Done;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The daemon's counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    tokens: AtomicU64,
    decode_micros: AtomicU64,
    last_tok_s_milli: AtomicU64,
    batch: AtomicU64,
    /// Prompt-lookup drafts verified, and confirmed.
    drafted: AtomicU64,
    accepted: AtomicU64,
    rounds: AtomicU64,
    runs: Mutex<BTreeMap<String, u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// In front of an upstream: its requests in flight, and the bound.
    upstream: std::sync::OnceLock<(std::sync::Arc<std::sync::atomic::AtomicUsize>, usize)>,
}

/// A label value in Prometheus' text format: `\\`, `"` and newlines
/// escaped.
pub(crate) fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    pub(crate) fn request(&self, route: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_owned(), status)).or_default() += 1;
        }
    }

    pub(crate) fn tokens(&self, n: usize, took: Duration) {
        self.tokens.fetch_add(n as u64, Ordering::Relaxed);
        self.decode_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if took.as_secs_f64() > 0.0 {
            self.last_tok_s_milli
                .store((n as f64 / took.as_secs_f64() * 1000.0) as u64, Ordering::Relaxed);
        }
    }

    /// A completion's prompt-lookup drafts: verified, and confirmed.
    pub(crate) fn drafts(&self, drafted: usize, accepted: usize) {
        self.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// Completions decoding together in the engine's current step.
    pub(crate) fn batch(&self, n: usize) {
        self.batch.store(n as u64, Ordering::Relaxed);
    }

    /// A chat completion failed (an upstream's failures keep their
    /// classification: quota, transient, unavailable).
    pub(crate) fn error(&self, classification: &str) {
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(classification.to_owned()).or_default() += 1;
        }
    }

    /// Reports the upstream's requests in flight (`in_flight`) under `max`.
    pub(crate) fn upstream(
        &self,
        in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        max: usize,
    ) {
        let _ = self.upstream.set((in_flight, max));
    }

    pub(crate) fn research(&self, d: &Done) {
        self.rounds.fetch_add(d.rounds as u64, Ordering::Relaxed);
        if let Ok(mut m) = self.runs.lock() {
            *m.entry(d.outcome.as_str().to_owned()).or_default() += 1;
        }
        if let (Some(e), Ok(mut m)) = (&d.error, self.errors.lock()) {
            *m.entry(e.classification.clone()).or_default() += 1;
        }
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self, queue_depth: usize, queue_capacity: usize) -> String {
        let mut s = String::new();
        s.push_str("# HELP agentd_http_requests_total HTTP requests by route and status.\n# TYPE agentd_http_requests_total counter\n");
        if let Ok(m) = self.requests.lock() {
            for ((route, status), n) in m.iter() {
                let route = label(route);
                s.push_str(&format!(
                    "agentd_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}\n"
                ));
            }
        }
        let tokens = self.tokens.load(Ordering::Relaxed);
        let micros = self.decode_micros.load(Ordering::Relaxed);
        s.push_str("# HELP agentd_generated_tokens_total Tokens generated.\n# TYPE agentd_generated_tokens_total counter\n");
        s.push_str(&format!("agentd_generated_tokens_total {tokens}\n"));
        s.push_str("# HELP agentd_tokens_per_second Generation speed of the last completion.\n# TYPE agentd_tokens_per_second gauge\n");
        s.push_str(&format!(
            "agentd_tokens_per_second {:.3}\n",
            self.last_tok_s_milli.load(Ordering::Relaxed) as f64 / 1000.0
        ));
        s.push_str("# HELP agentd_decode_batch Chat completions decoding together (one batched pass per token).\n# TYPE agentd_decode_batch gauge\n");
        s.push_str(&format!("agentd_decode_batch {}\n", self.batch.load(Ordering::Relaxed)));
        s.push_str("# HELP agentd_generation_seconds_total Time spent generating, summed over completions (concurrent ones overlap).\n# TYPE agentd_generation_seconds_total counter\n");
        s.push_str(&format!("agentd_generation_seconds_total {:.3}\n", micros as f64 / 1e6));
        s.push_str("# HELP agentd_draft_tokens_total Draft tokens verified (prompt lookup or a draft model).\n# TYPE agentd_draft_tokens_total counter\n");
        s.push_str(&format!(
            "agentd_draft_tokens_total {}\n",
            self.drafted.load(Ordering::Relaxed)
        ));
        s.push_str("# HELP agentd_draft_accepted_total Draft tokens sampling confirmed (each saved a decode pass).\n# TYPE agentd_draft_accepted_total counter\n");
        s.push_str(&format!(
            "agentd_draft_accepted_total {}\n",
            self.accepted.load(Ordering::Relaxed)
        ));
        s.push_str("# HELP agentd_queue_depth Requests waiting for the model.\n# TYPE agentd_queue_depth gauge\n");
        s.push_str(&format!(
            "agentd_queue_depth {queue_depth}\nagentd_queue_capacity {queue_capacity}\n"
        ));
        if let Some((n, max)) = self.upstream.get() {
            s.push_str("# HELP agentd_upstream_in_flight Requests in flight to the upstream engine (at most agentd_upstream_concurrency).\n# TYPE agentd_upstream_in_flight gauge\n");
            s.push_str(&format!(
                "agentd_upstream_in_flight {}\nagentd_upstream_concurrency {max}\n",
                n.load(Ordering::Relaxed)
            ));
        }
        s.push_str("# HELP agentd_research_rounds_total Tool research rounds run.\n# TYPE agentd_research_rounds_total counter\n");
        s.push_str(&format!(
            "agentd_research_rounds_total {}\n",
            self.rounds.load(Ordering::Relaxed)
        ));
        s.push_str("# HELP agentd_research_runs_total Research replies by outcome (excerpt and spoken_fallback are fallbacks).\n# TYPE agentd_research_runs_total counter\n");
        if let Ok(m) = self.runs.lock() {
            for (o, n) in m.iter() {
                s.push_str(&format!("agentd_research_runs_total{{outcome=\"{o}\"}} {n}\n"));
            }
        }
        s.push_str("# HELP agentd_errors_total Errors by classification.\n# TYPE agentd_errors_total counter\n");
        if let Ok(m) = self.errors.lock() {
            for (c, n) in m.iter() {
                s.push_str(&format!("agentd_errors_total{{classification=\"{c}\"}} {n}\n"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped() {
        assert_eq!(super::label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(super::label("x\ny"), "x\\ny");
    }
}
