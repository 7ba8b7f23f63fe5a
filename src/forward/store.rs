//! The outbox table: taking due rows, recording how an attempt went, and what the admin API
//! shows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Double, Integer, Nullable, Text};
use serde::Serialize;

use crate::db::schema::{deliveries, events};

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

/// Takes up to `limit` due deliveries, oldest due first, and leases each for `lease`: its
/// `next_attempt_at` moves past the attempt's end, and `FOR UPDATE SKIP LOCKED` lets several
/// dispatchers take rows at once without taking the same row twice.
pub fn take_due(conn: &mut PgConnection, limit: i64, lease: Duration) -> QueryResult<Vec<Due>> {
    diesel::sql_query(
        "UPDATE deliveries d \
         SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $2) \
         FROM events e \
         WHERE d.id IN (SELECT id FROM deliveries \
                        WHERE state = 'pending' AND next_attempt_at <= now() \
                        ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
           AND e.id = d.event_row \
         RETURNING d.id, d.attempts AS attempt, e.source, e.event_id, e.event_type, e.payload, \
                   e.headers ->> 'content-type' AS content_type",
    )
    .bind::<BigInt, _>(limit)
    .bind::<Double, _>(lease.as_secs_f64())
    .load(conn)
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

fn status_column(status: Option<u16>) -> Option<i16> {
    status.and_then(|s| i16::try_from(s).ok())
}

/// Records an attempt's outcome.
pub fn settle(conn: &mut PgConnection, id: i64, outcome: &Settle) -> QueryResult<()> {
    let row = deliveries::table.find(id);
    match outcome {
        Settle::Delivered { status } => diesel::update(row)
            .set((
                deliveries::state.eq("delivered"),
                deliveries::last_status.eq(status_column(Some(*status))),
                deliveries::last_error.eq(None::<String>),
                deliveries::delivered_at.eq(diesel::dsl::now),
            ))
            .execute(conn),
        Settle::Retry {
            status,
            error,
            after,
        } => {
            let due = Utc::now()
                + chrono::Duration::from_std(*after).unwrap_or(chrono::Duration::hours(24));
            diesel::update(row)
                .set((
                    deliveries::last_status.eq(status_column(*status)),
                    deliveries::last_error.eq(error),
                    deliveries::next_attempt_at.eq(due),
                ))
                .execute(conn)
        }
        Settle::Dead { status, error } => diesel::update(row)
            .set((
                deliveries::state.eq("dead"),
                deliveries::last_status.eq(status_column(*status)),
                deliveries::last_error.eq(error),
            ))
            .execute(conn),
    }
    .map(|_| ())
}

/// A delivery as the admin API shows it.
#[derive(Debug, Clone, Serialize, Queryable)]
pub struct DeliveryView {
    /// The outbox row id (for requeue).
    pub id: i64,
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

type ViewRow = (
    i64,
    String,
    i32,
    Option<i16>,
    Option<String>,
    DateTime<Utc>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn view(row: ViewRow) -> DeliveryView {
    let (id, state, attempts, last_status, last_error, next, created_at, delivered_at) = row;
    DeliveryView {
        next_attempt_at: (state == "pending").then_some(next),
        id,
        state,
        attempts,
        last_status,
        last_error,
        created_at,
        delivered_at,
    }
}

const VIEW_COLUMNS: (
    deliveries::id,
    deliveries::state,
    deliveries::attempts,
    deliveries::last_status,
    deliveries::last_error,
    deliveries::next_attempt_at,
    deliveries::created_at,
    deliveries::delivered_at,
) = (
    deliveries::id,
    deliveries::state,
    deliveries::attempts,
    deliveries::last_status,
    deliveries::last_error,
    deliveries::next_attempt_at,
    deliveries::created_at,
    deliveries::delivered_at,
);

/// The deliveries of one stored event; `None` when no such event is stored.
pub fn for_event(
    conn: &mut PgConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<Vec<DeliveryView>>> {
    let row: Option<i64> = events::table
        .filter(events::source.eq(source))
        .filter(events::event_id.eq(event_id))
        .select(events::id)
        .first(conn)
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let rows: Vec<ViewRow> = deliveries::table
        .filter(deliveries::event_row.eq(row))
        .order(deliveries::id)
        .select(VIEW_COLUMNS)
        .load(conn)?;
    Ok(Some(rows.into_iter().map(view).collect()))
}

/// Makes a dead delivery pending again, due now, with a fresh count of attempts.
/// `Ok(None)`: no such delivery; `Ok(Some(Err(state)))`: it is not dead.
pub fn requeue(
    conn: &mut PgConnection,
    id: i64,
) -> QueryResult<Option<Result<DeliveryView, String>>> {
    conn.transaction(|conn| {
        let state: Option<String> = deliveries::table
            .find(id)
            .select(deliveries::state)
            .for_update()
            .first(conn)
            .optional()?;
        match state.as_deref() {
            None => Ok(None),
            Some("dead") => {
                let row: ViewRow = diesel::update(deliveries::table.find(id))
                    .set((
                        deliveries::state.eq("pending"),
                        deliveries::attempts.eq(0),
                        deliveries::next_attempt_at.eq(diesel::dsl::now),
                    ))
                    .returning(VIEW_COLUMNS)
                    .get_result(conn)?;
                Ok(Some(Ok(view(row))))
            }
            Some(other) => Ok(Some(Err(other.to_owned()))),
        }
    })
}

/// Pending and dead rows, for the gauges.
pub fn counts(conn: &mut PgConnection) -> QueryResult<(i64, i64)> {
    let pending = deliveries::table
        .filter(deliveries::state.eq("pending"))
        .count()
        .get_result(conn)?;
    let dead = deliveries::table
        .filter(deliveries::state.eq("dead"))
        .count()
        .get_result(conn)?;
    Ok((pending, dead))
}
