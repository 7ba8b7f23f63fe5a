//! What a replay came to: the counts, the latencies, one row per delivery that did not get a
//! 2xx, and the summary and `--report` JSON made of them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::client::Answer;

/// How many failure rows the printed summary lists; the report has them all.
const SUMMARY_FAILURES: usize = 20;

/// Where a delivery came from, and what it was, as far as that is known.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Origin {
    /// The capture or body file.
    pub file: String,
    /// Its line in a capture (from 1); `None` for a body file.
    pub line: Option<u64>,
    /// The source it was for.
    pub source: Option<String>,
    /// The event id.
    pub event_id: Option<String>,
}

/// The line after the first [`SUMMARY_FAILURES`] of `rows` listed, when there are more.
fn more_rows(out: &mut String, rows: usize) {
    if rows > SUMMARY_FAILURES {
        let _ = writeln!(
            out,
            "  ... and {} more (--report FILE lists them all)",
            rows - SUMMARY_FAILURES
        );
    }
}

impl Origin {
    /// `file:line source event_id`, as a summary row starts (`-` for what is not known).
    fn named(&self) -> String {
        format!(
            "{} {} {}",
            self.place(),
            self.source.as_deref().unwrap_or("-"),
            self.event_id.as_deref().unwrap_or("-")
        )
    }

    /// `file:line`, or the file alone.
    pub fn place(&self) -> String {
        match self.line {
            Some(line) => format!("{}:{line}", self.file),
            None => self.file.clone(),
        }
    }
}

/// One delivery that did not get a 2xx: a row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// Where it came from.
    #[serde(flatten)]
    pub origin: Origin,
    /// The receiver's status; `None` when it never answered or nothing was sent.
    pub status: Option<u16>,
    /// The receiver's error code (`stale_timestamp`, ...), or the tool's own: `network`,
    /// `invalid_capture`, `source_not_configured` (`secret_not_set`, `cannot_sign`,
    /// `unknown_scheme` and `unusable_secret` stop a replay before anything is sent).
    pub error: String,
    /// One line saying what happened.
    pub message: String,
}

/// A line whose event the receiver stored under another id than the line names (a hand-edited
/// line: the receiver reads the id from the body or headers, not from the line).
#[derive(Debug, Clone, Serialize)]
pub struct StoredAs {
    /// Where it came from, with the line's id.
    #[serde(flatten)]
    pub origin: Origin,
    /// The id the receiver's answer names.
    pub stored_as: String,
}

/// `rows` by the file and line each came from (`origin`).
fn in_file_order<T>(rows: &[T], origin: impl Fn(&T) -> &Origin) -> Vec<&T> {
    let mut sorted: Vec<&T> = rows.iter().collect();
    sorted.sort_by(|a, b| {
        let (a, b) = (origin(a), origin(b));
        (&a.file, a.line).cmp(&(&b.file, b.line))
    });
    sorted
}

/// The running count of a replay.
#[derive(Debug, Default)]
pub struct Tally {
    /// Deliveries posted (answered or not).
    pub sent: u64,
    /// 2xx without `Idempotent-Replayed`: processed now.
    pub processed: u64,
    /// 2xx with `Idempotent-Replayed: true`: processed before.
    pub replayed: u64,
    /// 4xx.
    pub rejected: u64,
    /// 5xx, no answer, or an entry that could not be sent at all.
    pub failed: u64,
    /// Capture lines left out by `--source`.
    pub skipped: u64,
    /// Whether Ctrl-C stopped the replay before every entry was sent.
    pub interrupted: bool,
    /// Deliveries still in flight when an interrupted replay stopped waiting: sent, but their
    /// answers never came back (not counted in `sent`).
    pub abandoned: u64,
    /// Entries in the captures, when they were counted before sending (not on a dry run).
    pub total: Option<u64>,
    /// Of those, the capture lines `--source` leaves out (counted by the check before sending):
    /// what an interrupted replay had not reached of them is not "not sent".
    pub to_skip: u64,
    rejected_by_code: BTreeMap<String, u64>,
    failed_by_error: BTreeMap<String, u64>,
    latencies_ms: Vec<f64>,
    failures: Vec<Failure>,
    stored_as: Vec<StoredAs>,
}

impl Tally {
    /// Counts an answer.
    pub fn answered(&mut self, origin: Origin, answer: &Answer) {
        self.sent += 1;
        self.latencies_ms
            .push(answer.latency.as_secs_f64() * 1000.0);
        let code = || {
            answer
                .error_code()
                .unwrap_or_else(|| format!("http_{}", answer.status))
        };
        if (200..300).contains(&answer.status) {
            let stored = answer.json_field("event_id");
            if let (Some(line), Some(stored)) = (origin.event_id.as_deref(), stored) {
                if line != stored {
                    self.stored_as.push(StoredAs {
                        origin: origin.clone(),
                        stored_as: stored,
                    });
                }
            }
        }
        match answer.status {
            200..=299 if answer.replayed => self.replayed += 1,
            200..=299 => self.processed += 1,
            400..=499 => {
                let code = code();
                self.rejected += 1;
                *self.rejected_by_code.entry(code.clone()).or_default() += 1;
                self.fail_row(origin, Some(answer.status), code, answer.message());
            }
            _ => {
                let code = code();
                self.failed += 1;
                *self.failed_by_error.entry(code.clone()).or_default() += 1;
                self.fail_row(origin, Some(answer.status), code, answer.message());
            }
        }
    }

    /// Counts a delivery that was sent but never answered.
    pub fn unanswered(&mut self, origin: Origin, message: String) {
        self.sent += 1;
        self.failure(origin, "network", message);
    }

    /// Counts an entry that could not be sent (`error` says why, in one word).
    pub fn failure(&mut self, origin: Origin, error: &str, message: String) {
        self.failed += 1;
        *self.failed_by_error.entry(error.to_owned()).or_default() += 1;
        self.fail_row(origin, None, error.to_owned(), message);
    }

    /// The failures by file and line, as the captures hold them: deliveries run concurrently
    /// and end in any order, and a list in the order they ended read as shuffled.
    fn failures_in_order(&self) -> Vec<&Failure> {
        in_file_order(&self.failures, |failure| &failure.origin)
    }

    /// The deliveries stored under another id, by file and line too.
    fn stored_as_in_order(&self) -> Vec<&StoredAs> {
        in_file_order(&self.stored_as, |row| &row.origin)
    }

    fn fail_row(&mut self, origin: Origin, status: Option<u16>, error: String, message: String) {
        self.failures.push(Failure {
            origin,
            status,
            error,
            message,
        });
    }

    /// Whether every delivery got a 2xx: exit 0.
    pub fn all_ok(&self) -> bool {
        self.rejected == 0 && self.failed == 0
    }

    /// Entries dealt with so far, for the progress bar.
    pub fn done(&self) -> u64 {
        self.processed + self.replayed + self.rejected + self.failed + self.skipped
    }

    /// The latency below which `fraction` of the answers came (nearest rank), in ms.
    fn percentile(sorted: &[f64], fraction: f64) -> Option<f64> {
        if sorted.is_empty() {
            return None;
        }
        let rank = (fraction * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    fn latency(&self) -> (Option<f64>, Option<f64>) {
        let mut sorted = self.latencies_ms.clone();
        sorted.sort_by(f64::total_cmp);
        (
            Self::percentile(&sorted, 0.50),
            Self::percentile(&sorted, 0.99),
        )
    }

    /// The `--report` document.
    pub fn report(&self, duration: Duration) -> serde_json::Value {
        let (p50, p99) = self.latency();
        let round = |ms: Option<f64>| ms.map(|ms| (ms * 10.0).round() / 10.0);
        let mut report = serde_json::json!({
            "counts": {
                "sent": self.sent,
                "processed": self.processed,
                "replayed": self.replayed,
                "rejected": self.rejected,
                "failed": self.failed,
            },
            "skipped": self.skipped,
            "rejected_by_code": self.rejected_by_code,
            "failed_by_error": self.failed_by_error,
            "latency_ms": { "p50": round(p50), "p99": round(p99) },
            "duration_ms": duration.as_millis() as u64,
            "failures": self.failures_in_order(),
        });
        if !self.stored_as.is_empty() {
            report["stored_under_another_id"] = serde_json::json!(self.stored_as_in_order());
        }
        if self.interrupted {
            report["interrupted"] = serde_json::json!(true);
            report["abandoned_in_flight"] = serde_json::json!(self.abandoned);
            if let Some(not_sent) = self.not_sent() {
                report["not_sent"] = serde_json::json!(not_sent);
            }
        }
        report
    }

    /// Writes the report as JSON to `path`, whole or not at all and its owner's only, as
    /// `export --out` writes a capture (it may quote receivers' answers and where they are): a
    /// new file beside it, renamed over it; a symbolic link is written where it leads.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_report(&self, path: &Path, duration: Duration) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(&self.report(duration))?;
        text.push('\n');
        crate::capture::write_whole(path, |out| Ok(out.write_all(text.as_bytes())?))
            .map_err(|e| anyhow::anyhow!("cannot write the report {}: {e:#}", path.display()))
    }

    /// Entries an interrupted replay never posted: neither answered, failed, skipped nor in
    /// flight when it stopped. `None` when it was not interrupted or the total is unknown.
    pub fn not_sent(&self) -> Option<u64> {
        let total = self.total.filter(|_| self.interrupted)?;
        let never_to_send = self.to_skip.saturating_sub(self.skipped);
        Some(total.saturating_sub(self.done() + self.abandoned + never_to_send))
    }

    /// How the deliveries so far went, in one short line.
    pub fn outcomes(&self) -> String {
        format!(
            "{} processed, {} replayed, {} rejected, {} failed",
            self.processed, self.replayed, self.rejected, self.failed
        )
    }

    /// One line of progress, out of `total` entries.
    pub fn progress_line(&self, total: u64) -> String {
        format!(
            "{} of {total} done, {} sent: {}",
            self.done(),
            self.sent,
            self.outcomes()
        )
    }

    /// How many answers were refused with the receiver's error `code`.
    pub fn rejected_with(&self, code: &str) -> u64 {
        self.rejected_by_code.get(code).copied().unwrap_or(0)
    }

    /// The summary printed at the end.
    pub fn summary(&self, duration: Duration) -> String {
        let by = |counts: &BTreeMap<String, u64>| {
            if counts.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
                format!("  ({})", list.join(", "))
            }
        };
        let mut out = if self.interrupted {
            format!(
                "replay interrupted (Ctrl-C or SIGTERM) after {:.1}s: what was sent until then\n",
                duration.as_secs_f64()
            )
        } else {
            format!("replay finished in {:.1}s\n", duration.as_secs_f64())
        };
        let rows = [
            ("sent", self.sent, String::new()),
            ("processed", self.processed, String::new()),
            ("replayed", self.replayed, String::new()),
            ("rejected", self.rejected, by(&self.rejected_by_code)),
            ("failed", self.failed, by(&self.failed_by_error)),
        ];
        for (name, count, detail) in rows {
            let _ = writeln!(out, "  {name:<10} {count:>7}{detail}");
        }
        if self.skipped > 0 {
            let _ = writeln!(
                out,
                "  {:<10} {:>7}  (other sources)",
                "skipped", self.skipped
            );
        }
        if self.abandoned > 0 {
            let _ = writeln!(
                out,
                "  {:<10} {:>7}  (in flight when the wait ended; their answers are unknown)",
                "abandoned", self.abandoned
            );
        }
        if let Some(not_sent) = self.not_sent() {
            let _ = writeln!(
                out,
                "  {:<10} {not_sent:>7}  (never posted: replay the same captures again; what was \
                 stored answers as a replay)",
                "not sent"
            );
        }
        if let (Some(p50), Some(p99)) = self.latency() {
            let _ = writeln!(out, "  latency    p50 {p50:.1} ms, p99 {p99:.1} ms");
        }
        if !self.stored_as.is_empty() {
            let _ = writeln!(
                out,
                "stored under another id than the line's (the receiver reads the id from the \
                 delivery, not the line; was the line edited?):"
            );
            for row in self.stored_as_in_order().into_iter().take(SUMMARY_FAILURES) {
                let _ = writeln!(out, "  {}: stored as {}", row.origin.named(), row.stored_as);
            }
            more_rows(&mut out, self.stored_as.len());
        }
        if !self.failures.is_empty() {
            let _ = writeln!(out, "not 2xx:");
            for failure in self.failures_in_order().into_iter().take(SUMMARY_FAILURES) {
                let status = failure.status.map_or("-".to_owned(), |s| s.to_string());
                let _ = writeln!(
                    out,
                    "  {}: {status} {}: {}",
                    failure.origin.named(),
                    failure.error,
                    failure.message
                );
            }
            more_rows(&mut out, self.failures.len());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use actix_web::web::Bytes;

    use super::*;

    #[test]
    fn a_progress_line_says_how_many_of_all_are_done() {
        let tally = Tally {
            sent: 3,
            processed: 2,
            replayed: 1,
            skipped: 1,
            ..Tally::default()
        };
        assert_eq!(
            tally.progress_line(6000),
            "4 of 6000 done, 3 sent: 2 processed, 1 replayed, 0 rejected, 0 failed"
        );
    }

    fn answer(status: u16, replayed: bool, body: &'static str, ms: u64) -> Answer {
        Answer {
            status,
            replayed,
            body: Bytes::from_static(body.as_bytes()),
            latency: Duration::from_millis(ms),
            location: None,
        }
    }

    fn origin(line: u64) -> Origin {
        Origin {
            file: "capture.ndjson".into(),
            line: Some(line),
            source: Some("stripe".into()),
            event_id: Some(format!("evt_{line}")),
        }
    }

    #[test]
    fn failures_are_listed_by_line_whatever_order_they_ended_in() {
        let mut tally = Tally::default();
        for line in [12, 2, 7] {
            tally.unanswered(origin(line), "no answer".into());
        }
        let report = tally.report(Duration::from_secs(1));
        let lines: Vec<_> = report["failures"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|f| f["line"].as_u64().expect("a line"))
            .collect();
        assert_eq!(lines, [2, 7, 12]);
        let summary = tally.summary(Duration::from_secs(1));
        let at = |place: &str| summary.find(place).expect("listed");
        assert!(
            at("capture.ndjson:2 ") < at("capture.ndjson:7 "),
            "{summary}"
        );
        assert!(
            at("capture.ndjson:7 ") < at("capture.ndjson:12 "),
            "{summary}"
        );
    }

    #[test]
    fn deliveries_stored_under_another_id_are_listed_by_line_too() {
        let mut tally = Tally::default();
        for line in [4, 1, 3] {
            tally.answered(
                origin(line),
                &answer(200, false, r#"{"event_id":"x","status":"processed"}"#, 1),
            );
        }
        let report = tally.report(Duration::from_secs(1));
        let lines: Vec<_> = report["stored_under_another_id"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|row| row["line"].as_u64().expect("a line"))
            .collect();
        assert_eq!(lines, [1, 3, 4]);
    }

    #[test]
    fn answers_are_classified_and_the_report_has_the_contract_counts() {
        let mut tally = Tally::default();
        tally.answered(origin(1), &answer(200, false, "{}", 10));
        tally.answered(origin(2), &answer(200, true, "{}", 20));
        tally.answered(
            origin(3),
            &answer(
                401,
                false,
                r#"{"error":"stale_timestamp","message":"Old."}"#,
                30,
            ),
        );
        tally.answered(origin(4), &answer(502, false, "Bad Gateway", 40));
        tally.unanswered(origin(5), "no answer".into());
        tally.failure(origin(6), "invalid_capture", "not JSON".into());
        assert!(!tally.all_ok());

        let report = tally.report(Duration::from_secs(1));
        assert_eq!(
            report["counts"],
            serde_json::json!({"sent": 5, "processed": 1, "replayed": 1, "rejected": 1, "failed": 3})
        );
        assert_eq!(report["rejected_by_code"]["stale_timestamp"], 1);
        assert_eq!(report["failed_by_error"]["http_502"], 1);
        assert_eq!(report["failed_by_error"]["network"], 1);
        assert_eq!(report["latency_ms"]["p50"], 20.0);
        assert_eq!(report["latency_ms"]["p99"], 40.0);
        let failures = report["failures"].as_array().expect("a list");
        assert_eq!(failures.len(), 4);
        assert_eq!(
            failures[0],
            serde_json::json!({"file": "capture.ndjson", "line": 3, "source": "stripe",
                "event_id": "evt_3", "status": 401, "error": "stale_timestamp", "message": "Old."})
        );
        assert_eq!(failures[3]["status"], serde_json::Value::Null);

        let summary = tally.summary(Duration::from_secs(1));
        assert!(summary.contains("stale_timestamp 1"), "{summary}");
        assert!(
            summary.contains("capture.ndjson:6 stripe evt_6"),
            "{summary}"
        );
    }

    #[test]
    fn all_2xx_is_ok_and_no_answers_have_no_latency() {
        let mut tally = Tally::default();
        assert!(tally.all_ok());
        assert_eq!(
            tally.report(Duration::ZERO)["latency_ms"]["p50"],
            serde_json::Value::Null
        );
        tally.answered(origin(1), &answer(204, false, "", 5));
        assert!(tally.all_ok());
    }
}
