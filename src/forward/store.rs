//! The outbox table: taking due rows, recording how an attempt went, and what the admin API
//! shows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Integer, Nullable, Text};
use serde::Serialize;

use crate::db::{self, on_backend, AnyConnection};
use crate::ids::storable;

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
pub fn settle(conn: &mut AnyConnection, id: i64, outcome: &Settle) -> QueryResult<()> {
    let now = db::now();
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

/// The columns of a [`ViewRow`], for the backend's `deliveries` in scope.
macro_rules! view_columns {
    () => {
        (
            deliveries::id,
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

/// The deliveries of one stored event; `None` when no such event is stored.
pub fn for_event(
    conn: &mut AnyConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<Vec<DeliveryView>>> {
    if !storable(source) || !storable(event_id) {
        return Ok(None);
    }
    on_backend!(conn, c => {
    let row: Option<i64> = events::table
        .filter(events::source.eq(source))
        .filter(events::event_id.eq(event_id))
        .select(events::id)
        .first(c)
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let rows: Vec<ViewRow> = deliveries::table
        .filter(deliveries::event_row.eq(row))
        .order(deliveries::id)
        .select(view_columns!())
        .load(c)?;
    Ok(Some(rows.into_iter().map(view).collect()))
    })
}

/// Makes a dead delivery pending again, due now, with a fresh count of attempts.
/// `Ok(None)`: no such delivery; `Ok(Some(Err(state)))`: it is not dead.
pub fn requeue(
    conn: &mut AnyConnection,
    id: i64,
) -> QueryResult<Option<Result<DeliveryView, String>>> {
    let now = db::now();
    db::write_transaction(conn, |conn| {
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
