//! The owner of the `deliveries` table (the forward outbox): every statement on it is here.
//! A row is queued with its event's claim ([`enqueue`]; for a batch of claims, in the claim's
//! own statement on PostgreSQL, `QueueClaimedPg`, which
//! [`events::claim_and_queue`](super::events::claim_and_queue) places after its INSERT, and
//! [`enqueue_many`] in its transaction on SQLite), taken under a lease by the dispatcher, lane
//! by lane ([`take_due`]), settled in batches after the attempts ([`settle`]), and shown and
//! re-queued by the admin API and the console ([`of_event`], [`requeue`], [`redeliver`],
//! [`requeue_dead`]), and counted ([`counts`], [`dead`], [`pending_by_target`]). Rows go with
//! their event: deleted by the purge's transaction on PostgreSQL ([`remove_of_events_pg`]), by
//! `ON DELETE CASCADE` on SQLite.
//!
//! A lane is one (source, target): each row carries its event's `source` and `received_at`,
//! copied in by the claim, so a lane's due rows and an ordered lane's head each come from one
//! index.
//!
//! The dispatcher's statements on PostgreSQL ([`take_due`]'s two takes and [`settle`]'s
//! UPDATE of the delivered), and [`enqueue_many`]'s INSERT, bind each column as an array
//! (`unnest`), so their text does not depend on how many lanes or rows there are. On SQLite the
//! outbox's three statements bind their rows as one JSON array. Either way each is prepared
//! once per connection and kept (see `db::prepared_statement!`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::sql_types::{Array, BigInt, Bytea, Double, Integer, Nullable, SmallInt, Text, Untyped};
use diesel::sqlite::Sqlite;
use serde::Serialize;

use super::prepared_statement;
use super::{now, on_backend, write_transaction, AnyConnection};
use crate::ids::storable;

/// A delivery taken for an attempt: its lease runs, so no other dispatcher takes it meanwhile.
#[derive(Debug, Clone, QueryableByName)]
pub struct Due {
    /// The outbox row.
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    /// Which attempt this is, from 1.
    #[diesel(sql_type = Integer)]
    pub attempt: i32,
    /// Which attempt series (0 until a requeue, a redeliver or a take-back from a dead
    /// instance starts another).
    #[diesel(sql_type = Integer)]
    pub series: i32,
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
    /// When this attempt series was queued (the claim's commit, or the last requeue), in
    /// microseconds since the Unix epoch (milliseconds' precision on SQLite): where the lag
    /// starts.
    #[diesel(sql_type = BigInt)]
    pub queued_at_micros: i64,
}

/// How an attempt ended, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// Accepted (an HTTP 2xx): done.
    Delivered {
        /// The downstream's status, where the transport has one.
        status: Option<u16>,
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
    /// Never sent: given back, due again after `after`, its attempt not counted (a paced
    /// target's schedule was booked by other instances beyond what the row could wait).
    Untried {
        /// How long until it is due.
        after: Duration,
    },
}

/// One attempt's outcome, for [`settle`]: the row, which attempt it was, and how it ended.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The outbox row.
    pub id: i64,
    /// The attempt that ended, and its series: a row taken again since (its lease ran out,
    /// or it was re-queued or taken back from an instance found dead, either of which starts
    /// a new series and counts its attempts anew) is not overwritten by this older outcome.
    pub attempt: i32,
    pub series: i32,
    /// How it ended.
    pub outcome: Settle,
}

/// What the dispatcher asks of one lane, (source, target), in a take.
#[derive(Debug, Clone)]
pub struct Want {
    /// The event source.
    pub source: String,
    /// The target's name within the source.
    pub target: String,
    /// Rows to take at most (an ordered lane: at most its head, whatever this says).
    pub limit: i64,
    /// Only the lane's head may be taken: its earliest pending row by (received_at, event
    /// row), and only when it is due and not leased.
    pub ordered: bool,
    /// How long each taken row is leased.
    pub lease: Duration,
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
    /// When the next attempt is due (pending only). While an attempt is under way, the end of
    /// its lease: when another is made should this one never report.
    #[serde(serialize_with = "super::serialize_time_opt")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Whether an attempt is under way now (an instance holds the row's lease).
    pub attempt_under_way: bool,
    /// When it was queued (with the claim).
    #[serde(serialize_with = "super::serialize_time")]
    pub created_at: DateTime<Utc>,
    /// When it was delivered.
    #[serde(serialize_with = "super::serialize_time_opt")]
    pub delivered_at: Option<DateTime<Utc>>,
}

/// Queues a delivery of the event stored in row `event_row` to each of `targets` (names within
/// its source). Runs in the claim's transaction, so an event is queued if and only if it is
/// stored.
pub fn enqueue(conn: &mut AnyConnection, event_row: i64, targets: &[String]) -> QueryResult<()> {
    let rows: Vec<(i64, &str)> = targets.iter().map(|t| (event_row, t.as_str())).collect();
    enqueue_many(conn, &rows)
}

/// Queues the deliveries `rows`, each (event row, target name), for the events of one claim or
/// of several at once (a batch's on SQLite), in one INSERT that copies each event's source and
/// received time onto its rows. Runs in the transaction of the claims, so each event is queued
/// if and only if it is stored.
pub fn enqueue_many(conn: &mut AnyConnection, rows: &[(i64, &str)]) -> QueryResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let queued_at = now();
    match conn {
        AnyConnection::Postgres(c) => {
            let (events, targets) = rows.iter().copied().unzip();
            EnqueuePg {
                events,
                targets,
                queued_at,
            }
            .execute(c)
        }
        AnyConnection::Sqlite(c) => EnqueueSqlite {
            rows: serde_json::to_string(rows).expect("numbers and strings serialize"),
            queued_at,
        }
        .execute(c),
    }
    .map(|_| ())
}

/// [`enqueue_many`] on SQLite: the rows as one JSON array of [event row, target].
struct EnqueueSqlite {
    rows: String,
    queued_at: DateTime<Utc>,
}

impl QueryFragment<Sqlite> for EnqueueSqlite {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO deliveries (event_row, target, source, received_at, queued_at) \
             SELECT e.id, json_extract(v.value, '$[1]'), e.source, e.received_at, ",
        );
        out.push_bind_param::<super::sqlite::Instant, _>(&self.queued_at)?;
        out.push_sql(" FROM json_each(");
        out.push_bind_param::<Text, _>(&self.rows)?;
        out.push_sql(") AS v JOIN events e ON e.id = json_extract(v.value, '$[0]')");
        Ok(())
    }
}

/// [`queue_leased_sqlite`]'s INSERT: the rows as one JSON array of [event row, target], all
/// under `lease`.
struct QueueLeasedSqlite {
    rows: String,
    queued_at: DateTime<Utc>,
    lease: Lease,
}

impl QueryFragment<Sqlite> for QueueLeasedSqlite {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO deliveries \
                 (event_row, target, source, received_at, queued_at, attempts, next_attempt_at, \
                  leased_by) \
             SELECT e.id, json_extract(v.value, '$[1]'), e.source, e.received_at, ",
        );
        out.push_bind_param::<super::sqlite::Instant, _>(&self.queued_at)?;
        out.push_sql(", 1, ");
        out.push_bind_param::<super::sqlite::Instant, _>(&self.lease.until)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.lease.by)?;
        out.push_sql(" FROM json_each(");
        out.push_bind_param::<Text, _>(&self.rows)?;
        out.push_sql(
            ") AS v JOIN events e ON e.id = json_extract(v.value, '$[0]') \
             RETURNING id, event_row, target",
        );
        Ok(())
    }
}

/// [`settle_delivered_sqlite`]'s UPDATE: the rows as one JSON array of [id, attempt, status,
/// series].
struct SettleDeliveredSqlite {
    rows: String,
    at: DateTime<Utc>,
}

impl QueryFragment<Sqlite> for SettleDeliveredSqlite {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Sqlite>) -> QueryResult<()> {
        out.push_sql(
            "UPDATE deliveries SET state = 'delivered', last_status = json_extract(v.value, '$[2]'), \
                 last_error = NULL, delivered_at = ",
        );
        out.push_bind_param::<super::sqlite::Instant, _>(&self.at)?;
        out.push_sql(" FROM json_each(");
        out.push_bind_param::<Text, _>(&self.rows)?;
        out.push_sql(
            ") AS v \
             WHERE deliveries.id = json_extract(v.value, '$[0]') \
               AND deliveries.attempts = json_extract(v.value, '$[1]') \
               AND deliveries.series = json_extract(v.value, '$[3]') \
               AND deliveries.state = 'pending'",
        );
        Ok(())
    }
}

prepared_statement!(sqlite: EnqueueSqlite);
prepared_statement!(sqlite: QueueLeasedSqlite => Untyped);
prepared_statement!(sqlite: SettleDeliveredSqlite);

/// The text of a count of the pending outbox rows of the events `events` (a `SELECT id FROM
/// events ...` whose binds the caller gives): what a purge about to remove those events takes
/// unsent with them, counted by [`events::purge_batch`](super::events::purge_batch) and its dry
/// run.
pub(super) fn pending_of_events_sql(events: &str) -> String {
    format!(
        "SELECT count(*) AS n FROM deliveries WHERE state = 'pending' AND event_row IN ({events})"
    )
}

/// Deletes the outbox rows of the events in rows `event_rows`, on PostgreSQL, in the
/// transaction of the retention purge that deleted those events, after it. There `deliveries`
/// has no foreign key to `events` (its check cost every forwarding claim a lookup and a lock per
/// row). None is left behind: every outbox row is inserted in the transaction that inserts its
/// event (a claim's statement, or [`enqueue_many`] in the claim's transaction), so a purge,
/// which sees committed events only, finds each event's rows committed with it; the admin
/// API's redeliver and requeue only update rows that exist. On SQLite the foreign key's
/// `ON DELETE CASCADE` does this.
pub(super) fn remove_of_events_pg(
    conn: &mut diesel::PgConnection,
    event_rows: &[i64],
) -> QueryResult<u64> {
    #[derive(diesel::QueryableByName)]
    struct Pending {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    // Locked in ascending id order before they go, as [`settle`] locks the rows it updates.
    let pending: Pending = diesel::sql_query(
        "WITH gone AS (DELETE FROM deliveries WHERE id IN (\
            SELECT id FROM deliveries WHERE event_row = ANY($1) ORDER BY id FOR UPDATE) \
         RETURNING state) \
         SELECT count(*) FILTER (WHERE state = 'pending') AS n FROM gone",
    )
    .bind::<Array<BigInt>, _>(event_rows)
    .get_result(conn)?;
    Ok(u64::try_from(pending.n).unwrap_or(0))
}

/// [`enqueue_many`] on PostgreSQL: each (event row, target) bound a column at a time, as
/// arrays, so the text is fixed and stays prepared.
struct EnqueuePg<'a> {
    events: Vec<i64>,
    targets: Vec<&'a str>,
    queued_at: DateTime<Utc>,
}

impl QueryFragment<Pg> for EnqueuePg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "INSERT INTO deliveries (event_row, target, source, received_at, queued_at) \
             SELECT e.id, v.target, e.source, e.received_at, ",
        );
        out.push_bind_param::<super::pg::Instant, _>(&self.queued_at)?;
        out.push_sql(" FROM unnest(");
        out.push_bind_param::<Array<BigInt>, _>(&self.events)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.targets)?;
        out.push_sql(") AS v (event_row, target) JOIN events e ON e.id = v.event_row");
        Ok(())
    }
}

prepared_statement!(EnqueuePg<'_>);

/// The outbox rows of the events a claim inserts in the same statement, on PostgreSQL: the
/// data-modifying CTE
///
/// ```sql
/// queued AS (INSERT INTO deliveries (event_row, target, source, received_at, queued_at)
///            SELECT c.id, q.target, c.source, c.received_at, clock_timestamp()
///            FROM unnest($sources, $event_ids, $targets) WITH ORDINALITY AS q (...)
///            JOIN claimed c ON c.source = q.source AND c.event_id = q.event_id ...)
/// ```
///
/// which [`events::claim_and_queue`](super::events::claim_and_queue) writes after its own CTE
/// `claimed` (the claim's `INSERT ... RETURNING id, source, event_id, received_at`). Each
/// (source, event id, target) given queues one row if, and only if, its event came back in
/// `claimed`; an event that conflicted queues nothing. The event's source and received time are
/// copied from the claim's own RETURNING, with no second look at `events`. Its binds are
/// pushed in the order they appear, after whatever the statement bound before it, so the
/// composed statement's text is fixed and stays prepared.
pub(super) struct QueueClaimedPg<'a> {
    sources: Vec<&'a str>,
    event_ids: Vec<&'a str>,
    targets: Vec<&'a str>,
    leased_until: Vec<Option<DateTime<Utc>>>,
    leased_by: Vec<Option<i64>>,
}

/// One outbox row a claim queues with its event.
#[derive(Debug, Clone, Copy)]
pub struct ToQueue<'a> {
    /// The target's name within the source.
    pub target: &'a str,
    /// For a row handed straight to this process's dispatcher (`forward::Handover`): its
    /// lease. It goes in as attempt 1, leased until then, so no take finds it meanwhile.
    pub lease: Option<Lease>,
}

/// A row's lease to one instance's dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Lease {
    /// When it runs out: any instance may take the row then.
    pub until: DateTime<Utc>,
    /// The instance that holds it (see `db::instances`): should that one die, another takes
    /// the row back at once.
    pub by: i64,
}

impl<'a> ToQueue<'a> {
    /// A row queued for a take, the normal way.
    pub fn target(target: &'a str) -> ToQueue<'a> {
        ToQueue {
            target,
            lease: None,
        }
    }
}

/// A row a claim queued leased (see [`ToQueue::lease`]), to be handed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    /// The outbox row.
    pub id: i64,
    /// Its event's row.
    pub event_row: i64,
    /// The target's name within the source.
    pub target: String,
    /// When it was queued, as far as its lag goes: when the claim that queued it committed
    /// (PostgreSQL), or as it was written in the claim's transaction (SQLite).
    pub queued_at: DateTime<Utc>,
}

impl<'a> QueueClaimedPg<'a> {
    /// The outbox rows to queue, each (source, event id, row), in the order queued.
    pub(super) fn new(rows: impl IntoIterator<Item = (&'a str, &'a str, ToQueue<'a>)>) -> Self {
        let mut queue = QueueClaimedPg {
            sources: Vec::new(),
            event_ids: Vec::new(),
            targets: Vec::new(),
            leased_until: Vec::new(),
            leased_by: Vec::new(),
        };
        for (source, event_id, row) in rows {
            queue.sources.push(source);
            queue.event_ids.push(event_id);
            queue.targets.push(row.target);
            queue.leased_until.push(row.lease.map(|l| l.until));
            queue.leased_by.push(row.lease.map(|l| l.by));
        }
        queue
    }
}

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for QueueClaimedPg<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        out.push_sql(
            "queued AS (INSERT INTO deliveries \
             (event_row, target, source, received_at, queued_at, attempts, next_attempt_at, \
              leased_by) \
             SELECT c.id, q.target, c.source, c.received_at, ",
        );
        // Queued when the row is written, after any wait for a lock (the statement's own
        // `now()` is its start): the forward lag runs from about the commit.
        out.push_sql("clock_timestamp()");
        // A leased row is attempt 1, due when its lease ends; any other is due now.
        out.push_sql(
            ", CASE WHEN q.leased_until IS NULL THEN 0 ELSE 1 END, \
             COALESCE(q.leased_until, now()), q.leased_by FROM unnest(",
        );
        out.push_bind_param::<Array<Text>, _>(&self.sources)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.event_ids)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.targets)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<super::pg::Instant>>, _>(&self.leased_until)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<BigInt>>, _>(&self.leased_by)?;
        // In the order given, so an event's targets get their ids in the order named, as
        // `of_event` lists them.
        out.push_sql(
            ") WITH ORDINALITY AS q (source, event_id, target, leased_until, leased_by, n) \
             JOIN claimed c ON c.source = q.source AND c.event_id = q.event_id \
             ORDER BY q.n \
             RETURNING id, event_row, target, attempts)",
        );
        Ok(())
    }
}

/// Queues rows leased (see [`ToQueue::leased_until`]) on SQLite, in the claim's transaction:
/// each (event row, target, leased until), its event's source and received time copied from
/// `events` as [`enqueue_many`] does. One INSERT per distinct lease (one per target's
/// lease, as a batch's leases start together), not one per row: a row inserted on its own cost
/// about as much as the claim of its event. Returns the rows, in no particular order (each
/// names its event row and target).
pub(super) fn queue_leased_sqlite(
    conn: &mut diesel::SqliteConnection,
    rows: &[(i64, &str, Lease)],
    queued_at: DateTime<Utc>,
) -> QueryResult<Vec<Leased>> {
    #[derive(QueryableByName)]
    struct Inserted {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = BigInt)]
        event_row: i64,
        #[diesel(sql_type = Text)]
        target: String,
    }
    let mut by_lease: std::collections::BTreeMap<Lease, Vec<(i64, &str)>> =
        std::collections::BTreeMap::new();
    for &(event_row, target, lease) in rows {
        by_lease.entry(lease).or_default().push((event_row, target));
    }
    let mut leased = Vec::with_capacity(rows.len());
    for (lease, group) in by_lease {
        let inserted: Vec<Inserted> = QueueLeasedSqlite {
            rows: serde_json::to_string(&group).expect("numbers and strings serialize"),
            queued_at,
            lease,
        }
        .load(conn)?;
        leased.extend(inserted.into_iter().map(|row| Leased {
            id: row.id,
            event_row: row.event_row,
            target: row.target,
            queued_at,
        }));
    }
    Ok(leased)
}

/// Takes the due rows each lane of `wants` asks for, and leases each for its lane's `lease`:
/// its `next_attempt_at` moves past the attempt's end, so no other dispatcher takes it
/// meanwhile (`leased_until` says so until the outcome). An ordered lane gives at most its
/// head, and nothing while its head is leased or waiting for a retry, or another of its rows
/// is leased.
///
/// `holder` is the instance taking them (`db::instances`): each row names it until its
/// outcome, so should it die, another instance takes the row back without waiting for the
/// lease.
pub fn take_due(conn: &mut AnyConnection, wants: &[Want], holder: i64) -> QueryResult<Vec<Due>> {
    take_due_and_held(conn, wants, holder).map(|(due, _)| due)
}

/// [`take_due`], and which of `wants` (their indexes) are ordered lanes whose lock another
/// database session held ([`lock_lanes_pg`]; PostgreSQL only): nothing was taken from them.
pub fn take_due_and_held(
    conn: &mut AnyConnection,
    wants: &[Want],
    holder: i64,
) -> QueryResult<(Vec<Due>, Vec<usize>)> {
    if wants.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    match conn {
        AnyConnection::Postgres(c) => take_due_pg(c, wants, holder),
        AnyConnection::Sqlite(c) => take_due_sqlite(c, wants, holder).map(|due| (due, Vec::new())),
    }
}

/// The columns of a [`Due`], over `deliveries d` joined with `events e`, on PostgreSQL.
const DUE_COLUMNS_PG: &str =
    "d.id, d.attempts AS attempt, d.series, e.source, d.target, e.event_id, \
     e.event_type, e.payload, e.headers ->> 'content-type' AS content_type, \
     (extract(epoch FROM d.queued_at) * 1000000)::bigint AS queued_at_micros";

/// [`take_due`] on PostgreSQL: one statement for the unordered lanes ([`TakeDuePg`]) and one
/// for the ordered ([`TakeHeadsPg`]), each taking every lane's rows through a LATERAL subquery
/// with `FOR UPDATE SKIP LOCKED`, so several dispatchers take rows at once without taking one
/// row twice. An ordered lane's head is found without locking and then locked with SKIP LOCKED
/// and checked again: a head another dispatcher holds, or has leased or settled meanwhile,
/// yields nothing rather than the row behind it.
///
/// The ordered lanes' take also holds each lane's lock ([`lock_lanes_pg`]) until it commits.
/// Without it, two dispatchers taking at once each saw the lane as the other's uncommitted
/// lease left it: one leased the newest event while the older one behind it was not yet
/// committed (so it was the head), the other then leased that older one, whose check for a
/// leased row could not see the first lease, and both were sent at once (found by a black-box
/// run, in a few of a hundred bursts of two events on an idle lane over two instances).
///
/// Rows the unordered statement leased are returned even when the ordered one then fails:
/// dropped, they waited out their lease and went as a later attempt, one of their
/// `max_attempts` spent for nothing (a black-box run: 64 events whose first arrival said
/// attempt 2). The ordered lanes are then asked for again at the next take.
fn take_due_pg(
    conn: &mut diesel::PgConnection,
    wants: &[Want],
    holder: i64,
) -> QueryResult<(Vec<Due>, Vec<usize>)> {
    let (mut due, mut held) = (Vec::new(), Vec::new());
    for ordered in [false, true] {
        let lanes: Vec<&Want> = wants.iter().filter(|w| w.ordered == ordered).collect();
        if lanes.is_empty() {
            continue;
        }
        let taken = if ordered {
            conn.transaction(|conn| {
                let free = lock_lanes_pg(conn, &lanes)?;
                held = (0..wants.len())
                    .filter(|&i| wants[i].ordered)
                    .filter(|&i| !free.iter().any(|w| std::ptr::eq(*w, &wants[i])))
                    .collect();
                if free.is_empty() {
                    return Ok(Vec::new());
                }
                TakeHeadsPg(LanesPg::of(&free, holder)).load(conn)
            })
        } else {
            TakeDuePg(LanesPg::of(&lanes, holder)).load(conn)
        };
        match taken {
            Ok(taken) => due.extend(taken),
            Err(error) if due.is_empty() => return Err(error),
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    "cannot read the outbox's ordered targets; the rows already taken are sent, \
                     and the ordered targets are asked for again at the next take"
                );
                break;
            }
        }
    }
    Ok((due, held))
}

/// How long an ordered take's session may sit idle inside its transaction before PostgreSQL
/// ends it (`idle_in_transaction_session_timeout`), letting go of the lanes' locks: the take
/// is two statements a round trip apart, so only an instance stopped or cut off between them
/// gets there. Without it such an instance held its lanes for the session's 60 s.
const TAKE_IDLE_LIMIT: Duration = Duration::from_secs(2);

/// The PostgreSQL advisory lock key of `source`'s ordered target `target` (see
/// [`lock_lanes_pg`]): the first 8 bytes of a SHA-256 of both names.
pub fn lane_lock_key(source: &str, target: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("hookbox lane\0{source}\0{target}"));
    i64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 is 32 bytes"))
}

/// Locks, until the transaction ends, the lanes of a take that no other take holds (an
/// advisory lock per lane, keyed by a hash of its source and target), so two takes of one lane
/// go one after the other and each sees what the one before leased; returns those lanes. A
/// lane another take holds is left to it, without waiting: that take leases the lane's head,
/// or finds nothing to lease, as this one would. Waiting held every lane of the take, ordered
/// or not, behind an instance stopped inside its take, for as long as its transaction lived
/// (a black-box run: an instance forwarded nothing for 60 s while another was frozen); now
/// only that lane waits, for [`TAKE_IDLE_LIMIT`] at most.
fn lock_lanes_pg<'a>(
    conn: &mut diesel::PgConnection,
    lanes: &[&'a Want],
) -> QueryResult<Vec<&'a Want>> {
    #[derive(QueryableByName)]
    struct Locked {
        #[diesel(sql_type = BigInt)]
        k: i64,
    }
    let keys: Vec<i64> = lanes
        .iter()
        .map(|want| lane_lock_key(&want.source, &want.target))
        .collect();
    let locked: Vec<Locked> = diesel::sql_query(
        "SELECT k FROM (SELECT set_config('idle_in_transaction_session_timeout', $2, true)) AS s, \
         unnest($1::bigint[]) AS k WHERE pg_try_advisory_xact_lock(k)",
    )
    .bind::<Array<BigInt>, _>(&keys)
    .bind::<Text, _>(TAKE_IDLE_LIMIT.as_millis().to_string())
    .load(conn)?;
    Ok(lanes
        .iter()
        .zip(keys)
        .filter(|(_, key)| locked.iter().any(|l| l.k == *key))
        .map(|(want, _)| *want)
        .collect())
}

/// The lanes of a take on PostgreSQL, a column at a time: each column is bound as one array
/// and `unnest` turns them back into lanes, so the statement's text does not depend on how
/// many lanes there are, and diesel keeps it prepared.
struct LanesPg<'a> {
    sources: Vec<&'a str>,
    targets: Vec<&'a str>,
    limits: Vec<i64>,
    leases: Vec<f64>,
    holder: i64,
}

impl<'a> LanesPg<'a> {
    fn of(lanes: &[&'a Want], holder: i64) -> Self {
        LanesPg {
            sources: lanes.iter().map(|w| w.source.as_str()).collect(),
            targets: lanes.iter().map(|w| w.target.as_str()).collect(),
            limits: lanes.iter().map(|w| w.limit).collect(),
            leases: lanes.iter().map(|w| w.lease.as_secs_f64()).collect(),
            holder,
        }
    }

    /// The take: leases the rows `pick` (a subquery over the lane `w`) finds in each lane, and
    /// returns them as [`Due`] rows.
    fn walk_take<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>, pick: &str) -> QueryResult<()> {
        out.push_sql(
            "UPDATE deliveries d \
             SET attempts = d.attempts + 1, \
                 next_attempt_at = now() + make_interval(secs => picked.lease), \
                 leased_until = now() + make_interval(secs => picked.lease), \
                 leased_by = ",
        );
        out.push_bind_param::<BigInt, _>(&self.holder)?;
        out.push_sql(" FROM (SELECT p.id, w.lease FROM unnest(");
        out.push_bind_param::<Array<Text>, _>(&self.sources)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.targets)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<BigInt>, _>(&self.limits)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Double>, _>(&self.leases)?;
        out.push_sql(") AS w (source, target, n, lease) CROSS JOIN LATERAL (");
        out.push_sql(pick);
        out.push_sql(
            ") AS p) AS picked, events e \
             WHERE d.id = picked.id AND e.id = d.event_row \
             RETURNING ",
        );
        out.push_sql(DUE_COLUMNS_PG);
        Ok(())
    }
}

/// [`take_due_pg`]'s take of unordered lanes: up to `n` of each lane's due rows, the
/// earliest due first.
struct TakeDuePg<'a>(LanesPg<'a>);

impl QueryFragment<Pg> for TakeDuePg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_take(
            &mut out,
            "SELECT x.id FROM deliveries x \
             WHERE x.state = 'pending' AND x.source = w.source AND x.target = w.target \
               AND x.next_attempt_at <= now() \
             ORDER BY x.next_attempt_at LIMIT w.n FOR UPDATE SKIP LOCKED",
        )
    }
}

/// How old an ordered lane's head must be before it is sent: an event's received time is taken
/// before its claim commits, so an event received first on one instance can commit after one
/// received a few milliseconds later on another, and the later one, alone in sight, went first
/// (a black-box run of two and three instances under steady load: a few in a thousand, up to
/// 46 ms apart). Waiting this long lets every claim under way commit in its time; a claim that
/// stalls longer still loses its place (see docs/forwarding.md). An idle ordered lane's event
/// waits this long before it is sent: the lane looks again then (`forward::lane`), or, for an
/// event another instance claimed, at the next poll.
pub const ORDER_SETTLE: Duration = Duration::from_millis(100);

/// [`take_due_pg`]'s take of ordered lanes: each lane's head, if it is due, no other
/// dispatcher holds it, and no other row of the lane is leased (`leased_until` still ahead):
/// an older event redelivered while a later one is being sent waits for that attempt to end,
/// whichever instance sends it. A leased row's `next_attempt_at` is its lease's end too, so
/// the look walks only the lane's rows not yet due, in `deliveries_lane_due_idx`.
struct TakeHeadsPg<'a>(LanesPg<'a>);

impl QueryFragment<Pg> for TakeHeadsPg<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let pick = format!(
            "SELECT x.id FROM deliveries x \
             WHERE x.id = (SELECT h.id FROM deliveries h \
                           WHERE h.state = 'pending' AND h.source = w.source AND h.target = w.target \
                           ORDER BY h.received_at, h.event_row LIMIT 1) \
               AND x.state = 'pending' AND x.next_attempt_at <= now() \
               AND x.received_at <= now() - interval '{} milliseconds' \
               AND NOT EXISTS (SELECT 1 FROM deliveries l \
                               WHERE l.state = 'pending' AND l.source = w.source \
                                 AND l.target = w.target AND l.next_attempt_at > now() \
                                 AND l.leased_until > now()) \
             FOR UPDATE SKIP LOCKED",
            ORDER_SETTLE.as_millis()
        );
        self.0.walk_take(&mut out, &pick)
    }
}

// `Untyped`, as `sql_query`'s: the rows load by name into a `Due`.
prepared_statement!(TakeDuePg<'_> => Untyped);
prepared_statement!(TakeHeadsPg<'_> => Untyped);

/// [`take_due`] on SQLite. The write lock, taken first, keeps other dispatchers (of other
/// processes on the same file) out until the leases are written, so a lane's head is the
/// head for as long as it is looked at. A look without the lock comes first: SQLite has one
/// writer, and a dispatcher that finds nothing due should not have held it from the claims.
fn take_due_sqlite(
    conn: &mut diesel::SqliteConnection,
    wants: &[Want],
    holder: i64,
) -> QueryResult<Vec<Due>> {
    let now = now();
    let mut any = false;
    for want in wants {
        any |= !due_in_lane_sqlite(conn, want, now)?.is_empty();
        if any {
            break;
        }
    }
    if !any {
        return Ok(Vec::new());
    }
    conn.immediate_transaction(|conn| {
        let mut taken: Vec<i64> = Vec::new();
        for want in wants {
            let ids = due_in_lane_sqlite(conn, want, now)?;
            if ids.is_empty() {
                continue;
            }
            let lease_end =
                now + chrono::Duration::from_std(want.lease).unwrap_or(chrono::Duration::hours(1));
            diesel::sql_query(
                "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?1, \
                     leased_until = ?1, leased_by = ?3 \
                 WHERE id IN (SELECT value FROM json_each(?2))",
            )
            .bind::<super::sqlite::Instant, _>(lease_end)
            .bind::<Text, _>(serde_json::to_string(&ids).expect("numbers serialize"))
            .bind::<BigInt, _>(holder)
            .execute(conn)?;
            taken.extend(ids);
        }
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        diesel::sql_query(
            "SELECT d.id, d.attempts AS attempt, d.series, e.source, d.target, e.event_id, e.event_type, \
                    e.payload, json_extract(e.headers, '$.\"content-type\"') AS content_type, \
                    CAST(round((julianday(d.queued_at) - 2440587.5) * 86400000000.0) AS INTEGER) \
                        AS queued_at_micros \
             FROM deliveries d JOIN events e ON e.id = d.event_row \
             WHERE d.id IN (SELECT value FROM json_each(?1))",
        )
        .bind::<Text, _>(serde_json::to_string(&taken).expect("numbers serialize"))
        .load(conn)
    })
}

/// The rows of `want`'s lane that may be taken at `now`, on SQLite: its due rows, oldest due
/// first, or an ordered lane's head if it is due.
fn due_in_lane_sqlite(
    conn: &mut diesel::SqliteConnection,
    want: &Want,
    now: DateTime<Utc>,
) -> QueryResult<Vec<i64>> {
    use super::sqlite::Instant;

    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let rows: Vec<Row> = if want.ordered {
        diesel::sql_query(
            "SELECT x.id FROM deliveries x \
             WHERE x.id = (SELECT h.id FROM deliveries h \
                           WHERE h.state = 'pending' AND h.source = ?1 AND h.target = ?2 \
                           ORDER BY h.received_at, h.event_row LIMIT 1) \
               AND x.next_attempt_at <= ?3 AND x.received_at <= ?4 \
               AND NOT EXISTS (SELECT 1 FROM deliveries l \
                               WHERE l.state = 'pending' AND l.source = ?1 AND l.target = ?2 \
                                 AND l.next_attempt_at > ?3 AND l.leased_until > ?3)",
        )
        .bind::<Text, _>(&want.source)
        .bind::<Text, _>(&want.target)
        .bind::<Instant, _>(now)
        .bind::<Instant, _>(
            now - chrono::Duration::from_std(ORDER_SETTLE).expect("a tenth of a second"),
        )
        .load(conn)?
    } else {
        diesel::sql_query(
            "SELECT id FROM deliveries \
             WHERE state = 'pending' AND source = ?1 AND target = ?2 AND next_attempt_at <= ?3 \
             ORDER BY next_attempt_at LIMIT ?4",
        )
        .bind::<Text, _>(&want.source)
        .bind::<Text, _>(&want.target)
        .bind::<Instant, _>(now)
        .bind::<BigInt, _>(want.limit)
        .load(conn)?
    };
    Ok(rows.into_iter().map(|r| r.id).collect())
}

fn status_column(status: Option<u16>) -> Option<i16> {
    status.and_then(|s| i16::try_from(s).ok())
}

/// Records the outcomes of a batch of attempts, all or none. Each applies only while its row is
/// pending at the attempt it names, so an outcome that comes late (its lease ran out and the row
/// was taken again, or it was re-queued) changes nothing; returns how many applied. On
/// PostgreSQL the common batch, every
/// row delivered, is one statement (atomic on its own, so no BEGIN and COMMIT round trips);
/// anything else is one transaction.
///
/// The commit does not wait for the disk (PostgreSQL: `synchronous_commit = off` for this
/// transaction alone; SQLite: `synchronous = NORMAL` for it), where every claim's does. An
/// outcome is worth less than a claim: should the database's machine crash in the moment
/// before its log reaches the disk, the outcome is lost, the row's lease runs out, and it is
/// sent again with its one key: at least once, as always. A crash of hookbox loses nothing
/// committed. Waiting for the disk on every batch of outcomes cost as much as the claims'
/// own waits.
pub fn settle(conn: &mut AnyConnection, outcomes: &[Settled]) -> QueryResult<usize> {
    if outcomes.is_empty() {
        return Ok(0);
    }
    let now = now();
    // Rows are locked in ascending id order, as the purge locks the rows it deletes (see
    // `remove_of_events_pg`): two transactions that each lock several rows of the outbox, in
    // different orders, deadlock, and the loser's whole batch is lost (a purge pass under load
    // lost the dispatcher batches of thousands of outcomes, each then sent again).
    let mut outcomes: Vec<&Settled> = outcomes.iter().collect();
    outcomes.sort_unstable_by_key(|s| s.id);
    let (delivered, others): (Vec<&Settled>, Vec<&Settled>) = outcomes
        .into_iter()
        .partition(|s| matches!(s.outcome, Settle::Delivered { .. }));
    match &mut *conn {
        AnyConnection::Postgres(c) if others.is_empty() => settle_delivered_pg(c, &delivered, now),
        AnyConnection::Postgres(_) => settle_in_transaction(conn, &delivered, &others, now),
        AnyConnection::Sqlite(c) => {
            super::sqlite::wait_for_disk(c, false)?;
            let settled = settle_in_transaction(conn, &delivered, &others, now);
            if let AnyConnection::Sqlite(c) = &mut *conn {
                super::sqlite::wait_for_disk(c, true)?;
            }
            settled
        }
    }
}

/// [`settle`]'s transaction, for a batch with outcomes other than delivered (and every batch
/// on SQLite).
fn settle_in_transaction(
    conn: &mut AnyConnection,
    delivered: &[&Settled],
    others: &[&Settled],
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    write_transaction(conn, |conn| {
        let mut recorded = 0;
        let rest: Vec<&Settled> = match &mut *conn {
            AnyConnection::Postgres(c) => {
                super::pg::commit_without_waiting(c)?;
                // The delivered rows and the others are updated apart: every row is locked
                // first, in one ascending pass.
                let mut ids: Vec<i64> = delivered.iter().chain(others).map(|s| s.id).collect();
                ids.sort_unstable();
                diesel::sql_query(
                    "SELECT id FROM deliveries WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                )
                .bind::<Array<BigInt>, _>(&ids)
                .execute(c)?;
                recorded += settle_delivered_pg(c, delivered, now)?;
                // Attempts to be made again, the most of the others while a downstream
                // fails, in one statement too: one each, a round trip apiece with the rows
                // locked, kept a batch's transaction open for seconds under load (a purge
                // waiting on it, found by a black-box run).
                let (retried, rest): (Vec<&Settled>, Vec<&Settled>) = others
                    .iter()
                    .copied()
                    .partition(|s| matches!(s.outcome, Settle::Retry { .. }));
                recorded += settle_retried_pg(c, &retried, now)?;
                rest
            }
            AnyConnection::Sqlite(c) => {
                recorded += settle_delivered_sqlite(c, delivered, now)?;
                others.to_vec()
            }
        };
        for settled in rest {
            recorded += settle_one(conn, settled, now)?;
        }
        Ok(recorded)
    })
}

/// The delivered outcomes of [`settle`] on SQLite, in one statement, prepared once per
/// connection (diesel prepares its query builder's UPDATE anew for every row).
fn settle_delivered_sqlite(
    conn: &mut diesel::SqliteConnection,
    delivered: &[&Settled],
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    if delivered.is_empty() {
        return Ok(0);
    }
    let rows: Vec<(i64, i32, Option<i16>, i32)> = delivered
        .iter()
        .map(|s| {
            let status = match s.outcome {
                Settle::Delivered { status } => status_column(status),
                _ => None,
            };
            (s.id, s.attempt, status, s.series)
        })
        .collect();
    SettleDeliveredSqlite {
        rows: serde_json::to_string(&rows).expect("numbers serialize"),
        at: now,
    }
    .execute(conn)
}

/// The delivered outcomes of [`settle`] on PostgreSQL, in one statement.
fn settle_delivered_pg(
    conn: &mut diesel::PgConnection,
    delivered: &[&Settled],
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    if delivered.is_empty() {
        return Ok(0);
    }
    let mut rows = OutcomeRows::default();
    for settled in delivered {
        let Settle::Delivered { status } = settled.outcome else {
            continue;
        };
        rows.push(settled, status);
    }
    SettleDeliveredPg { rows, at: now }.execute(conn)
}

/// The rows of a batch of outcomes on PostgreSQL, bound a column at a time, as arrays: each
/// row's id, the attempt and series its outcome is of, and the status its attempt got.
#[derive(Default)]
struct OutcomeRows {
    ids: Vec<i64>,
    attempts: Vec<i32>,
    series: Vec<i32>,
    statuses: Vec<Option<i16>>,
}

impl OutcomeRows {
    /// What an outcome statement's rows are matched by: the row, still at the outcome's attempt
    /// of its series and neither delivered nor dead (written so that no partial index on
    /// pending rows can serve it, see [`SettleDeliveredPg`]).
    const MATCH: &'static str = "WHERE d.id = v.id AND d.attempts = v.attempt \
                                 AND d.series = v.series AND d.state NOT IN ('delivered', 'dead')";

    fn push(&mut self, settled: &Settled, status: Option<u16>) {
        self.ids.push(settled.id);
        self.attempts.push(settled.attempt);
        self.series.push(settled.series);
        self.statuses.push(status_column(status));
    }

    /// `unnest(` and the four columns' binds, in the order `v (id, attempt, status, series`
    /// names them; the caller adds its own columns and closes both.
    fn walk_unnest<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("unnest(");
        out.push_bind_param::<Array<BigInt>, _>(&self.ids)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Integer>, _>(&self.attempts)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<SmallInt>>, _>(&self.statuses)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Integer>, _>(&self.series)
    }
}

/// [`settle_delivered_pg`]'s UPDATE: each row delivered at `at` with its status, if it is still
/// pending at that attempt of that series (neither delivered nor dead).
///
/// Unlike the other statements here it is planned on every call, and its test of the state
/// is written so that no partial index on pending rows can serve it. Each row delivered leaves
/// its entries in those indexes until a vacuum; the planner, which counts live pending rows
/// only, took them for a few rows and chose to read them all and hash-join the batch against
/// them, and a plan kept prepared stays the one made when the table was empty. Planned with the
/// batch's own arrays and the table's size, the UPDATE finds each row by its primary key.
struct SettleDeliveredPg {
    rows: OutcomeRows,
    at: DateTime<Utc>,
}

impl QueryFragment<Pg> for SettleDeliveredPg {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.unsafe_to_cache_prepared();
        // A statement outside a transaction block commits at its end: set here, the setting
        // holds for that commit, with no round trip of its own (see `settle`).
        out.push_sql("WITH asynchronous AS (");
        out.push_sql(super::pg::COMMIT_WITHOUT_WAITING);
        out.push_sql(
            ") UPDATE deliveries d \
             SET state = 'delivered', last_status = v.status, last_error = NULL, delivered_at = ",
        );
        out.push_bind_param::<super::pg::Instant, _>(&self.at)?;
        out.push_sql(" FROM ");
        self.rows.walk_unnest(&mut out)?;
        out.push_sql(") AS v (id, attempt, status, series), asynchronous ");
        out.push_sql(OutcomeRows::MATCH);
        Ok(())
    }
}

/// The outcomes of [`settle`] on PostgreSQL that are attempts to be made again
/// ([`Settle::Retry`]), in one statement, in the batch's transaction.
fn settle_retried_pg(
    conn: &mut diesel::PgConnection,
    retried: &[&Settled],
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    if retried.is_empty() {
        return Ok(0);
    }
    let mut retry = SettleRetriedPg::default();
    for settled in retried {
        let Settle::Retry {
            status,
            error,
            after,
        } = &settled.outcome
        else {
            continue;
        };
        retry.rows.push(settled, *status);
        retry.errors.push(error.clone());
        retry.due.push(due_after(now, *after));
    }
    retry.execute(conn)
}

/// [`settle_retried_pg`]'s UPDATE: each row keeps its status and error and is due again at its
/// `due`, its lease let go, if it is still pending at that attempt; as [`settle_one`] does one
/// row. Planned on every call, as [`SettleDeliveredPg`] is, so each row is found by its
/// primary key.
#[derive(Default)]
struct SettleRetriedPg {
    rows: OutcomeRows,
    errors: Vec<String>,
    due: Vec<DateTime<Utc>>,
}

impl QueryFragment<Pg> for SettleRetriedPg {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.unsafe_to_cache_prepared();
        out.push_sql(
            "UPDATE deliveries d \
             SET last_status = v.status, last_error = v.error, next_attempt_at = v.due, \
                 leased_until = NULL, leased_by = NULL \
             FROM ",
        );
        self.rows.walk_unnest(&mut out)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Text>, _>(&self.errors)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<super::pg::Instant>, _>(&self.due)?;
        out.push_sql(") AS v (id, attempt, status, series, error, due) ");
        out.push_sql(OutcomeRows::MATCH);
        Ok(())
    }
}

/// The outcome statements on PostgreSQL: built anew for each batch, run as they are.
macro_rules! outcome_statement {
    ($($statement:ty),*) => {$(
        impl diesel::query_builder::QueryId for $statement {
            type QueryId = ();
            const HAS_STATIC_QUERY_ID: bool = false;
        }

        impl RunQueryDsl<diesel::PgConnection> for $statement {}
    )*};
}

outcome_statement!(SettleDeliveredPg, SettleRetriedPg);

/// One outcome of [`settle`]. Its row is found by primary key; the state is tested as neither
/// delivered nor dead, as in [`SettleDeliveredPg`], so no partial index on pending rows (with
/// the entries of every row delivered since the last vacuum) can be picked for it instead.
fn settle_one(
    conn: &mut AnyConnection,
    settled: &Settled,
    now: DateTime<Utc>,
) -> QueryResult<usize> {
    on_backend!(conn, c => {
    let row = deliveries::table
        .find(settled.id)
        .filter(deliveries::attempts.eq(settled.attempt))
        .filter(deliveries::series.eq(settled.series))
        .filter(deliveries::state.ne_all(["delivered", "dead"]));
    match &settled.outcome {
        Settle::Delivered { status } => diesel::update(row)
            .set((
                deliveries::state.eq("delivered"),
                deliveries::last_status.eq(status_column(*status)),
                deliveries::last_error.eq(None::<String>),
                deliveries::delivered_at.eq(now),
            ))
            .execute(c),
        Settle::Retry {
            status,
            error,
            after,
        } => {
            let due = due_after(now, *after);
            diesel::update(row)
                .set((
                    deliveries::last_status.eq(status_column(*status)),
                    deliveries::last_error.eq(error),
                    deliveries::next_attempt_at.eq(due),
                    deliveries::leased_until.eq(None::<DateTime<Utc>>),
                    deliveries::leased_by.eq(None::<i64>),
                ))
                .execute(c)
        }
        Settle::Untried { after } => {
            let due = due_after(now, *after);
            diesel::update(row)
                .set((
                    deliveries::attempts.eq(deliveries::attempts - 1),
                    deliveries::next_attempt_at.eq(due),
                    deliveries::leased_until.eq(None::<DateTime<Utc>>),
                    deliveries::leased_by.eq(None::<i64>),
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
    })
}

/// `after` from `now` (a day, should it not fit).
fn due_after(now: DateTime<Utc>, after: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(after).unwrap_or(chrono::Duration::hours(24))
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
    Option<i64>,
);

fn view(row: ViewRow) -> DeliveryView {
    let (
        id,
        target,
        state,
        attempts,
        last_status,
        last_error,
        next,
        created_at,
        delivered_at,
        leased_by,
    ) = row;
    let pending = state == "pending";
    DeliveryView {
        next_attempt_at: pending.then_some(next),
        // Held by an instance (taken, or handed over by its claim) until `next`, its lease's
        // end: a lease run out is an instance that stopped, and the row is due.
        attempt_under_way: pending && leased_by.is_some() && next > now(),
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
            deliveries::leased_by,
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

/// What starting a new attempt series sets on a row (a requeue, a redeliver): pending, due at
/// `$now`, attempts counted afresh in the next series, no lease, and nothing of the series
/// before's last answer, which would read as the new one's.
macro_rules! new_series {
    ($now:expr) => {
        (
            deliveries::state.eq("pending"),
            deliveries::attempts.eq(0),
            deliveries::series.eq(deliveries::series + 1),
            deliveries::next_attempt_at.eq($now),
            deliveries::leased_until.eq(None::<DateTime<Utc>>),
            deliveries::leased_by.eq(None::<i64>),
            deliveries::queued_at.eq($now),
            deliveries::delivered_at.eq(None::<DateTime<Utc>>),
            deliveries::last_status.eq(None::<i16>),
            deliveries::last_error.eq(None::<String>),
        )
    };
}

/// The (source, target) of delivery `id`, if it is stored.
pub fn lane_of(conn: &mut AnyConnection, id: i64) -> QueryResult<Option<(String, String)>> {
    on_backend!(conn, c => {
        deliveries::table
            .find(id)
            .select((deliveries::source, deliveries::target))
            .first(c)
            .optional()
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
                        .set(new_series!(now))
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

/// Takes back the rows the instance `holder` leased (by a take, or a claim that handed them
/// over) and had no outcome for: `db::instances` found it dead. Each is due now, as if its
/// lease had run out; its attempt may have reached the downstream, so it goes again with the
/// same key (at least once).
///
/// The attempt is numbered again: most such rows were leased and never sent (a claim's handed
/// rows wait for a slot), and a downstream's first request should not say attempt 2, nor a
/// crash use up one of `max_attempts`. One that was sent arrives twice with one number. The
/// series moves on, so an outcome of the taken-back attempt that still comes (its instance was
/// alive after all, and had lost its lock's connection) changes nothing. Returns how many.
pub(super) fn release_leased_by(conn: &mut AnyConnection, holder: i64) -> QueryResult<usize> {
    let now = now();
    on_backend!(conn, c => diesel::update(
        deliveries::table
            .filter(deliveries::state.eq("pending"))
            .filter(deliveries::leased_by.eq(holder))
            .filter(deliveries::attempts.gt(0)),
    )
    .set((
        deliveries::attempts.eq(deliveries::attempts - 1),
        deliveries::series.eq(deliveries::series + 1),
        deliveries::next_attempt_at.eq(now),
        deliveries::leased_until.eq(None::<DateTime<Utc>>),
        deliveries::leased_by.eq(None::<i64>),
    ))
    .execute(c))
}

/// Pending and dead rows, for the console's overview.
pub fn counts(conn: &mut AnyConnection) -> QueryResult<(i64, i64)> {
    let pending = on_backend!(conn, c => deliveries::table
        .filter(deliveries::state.eq("pending"))
        .count()
        .get_result(c))?;
    Ok((pending, dead(conn)?))
}

/// Dead rows (for the gauges, beside [`pending_by_target`], whose counts add up to the pending
/// total: the dispatcher's recount reads the pending rows once, not twice).
pub fn dead(conn: &mut AnyConnection) -> QueryResult<i64> {
    on_backend!(conn, c => deliveries::table
        .filter(deliveries::state.eq("dead"))
        .count()
        .get_result(c))
}

/// One (source, target)'s pending rows, as [`pending_by_target`] counts them.
#[derive(Debug, QueryableByName)]
pub struct PendingCount {
    /// The source's name.
    #[diesel(sql_type = Text)]
    pub source: String,
    /// The target's name.
    #[diesel(sql_type = Text)]
    pub target: String,
    /// Pending rows.
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    /// Of those, the ones leased now (taken by a dispatcher or handed to it by a claim, their
    /// lease, which `next_attempt_at` ends, still running: the attempt under way or about to
    /// be). An ordered lane has at most one, whichever instance sends it.
    #[diesel(sql_type = BigInt)]
    pub leased: i64,
}

/// Pending rows by (source, target), for the per-target gauge, and how many of each are leased.
pub fn pending_by_target(conn: &mut AnyConnection) -> QueryResult<Vec<PendingCount>> {
    match conn {
        AnyConnection::Postgres(c) => diesel::sql_query(
            "SELECT source, target, count(*) AS pending, \
                    count(*) FILTER (WHERE leased_by IS NOT NULL AND next_attempt_at > now()) \
                        AS leased \
             FROM deliveries WHERE state = 'pending' GROUP BY source, target",
        )
        .load(c),
        AnyConnection::Sqlite(c) => diesel::sql_query(
            "SELECT source, target, count(*) AS pending, \
                    coalesce(sum(CASE WHEN leased_by IS NOT NULL AND next_attempt_at > ?1 \
                                      THEN 1 ELSE 0 END), 0) AS leased \
             FROM deliveries WHERE state = 'pending' GROUP BY source, target",
        )
        .bind::<super::sqlite::Instant, _>(now())
        .load(c),
    }
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
        .set(new_series!(now))
        .execute(c))?;
    }
    Ok(requeued)
}

/// Queues a new attempt series for the delivered or dead deliveries of the event stored in row
/// `event_row` to `targets`: each is pending again, due now, with a fresh count of attempts,
/// and goes out with the same key. Pending ones are left as they are. Returns how many were
/// re-queued (none for a target name no store can hold).
pub fn redeliver(
    conn: &mut AnyConnection,
    event_row: i64,
    targets: &[String],
) -> QueryResult<usize> {
    let targets: Vec<&String> = targets.iter().filter(|t| storable(t)).collect();
    if targets.is_empty() {
        return Ok(0);
    }
    write_transaction(conn, |conn| {
        let ids: Vec<i64> = on_backend!(conn, c => {
            deliveries::table
                .filter(deliveries::event_row.eq(event_row))
                .filter(deliveries::target.eq_any(&targets))
                .select(deliveries::id)
                .load(c)
        })?;
        requeue_rows(conn, &ids, &["delivered", "dead"])
    })
}

/// Re-queues every dead delivery that matches: of events of `source`, to targets named
/// `target`, queued at or after `since` (each only if given), to a (source, target) the config
/// has (`configured`). Returns how many (none for a source or target name no store can hold).
pub fn requeue_dead(
    conn: &mut AnyConnection,
    source: Option<&str>,
    target: Option<&str>,
    since: Option<DateTime<Utc>>,
    configured: &dyn Fn(&str, &str) -> bool,
) -> QueryResult<usize> {
    if [source, target].into_iter().flatten().any(|v| !storable(v)) {
        return Ok(0);
    }
    write_transaction(conn, |conn| {
        let rows: Vec<(i64, String, String)> = on_backend!(conn, c => {
            let mut select = deliveries::table
                .filter(deliveries::state.eq("dead"))
                .select((deliveries::id, deliveries::source, deliveries::target))
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
                select = select.filter(deliveries::queued_at.ge(since));
            }
            select.load(c)
        })?;
        // A delivery to a target no longer in the config stays dead: no instance would send it.
        let ids: Vec<i64> = rows
            .into_iter()
            .filter(|(_, source, target)| configured(source, target))
            .map(|(id, _, _)| id)
            .collect();
        requeue_rows(conn, &ids, &["dead"])
    })
}
