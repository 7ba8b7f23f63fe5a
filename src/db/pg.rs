//! What only PostgreSQL does: session setup, advisory locks, and the statements that use its
//! own SQL (arrays, `ctid`, `FOR UPDATE SKIP LOCKED`, `make_interval`).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{BigInt, Bool};

/// The SQL type of hookbox's times on this backend.
pub type Instant = diesel::sql_types::Timestamptz;

/// Any number will do, as long as every hookbox uses the same one: it serialises the
/// migrations (and the handlers' own setup) of instances starting together.
const MIGRATION_LOCK_KEY: i64 = 0x686f_6f6b_626f_7801;

/// Any number, as long as every hookbox uses the same one.
const PURGE_LOCK_KEY: i64 = 0x686f_6f6b_626f_7802;

/// libpq connection parameters hookbox adds where the URL sets none, each with why.
///
/// - `connect_timeout` (seconds): without one, a host that accepts the TCP connection and never
///   answers (a frozen server, a firewall that swallows packets) holds `serve`, `migrate` or
///   `purge` forever, silently.
/// - `keepalives_idle`, `keepalives_interval`, `keepalives_count` (seconds, probes) and
///   `tcp_user_timeout` (milliseconds): a connection whose server vanished without a word (a
///   failover that moved the address and black-holed the old one, a partition) is found dead
///   in about 25 s and replaced, where the system's defaults took 15 minutes for one waiting on
///   an answer and 2 hours for an idle one: meanwhile its pool's connections hung, and every
///   delivery was 503 (a black-box run: 9.5 minutes on an instance whose database was fine).
///   A live server answers keepalive probes however long its query runs, so they cut nothing
///   short.
const SESSION_DEFAULTS: [(&str, &str); 5] = [
    ("connect_timeout", "10"),
    ("keepalives_idle", "10"),
    ("keepalives_interval", "5"),
    ("keepalives_count", "3"),
    ("tcp_user_timeout", "25000"),
];

/// The server's side of the same: PostgreSQL's own keepalives and `tcp_user_timeout` for each
/// session, where nothing (the server's config, the database, the role, the URL's `options`)
/// sets them. A session whose client vanished without a word otherwise stayed on the server
/// for its 2-hour default, and kept what it held: an instance's advisory lock among them, so
/// no other instance learnt of that instance's death (a black-box run: a crash after a network
/// cut went unseen, and its deliveries under way waited for their leases). Parameters the
/// server does not know (`tcp_user_timeout` before PostgreSQL 12) are left alone; a session
/// over a Unix socket ignores them. Not set where the URL turns keepalives off.
const SERVER_SESSION_DEFAULTS: &str = "SELECT set_config(d.name, d.value, false) \
     FROM (VALUES ('tcp_keepalives_idle', '10'), ('tcp_keepalives_interval', '5'), \
                  ('tcp_keepalives_count', '3'), ('tcp_user_timeout', '25000')) \
          AS d(name, value) \
     JOIN pg_settings s ON s.name = d.name \
     WHERE s.source = 'default'";

/// Whether `url` turns libpq's keepalives off (`keepalives=0`).
fn keepalives_off(url: &str) -> bool {
    crate::redact::query_of(url)
        .unwrap_or("")
        .split('&')
        .any(|pair| pair == "keepalives=0")
}

/// `url` with each of [`SESSION_DEFAULTS`] added that it does not set.
pub fn with_session_defaults(url: &str) -> std::borrow::Cow<'_, str> {
    // A password may hold an unencoded '?' (libpq reads `u:ab?c@h/db`): the query is the one
    // past the userinfo, else the parameters went into the database's name.
    let query = crate::redact::query_of(url);
    let set = |name: &str| {
        query
            .unwrap_or("")
            .split('&')
            .any(|pair| pair.split('=').next() == Some(name))
    };
    let added: Vec<String> = SESSION_DEFAULTS
        .iter()
        .filter(|(name, _)| !set(name))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    if added.is_empty() {
        return url.into();
    }
    let joiner = if query.is_some() { '&' } else { '?' };
    format!("{url}{joiner}{}", added.join("&")).into()
}

/// Opens a session set up for hookbox's transactions.
pub fn connect(url: &str, lock_timeout: Duration) -> Result<PgConnection, diesel::r2d2::Error> {
    // libpq's message may quote a piece of the URL, a password among them.
    let mut pg = PgConnection::establish(&with_session_defaults(url)).map_err(|e| {
        diesel::r2d2::Error::ConnectionError(diesel::ConnectionError::BadConnection(
            crate::redact::message_about(&e.to_string(), url),
        ))
    })?;
    // lock_timeout bounds the wait on another transaction's claim (the in-flight wait);
    // idle_in_transaction_session_timeout makes the server abandon a transaction whose client
    // went away or stalled mid-way, so its claim cannot block the provider's retry for long:
    // 60 s, unless the server, database, role or URL already sets one.
    // One round trip, the server's keepalives with them.
    pg.batch_execute(&format!(
        "SET lock_timeout = {}; SET application_name = 'hookbox'; \
         SELECT set_config('idle_in_transaction_session_timeout', '60000', false) \
         WHERE current_setting('idle_in_transaction_session_timeout') = '0'; {}",
        lock_timeout.as_millis().max(1),
        server_keepalives(url)
    ))
    .map_err(diesel::r2d2::Error::QueryError)?;
    Ok(pg)
}

/// [`SERVER_SESSION_DEFAULTS`] for a session opened from `url`, or nothing where the URL
/// turns keepalives off.
fn server_keepalives(url: &str) -> &'static str {
    if keepalives_off(url) {
        ""
    } else {
        SERVER_SESSION_DEFAULTS
    }
}

/// Sets [`SERVER_SESSION_DEFAULTS`] on a session opened from `url` outside [`connect`] (the
/// commands' one connection, and `serve`'s for its migrations, which lives as long as the
/// process).
pub fn ask_server_keepalives(pg: &mut PgConnection, url: &str) -> QueryResult<()> {
    match server_keepalives(url) {
        "" => Ok(()),
        sql => pg.batch_execute(sql),
    }
}

/// A query that makes the transaction it runs in commit without waiting for its log to reach
/// the disk (`synchronous_commit = off` until that transaction ends), for writes that may be
/// lost in a crash of the database's machine and done again: a forward attempt's outcome.
pub const COMMIT_WITHOUT_WAITING: &str = "SELECT set_config('synchronous_commit', 'off', true)";

/// Makes the transaction under way commit without waiting for the disk
/// ([`COMMIT_WITHOUT_WAITING`]).
pub fn commit_without_waiting(conn: &mut PgConnection) -> QueryResult<()> {
    conn.batch_execute("SET LOCAL synchronous_commit = off")
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

/// Waits for the migration lock.
pub fn lock_migrations(conn: &mut PgConnection) -> anyhow::Result<()> {
    let taken = |e| anyhow::anyhow!("cannot take the migration lock: {e}");
    let free = diesel::sql_query(format!(
        "SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY}) AS locked"
    ))
    .get_result::<Locked>(conn)
    .map_err(taken)?
    .locked;
    if !free {
        // Another instance is migrating (or a `migrate` hangs): say what this one waits for.
        tracing::info!(
            "waiting for the migration lock: another hookbox is applying migrations to this \
             database (the wait ends when it finishes; a session that holds it is in \
             pg_locks, locktype advisory)"
        );
        diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
            .execute(conn)
            .map_err(taken)?;
    }
    Ok(())
}

/// Lets go of the migration lock.
pub fn unlock_migrations(conn: &mut PgConnection) -> QueryResult<()> {
    diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))
        .execute(conn)
        .map(|_| ())
}

/// Takes the purge lock if no other instance holds it.
pub fn try_lock_purge(conn: &mut PgConnection) -> QueryResult<bool> {
    Ok(
        diesel::sql_query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind::<BigInt, _>(PURGE_LOCK_KEY)
            .get_result::<Locked>(conn)?
            .locked,
    )
}

/// Lets go of the purge lock.
pub fn unlock_purge(conn: &mut PgConnection) -> QueryResult<()> {
    diesel::sql_query("SELECT pg_advisory_unlock($1) AS locked")
        .bind::<BigInt, _>(PURGE_LOCK_KEY)
        .get_result::<Locked>(conn)
        .map(|_| ())
}

/// Whether the error says a duplicate waited on another transaction's claim past the lock
/// timeout. PostgreSQL reports it as SQLSTATE 55P03, which diesel does not expose, so the
/// server's message is matched (its default English text).
pub fn is_lock_timeout(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("lock timeout"))
}

/// Whether the error says the transaction was ended to break a deadlock (SQLSTATE 40P01,
/// matched by the server's message as above): it rolled back, and may be run again.
pub fn is_deadlock(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("deadlock detected"))
}

/// Whether the error says a statement ran past the `statement_timeout` hookbox set for it
/// ([`super::within_deadline`]): SQLSTATE 57014, matched by the server's message as above.
pub fn is_statement_timeout(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("statement timeout"))
}

/// After a lock timeout: whether another session holds one of hookbox's tables in a mode that
/// blocks writing rows (a migration's `ALTER`, a `LOCK TABLE`, an index built without
/// `CONCURRENTLY`), rather than a duplicate's uncommitted claim holding the event's row.
pub fn tables_locked_by_another(conn: &mut PgConnection) -> QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Locked {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        locked: bool,
    }
    diesel::sql_query(
        "SELECT EXISTS (SELECT 1 FROM pg_locks \
         WHERE granted AND pid <> pg_backend_pid() AND locktype = 'relation' \
         AND relation IN (to_regclass('events'), to_regclass('deliveries')) \
         AND mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', \
         'AccessExclusiveLock')) AS locked",
    )
    .get_result::<Locked>(conn)
    .map(|row| row.locked)
}

/// The sessions other than this one that hold a lock on one of hookbox's tables, longest
/// open first: `pid 4242 (pg_dump, active, its transaction open 95 s: events, deliveries)`,
/// at most three and how many more. `none now` when the holder let go meanwhile.
pub fn sessions_holding_tables(conn: &mut PgConnection) -> QueryResult<String> {
    #[derive(diesel::QueryableByName)]
    struct Holder {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
        #[diesel(sql_type = diesel::sql_types::Text)]
        application: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        state: String,
        #[diesel(sql_type = BigInt)]
        open_secs: i64,
        #[diesel(sql_type = diesel::sql_types::Text)]
        tables: String,
    }
    let holders: Vec<Holder> = diesel::sql_query(
        "SELECT l.pid, \
         coalesce(nullif(a.application_name, ''), 'no application name') AS application, \
         coalesce(a.state, 'state unknown') AS state, \
         coalesce(extract(epoch FROM now() - a.xact_start)::bigint, 0) AS open_secs, \
         string_agg(DISTINCT c.relname, ', ' ORDER BY c.relname) AS tables \
         FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.granted AND l.locktype = 'relation' AND l.pid <> pg_backend_pid() \
         AND c.relnamespace = current_schema()::regnamespace \
         AND c.relname IN ('events', 'deliveries', 'instances', 'paces', 'transmissions', \
         '__diesel_schema_migrations') \
         GROUP BY l.pid, a.application_name, a.state, a.xact_start \
         ORDER BY open_secs DESC, l.pid",
    )
    .load(conn)?;
    if holders.is_empty() {
        return Ok("none now".to_owned());
    }
    let mut said: Vec<String> = holders
        .iter()
        .take(3)
        .map(|h| {
            format!(
                "pid {} ({}, {}, its transaction open {} s: {})",
                h.pid, h.application, h.state, h.open_secs, h.tables
            )
        })
        .collect();
    if holders.len() > 3 {
        said.push(format!("and {} more", holders.len() - 3));
    }
    Ok(said.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_defaults_are_added_only_where_the_url_sets_none() {
        let all = "connect_timeout=10&keepalives_idle=10&keepalives_interval=5&\
                   keepalives_count=3&tcp_user_timeout=25000";
        for (url, with) in [
            ("postgres://h/db", format!("postgres://h/db?{all}")),
            (
                "postgres://h/db?sslmode=require",
                format!("postgres://h/db?sslmode=require&{all}"),
            ),
            (
                "postgres://h/db?connect_timeout=3",
                "postgres://h/db?connect_timeout=3&keepalives_idle=10&keepalives_interval=5&\
                 keepalives_count=3&tcp_user_timeout=25000"
                    .to_owned(),
            ),
            (
                "postgres://h/db?a=1&connect_timeout=0&keepalives_idle=60&keepalives_interval=5&\
                 keepalives_count=3&tcp_user_timeout=0",
                "postgres://h/db?a=1&connect_timeout=0&keepalives_idle=60&keepalives_interval=5&\
                 keepalives_count=3&tcp_user_timeout=0"
                    .to_owned(),
            ),
            (
                "postgres://u:a?b@h/db",
                format!("postgres://u:a?b@h/db?{all}"),
            ),
        ] {
            assert_eq!(with_session_defaults(url), with, "{url}");
        }
    }
}
