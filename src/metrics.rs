//! Counters, gauges and histograms, rendered as Prometheus text for `/metrics`.
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
    /// A provider's handshake (Slack's `url_verification`), answered and not stored.
    Handshake,
    /// The connection ended before the body arrived: nothing to refuse, nothing stored.
    Incomplete,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Processed,
        Outcome::Replayed,
        Outcome::Rejected,
        Outcome::Failed,
        Outcome::Handshake,
        Outcome::Incomplete,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Replayed => "replayed",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
            Outcome::Handshake => "handshake",
            Outcome::Incomplete => "incomplete",
        }
    }
}

/// How one forward attempt ended, as `hookbox_forward_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardResult {
    /// The downstream answered 2xx.
    Delivered,
    /// The attempt failed and another is scheduled.
    Retried,
    /// The attempt failed and no other will be made (410, another 4xx, or out of attempts).
    Dead,
}

impl ForwardResult {
    const ALL: [ForwardResult; 3] = [
        ForwardResult::Delivered,
        ForwardResult::Retried,
        ForwardResult::Dead,
    ];

    fn label(self) -> &'static str {
        match self {
            ForwardResult::Delivered => "delivered",
            ForwardResult::Retried => "retried",
            ForwardResult::Dead => "dead",
        }
    }
}

/// Upper bounds of the duration buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the forward lag buckets, in seconds: from a dispatcher that keeps up
/// (milliseconds) through retries (seconds to minutes) to an outage (an hour).
const LAG_BUCKETS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    1800.0, 3600.0,
];

/// A histogram of durations with fixed bucket bounds.
struct Histogram {
    bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    /// A request or attempt duration histogram ([`BUCKETS`]).
    fn default() -> Self {
        Histogram::new(&BUCKETS)
    }
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bound, bucket) in self.bounds.iter().zip(self.buckets.iter()) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Writes the series of `name` with `labels` (e.g. `source="stripe"`).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, bucket) in self.bounds.iter().zip(self.buckets.iter()) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

#[derive(Default)]
struct Series {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    duration: Histogram,
    purged: AtomicU64,
    forward_duration: Histogram,
}

/// The series of one forward target.
struct TargetSeries {
    forwarded: [AtomicU64; 3],
    pending: AtomicU64,
    /// From the commit that queued a delivery (or its requeue) to its delivery.
    lag: Histogram,
}

impl Default for TargetSeries {
    fn default() -> Self {
        TargetSeries {
            forwarded: Default::default(),
            pending: AtomicU64::new(0),
            lag: Histogram::new(&LAG_BUCKETS),
        }
    }
}

/// The process's metrics.
pub struct Metrics {
    labels: Vec<String>,
    index: HashMap<String, usize>,
    series: Vec<Series>,
    /// Unix seconds when the last purge pass completed; 0 before the first.
    last_purge: AtomicU64,
    /// Outbox rows waiting to be sent, as last counted.
    forward_pending: AtomicU64,
    /// Dead-lettered outbox rows, as last counted.
    forward_dead: AtomicU64,
    /// (source, target) labels of the forward targets, in config order.
    target_labels: Vec<(String, String)>,
    target_index: HashMap<(String, String), usize>,
    targets: Vec<TargetSeries>,
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
            forward_pending: AtomicU64::new(0),
            forward_dead: AtomicU64::new(0),
            target_labels: Vec::new(),
            target_index: HashMap::new(),
            targets: Vec::new(),
        }
    }

    /// Allocates the series of these forward targets, as (source, target name).
    pub fn with_targets(mut self, targets: impl IntoIterator<Item = (String, String)>) -> Self {
        for target in targets {
            if !self.target_index.contains_key(&target) {
                self.target_index
                    .insert(target.clone(), self.target_labels.len());
                self.target_labels.push(target);
                self.targets.push(TargetSeries::default());
            }
        }
        self
    }

    /// The series of a configured target; `None` for one not configured (a row queued for a
    /// target since removed from the config is not counted).
    fn target(&self, source: &str, target: &str) -> Option<&TargetSeries> {
        self.target_index
            .get(&(source.to_owned(), target.to_owned()))
            .map(|i| &self.targets[*i])
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

    /// Counts one webhook request to `source` (a configured name or [`UNKNOWN_SOURCE`]).
    pub fn record(&self, source: &str, outcome: Outcome, elapsed: Duration) {
        let series = self.series(source);
        let slot = Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is in ALL");
        series.outcomes[slot].fetch_add(1, Ordering::Relaxed);
        series.duration.observe(elapsed);
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

    /// Counts one forward attempt to a source's target and how long it took.
    pub fn record_forward(
        &self,
        source: &str,
        target: &str,
        result: ForwardResult,
        elapsed: Duration,
    ) {
        self.series(source).forward_duration.observe(elapsed);
        let slot = ForwardResult::ALL
            .iter()
            .position(|r| *r == result)
            .expect("every result is in ALL");
        if let Some(series) = self.target(source, target) {
            series.forwarded[slot].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one delivery's lag: from the commit that queued it (or its requeue) until the
    /// target took it.
    pub fn record_lag(&self, source: &str, target: &str, lag: Duration) {
        if let Some(series) = self.target(source, target) {
            series.lag.observe(lag);
        }
    }

    /// Sets the outbox gauges: the totals, and the pending rows of each (source, target) as
    /// counted (a target missing from `pending` has none).
    pub fn set_outbox(&self, pending: u64, dead: u64, pending_by_target: &[(String, String, u64)]) {
        self.forward_pending.store(pending, Ordering::Relaxed);
        self.forward_dead.store(dead, Ordering::Relaxed);
        for series in &self.targets {
            series.pending.store(0, Ordering::Relaxed);
        }
        for (source, target, n) in pending_by_target {
            if let Some(series) = self.target(source, target) {
                series.pending.store(*n, Ordering::Relaxed);
            }
        }
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        let rows = || self.labels.iter().zip(&self.series);

        // Which build answers, for a rolling deploy with old and new instances side by side.
        out.push_str(
            "# HELP hookbox_build_info The hookbox version this process runs (always 1).\n",
        );
        out.push_str("# TYPE hookbox_build_info gauge\n");
        let _ = writeln!(
            out,
            "hookbox_build_info{{version=\"{}\"}} 1",
            crate::VERSION
        );

        out.push_str("# HELP hookbox_webhooks_total Webhook requests by source and outcome.\n");
        out.push_str("# TYPE hookbox_webhooks_total counter\n");
        for (label, series) in rows() {
            for (outcome, count) in Outcome::ALL.iter().zip(&series.outcomes) {
                let _ = writeln!(
                    out,
                    "hookbox_webhooks_total{{source=\"{label}\",outcome=\"{}\"}} {}",
                    outcome.label(),
                    count.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP hookbox_webhook_duration_seconds Time from request to answer for webhook requests.\n");
        out.push_str("# TYPE hookbox_webhook_duration_seconds histogram\n");
        for (label, series) in rows() {
            series.duration.render(
                &mut out,
                "hookbox_webhook_duration_seconds",
                &format!("source=\"{label}\""),
            );
        }

        out.push_str("# HELP hookbox_purged_total Events removed by the retention purge.\n");
        out.push_str("# TYPE hookbox_purged_total counter\n");
        for (label, series) in rows() {
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

        out.push_str(
            "# HELP hookbox_forward_total Forward attempts by source, target and result.\n",
        );
        out.push_str("# TYPE hookbox_forward_total counter\n");
        let targets = || self.target_labels.iter().zip(&self.targets);
        for ((source, target), series) in targets() {
            for (result, count) in ForwardResult::ALL.iter().zip(&series.forwarded) {
                let _ = writeln!(
                    out,
                    "hookbox_forward_total{{source=\"{source}\",target=\"{target}\",result=\"{}\"}} {}",
                    result.label(),
                    count.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP hookbox_forward_pending Pending outbox rows by source and target, as last counted.\n");
        out.push_str("# TYPE hookbox_forward_pending gauge\n");
        for ((source, target), series) in targets() {
            let _ = writeln!(
                out,
                "hookbox_forward_pending{{source=\"{source}\",target=\"{target}\"}} {}",
                series.pending.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP hookbox_forward_lag_seconds Time from the commit that queued a delivery (or its requeue) to its delivery, by source and target.\n");
        out.push_str("# TYPE hookbox_forward_lag_seconds histogram\n");
        for ((source, target), series) in targets() {
            series.lag.render(
                &mut out,
                "hookbox_forward_lag_seconds",
                &format!("source=\"{source}\",target=\"{target}\""),
            );
        }
        out.push_str("# HELP hookbox_forward_duration_seconds Time one forward attempt took.\n");
        out.push_str("# TYPE hookbox_forward_duration_seconds histogram\n");
        // Only sources with a forward target attempt anything: the rest (and requests to
        // unconfigured sources) would each add an empty histogram of 17 lines.
        let forwards = |label: &str| self.target_labels.iter().any(|(source, _)| source == label);
        for (label, series) in rows().filter(|(label, _)| forwards(label)) {
            series.forward_duration.render(
                &mut out,
                "hookbox_forward_duration_seconds",
                &format!("source=\"{label}\""),
            );
        }
        out.push_str("# HELP hookbox_forward_outbox Outbox rows by state, as last counted.\n");
        out.push_str("# TYPE hookbox_forward_outbox gauge\n");
        let _ = writeln!(
            out,
            "hookbox_forward_outbox{{state=\"pending\"}} {}",
            self.forward_pending.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "hookbox_forward_outbox{{state=\"dead\"}} {}",
            self.forward_dead.load(Ordering::Relaxed)
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
        for line in [
            "hookbox_webhooks_total{source=\"stripe\",outcome=\"processed\"} 1",
            "hookbox_webhooks_total{source=\"stripe\",outcome=\"replayed\"} 1",
            "hookbox_webhooks_total{source=\"_unknown\",outcome=\"rejected\"} 1",
            "hookbox_webhook_duration_seconds_bucket{source=\"stripe\",le=\"0.005\"} 1",
            "hookbox_webhook_duration_seconds_bucket{source=\"stripe\",le=\"0.05\"} 2",
            "hookbox_webhook_duration_seconds_count{source=\"stripe\"} 2",
            "hookbox_last_purge_timestamp_seconds 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn purges_and_forwards_are_counted() {
        let stripe = SourceName::try_from("stripe").expect("valid name");
        let github = SourceName::try_from("github").expect("valid name");
        let metrics = Metrics::new([&stripe, &github]).with_targets([
            ("stripe".to_owned(), "billing".to_owned()),
            ("stripe".to_owned(), "audit".to_owned()),
        ]);
        let removed =
            std::collections::BTreeMap::from([("stripe".to_owned(), 3u64), ("gone".to_owned(), 2)]);
        metrics.record_purge(&removed, true);
        metrics.record_forward(
            "stripe",
            "billing",
            ForwardResult::Retried,
            Duration::from_millis(2),
        );
        metrics.record_forward(
            "stripe",
            "billing",
            ForwardResult::Delivered,
            Duration::from_millis(2),
        );
        metrics.record_forward("stripe", "gone", ForwardResult::Dead, Duration::ZERO);
        metrics.record_lag("stripe", "billing", Duration::from_millis(40));
        metrics.record_lag("stripe", "billing", Duration::from_secs(20));
        metrics.set_outbox(4, 1, &[("stripe".to_owned(), "audit".to_owned(), 4)]);
        let text = metrics.render();
        for line in [
            "hookbox_purged_total{source=\"stripe\"} 3",
            "hookbox_purged_total{source=\"_unknown\"} 2",
            "hookbox_forward_total{source=\"stripe\",target=\"billing\",result=\"retried\"} 1",
            "hookbox_forward_total{source=\"stripe\",target=\"billing\",result=\"delivered\"} 1",
            "hookbox_forward_total{source=\"stripe\",target=\"billing\",result=\"dead\"} 0",
            "hookbox_forward_total{source=\"stripe\",target=\"audit\",result=\"delivered\"} 0",
            "hookbox_forward_pending{source=\"stripe\",target=\"billing\"} 0",
            "hookbox_forward_pending{source=\"stripe\",target=\"audit\"} 4",
            "hookbox_forward_duration_seconds_count{source=\"stripe\"} 3",
            "hookbox_forward_lag_seconds_bucket{source=\"stripe\",target=\"billing\",le=\"0.05\"} 1",
            "hookbox_forward_lag_seconds_bucket{source=\"stripe\",target=\"billing\",le=\"30\"} 2",
            "hookbox_forward_lag_seconds_bucket{source=\"stripe\",target=\"billing\",le=\"+Inf\"} 2",
            "hookbox_forward_lag_seconds_count{source=\"stripe\",target=\"audit\"} 0",
            "hookbox_forward_outbox{state=\"pending\"} 4",
            "hookbox_forward_outbox{state=\"dead\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("hookbox_last_purge_timestamp_seconds 0\n"));
        // A source without a target attempts nothing, and has no attempt histogram.
        assert!(!text.contains("hookbox_forward_duration_seconds_count{source=\"github\"}"));
        assert!(!text.contains("hookbox_forward_duration_seconds_count{source=\"_unknown\"}"));
    }
}
