//! The heart of hookbox: claim → handle → store, in one transaction.
//!
//! Under READ COMMITTED, `INSERT ... ON CONFLICT (source, event_id) DO NOTHING RETURNING id`
//! decides who owns an event. One row back: this delivery claimed it, runs the handler and
//! stores the response before the commit. No row: another transaction committed the id first,
//! and its stored response is the answer. A duplicate that arrives while the first transaction
//! is still open blocks inside the INSERT until that transaction ends (PostgreSQL's unique-index
//! check waits for it), for at most the session's `lock_timeout` (the in-flight wait); if the
//! first rolls back, the waiting INSERT claims the event itself.

mod fingerprint;

pub use fingerprint::fingerprint;

use std::panic::{catch_unwind, AssertUnwindSafe};

use chrono::{DateTime, Utc};
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;

use crate::db;
use crate::db::schema::{deliveries, events};
use crate::handlers::{Event, Handler, Response};
use crate::ids::{EventId, SourceName};

/// A delivery whose signature checked out and whose event id is known: ready to be claimed.
#[derive(Debug)]
pub struct Delivery {
    /// Where it arrived.
    pub source: SourceName,
    /// The provider's event id.
    pub event_id: EventId,
    /// The provider's event type, if the scheme carries one.
    pub event_type: Option<String>,
    /// See [`fingerprint`].
    pub fingerprint: [u8; 32],
    /// The raw body.
    pub body: Vec<u8>,
    /// The body as JSON, when it parsed.
    pub json: Option<serde_json::Value>,
    /// The kept headers, lowercase name → value, as a JSON object.
    pub headers: serde_json::Value,
    /// Whether the source hands its events on downstream: if so, the claim queues a delivery
    /// in the outbox in the same transaction.
    pub forward: bool,
}

/// A response committed with its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The stored HTTP status.
    pub status: u16,
    /// The stored `Content-Type`.
    pub content_type: String,
    /// The stored body, byte for byte.
    pub body: Vec<u8>,
}

impl From<Response> for StoredResponse {
    fn from(r: Response) -> Self {
        StoredResponse {
            status: r.status,
            content_type: r.content_type,
            body: r.body,
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
    /// Another delivery of the event is still in its transaction after the in-flight wait.
    InFlight,
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
}

/// Claims, processes and stores `delivery` in one transaction, or finds the stored answer.
pub fn claim(
    conn: &mut PgConnection,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Outcome, ClaimError> {
    // The only way round twice: the stored row vanished (purged) between the INSERT's
    // conflict and the read of the stored response. The second INSERT then claims afresh.
    for _ in 0..2 {
        match conn.transaction(|conn| claim_once(conn, delivery, handler)) {
            Ok(Some(outcome)) => return Ok(outcome),
            Ok(None) => continue,
            Err(ClaimError::Database(e)) if db::is_lock_timeout(&e) => {
                return Ok(Outcome::InFlight)
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClaimError::Database(DieselError::NotFound))
}

fn claim_once(
    conn: &mut PgConnection,
    delivery: &Delivery,
    handler: &dyn Handler,
) -> Result<Option<Outcome>, ClaimError> {
    let claimed: Option<(i64, DateTime<Utc>)> = diesel::insert_into(events::table)
        .values((
            events::source.eq(delivery.source.as_str()),
            events::event_id.eq(delivery.event_id.as_str()),
            events::event_type.eq(delivery.event_type.as_deref()),
            events::fingerprint.eq(&delivery.fingerprint[..]),
            events::payload.eq(&delivery.body),
            events::headers.eq(&delivery.headers),
        ))
        .on_conflict((events::source, events::event_id))
        .do_nothing()
        .returning((events::id, events::received_at))
        .get_result(conn)
        .optional()?;

    let Some((row_id, received_at)) = claimed else {
        return stored(conn, delivery);
    };

    let event = Event {
        row_id,
        source: &delivery.source,
        event_id: &delivery.event_id,
        event_type: delivery.event_type.as_deref(),
        received_at,
        body: &delivery.body,
        json: delivery.json.as_ref(),
    };
    let response = match catch_unwind(AssertUnwindSafe(|| handler.handle(conn, &event))) {
        Ok(Ok(response)) if (100..=599).contains(&response.status) => response,
        Ok(Ok(response)) => {
            return Err(ClaimError::Handler(anyhow::anyhow!(
                "the handler answered with status {}, which is not an HTTP status",
                response.status
            )))
        }
        Ok(Err(e)) => return Err(ClaimError::Handler(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            return Err(ClaimError::Handler(anyhow::anyhow!(
                "the handler panicked: {what}"
            )));
        }
    };
    let status = i16::try_from(response.status).expect("checked to be 100..=599 above");
    diesel::update(events::table.find(row_id))
        .set((
            events::response_status.eq(status),
            events::response_content_type.eq(&response.content_type),
            events::response_body.eq(&response.body),
        ))
        .execute(conn)?;
    if delivery.forward {
        diesel::insert_into(deliveries::table)
            .values(deliveries::event_row.eq(row_id))
            .execute(conn)?;
    }
    Ok(Some(Outcome::Claimed(response.into())))
}

type StoredRow = (Vec<u8>, Option<i16>, Option<String>, Option<Vec<u8>>);

/// Reads the committed answer for an event another transaction claimed.
fn stored(conn: &mut PgConnection, delivery: &Delivery) -> Result<Option<Outcome>, ClaimError> {
    let row: Option<StoredRow> = events::table
        .filter(events::source.eq(delivery.source.as_str()))
        .filter(events::event_id.eq(delivery.event_id.as_str()))
        .select((
            events::fingerprint,
            events::response_status,
            events::response_content_type,
            events::response_body,
        ))
        .first(conn)
        .optional()?;
    let Some((fingerprint, status, content_type, body)) = row else {
        return Ok(None);
    };
    if fingerprint != delivery.fingerprint {
        return Ok(Some(Outcome::Mismatch));
    }
    match (status, content_type, body) {
        (Some(status), Some(content_type), Some(body)) => {
            Ok(Some(Outcome::Replay(StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                content_type,
                body,
            })))
        }
        // Claim and response commit together, so a committed claim has its response.
        _ => Err(ClaimError::Database(DieselError::NotFound)),
    }
}
