//! The database: the connection pool, the embedded migrations, and how a database failure is
//! told apart from the rest.

pub mod schema;

use std::time::Duration;

use anyhow::Context;
use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool, PooledConnection};
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
pub type DbPool = Pool<ConnectionManager<PgConnection>>;

/// One connection out of the pool.
pub type DbConnection = PooledConnection<ConnectionManager<PgConnection>>;

/// Sets the session up for hookbox's transactions on every new connection.
#[derive(Debug)]
struct SessionSetup {
    /// A duplicate waits this long on the first delivery's uncommitted claim.
    lock_timeout: Duration,
}

impl CustomizeConnection<PgConnection, diesel::r2d2::Error> for SessionSetup {
    fn on_acquire(&self, conn: &mut PgConnection) -> Result<(), diesel::r2d2::Error> {
        // lock_timeout bounds the wait on another transaction's claim (the in-flight wait);
        // idle_in_transaction_session_timeout makes the server abandon a transaction whose
        // client went away mid-way, so its claim cannot block the provider's retry for long.
        conn.batch_execute(&format!(
            "SET lock_timeout = {}; SET idle_in_transaction_session_timeout = 60000; \
             SET application_name = 'hookbox'",
            self.lock_timeout.as_millis().max(1)
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// Builds the pool. It does not wait for the database: connections are made as they are
/// needed, so a server started during an outage answers 503 until the database is back.
pub fn pool(config: &DatabaseConfig, lock_timeout: Duration) -> DbPool {
    Pool::builder()
        .max_size(config.pool_size)
        .min_idle(Some(config.pool_size.min(2)))
        .connection_timeout(CHECKOUT_TIMEOUT)
        .connection_customizer(Box::new(SessionSetup { lock_timeout }))
        // Broken connections are found by the check on checkout and replaced, which is
        // what lets the server recover by itself after the database comes back.
        .test_on_check_out(true)
        .build_unchecked(ConnectionManager::new(&config.url))
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
