//! Handlers: what hookbox does with an event it has claimed.
//!
//! A [`Handler`] runs inside the claim transaction, on the same diesel connection, so its
//! database writes commit with the claim and the stored response, or not at all. An error (or a
//! panic) rolls everything back and the delivery is answered 500 `processing_failed`, so the
//! provider's retry processes the event again from scratch.
//!
//! Keep a handler database-only: an effect outside the database (an e-mail, a call to another
//! service) cannot be rolled back, and would repeat when a crash makes the provider retry.

mod record;

pub use record::Record;

use std::collections::HashMap;
use std::sync::Arc;

pub use crate::db::AnyConnection;
use chrono::{DateTime, Utc};

use crate::ids::{EventId, SourceName};

/// An event that this delivery has claimed, as the handler sees it.
#[derive(Debug)]
pub struct Event<'a> {
    /// The claim's row in `events`, for handler tables that reference it
    /// (`REFERENCES events (id) ON DELETE CASCADE` lets the retention purge take them along).
    /// 0 for a handler whose [`Handler::uses_connection`] is false.
    pub row_id: i64,
    /// The source it arrived at.
    pub source: &'a SourceName,
    /// The provider's event id.
    pub event_id: &'a EventId,
    /// The provider's event type, where the scheme carries one.
    pub event_type: Option<&'a str>,
    /// When the claim was made (the database's clock).
    pub received_at: DateTime<Utc>,
    /// The raw body, byte for byte as it was signed.
    pub body: &'a [u8],
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<&'a serde_json::Value>,
}

/// What a handler answers: stored with the claim and sent, byte for byte, to every delivery of
/// the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status, 100 to 599.
    pub status: u16,
    /// The `Content-Type` of `body`.
    pub content_type: String,
    /// The response body.
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON response with the given status.
    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        Response {
            status,
            content_type: "application/json".to_owned(),
            body: serde_json::to_vec(value).expect("a JSON value always serializes"),
        }
    }

    /// The standard answer for a processed event: 200 and
    /// `{"event_id", "event_type", "received_at", "source", "status": "processed"}`.
    pub fn processed(event: &Event<'_>) -> Self {
        Response::json(
            200,
            &serde_json::json!({
                "status": "processed",
                "source": event.source.as_str(),
                "event_id": event.event_id.as_str(),
                "event_type": event.event_type,
                "received_at": crate::db::shown_time(event.received_at),
            }),
        )
    }
}

/// Processes claimed events. Implement it to give a source its own behaviour, and register it
/// with [`Handlers::with`].
pub trait Handler: Send + Sync + 'static {
    /// Runs once at startup, after hookbox's migrations and under the same lock (an advisory
    /// lock on PostgreSQL, the write lock on SQLite): the place to create the handler's own
    /// tables (`CREATE TABLE IF NOT EXISTS ...`). Match on `conn` where the DDL differs
    /// between the stores.
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        let _ = conn;
        Ok(())
    }

    /// Processes one claimed event inside the claim transaction and returns the response to
    /// store. An `Err` rolls the claim back and answers 500 `processing_failed`.
    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response>;

    /// Whether `handle` uses the connection. A handler that answers from the event alone returns
    /// `false`: hookbox then asks it first and stores the claim and its response in one
    /// statement instead of a transaction (one round trip instead of four). Such a handler sees
    /// `Event::row_id` as 0, as the row does not exist yet, and must not touch `conn`.
    fn uses_connection(&self) -> bool {
        true
    }
}

/// Which handler processes each source's events: [`Record`] unless a source is given its own.
#[derive(Clone)]
pub struct Handlers {
    default: Arc<dyn Handler>,
    by_source: HashMap<String, Arc<dyn Handler>>,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers {
            default: Arc::new(Record),
            by_source: HashMap::new(),
        }
    }
}

impl Handlers {
    /// Gives `source` its own handler.
    pub fn with(mut self, source: &str, handler: impl Handler) -> Self {
        self.by_source.insert(source.to_owned(), Arc::new(handler));
        self
    }

    /// The handler of `source`'s events.
    pub fn for_source(&self, source: &SourceName) -> Arc<dyn Handler> {
        self.by_source
            .get(source.as_str())
            .unwrap_or(&self.default)
            .clone()
    }

    /// The sources given a handler of their own.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.by_source.keys().map(String::as_str)
    }

    /// Every handler, the default first.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Handler>> {
        std::iter::once(&self.default).chain(self.by_source.values())
    }
}
