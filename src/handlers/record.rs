//! `record`, the built-in handler: keep the event, answer 200.

use super::{AnyConnection, Event, Handler, Response};

/// Keeps the event as an inbox row and answers 200 `{"status": "processed", ...}`.
///
/// The claim row in `events` already carries everything the inbox needs (source, id, type,
/// received time, raw body and the scheme's headers), so recording adds no statement of its
/// own: the event is kept exactly when it is claimed, and claim and answer go in as one INSERT.
#[derive(Debug, Default, Clone, Copy)]
pub struct Record;

impl Handler for Record {
    fn handle(&self, _conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        Ok(Response::processed(event))
    }

    fn uses_connection(&self) -> bool {
        false
    }
}
