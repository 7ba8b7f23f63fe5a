//! The owner of the `instances` table: the dispatchers running on one store, and how one finds
//! out that another has died.
//!
//! A dispatcher registers as it starts ([`Registration::look`]): it takes a lock that it
//! holds for as long as its process lives, then inserts its row. On PostgreSQL the lock is a
//! session advisory lock, `(INSTANCE_LOCK_CLASS, id)`, on a connection of its own outside the
//! pool; on an SQLite file it is an exclusive `flock` of a file beside the database,
//! `<path>-hookbox-<id>.lock`. Either goes when the process ends, however it ends. Every row
//! the dispatcher leases names it (`deliveries.leased_by`).
//!
//! At every look (at the start, then every few seconds) a dispatcher looks at the lock of each
//! other instance in the table. One whose lock is free at a look, and still free at a later
//! look at least [`FREE_FOR`] after, has died: the rows it had leased and not settled are due
//! again at once ([`super::deliveries`]'s `release_leased_by`), and its row is deleted.
//! Without this they would wait for their leases to run out (twice the target's timeout and
//! 5 s: 25 s at the default), which is still what happens where there is no lock to try (an
//! in-memory SQLite store lives and dies with its one process anyway).
//!
//! Why a time, not one free lock, nor two looks in a row: a live instance whose lock
//! connection broke takes its lock again at its own next look, up to a look period (2 s) and
//! a new connection later. One free lock alone would have its attempts under way sent a
//! second time at once; and two looks in a row are a look period apart, no more, so where two
//! instances look within milliseconds of each other (as two started together do), a break
//! between their looks was seen twice before the live one's next look had made its connection.
//! On PostgreSQL a look that only asks reads `pg_locks` rather than trying the lock: trying it
//! holds it for the moment, and the live instance taking its lock again at that moment would
//! fail, and wait another look period. And an instance about to take its lock again counts it
//! in its row (`locks_taken`) first, on the connection that will hold it: a lock held again
//! and lost again between two looks of another instance (two breaks a few seconds apart, or a
//! new connection that breaks at once) starts that one's wait over, where it would otherwise
//! have looked free all along. What is left is an instance that cannot try its lock again at
//! all for 2.5 s (no new connection, or its count held up by a lock on its row).
//!
//! Rows leased by an instance whose lock is held are left alone. Should a live instance lose
//! its lock for longer than a look (its lock connection broke and cannot be made again),
//! another may take its rows back while it is still sending them: they are sent again with
//! their one key, at least once as always.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{Bool, Double, Integer};

use super::{now, on_backend, write_transaction, AnyConnection, Store};

/// The first key of every instance's advisory lock on PostgreSQL ("hkbx"); the second is the
/// instance's number. Any number will do, as long as every hookbox uses the same one.
const INSTANCE_LOCK_CLASS: i32 = 0x686b_6278;

/// How long another instance's lock must stay free (from the look that first finds it free to
/// a look that finds it free again) before that instance is taken for dead: a look period
/// (2 s) and half a second. With looks every 2 s that is the third look to find it free, 4 to
/// 6 s after it died; a live instance has taken its lock again by its own next look, 2 s and
/// a connection after the break.
pub const FREE_FOR: Duration = Duration::from_millis(2500);

/// How long the lock connection waits on a lock (it never should: every try is a try).
const LOCK_CONNECTION_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// This instance's number: what its leases name. Random, so instances need not agree on
/// anything; should the number be taken, registering picks another.
pub fn new_number() -> i64 {
    i64::from(rand::random_range(1..i32::MAX))
}

/// An instance found dead, whose rows were taken back.
#[derive(Debug)]
pub struct TakenBack {
    /// Its number.
    pub id: i64,
    /// Where it ran, as it said when it registered.
    pub host: String,
    pub pid: i64,
    /// Its leased rows, now due.
    pub rows: usize,
}

/// This instance's place in `instances`, and the lock that says it is alive.
pub struct Registration {
    store: Store,
    /// This instance's number, shared with whatever leases rows in its name.
    id: Arc<AtomicI64>,
    lock: Option<Lock>,
    /// Whether its row is known to be in the table.
    listed: bool,
    /// Whether its row was ever in the table: a row gone since was deleted by another instance
    /// that took this one for dead.
    was_listed: bool,
    /// Whether it has held its lock under its number: from then on it keeps that number.
    registered: bool,
    /// The other instances whose lock was free at the last look, each since the look that
    /// first found it free, and its `locks_taken` then.
    free: HashMap<i64, (Instant, i64)>,
    /// Let go of at the end of a stop ([`release`](Self::release)): not taken again.
    released: bool,
}

enum Lock {
    /// A connection of its own that holds the session advisory lock.
    Postgres(AnyConnection),
    /// The lock file, locked.
    File(File, String),
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

impl Registration {
    /// The registration of the instance numbered by `id` on `store`; nothing is locked or
    /// written until the first [`look`](Self::look).
    pub fn new(store: Store, id: Arc<AtomicI64>) -> Registration {
        Registration {
            store,
            id,
            lock: None,
            listed: false,
            was_listed: false,
            registered: false,
            free: HashMap::new(),
            released: false,
        }
    }

    /// Lets go of this instance's lock for good, at the end of a stop once its attempts are
    /// over: the lock file on SQLite is removed (as dropping the registration does; `serve`
    /// ends without running destructors, and each stop left one beside the store), and the
    /// session lock on PostgreSQL goes with its connection. Its row stays, for another
    /// instance to find free and remove. No later look takes the lock again.
    pub fn release(&mut self) {
        self.released = true;
        self.let_go();
    }

    fn let_go(&mut self) {
        match self.lock.take() {
            Some(Lock::File(file, path)) => {
                // Removed while still locked, so no other instance takes an emptied file for
                // a dead instance's before this one's row is gone; the row goes at another's
                // look.
                let _ = std::fs::remove_file(&path);
                drop(file);
            }
            Some(Lock::Postgres(conn)) => drop(conn),
            None => {}
        }
    }

    fn id(&self) -> i64 {
        self.id.load(Ordering::SeqCst)
    }

    /// Keeps this instance registered (takes its lock and inserts its row, again if either
    /// was lost), then takes back the rows of every other instance that died. `pooled` is a
    /// pooled connection in this process's turn to write, which SQLite's statements run on;
    /// PostgreSQL's run on the lock's own connection, and need none (a busy pool must not
    /// hold up the look that takes a broken lock again). Returns the instances taken back
    /// from.
    pub fn look(&mut self, pooled: Option<&mut AnyConnection>) -> anyhow::Result<Vec<TakenBack>> {
        if matches!(self.store, Store::SqliteMemory) || !self.keep()? {
            return Ok(Vec::new());
        }
        let (id, lock) = (self.id(), self.lock.as_mut().expect("kept"));
        let conn = match (lock, pooled) {
            (Lock::Postgres(own), _) => own,
            (Lock::File(..), Some(pooled)) => pooled,
            (Lock::File(..), None) => anyhow::bail!("a look on SQLite needs a pooled connection"),
        };
        if matches!(self.store, Store::Postgres(_)) {
            if let Some(skew) = follow_database_clock(conn)? {
                warn_of_skew(skew);
            }
        }
        // Listed again if another instance took this one for dead (it lost its lock a while).
        if !self.listed || !is_listed(conn, id)? {
            let inserted = list(conn, id)?;
            if !self.was_listed {
                tracing::info!(instance = id, "forward dispatcher registered");
            } else if inserted {
                tracing::warn!(
                    instance = id,
                    "another instance sharing the database took this one for dead (it found this \
                     one's lock free for 2.5 s or more: the connection that holds it broke and was \
                     not made again in time) and took back its deliveries under way, if it had \
                     any: that one sends them again, with the same key, so a downstream may get \
                     some twice; this instance is registered again and goes on"
                );
            }
            self.listed = true;
            self.was_listed = true;
        }
        let mut taken_back = Vec::new();
        let mut free = HashMap::new();
        for (other, host, pid, locks_taken) in others(conn, id)? {
            // Free since an earlier look, and not taken again (and lost again) in between.
            let since = self
                .free
                .get(&other)
                .filter(|(_, taken)| *taken == locks_taken)
                .map(|(since, _)| *since);
            let confirm = since.is_some_and(|since| since.elapsed() >= FREE_FOR);
            match look_at(&self.store, conn, other, confirm)? {
                Found::Alive | Found::Gone => {}
                Found::Free => {
                    free.insert(other, (since.unwrap_or_else(Instant::now), locks_taken));
                }
                Found::TakenBack(rows) => taken_back.push(TakenBack {
                    id: other,
                    host,
                    pid,
                    rows,
                }),
            }
        }
        self.free = free;
        Ok(taken_back)
    }

    /// Holds this instance's lock: checks the one it holds, or takes one (at the start, on a
    /// new number if another instance holds this one's). Whether it holds it now.
    fn keep(&mut self) -> anyhow::Result<bool> {
        if matches!(self.store, Store::SqliteMemory) || self.released {
            return Ok(false);
        }
        if let Some(Lock::Postgres(conn)) = &mut self.lock {
            if diesel::sql_query("SELECT 1").execute(conn).is_err() {
                tracing::warn!(
                    instance = self.id(),
                    "the connection that holds this instance's lock broke; taking it again \
                     (should it not take its lock again within 2.5 s, another instance may take \
                     this one for dead and send its deliveries under way again, with the same \
                     key)"
                );
                self.lock = None;
                self.listed = false;
            }
        }
        if let Some(Lock::File(file, path)) = &self.lock {
            if !still_named(file, path) {
                tracing::warn!(
                    instance = self.id(),
                    path = %path,
                    "this instance's lock file was removed or replaced while it runs; making it \
                     again. Do not delete hookbox's `*-hookbox-N.lock` files while serve runs: \
                     another instance takes an instance whose lock file is gone for dead, and \
                     sends its deliveries under way again, with the same key"
                );
                self.lock = None;
                self.listed = false;
            }
        }
        if self.lock.is_some() {
            return Ok(true);
        }
        if self.registered {
            // Its own number again, never a new one: rows under way are leased in its name,
            // and a new number would leave them to be taken back, once the broken connection's
            // session ends, and sent again while this instance still sends them. Until that
            // session ends it holds the lock for this instance, so no one takes them.
            let id = self.id();
            if let Some(lock) = try_lock(&self.store, id, true)? {
                self.lock = Some(lock);
                tracing::info!(instance = id, "this instance's lock is held again");
                return Ok(true);
            }
            tracing::warn!(
                instance = id,
                "this instance's lock is still held: by the session of its broken connection \
                 (the database has not seen it end yet), or by another instance that took this \
                 one for dead and is taking its deliveries under way back (they are sent \
                 again, with the same key); taking it again at the next look, 2 s from now"
            );
            return Ok(false);
        }
        for _ in 0..8 {
            let id = self.id();
            if let Some(lock) = try_lock(&self.store, id, false)? {
                self.lock = Some(lock);
                self.registered = true;
                // Said once its row is in too ([`Registration::look`]): on a full disk the
                // lock was taken and said, and the row's insert failed the next moment.
                return Ok(true);
            }
            self.id.store(new_number(), Ordering::SeqCst);
        }
        anyhow::bail!("no free instance number after 8 tries")
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.let_go();
    }
}

/// Whether `path` still names `file`: a lock file deleted (a clean-up job taking it for a
/// stray) or replaced is held by no one that another instance can see, which then took this
/// one for dead at every look, for good, and sent its deliveries under way again while it
/// still sent them (a black-box run).
fn still_named(file: &File, path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(named)) => held.dev() == named.dev() && held.ino() == named.ino(),
        // Not known to be gone: kept (a failure to read it says nothing of the lock).
        (Err(_), _) => true,
        (Ok(_), Err(e)) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// The lock file of instance `id` of the SQLite file at `path`: beside the file itself, where
/// `path` is a symbolic link or a relative path (every process sharing the file must find one
/// another's locks, however each names the file); beside `path` if it cannot be resolved.
fn lock_path(path: &str, id: i64) -> String {
    let file = std::fs::canonicalize(path)
        .map(|real| real.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_owned());
    format!("{file}-hookbox-{id}.lock")
}

/// How far this host's clock may be from the database's before a look warns.
const SKEW_TOLERATED: f64 = 1.0;

/// How far this host's clock may be from the database's before times are written on the
/// database's clock instead.
const SKEW_FOLLOWED: f64 = 0.05;

/// How often the clock warning may be repeated while the clocks disagree.
const SKEW_WARN_EVERY: Duration = Duration::from_secs(600);

#[derive(QueryableByName)]
struct DatabaseClock {
    #[diesel(sql_type = Double)]
    seconds: f64,
}

/// How far the database's clock is ahead of this host's, in seconds, measured now (with the
/// round trip's half as its uncertainty).
fn measure_skew(conn: &mut AnyConnection) -> QueryResult<(f64, f64)> {
    let seconds = |at: chrono::DateTime<chrono::Utc>| at.timestamp_micros() as f64 / 1e6;
    let before = seconds(chrono::Utc::now());
    let database =
        diesel::sql_query("SELECT extract(epoch FROM clock_timestamp())::float8 AS seconds")
            .get_result::<DatabaseClock>(conn)?
            .seconds;
    let after = seconds(chrono::Utc::now());
    Ok((database - (before + after) / 2.0, (after - before) / 2.0))
}

/// The WARN for a host clock `skew` seconds behind the database's (negative: ahead), at most
/// once every [`SKEW_WARN_EVERY`] in the process (the startup's measure and the forwarding
/// looks' both call it: a skewed start said it twice).
pub fn warn_of_skew(skew: f64) {
    static WARNED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    {
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if warned.is_some_and(|at| at.elapsed() < SKEW_WARN_EVERY) {
            return;
        }
        *warned = Some(std::time::Instant::now());
    }
    tracing::warn!(
        database_minus_host_seconds = format!("{skew:+.3}"),
        "this host's clock is {:.1} s {} the database's: hookbox writes received times, leases \
         and retry times on the database's clock (this host's, corrected by the difference it \
         measures at startup and every 2 s while it forwards), but not its log lines, nor a \
         clock that jumps between two measures. Keep the clocks of every host in sync with the \
         database's (NTP, chrony)",
        skew.abs(),
        if skew > 0.0 { "behind" } else { "ahead of" }
    );
}

/// Measures how far PostgreSQL's clock is from this host's and has [`super::now`] follow the
/// database's from then on, when they differ by more than [`SKEW_FOLLOWED`] beyond what the
/// round trip leaves unknown (else this host's clock is used as it is). Returns the difference
/// in seconds when it is past [`SKEW_TOLERATED`], to be warned about.
pub fn follow_database_clock(conn: &mut AnyConnection) -> QueryResult<Option<f64>> {
    let (skew, uncertain) = measure_skew(conn)?;
    let followed = skew.abs() > SKEW_FOLLOWED + uncertain;
    super::set_clock_offset(if followed { (skew * 1e6) as i64 } else { 0 });
    Ok((skew.abs() > SKEW_TOLERATED + uncertain).then_some(skew))
}

/// Takes instance `id`'s lock for as long as it is held; `None` when another holds it.
fn try_lock(store: &Store, id: i64, again: bool) -> anyhow::Result<Option<Lock>> {
    match store {
        Store::Postgres(url) => {
            let mut conn =
                AnyConnection::Postgres(super::pg::connect(url, LOCK_CONNECTION_LOCK_TIMEOUT)?);
            if again {
                // Counted before the lock is tried, on the connection that will hold it: a lock
                // held again is always counted, however soon this connection breaks.
                count_lock_taken(&mut conn, id)?;
            }
            let locked: Locked = diesel::sql_query("SELECT pg_try_advisory_lock($1, $2) AS locked")
                .bind::<Integer, _>(INSTANCE_LOCK_CLASS)
                .bind::<Integer, _>(second_key(id))
                .get_result(&mut conn)?;
            Ok(locked.locked.then_some(Lock::Postgres(conn)))
        }
        Store::SqliteFile(path) => {
            let path = lock_path(path, id);
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            match file.try_lock() {
                Ok(()) => Ok(Some(Lock::File(file, path))),
                Err(TryLockError::WouldBlock) => Ok(None),
                Err(TryLockError::Error(e)) => Err(e.into()),
            }
        }
        Store::SqliteMemory => Ok(None),
    }
}

/// The second key of instance `id`'s advisory lock (numbers are drawn below `i32::MAX`).
fn second_key(id: i64) -> i32 {
    i32::try_from(id).unwrap_or_default()
}

/// Inserts this instance's row, unless it is there; whether it inserted it.
fn list(conn: &mut AnyConnection, id: i64) -> QueryResult<bool> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let pid = i64::from(std::process::id());
    let started_at = now();
    let inserted = on_backend!(conn, c => diesel::insert_into(instances::table)
        .values((
            instances::id.eq(id),
            instances::host.eq(&host),
            instances::pid.eq(pid),
            instances::started_at.eq(started_at),
        ))
        .on_conflict_do_nothing()
        .execute(c))?;
    Ok(inserted > 0)
}

/// The other instances in the table, the earliest registered first: (id, host, pid,
/// locks_taken) of each.
fn others(conn: &mut AnyConnection, id: i64) -> QueryResult<Vec<(i64, String, i64, i64)>> {
    on_backend!(conn, c => instances::table
        .filter(instances::id.ne(id))
        .order(instances::started_at)
        .select((instances::id, instances::host, instances::pid, instances::locks_taken))
        .load(c))
}

/// Counts, in instance `id`'s row, that it is about to take its lock again: another instance
/// that saw the lock free starts its wait over. (A row gone, taken for dead, counts nothing.)
fn count_lock_taken(conn: &mut AnyConnection, id: i64) -> QueryResult<()> {
    on_backend!(conn, c => diesel::update(instances::table.find(id))
        .set(instances::locks_taken.eq(instances::locks_taken + 1))
        .execute(c))?;
    Ok(())
}

fn is_listed(conn: &mut AnyConnection, id: i64) -> QueryResult<bool> {
    let n: i64 = on_backend!(conn, c => instances::table
        .filter(instances::id.eq(id))
        .count()
        .get_result(c))?;
    Ok(n > 0)
}

/// What a look found of another instance.
enum Found {
    /// Its lock is held: it lives.
    Alive,
    /// Its lock is free, seen for the first time: it may be dead, or alive and about to take
    /// its lock again (its lock connection broke). Taken back at the next look if still free.
    Free,
    /// Its lock was free at the last look and still is: its leased rows (this many) are due
    /// again and its row is gone.
    TakenBack(usize),
    /// Its lock was free, but another instance's look took it back first: nothing came back
    /// here, and there is nothing to say.
    Gone,
}

/// Whether instance `id`'s lock is free; if it is and `confirm` (it has been free since a
/// look at least [`FREE_FOR`] ago), takes its leased rows back and deletes its row. On
/// PostgreSQL a look that does not confirm only reads `pg_locks`, and one that does holds the
/// lock for the transaction that takes the rows back (so the instance cannot come back to life
/// under the same number meanwhile); on SQLite the lock file is tried, and held locked until
/// the rows are back, then removed.
fn look_at(
    store: &Store,
    conn: &mut AnyConnection,
    id: i64,
    confirm: bool,
) -> anyhow::Result<Found> {
    // What came back, or `Gone` when another instance's look took it back first (its row is
    // gone): two survivors both said the same death, the second with no deliveries under way
    // (a black-box run).
    let forget = |conn: &mut AnyConnection| -> QueryResult<Found> {
        let rows = super::deliveries::release_leased_by(conn, id)?;
        let listed = on_backend!(conn, c => diesel::delete(instances::table.find(id)).execute(c))?;
        Ok(if listed == 0 && rows == 0 {
            Found::Gone
        } else {
            Found::TakenBack(rows)
        })
    };
    match store {
        Store::Postgres(_) if !confirm => {
            let locked: Locked = diesel::sql_query(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND classid = $1::oid AND objid = $2::oid AND objsubid = 2 AND granted) \
                 AS locked",
            )
            .bind::<Integer, _>(INSTANCE_LOCK_CLASS)
            .bind::<Integer, _>(second_key(id))
            .get_result(conn)?;
            Ok(if locked.locked {
                Found::Alive
            } else {
                Found::Free
            })
        }
        Store::Postgres(_) => Ok(write_transaction(conn, |conn| {
            let locked: Locked =
                diesel::sql_query("SELECT pg_try_advisory_xact_lock($1, $2) AS locked")
                    .bind::<Integer, _>(INSTANCE_LOCK_CLASS)
                    .bind::<Integer, _>(second_key(id))
                    .get_result(conn)?;
            Ok::<_, diesel::result::Error>(match locked.locked {
                false => Found::Alive,
                true => forget(conn)?,
            })
        })?),
        Store::SqliteFile(path) => {
            let path = lock_path(path, id);
            let held = match OpenOptions::new().write(true).open(&path) {
                Ok(file) => match file.try_lock() {
                    Ok(()) => Some(file),
                    Err(TryLockError::WouldBlock) => return Ok(Found::Alive),
                    Err(TryLockError::Error(e)) => return Err(e.into()),
                },
                // No file: it never took its lock, or its rows were taken back before.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e.into()),
            };
            if !confirm {
                return Ok(Found::Free);
            }
            let found = write_transaction(conn, forget)?;
            if held.is_some() {
                let _ = std::fs::remove_file(&path);
            }
            Ok(found)
        }
        Store::SqliteMemory => Ok(Found::Alive),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_naming_one_file_by_a_link_or_a_relative_path_share_its_lock_files() {
        let dir = std::env::temp_dir().join(format!("hookbox-lock-unit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).expect("a directory");
        let file = dir.join("events.db");
        std::fs::write(&file, b"").expect("the file");
        let link = dir.join("link.db");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).expect("a link");
        let real = lock_path(&file.to_string_lossy(), 7);
        assert_eq!(lock_path(&link.to_string_lossy(), 7), real);
        assert_eq!(
            lock_path(&dir.join("sub/../events.db").to_string_lossy(), 7),
            real
        );
        // Not there (yet): beside the path as written.
        let missing = dir.join("missing.db").to_string_lossy().into_owned();
        assert_eq!(lock_path(&missing, 7), format!("{missing}-hookbox-7.lock"));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn an_instance_another_look_took_back_first_is_not_taken_back_or_said_again() {
        // Two survivors whose looks met both said the same death, the second "with no
        // deliveries under way" (a black-box run): the second finds the row gone.
        let dir = std::env::temp_dir().join(format!("hookbox-look-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("store.db").to_string_lossy().into_owned();
        let mut conn = AnyConnection::Sqlite(
            crate::db::sqlite::connect(&path, Duration::from_secs(5)).expect("the store"),
        );
        crate::db::migrate(&mut conn, |_| Ok(())).expect("migrated");
        let store = Store::SqliteFile(path);
        assert!(list(&mut conn, 42).expect("listed"));
        // No lock file: free, and confirmed.
        let first = look_at(&store, &mut conn, 42, true).expect("a look");
        assert!(matches!(first, Found::TakenBack(0)));
        let second = look_at(&store, &mut conn, 42, true).expect("a look");
        assert!(matches!(second, Found::Gone));
        drop(conn);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
