//! Counters and the request-duration histogram, rendered as Prometheus text for `/metrics`.
//!
//! Sources are known at startup, so every series is allocated once and a request only bumps
//! atomics. Requests to an unknown source count under `source="_unknown"`: a label taken from
//! the URL would let anyone create series without bound.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::ids::SourceName;

/// The label requests to unconfigured sources are counted under.
pub const UNKNOWN_SOURCE: &str = "_unknown";

/// How a webhook request ended, as `hookbox_webhooks_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A first delivery, processed and stored.
    Processed,
    /// A later delivery answered with the stored response.
    Replayed,
    /// Answered 4xx.
    Rejected,
    /// Answered 5xx.
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Processed,
        Outcome::Replayed,
        Outcome::Rejected,
        Outcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Replayed => "replayed",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
        }
    }
}

/// Upper bounds of the duration buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default)]
struct Series {
    outcomes: [AtomicU64; 4],
    purged: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

/// The process's metrics.
pub struct Metrics {
    labels: Vec<String>,
    index: HashMap<String, usize>,
    series: Vec<Series>,
    /// Unix seconds when the last purge pass completed; 0 before the first.
    last_purge: AtomicU64,
}

impl Metrics {
    /// Allocates the series for these sources (and the unknown-source bucket).
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a SourceName>) -> Self {
        let mut labels: Vec<String> = sources.into_iter().map(|s| s.as_str().to_owned()).collect();
        labels.push(UNKNOWN_SOURCE.to_owned());
        let index = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), i))
            .collect();
        let series = labels.iter().map(|_| Series::default()).collect();
        Metrics {
            labels,
            index,
            series,
            last_purge: AtomicU64::new(0),
        }
    }

    fn series(&self, source: &str) -> &Series {
        let i = self
            .index
            .get(source)
            .or_else(|| self.index.get(UNKNOWN_SOURCE))
            .copied()
            .expect("the unknown-source series always exists");
        &self.series[i]
    }

    /// Counts what a purge pass removed, by source, and when it completed if it did (a pass
    /// cut short by shutdown did not).
    pub fn record_purge<'a>(
        &self,
        removed: impl IntoIterator<Item = (&'a String, &'a u64)>,
        completed: bool,
    ) {
        for (source, n) in removed {
            self.series(source).purged.fetch_add(*n, Ordering::Relaxed);
        }
        if !completed {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last_purge.store(now, Ordering::Relaxed);
    }

    /// Counts one webhook request to `source` (a configured name or [`UNKNOWN_SOURCE`]).
    pub fn record(&self, source: &str, outcome: Outcome, elapsed: Duration) {
        let series = self.series(source);
        let slot = Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is in ALL");
        series.outcomes[slot].fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&series.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        series.count.fetch_add(1, Ordering::Relaxed);
        series.sum_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP hookbox_webhooks_total Webhook requests by source and outcome.\n");
        out.push_str("# TYPE hookbox_webhooks_total counter\n");
        for (label, series) in self.labels.iter().zip(&self.series) {
            for (outcome, count) in Outcome::ALL.iter().zip(&series.outcomes) {
                let _ = writeln!(
                    out,
                    "hookbox_webhooks_total{{source=\"{label}\",outcome=\"{}\"}} {}",
                    outcome.label(),
                    count.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str(
            "# HELP hookbox_webhook_duration_seconds Time from request to answer for webhook requests.\n",
        );
        out.push_str("# TYPE hookbox_webhook_duration_seconds histogram\n");
        for (label, series) in self.labels.iter().zip(&self.series) {
            for (bound, bucket) in BUCKETS.iter().zip(&series.buckets) {
                let _ = writeln!(
                    out,
                    "hookbox_webhook_duration_seconds_bucket{{source=\"{label}\",le=\"{bound}\"}} {}",
                    bucket.load(Ordering::Relaxed)
                );
            }
            let count = series.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "hookbox_webhook_duration_seconds_bucket{{source=\"{label}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                out,
                "hookbox_webhook_duration_seconds_sum{{source=\"{label}\"}} {}",
                series.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "hookbox_webhook_duration_seconds_count{{source=\"{label}\"}} {count}"
            );
        }
        out.push_str("# HELP hookbox_purged_total Events removed by the retention purge.\n");
        out.push_str("# TYPE hookbox_purged_total counter\n");
        for (label, series) in self.labels.iter().zip(&self.series) {
            let _ = writeln!(
                out,
                "hookbox_purged_total{{source=\"{label}\"}} {}",
                series.purged.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP hookbox_last_purge_timestamp_seconds When the last purge pass completed (0: none yet).\n");
        out.push_str("# TYPE hookbox_last_purge_timestamp_seconds gauge\n");
        let _ = writeln!(
            out,
            "hookbox_last_purge_timestamp_seconds {}",
            self.last_purge.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_source_and_outcome_and_buckets_durations() {
        let stripe = SourceName::try_from("stripe").expect("valid name");
        let metrics = Metrics::new([&stripe]);
        metrics.record("stripe", Outcome::Processed, Duration::from_millis(3));
        metrics.record("stripe", Outcome::Replayed, Duration::from_millis(30));
        metrics.record("nope", Outcome::Rejected, Duration::from_micros(10));
        let text = metrics.render();
        assert!(text.contains("hookbox_webhooks_total{source=\"stripe\",outcome=\"processed\"} 1"));
        assert!(text.contains("hookbox_webhooks_total{source=\"stripe\",outcome=\"replayed\"} 1"));
        assert!(text.contains("hookbox_webhooks_total{source=\"_unknown\",outcome=\"rejected\"} 1"));
        assert!(text
            .contains("hookbox_webhook_duration_seconds_bucket{source=\"stripe\",le=\"0.005\"} 1"));
        assert!(text
            .contains("hookbox_webhook_duration_seconds_bucket{source=\"stripe\",le=\"0.05\"} 2"));
        assert!(text.contains("hookbox_webhook_duration_seconds_count{source=\"stripe\"} 2"));
        assert!(text.contains("hookbox_last_purge_timestamp_seconds 0"));
        let removed =
            std::collections::BTreeMap::from([("stripe".to_owned(), 3u64), ("gone".to_owned(), 2)]);
        metrics.record_purge(&removed, true);
        let text = metrics.render();
        assert!(text.contains("hookbox_purged_total{source=\"stripe\"} 3"));
        assert!(text.contains("hookbox_purged_total{source=\"_unknown\"} 2"));
        assert!(!text.contains("hookbox_last_purge_timestamp_seconds 0\n"));
    }
}
