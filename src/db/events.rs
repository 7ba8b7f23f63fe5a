//! The owner of the `events` table: every statement on it is here.

use diesel::prelude::*;

use super::{on_backend, AnyConnection};
use crate::ids::storable;

/// The row of the event stored under `source` and `event_id`, if there is one.
pub fn row_of(conn: &mut AnyConnection, source: &str, event_id: &str) -> QueryResult<Option<i64>> {
    if !storable(source) || !storable(event_id) {
        return Ok(None);
    }
    on_backend!(conn, c => events::table
        .filter(events::source.eq(source))
        .filter(events::event_id.eq(event_id))
        .select(events::id)
        .first(c)
        .optional())
}
