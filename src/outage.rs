//! A run of failures of a step that is retried on its own, told in the log as one outage.

use std::time::{Duration, Instant};

/// While a step keeps failing, at most one WARN about it per this long.
const OUTAGE_WARN_EVERY: Duration = Duration::from_secs(60);

/// A run of failures of a step retried on its own (the dispatcher's take of the outbox, the
/// flush of replay counts), as the log tells it: at most one WARN per [`OUTAGE_WARN_EVERY`],
/// however the failures come (one long run, or many short ones that flap), and the first
/// success after a run that warned ends it with a report; a run that did not warn ends
/// quietly.
#[derive(Debug, Default)]
pub struct Outage {
    /// When the first failure of the run was.
    since: Option<Instant>,
    /// Failures in the run so far.
    failed: u64,
    /// When the last WARN was worth making, this run or an earlier one (this run's when it is
    /// not before the run's first failure).
    warned_at: Option<Instant>,
}

/// What an [`Outage`] says to log: the failures so far and how long since the first.
#[derive(Debug, PartialEq, Eq)]
pub struct OutageReport {
    /// Failures in the run so far.
    pub failed: u64,
    /// How long since its first failure.
    pub lasted: Duration,
}

impl Outage {
    /// A failure at `now`: a report when a WARN is due.
    pub fn failed(&mut self, now: Instant) -> Option<OutageReport> {
        let since = *self.since.get_or_insert(now);
        self.failed += 1;
        if self
            .warned_at
            .is_some_and(|at| now.saturating_duration_since(at) < OUTAGE_WARN_EVERY)
        {
            return None;
        }
        self.warned_at = Some(now);
        Some(OutageReport {
            failed: self.failed,
            lasted: now.saturating_duration_since(since),
        })
    }

    /// A success at `now`: a report of the run it ends, if there was one.
    pub fn ended(&mut self, now: Instant) -> Option<OutageReport> {
        let since = self.since.take()?;
        let failed = std::mem::take(&mut self.failed);
        let warned = self.warned_at.is_some_and(|at| at >= since);
        warned.then(|| OutageReport {
            failed,
            lasted: now.saturating_duration_since(since),
        })
    }
}

/// `d` to the whole second, for a log line (`3s`, not `3s 2ms 41us`).
pub fn round_to_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_warns_as_it_starts_then_once_a_minute_and_reports_its_end_once() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let report = |failed: u64, secs: u64| {
            Some(OutageReport {
                failed,
                lasted: Duration::from_secs(secs),
            })
        };
        let mut outage = Outage::default();
        assert_eq!(outage.ended(at(0)), None, "no failure, so nothing ends");
        assert_eq!(outage.failed(at(0)), report(1, 0));
        for s in 1..60 {
            assert_eq!(
                outage.failed(at(s)),
                None,
                "quiet within the minute ({s} s)"
            );
        }
        assert_eq!(outage.failed(at(60)), report(61, 60));
        assert_eq!(outage.failed(at(61)), None);
        assert_eq!(outage.ended(at(90)), report(62, 90));
        assert_eq!(outage.ended(at(91)), None, "an outage ends once");
        // Failures that flap (fail, work, fail, ...) warn no more than one long run does.
        for s in 92..120 {
            assert_eq!(outage.failed(at(s)), None, "within the minute ({s} s)");
            assert_eq!(
                outage.ended(at(s)),
                None,
                "a run that did not warn ends quietly"
            );
        }
        assert_eq!(
            outage.failed(at(125)),
            report(1, 0),
            "a minute after the last WARN, the next run warns, counted afresh"
        );
        assert_eq!(outage.ended(at(126)), report(1, 1));
    }
}
