//! The database: the connection pool, the embedded migrations, and how a database failure is
//! told apart from the rest.

pub mod schema;

use std::time::Duration;

use anyhow::Context;
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, ManageConnection, Pool, PooledConnection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::{Connection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::config::DatabaseConfig;

/// The migrations in `migrations/`, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// Any number will do, as long as every hookbox uses the same one: it serialises the
/// migrations (and the handlers' own setup) of instances starting together.
const MIGRATION_LOCK_KEY: i64 = 0x686f_6f6b_626f_7801;

/// How long a request waits for a pooled connection before it is answered 503. Short, so a
/// provider hears "try later" quickly while the database is away.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(3);

/// The pool of database connections the server works with.
pub type DbPool = Pool<Manager>;

/// One connection out of the pool.
pub type DbConnection = PooledConnection<Manager>;

/// A pooled PostgreSQL connection that remembers whether it was seen to fail, so the pool drops
/// it instead of handing it out again. This replaces a test query on every checkout (one round
/// trip per request): a connection that died is found by the query that needed it.
pub struct Conn {
    pg: PgConnection,
    broken: bool,
}

impl Conn {
    /// Marks the connection broken when `error` says the connection itself failed (closed, or
    /// a command could not be sent): the pool then drops it rather than hand it out again.
    /// Returns whether it did.
    pub fn note(&mut self, error: &DieselError) -> bool {
        if is_connection_error(error) {
            self.broken = true;
        }
        self.broken
    }
}

impl std::ops::Deref for Conn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.pg
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.pg
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
    work: impl FnOnce(&mut PgConnection) -> Result<T, DieselError>,
) -> Result<T, DbError> {
    let mut conn = pool.get()?;
    work(&mut conn).map_err(|e| {
        conn.note(&e);
        DbError::Query(e)
    })
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

/// Makes the pool's connections, sets each session up for hookbox's transactions, and tells
/// the pool which to drop.
pub struct Manager {
    inner: ConnectionManager<PgConnection>,
    /// A duplicate waits this long on the first delivery's uncommitted claim.
    lock_timeout: Duration,
}

impl ManageConnection for Manager {
    type Connection = Conn;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<Conn, Self::Error> {
        let mut pg = self.inner.connect()?;
        // lock_timeout bounds the wait on another transaction's claim (the in-flight wait);
        // idle_in_transaction_session_timeout makes the server abandon a transaction whose
        // client went away or stalled mid-way, so its claim cannot block the provider's retry
        // for long: 60 s, unless the server, database, role or URL already sets one.
        pg.batch_execute(&format!(
            "SET lock_timeout = {}; SET application_name = 'hookbox'; \
             SELECT set_config('idle_in_transaction_session_timeout', '60000', false) \
             WHERE current_setting('idle_in_transaction_session_timeout') = '0'",
            self.lock_timeout.as_millis().max(1)
        ))
        .map_err(diesel::r2d2::Error::QueryError)?;
        Ok(Conn { pg, broken: false })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), Self::Error> {
        self.inner.is_valid(&mut conn.pg)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || self.inner.has_broken(&mut conn.pg)
    }
}

/// Builds the pool. It does not wait for the database: connections are made as they are
/// needed, so a server started during an outage answers 503 until the database is back.
pub fn pool(config: &DatabaseConfig, lock_timeout: Duration) -> DbPool {
    Pool::builder()
        .max_size(config.pool_size)
        .min_idle(Some(config.pool_size.min(2)))
        .connection_timeout(CHECKOUT_TIMEOUT)
        .test_on_check_out(false)
        .build_unchecked(Manager {
            inner: ConnectionManager::new(&config.url),
            lock_timeout,
        })
}

/// Connects once, outside the pool, with an error that says what to check.
pub fn connect(config: &DatabaseConfig) -> anyhow::Result<PgConnection> {
    PgConnection::establish(&config.url).with_context(|| {
        format!(
            "cannot connect to the database at {} (is PostgreSQL running? set DATABASE_URL or [database].url)",
            config.display_url()
        )
    })
}

/// Applies pending migrations under a session advisory lock, so instances starting together
/// take turns, then runs `after` (the handlers' own setup) under the same lock. Returns the
/// versions it applied.
pub fn migrate(
    config: &DatabaseConfig,
    after: impl FnOnce(&mut PgConnection) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<String>> {
    let mut conn = connect(config)?;
    diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
        .execute(&mut conn)
        .context("cannot take the migration lock")?;
    let result = conn
        .run_pending_migrations(MIGRATIONS)
        .map(|versions| versions.iter().map(ToString::to_string).collect::<Vec<_>>())
        .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))
        .and_then(|versions| after(&mut conn).map(|()| versions));
    // The lock is released with the session anyway; unlocking is just prompt.
    let _ = diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))
        .execute(&mut conn);
    result
}

/// Whether every embedded migration has been applied: what `/readyz` needs.
pub fn is_migrated(conn: &mut PgConnection) -> anyhow::Result<bool> {
    conn.has_pending_migration(MIGRATIONS)
        .map(|pending| !pending)
        .map_err(|e| anyhow::anyhow!("cannot read the migrations table: {e}"))
}

/// Whether the error says a duplicate waited on another transaction's claim past the lock
/// timeout. PostgreSQL reports it as SQLSTATE 55P03, which diesel does not expose, so the
/// server's message is matched (its default English text).
pub fn is_lock_timeout(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("lock timeout"))
}
