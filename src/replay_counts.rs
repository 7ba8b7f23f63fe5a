//! Write-behind replay counts: a replay only bumps a counter in a map, and [`Flusher`] adds the
//! counts to `events.replays` in batches every [`FLUSH_EVERY`], so the replay path never waits
//! on a write. In memory and per process; the console adds what is not flushed yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::web;
use diesel::QueryResult;

use crate::db::{self, AnyConnection, DbPool};
use crate::outage::{round_to_seconds, Outage};

/// How often replay counts are added to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// Events one flush statement updates at most.
const FLUSH_BATCH: usize = 1000;

/// Events with unflushed replays kept at most: while the database is away, counts for further
/// events are dropped (and the loss logged) rather than grow the map without bound.
const MAX_UNFLUSHED: usize = 100_000;

/// Unflushed replay counts: source → event id → replays.
type Unflushed = HashMap<String, HashMap<String, u64>>;

/// Replays counted in memory and not yet added to `events.replays`.
#[derive(Default)]
pub struct ReplayCounts {
    unflushed: Mutex<Unflushed>,
    /// Replays not counted because [`MAX_UNFLUSHED`] was reached.
    lost: AtomicU64,
}

impl ReplayCounts {
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
    /// Spawns the task on the current actix runtime: it writes `counts` through `pool`.
    pub fn start(pool: DbPool, counts: Arc<ReplayCounts>) -> Flusher {
        let stop = Arc::new(tokio::sync::Notify::new());
        let done = actix_web::rt::spawn({
            let stop = stop.clone();
            async move {
                let mut ticks = tokio::time::interval(FLUSH_EVERY);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut outage = Outage::default();
                loop {
                    let stopping = tokio::select! {
                        _ = ticks.tick() => false,
                        _ = stop.notified() => true,
                    };
                    let flushed = flush(&pool, &counts, &mut outage, stopping).await;
                    if stopping {
                        if let Err(error) = flushed {
                            // Said as lost, not as "kept and retried": nothing retries them
                            // now (a black-box run saw that WARN at the stop itself).
                            let left = counts.take_unflushed();
                            tracing::warn!(
                                error = %error,
                                events = left.len(),
                                replays = left.iter().map(|(_, _, n)| n).sum::<u64>(),
                                "replay counts could not be written before the stop and are \
                                 lost: the stored replay counts of these events are short by \
                                 that many (nothing else is lost: they are only counts)"
                            );
                        }
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

/// Writes what `replays` holds; a failure keeps it for the next flush, and a run of them (the
/// database away) is one WARN a minute (`outage`), not one every flush; at the `stopping`
/// flush, none (the caller says what is lost). The error, when what it held is left.
async fn flush(
    pool: &DbPool,
    replays: &ReplayCounts,
    outage: &mut Outage,
    stopping: bool,
) -> Result<(), String> {
    let lost = replays.lost.swap(0, Ordering::Relaxed);
    if lost > 0 {
        tracing::warn!(
            lost,
            "replay counts dropped: too many events waited for a flush"
        );
    }
    let counts = replays.take_unflushed();
    if counts.is_empty() {
        return Ok(());
    }
    let pool = pool.clone();
    let written =
        web::block(
            move || match db::with_connection(&pool, |conn| add_replays(conn, &counts)) {
                Ok(()) => Ok(()),
                Err(e) => Err((e, counts)),
            },
        )
        .await;
    match written {
        Ok(Ok(())) => {
            if let Some(ended) = outage.ended(Instant::now()) {
                tracing::info!(
                    failed_tries = ended.failed,
                    lasted = %crate::config::Spelt(round_to_seconds(ended.lasted)),
                    "replay counts are flushed again"
                );
            }
            Ok(())
        }
        Ok(Err((e, counts))) => {
            tracing::debug!(error = %e, events = counts.len(), "replay counts not flushed");
            if let Some(warn) = outage.failed(Instant::now()).filter(|_| !stopping) {
                tracing::warn!(
                    error = %e,
                    events = counts.len(),
                    failing_for = %crate::config::Spelt(round_to_seconds(warn.lasted)),
                    failed_tries = warn.failed,
                    "replay counts not flushed; kept and retried at every flush (every {} s). \
                     At most one such warning a minute, RUST_LOG=debug shows each",
                    FLUSH_EVERY.as_secs()
                );
            }
            replays.restore(counts);
            Err(e.to_string())
        }
        Err(_) => {
            tracing::error!("the replay-count flush panicked");
            Err("the flush panicked".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_are_counted_until_taken_and_restored_when_a_flush_fails() {
        let counts = ReplayCounts::default();
        counts.replayed("stripe", "evt_1");
        counts.replayed("stripe", "evt_1");
        counts.replayed("stripe", "evt_2");
        assert_eq!(counts.unflushed_replays("stripe", "evt_1"), 2);
        let mut taken = counts.take_unflushed();
        taken.sort();
        assert_eq!(
            taken,
            [
                ("stripe".to_owned(), "evt_1".to_owned(), 2),
                ("stripe".to_owned(), "evt_2".to_owned(), 1)
            ]
        );
        assert_eq!(counts.unflushed_replays("stripe", "evt_1"), 0);
        counts.replayed("stripe", "evt_1");
        counts.restore(taken);
        assert_eq!(counts.unflushed_replays("stripe", "evt_1"), 3);
        assert_eq!(counts.unflushed_replays("stripe", "evt_2"), 1);
    }
}
