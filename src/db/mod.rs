//! The store: the connection pool, the embedded migrations, and how a database failure is
//! told apart from the rest.
//!
//! hookbox keeps its events in PostgreSQL (`postgres://...`), the store of record for teams and
//! for several instances, or in an embedded SQLite file (`sqlite://PATH`, `sqlite::memory:`)
//! for one instance with nothing else installed. This module is the one place that knows which:
//! the rest of hookbox, handlers included, works with an [`AnyConnection`], and code whose SQL
//! differs between the two goes through [`on_backend!`] or the [`pg`] and [`sqlite`] modules.

pub mod deliveries;
pub mod events;
pub mod instances;
pub mod paces;
pub mod pg;
pub mod pg_schema;
pub mod sqlite;
pub mod sqlite_schema;
pub mod transmissions;

/// Makes each of the given statements (a `QueryFragment` of fixed text) one that diesel
/// prepares once per connection and keeps: its query id is its type, so the statement cache
/// finds it without building its SQL again. Written `Name<'_>` or `Name` for PostgreSQL's,
/// `sqlite: Name` for SQLite's, with `=> SqlType` after if it returns rows. `sql_query`'s
/// statements are never kept: each is parsed (and on PostgreSQL planned) again every time it
/// runs.
macro_rules! prepared_statement {
    (sqlite: $query:ident $(=> $sql_type:ty)?) => {
        $crate::db::prepared_statement!(@impl [$query] [$query] [diesel::SqliteConnection] $($sql_type)?);
    };
    ($query:ident<'_> $(=> $sql_type:ty)?) => {
        $crate::db::prepared_statement!(@impl [$query<'_>] [$query<'static>] [diesel::PgConnection] $($sql_type)?);
    };
    ($query:ident $(=> $sql_type:ty)?) => {
        $crate::db::prepared_statement!(@impl [$query] [$query] [diesel::PgConnection] $($sql_type)?);
    };
    (@impl [$query:ty] [$id:ty] [$conn:ty] $($sql_type:ty)?) => {
        impl diesel::query_builder::QueryId for $query {
            type QueryId = $id;
            const HAS_STATIC_QUERY_ID: bool = true;
        }

        $(
            impl diesel::query_builder::Query for $query {
                type SqlType = $sql_type;
            }
        )?

        impl diesel::RunQueryDsl<$conn> for $query {}
    };
}
pub(crate) use prepared_statement;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::pg::PgConnection;
use diesel::r2d2::{ManageConnection, Pool, PooledConnection, R2D2Connection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{Array, Text};
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, QueryResult, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

pub use crate::store::{DatabaseConfig, Store};

/// A connection to either store. Handlers get one: diesel's query builder and `sql_query`
/// work on it as on either backend (through diesel's `MultiBackend`), and a handler that needs
/// SQL of one backend's own matches on it.
#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    /// PostgreSQL.
    Postgres(PgConnection),
    /// The embedded SQLite store.
    Sqlite(SqliteConnection),
}

/// Runs `$body` with `$conn` (an `&mut AnyConnection`) opened up as the backend's own
/// connection, named `$c`, and that backend's `events`, `deliveries`, `instances` and `paces`
/// tables and `Instant` SQL type in scope. The body is written once and compiled for each backend.
#[macro_export]
#[doc(hidden)]
macro_rules! on_backend {
    ($conn:expr, $c:ident => $body:expr) => {
        match $crate::db::as_any($conn) {
            $crate::db::AnyConnection::Postgres($c) => {
                #[allow(unused_imports)]
                use $crate::db::pg::Instant;
                #[allow(unused_imports)]
                use $crate::db::pg_schema::{deliveries, events, instances, paces, transmissions};
                $body
            }
            $crate::db::AnyConnection::Sqlite($c) => {
                #[allow(unused_imports)]
                use $crate::db::sqlite::Instant;
                #[allow(unused_imports)]
                use $crate::db::sqlite_schema::{
                    deliveries, events, instances, paces, transmissions,
                };
                $body
            }
        }
    };
}
pub use on_backend;

/// The identity, so [`on_backend!`] takes anything that derefs to an [`AnyConnection`].
#[doc(hidden)]
pub fn as_any(conn: &mut AnyConnection) -> &mut AnyConnection {
    conn
}

/// The migrations of each backend, compiled into the binary.
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");
const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// What a migration run did, and what it found.
#[derive(Debug, Default)]
pub struct Migrated {
    /// The versions it applied, oldest first.
    pub applied: Vec<String>,
    /// Versions the database has applied that this binary does not carry: a newer hookbox
    /// migrated it.
    pub unknown: Vec<String>,
}

/// The versions of the migrations this binary carries for the connection's backend.
fn known_versions(conn: &AnyConnection) -> Vec<String> {
    fn of<DB: diesel::backend::Backend>(source: &EmbeddedMigrations) -> Vec<String> {
        diesel::migration::MigrationSource::<DB>::migrations(source)
            .map(|all| all.iter().map(|m| m.name().version().to_string()).collect())
            .unwrap_or_default()
    }
    match conn {
        AnyConnection::Postgres(_) => of::<diesel::pg::Pg>(&PG_MIGRATIONS),
        AnyConnection::Sqlite(_) => of::<diesel::sqlite::Sqlite>(&SQLITE_MIGRATIONS),
    }
}

/// The versions the database records as applied, read with a plain `SELECT`. diesel's own
/// harness creates the table first if it is missing, a `CREATE` that a role which may only
/// read and write rows is refused even when nothing is left to apply; this read needs no such
/// right.
fn applied_versions(conn: &mut AnyConnection) -> QueryResult<Vec<String>> {
    #[derive(diesel::QueryableByName)]
    struct Applied {
        #[diesel(sql_type = diesel::sql_types::Text)]
        version: String,
    }
    diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
        .load::<Applied>(conn)
        .map(|rows| rows.into_iter().map(|row| row.version).collect())
}

/// Whether the error says the migrations table is not there: a database never migrated.
fn is_missing_table(error: &DieselError) -> bool {
    let message = error.to_string();
    message.contains("does not exist") || message.contains("no such table")
}

/// Applies the backend's pending migrations, and lists the applied ones this binary lacks.
/// When none is pending nothing but a read is done, so a role without the right to create
/// tables can start a server on a database its owner migrated.
fn run_migrations(conn: &mut AnyConnection) -> anyhow::Result<Migrated> {
    let known = known_versions(conn);
    // Unreadable for any reason: the harness is left to apply, or to say what is wrong.
    let before = applied_versions(conn).ok();
    if before.is_none() {
        if let AnyConnection::Sqlite(sqlite) = conn {
            refuse_another_programs_file(sqlite)?;
        }
    }
    let pending = before
        .as_ref()
        .is_none_or(|applied| known.iter().any(|version| !applied.contains(version)));
    if pending {
        let applied = match conn {
            AnyConnection::Postgres(pg) => run_pg_migrations_aloud(pg),
            AnyConnection::Sqlite(sqlite) => {
                sqlite.run_pending_migrations(SQLITE_MIGRATIONS).map(drop)
            }
        };
        applied.map_err(|e| {
            let hint = match (&before, e.to_string().contains("permission denied")) {
                (_, false) => String::new(),
                // The table was read: the role lacks only the right to create.
                (Some(applied), true) => {
                    let missing: Vec<&str> = known
                        .iter()
                        .filter(|version| !applied.contains(version))
                        .map(String::as_str)
                        .collect();
                    format!(
                        " ({} migration(s) pending: {}; this role may not create or alter \
                             hookbox's tables: run hookbox migrate as the schema's owner, then \
                             grant this role what docs/stores.md, Roles, lists)",
                        missing.len(),
                        missing.join(", ")
                    )
                }
                (None, true) => " (this role may neither create hookbox's tables nor read \
                                     the migrations table: run hookbox migrate as the schema's \
                                     owner, then grant this role what docs/stores.md, Roles, \
                                     lists)"
                    .to_owned(),
            };
            anyhow::anyhow!("applying migrations failed: {e}{hint}")
        })?;
    }
    let recorded = match pending {
        true => applied_versions(conn).unwrap_or_default(),
        false => before.clone().unwrap_or_default(),
    };
    // What this run applied, oldest first: on PostgreSQL, tries that waited on a lock may
    // each have applied some before the one that waited.
    let mut applied: Vec<String> = recorded
        .iter()
        .filter(|version| {
            known.contains(version) && before.as_ref().is_none_or(|was| !was.contains(version))
        })
        .cloned()
        .collect();
    applied.sort();
    let unknown = recorded
        .into_iter()
        .filter(|version| !known.contains(version))
        .collect();
    Ok(Migrated { applied, unknown })
}

/// [`refuse_another_programs_file`], on a file that exists, before hookbox first opens it as its
/// store: that switches the file to WAL mode, and a refused file is left as it was. Read on a
/// connection of its own with no setup; a file it cannot read is left to the store's own open,
/// which says what to check.
fn refuse_another_programs_file_at(path: &str) -> anyhow::Result<()> {
    if std::fs::metadata(path).map_or(true, |meta| meta.len() == 0) {
        return Ok(());
    }
    // Read-only: a connection that may write checkpoints a WAL-mode file as it closes (another
    // program's main file grew and its -wal and -shm were removed, a re-check found), and this
    // look writes nothing. As a URI, so its mode can be given: '%', '?' and '#' are escaped.
    let uri = format!(
        "file:{}?mode=ro",
        path.replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23")
    );
    let Ok(mut conn) = SqliteConnection::establish(&uri) else {
        return Ok(());
    };
    // A read, which another process's write in rollback-journal mode may hold a moment.
    let _ = conn.batch_execute("PRAGMA busy_timeout = 5000");
    let hookboxs = diesel::sql_query("SELECT version FROM __diesel_schema_migrations LIMIT 1")
        .execute(&mut conn)
        .is_ok();
    if hookboxs {
        return Ok(());
    }
    refuse_another_programs_file(&mut conn)
}

/// An SQLite file with tables but no hookbox schema is another program's (a path that names
/// the wrong file): hookbox would add its tables to it, or fail on a table of the same name
/// with the database's own error. Refused, naming a few of its tables.
fn refuse_another_programs_file(conn: &mut SqliteConnection) -> anyhow::Result<()> {
    #[derive(diesel::QueryableByName)]
    struct Table {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    let tables: Vec<String> = diesel::sql_query(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         ORDER BY name",
    )
    .load::<Table>(conn)
    .map(|rows| rows.into_iter().map(|row| row.name).collect())
    .unwrap_or_default();
    if tables.is_empty() {
        return Ok(());
    }
    let file: String =
        diesel::sql_query("SELECT file AS name FROM pragma_database_list WHERE name = 'main'")
            .get_result::<Table>(conn)
            .map_or_else(|_| "this SQLite file".to_owned(), |row| row.name);
    let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
    anyhow::bail!(
        "{file} holds another program's tables ({}{}) and no hookbox store: hookbox adds \
         nothing to it. Point [database].url (or DATABASE_URL) at hookbox's own file; a path \
         with no file makes a new store",
        shown.join(", "),
        if tables.len() > shown.len() {
            format!(" and {} more", tables.len() - shown.len())
        } else {
            String::new()
        }
    )
}

/// How long one try of PostgreSQL's pending migrations waits for a lock on a table. A
/// migration's `ALTER TABLE` waits for every session using the table (a `pg_dump` holds them
/// all for its whole run), and every claim of the running instances queues behind that wait:
/// short tries keep both from waiting silently and without end.
const MIGRATION_LOCK_TRY: Duration = Duration::from_secs(2);

/// The pause between two tries, in which the claims queued behind a try's lock request go on.
const MIGRATION_LOCK_PAUSE: Duration = Duration::from_secs(3);

/// How often a wait that goes on is said again.
const MIGRATION_WAIT_SAID_EVERY: Duration = Duration::from_secs(30);

/// Applies PostgreSQL's pending migrations so that a wait on a lock another session holds is
/// never silent: each try waits [`MIGRATION_LOCK_TRY`] at most, and one that times out (the
/// migration that waited is rolled back; those before it stay applied) names the sessions that
/// hold hookbox's tables in a WARN (then every 30 s), pauses, and tries again, for as long as
/// it takes, as the wait did before.
fn run_pg_migrations_aloud(
    pg: &mut PgConnection,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use diesel::connection::SimpleConnection;
    pg.batch_execute(&format!(
        "SET lock_timeout = {}",
        MIGRATION_LOCK_TRY.as_millis()
    ))?;
    let started = Instant::now();
    let mut said: Option<Instant> = None;
    let result = loop {
        match pg.run_pending_migrations(PG_MIGRATIONS) {
            Ok(_) => break Ok(()),
            Err(e) if e.to_string().contains("lock timeout") => {
                if said.is_none_or(|at| at.elapsed() >= MIGRATION_WAIT_SAID_EVERY) {
                    let holders = pg::sessions_holding_tables(pg)
                        .unwrap_or_else(|e| format!("(who holds them could not be read: {e})"));
                    tracing::warn!(
                        waited = %crate::config::Spelt(Duration::from_secs(
                            started.elapsed().as_secs()
                        )),
                        holders = %holders,
                        "migrations wait for hookbox's tables, which another database session \
                         holds (a pg_dump, a long transaction): tried again every {}s until \
                         it lets go; deliveries to running instances go on between tries \
                         (to end a holder now: SELECT pg_terminate_backend(pid))",
                        (MIGRATION_LOCK_TRY + MIGRATION_LOCK_PAUSE).as_secs()
                    );
                    said = Some(Instant::now());
                }
                std::thread::sleep(MIGRATION_LOCK_PAUSE);
            }
            Err(e) => break Err(e),
        }
    };
    let _ = pg.batch_execute("SET lock_timeout TO DEFAULT");
    result
}

/// How long a request waits for a pooled connection before it is answered 503. Short, so a
/// provider hears "try later" quickly while the database is away.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(3);

/// The pool of database connections the server works with.
pub type DbPool = Pool<Manager>;

/// One connection out of the pool.
pub type DbConnection = PooledConnection<Manager>;

/// A pooled connection that remembers whether it was seen to fail, so the pool drops it
/// instead of handing it out again. This replaces a test query on every checkout (one round
/// trip per request): a connection is checked only when it sat idle or a dead one was seen
/// since it was last used (see [`Health`]), and the first query to meet a dead one is tried
/// again on a fresh connection where that is safe.
pub struct Conn {
    conn: AnyConnection,
    broken: bool,
    /// The pool's write turns, on SQLite.
    turns: Option<Arc<WriteTurns>>,
    /// The session's own bound on a wait for a lock: the in-flight wait.
    lock_wait: Duration,
    /// What the pool's connections have seen of the database.
    health: Arc<Health>,
    /// When the pool last handed this connection out (or made it).
    handed_out: Instant,
    /// When it was made.
    made: Instant,
}

/// A connection idle this long is checked with a round trip before it is handed out: a server
/// or a proxy may have closed it meanwhile (`idle_session_timeout`, a restart).
const IDLE_BEFORE_CHECK: Duration = Duration::from_secs(5);

/// What a pool's connections have seen: when one was last found dead. A database that killed
/// one connection (a restart, `pg_terminate_backend`) has usually killed them all, so each
/// connection handed out before that moment is checked with a round trip before it is handed
/// out again, and the dead ones are replaced, instead of each failing one request.
struct Health {
    since: Instant,
    /// Milliseconds from `since` to the last dead connection seen, plus one; 0 if none was.
    dead_seen: AtomicU64,
    /// The same, for the last SQLite connection that refused a write as read-only.
    read_only_seen: AtomicU64,
}

impl Health {
    fn new() -> Arc<Health> {
        Arc::new(Health {
            since: Instant::now(),
            dead_seen: AtomicU64::new(0),
            read_only_seen: AtomicU64::new(0),
        })
    }

    fn saw_dead(&self) {
        self.saw(&self.dead_seen);
    }

    /// A connection refused a write as read-only: the others made before now were opened as
    /// it was (SQLite opens a file it cannot write read-only), and are made again.
    fn saw_read_only(&self) {
        self.saw(&self.read_only_seen);
    }

    fn saw(&self, seen: &AtomicU64) {
        let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        seen.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether a dead connection was seen after `at`.
    fn dead_seen_after(&self, at: Instant) -> bool {
        self.seen_after(&self.dead_seen, at)
    }

    /// Whether a connection refused a write as read-only after `at`.
    fn read_only_seen_after(&self, at: Instant) -> bool {
        self.seen_after(&self.read_only_seen, at)
    }

    fn seen_after(&self, seen: &AtomicU64, at: Instant) -> bool {
        match seen.load(Ordering::Relaxed) {
            0 => false,
            ms => self.since + Duration::from_millis(ms - 1) >= at,
        }
    }
}

/// A lock wait this much shorter than the session's is cut to size; a smaller difference is
/// not worth the two statements that cut and restore it.
const LOCK_WAIT_SLACK: Duration = Duration::from_millis(200);

impl Conn {
    /// Waits for this process's turn to write, on SQLite, until `deadline` at the latest
    /// (see [`WriteTurns`]); `Err` past it. On PostgreSQL there are no turns: at once.
    pub fn write_turn(&self, deadline: Instant) -> Result<Option<WriteTurn>, TurnTimeout> {
        self.turns.as_ref().map(|t| t.take(deadline)).transpose()
    }

    /// Runs `work` with the session's bound on a lock wait (PostgreSQL's `lock_timeout`,
    /// SQLite's busy timeout) cut to what is left until `deadline`, so that a delivery whose
    /// claim is tried more than once waits `in_flight_wait` in all, not on each try. A wait
    /// already past its deadline is still given a millisecond: a claim that does not have to
    /// wait goes ahead.
    pub fn waiting_until<T, E>(
        &mut self,
        deadline: Instant,
        work: impl FnOnce(&mut AnyConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<DieselError>,
    {
        self.waiting(deadline, false, work)
    }

    /// [`Conn::waiting_until`], and on a connection whose session waits less than is left
    /// until `deadline` (a claim writer's own, see [`Pools::claims`]), with the bound
    /// lengthened to it for `work`: a delivery held up by another's claim that waits in the
    /// writer waits out its whole in-flight wait, as it would on any other connection. The two
    /// statements that lengthen and restore the bound are paid only then (a batch's INSERT
    /// keeps the writer's short wait: see `inbox::batch`).
    pub fn waiting_all_until<T, E>(
        &mut self,
        deadline: Instant,
        work: impl FnOnce(&mut AnyConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<DieselError>,
    {
        self.waiting(deadline, true, work)
    }

    fn waiting<T, E>(
        &mut self,
        deadline: Instant,
        lengthened: bool,
        work: impl FnOnce(&mut AnyConnection) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<DieselError>,
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let cut = left + LOCK_WAIT_SLACK < self.lock_wait;
        let longer = lengthened && left > self.lock_wait + LOCK_WAIT_SLACK;
        if !cut && !longer {
            return work(&mut self.conn);
        }
        if let Err(e) = set_lock_wait(&mut self.conn, left) {
            self.note(&e);
            return Err(e.into());
        }
        let result = work(&mut self.conn);
        // A session left with another wait would cut every later claim short (or let it wait
        // past its own): drop it.
        if set_lock_wait(&mut self.conn, self.lock_wait).is_err() {
            self.broken = true;
        }
        result
    }

    /// Marks the connection broken when `error` says the connection itself failed (closed, or
    /// a command could not be sent): the pool then drops it rather than hand it out again.
    /// Returns whether it did.
    ///
    /// So too an SQLite connection that refused a write as read-only: SQLite opened the file
    /// read-only because it was not writable then, and such a connection stays so for its
    /// life. Kept in the pool, a store made writable again went on refusing every delivery
    /// until the pool retired its connections, ten minutes later (a black-box run); a fresh
    /// connection opens it for writing as soon as it can be. The pool's other connections,
    /// made before, are made again as they are checked out (see [`Health`]).
    pub fn note(&mut self, error: &DieselError) -> bool {
        if is_connection_error(error) {
            self.broken = true;
            self.health.saw_dead();
        } else if matches!(self.conn, AnyConnection::Sqlite(_))
            && matches!(error, DieselError::DatabaseError(_, info)
                if info.message().contains("readonly database"))
        {
            self.broken = true;
            self.health.saw_read_only();
        }
        self.broken
    }
}

impl std::ops::Deref for Conn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.conn
    }
}

/// Sets the session's bound on a wait for a lock (at least a millisecond: 0 means no bound).
fn set_lock_wait(conn: &mut AnyConnection, wait: Duration) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    let ms = wait.as_millis().max(1);
    match conn {
        AnyConnection::Postgres(pg) => pg.batch_execute(&format!("SET lock_timeout = {ms}")),
        AnyConnection::Sqlite(sqlite) => {
            sqlite.batch_execute(&format!("PRAGMA busy_timeout = {ms}"))
        }
    }
}

/// One writer at a time among a pool's SQLite connections.
///
/// SQLite has one write lock per database, and a writer that finds it taken sleeps between
/// tries (up to 100 ms at a time), so under contention the lock sits free while the waiters
/// sleep. The claims of one process instead queue here, woken the moment the writer before them
/// is done, and take SQLite's lock (`BEGIN IMMEDIATE`) only to be safe from other processes on
/// the same file.
pub struct WriteTurns {
    taken: Mutex<bool>,
    freed: Condvar,
}

/// No turn came before the delivery's in-flight wait ran out.
#[derive(Debug)]
pub struct TurnTimeout;

/// A turn to write; the next writer's comes when it is dropped.
pub struct WriteTurn(Arc<WriteTurns>);

impl WriteTurns {
    fn new() -> Arc<WriteTurns> {
        Arc::new(WriteTurns {
            taken: Mutex::new(false),
            freed: Condvar::new(),
        })
    }

    fn take(self: &Arc<Self>, deadline: Instant) -> Result<WriteTurn, TurnTimeout> {
        let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let left = deadline.saturating_duration_since(Instant::now());
        let (mut taken, waited) = self
            .freed
            .wait_timeout_while(taken, left, |taken| *taken)
            .unwrap_or_else(|e| e.into_inner());
        if waited.timed_out() && *taken {
            return Err(TurnTimeout);
        }
        *taken = true;
        Ok(WriteTurn(self.clone()))
    }
}

impl Drop for WriteTurn {
    fn drop(&mut self) {
        *self.0.taken.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0.freed.notify_one();
    }
}

/// Why [`with_connection`] could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// No connection could be had in time: the database is unreachable (or the pool is busy).
    #[error("no database connection: {0}")]
    Unavailable(#[from] diesel::r2d2::PoolError),
    /// A statement failed.
    #[error("database error: {0}")]
    Query(#[from] DieselError),
}

/// Runs `work` on a pooled connection. A connection that fails under it is dropped from the
/// pool rather than handed out again.
pub fn with_connection<T>(
    pool: &DbPool,
    work: impl FnOnce(&mut AnyConnection) -> Result<T, DieselError>,
) -> Result<T, DbError> {
    let mut conn = pool.get()?;
    work(&mut conn).map_err(|e| {
        conn.note(&e);
        DbError::Query(e)
    })
}

/// [`with_connection`], for work that is safe to run twice (reads, and writes that come to the
/// same whether done once or twice): when its connection turns out dead (the database
/// restarted or ended the session while the connection sat in the pool), it runs again, once,
/// on a fresh one, so the first request after the database is back does not fail.
pub fn with_connection_retried<T>(
    pool: &DbPool,
    mut work: impl FnMut(&mut AnyConnection) -> Result<T, DieselError>,
) -> Result<T, DbError> {
    match with_connection(pool, &mut work) {
        Err(DbError::Query(e)) if is_connection_error(&e) => with_connection(pool, work),
        result => result,
    }
}

/// What a database failure was, in words a 503 can say without quoting the database (whose
/// message may carry a value of the delivery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection, or the connection died.
    Unreachable,
    /// The database refused hookbox's role the statement (`REVOKE`, a read-only file).
    Permission,
    /// The database refused a value (a constraint, an encoding, a length).
    Refused,
    /// The database's disk is full (SQLite's `database or disk is full`, PostgreSQL's `No
    /// space left on device`).
    Full,
    /// SQLite could not read or write its files (`disk I/O error`): a file-size limit reached
    /// (`ulimit -f`), a failing disk.
    Io,
    /// SQLite found its file damaged (`database disk image is malformed`): a backup put in
    /// place beside the old file's `-wal`, a file copied while written.
    Damaged,
    /// Anything else.
    Other,
}

impl Failure {
    /// Whether the database answered and refused to write (no room, no permission, a file it
    /// cannot write or finds damaged): not away, and what it holds may still be read.
    pub fn refused_a_write(self) -> bool {
        matches!(
            self,
            Failure::Full | Failure::Permission | Failure::Io | Failure::Damaged
        )
    }

    /// Reads a statement's error. PostgreSQL's SQLSTATE is not exposed by diesel, so its
    /// message is matched (the server's default English text), as for the lock timeout.
    pub fn of(error: &DieselError) -> Failure {
        if is_connection_error(error) {
            return Failure::Unreachable;
        }
        let DieselError::DatabaseError(kind, info) = error else {
            return Failure::Other;
        };
        let message = info.message();
        match kind {
            DatabaseErrorKind::UniqueViolation
            | DatabaseErrorKind::ForeignKeyViolation
            | DatabaseErrorKind::NotNullViolation
            | DatabaseErrorKind::CheckViolation => Failure::Refused,
            _ if message.contains("database or disk is full")
                || message.contains("No space left on device") =>
            {
                Failure::Full
            }
            _ if message.contains("disk I/O error") => Failure::Io,
            _ if message.contains("database disk image is malformed") => Failure::Damaged,
            _ if message.contains("permission denied")
                || message.contains("readonly database")
                || message.contains("read-only transaction") =>
            {
                Failure::Permission
            }
            _ if [
                "invalid byte sequence",
                "value too long",
                "out of range",
                "invalid input",
            ]
            .iter()
            .any(|m| message.contains(m)) =>
            {
                Failure::Refused
            }
            _ => Failure::Other,
        }
    }
}

/// Whether the error means the connection is gone, rather than that a statement failed.
pub fn is_connection_error(error: &DieselError) -> bool {
    matches!(
        error,
        DieselError::DatabaseError(
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
            _
        ) | DieselError::BrokenTransactionManager
    )
}

/// Runs `work` in a transaction that writes. On PostgreSQL a plain `BEGIN`: row locks sort out
/// who waits for whom. On SQLite, which has one writer at a time, `BEGIN IMMEDIATE` takes the
/// write lock at once, so a transaction never reads first and then finds it cannot write; a
/// wait for the lock past the busy timeout (the in-flight wait) fails as [`is_lock_timeout`].
pub fn write_transaction<T, E>(
    conn: &mut AnyConnection,
    work: impl FnOnce(&mut AnyConnection) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<DieselError>,
{
    match conn {
        AnyConnection::Postgres(_) => conn.transaction(work),
        AnyConnection::Sqlite(sqlite) => {
            AnsiTransactionManager::begin_transaction_sql(sqlite, "BEGIN IMMEDIATE")?;
            match work(conn) {
                Ok(value) => {
                    AnyConnection::commit_transaction(conn)?;
                    Ok(value)
                }
                Err(e) => {
                    // The error that ended the work is the one to report; a failed rollback
                    // leaves the transaction manager broken, so the pool drops the connection.
                    let _ = AnyConnection::rollback_transaction(conn);
                    Err(e)
                }
            }
        }
    }
}

/// Runs `work` on one consistent snapshot that it only reads: a read-only repeatable-read
/// transaction on PostgreSQL, a read transaction on SQLite (a WAL reader sees one snapshot).
pub fn read_snapshot<T, E>(
    conn: &mut AnyConnection,
    work: impl FnOnce(&mut AnyConnection) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<DieselError>,
{
    conn.transaction(|conn| {
        if let AnyConnection::Postgres(pg) = conn {
            diesel::sql_query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(pg)?;
        }
        work(conn)
    })
}

/// Makes the pool's connections, sets each session up for hookbox's transactions, and tells
/// the pool which to drop.
pub struct Manager {
    store: Store,
    /// A duplicate waits this long on the first delivery's uncommitted claim.
    lock_timeout: Duration,
    /// Shared by the connections, on SQLite.
    turns: Option<Arc<WriteTurns>>,
    /// Shared by the connections.
    health: Arc<Health>,
}

impl ManageConnection for Manager {
    type Connection = Conn;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<Conn, Self::Error> {
        let conn = match &self.store {
            Store::Postgres(url) => AnyConnection::Postgres(pg::connect(url, self.lock_timeout)?),
            Store::SqliteFile(path) => {
                AnyConnection::Sqlite(sqlite::connect(path, self.lock_timeout)?)
            }
            Store::SqliteMemory => {
                AnyConnection::Sqlite(sqlite::connect(":memory:", self.lock_timeout)?)
            }
        };
        Ok(Conn {
            conn,
            broken: false,
            turns: self.turns.clone(),
            lock_wait: self.lock_timeout,
            health: self.health.clone(),
            handed_out: Instant::now(),
            made: Instant::now(),
        })
    }

    /// Called at each checkout. A round trip only for a connection that sat idle, or that was
    /// last handed out before a dead connection was seen (see [`Health`]); the pool drops a
    /// connection that fails it and takes the next, or makes a new one.
    fn is_valid(&self, conn: &mut Conn) -> Result<(), Self::Error> {
        if self.health.read_only_seen_after(conn.made) {
            return Err(diesel::r2d2::Error::ConnectionError(
                diesel::ConnectionError::BadConnection(MADE_AGAIN_WRITABLE.to_owned()),
            ));
        }
        let last = std::mem::replace(&mut conn.handed_out, Instant::now());
        if last.elapsed() < IDLE_BEFORE_CHECK && !self.health.dead_seen_after(last) {
            return Ok(());
        }
        conn.conn.ping().map(|_| ()).map_err(|e| {
            self.health.saw_dead();
            diesel::r2d2::Error::QueryError(e)
        })
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || conn.conn.is_broken()
    }
}

/// How long a claim writer's batch waits, on PostgreSQL, for a row another session holds (a
/// claim of the same event not yet committed, elsewhere) before its claims go one by one (see
/// `inbox::batch`). Waiting the whole in-flight wait held up a writer, and with it every
/// delivery to the instance, for as long as a duplicate waited (a black-box run: 55 unrelated
/// deliveries held up to 10 s each). Another instance's claim commits in a few milliseconds.
pub const CLAIM_BATCH_LOCK_WAIT: Duration = Duration::from_millis(100);

/// The process's connections to its store.
#[derive(Clone)]
pub struct Pools {
    /// For everything but the claim writers' batches, and for theirs where `claims` is `None`.
    pub main: DbPool,
    /// On PostgreSQL, the claim writers' own connections, one each, whose sessions wait at most
    /// [`CLAIM_BATCH_LOCK_WAIT`] for a lock: the bound is set once as each session opens, so a
    /// batch pays no statement for it (setting it around each batch's INSERT, on connections
    /// shared with the rest, cost a quarter of the throughput: BENCHMARKS.md, "A bound on the
    /// claim batch's lock wait, tried and reverted"). They are carved out of `pool_size`, which
    /// stays the most connections the process opens; a `pool_size` with no room beside the
    /// writers leaves them on `main`, with its full wait. `None` on SQLite, where the wait is for
    /// the store's one write lock, which any claim waits for alike.
    pub claims: Option<DbPool>,
}

/// Builds the pools for a server whose batched claims are written by `writers` threads (none
/// where no source's claims are batched): the writers' own connections where there is room for
/// them (see [`Pools::claims`]), the rest in `main`.
pub fn pools(
    config: &DatabaseConfig,
    lock_timeout: Duration,
    writers: usize,
) -> anyhow::Result<Pools> {
    let writers = u32::try_from(writers).unwrap_or(u32::MAX);
    let carved =
        matches!(config.store, Store::Postgres(_)) && writers > 0 && config.pool_size > writers;
    if !carved {
        return Ok(Pools {
            main: pool(config, lock_timeout)?,
            claims: None,
        });
    }
    Ok(Pools {
        main: pool_of(config, lock_timeout, config.pool_size - writers)?,
        claims: Some(pool_of(config, CLAIM_BATCH_LOCK_WAIT, writers)?),
    })
}

/// Builds the pool. It does not wait for the database: connections are made as they are
/// needed, so a server started during an outage answers 503 until the database is back.
///
/// An in-memory SQLite store lives in its one connection, so its pool holds exactly one and
/// never retires it.
pub fn pool(config: &DatabaseConfig, lock_timeout: Duration) -> anyhow::Result<DbPool> {
    pool_of(config, lock_timeout, config.pool_size)
}

/// [`pool`], of at most `size` connections.
fn pool_of(config: &DatabaseConfig, lock_timeout: Duration, size: u32) -> anyhow::Result<DbPool> {
    let store = &config.store;
    let manager = Manager {
        turns: matches!(store, Store::SqliteFile(_) | Store::SqliteMemory).then(WriteTurns::new),
        store: store.clone(),
        lock_timeout,
        health: Health::new(),
    };
    // `is_valid` decides which connections are worth a round trip (most are not).
    let builder = Pool::builder()
        .connection_timeout(CHECKOUT_TIMEOUT)
        .test_on_check_out(true)
        .error_handler(Box::new(SayConnectionErrors::default()));
    Ok(match store {
        Store::SqliteMemory => builder
            .max_size(1)
            .min_idle(Some(1))
            .idle_timeout(None)
            .max_lifetime(None)
            .build(manager)
            .context("cannot open the in-memory SQLite store")?,
        Store::SqliteFile(_) => {
            // Opened once first, for an error at once that says what to check (the pool
            // would retry until its checkout timeout).
            drop(connect(config)?);
            builder
                .max_size(size)
                .min_idle(Some(1))
                .build(manager)
                .with_context(|| format!("cannot open the SQLite store {}", config.display_url()))?
        }
        Store::Postgres(_) => builder
            .max_size(size)
            .min_idle(Some(size.min(2)))
            .build_unchecked(manager),
    })
}

/// Says why the pool cannot open (or keep) its connections. r2d2 hands the cause to one
/// waiting checkout only, and the others fail with a bare "timed out waiting for connection":
/// a cause of this process's own (out of file descriptors: "Too many open files") read as the
/// database being away, and was never logged. Each error is said at once, and again at most
/// once a minute while it goes on.
#[derive(Debug, Default)]
struct SayConnectionErrors {
    /// When each error was last said, by its text (a few at most: kept to 16).
    said: Mutex<std::collections::HashMap<String, Instant>>,
}

/// How often [`SayConnectionErrors`] says so while the errors go on.
const CONNECTION_ERRORS_SAID_EVERY: Duration = Duration::from_secs(60);

/// Why a checkout drops a connection made before one refused a write as read-only (see
/// [`Health`]): a connection made again, not a failure, and not said.
const MADE_AGAIN_WRITABLE: &str = "made before a connection refused a write as read-only";

impl diesel::r2d2::HandleError<diesel::r2d2::Error> for SayConnectionErrors {
    fn handle_error(&self, error: diesel::r2d2::Error) {
        let mut text = error.to_string();
        if text.contains(MADE_AGAIN_WRITABLE) {
            return;
        }
        if text.trim().is_empty() {
            // libpq's message for an SSL connection cut from under it can be empty.
            text = "the database driver gave no message".to_owned();
        }
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if said
            .get(&text)
            .is_none_or(|at| at.elapsed() >= CONNECTION_ERRORS_SAID_EVERY)
        {
            if said.len() >= 16 {
                said.retain(|_, at| at.elapsed() < CONNECTION_ERRORS_SAID_EVERY);
            }
            tracing::warn!(
                error = %text,
                "a database connection failed (opening one, or checking one that sat idle): \
                 a request that gets no connection in time is answered 503 (said again at \
                 most once a minute while it goes on)"
            );
            said.insert(text, Instant::now());
        }
    }
}

/// [`connect_hint`]'s words for a database the server does not have.
pub const NO_DATABASE: &str =
    "create it (createdb NAME) or fix the database name in DATABASE_URL or [database].url";

/// [`connect_hint`]'s words for a URL libpq cannot read.
const UNREADABLE_URL: &str =
    "libpq cannot read the URL itself: fix it in DATABASE_URL or [database].url";

/// What to check when PostgreSQL refused or never answered a connection, from libpq's words.
fn connect_hint(message: &str) -> &'static str {
    if message.contains("database") && message.contains("does not exist") {
        NO_DATABASE
    } else if message.contains("role") && message.contains("does not exist") {
        "the user in the URL does not exist on that server: fix it, or create the role"
    } else if message.contains("password authentication failed")
        || message.contains("no password supplied")
    {
        "check the user and password in DATABASE_URL or [database].url"
    } else if message.contains("timeout expired") {
        "nothing answered within connect_timeout: is the host reachable, and is it PostgreSQL?"
    } else if message.contains("received invalid response")
        || message.contains("expected authentication request")
    {
        // "received invalid response to SSL negotiation: H": an HTTP server, say.
        "something answered at that host and port, but not as PostgreSQL: check them"
    } else if message.contains("could not translate host name") {
        // libpq's "could not translate host name \"db\" to address: Name or service not
        // known": the name, not the server.
        "the host name in the URL does not resolve here: check its spelling, or this host's DNS"
    } else if message.contains("invalid ") {
        // libpq's own reading of the URL: "invalid port number", "invalid sslmode value",
        // "invalid connection option", "invalid URI query parameter".
        UNREADABLE_URL
    } else {
        "is PostgreSQL running? set DATABASE_URL or [database].url"
    }
}

/// A database URL that libpq itself cannot read (a port that is no number, an unknown
/// `sslmode`): a config error, which the command line answers with exit 2, not a failure to
/// reach a server that a retry could mend.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UnreadableUrl(String);

/// Connects once, outside the pool, with an error that says what to check.
pub fn connect(config: &DatabaseConfig) -> anyhow::Result<AnyConnection> {
    match &config.store {
        Store::Postgres(url) => PgConnection::establish(&pg::with_session_defaults(url))
            .and_then(|mut pg| {
                pg::ask_server_keepalives(&mut pg, url)
                    .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
                Ok(AnyConnection::Postgres(pg))
            })
            .map_err(|e| {
                let message = crate::redact::message_about(&e.to_string(), url);
                let hint = connect_hint(&message);
                if hint == UNREADABLE_URL {
                    // Where to fix it is known: where the URL came from.
                    return anyhow::Error::new(UnreadableUrl(format!(
                        "cannot connect to the database at {} (libpq cannot read the URL \
                         itself: fix it in {}): {message}",
                        config.display_url(),
                        config.url_from.describe(),
                    )));
                }
                anyhow::anyhow!(
                    "cannot connect to the database at {} ({hint}): {message}",
                    config.display_url(),
                )
            }),
        Store::SqliteFile(path) => {
            refuse_another_programs_file_at(path)?;
            sqlite::connect(path, Duration::from_secs(5))
                .map(AnyConnection::Sqlite)
                .with_context(|| {
                    format!(
                        "cannot open the SQLite store {} (the file {}: is its directory there \
                         and writable, with room and inodes free for its -wal and -shm files \
                         (df -h, df -i), the file a SQLite database, and no other process \
                         holding its write lock?)",
                        config.display_url(),
                        sqlite::absolute(path)
                    )
                })
        }
        Store::SqliteMemory => anyhow::bail!(
            "sqlite::memory: lives inside one `hookbox serve`; a separate command cannot reach it"
        ),
    }
}

/// Connects to the configured store and applies its pending migrations (see [`migrate`]).
pub fn migrate_store(
    config: &DatabaseConfig,
    after: impl FnOnce(&mut AnyConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Migrated> {
    migrate(&mut connect(config)?, after)
}

/// Applies pending migrations, with instances starting together taking turns (a session
/// advisory lock on PostgreSQL, the write lock on SQLite), then runs `after` (the handlers' own
/// setup) under the same lock. Returns what it applied and found.
pub fn migrate(
    conn: &mut AnyConnection,
    after: impl FnOnce(&mut AnyConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Migrated> {
    let run = |conn: &mut AnyConnection| {
        run_migrations(conn).and_then(|versions| after(conn).map(|()| versions))
    };
    match conn {
        AnyConnection::Postgres(pg) => {
            pg::lock_migrations(pg)?;
            let result = run(conn);
            if let AnyConnection::Postgres(pg) = conn {
                // The lock is released with the session anyway; unlocking is just prompt.
                let _ = pg::unlock_migrations(pg);
            }
            result
        }
        AnyConnection::Sqlite(sqlite) => {
            sqlite::wait_for_write_lock(sqlite)
                .map_err(|e| anyhow::anyhow!("cannot take the SQLite write lock: {e}"))?;
            write_transaction(conn, |conn| run(conn).map_err(MigrateError))
                .map_err(|MigrateError(e)| e)
        }
    }
}

/// An error of the migration run, or of the transaction around it.
struct MigrateError(anyhow::Error);

impl From<DieselError> for MigrateError {
    fn from(e: DieselError) -> Self {
        MigrateError(anyhow::anyhow!("the migration transaction failed: {e}"))
    }
}

/// Whether every embedded migration has been applied: what `/readyz` needs. A read alone (see
/// [`applied_versions`]): a database never migrated is not migrated, not an error.
pub fn is_migrated(conn: &mut AnyConnection) -> anyhow::Result<bool> {
    let known = known_versions(conn);
    match applied_versions(conn) {
        Ok(applied) => Ok(known.iter().all(|version| applied.contains(version))),
        Err(e) if is_missing_table(&e) => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("cannot read the migrations table")),
    }
}

/// Runs `work`, one statement of the transaction under way, with a bound on its whole run at
/// `deadline` (PostgreSQL's `statement_timeout`, for that statement only): `lock_timeout`
/// bounds each wait for a lock on its own, so a statement that waits on several claims in
/// turn (a batch's INSERT behind another copy of the batch, then behind a claim of one of its
/// items) would wait the in-flight wait for each. Past the deadline it fails as
/// [`pg::is_statement_timeout`]. On SQLite the write lock is the one wait, bounded already.
pub fn within_deadline<T>(
    conn: &mut AnyConnection,
    deadline: Instant,
    work: impl FnOnce(&mut AnyConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    use diesel::connection::SimpleConnection;
    if !matches!(conn, AnyConnection::Postgres(_)) {
        return work(conn);
    }
    let left = deadline.saturating_duration_since(Instant::now());
    conn.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        left.as_millis().max(1)
    ))?;
    let done = work(conn)?;
    conn.batch_execute("SET LOCAL statement_timeout TO DEFAULT")?;
    Ok(done)
}

/// Whether the error says a delivery waited on another transaction past the in-flight wait:
/// PostgreSQL's lock timeout on another transaction's claim, or SQLite's busy timeout on the
/// write lock.
pub fn is_lock_timeout(error: &DieselError) -> bool {
    pg::is_lock_timeout(error) || sqlite::is_busy(error)
}

/// After a lock timeout on PostgreSQL: whether it was a table lock another session holds (see
/// [`pg::tables_locked_by_another`]) rather than a duplicate's claim. Never on SQLite, whose
/// busy store is its own answer.
pub fn tables_locked(conn: &mut AnyConnection) -> bool {
    match conn {
        AnyConnection::Postgres(pg) => pg::tables_locked_by_another(pg).unwrap_or(false),
        AnyConnection::Sqlite(_) => false,
    }
}

/// Takes the purge lock if no other instance holds it. On SQLite there is none to take: the
/// store is one machine's file, and each purge batch is a write of its own, so two passes at
/// once only share the work.
pub fn try_lock_purge(conn: &mut AnyConnection) -> QueryResult<bool> {
    match conn {
        AnyConnection::Postgres(c) => pg::try_lock_purge(c),
        AnyConnection::Sqlite(_) => Ok(true),
    }
}

/// Lets go of the purge lock.
pub fn unlock_purge(conn: &mut AnyConnection) -> QueryResult<()> {
    match conn {
        AnyConnection::Postgres(c) => pg::unlock_purge(c),
        AnyConnection::Sqlite(_) => Ok(()),
    }
}

/// Between two writes of a long job (purge batches): a pause on SQLite, so the writers waiting
/// on its one write lock get it; nothing on PostgreSQL, where they do not wait on each other.
pub fn between_batches(conn: &AnyConnection) {
    if let AnyConnection::Sqlite(_) = conn {
        std::thread::sleep(sqlite::YIELD_TO_WRITERS);
    }
}

/// On a clean stop: on an SQLite file, moves the write-ahead log into the database file and
/// empties it (see [`sqlite::checkpoint`]), so a copy of the file alone, taken after the stop,
/// holds every event. Logs what happened; nothing to do on PostgreSQL or in memory.
pub fn checkpoint_on_stop(pool: &DbPool) {
    let result = with_connection(pool, |conn| match conn {
        AnyConnection::Sqlite(c) => sqlite::checkpoint(c).map(Some),
        AnyConnection::Postgres(_) => Ok(None),
    });
    match result {
        Ok(None) => {}
        Ok(Some(true)) => {
            tracing::info!("SQLite write-ahead log checkpointed into the database file")
        }
        Ok(Some(false)) => tracing::warn!(
            "SQLite write-ahead log not fully checkpointed: another process has the file open; \
             back it up with sqlite3's .backup, or copy the -wal and -shm files with it"
        ),
        // The file alone is not a backup then: a checkpoint that failed part way (a full disk)
        // leaves it readable only with its log (a black-box run: a copy of it alone read as
        // `database disk image is malformed`; with its -wal beside it, every event).
        Err(e) => tracing::warn!(
            error = %e,
            "SQLite write-ahead log checkpoint failed: the database file alone is not a backup \
             now and may read as malformed without its -wal file; keep the -wal and -shm files \
             beside it and copy all three together (or use sqlite3's .backup). Nothing stored \
             is lost: the next start reads the log, and a clean stop once the cause is mended \
             (a full disk: free space on it) checkpoints it"
        ),
    }
}

/// The `WHERE` of a retention pass's target over a table with a `source` and the time column
/// `at` (`events.received_at`, `transmissions.seen_at`), with its binds in order: the cutoff,
/// then the source or the names to leave out (an array on PostgreSQL, a JSON array on SQLite).
/// Run it with [`purge_statement`].
pub(crate) fn purge_filter(conn: &AnyConnection, source: Option<&str>, at: &str) -> String {
    match (conn, source) {
        (AnyConnection::Postgres(_), Some(_)) => format!("source = $2 AND {at} < $1"),
        (AnyConnection::Postgres(_), None) => format!("source <> ALL($2) AND {at} < $1"),
        (AnyConnection::Sqlite(_), Some(_)) => format!("source = ?2 AND {at} < ?1"),
        (AnyConnection::Sqlite(_), None) => {
            format!("source NOT IN (SELECT value FROM json_each(?2)) AND {at} < ?1")
        }
    }
}

/// The part of a retention pass's filter of `events` that leaves out an event one of whose
/// outbox rows is leased past `now` (the third bind of [`purge_statement`]): an attempt under
/// way, taken by a dispatcher (`leased_until`) or handed straight to one by its claim (held by
/// an instance, `leased_by`, and due when the lease ends; such rows leave `leased_until`
/// unset, and were purged in flight). Its row, and the lease an ordered target's other
/// instances wait on, stay until the attempt's outcome is written; the next pass takes the
/// event. Deleting it let another
/// instance start the ordered target's next event while the attempt was still in flight
/// (found by a black-box run: every request from then on overlapped the one before).
pub(crate) fn not_in_flight(conn: &AnyConnection) -> &'static str {
    match conn {
        AnyConnection::Postgres(_) => {
            " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_row = events.id \
             AND d.state = 'pending' AND (d.leased_until > $3 \
             OR (d.leased_by IS NOT NULL AND d.next_attempt_at > $3)))"
        }
        AnyConnection::Sqlite(_) => {
            " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_row = events.id \
             AND d.state = 'pending' AND (d.leased_until > ?3 \
             OR (d.leased_by IS NOT NULL AND d.next_attempt_at > ?3)))"
        }
    }
}

/// Runs a purge statement `sql` (with a [`purge_filter`]) with its binds: the cutoff, then
/// `source` or `named`, then `now` when the statement has a third (see [`not_in_flight`]).
pub(crate) fn purge_statement<R>(
    conn: &mut AnyConnection,
    sql: &str,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
    now: Option<DateTime<Utc>>,
) -> QueryResult<Vec<R>>
where
    R: diesel::QueryableByName<diesel::pg::Pg>
        + diesel::QueryableByName<diesel::sqlite::Sqlite>
        + 'static,
{
    match conn {
        AnyConnection::Postgres(c) => {
            let query = diesel::sql_query(sql).bind::<pg::Instant, _>(cutoff);
            match (source, now) {
                (Some(source), None) => query.bind::<Text, _>(source).load(c),
                (Some(source), Some(now)) => query
                    .bind::<Text, _>(source)
                    .bind::<pg::Instant, _>(now)
                    .load(c),
                (None, None) => query.bind::<Array<Text>, _>(named).load(c),
                (None, Some(now)) => query
                    .bind::<Array<Text>, _>(named)
                    .bind::<pg::Instant, _>(now)
                    .load(c),
            }
        }
        AnyConnection::Sqlite(c) => {
            let query = diesel::sql_query(sql).bind::<sqlite::Instant, _>(cutoff);
            let named = serde_json::to_string(named).expect("a list of strings serializes");
            match (source, now) {
                (Some(source), None) => query.bind::<Text, _>(source).load(c),
                (Some(source), Some(now)) => query
                    .bind::<Text, _>(source)
                    .bind::<sqlite::Instant, _>(now)
                    .load(c),
                (None, None) => query.bind::<Text, _>(named).load(c),
                (None, Some(now)) => query
                    .bind::<Text, _>(named)
                    .bind::<sqlite::Instant, _>(now)
                    .load(c),
            }
        }
    }
}

/// A stored time as the admin API and handlers show it: RFC 3339 in UTC, always six digits of
/// fraction (`2026-12-02T09:00:00.123400Z`), whatever digits the store's text held (a time
/// computed on SQLite, such as a retry's due time, may carry nanoseconds).
pub fn shown_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// [`shown_time`] for serde, as `serialize_with`.
///
/// # Errors
/// The serializer's.
pub fn serialize_time<S: serde::Serializer>(
    at: &DateTime<Utc>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&shown_time(*at))
}

/// [`serialize_time`] for an optional time (`null` when absent).
///
/// # Errors
/// The serializer's.
pub fn serialize_time_opt<S: serde::Serializer>(
    at: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => serialize_time(at, serializer),
        None => serializer.serialize_none(),
    }
}

/// Now on the store's clock, to the microsecond: both stores keep microseconds, and a time
/// stored must read back as the same time. This host's clock, or where PostgreSQL's was
/// measured to be off from it ([`set_clock_offset`]), the database's time at that measure
/// carried on by the monotonic clock: the dispatchers compare the times written with the
/// database's `now()`, and hosts whose clocks differ share one database. Carried on that way,
/// a step of the host's clock after the measure (out and back again before the next) moves
/// nothing: an offset added to the host's clock, measured during a day's step, dated every
/// event a day early once the clock came back (found by a black-box run).
pub fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(now_micros()).expect("now is a representable time")
}

/// [`now`] in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    match DATABASE_MINUS_MONOTONIC.load(std::sync::atomic::Ordering::Relaxed) {
        NOT_MEASURED => Utc::now().timestamp_micros(),
        difference => monotonic_micros().saturating_add(difference),
    }
}

/// The database's time minus [`monotonic_micros`] at the last measure that found them apart,
/// or [`NOT_MEASURED`]: this host's clock is then used as it is (on SQLite always).
static DATABASE_MINUS_MONOTONIC: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(NOT_MEASURED);

const NOT_MEASURED: i64 = i64::MIN;

/// Microseconds on the monotonic clock since this process first read it.
fn monotonic_micros() -> i64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    i64::try_from(START.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// Sets how far PostgreSQL's clock is ahead of this host's (negative: behind), as measured
/// now; 0: this host's clock is used as it is. [`now`] follows the database's from then on.
pub fn set_clock_offset(micros: i64) {
    let difference = if micros == 0 {
        NOT_MEASURED
    } else {
        let start = monotonic_micros();
        Utc::now()
            .timestamp_micros()
            .saturating_add(micros)
            .saturating_sub(start)
    };
    DATABASE_MINUS_MONOTONIC.store(difference, std::sync::atomic::Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(message: &str) -> Failure {
        Failure::of(&DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(message.to_owned()),
        ))
    }

    #[test]
    fn a_full_disk_is_told_apart_from_other_failures() {
        assert_eq!(failure("database or disk is full"), Failure::Full);
        assert_eq!(failure("disk I/O error"), Failure::Io);
        assert_eq!(
            failure("database disk image is malformed"),
            Failure::Damaged
        );
        assert_eq!(
            failure("could not extend file \"base/16384/2619\": No space left on device"),
            Failure::Full
        );
        assert_eq!(
            failure("attempt to write a readonly database"),
            Failure::Permission
        );
        assert_eq!(
            failure("relation \"events\" does not exist"),
            Failure::Other
        );
    }
}
