//! What only the embedded SQLite store does: the connection's pragmas, and the statements
//! PostgreSQL writes with its own SQL, in SQLite's.
//!
//! SQLite has one writer at a time. Every connection runs in WAL mode (readers never wait for
//! the writer, nor it for them) with `synchronous = FULL` (a committed claim survives a power
//! cut, as on PostgreSQL) and a busy timeout of the in-flight wait: a write that cannot have the
//! lock within it fails as "database is locked", which a claim answers 409. Several processes
//! on one machine may share a file; the lock is the file's.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::SqliteConnection;

use super::{Counted, Removed};

/// How long a long job of many write transactions (a purge) pauses between them, so writers
/// waiting for the lock get it: SQLite's busy handler sleeps up to 100 ms between its tries.
pub const YIELD_TO_WRITERS: Duration = Duration::from_millis(110);

/// The SQL type of hookbox's times on this backend: TEXT, always UTC, in one format, so times
/// compare in order as strings.
pub type Instant = diesel::sql_types::TimestamptzSqlite;

/// Opens the file at `path` (`:memory:` for a database in memory), creating it if need be.
pub fn connect(
    path: &str,
    busy_timeout: Duration,
) -> Result<SqliteConnection, diesel::r2d2::Error> {
    let mut conn =
        SqliteConnection::establish(path).map_err(diesel::r2d2::Error::ConnectionError)?;
    conn.batch_execute(&format!(
        "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         PRAGMA foreign_keys = ON;",
        busy_timeout.as_millis().max(1)
    ))
    .map_err(diesel::r2d2::Error::QueryError)?;
    Ok(conn)
}

/// What `PRAGMA wal_checkpoint` reports.
#[derive(QueryableByName)]
struct Checkpoint {
    /// 1 when another connection (another process's) kept the checkpoint from finishing.
    #[diesel(sql_type = diesel::sql_types::Integer)]
    busy: i32,
}

/// Copies every committed page from the write-ahead log into the database file and empties the
/// log (`wal_checkpoint(TRUNCATE)`), so the file alone holds everything. Returns false when
/// another connection (another process on the file) kept it from finishing.
pub fn checkpoint(conn: &mut SqliteConnection) -> QueryResult<bool> {
    let done: Checkpoint = diesel::sql_query("PRAGMA wal_checkpoint(TRUNCATE)").get_result(conn)?;
    Ok(done.busy == 0)
}

/// The `WHERE` of a purge target: `?1` the cutoff, `?2` the source or the names to leave
/// out (a JSON array).
fn filter(source: Option<&str>) -> &'static str {
    match source {
        Some(_) => "source = ?2 AND received_at < ?1",
        None => "source NOT IN (SELECT value FROM json_each(?2)) AND received_at < ?1",
    }
}

fn named_json(named: &[String]) -> String {
    serde_json::to_string(named).expect("a list of strings serializes")
}

/// See [`super::pg::purge_batch`].
pub fn purge_batch(
    conn: &mut SqliteConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
    limit: i64,
) -> QueryResult<Vec<String>> {
    let sql = format!(
        "DELETE FROM events WHERE rowid IN (\
            SELECT rowid FROM events WHERE {} LIMIT {limit}) \
         RETURNING source",
        filter(source)
    );
    let query = diesel::sql_query(&sql).bind::<Instant, _>(cutoff);
    let removed: Vec<Removed> = match source {
        Some(source) => query.bind::<Text, _>(source).load(conn)?,
        None => query.bind::<Text, _>(named_json(named)).load(conn)?,
    };
    Ok(removed.into_iter().map(|r| r.source).collect())
}

/// See [`super::pg::count_older`].
pub fn count_older(
    conn: &mut SqliteConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
) -> QueryResult<Vec<(String, i64)>> {
    let sql = format!(
        "SELECT source, count(*) AS n FROM events WHERE {} GROUP BY source",
        filter(source)
    );
    let query = diesel::sql_query(&sql).bind::<Instant, _>(cutoff);
    let counted: Vec<Counted> = match source {
        Some(source) => query.bind::<Text, _>(source).load(conn)?,
        None => query.bind::<Text, _>(named_json(named)).load(conn)?,
    };
    Ok(counted.into_iter().map(|c| (c.source, c.n)).collect())
}

/// See [`super::pg::add_replays`]: one UPDATE per event, in one transaction.
pub fn add_replays(
    conn: &mut SqliteConnection,
    batch: &[(String, String, u64)],
) -> QueryResult<()> {
    conn.immediate_transaction(|conn| {
        for (source, event_id, n) in batch {
            diesel::sql_query(
                "UPDATE events SET replays = replays + ?1 WHERE source = ?2 AND event_id = ?3",
            )
            .bind::<BigInt, _>(i64::try_from(*n).unwrap_or(i64::MAX))
            .bind::<Text, _>(source)
            .bind::<Text, _>(event_id)
            .execute(conn)?;
        }
        Ok(())
    })
}

/// Whether the error is SQLite's "database is locked": the write lock was not had within the
/// busy timeout.
pub fn is_busy(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("database is locked"))
}
