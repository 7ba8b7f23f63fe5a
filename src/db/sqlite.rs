//! What only the embedded SQLite store does: the connection's pragmas, and the statements
//! PostgreSQL writes with its own SQL, in SQLite's.
//!
//! SQLite has one writer at a time. Every connection runs in WAL mode (readers never wait for
//! the writer, nor it for them) with `synchronous = FULL` (a committed claim survives a power
//! cut, as on PostgreSQL) and a busy timeout of the in-flight wait: a write that cannot have the
//! lock within it fails as "database is locked", which a claim answers 409. Several processes
//! on one machine may share a file; the lock is the file's.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sqlite::SqliteConnection;

/// How long a long job of many write transactions (a purge) pauses between them, so writers
/// waiting for the lock get it: SQLite's busy handler sleeps up to 100 ms between its tries.
pub const YIELD_TO_WRITERS: Duration = Duration::from_millis(110);

/// Whether this connection's commits wait for the disk: `synchronous = FULL`, as every
/// connection opens, or `NORMAL` (in WAL mode a commit then survives a crash of the process
/// but maybe not of the machine), for the writes that may be lost that way and done again: a
/// forward attempt's outcome. Whoever turns it off turns it back on before the connection is
/// used for anything else.
pub fn wait_for_disk(conn: &mut SqliteConnection, wait: bool) -> QueryResult<()> {
    conn.batch_execute(if wait {
        "PRAGMA synchronous = FULL"
    } else {
        "PRAGMA synchronous = NORMAL"
    })
}

/// The SQL type of hookbox's times on this backend: TEXT, always UTC, in one format, so times
/// compare in order as strings.
pub type Instant = diesel::sql_types::TimestamptzSqlite;

/// Opens the file at `path` (`:memory:` for a database in memory), creating it if need be.
pub fn connect(
    path: &str,
    busy_timeout: Duration,
) -> Result<SqliteConnection, diesel::r2d2::Error> {
    owner_only_if_new(path);
    let mut conn =
        SqliteConnection::establish(path).map_err(diesel::r2d2::Error::ConnectionError)?;
    let setup = format!(
        "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
         PRAGMA foreign_keys = ON;",
        busy_timeout.as_millis().max(1)
    );
    // Switching a new file to WAL takes its lock without waiting on the busy timeout: processes
    // opening one new file together (two `serve`s and a `migrate` at a first start) got
    // "database is locked" at once (found by a black-box run). Tried again within the timeout.
    let started = std::time::Instant::now();
    loop {
        match conn.batch_execute(&setup) {
            Err(e) if is_busy(&e) && started.elapsed() < busy_timeout => {
                std::thread::sleep(Duration::from_millis(10));
            }
            done => return done.map(|()| conn).map_err(diesel::r2d2::Error::QueryError),
        }
    }
}

/// Makes the store's file, where there is none, readable and writable by its owner only: it
/// holds every stored body (payment payloads) and whole signature headers, as an export does,
/// which is made so too. SQLite gives its `-wal` and `-shm` files the database file's mode. A
/// file that exists keeps its own; one that cannot be made here is left to SQLite's open,
/// which says why.
fn owner_only_if_new(path: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    if path == ":memory:" || path.is_empty() {
        return;
    }
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
}

/// How long a migration waits for another process's write to end on SQLite, once it has
/// said it waits (a purge's batch, another instance's migrations).
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(120);

/// Waits for the file's write lock, before a migration takes it: at once when it is free (or
/// within the connection's busy timeout); else it says what it waits for and waits up to
/// [`MIGRATION_LOCK_WAIT`], as instances starting together on PostgreSQL wait their turn. A
/// writer holding it longer than the busy timeout made `serve` give up at the start.
pub fn wait_for_write_lock(conn: &mut SqliteConnection) -> QueryResult<()> {
    match conn.batch_execute("BEGIN IMMEDIATE; ROLLBACK") {
        Err(e) if is_busy(&e) => {
            tracing::info!(
                "waiting for the SQLite write lock: another process is writing to this file \
                 (up to {} s)",
                MIGRATION_LOCK_WAIT.as_secs()
            );
            conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {}; BEGIN IMMEDIATE; ROLLBACK",
                MIGRATION_LOCK_WAIT.as_millis()
            ))
        }
        other => other,
    }
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

/// `path` made absolute against the working directory, for messages: a relative store path is
/// the working directory's, and a service started from another directory opens another file.
/// Its directory is named as the system resolves it (no `sub/../`), where it exists.
pub fn absolute(path: &str) -> String {
    let path = std::path::Path::new(path);
    let resolved = path.file_name().and_then(|name| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = std::fs::canonicalize(parent.unwrap_or(std::path::Path::new("."))).ok()?;
        Some(dir.join(name))
    });
    resolved
        .or_else(|| std::path::absolute(path).ok())
        .map_or_else(|| path.display().to_string(), |p| p.display().to_string())
}

/// The SQLite file a store opened, by path and by identity (device and inode), to tell when
/// the path no longer names it: a file deleted or replaced under a running `serve` goes on
/// taking writes through the open handle, and they are gone when the process ends.
#[derive(Debug, Clone)]
pub struct OpenedFile {
    path: std::path::PathBuf,
    dev: u64,
    ino: u64,
}

impl OpenedFile {
    /// The file at `path` as it is now; `None` when it cannot be read.
    pub fn of(path: &std::path::Path) -> Option<OpenedFile> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(OpenedFile {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether its path still names the file opened.
    pub fn still_there(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path)
            .is_ok_and(|meta| meta.dev() == self.dev && meta.ino() == self.ino)
    }

    /// Its path, as configured.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// Whether the error is SQLite's "database is locked": the write lock was not had within the
/// busy timeout.
pub fn is_busy(error: &DieselError) -> bool {
    matches!(error, DieselError::DatabaseError(DatabaseErrorKind::Unknown, info)
        if info.message().contains("database is locked"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_store_path_is_named_absolute_with_its_directory_resolved() {
        let dir = std::env::temp_dir();
        // `nowhere` does not exist: the path is only made absolute.
        let through = super::absolute("nowhere/../x.db");
        assert!(
            through.starts_with('/') && through.ends_with("nowhere/../x.db"),
            "{through}"
        );
        let resolved = std::fs::canonicalize(&dir).expect("temp dir").join("x.db");
        let roundabout = format!(
            "{}/../{}/x.db",
            dir.display(),
            dir.file_name().unwrap().to_string_lossy()
        );
        assert_eq!(super::absolute(&roundabout), resolved.display().to_string());
        assert!(super::absolute("x.db").starts_with('/'));
    }

    use super::*;

    #[test]
    fn processes_opening_one_new_file_together_all_open_it() {
        for round in 0..40 {
            let dir = std::env::temp_dir()
                .join(format!("hookbox-wal-race-{}-{round}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a directory");
            let path = dir.join("new.db").to_string_lossy().into_owned();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
            let opened: Vec<Result<(), String>> = (0..6)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        connect(&path, Duration::from_secs(5))
                            .map(drop)
                            .map_err(|e| e.to_string())
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|thread| thread.join().expect("the thread"))
                .collect();
            std::fs::remove_dir_all(&dir).expect("clean up");
            for result in opened {
                assert_eq!(result, Ok(()), "round {round}");
            }
        }
    }
}
