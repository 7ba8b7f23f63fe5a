//! Retention: forgetting events once no provider can redeliver them.
//!
//! A pass deletes events received longer ago than their source's window, in batches of
//! [`BATCH_SIZE`] rows, each its own short statement, until a batch removes nothing; so a
//! delivery never waits behind one long delete, and a pass can stop between batches. An event's
//! forward outbox rows go with it (`db::events::purge_batch`), and so does whatever a handler
//! hung off it (`REFERENCES events (id) ON DELETE CASCADE`); a source's bound transmission ids
//! (`db::transmissions`) go by the same window, in one statement after its events. On
//! PostgreSQL only one instance purges at a time: a pass starts by taking a session advisory
//! lock with `pg_try_advisory_lock`, and an instance that cannot take it skips its turn. On
//! SQLite each batch is a write of its own, with a pause between batches for the writers
//! waiting on the one write lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::QueryResult;

use crate::config::{Config, SourceConfig};
use crate::db::{self, AnyConnection};

/// Rows one DELETE removes at most.
pub const BATCH_SIZE: i64 = 5000;

/// Which events a pass removes: one cutoff per configured source, and the global window for
/// events of sources no longer configured.
#[derive(Debug, Clone)]
pub struct Plan {
    targets: Vec<Target>,
}

#[derive(Debug, Clone)]
struct Target {
    /// `Some(name)`: that source only. `None`: every source not named by another target.
    source: Option<String>,
    /// Events older than this long go.
    older_than: Duration,
}

impl Plan {
    /// Each source's window (see [`source_window`]); `[retention].window` for the events of
    /// sources no longer configured.
    pub fn from_config(config: &Config) -> Plan {
        let mut targets: Vec<Target> = config
            .sources
            .iter()
            .map(|source| Target {
                source: Some(source.name.as_str().to_owned()),
                older_than: source_window(source, config.retention.window),
            })
            .collect();
        targets.push(Target {
            source: None,
            older_than: config.retention.window,
        });
        Plan { targets }
    }

    /// One window for every source (`hookbox purge --older-than`).
    pub fn older_than(window: Duration) -> Plan {
        Plan {
            targets: vec![Target {
                source: None,
                older_than: window,
            }],
        }
    }

    /// The configured source names the catch-all target leaves to their own targets.
    fn named(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter_map(|t| t.source.clone())
            .collect()
    }
}

/// What a pass removed (or, dry, would remove), by source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Source → events.
    pub removed: BTreeMap<String, u64>,
    /// Whether the pass stopped early because the server is shutting down.
    pub interrupted: bool,
    /// Forward deliveries of those events still pending: removed with them, not sent (but for
    /// attempts a dispatcher had already taken).
    pub pending_forwards: u64,
}

impl Report {
    /// Events in all.
    pub fn total(&self) -> u64 {
        self.removed.values().sum()
    }

    /// `stripe=3 github=1`, for a log line.
    pub fn summary(&self) -> String {
        if self.removed.is_empty() {
            return "none".to_owned();
        }
        self.removed
            .iter()
            .map(|(source, n)| format!("{source}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Events received before this go. The config refuses a window whose cutoff a store cannot
/// hold; one built here anyway stops at 1970, before which nothing is stored, so the pass
/// removes what it should and never asks PostgreSQL for a time outside its range.
fn cutoff(target: &Target, now: DateTime<Utc>) -> DateTime<Utc> {
    chrono::Duration::from_std(target.older_than)
        .ok()
        .and_then(|window| now.checked_sub_signed(window))
        .map_or(DateTime::UNIX_EPOCH, crate::config::no_earlier_than_1970)
}

/// One purge pass. `None` when another instance holds the purge lock (nothing was done).
/// `stop` is checked between batches; `progress` sees the running tally after each batch.
pub fn purge(
    conn: &mut AnyConnection,
    plan: &Plan,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Report),
) -> QueryResult<Option<Report>> {
    if !db::try_lock_purge(conn)? {
        return Ok(None);
    }
    let result = purge_locked(conn, plan, stop, progress);
    let unlocked = db::unlock_purge(conn);
    let report = result?;
    unlocked?;
    Ok(Some(report))
}

fn purge_locked(
    conn: &mut AnyConnection,
    plan: &Plan,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Report),
) -> QueryResult<Report> {
    let now = database_now(conn);
    let named = plan.named();
    let mut report = Report::default();
    for target in &plan.targets {
        let source = target.source.as_deref();
        let cutoff = cutoff(target, now);
        loop {
            if stop.load(Ordering::Relaxed) {
                report.interrupted = true;
                return Ok(report);
            }
            let purged = purge_batch(conn, source, &named, cutoff, now)?;
            report.pending_forwards += purged.pending_forwards;
            let removed = purged.sources;
            for removed_source in &removed {
                *report.removed.entry(removed_source.clone()).or_default() += 1;
            }
            progress(&report);
            // Only a batch that removes nothing ends the pass. One that removes fewer than it
            // chose does not: on PostgreSQL a batch picks its rows by ctid and deletes them in
            // the same statement, and a row updated meanwhile (a replay count added to an old
            // event) has moved and is skipped; the next batch picks it up. Ending on a short
            // batch left all but one batch of a busy minute's expired events for the next pass.
            if removed.is_empty() {
                break;
            }
            db::between_batches(conn);
        }
        // The transmission ids bound to event ids (PayPal's), by the same window.
        db::transmissions::purge(conn, source, &named, cutoff)?;
    }
    Ok(report)
}

/// How many times a batch PostgreSQL ended to break a deadlock is made again before the pass
/// fails. The outbox rows a batch deletes are locked in the order the dispatcher locks the ones
/// it settles; another writer (an operator's bulk requeue) may still lock them otherwise.
const DEADLOCK_TRIES: u32 = 3;

/// One batch of the pass, made again after a deadlock (it rolled back whole).
fn purge_batch(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
) -> QueryResult<db::events::Purged> {
    let mut tries = 1;
    loop {
        match db::events::purge_batch(conn, source, named, cutoff, now, BATCH_SIZE) {
            Err(e) if db::pg::is_deadlock(&e) && tries < DEADLOCK_TRIES => tries += 1,
            done => return done,
        }
    }
}

/// Now on the clock received times are written on: on PostgreSQL this host's corrected by
/// how far it is from the database's (measured here, so `hookbox purge` run on another host
/// than `serve` cuts where `serve` would), else this host's. A cutoff on this host's clock
/// alone purged an event 30 s early from an instance whose clock was 30 s ahead, and a
/// provider's retry inside the window was processed a second time (a black-box run).
fn database_now(conn: &mut AnyConnection) -> DateTime<Utc> {
    if matches!(conn, AnyConnection::Postgres(_)) {
        // Warned of at serve's startup and its looks, not at every pass. Measured failing,
        // the correction measured before (if any) stands: the pass's own statements will say
        // what is wrong with the database.
        let _ = db::instances::follow_database_clock(conn);
    }
    db::now()
}

/// What a pass would remove, without removing anything.
pub fn dry_run(conn: &mut AnyConnection, plan: &Plan) -> QueryResult<Report> {
    let now = database_now(conn);
    let named = plan.named();
    let mut report = Report::default();
    for target in &plan.targets {
        let source = target.source.as_deref();
        let cutoff = cutoff(target, now);
        let counted = db::events::count_older(conn, source, &named, cutoff)?;
        for (source, n) in counted {
            *report.removed.entry(source).or_default() += u64::try_from(n).unwrap_or(0);
        }
        report.pending_forwards += db::events::count_pending_older(conn, source, &named, cutoff)?;
    }
    Ok(report)
}

/// How long `source`'s events are kept: its own `retention` when set; otherwise
/// `[retention].window`, or its provider's redelivery horizon where that is longer, so that a
/// source left at the defaults never forgets an id its provider can still redeliver.
pub fn source_window(source: &SourceConfig, global: Duration) -> Duration {
    source.retention.unwrap_or_else(|| {
        source
            .provider
            .redelivery_horizon()
            .map_or(global, |(horizon, _)| global.max(horizon))
    })
}

/// The startup warning for a source whose own window is set shorter than its provider's
/// horizon (a source without one gets at least the horizon, see [`source_window`]).
pub fn horizon_warning(source: &SourceConfig, global: Duration) -> Option<String> {
    let window = source_window(source, global);
    let (horizon, why) = source.provider.redelivery_horizon()?;
    (window < horizon).then(|| {
        format!(
            "source {}: retention {} is shorter than its provider's redelivery horizon ({why}); \
             a redelivery after {} is processed as new. Set sources.{}.retention to at least {}",
            source.name,
            crate::config::Spelt(window),
            crate::config::Spelt(window),
            source.name,
            crate::config::Spelt(horizon),
        )
    })
}

/// The startup warning for a source that keeps its events longer than a `[retention].window`
/// lowered below the default (data kept for less time, say): a source without a `retention`
/// of its own keeps them for its provider's redelivery horizon, however short the window, and
/// an operator who lowered the window may not know it.
pub fn stretched_warning(source: &SourceConfig, global: Duration) -> Option<String> {
    let (horizon, why) = source.provider.redelivery_horizon()?;
    (source.retention.is_none() && global < crate::config::DEFAULT_WINDOW && horizon > global).then(
        || {
            format!(
                "source {}: keeps its events {}, longer than retention.window {}, as its \
                 provider may redeliver them that long ({why}). To keep them for less, set \
                 sources.{}.retention (a redelivery after it is then processed as new)",
                source.name,
                crate::config::Spelt(horizon),
                crate::config::Spelt(global),
                source.name,
            )
        },
    )
}

/// The startup warning for a source that checks a signed time and keeps its events no longer
/// than its `tolerance`: a delivery whose time is still accepted can come back after its id is
/// forgotten (a replay by anyone who saw it) and be processed again; for PayPal, the
/// transmission id's binding is gone too.
pub fn tolerance_warning(source: &SourceConfig, global: Duration) -> Option<String> {
    let window = source_window(source, global);
    (source.provider.checks_timestamp() && window <= source.tolerance).then(|| {
        format!(
            "source {}: retention {} is not longer than its tolerance {}: a delivery whose \
             signed time is still accepted is processed again once its event is purged. Set \
             sources.{}.retention longer than {}",
            source.name,
            crate::config::Spelt(window),
            crate::config::Spelt(source.tolerance),
            source.name,
            crate::config::Spelt(source.tolerance),
        )
    })
}

/// Runs one pass and logs it, with counts and `duration_ms`. For the scheduled task and the
/// `purge` command alike.
pub fn purge_logged(
    conn: &mut AnyConnection,
    plan: &Plan,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Report),
) -> QueryResult<Option<Report>> {
    let started = Instant::now();
    let report = purge(conn, plan, stop, progress)?;
    let duration_ms = started.elapsed().as_millis() as u64;
    match &report {
        Some(report) => {
            tracing::info!(
                removed = report.total(),
                by_source = %report.summary(),
                interrupted = report.interrupted,
                duration_ms,
                "purge pass done"
            );
            if report.pending_forwards > 0 {
                tracing::warn!(
                    pending_forwards = report.pending_forwards,
                    "the purge removed events whose forward deliveries were still pending; \
                     they will not be sent, but for attempts a dispatcher had already taken (a \
                     window shorter than a target's retries, or a target that has been failing \
                     for that long)"
                );
            }
        }
        None => tracing::info!("purge skipped: another instance is purging"),
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_not_longer_than_the_tolerance_is_warned_of() {
        let source = |extra: &str| {
            let text =
                format!("[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_a\"]\n{extra}");
            Config::parse(&text, &|_: &str| None)
                .expect("a valid config")
                .sources
                .remove(0)
        };
        let day = Duration::from_secs(86_400);
        let short = source("retention = \"1m\"\ntolerance = \"5m\"\n");
        let warning = tolerance_warning(&short, day).expect("warned");
        assert!(
            warning.contains("sources.s.retention") && warning.contains("5m"),
            "{warning}"
        );
        assert_eq!(
            tolerance_warning(&source("retention = \"1h\"\n"), day),
            None
        );
        assert_eq!(tolerance_warning(&source(""), day), None);
    }

    #[test]
    fn a_cutoff_never_falls_before_1970() {
        let now = Utc::now();
        let target = |older_than: Duration| Target {
            source: None,
            older_than,
        };
        let hour = cutoff(&target(Duration::from_secs(3600)), now);
        assert_eq!(now - hour, chrono::Duration::hours(1));
        // Past what PostgreSQL holds, or what chrono can subtract: 1970, before which nothing
        // is stored, rather than a time the store refuses.
        for years in [100, 10_000, 100_000_000] {
            let window = Duration::from_secs(years * 366 * 24 * 3600);
            assert_eq!(
                cutoff(&target(window), now),
                DateTime::<Utc>::UNIX_EPOCH,
                "{years} years"
            );
        }
    }
}
