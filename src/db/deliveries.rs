//! The owner of the `deliveries` table (the forward outbox): every statement on it is here.
//! A row is queued with its event's claim ([`enqueue`]; [`enqueue_many`] for a batch of
//! claims), taken under a lease by the dispatcher ([`take_due`]), settled after each attempt
//! ([`settle`]), and shown and re-queued by the admin API and the console ([`of_event`],
//! [`requeue`], [`redeliver`], [`requeue_dead`], [`counts`], [`pending_by_target`]). Rows go
//! with their event (`ON DELETE CASCADE`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Integer, Nullable, Text};
use serde::Serialize;

use super::{now, on_backend, write_transaction, AnyConnection};

/// A delivery taken for an attempt: its lease runs, so no other dispatcher takes it meanwhile.
#[derive(Debug, QueryableByName)]
pub struct Due {
    /// The outbox row.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// Which attempt this is, from 1.
    #[diesel(sql_type = Integer)]
    pub attempt: i32,
    /// The event's source.
    #[diesel(sql_type = Text)]
    pub source: String,
    /// The target's name within the source.
    #[diesel(sql_type = Text)]
    pub target: String,
    /// The provider's event id.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// The provider's event type.
    #[diesel(sql_type = Nullable<Text>)]
    pub event_type: Option<String>,
    /// The original body, byte for byte.
    #[diesel(sql_type = Bytea)]
    pub payload: Vec<u8>,
    /// The original `Content-Type`, if the delivery had one.
    #[diesel(sql_type = Nullable<Text>)]
    pub content_type: Option<String>,
}

/// How an attempt ended, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// 2xx: done.
    Delivered {
        /// The downstream's status.
        status: u16,
    },
    /// Failed; try again after `after`.
    Retry {
        /// The downstream's status, if it answered.
        status: Option<u16>,
        /// What went wrong, in a sentence.
        error: String,
        /// How long until the next attempt.
        after: Duration,
    },
    /// Failed for good.
    Dead {
        /// The downstream's status, if it answered.
        status: Option<u16>,
        /// What went wrong, in a sentence.
        error: String,
    },
}

/// A delivery as the admin API and the console show it.
#[derive(Debug, Clone, Serialize, Queryable)]
pub struct DeliveryView {
    /// The outbox row id (for requeue).
    pub id: i64,
    /// The forward target's name within the source (`default` for the single-table form).
    pub target: String,
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    /// Attempts made so far.
    pub attempts: i32,
    /// The last attempt's HTTP status, if it got one.
    pub last_status: Option<i16>,
    /// The last failure, in a sentence.
    pub last_error: Option<String>,
    /// When the next attempt is due (pending only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was queued (with the claim).
    pub created_at: DateTime<Utc>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Queues a delivery of the event stored in row `event_row` to each of `targets` (names within
/// its source). Runs in the claim's transaction, so an event is queued if and only if it is
/// stored.
pub fn enqueue(conn: &mut AnyConnection, event_row: i64, targets: &[String]) -> QueryResult<()> {
    on_backend!(conn, c => {
        let rows: Vec<_> = targets
            .iter()
            .map(|target| (deliveries::event_row.eq(event_row), deliveries::target.eq(target)))
            .collect();
        diesel::insert_into(deliveries::table).values(rows).execute(c)
    })
    .map(|_| ())
}

/// Rows one INSERT of [`enqueue_many`] carries at most (two bound values each; SQLite caps
/// the bound values of a statement).
const ENQUEUE_CHUNK: usize = 1000;

/// Queues the deliveries `rows`, each (event row, target name), for the events of several
/// claims at once: one multi-row INSERT (per [`ENQUEUE_CHUNK`] rows). Runs in the transaction
/// of the claims' batch, so each event is queued if and only if it is stored.
pub fn enqueue_many(conn: &mut AnyConnection, rows: &[(i64, &str)]) -> QueryResult<()> {
    for chunk in rows.chunks(ENQUEUE_CHUNK) {
        on_backend!(conn, c => {
            let values: Vec<_> = chunk
                .iter()
                .map(|(event_row, target)| {
                    (deliveries::event_row.eq(*event_row), deliveries::target.eq(*target))
                })
                .collect();
            diesel::insert_into(deliveries::table).values(values).execute(c)
        })?;
    }
    Ok(())
}

/// Takes up to `limit` due deliveries, oldest due first, and leases each for `lease`: its
/// `next_attempt_at` moves past the attempt's end, so no other dispatcher takes it meanwhile.
pub fn take_due(conn: &mut AnyConnection, limit: i64, lease: Duration) -> QueryResult<Vec<Due>> {
    match conn {
        AnyConnection::Postgres(c) => take_due_pg(c, limit, lease),
        AnyConnection::Sqlite(c) => take_due_sqlite(c, limit, lease),
    }
}

/// [`take_due`] on PostgreSQL: `FOR UPDATE SKIP LOCKED` lets several dispatchers take rows at
/// once without taking the same row twice.
fn take_due_pg(
    conn: &mut diesel::PgConnection,
    limit: i64,
    lease: Duration,
) -> QueryResult<Vec<Due>> {
    diesel::sql_query(
        "UPDATE deliveries d \
         SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $2) \
         FROM events e \
         WHERE d.id IN (SELECT id FROM deliveries \
                        WHERE state = 'pending' AND next_attempt_at <= now() \
                        ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
           AND e.id = d.event_row \
         RETURNING d.id, d.attempts AS attempt, e.source, d.target, e.event_id, e.event_type, e.payload, \
                   e.headers ->> 'content-type' AS content_type",
    )
    .bind::<BigInt, _>(limit)
    .bind::<diesel::sql_types::Double, _>(lease.as_secs_f64())
    .load(conn)
}

/// [`take_due`] on SQLite. The write lock, taken first, keeps other dispatchers (of other
/// processes on the same file) out until the leases are written.
fn take_due_sqlite(
    conn: &mut diesel::SqliteConnection,
    limit: i64,
    lease: Duration,
) -> QueryResult<Vec<Due>> {
    use super::sqlite::Instant;
    let now = now();
    let lease_end = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::hours(1));
    conn.immediate_transaction(|conn| {
        let due: Vec<Due> = diesel::sql_query(
            "SELECT d.id, d.attempts + 1 AS attempt, e.source, d.target, e.event_id, e.event_type, \
                    e.payload, json_extract(e.headers, '$.\"content-type\"') AS content_type \
             FROM deliveries d JOIN events e ON e.id = d.event_row \
             WHERE d.state = 'pending' AND d.next_attempt_at <= ?1 \
             ORDER BY d.next_attempt_at LIMIT ?2",
        )
        .bind::<Instant, _>(now)
        .bind::<BigInt, _>(limit)
        .load(conn)?;
        if !due.is_empty() {
            let ids: Vec<i64> = due.iter().map(|d| d.id).collect();
            diesel::sql_query(
                "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?1 \
                 WHERE id IN (SELECT value FROM json_each(?2))",
            )
            .bind::<Instant, _>(lease_end)
            .bind::<Text, _>(serde_json::to_string(&ids).expect("numbers serialize"))
            .execute(conn)?;
        }
        Ok(due)
    })
}

fn status_column(status: Option<u16>) -> Option<i16> {
    status.and_then(|s| i16::try_from(s).ok())
}

/// Records an attempt's outcome.
pub fn settle(conn: &mut AnyConnection, id: i64, outcome: &Settle) -> QueryResult<()> {
    let now = now();
    on_backend!(conn, c => {
    let row = deliveries::table.find(id);
    match outcome {
        Settle::Delivered { status } => diesel::update(row)
            .set((
                deliveries::state.eq("delivered"),
                deliveries::last_status.eq(status_column(Some(*status))),
                deliveries::last_error.eq(None::<String>),
                deliveries::delivered_at.eq(now),
            ))
            .execute(c),
        Settle::Retry {
            status,
            error,
            after,
        } => {
            let due =
                now + chrono::Duration::from_std(*after).unwrap_or(chrono::Duration::hours(24));
            diesel::update(row)
                .set((
                    deliveries::last_status.eq(status_column(*status)),
                    deliveries::last_error.eq(error),
                    deliveries::next_attempt_at.eq(due),
                ))
                .execute(c)
        }
        Settle::Dead { status, error } => diesel::update(row)
            .set((
                deliveries::state.eq("dead"),
                deliveries::last_status.eq(status_column(*status)),
                deliveries::last_error.eq(error),
            ))
            .execute(c),
    }
    .map(|_| ())
    })
}

type ViewRow = (
    i64,
    String,
    String,
    i32,
    Option<i16>,
    Option<String>,
    DateTime<Utc>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn view(row: ViewRow) -> DeliveryView {
    let (id, target, state, attempts, last_status, last_error, next, created_at, delivered_at) =
        row;
    DeliveryView {
        next_attempt_at: (state == "pending").then_some(next),
        id,
        target,
        state,
        attempts,
        last_status,
        last_error,
        created_at,
        delivered_at,
    }
}

/// The columns of a [`ViewRow`], for the backend's `deliveries` in scope.
macro_rules! view_columns {
    () => {
        (
            deliveries::id,
            deliveries::target,
            deliveries::state,
            deliveries::attempts,
            deliveries::last_status,
            deliveries::last_error,
            deliveries::next_attempt_at,
            deliveries::created_at,
            deliveries::delivered_at,
        )
    };
}

/// The deliveries of the event stored in row `event_row`, one per target, in the order queued.
pub fn of_event(conn: &mut AnyConnection, event_row: i64) -> QueryResult<Vec<DeliveryView>> {
    on_backend!(conn, c => {
    let rows: Vec<ViewRow> = deliveries::table
        .filter(deliveries::event_row.eq(event_row))
        .order(deliveries::id)
        .select(view_columns!())
        .load(c)?;
    Ok(rows.into_iter().map(view).collect())
    })
}

/// Makes a dead delivery pending again, due now, with a fresh count of attempts.
/// `Ok(None)`: no such delivery; `Ok(Some(Err(state)))`: it is not dead.
pub fn requeue(
    conn: &mut AnyConnection,
    id: i64,
) -> QueryResult<Option<Result<DeliveryView, String>>> {
    let now = now();
    write_transaction(conn, |conn| {
        on_backend!(conn, c => {
            // The state read tells the caller why nothing was re-queued; the UPDATE itself
            // re-checks `state = 'dead'`, so two re-queues at once re-queue it once (on SQLite
            // the write lock keeps the two apart anyway).
            let state: Option<String> = deliveries::table
                .find(id)
                .select(deliveries::state)
                .first(c)
                .optional()?;
            match state.as_deref() {
                None => Ok(None),
                Some("dead") => {
                    let row: Option<ViewRow> = diesel::update(deliveries::table.find(id))
                        .set((
                            deliveries::state.eq("pending"),
                            deliveries::attempts.eq(0),
                            deliveries::next_attempt_at.eq(now),
                        ))
                        .filter(deliveries::state.eq("dead"))
                        .returning(view_columns!())
                        .get_result(c)
                        .optional()?;
                    Ok(Some(row.map(view).ok_or_else(|| "pending".to_owned())))
                }
                Some(other) => Ok(Some(Err(other.to_owned()))),
            }
        })
    })
}

/// Pending and dead rows, for the gauges.
pub fn counts(conn: &mut AnyConnection) -> QueryResult<(i64, i64)> {
    on_backend!(conn, c => {
    let pending = deliveries::table
        .filter(deliveries::state.eq("pending"))
        .count()
        .get_result(c)?;
    let dead = deliveries::table
        .filter(deliveries::state.eq("dead"))
        .count()
        .get_result(c)?;
    Ok((pending, dead))
    })
}

/// Pending rows by (source, target), for the per-target gauge.
pub fn pending_by_target(conn: &mut AnyConnection) -> QueryResult<Vec<(String, String, i64)>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        source: String,
        #[diesel(sql_type = Text)]
        target: String,
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let query = diesel::sql_query(
        "SELECT e.source, d.target, count(*) AS n \
         FROM deliveries d JOIN events e ON e.id = d.event_row \
         WHERE d.state = 'pending' GROUP BY e.source, d.target",
    );
    let rows: Vec<Row> = on_backend!(conn, c => query.load(c))?;
    Ok(rows
        .into_iter()
        .map(|r| (r.source, r.target, r.n))
        .collect())
}

/// The ids re-queued at once by one UPDATE (SQLite caps the bound values of a statement).
const REQUEUE_CHUNK: usize = 5000;

/// Makes the rows `ids` that are in one of `states` pending again, due now, with a fresh count
/// of attempts; returns how many changed. The UPDATE re-checks the state, so two re-queues at
/// once re-queue a row once.
fn requeue_rows(conn: &mut AnyConnection, ids: &[i64], states: &[&str]) -> QueryResult<usize> {
    let now = now();
    let mut requeued = 0;
    for chunk in ids.chunks(REQUEUE_CHUNK) {
        requeued += on_backend!(conn, c => diesel::update(
            deliveries::table
                .filter(deliveries::id.eq_any(chunk))
                .filter(deliveries::state.eq_any(states)),
        )
        .set((
            deliveries::state.eq("pending"),
            deliveries::attempts.eq(0),
            deliveries::next_attempt_at.eq(now),
            deliveries::delivered_at.eq(None::<DateTime<Utc>>),
        ))
        .execute(c))?;
    }
    Ok(requeued)
}

/// Queues a new attempt series for the delivered or dead deliveries of the event stored in row
/// `event_row` (only the one to `target`, if given): each is pending again, due now, with a
/// fresh count of attempts, and goes out with the same key. Pending ones are left as they are.
/// Returns how many were re-queued.
pub fn redeliver(
    conn: &mut AnyConnection,
    event_row: i64,
    target: Option<&str>,
) -> QueryResult<usize> {
    write_transaction(conn, |conn| {
        let ids: Vec<i64> = on_backend!(conn, c => {
            let mut select = deliveries::table
                .filter(deliveries::event_row.eq(event_row))
                .select(deliveries::id)
                .into_boxed();
            if let Some(target) = target {
                select = select.filter(deliveries::target.eq(target));
            }
            select.load(c)
        })?;
        requeue_rows(conn, &ids, &["delivered", "dead"])
    })
}

/// Re-queues every dead delivery that matches: of events of `source`, to targets named
/// `target`, queued at or after `since` (each only if given). Returns how many.
pub fn requeue_dead(
    conn: &mut AnyConnection,
    source: Option<&str>,
    target: Option<&str>,
    since: Option<DateTime<Utc>>,
) -> QueryResult<usize> {
    write_transaction(conn, |conn| {
        let ids: Vec<i64> = on_backend!(conn, c => {
            let mut select = deliveries::table
                .filter(deliveries::state.eq("dead"))
                .select(deliveries::id)
                .into_boxed();
            if let Some(source) = source {
                select = select.filter(
                    deliveries::event_row.eq_any(
                        events::table
                            .filter(events::source.eq(source.to_owned()))
                            .select(events::id),
                    ),
                );
            }
            if let Some(target) = target {
                select = select.filter(deliveries::target.eq(target.to_owned()));
            }
            if let Some(since) = since {
                select = select.filter(deliveries::created_at.ge(since));
            }
            select.load(c)
        })?;
        requeue_rows(conn, &ids, &["dead"])
    })
}
