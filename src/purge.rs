//! The scheduled retention purge (a pass of [`retention::purge_logged`] every
//! `purge_interval`, the first right after startup) and how its last pass went, for the
//! console. The last pass is per process: other instances keep their own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web;
use chrono::{DateTime, Utc};

use crate::db::{self, DbPool};
use crate::metrics::Metrics;
use crate::retention::{self, Plan};

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

/// Where the scheduled purge leaves how its last pass went.
#[derive(Default)]
pub struct LastPurgeSlot(Mutex<Option<LastPurge>>);

impl LastPurgeSlot {
    /// Notes how a purge pass went.
    pub fn finished(&self, took: Duration, result: PurgeResult) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(LastPurge {
            at: Utc::now(),
            took,
            result,
        });
    }

    /// The last purge pass this process ran, if any has ended.
    pub fn get(&self) -> Option<LastPurge> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// The scheduled retention purge task.
pub struct Schedule {
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    under_way: UnderWay,
}

/// The pass under way, if any, with what its batches committed so far.
type UnderWay = Arc<Mutex<Option<retention::Report>>>;

impl Schedule {
    /// Spawns the task on the current actix runtime: a pass of `plan` through `pool` every
    /// `every`, counted in `metrics` and noted in `last`.
    pub fn start(
        pool: DbPool,
        metrics: Arc<Metrics>,
        last: Arc<LastPurgeSlot>,
        plan: Plan,
        every: Duration,
    ) -> Schedule {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let under_way = UnderWay::default();
        let plan = Arc::new(plan);
        actix_web::rt::spawn({
            let (stop, wake, under_way) = (stop.clone(), wake.clone(), under_way.clone());
            async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = ticks.tick() => {}
                        _ = wake.notified() => {}
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let started = std::time::Instant::now();
                    let result = pass(&pool, &metrics, &plan, &stop, &under_way).await;
                    last.finished(started.elapsed(), result);
                }
            }
        });
        Schedule {
            stop,
            wake,
            under_way,
        }
    }

    /// At the end of a stop: a pass still under way (waiting on a database that does not
    /// answer) is abandoned with the process, and said, with what its batches removed before
    /// (the batch in progress rolls back). Its own `purge pass` line never comes.
    pub fn say_if_abandoned(&self) {
        let under_way = self
            .under_way
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some(so_far) = under_way {
            tracing::warn!(
                removed = so_far.total(),
                by_source = %so_far.summary(),
                "purge pass abandoned at the stop, its batch in progress still waiting on the \
                 database: that batch rolls back; what the pass removed before (counted here) \
                 stays removed, and the next pass removes the rest"
            );
        }
    }

    /// Stops the task: a pass under way ends after its current batch.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }
}

/// One pass on a blocking thread.
async fn pass(
    pool: &DbPool,
    metrics: &Arc<Metrics>,
    plan: &Arc<Plan>,
    stop: &Arc<AtomicBool>,
    under_way: &UnderWay,
) -> PurgeResult {
    let (pool, metrics, plan, stop) = (pool.clone(), metrics.clone(), plan.clone(), stop.clone());
    // What the batches committed so far removed: a pass that fails after some has still
    // removed that much, and counts it (a black-box run's metrics and log lines were a batch
    // of 5000 short after a pass failed past its first batch); and a stop that abandons the
    // pass says it (`Schedule::say_if_abandoned`).
    let note = |so_far: Option<retention::Report>| {
        *under_way
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = so_far;
    };
    note(Some(retention::Report::default()));
    let watched = under_way.clone();
    let pass = web::block(move || {
        let pass = db::with_connection(&pool, |conn| {
            retention::purge_logged(conn, &plan, &stop, &mut |report| {
                *watched
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(report.clone());
            })
        });
        let so_far = watched
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
            .unwrap_or_default();
        match &pass {
            Ok(Some(report)) => metrics.record_purge(&report.removed, !report.interrupted),
            Ok(None) => {}
            Err(_) => metrics.record_purge(&so_far.removed, false),
        }
        pass.map_err(|e| (e, so_far))
    })
    .await;
    note(None);
    match pass {
        Ok(Ok(Some(report))) => PurgeResult::Done {
            removed: report.removed,
            interrupted: report.interrupted,
        },
        Ok(Ok(None)) => PurgeResult::Skipped,
        Ok(Err((e, so_far))) => {
            tracing::warn!(
                error = %e,
                removed = so_far.total(),
                by_source = %so_far.summary(),
                "purge pass failed; what it removed before (counted here) stays removed, and \
                 the next pass is at the next interval"
            );
            PurgeResult::Failed(e.to_string())
        }
        Err(_) => {
            tracing::error!("the purge pass panicked");
            PurgeResult::Failed("the purge pass panicked".to_owned())
        }
    }
}
