//! The heart of hookbox: claim → handle → store, atomically.
//!
//! Under READ COMMITTED, `INSERT ... ON CONFLICT (source, event_id) DO NOTHING RETURNING id`
//! decides who owns an event. One row back: this delivery claimed it, and the handler's
//! response is stored before the commit. No row: another transaction committed the id first,
//! and its stored response is the answer. A duplicate that arrives while the first transaction
//! is still open blocks inside the INSERT until that transaction ends (PostgreSQL's unique-index
//! check waits for it), for at most the session's `lock_timeout` (the in-flight wait); if the
//! first rolls back, the waiting INSERT claims the event itself.
//!
//! On SQLite the same statements run, but a transaction holds the database's one write lock
//! from its start (`BEGIN IMMEDIATE`, see [`db::write_transaction`]): a duplicate waits before
//! its transaction begins, for the first one's commit or rollback, then its INSERT finds the
//! committed row (or claims the event). Within a process, claims wait their turn on
//! [`db::WriteTurns`] first. Either wait past the in-flight wait is [`Outcome::InFlight`].
//!
//! Two ways to the same guarantee:
//! - a handler that uses the connection runs inside a transaction: INSERT the claim, run the
//!   handler, UPDATE the row with its response (and queue the outbox row), COMMIT;
//! - a handler that answers from the event alone ([`Handler::uses_connection`] is false, as for
//!   the built-in `record`) is asked first, and the claim and its response go in as one INSERT,
//!   atomic on its own: one round trip for a new event instead of four. Where the source
//!   forwards, the INSERT and the event's outbox rows commit in one transaction. Either way,
//!   [`Batcher`] gathers the claims waiting at once into one INSERT (and one INSERT of their
//!   outbox rows).

mod batch;
mod cache;
mod fingerprint;
mod items;

pub use batch::Batcher;
pub use cache::{Cached, ReplayCache};
pub use fingerprint::fingerprint;
pub use items::{claim_batch, BatchOutcome};

use actix_web::web::Bytes;
use chrono::{DateTime, Utc};
use diesel::result::Error as DieselError;

use crate::db::events::{self, Answer, NewEvent};
use crate::db::{self, deliveries, AnyConnection};
use crate::handlers::{Event, Handler, Response};
use crate::ids::{EventId, EventType, SourceName};

/// A delivery whose signature checked out and whose event id is known: ready to be claimed.
#[derive(Debug)]
pub struct Delivery {
    /// Where it arrived.
    pub source: SourceName,
    /// The provider's event id.
    pub event_id: EventId,
    /// The provider's event type, if the scheme carries one, as stores can hold it.
    pub event_type: Option<EventType>,
    /// See [`fingerprint`].
    pub fingerprint: [u8; 32],
    /// The raw body.
    pub body: Bytes,
    /// The body as JSON, when it parsed.
    pub json: Option<serde_json::Value>,
    /// The kept headers, lowercase name → value, as a JSON object.
    pub headers: serde_json::Value,
    /// The forward targets (by name) whose `events` patterns match this event: the claim
    /// queues one outbox row for each in the same transaction. Empty: nothing is queued.
    pub forward: Vec<String>,
    /// When the in-flight wait of this delivery ends: every wait of its claim (for a write
    /// turn, for another transaction's claim, on each try) ends by then, in all.
    pub deadline: std::time::Instant,
    /// When its request is answered whatever becomes of the claim (`server.request_timeout`).
    /// A claim in a transaction that is ready to commit only after it is rolled back instead
    /// ([`ClaimError::TooLate`]): committed, it stored an event its provider was told was not
    /// taken (a black-box run: minutes later, under the received time it had then, and an
    /// ordered target got it far out of order).
    pub answer_by: std::time::Instant,
    /// For a source with `dedupe = "body"`: the key its payload is stored under (the
    /// fingerprint, or what the signature covers where bodies of other bytes verify alike:
    /// [`Provider::signed_payload_key`](crate::providers::Provider::signed_payload_key)),
    /// unique per source, so the same payload under another event id is a replay of the event
    /// stored first ([`Outcome::BodyReplay`]). `None` otherwise.
    pub dedupe_key: Option<[u8; 32]>,
}

/// A response committed with its claim. It never changes once committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The stored HTTP status.
    pub status: u16,
    /// The stored `Content-Type`.
    pub content_type: String,
    /// The stored body, byte for byte.
    pub body: Bytes,
    /// When the event was claimed.
    pub received_at: DateTime<Utc>,
}

impl StoredResponse {
    fn new(response: Response, received_at: DateTime<Utc>) -> Self {
        StoredResponse {
            status: response.status,
            content_type: response.content_type,
            body: Bytes::from(response.body),
            received_at,
        }
    }
}

/// What claiming a delivery came to.
#[derive(Debug)]
pub enum Outcome {
    /// This delivery claimed the event; the handler's response is stored and committed.
    Claimed(StoredResponse),
    /// Another delivery committed the event first: answer with its response.
    Replay(StoredResponse),
    /// The source dedupes by body, and this payload is stored under another event id: answer
    /// with that event's response, as a replay of it. Nothing is stored under this id.
    BodyReplay {
        /// The event id the payload was first stored under.
        first_event_id: String,
        /// Its stored answer.
        stored: StoredResponse,
    },
    /// Another delivery of the event is still in its transaction after the in-flight wait.
    InFlight,
    /// On SQLite: the write lock (or this process's turn at it) stayed with another writer
    /// past the in-flight wait. It may be another delivery of this event, or any other write.
    Busy,
    /// On PostgreSQL: the wait past the in-flight wait was for a table another session holds
    /// locked (a migration, a `LOCK TABLE`), not for a duplicate.
    Locked,
    /// The event id is stored with a different payload.
    Mismatch,
}

/// Why a claim could not be settled.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The handler failed or panicked; everything was rolled back.
    #[error("the handler failed: {0:#}")]
    Handler(anyhow::Error),
    /// The database failed (unreachable, connection lost, ...); nothing was committed.
    #[error("database error: {0}")]
    Database(#[from] DieselError),
    /// The claim's transaction came to its commit after its delivery's answer was due (held
    /// up by a database that stalled): it was rolled back, not committed.
    #[error("the claim was ready to commit only after the request timeout; rolled back")]
    TooLate,
}

/// Whether `delivery` must be claimed in a transaction of its own: its handler writes, or its
/// source dedupes by body (the claim may then conflict on the payload as well as the id, see
/// [`Delivery::dedupe_key`]). Otherwise it may be batched with others (see [`Batcher`]): its
/// handler answers before the claim, and the claim, the answer and its outbox rows (where its
/// source forwards) go in with the batch's.
pub fn needs_transaction(delivery: &Delivery, handler: &dyn Handler) -> bool {
    handler.uses_connection() || delivery.dedupe_key.is_some()
}

/// Whether [`claim`] stores `delivery` in one statement: claim and answer as one INSERT,
/// atomic on its own. Not where it needs a transaction anyway, or queues outbox rows, which
/// must commit with the claim.
fn in_one_statement(delivery: &Delivery, handler: &dyn Handler) -> bool {
    !needs_transaction(delivery, handler) && delivery.forward.is_empty()
}

/// Claims, processes and stores `delivery` atomically, or finds the stored answer.
pub fn claim(
    conn: &mut db::Conn,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Outcome, ClaimError> {
    claim_until(conn, delivery, handler, delivery.deadline)
}

/// [`claim`], waiting for another transaction's claim of the event (or the store's write lock)
/// until `until` rather than the delivery's own deadline, however short the connection's own
/// wait (see [`db::Conn::waiting_all_until`]).
fn claim_until(
    conn: &mut db::Conn,
    delivery: &Delivery,
    handler: &dyn Handler,
    until: std::time::Instant,
) -> Result<Outcome, ClaimError> {
    let Ok(_turn) = conn.write_turn(until) else {
        return Ok(Outcome::Busy);
    };
    conn.waiting_all_until(until, |conn| claim_within(conn, delivery, handler))
}

/// [`claim`], with the wait for another transaction's claim bounded by the session.
fn claim_within(
    conn: &mut AnyConnection,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Outcome, ClaimError> {
    // The only way round twice: the stored row vanished (purged) between the INSERT's
    // conflict and the read of the stored response. The second INSERT then claims afresh.
    for _ in 0..2 {
        let attempt = if in_one_statement(delivery, handler) {
            claim_in_one_statement(conn, delivery, handler)
        } else {
            db::write_transaction(conn, |conn| claim_in_transaction(conn, delivery, handler))
        };
        match attempt {
            Ok(Some(outcome)) => return Ok(outcome),
            Ok(None) => continue,
            Err(ClaimError::Database(e)) if db::sqlite::is_busy(&e) => return Ok(Outcome::Busy),
            Err(ClaimError::Database(e)) if db::is_lock_timeout(&e) => {
                return Ok(match db::tables_locked(conn) {
                    true => Outcome::Locked,
                    false => Outcome::InFlight,
                })
            }
            // A write the store refused (a full disk, a read-only file) need not keep a stored
            // event from its answer, which is a read: its replay and a reused id's 422 stand.
            // SQLite refused even an INSERT that would have conflicted, on a disk full from
            // before a restart (a black-box run: replays and 422s answered 503).
            Err(ClaimError::Database(e)) if write_refused(&e) => {
                return match stored(conn, delivery) {
                    Ok(Some(outcome)) => Ok(outcome),
                    _ => Err(ClaimError::Database(e)),
                };
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClaimError::Database(DieselError::NotFound))
}

/// Whether the store refused to write at all (no room, no permission, its file unwritable),
/// which says nothing against reading what it holds.
pub(super) fn write_refused(error: &DieselError) -> bool {
    db::Failure::of(error).refused_a_write()
}

/// Runs the handler, turning a panic into an error and a nonsense status into one too.
fn run_handler(
    handler: &dyn Handler,
    conn: &mut AnyConnection,
    event: &Event<'_>,
) -> Result<Response, ClaimError> {
    match crate::telemetry::catch_panic(|| handler.handle(conn, event)) {
        Ok(Ok(response)) if !(100..=599).contains(&response.status) => {
            Err(ClaimError::Handler(anyhow::anyhow!(
                "the handler answered with status {}, which is not an HTTP status",
                response.status
            )))
        }
        // Stored as text and sent as a header: a control character (a NUL, which PostgreSQL
        // cannot store) is the handler's mistake, a 500, not a database failure.
        Ok(Ok(response))
            if actix_web::http::header::HeaderValue::from_str(&response.content_type).is_err() =>
        {
            Err(ClaimError::Handler(anyhow::anyhow!(
                "the handler answered with a Content-Type that is not a valid header value"
            )))
        }
        Ok(Ok(response)) => Ok(response),
        // A statement of the handler's that failed because the connection did (the database
        // restarted or went away) is the database's failure, not the handler's: 503, not 500.
        Ok(Err(e)) => Err(match e.downcast::<DieselError>() {
            Ok(error) if db::is_connection_error(&error) => ClaimError::Database(error),
            Ok(error) => ClaimError::Handler(error.into()),
            Err(e) => ClaimError::Handler(e),
        }),
        Err(what) => Err(ClaimError::Handler(anyhow::anyhow!(
            "the handler panicked: {what}"
        ))),
    }
}

fn event<'a>(delivery: &'a Delivery, row_id: i64, received_at: DateTime<Utc>) -> Event<'a> {
    Event {
        row_id,
        source: &delivery.source,
        event_id: &delivery.event_id,
        event_type: delivery.event_type.as_ref().map(EventType::as_str),
        received_at,
        body: &delivery.body,
        json: delivery.json.as_ref(),
    }
}

/// The claim's row of `delivery`, with its answer when it is known before the claim.
fn new_event<'a>(
    delivery: &'a Delivery,
    received_at: DateTime<Utc>,
    answer: Option<Answer<'a>>,
) -> NewEvent<'a> {
    NewEvent {
        source: delivery.source.as_str(),
        event_id: delivery.event_id.as_str(),
        event_type: delivery.event_type.as_ref().map(EventType::as_str),
        fingerprint: &delivery.fingerprint,
        received_at,
        payload: &delivery.body,
        headers: &delivery.headers,
        dedupe_key: delivery.dedupe_key.as_ref().map(|key| &key[..]),
        answer,
    }
}

/// A handler's response, as stored.
fn answer(response: &Response) -> Answer<'_> {
    Answer {
        status: i16::try_from(response.status).expect("run_handler admits only 100..=599"),
        content_type: &response.content_type,
        body: &response.body,
    }
}

/// The times `n` deliveries were received, in the order given: now on the store's clock
/// ([`crate::db::now`]) to the microsecond (the
/// stores keep microseconds, and a time stored must read back as the same time), each strictly
/// later than the one before and than every time this process gave out before. So within a
/// process no two events share a received time, and an ordered target gets them in the order
/// they reached the claim, also when one batch claims several at once (a batch inserts its rows
/// in key order, to take their locks in one order, so their row ids do not follow arrival).
///
/// Except after the clock went back by more than [`CLOCK_STEP_FOLLOWED`] (a step of the host's
/// clock, or its measured offset from the database's): then the clock is followed, since
/// holding on to the time given out before pinned every later event to it, a day ahead after
/// a moment's step of a day, and put them after other instances' later events.
fn received_times(n: usize) -> Vec<DateTime<Utc>> {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let count = i64::try_from(n).unwrap_or(i64::MAX);
    let mut last = LAST.load(Ordering::SeqCst);
    let first = loop {
        let first = next_time(last, crate::db::now_micros());
        let end = first.saturating_add(count - 1);
        match LAST.compare_exchange(last, end, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => break first,
            Err(now_last) => last = now_last,
        }
    };
    if first < last {
        tracing::warn!(
            back_seconds = format!("{:.3}", (last - first) as f64 / 1e6),
            "the clock went back (a step of this host's clock, or of its measured difference \
             from the database's): received times follow it, so events this instance received \
             just before may sort after the ones it receives now"
        );
    }
    (0..count)
        .map(|i| DateTime::from_timestamp_micros(first + i).expect("now is a representable time"))
        .collect()
}

/// How far back the clock may go before received times follow it (see [`received_times`]),
/// in microseconds: a second, past any jitter of the clock or of the offset's measure.
const CLOCK_STEP_FOLLOWED: i64 = 1_000_000;

/// The received time to give out next, in microseconds, the last given out being `last`:
/// after it, unless the clock (`now`) went back more than [`CLOCK_STEP_FOLLOWED`].
fn next_time(last: i64, now: i64) -> i64 {
    if last.saturating_sub(now) > CLOCK_STEP_FOLLOWED {
        now
    } else {
        now.max(last.saturating_add(1))
    }
}

/// The time one delivery was received (see [`received_times`]).
fn received_time() -> DateTime<Utc> {
    received_times(1)[0]
}

/// The claim and a precomputed response in one INSERT.
fn claim_in_one_statement(
    conn: &mut AnyConnection,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Option<Outcome>, ClaimError> {
    let received_at = received_time();
    let response = run_handler(handler, conn, &event(delivery, 0, received_at))?;
    let row = new_event(delivery, received_at, Some(answer(&response)));
    if events::claim(conn, &[row])?.is_empty() {
        return stored(conn, delivery);
    }
    Ok(Some(Outcome::Claimed(StoredResponse::new(
        response,
        received_at,
    ))))
}

/// The claim, the handler's writes and the response in one transaction.
fn claim_in_transaction(
    conn: &mut AnyConnection,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Option<Outcome>, ClaimError> {
    let received_at = received_time();
    let row = new_event(delivery, received_at, None);
    let Some(claimed) = events::claim(conn, &[row])?.pop() else {
        return stored(conn, delivery);
    };
    let response = run_handler(handler, conn, &event(delivery, claimed.row, received_at))?;
    events::set_answer(conn, claimed.row, &answer(&response))?;
    if !delivery.forward.is_empty() {
        deliveries::enqueue(conn, claimed.row, &delivery.forward)?;
    }
    if std::time::Instant::now() >= delivery.answer_by {
        return Err(ClaimError::TooLate);
    }
    Ok(Some(Outcome::Claimed(StoredResponse::new(
        response,
        received_at,
    ))))
}

impl StoredResponse {
    /// A committed answer, as read back; `None` if the row has none, which a committed claim
    /// never lacks.
    fn read(stored: events::Stored) -> Option<StoredResponse> {
        let answer = stored.answer?;
        Some(StoredResponse {
            status: u16::try_from(answer.status).unwrap_or(500),
            content_type: answer.content_type,
            body: Bytes::from(answer.body),
            received_at: stored.received_at,
        })
    }
}

/// Reads the committed answer for an event another transaction claimed.
fn stored(conn: &mut AnyConnection, delivery: &Delivery) -> Result<Option<Outcome>, ClaimError> {
    let found = events::answers(
        conn,
        delivery.source.as_str(),
        &[delivery.event_id.as_str()],
    )?
    .pop();
    let Some(found) = found else {
        return match delivery.dedupe_key {
            Some(key) => stored_payload(conn, delivery, &key),
            None => Ok(None),
        };
    };
    if found.fingerprint != delivery.fingerprint {
        return Ok(Some(Outcome::Mismatch));
    }
    // Claim and response commit together, so a committed claim has its response.
    match StoredResponse::read(found) {
        Some(stored) => Ok(Some(Outcome::Replay(stored))),
        None => Err(ClaimError::Database(DieselError::NotFound)),
    }
}

/// Reads the committed answer of the event stored first with this payload, for a source that
/// dedupes by body. `None` when there is none (purged meanwhile): the claim is tried again.
fn stored_payload(
    conn: &mut AnyConnection,
    delivery: &Delivery,
    key: &[u8; 32],
) -> Result<Option<Outcome>, ClaimError> {
    let Some(found) = events::answer_by_key(conn, delivery.source.as_str(), key)? else {
        return Ok(None);
    };
    let first_event_id = found.event_id.clone();
    match StoredResponse::read(found) {
        Some(stored) => Ok(Some(Outcome::BodyReplay {
            first_event_id,
            stored,
        })),
        None => Err(ClaimError::Database(DieselError::NotFound)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn received_times_go_on_after_the_last_unless_the_clock_went_back_past_a_second() {
        const SECOND: i64 = 1_000_000;
        let day = 86_400 * SECOND;
        let now = 1_796_600_000 * SECOND;
        // In step, and a clock a moment behind the last time given out: strictly after it.
        assert_eq!(next_time(now - 5, now), now);
        assert_eq!(next_time(now, now), now + 1);
        assert_eq!(next_time(now + SECOND / 2, now), now + SECOND / 2 + 1);
        assert_eq!(next_time(now + SECOND, now), now + SECOND + 1);
        // Back from a step of a day: the clock is followed, not the day-ahead time (which
        // pinned every later event a day ahead of the others').
        assert_eq!(next_time(now + day, now), now);
        assert_eq!(next_time(now + SECOND + 1, now), now);
        // The first time of all.
        assert_eq!(next_time(i64::MIN, now), now);
    }
}
