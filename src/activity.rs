//! What this process answered, for the console: per-minute webhook answers per source over the
//! last [`HISTORY_MINUTES`] minutes, by outcome and error code.
//!
//! In memory and per process: a restart starts the history afresh, and other instances keep
//! their own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

use crate::ids::SourceName;
use crate::metrics::{Outcome, UNKNOWN_SOURCE};

/// How many minutes of history each source keeps.
pub const HISTORY_MINUTES: usize = 180;

/// One minute of one source's answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Minute {
    /// The minute, as minutes since the Unix epoch.
    pub at: i64,
    /// First deliveries, processed and stored.
    pub processed: u64,
    /// Later deliveries answered with the stored response.
    pub replayed: u64,
    /// Answered 4xx.
    pub rejected: u64,
    /// Answered 5xx.
    pub failed: u64,
    /// Rejected and failed answers by their error code, in order of first appearance.
    pub reasons: Vec<(&'static str, u64)>,
}

impl Minute {
    /// Every answer in the minute.
    pub fn total(&self) -> u64 {
        self.processed + self.replayed + self.rejected + self.failed
    }

    fn add(&mut self, outcome: Outcome, reason: Option<&'static str>, n: u64) {
        match outcome {
            Outcome::Processed => self.processed += n,
            Outcome::Replayed => self.replayed += n,
            Outcome::Rejected => self.rejected += n,
            Outcome::Failed => self.failed += n,
            // A handshake carries no event, and a connection lost mid-body no delivery: the
            // console's history counts deliveries.
            Outcome::Handshake | Outcome::Incomplete => return,
        }
        if let Some(reason) = reason {
            match self.reasons.iter_mut().find(|(code, _)| *code == reason) {
                Some((_, count)) => *count += n,
                None => self.reasons.push((reason, n)),
            }
        }
    }
}

/// A source's last [`HISTORY_MINUTES`] minutes: slot `at % HISTORY_MINUTES` holds minute `at`,
/// and a slot still holding an older minute is reset when its new minute begins.
struct Ring {
    slots: Vec<Minute>,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            slots: vec![Minute::default(); HISTORY_MINUTES],
        }
    }

    fn slot(minute: i64) -> usize {
        minute.rem_euclid(HISTORY_MINUTES as i64) as usize
    }

    fn record(&mut self, minute: i64, outcome: Outcome, reason: Option<&'static str>) {
        let slot = &mut self.slots[Ring::slot(minute)];
        if slot.at != minute {
            *slot = Minute {
                at: minute,
                ..Minute::default()
            };
        }
        slot.add(outcome, reason, 1);
    }

    /// The window ending with minute `now`, oldest first, minutes without answers included.
    fn window(&self, now: i64) -> Vec<Minute> {
        (now + 1 - HISTORY_MINUTES as i64..=now)
            .map(|minute| {
                let slot = &self.slots[Ring::slot(minute)];
                if slot.at == minute {
                    slot.clone()
                } else {
                    Minute {
                        at: minute,
                        ..Minute::default()
                    }
                }
            })
            .collect()
    }
}

/// The per-minute history of every source; see the module documentation.
pub struct Activity {
    /// Source labels in config order, [`UNKNOWN_SOURCE`] last.
    labels: Vec<String>,
    history: HashMap<String, Mutex<Ring>>,
    started_at: DateTime<Utc>,
}

/// Minutes since the Unix epoch, now.
pub fn current_minute() -> i64 {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (seconds / 60) as i64
}

impl Activity {
    /// Keeps a history for these sources and one for requests to unknown sources.
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a SourceName>) -> Activity {
        let mut labels: Vec<String> = sources.into_iter().map(|s| s.as_str().to_owned()).collect();
        labels.push(UNKNOWN_SOURCE.to_owned());
        let history = labels
            .iter()
            .map(|label| (label.clone(), Mutex::new(Ring::new())))
            .collect();
        Activity {
            labels,
            history,
            started_at: Utc::now(),
        }
    }

    /// Counts one webhook answer to `source` (a configured name or [`UNKNOWN_SOURCE`]) in the
    /// current minute, with the error code of a refusal.
    pub fn record(&self, source: &str, outcome: Outcome, reason: Option<&'static str>) {
        self.record_at(current_minute(), source, outcome, reason);
    }

    fn record_at(&self, minute: i64, source: &str, outcome: Outcome, reason: Option<&'static str>) {
        let ring = self
            .history
            .get(source)
            .or_else(|| self.history.get(UNKNOWN_SOURCE))
            .expect("the unknown-source history always exists");
        ring.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .record(minute, outcome, reason);
    }

    /// When this process started counting: its history begins here.
    pub fn started_at(&self) -> DateTime<Utc> {
        self.started_at
    }

    /// The source labels with a history, in config order, [`UNKNOWN_SOURCE`] last.
    pub fn sources(&self) -> &[String] {
        &self.labels
    }

    /// `source`'s minutes up to and including `now` (see [`current_minute`]), oldest first.
    pub fn history(&self, source: &str, now: i64) -> Vec<Minute> {
        self.history.get(source).map_or_else(Vec::new, |ring| {
            ring.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .window(now)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity() -> Activity {
        let stripe = SourceName::try_from("stripe").expect("valid name");
        Activity::new([&stripe])
    }

    #[test]
    fn counts_each_minute_by_outcome_and_reason() {
        let activity = activity();
        activity.record_at(100, "stripe", Outcome::Processed, None);
        activity.record_at(100, "stripe", Outcome::Processed, None);
        activity.record_at(100, "stripe", Outcome::Rejected, Some("invalid_signature"));
        activity.record_at(101, "stripe", Outcome::Replayed, None);
        activity.record_at(101, "stripe", Outcome::Failed, Some("unavailable"));
        activity.record_at(101, "nope", Outcome::Rejected, Some("unknown_source"));

        let window = activity.history("stripe", 101);
        assert_eq!(window.len(), HISTORY_MINUTES);
        assert_eq!(window.last().map(|m| m.at), Some(101));
        let at_100 = &window[HISTORY_MINUTES - 2];
        assert_eq!(
            (at_100.processed, at_100.rejected, at_100.reasons.clone()),
            (2, 1, vec![("invalid_signature", 1)])
        );
        let at_101 = &window[HISTORY_MINUTES - 1];
        assert_eq!((at_101.replayed, at_101.failed, at_101.total()), (1, 1, 2));
        let unknown = activity.history(UNKNOWN_SOURCE, 101);
        assert_eq!(
            unknown[HISTORY_MINUTES - 1].reasons,
            [("unknown_source", 1)]
        );
        assert_eq!(activity.sources(), ["stripe", UNKNOWN_SOURCE]);
    }

    #[test]
    fn a_minute_falls_out_of_the_window_and_its_slot_is_reused() {
        let activity = activity();
        activity.record_at(10, "stripe", Outcome::Processed, None);
        let later = 10 + HISTORY_MINUTES as i64;
        assert!(activity
            .history("stripe", later)
            .iter()
            .all(|m| m.total() == 0));
        activity.record_at(later, "stripe", Outcome::Replayed, None);
        let window = activity.history("stripe", later);
        let counted: Vec<(i64, u64, u64)> = window
            .iter()
            .filter(|m| m.total() > 0)
            .map(|m| (m.at, m.processed, m.replayed))
            .collect();
        assert_eq!(counted, [(later, 0, 1)], "the old minute's count is gone");
        assert!(window.windows(2).all(|w| w[1].at == w[0].at + 1));
    }
}
