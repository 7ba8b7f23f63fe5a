//! The owner of the `events` table: every statement on it is here. The claim ([`claim`],
//! [`claim_and_queue`], [`set_answer`]), the stored-answer reads ([`answers`],
//! [`answer_by_key`]), the admin and console lists and lookups ([`recent`], [`page`], [`find`],
//! [`row_of`]), `export`'s pages ([`export_page`]), the retention purge ([`purge_batch`],
//! [`count_older`]), the replay-count flush ([`add_replays`]) and `/readyz`'s write probe
//! ([`takes_writes`]).
//!
//! A source or id no store can hold (see [`storable`]) was never stored: a lookup of one finds
//! nothing, without asking the database (PostgreSQL would refuse even to compare it).
//!
//! One function here writes `deliveries` too: [`claim_and_queue`], the claim of a batch whose
//! sources forward, with its outbox rows. On PostgreSQL the two INSERTs are one statement
//! (data-modifying CTEs): one round trip and no `BEGIN`/`COMMIT` instead of four round trips,
//! and no second look at `events` for what the claim's own `RETURNING` gives. Each table's SQL
//! is still written by its owner: the outbox's CTE, its columns and its binds are
//! `deliveries.rs`'s (`deliveries::QueueClaimedPg`), which this module only places after its
//! claim's CTE, under the name it reads (`claimed`).
//!
//! On PostgreSQL the claim's INSERT binds each column as an array (`unnest`), so its text is
//! the same whatever the number of rows and diesel keeps it prepared (its own multi-row
//! `VALUES` and `sql_query` are never cached: each would be parsed and planned again for every
//! claim).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::result::Error as DieselError;
use diesel::sql_types::{Array, BigInt, Bytea, Jsonb, Nullable, SmallInt, Text};

use super::deliveries::{Lease, Leased, ToQueue};
use super::{now, on_backend, sqlite, write_transaction, AnyConnection, Conn};
use crate::ids::storable;

/// An event to claim: one row of the claim's `INSERT`.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// Where it arrived.
    pub source: &'a str,
    /// The provider's event id.
    pub event_id: &'a str,
    /// The provider's event type, as stored.
    pub event_type: Option<&'a str>,
    /// The payload's fingerprint.
    pub fingerprint: &'a [u8],
    /// When it was claimed, to the microsecond.
    pub received_at: DateTime<Utc>,
    /// The raw body.
    pub payload: &'a [u8],
    /// The kept headers, as a JSON object.
    pub headers: &'a serde_json::Value,
    /// For a source with `dedupe = "body"`, the payload's key, unique per source.
    pub dedupe_key: Option<&'a [u8]>,
    /// The answer, when it is known before the claim (a handler that answers from the event
    /// alone): claim and answer are then one statement. Otherwise [`set_answer`] stores it in
    /// the claim's transaction.
    pub answer: Option<Answer<'a>>,
}

/// An answer to store with its event.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The HTTP status.
    pub status: i16,
    /// The `Content-Type`.
    pub content_type: &'a str,
    /// The body, byte for byte.
    pub body: &'a [u8],
}

/// A row the claim inserted: this claim owns the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The event's row, for the handler's own rows and the outbox.
    pub row: i64,
    /// The source it was claimed under.
    pub source: String,
    /// The event id it was claimed under.
    pub event_id: String,
}

/// Claims `rows`, all in one statement: `INSERT ... ON CONFLICT DO NOTHING RETURNING`. A row
/// that comes back is claimed; one that does not conflicted with a committed event (its id, or
/// where the source dedupes by body, its payload's key; the index makes a concurrent claim of
/// either wait for this transaction to end), whose answer [`answers`] or [`answer_by_key`]
/// read. Rows should be sorted by (source, event id), so that two claims never wait on each
/// other in opposite orders; they go in in the order given.
///
/// On PostgreSQL the statement's text is the same for any number of rows (each column is bound
/// as one array, see [`ClaimPg`]), so it is prepared once per connection and kept; on SQLite it
/// is diesel's multi-row `VALUES`, prepared in-process.
pub fn claim(conn: &mut AnyConnection, rows: &[NewEvent<'_>]) -> QueryResult<Vec<Claimed>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let returned: Vec<(i64, String, String)> = match conn {
        AnyConnection::Postgres(c) => ClaimPg(Columns::of(rows)).get_results(c)?,
        AnyConnection::Sqlite(c) => {
            use super::sqlite_schema::events;
            // SQLite takes at most 32,766 bound values in a statement: a batch of thousands
            // of items (SendGrid's, GoCardless's) is inserted a part at a time, all in the
            // batch's transaction (2,979 items in one INSERT failed every retry). The claim
            // writer's batches, never in a transaction, are far smaller than a part.
            let mut returned = Vec::with_capacity(rows.len());
            for part in rows.chunks(SQLITE_ROWS_PER_CLAIM) {
                let values: Vec<_> = part
                    .iter()
                    .map(|row| {
                        let answer = row.answer.as_ref();
                        (
                            events::source.eq(row.source),
                            events::event_id.eq(row.event_id),
                            events::event_type.eq(row.event_type),
                            events::fingerprint.eq(row.fingerprint),
                            events::received_at.eq(row.received_at),
                            events::payload.eq(row.payload),
                            events::headers.eq(row.headers),
                            events::dedupe_key.eq(row.dedupe_key),
                            events::response_status.eq(answer.map(|a| a.status)),
                            events::response_content_type.eq(answer.map(|a| a.content_type)),
                            events::response_body.eq(answer.map(|a| a.body)),
                        )
                    })
                    .collect();
                returned.extend(
                    diesel::insert_into(events::table)
                        .values(&values)
                        .on_conflict_do_nothing()
                        .returning((events::id, events::source, events::event_id))
                        .get_results::<(i64, String, String)>(c)?,
                );
            }
            returned
        }
    };
    Ok(returned.into_iter().map(claimed_row).collect())
}

/// The events one INSERT of [`claim`] takes on SQLite: eleven bound values each, well within
/// the 32,766 a statement may hold.
pub const SQLITE_ROWS_PER_CLAIM: usize = 1000;

/// Claims `rows` as [`claim`] does and, for each event it claims, queues a delivery to each of
/// the targets given with it (names within its source): all or nothing, so each event is
/// queued if and only if it is stored, and a row that does not come back queues nothing. Not
/// for use inside a transaction: it is atomic on its own.
///
/// This one function writes two tables, `events` and `deliveries` (which
/// [`deliveries`](super::deliveries) owns). On PostgreSQL as one statement: the claim's INSERT
/// (written here) and the outbox's (written by `deliveries::QueueClaimedPg`) as data-modifying
/// CTEs, so a batch of claims and their outbox rows is one round trip, no parse (the text is
/// fixed, so it stays prepared) and no `BEGIN`/`COMMIT`. On SQLite, whose statements cost no
/// round trip, [`claim`] then [`enqueue_many`](super::deliveries::enqueue_many) in one write
/// transaction.
pub fn claim_and_queue(
    conn: &mut AnyConnection,
    rows: &[(NewEvent<'_>, &[ToQueue<'_>])],
) -> QueryResult<ClaimedAndQueued> {
    let events: Vec<NewEvent<'_>> = rows.iter().map(|(row, _)| *row).collect();
    if rows.iter().all(|(_, queue)| queue.is_empty()) {
        return Ok(ClaimedAndQueued {
            claimed: claim(conn, &events)?,
            leased: Vec::new(),
        });
    }
    match conn {
        AnyConnection::Postgres(c) => {
            let outbox = rows
                .iter()
                .flat_map(|(row, queue)| queue.iter().map(|to| (row.source, row.event_id, *to)));
            let statement = ClaimAndQueuePg {
                claim: Columns::of(&events),
                queue: super::deliveries::QueueClaimedPg::new(outbox),
            };
            let returned: Vec<ClaimedRowPg> = statement.get_results(c)?;
            // The statement is its own transaction: it has committed now, which is when a
            // handed-over row's lag starts (not when the statement was made: a claim may
            // wait for a lock first).
            let queued_at = now();
            // One row per claimed event, or per leased row of it (LEFT JOIN).
            let mut claimed: Vec<Claimed> = Vec::new();
            let mut leased = Vec::new();
            for (row, source, event_id, delivery, target) in returned {
                if claimed.last().map(|c| c.row) != Some(row) {
                    claimed.push(claimed_row((row, source, event_id)));
                }
                if let (Some(id), Some(target)) = (delivery, target) {
                    leased.push(Leased {
                        id,
                        event_row: row,
                        target,
                        queued_at,
                    });
                }
            }
            Ok(ClaimedAndQueued { claimed, leased })
        }
        AnyConnection::Sqlite(_) => write_transaction(conn, |conn| {
            let claimed = claim(conn, &events)?;
            let queues: std::collections::HashMap<(&str, &str), &[ToQueue<'_>]> = rows
                .iter()
                .map(|(row, queue)| ((row.source, row.event_id), *queue))
                .collect();
            let queued_at = now();
            let mut outbox: Vec<(i64, &str)> = Vec::new();
            let mut to_lease: Vec<(i64, &str, Lease)> = Vec::new();
            for claimed in &claimed {
                let key = (claimed.source.as_str(), claimed.event_id.as_str());
                let Some(queue) = queues.get(&key) else {
                    continue;
                };
                for to in queue.iter() {
                    match to.lease {
                        Some(lease) => to_lease.push((claimed.row, to.target, lease)),
                        None => outbox.push((claimed.row, to.target)),
                    }
                }
            }
            let leased = match &mut *conn {
                AnyConnection::Sqlite(c) if !to_lease.is_empty() => {
                    super::deliveries::queue_leased_sqlite(c, &to_lease, queued_at)?
                }
                _ => Vec::new(),
            };
            super::deliveries::enqueue_many(conn, &outbox)?;
            Ok(ClaimedAndQueued { claimed, leased })
        }),
    }
}

/// A row of [`ClaimAndQueuePg`]: the event's row, source and id, and a row it queued leased.
type ClaimedRowPg = (i64, String, String, Option<i64>, Option<String>);

/// What [`claim_and_queue`] stored: the events it claimed, in the order given, and the outbox
/// rows it queued leased, to be handed over.
#[derive(Debug)]
pub struct ClaimedAndQueued {
    /// The events claimed.
    pub claimed: Vec<Claimed>,
    /// The rows queued leased.
    pub leased: Vec<Leased>,
}

/// A row of a claim's `RETURNING id, source, event_id`.
fn claimed_row((row, source, event_id): (i64, String, String)) -> Claimed {
    Claimed {
        row,
        source,
        event_id,
    }
}

/// The claim's rows on PostgreSQL, a column at a time: each column is bound as one array and
/// `unnest` turns them back into rows, so the statement's text does not depend on how many
/// rows there are, and diesel keeps it prepared.
struct Columns<'a> {
    source: Vec<&'a str>,
    event_id: Vec<&'a str>,
    event_type: Vec<Option<&'a str>>,
    fingerprint: Vec<&'a [u8]>,
    received_at: Vec<DateTime<Utc>>,
    payload: Vec<&'a [u8]>,
    headers: Vec<&'a serde_json::Value>,
    dedupe_key: Vec<Option<&'a [u8]>>,
    response_status: Vec<Option<i16>>,
    response_content_type: Vec<Option<&'a str>>,
    response_body: Vec<Option<&'a [u8]>>,
}

/// The columns a claim writes, in the order [`Columns`] binds them.
const CLAIM_COLUMNS: &str = "source, event_id, event_type, fingerprint, received_at, payload, \
     headers, dedupe_key, response_status, response_content_type, response_body";

impl<'a> Columns<'a> {
    fn of(rows: &[NewEvent<'a>]) -> Self {
        let answers = || rows.iter().map(|row| row.answer.as_ref());
        Columns {
            source: rows.iter().map(|row| row.source).collect(),
            event_id: rows.iter().map(|row| row.event_id).collect(),
            event_type: rows.iter().map(|row| row.event_type).collect(),
            fingerprint: rows.iter().map(|row| row.fingerprint).collect(),
            received_at: rows.iter().map(|row| row.received_at).collect(),
            payload: rows.iter().map(|row| row.payload).collect(),
            headers: rows.iter().map(|row| row.headers).collect(),
            dedupe_key: rows.iter().map(|row| row.dedupe_key).collect(),
            response_status: answers().map(|a| a.map(|a| a.status)).collect(),
            response_content_type: answers().map(|a| a.map(|a| a.content_type)).collect(),
            response_body: answers().map(|a| a.map(|a| a.body)).collect(),
        }
    }

    /// `INSERT INTO events ... ON CONFLICT DO NOTHING RETURNING {returning}`, its binds the
    /// eleven columns. `ORDER BY n` (the arrays' order, which costs no sort: the planner knows
    /// `WITH ORDINALITY` counts up) makes the order the rows go in the order given, on which
    /// the absence of deadlocks rests. `ON CONFLICT DO NOTHING` names no target, so every
    /// unique index is an arbiter: `(source, event_id)` and, for `dedupe = "body"`, the
    /// partial `(source, dedupe_key)`.
    fn walk_insert<'b>(
        &'b self,
        out: &mut AstPass<'_, 'b, Pg>,
        returning: &str,
    ) -> QueryResult<()> {
        out.push_sql("INSERT INTO events (");
        out.push_sql(CLAIM_COLUMNS);
        out.push_sql(") SELECT ");
        out.push_sql(CLAIM_COLUMNS);
        out.push_sql(" FROM unnest(");
        out.push_bind_param::<Array<Text>, _>(&self.source)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.event_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<Text>>, _>(&self.event_type)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Bytea>, _>(&self.fingerprint)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<super::pg::Instant>, _>(&self.received_at)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Bytea>, _>(&self.payload)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Jsonb>, _>(&self.headers)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<Bytea>>, _>(&self.dedupe_key)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<SmallInt>>, _>(&self.response_status)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<Text>>, _>(&self.response_content_type)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<Bytea>>, _>(&self.response_body)?;
        out.push_sql(") WITH ORDINALITY AS v (");
        out.push_sql(CLAIM_COLUMNS);
        out.push_sql(", n) ORDER BY n ON CONFLICT DO NOTHING RETURNING ");
        out.push_sql(returning);
        Ok(())
    }
}

/// [`claim`] on PostgreSQL: the claim's INSERT alone.
struct ClaimPg<'a>(Columns<'a>);

impl QueryFragment<Pg> for ClaimPg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_insert(&mut out, "id, source, event_id")
    }
}

/// [`claim_and_queue`] on PostgreSQL: the claim's INSERT as the CTE `claimed`, which
/// `deliveries::QueueClaimedPg`'s CTE reads (it needs `id`, `source`,
/// `event_id` and `received_at` of each claimed row), and the claimed rows as the result.
/// PostgreSQL runs a data-modifying CTE to completion whether or not the query reads it.
struct ClaimAndQueuePg<'a> {
    claim: Columns<'a>,
    queue: super::deliveries::QueueClaimedPg<'a>,
}

impl QueryFragment<Pg> for ClaimAndQueuePg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH claimed AS (");
        self.claim
            .walk_insert(&mut out, "id, source, event_id, received_at")?;
        out.push_sql("), ");
        self.queue.walk_ast(out.reborrow())?;
        // Each claimed event, once per row of it queued leased (whose id is handed over).
        out.push_sql(
            " SELECT c.id, c.source, c.event_id, q.id, q.target FROM claimed c \
             LEFT JOIN queued q ON q.event_row = c.id AND q.attempts = 1 \
             ORDER BY c.id, q.id",
        );
        Ok(())
    }
}

super::prepared_statement!(ClaimPg<'_> => (BigInt, Text, Text));
super::prepared_statement!(ClaimAndQueuePg<'_> => ClaimedRowTypesPg);

/// The SQL types of a [`ClaimedRowPg`].
type ClaimedRowTypesPg = (BigInt, Text, Text, Nullable<BigInt>, Nullable<Text>);

/// Stores the answer of the event claimed in `row`, in the claim's transaction.
pub fn set_answer(conn: &mut AnyConnection, row: i64, answer: &Answer<'_>) -> QueryResult<()> {
    on_backend!(conn, c => diesel::update(events::table.find(row))
        .set((
            events::response_status.eq(answer.status),
            events::response_content_type.eq(answer.content_type),
            events::response_body.eq(answer.body),
        ))
        .execute(c))
    .map(|_| ())
}

/// A committed event's answer, as a later delivery of it is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The event id it is stored under.
    pub event_id: String,
    /// The payload's fingerprint, to tell a redelivery from another payload under the same id.
    pub fingerprint: Vec<u8>,
    /// When it was claimed.
    pub received_at: DateTime<Utc>,
    /// The stored answer; `None` only if a row was committed without one, which the claim
    /// never does.
    pub answer: Option<StoredAnswer>,
}

/// A stored answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAnswer {
    /// The HTTP status.
    pub status: i16,
    /// The `Content-Type`.
    pub content_type: String,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

type StoredRow = (
    String,
    Vec<u8>,
    DateTime<Utc>,
    Option<i16>,
    Option<String>,
    Option<Vec<u8>>,
);

fn stored((event_id, fingerprint, received_at, status, content_type, body): StoredRow) -> Stored {
    let answer = match (status, content_type, body) {
        (Some(status), Some(content_type), Some(body)) => Some(StoredAnswer {
            status,
            content_type,
            body,
        }),
        _ => None,
    };
    Stored {
        event_id,
        fingerprint,
        received_at,
        answer,
    }
}

/// The columns of a [`StoredRow`], for the backend's `events` in scope.
macro_rules! stored_columns {
    () => {
        (
            events::event_id,
            events::fingerprint,
            events::received_at,
            events::response_status,
            events::response_content_type,
            events::response_body,
        )
    };
}

/// The committed answers of `source`'s events `event_ids` (those stored; in no set order).
pub fn answers(
    conn: &mut AnyConnection,
    source: &str,
    event_ids: &[&str],
) -> QueryResult<Vec<Stored>> {
    let rows: Vec<StoredRow> = match event_ids {
        [] => Vec::new(),
        [event_id] => on_backend!(conn, c => events::table
            .filter(events::source.eq(source))
            .filter(events::event_id.eq(event_id))
            .select(stored_columns!())
            .load(c))?,
        _ => on_backend!(conn, c => events::table
            .filter(events::source.eq(source))
            .filter(events::event_id.eq_any(event_ids))
            .select(stored_columns!())
            .load(c))?,
    };
    Ok(rows.into_iter().map(stored).collect())
}

/// The committed answer of `source`'s event stored with the payload key `key` (a source with
/// `dedupe = "body"`), if there is one.
pub fn answer_by_key(
    conn: &mut AnyConnection,
    source: &str,
    key: &[u8],
) -> QueryResult<Option<Stored>> {
    let row: Option<StoredRow> = on_backend!(conn, c => events::table
        .filter(events::source.eq(source))
        .filter(events::dedupe_key.eq(key))
        .select(stored_columns!())
        .first(c)
        .optional())?;
    Ok(row.map(stored))
}

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

/// One stored event, whole, as the admin API and the console show it.
#[derive(Debug, Queryable)]
pub struct StoredEvent {
    /// The provider's event type.
    pub event_type: Option<String>,
    /// When it was claimed.
    pub received_at: DateTime<Utc>,
    /// The raw body.
    pub payload: Vec<u8>,
    /// The kept headers.
    pub headers: serde_json::Value,
    /// The stored answer's status.
    pub status: Option<i16>,
    /// The stored answer's `Content-Type`.
    pub content_type: Option<String>,
    /// The stored answer's body.
    pub body: Option<Vec<u8>>,
    /// Replays flushed to the database so far.
    pub replays: i64,
}

/// `source`'s stored event `event_id`, if it is stored.
pub fn find(
    conn: &mut AnyConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<StoredEvent>> {
    if !storable(source) || !storable(event_id) {
        return Ok(None);
    }
    on_backend!(conn, c => events::table
        .filter(events::source.eq(source))
        .filter(events::event_id.eq(event_id))
        .select((
            events::event_type,
            events::received_at,
            events::payload,
            events::headers,
            events::response_status,
            events::response_content_type,
            events::response_body,
            events::replays,
        ))
        .first(c)
        .optional())
    .map(|found| {
        found.map(|mut event: StoredEvent| {
            // Rows stored before credentials were left out of what is kept may hold one.
            crate::redact::drop_credentials(&mut event.headers);
            event
        })
    })
}

/// A place in the newest-first list of events, for the next page (the console's `before`,
/// the admin API's `before` and `next_before`): the `(received_at, row)` of the last event
/// listed, written `{received_at in µs}.{row}`.
pub fn cursor(received_at: DateTime<Utc>, row: i64) -> String {
    format!("{}.{row}", received_at.timestamp_micros())
}

/// Reads a [`cursor`]; `None` when it is not one. Its time is within the years 1 to 9999, as
/// every stored time is: both stores hold (and SQLite orders) no other, and a time PostgreSQL
/// cannot take would fail the query rather than the cursor.
pub fn parse_cursor(text: &str) -> Option<(DateTime<Utc>, i64)> {
    use chrono::Datelike;
    let (micros, row) = text.trim().split_once('.')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    (1..=9999)
        .contains(&at.year())
        .then_some((at, row.parse().ok()?))
}

/// Which events the console and the admin API list (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this source's.
    pub source: Option<String>,
    /// Only of this type, as stored.
    pub event_type: Option<String>,
    /// Only those received at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Only those received before this.
    pub until: Option<DateTime<Utc>>,
    /// Only this event id.
    pub event_id: Option<String>,
    /// Only those with a dead delivery.
    pub dead: bool,
    /// Only those before this `(received_at, row)` in the list: the keyset cursor.
    pub before: Option<(DateTime<Utc>, i64)>,
}

/// An event in a list: row, source, event id, type, received time, stored status,
/// replays flushed.
pub type Listed = (
    i64,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    Option<i16>,
    i64,
);

/// The console's and the admin API's list: up to `limit` events that `filter` selects, newest
/// first.
pub fn page(conn: &mut AnyConnection, filter: Filter, limit: i64) -> QueryResult<Vec<Listed>> {
    if [&filter.source, &filter.event_id]
        .into_iter()
        .flatten()
        .any(|v| !storable(v))
    {
        return Ok(Vec::new());
    }
    on_backend!(conn, c => {
        let mut select = events::table
            .select((
                events::id,
                events::source,
                events::event_id,
                events::event_type,
                events::received_at,
                events::response_status,
                events::replays,
            ))
            .order((events::received_at.desc(), events::id.desc()))
            .limit(limit)
            .into_boxed();
        if let Some(source) = filter.source {
            select = select.filter(events::source.eq(source));
        }
        if let Some(event_type) = filter.event_type {
            select = select.filter(events::event_type.eq(event_type));
        }
        if let Some(since) = filter.since {
            select = select.filter(events::received_at.ge(since));
        }
        if let Some(until) = filter.until {
            select = select.filter(events::received_at.lt(until));
        }
        if let Some(id) = filter.event_id {
            select = select.filter(events::event_id.eq(id));
        }
        if filter.dead {
            select = select.filter(
                events::id.eq_any(
                    deliveries::table
                        .filter(deliveries::state.eq("dead"))
                        .select(deliveries::event_row),
                ),
            );
        }
        if let Some((at, id)) = filter.before {
            // `(received_at, id) < (at, id)`, written so the index on received_at bounds the
            // scan.
            select = select
                .filter(events::received_at.le(at))
                .filter(events::received_at.lt(at).or(events::id.lt(id)));
        }
        select.load(c)
    })
}

/// An event as `export` writes it: row, source, event id, type, received time, headers, payload.
pub type Exported = (
    i64,
    String,
    String,
    Option<String>,
    DateTime<Utc>,
    serde_json::Value,
    Vec<u8>,
);

/// Which events `export` writes (`None`: any).
#[derive(Debug, Clone, Copy, Default)]
pub struct Span<'a> {
    /// Only this source's.
    pub source: Option<&'a str>,
    /// Only those received at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Only those received before this.
    pub until: Option<DateTime<Utc>>,
}

/// A page of `export`: up to `limit` events of `span`, oldest first, after the row `after`
/// (its received time, then its id), which must still be there (`export` reads one snapshot).
pub fn export_page(
    conn: &mut AnyConnection,
    span: Span<'_>,
    after: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<Exported>> {
    on_backend!(conn, c => {
        let mut query = events::table
            .select((
                events::id,
                events::source,
                events::event_id,
                events::event_type,
                events::received_at,
                events::headers,
                events::payload,
            ))
            .order((events::received_at.asc(), events::id.asc()))
            .limit(limit)
            .into_boxed();
        if let Some(source) = span.source {
            query = query.filter(events::source.eq(source.to_owned()));
        }
        if let Some(since) = span.since {
            query = query.filter(events::received_at.ge(since));
        }
        if let Some(until) = span.until {
            query = query.filter(events::received_at.lt(until));
        }
        if let Some(id) = after {
            // Written as a range on received_at plus a tie-break, so the index on received_at
            // serves it. The range starts at the last row's received time as stored, read back
            // in the statement: on SQLite it is text, and a time another tool stored
            // (`.100000` where hookbox writes `.100`) sorted apart from hookbox's spelling of
            // it, so pages read rows again (a black-box run: an export that never ended).
            let prev = "(SELECT prev.received_at FROM events AS prev WHERE prev.id = ";
            query = query.filter(
                diesel::dsl::sql::<diesel::sql_types::Bool>(&format!("events.received_at >= {prev}"))
                    .bind::<BigInt, _>(id)
                    .sql(&format!(") AND (events.received_at > {prev}"))
                    .bind::<BigInt, _>(id)
                    .sql(") OR events.id > ")
                    .bind::<BigInt, _>(id)
                    .sql(")"),
            );
        }
        query.load(c)
    })
}

/// A row of a purge batch's `RETURNING id, source` (either store).
#[derive(diesel::QueryableByName)]
struct Removed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    source: String,
}

/// A row of a dry run's `SELECT source, count(*) AS n ... GROUP BY source` (either store).
#[derive(diesel::QueryableByName)]
struct Counted {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A row of `SELECT count(*) AS n` (either store).
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// What one purge batch removed.
#[derive(Debug, Default)]
pub struct Purged {
    /// The source of each event removed.
    pub sources: Vec<String>,
    /// How many of their forward deliveries were still pending (and so will never be sent).
    pub pending_forwards: u64,
}

/// Deletes up to `limit` events received before `cutoff`, of `source` (or of every source but
/// `named`), and their outbox rows; none with an attempt under way at `now` (see
/// [`super::not_in_flight`]). Batches by `ctid` on PostgreSQL, where the outbox rows go in
/// a second statement of the same transaction
/// ([`deliveries::remove_of_events_pg`](super::deliveries::remove_of_events_pg)), which counts
/// the pending ones; and by `id` on SQLite, where its foreign key's cascade takes them, counted
/// first in the same transaction.
pub fn purge_batch(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
    now: DateTime<Utc>,
    limit: i64,
) -> QueryResult<Purged> {
    let filter = format!(
        "{}{}",
        super::purge_filter(conn, source, "received_at"),
        super::not_in_flight(conn)
    );
    let (removed, pending_forwards): (Vec<Removed>, u64) = match conn {
        AnyConnection::Postgres(_) => {
            let sql = format!(
                "DELETE FROM events WHERE ctid = ANY(ARRAY(\
                    SELECT ctid FROM events WHERE {filter} LIMIT {limit})) \
                 RETURNING id, source"
            );
            write_transaction(conn, |conn| {
                let removed: Vec<Removed> =
                    super::purge_statement(conn, &sql, source, named, cutoff, Some(now))?;
                let mut pending = 0;
                if let AnyConnection::Postgres(c) = conn {
                    let rows: Vec<i64> = removed.iter().map(|r| r.id).collect();
                    pending = super::deliveries::remove_of_events_pg(c, &rows)?;
                }
                Ok::<_, DieselError>((removed, pending))
            })?
        }
        AnyConnection::Sqlite(_) => {
            let chosen = format!("SELECT id FROM events WHERE {filter} LIMIT {limit}");
            let count = super::deliveries::pending_of_events_sql(&chosen);
            let delete = format!("DELETE FROM events WHERE id IN ({chosen}) RETURNING id, source");
            // One write: the count sees the rows the delete takes.
            write_transaction(conn, |conn| {
                let pending: Vec<Count> =
                    super::purge_statement(conn, &count, source, named, cutoff, Some(now))?;
                let removed: Vec<Removed> =
                    super::purge_statement(conn, &delete, source, named, cutoff, Some(now))?;
                let pending = pending.first().map_or(0, |c| c.n);
                Ok::<_, DieselError>((removed, u64::try_from(pending).unwrap_or(0)))
            })?
        }
    };
    Ok(Purged {
        sources: removed.into_iter().map(|r| r.source).collect(),
        pending_forwards,
    })
}

/// How many forward deliveries of the events [`purge_batch`] would remove are still pending.
pub fn count_pending_older(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
) -> QueryResult<u64> {
    let sql = super::deliveries::pending_of_events_sql(&format!(
        "SELECT id FROM events WHERE {}",
        super::purge_filter(conn, source, "received_at")
    ));
    let counted: Vec<Count> = super::purge_statement(conn, &sql, source, named, cutoff, None)?;
    Ok(counted
        .first()
        .map_or(0, |c| u64::try_from(c.n).unwrap_or(0)))
}

/// How many events [`purge_batch`] would remove in all, by source.
pub fn count_older(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
) -> QueryResult<Vec<(String, i64)>> {
    let sql = format!(
        "SELECT source, count(*) AS n FROM events WHERE {} GROUP BY source",
        super::purge_filter(conn, source, "received_at")
    );
    let counted: Vec<Counted> = super::purge_statement(conn, &sql, source, named, cutoff, None)?;
    Ok(counted.into_iter().map(|c| (c.source, c.n)).collect())
}

/// Adds replay counts (source, event id, count) to `events.replays`: one
/// `UPDATE ... FROM unnest(...)` on PostgreSQL, one UPDATE per event in one transaction on
/// SQLite.
pub fn add_replays(conn: &mut AnyConnection, batch: &[(String, String, u64)]) -> QueryResult<()> {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    match conn {
        AnyConnection::Postgres(c) => AddReplaysPg {
            sources: batch.iter().map(|(s, _, _)| s.as_str()).collect(),
            event_ids: batch.iter().map(|(_, id, _)| id.as_str()).collect(),
            counts: batch.iter().map(|(_, _, n)| count(*n)).collect(),
        }
        .execute(c)
        .map(|_| ()),
        AnyConnection::Sqlite(c) => c.immediate_transaction(|c| {
            for (source, event_id, n) in batch {
                diesel::sql_query(
                    "UPDATE events SET replays = replays + ?1 WHERE source = ?2 AND event_id = ?3",
                )
                .bind::<BigInt, _>(count(*n))
                .bind::<Text, _>(source)
                .bind::<Text, _>(event_id)
                .execute(c)?;
            }
            Ok(())
        }),
    }
}

/// [`add_replays`] on PostgreSQL: the counts bound a column at a time, as arrays, so the text
/// is fixed and stays prepared.
struct AddReplaysPg<'a> {
    sources: Vec<&'a str>,
    event_ids: Vec<&'a str>,
    counts: Vec<i64>,
}

impl QueryFragment<Pg> for AddReplaysPg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        // The rows are locked in one order (their ids) before they are updated: two instances
        // flushing counts of the same events, each in its own order, otherwise each held rows
        // the other waited for (`deadlock detected`, found by a black-box run).
        out.push_sql("WITH v AS (SELECT * FROM unnest(");
        out.push_bind_param::<Array<Text>, _>(&self.sources)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.event_ids)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<BigInt>, _>(&self.counts)?;
        out.push_sql(
            ") AS v (source, event_id, n)), \
             locked AS (SELECT e.id, v.n FROM events AS e JOIN v \
             ON e.source = v.source AND e.event_id = v.event_id ORDER BY e.id FOR UPDATE OF e) \
             UPDATE events AS e SET replays = e.replays + locked.n FROM locked \
             WHERE e.id = locked.id",
        );
        Ok(())
    }
}

super::prepared_statement!(AddReplaysPg<'_>);

/// Whether the store takes a write as a claim makes one: an event claimed and answered with
/// the claim's own statements, then rolled back, so `/readyz` says not ready when hookbox's role lost `INSERT` or `UPDATE`, or
/// the SQLite file went read-only. On SQLite a write lock held by another writer past a short
/// wait counts as ready: the store is evidently taking writes.
pub fn takes_writes(conn: &mut Conn) -> QueryResult<()> {
    let probe_id = format!(
        "readyz-{}-{}",
        std::process::id(),
        Utc::now().timestamp_micros()
    );
    let deadline = Instant::now() + Duration::from_millis(250);
    let result = conn.waiting_until(deadline, |conn| {
        write_transaction(conn, |conn| -> QueryResult<()> {
            let headers = serde_json::json!({});
            let probe = NewEvent {
                source: "_readyz",
                event_id: &probe_id,
                event_type: None,
                fingerprint: &[0],
                received_at: now(),
                payload: b"",
                headers: &headers,
                dedupe_key: None,
                answer: None,
            };
            for claimed in claim(conn, &[probe])? {
                let answer = Answer {
                    status: 200,
                    content_type: "text/plain",
                    body: b"",
                };
                set_answer(conn, claimed.row, &answer)?;
            }
            Err(DieselError::RollbackTransaction)
        })
    });
    match result {
        Err(DieselError::RollbackTransaction) => Ok(()),
        Err(e) if sqlite::is_busy(&e) => Ok(()),
        Err(e) => {
            conn.note(&e);
            Err(e)
        }
        Ok(()) => Ok(()),
    }
}
