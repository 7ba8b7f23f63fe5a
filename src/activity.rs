//! What this process has seen, for the console: per-minute webhook answers per source over the
//! last hours, replay counts per event not yet added to `events.replays`, and how the last
//! purge pass went.
//!
//! All of it is in memory and per process. The per-minute history covers this process's last
//! [`HISTORY_MINUTES`] minutes (a restart starts it afresh, and other instances keep their own).
//! A replay only bumps a counter in a map; [`Flusher`] adds the counts to `events.replays` in
//! batches every [`FLUSH_EVERY`], so the replay path never waits on a write.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::web;
use chrono::{DateTime, Utc};
use diesel::QueryResult;

use crate::db::{self, AnyConnection};
use crate::ids::SourceName;
use crate::metrics::{Outcome, UNKNOWN_SOURCE};
use crate::state::AppState;

/// How many minutes of history each source keeps.
pub const HISTORY_MINUTES: usize = 180;

/// How often replay counts are added to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// Events one flush statement updates at most.
const FLUSH_BATCH: usize = 1000;

/// Events with unflushed replays kept at most: while the database is away, counts for further
/// events are dropped (and the loss logged) rather than grow the map without bound.
const MAX_UNFLUSHED: usize = 100_000;

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
            // A handshake carries no event: the console's history counts deliveries.
            Outcome::Handshake => {}
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

/// How a purge pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeResult {
    /// It ran; `interrupted` when shutdown cut it short.
    Done {
        /// Events removed, by source.
        removed: BTreeMap<String, u64>,
        /// Whether it stopped early because the server is shutting down.
        interrupted: bool,
    },
    /// Another instance held the purge lock, so this one skipped its turn.
    Skipped,
    /// The pass failed; the sentence says why.
    Failed(String),
}

/// The last purge pass this process ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastPurge {
    /// When it ended.
    pub at: DateTime<Utc>,
    /// How long it took.
    pub took: Duration,
    /// How it ended.
    pub result: PurgeResult,
}

/// Unflushed replay counts: source → event id → replays.
type Unflushed = HashMap<String, HashMap<String, u64>>;

/// The console's view of this process; see the module documentation.
pub struct Activity {
    /// Source labels in config order, [`UNKNOWN_SOURCE`] last.
    labels: Vec<String>,
    history: HashMap<String, Mutex<Ring>>,
    unflushed: Mutex<Unflushed>,
    /// Replays not counted because [`MAX_UNFLUSHED`] was reached.
    lost: AtomicU64,
    last_purge: Mutex<Option<LastPurge>>,
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
            unflushed: Mutex::new(HashMap::new()),
            lost: AtomicU64::new(0),
            last_purge: Mutex::new(None),
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

    /// Counts a replay of `source`'s event `event_id`, to be flushed to `events.replays`.
    pub fn replayed(&self, source: &str, event_id: &str) {
        let mut unflushed = self.unflushed();
        let total: usize = unflushed.values().map(HashMap::len).sum();
        if !unflushed.contains_key(source) {
            unflushed.insert(source.to_owned(), HashMap::new());
        }
        let by_id = unflushed.get_mut(source).expect("inserted above");
        match by_id.get_mut(event_id) {
            Some(count) => *count += 1,
            None if total >= MAX_UNFLUSHED => {
                self.lost.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                by_id.insert(event_id.to_owned(), 1);
            }
        }
    }

    /// Replays of this event counted here and not yet flushed.
    pub fn unflushed_replays(&self, source: &str, event_id: &str) -> u64 {
        self.unflushed()
            .get(source)
            .and_then(|by_id| by_id.get(event_id))
            .copied()
            .unwrap_or(0)
    }

    fn unflushed(&self) -> std::sync::MutexGuard<'_, Unflushed> {
        self.unflushed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes every unflushed count.
    fn take_unflushed(&self) -> Vec<(String, String, u64)> {
        std::mem::take(&mut *self.unflushed())
            .into_iter()
            .flat_map(|(source, by_id)| {
                by_id
                    .into_iter()
                    .map(move |(event_id, n)| (source.clone(), event_id, n))
            })
            .collect()
    }

    /// Puts back counts a flush could not write, for the next flush.
    fn restore(&self, counts: Vec<(String, String, u64)>) {
        let mut unflushed = self.unflushed();
        for (source, event_id, n) in counts {
            *unflushed
                .entry(source)
                .or_default()
                .entry(event_id)
                .or_default() += n;
        }
    }

    /// Notes how a purge pass went.
    pub fn purge_finished(&self, took: Duration, result: PurgeResult) {
        *self
            .last_purge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(LastPurge {
            at: Utc::now(),
            took,
            result,
        });
    }

    /// The last purge pass this process ran, if any has ended.
    pub fn last_purge(&self) -> Option<LastPurge> {
        self.last_purge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// Adds replay counts to `events.replays`, in statements of at most [`FLUSH_BATCH`] events.
/// Counts of events purged meanwhile match no row and are dropped.
fn add_replays(conn: &mut AnyConnection, counts: &[(String, String, u64)]) -> QueryResult<()> {
    for batch in counts.chunks(FLUSH_BATCH) {
        db::events::add_replays(conn, batch)?;
    }
    Ok(())
}

/// The background task that flushes replay counts every [`FLUSH_EVERY`], and once more when
/// stopped.
pub struct Flusher {
    stop: Arc<tokio::sync::Notify>,
    done: actix_web::rt::task::JoinHandle<()>,
}

impl Flusher {
    /// Spawns the task on the current actix runtime.
    pub fn start(state: web::Data<AppState>) -> Flusher {
        let stop = Arc::new(tokio::sync::Notify::new());
        let done = actix_web::rt::spawn({
            let stop = stop.clone();
            async move {
                let mut ticks = tokio::time::interval(FLUSH_EVERY);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    let stopping = tokio::select! {
                        _ = ticks.tick() => false,
                        _ = stop.notified() => true,
                    };
                    flush(&state).await;
                    if stopping {
                        break;
                    }
                }
            }
        });
        Flusher { stop, done }
    }

    /// Flushes what is left and ends the task.
    pub async fn stop(self) {
        self.stop.notify_one();
        let _ = self.done.await;
    }
}

async fn flush(state: &web::Data<AppState>) {
    let lost = state.activity.lost.swap(0, Ordering::Relaxed);
    if lost > 0 {
        tracing::warn!(
            lost,
            "replay counts dropped: too many events waited for a flush"
        );
    }
    let counts = state.activity.take_unflushed();
    if counts.is_empty() {
        return;
    }
    let pool_state = state.clone();
    let written = web::block(move || {
        match db::with_connection(&pool_state.pool, |conn| add_replays(conn, &counts)) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, counts)),
        }
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err((e, counts))) => {
            tracing::warn!(error = %e, events = counts.len(), "replay counts not flushed; retrying at the next flush");
            state.activity.restore(counts);
        }
        Err(_) => tracing::error!("the replay-count flush panicked"),
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

    #[test]
    fn replays_are_counted_until_taken_and_restored_when_a_flush_fails() {
        let activity = activity();
        activity.replayed("stripe", "evt_1");
        activity.replayed("stripe", "evt_1");
        activity.replayed("stripe", "evt_2");
        assert_eq!(activity.unflushed_replays("stripe", "evt_1"), 2);
        let mut taken = activity.take_unflushed();
        taken.sort();
        assert_eq!(
            taken,
            [
                ("stripe".to_owned(), "evt_1".to_owned(), 2),
                ("stripe".to_owned(), "evt_2".to_owned(), 1)
            ]
        );
        assert_eq!(activity.unflushed_replays("stripe", "evt_1"), 0);
        activity.replayed("stripe", "evt_1");
        activity.restore(taken);
        assert_eq!(activity.unflushed_replays("stripe", "evt_1"), 3);
        assert_eq!(activity.unflushed_replays("stripe", "evt_2"), 1);
    }
}
