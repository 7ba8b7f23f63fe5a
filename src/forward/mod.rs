//! Forwarding: handing each stored event on to a downstream application, at least once, after
//! the provider has been answered.
//!
//! The claim transaction writes one outbox row (`deliveries`) per target whose `events`
//! patterns match the event, with the claim, so an event is queued if and only if it is stored. The [`Dispatcher`] sends due rows after commit: it takes
//! them with `FOR UPDATE SKIP LOCKED` and leases each past the attempt's timeout, so instances
//! sharing a database never send one row at the same moment; a process killed mid-attempt leaves
//! a lease that runs out, and another attempt follows. Every attempt of an event carries the same
//! `Idempotency-Key: {source}:{event_id}` (the same for every target), so a downstream that
//! honours it sees the effect once; `X-Hookbox-Target` names the target.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::http::header::HeaderValue;
use actix_web::web;

use crate::config::ForwardConfig;
use crate::db::{self, deliveries, DbPool};
use crate::metrics::{ForwardResult, Metrics};
use crate::providers::{Provider, Standard};
use crate::retry;
use deliveries::{Due, Settle};

/// Attempts one instance has under way at most.
const MAX_IN_FLIGHT: usize = 16;

/// How often the outbox is looked at when nothing wakes the dispatcher: rows claimed by another
/// instance, and retries coming due, are picked up within this.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// How often the outbox gauges are recounted.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// A lease lasts the attempt's timeout plus this, so a slow but live attempt ends before
/// another dispatcher may take the row.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// The first retry waits about this long; each further one about twice the last.
const BACKOFF_BASE: Duration = Duration::from_secs(1);

/// No retry waits longer than this, whatever the backoff or `Retry-After` says.
const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// One of a source's downstreams, ready to send to.
pub struct Target {
    /// `[sources.NAME.forward]`, or one of `[[sources.NAME.forward]]`.
    pub config: ForwardConfig,
    /// Signs what hookbox sends, the Standard Webhooks way, with the target's secret.
    signer: Standard,
}

impl Target {
    /// Builds the signer from the target's secret.
    pub fn new(config: ForwardConfig) -> Result<Target, String> {
        let signer = Standard::new(std::slice::from_ref(&config.secret), Duration::ZERO)
            .map_err(|e| e.problem)?;
        Ok(Target { config, signer })
    }
}

/// Starts and stops the dispatcher, and wakes it when a claim queued something.
#[derive(Clone, Default)]
pub struct Wake {
    notify: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
}

impl Wake {
    /// A claim committed an outbox row: look now rather than at the next poll.
    pub fn queued(&self) {
        self.notify.notify_one();
    }

    /// Stop taking rows; attempts under way finish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.notify.notify_one();
    }
}

/// What the dispatcher works with: the pool, the metrics, and each forwarding source's target.
/// Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    pool: DbPool,
    metrics: Arc<Metrics>,
    /// Targets by (source name, target name).
    targets: Arc<HashMap<(String, String), Arc<Target>>>,
    /// How long a taken row is leased: the longest timeout plus [`LEASE_MARGIN`].
    lease: Duration,
}

impl Outbox {
    /// The outbox of these targets (by source name and target name); `None` when no source
    /// forwards.
    pub fn new(
        pool: DbPool,
        metrics: Arc<Metrics>,
        targets: HashMap<(String, String), Arc<Target>>,
    ) -> Option<Outbox> {
        let lease = targets
            .values()
            .map(|t| t.config.timeout + LEASE_MARGIN)
            .max()?;
        Some(Outbox {
            pool,
            metrics,
            targets: Arc::new(targets),
            lease,
        })
    }

    /// One pass: takes up to [`MAX_IN_FLIGHT`] rows due now, sends them, waits for every
    /// attempt to be recorded, and returns how many were sent. The dispatcher runs the same
    /// steps continuously; a pass lets a caller (a test) drive it and see the result.
    pub async fn pass(&self) -> usize {
        let client = self.client();
        let due = self.take(MAX_IN_FLIGHT).await;
        let sent = due.len();
        futures_util::future::join_all(due.into_iter().map(|due| attempt(self, &client, due)))
            .await;
        sent
    }

    fn client(&self) -> awc::Client {
        awc::Client::builder()
            .disable_redirects()
            .timeout(self.lease)
            .finish()
    }

    /// Leases up to `n` due rows; none when the outbox cannot be read (logged).
    async fn take(&self, n: usize) -> Vec<Due> {
        let (pool, lease) = (self.pool.clone(), self.lease);
        let due = web::block(move || {
            db::with_connection(&pool, |conn| deliveries::take_due(conn, n as i64, lease))
        })
        .await;
        match due {
            Ok(Ok(due)) => due,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the outbox");
                Vec::new()
            }
            Err(_) => {
                tracing::error!("reading the outbox panicked");
                Vec::new()
            }
        }
    }

    async fn refresh_gauges(&self) {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        let counted = web::block(move || {
            let ((pending, dead), by_target) = db::with_connection(&pool, |conn| {
                Ok((
                    deliveries::counts(conn)?,
                    deliveries::pending_by_target(conn)?,
                ))
            })?;
            let by_target: Vec<(String, String, u64)> = by_target
                .into_iter()
                .map(|(source, target, n)| (source, target, u64::try_from(n).unwrap_or(0)))
                .collect();
            metrics.set_outbox(
                u64::try_from(pending).unwrap_or(0),
                u64::try_from(dead).unwrap_or(0),
                &by_target,
            );
            Ok::<_, db::DbError>(())
        })
        .await;
        if let Ok(Err(e)) = counted {
            tracing::debug!(error = %e, "cannot count the outbox");
        }
    }
}

/// The dispatcher task inside `serve`.
pub struct Dispatcher;

impl Dispatcher {
    /// Spawns the dispatcher on the current actix runtime: it sends `outbox`'s due rows until
    /// `wake` says stop.
    pub fn start(outbox: Outbox, wake: Wake) {
        actix_web::rt::spawn(run(outbox, wake));
    }
}

async fn run(outbox: Outbox, wake: Wake) {
    let client = outbox.client();
    let in_flight = Rc::new(Cell::new(0usize));
    let mut gauges_at = Instant::now();
    while !wake.stop.load(Ordering::Relaxed) {
        let free = MAX_IN_FLIGHT - in_flight.get();
        let mut taken = 0;
        if free > 0 {
            let due = outbox.take(free).await;
            taken = due.len();
            for due in due {
                in_flight.set(in_flight.get() + 1);
                let (outbox, client, in_flight, wake) = (
                    outbox.clone(),
                    client.clone(),
                    in_flight.clone(),
                    wake.clone(),
                );
                actix_web::rt::spawn(async move {
                    attempt(&outbox, &client, due).await;
                    in_flight.set(in_flight.get() - 1);
                    wake.notify.notify_one();
                });
            }
        }
        if gauges_at.elapsed() >= GAUGES_EVERY {
            gauges_at = Instant::now();
            outbox.refresh_gauges().await;
        }
        // A full batch means more may be due: look again at once.
        if taken == 0 || taken < free {
            tokio::select! {
                _ = wake.notify.notified() => {}
                _ = actix_web::rt::time::sleep(POLL_EVERY) => {}
            }
        }
    }
    tracing::info!("forward dispatcher stopped");
}

/// One attempt: send, judge the answer, record it.
// At ERROR level, so that its fields are on every line whatever level `RUST_LOG` lets through.
#[tracing::instrument(
    name = "forward",
    level = "error",
    skip_all,
    fields(source = %due.source, target = %due.target, event.id = %due.event_id, attempt = due.attempt)
)]
async fn attempt(outbox: &Outbox, client: &awc::Client, due: Due) {
    let started = Instant::now();
    let target = outbox
        .targets
        .get(&(due.source.clone(), due.target.clone()));
    let outcome = match target {
        Some(target) => send(client, target, &due).await,
        None => Settle::Dead {
            status: None,
            error: format!(
                "source {} no longer has a forward target named {} in the config",
                due.source, due.target
            ),
        },
    };
    let max_attempts = target.map_or(1, |t| t.config.max_attempts);
    let outcome = give_up_after(outcome, due.attempt, max_attempts);
    let result = match &outcome {
        Settle::Delivered { .. } => ForwardResult::Delivered,
        Settle::Retry { .. } => ForwardResult::Retried,
        Settle::Dead { .. } => ForwardResult::Dead,
    };
    let elapsed = started.elapsed();
    match &outcome {
        Settle::Delivered { status } => tracing::info!(
            status,
            duration_ms = elapsed.as_millis() as u64,
            "forwarded"
        ),
        Settle::Retry { error, after, .. } => tracing::warn!(
            error = %error,
            retry_in_ms = after.as_millis() as u64,
            "forward attempt failed; will retry"
        ),
        Settle::Dead { error, .. } => {
            tracing::error!(error = %error, "forward gave up; the delivery is dead-lettered")
        }
    }
    outbox
        .metrics
        .record_forward(&due.source, &due.target, result, elapsed);

    let pool = outbox.pool.clone();
    let id = due.id;
    let stored = web::block(move || {
        db::with_connection(&pool, |conn| deliveries::settle(conn, id, &outcome))
    })
    .await;
    // The lease runs out and the row is attempted again: at least once, never lost.
    match stored {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            error = %e,
            "cannot record the forward attempt; it will be attempted again"
        ),
        Err(_) => {
            tracing::error!("recording the forward attempt panicked; it will be attempted again")
        }
    }
}

/// A retry past the last allowed attempt is dead instead.
fn give_up_after(outcome: Settle, attempt: i32, max_attempts: u32) -> Settle {
    match outcome {
        Settle::Retry { status, error, .. }
            if attempt >= i32::try_from(max_attempts).unwrap_or(i32::MAX) =>
        {
            Settle::Dead {
                status,
                error: format!("{error}; gave up after {attempt} attempts"),
            }
        }
        other => other,
    }
}

/// The headers of one attempt: the stable key, the Standard Webhooks signature, and the
/// event's identity.
fn headers(target: &Target, due: &Due, now: i64) -> Vec<(String, String)> {
    let key = format!("{}:{}", due.source, due.event_id);
    let mut headers = target.signer.sign(&due.payload, now, &key, None);
    headers.extend([
        ("Idempotency-Key".to_owned(), key),
        ("X-Hookbox-Source".to_owned(), due.source.clone()),
        ("X-Hookbox-Target".to_owned(), due.target.clone()),
        ("X-Hookbox-Event-Id".to_owned(), due.event_id.clone()),
        ("X-Hookbox-Attempt".to_owned(), due.attempt.to_string()),
        (
            "Content-Type".to_owned(),
            due.content_type
                .clone()
                .unwrap_or_else(|| "application/json".to_owned()),
        ),
    ]);
    if let Some(event_type) = &due.event_type {
        headers.push(("X-Hookbox-Event-Type".to_owned(), event_type.clone()));
    }
    headers
}

async fn send(client: &awc::Client, target: &Target, due: &Due) -> Settle {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut request = client.post(&target.config.url);
    for (name, value) in headers(target, due, now) {
        // An id may hold non-ASCII characters: sent as raw bytes, as HTTP allows.
        match HeaderValue::from_bytes(value.as_bytes()) {
            Ok(value) => request = request.insert_header((name, value)),
            Err(_) => {
                return Settle::Dead {
                    status: None,
                    error: format!("the {name} header cannot carry this event's value"),
                }
            }
        }
    }
    let timeout = target.config.timeout;
    let exchange = async {
        let mut response = request.send_body(due.payload.clone()).await?;
        // Read (and drop) the body so the connection can be reused.
        let _ = response.body().limit(64 * 1024).await;
        Ok::<_, awc::error::SendRequestError>(response)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Settle::Retry {
            status: None,
            error: format!("no answer within {}", humantime::format_duration(timeout)),
            after: backoff(due.attempt),
        },
        Ok(Err(e)) => Settle::Retry {
            status: None,
            error: format!("cannot reach the downstream: {e}"),
            after: backoff(due.attempt),
        },
        Ok(Ok(response)) => judge(
            response.status().as_u16(),
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            due.attempt,
        ),
    }
}

/// What an HTTP answer means for the delivery.
fn judge(status: u16, retry_after: Option<&str>, attempt: i32) -> Settle {
    match status {
        200..=299 => Settle::Delivered { status },
        410 => Settle::Dead {
            status: Some(status),
            error: "the downstream answered 410 Gone; not retried".to_owned(),
        },
        429 | 500..=599 => {
            let wait = backoff(attempt).max(
                retry_after
                    .and_then(|v| retry::retry_after(v, SystemTime::now()))
                    .unwrap_or_default(),
            );
            Settle::Retry {
                status: Some(status),
                error: format!("the downstream answered {status}"),
                after: wait.min(BACKOFF_CAP),
            }
        }
        _ => Settle::Dead {
            status: Some(status),
            error: format!("the downstream answered {status}; not retried"),
        },
    }
}

/// The wait before retry `attempt` of a delivery.
fn backoff(attempt: i32) -> Duration {
    retry::backoff(
        BACKOFF_BASE,
        BACKOFF_CAP,
        u32::try_from(attempt).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_judged_as_the_contract_says() {
        assert_eq!(judge(204, None, 1), Settle::Delivered { status: 204 });
        assert!(matches!(
            judge(410, None, 1),
            Settle::Dead {
                status: Some(410),
                ..
            }
        ));
        assert!(matches!(
            judge(404, None, 1),
            Settle::Dead {
                status: Some(404),
                ..
            }
        ));
        assert!(matches!(judge(302, None, 1), Settle::Dead { .. }));
        assert!(matches!(
            judge(503, None, 1),
            Settle::Retry {
                status: Some(503),
                ..
            }
        ));
        assert!(matches!(judge(429, None, 1), Settle::Retry { .. }));
    }

    #[test]
    fn retry_after_is_a_floor_under_the_backoff() {
        let Settle::Retry { after, .. } = judge(503, Some("30"), 1) else {
            panic!("503 is retried");
        };
        assert!(after >= Duration::from_secs(30));
        let Settle::Retry { after, .. } = judge(429, Some("Wed, 21 Oct 2015 07:28:00 GMT"), 1)
        else {
            panic!("429 is retried");
        };
        assert!(
            after <= BACKOFF_BASE,
            "a date in the past asks for no extra wait"
        );
    }

    #[test]
    fn the_last_allowed_attempt_is_dead_not_retried() {
        let retry = Settle::Retry {
            status: Some(503),
            error: "the downstream answered 503".to_owned(),
            after: Duration::from_secs(1),
        };
        assert_eq!(give_up_after(retry.clone(), 2, 3), retry);
        assert!(matches!(
            give_up_after(retry, 3, 3),
            Settle::Dead {
                status: Some(503),
                ..
            }
        ));
    }
}
