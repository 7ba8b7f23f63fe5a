//! Claims of handlers that answer from the event alone, gathered into multi-row INSERTs.
//!
//! Under load many deliveries wait at once, each for its own round trip and its own commit.
//! A few writer threads take whatever claims are waiting (up to [`MAX_BATCH`]) and store them
//! with one multi-row `INSERT ... ON CONFLICT DO NOTHING RETURNING id, source, event_id`
//! ([`events::claim`]): one round trip and one commit for the lot. Each row is still claimed on its own terms: a row
//! that comes back is this delivery's claim, a row that does not was committed by someone else
//! and its stored answer is read. Nothing waits to fill a batch: a writer takes what is there,
//! so a lone delivery goes out at once.
//!
//! Where a claimed event's source forwards, its outbox rows (one per matching target) go in
//! with the claims, all or nothing ([`events::claim_and_queue`]: on PostgreSQL the claims'
//! INSERT and the outbox's are one statement, on SQLite one transaction): every event of the
//! batch is queued if and only if it is stored. A row that did not come back queues nothing
//! (its stored answer is a replay), and a batch that falls back to claims one by one has
//! queued nothing.
//!
//! Rows go in sorted by (source, event id), so two batches never wait on each other in opposite
//! orders (no deadlock); a delivery and its duplicate in one batch are claimed once, the second
//! answered as a replay (or 422 if its payload differs). A batch that meets trouble (a lock
//! timeout, a failed statement) falls back to claiming its deliveries one by one.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use chrono::{DateTime, Utc};
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::{
    answer, claim_until, event, new_event, run_handler, ClaimError, Delivery, Outcome,
    StoredResponse,
};
use crate::db::deliveries::{Due, Lease, Leased, ToQueue};
use crate::db::{self, events, AnyConnection, DbPool};
use crate::forward::{Handover, Reserved, Wake};
use crate::handlers::{Handler, Response};

/// Claims one INSERT carries at most.
pub const MAX_BATCH: usize = 64;

// A batch's claim is one INSERT on SQLite too, outside any transaction: never split in parts.
const _: () = assert!(MAX_BATCH <= events::SQLITE_ROWS_PER_CLAIM);

type Reply = tokio::sync::oneshot::Sender<Result<Outcome, ClaimError>>;

struct Job {
    delivery: Delivery,
    handler: Arc<dyn Handler>,
    reply: Reply,
    /// When it reached the queue (see `received_times`): strictly later than every job
    /// queued before it in this process, so jobs stored by one batch keep their order.
    received_at: DateTime<Utc>,
}

#[derive(Default)]
struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    /// Wakes the forward dispatcher when a batch queued outbox rows.
    wake: Wake,
    /// Where rows are handed straight to this process's dispatcher, once it has started.
    handover: OnceLock<Handover>,
    /// Set when the last [`Batcher`] is gone: the writers finish what is queued and stop,
    /// letting go of their pool.
    closed: std::sync::atomic::AtomicBool,
    /// Events another session's claim holds up, with their deliveries waiting apart.
    held: Held,
}

/// Events whose claim another session holds (not committed), by (source, event id), each
/// with the deliveries of it that wait apart from the writers on a thread of its own (see
/// [`apart_from_the_held`]): a later delivery of such an event joins that wait instead of
/// holding a batch up again (a black-box run: every duplicate cost the writer 0.1 s).
#[derive(Clone, Default)]
struct Held(Arc<Mutex<Waiting>>);

/// The deliveries waiting apart, by (source, event id).
type Waiting = HashMap<(String, String), Vec<Job>>;

/// At most this many events wait apart at once, a thread and a connection of the main pool
/// each, and never more than half that pool's connections (see [`Writes::held_apart_at_most`]);
/// past it, a held event's deliveries wait in the writer, as they all did before.
const HELD_APART_AT_MOST: usize = 4;

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes out of `groups` the deliveries of events waiting apart, and adds them to the wait.
    fn join(&self, groups: &mut Groups) {
        let mut held = self.lock();
        if held.is_empty() {
            return;
        }
        groups.retain(|key, jobs| match held.get_mut(key) {
            Some(waiting) => {
                waiting.extend(std::mem::take(jobs).into_iter().map(|(job, _)| job));
                false
            }
            None => true,
        });
    }
}

/// Closes the queue when the last [`Batcher`] clone is dropped.
struct Closer(Arc<Queue>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _guard = self.0.jobs.lock();
        self.0.ready.notify_all();
    }
}

/// The writers and their queue.
#[derive(Clone)]
pub struct Batcher {
    queue: Arc<Queue>,
    _closer: Arc<Closer>,
    writers: usize,
    /// The connections the writers keep of their own (0: they share the main pool's).
    own_connections: u32,
}

impl Batcher {
    /// Starts `writers` threads claiming from the queue, their batches on connections from
    /// `pools.claims` (where there are such) and their claims one by one from `pools.main`;
    /// `wake` wakes the forward dispatcher when a batch queues outbox rows.
    pub fn start(pools: &db::Pools, writers: usize, wake: Wake) -> Batcher {
        let queue = Arc::new(Queue {
            wake,
            ..Queue::default()
        });
        let writers = writers.max(1);
        for n in 0..writers {
            let queue = queue.clone();
            let pools = Writes {
                batches: pools.claims.clone().unwrap_or_else(|| pools.main.clone()),
                one_by_one: pools.main.clone(),
                held_apart_at_most: (pools.main.max_size() as usize / 2).min(HELD_APART_AT_MOST),
            };
            std::thread::Builder::new()
                .name(format!("hookbox-claims-{n}"))
                .spawn(move || write_loop(&queue, &pools))
                .expect("a thread can be started at startup");
        }
        Batcher {
            _closer: Arc::new(Closer(queue.clone())),
            queue,
            writers,
            own_connections: pools.claims.as_ref().map_or(0, DbPool::max_size),
        }
    }

    /// How many writer threads claim from the queue.
    pub fn writers(&self) -> usize {
        self.writers
    }

    /// How many connections the writers keep of their own, out of `pool_size` (0 where they
    /// share the main pool's; see [`db::Pools::claims`]).
    pub fn own_connections(&self) -> u32 {
        self.own_connections
    }

    /// From now on, a batch hands the outbox rows that `handover` has room for straight to this
    /// process's dispatcher (see [`Handover`]) instead of queuing them for a take.
    pub fn hand_over_to(&self, handover: Handover) {
        let _ = self.queue.handover.set(handover);
    }

    /// Claims `delivery` in the next batch and waits for the outcome.
    pub async fn claim(
        &self,
        delivery: Delivery,
        handler: Arc<dyn Handler>,
    ) -> Result<Outcome, ClaimError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        {
            let mut jobs = self.queue.jobs.lock().unwrap_or_else(|e| e.into_inner());
            // Stamped under the queue's lock: the queue's order is the received times' order.
            jobs.push_back(Job {
                delivery,
                handler,
                reply,
                received_at: super::received_time(),
            });
        }
        self.queue.ready.notify_one();
        // The writer lets go of a job unanswered only when its batch panicked (a bug of
        // hookbox's own): the delivery is answered 500, and that answer is the one log line.
        answer.await.unwrap_or_else(|_| {
            Err(ClaimError::Handler(anyhow::anyhow!(
                "the claim batch panicked before it was stored"
            )))
        })
    }
}

/// Where a writer's connections come from.
struct Writes {
    /// For its batches (see [`db::Pools::claims`]).
    batches: DbPool,
    /// For the claims one by one a batch falls back to, which wait for another's claim as a
    /// claim in a transaction does.
    one_by_one: DbPool,
    /// How many held events may wait apart at once, each holding a connection of `one_by_one`
    /// for up to its in-flight wait: no more than half of them, so that the deliveries of
    /// sources whose claims are not batched, the dispatcher and `/readyz` keep the rest. With
    /// four held events waiting on a pool of one to four connections, every other checkout
    /// timed out and was answered 503, as though the database were unreachable (a black-box
    /// run); with none to spare, held events wait in the writer, as before.
    held_apart_at_most: usize,
}

fn write_loop(queue: &Queue, pools: &Writes) {
    loop {
        let batch: Vec<Job> = {
            let mut jobs = queue.jobs.lock().unwrap_or_else(|e| e.into_inner());
            while jobs.is_empty() {
                if queue.closed.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                jobs = queue.ready.wait(jobs).unwrap_or_else(|e| e.into_inner());
            }
            let n = jobs.len().min(MAX_BATCH);
            jobs.drain(..n).collect()
        };
        // Handlers' panics are caught where they run; this is for a bug of hookbox's own. The
        // batch's jobs are dropped with it, so their deliveries are answered 500 (and logged,
        // each once, where they are answered), and the writer lives on for the next batch.
        let forwards = batch.iter().any(|job| !job.delivery.forward.is_empty());
        let queued =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(queue, pools, batch)))
                .unwrap_or(Queued::Unknown);
        // After the commit (or whatever became of the batch): a look finds the rows.
        match (queued, queue.handover.get()) {
            _ if !forwards => {}
            (Queued::Nothing, _) => {}
            (Queued::Lanes(lanes), Some(handover)) => handover.queued(&lanes),
            _ => queue.wake.queued(),
        }
    }
}

/// A failure every job of the batch shares, made anew for each (diesel errors are not Clone).
fn shared_failure(message: &str) -> ClaimError {
    ClaimError::Database(DieselError::DatabaseError(
        DatabaseErrorKind::ClosedConnection,
        Box::new(message.to_owned()),
    ))
}

/// What a batch queued for a take (rather than handing it over), for the dispatcher's wake.
enum Queued {
    /// Nothing: every row was handed over, or none was queued.
    Nothing,
    /// Rows of these lanes, each (source, target).
    Lanes(Vec<(String, String)>),
    /// Perhaps rows of any lane (claims one by one, a failure).
    Unknown,
}

/// The jobs of `batch` whose delivery still waits for its answer. A delivery answered
/// already (503 at the request timeout) is not claimed: claimed late, it
/// stored an event its provider was told was not taken, minutes after, under the received
/// time it had then (a black-box run: claims queued behind a stalled database connection
/// committed 9 minutes after their 503s, and an ordered target got them far out of order).
fn still_waited_for(batch: Vec<Job>) -> Vec<Job> {
    batch
        .into_iter()
        .filter(|job| !job.reply.is_closed())
        .collect()
}

/// Claims a batch and answers its jobs; says what it queued for a take.
fn write(queue: &Queue, pools: &Writes, batch: Vec<Job>) -> Queued {
    let batch = still_waited_for(batch);
    if batch.is_empty() {
        return Queued::Nothing;
    }
    let conn = pools.batches.get();
    // Checking a connection out may have waited (on a database that stalled).
    let batch = still_waited_for(batch);
    if batch.is_empty() {
        return Queued::Nothing;
    }
    let mut conn = match conn {
        Ok(conn) => conn,
        Err(e) => {
            // Not logged here: each delivery logs its failure, with this cause, where it is
            // answered.
            let message = format!("no database connection: {e}");
            for job in batch {
                let _ = job.reply.send(Err(shared_failure(&message)));
            }
            return Queued::Unknown;
        }
    };
    // Each job's answer, from its handler; a handler that fails fails its own job only.
    let mut ready: Vec<(Job, Response)> = Vec::with_capacity(batch.len());
    for job in batch {
        match run_handler(
            job.handler.as_ref(),
            &mut conn,
            &event(&job.delivery, 0, job.received_at),
        ) {
            Ok(response) => ready.push((job, response)),
            Err(e) => {
                let _ = job.reply.send(Err(e));
            }
        }
    }
    // Grouped by (source, event id), in key order: the first of each group is the one whose
    // row is inserted, with its received time.
    let mut groups: BTreeMap<(String, String), Vec<(Job, Response)>> = BTreeMap::new();
    for (job, response) in ready {
        let key = (
            job.delivery.source.as_str().to_owned(),
            job.delivery.event_id.as_str().to_owned(),
        );
        groups.entry(key).or_default().push((job, response));
    }
    queue.held.join(&mut groups);
    if groups.is_empty() {
        return Queued::Unknown;
    }

    // The batch waits no longer than its most hurried delivery may; the others, should it
    // time out, wait what is left of theirs in claims one by one.
    let deadline = groups
        .values()
        .flatten()
        .map(|(job, _)| job.delivery.deadline)
        .min()
        .expect("a batch has a job");
    // On PostgreSQL the writers' own connections wait at most `CLAIM_BATCH_LOCK_WAIT` for a
    // row another session holds (see `db::Pools::claims`). On SQLite the wait is for the
    // store's one write lock, which any claim one by one would wait for as well: no row of its
    // own holds a batch up there.
    let on_postgres = matches!(**conn, AnyConnection::Postgres(_));
    let inserted = {
        // Past the in-flight wait without a turn, the batch goes ahead anyway: SQLite's own
        // lock still keeps it safe. The turn ends with the INSERT, before any claim one by one
        // (which takes turns of its own).
        let _turn = conn.write_turn(deadline).ok().flatten();
        let handover = queue.handover.get();
        conn.waiting_until(deadline, |c| insert(c, &groups, handover))
    };
    let (inserted, handed, queued) = match inserted {
        Ok(stored) => stored,
        Err(e) => {
            let gone = conn.note(&e);
            if !gone {
                tracing::debug!(error = %e, "a claim batch fell back to claims one by one");
            }
            drop(conn);
            if on_postgres && db::is_lock_timeout(&e) {
                apart_from_the_held(pools, groups, queue);
            } else {
                one_by_one(&pools.one_by_one, groups);
            }
            return Queued::Unknown;
        }
    };
    if let Some(handover) = queue.handover.get() {
        handover.hand(handed);
    }

    let mut unresolved = BTreeMap::new();
    for (key, jobs) in groups {
        if inserted.contains(&key) {
            let mut jobs = jobs.into_iter();
            let (leader, response) = jobs.next().expect("a group has a job");
            let stored = StoredResponse::new(response, leader.received_at);
            for (job, _) in jobs {
                let outcome = if job.delivery.fingerprint == leader.delivery.fingerprint {
                    Outcome::Replay(stored.clone())
                } else {
                    Outcome::Mismatch
                };
                let _ = job.reply.send(Ok(outcome));
            }
            let _ = leader.reply.send(Ok(Outcome::Claimed(stored)));
        } else {
            unresolved.insert(key, jobs);
        }
    }
    if unresolved.is_empty() {
        return queued;
    }
    let left = answer_from_store(&mut conn, unresolved);
    // The connection goes back to the pool before any claim one by one takes its own: held, it
    // would leave a pool of one (as `sqlite::memory:` has) waiting on itself until it timed out.
    drop(conn);
    if !left.is_empty() {
        one_by_one(&pools.one_by_one, left);
        return Queued::Unknown;
    }
    queued
}

type Groups = BTreeMap<(String, String), Vec<(Job, Response)>>;

/// What a batch's INSERT stored: the keys it claimed, the outbox rows it queued leased (each
/// with its lane's reservation, to be handed over), and what it queued for a take.
type Stored = (BTreeSet<(String, String)>, Vec<(Reserved, Due)>, Queued);

/// The claim of each group's first delivery, and where their sources forward, the outbox rows
/// of the events it claims, all or nothing (one statement on PostgreSQL, see
/// [`events::claim_and_queue`]). A row whose lane `handover` has room for goes in leased to
/// this process, to be handed to its dispatcher once stored; the room of a row that was not
/// stored is given back.
fn insert(
    conn: &mut AnyConnection,
    groups: &Groups,
    handover: Option<&Handover>,
) -> Result<Stored, DieselError> {
    let now = db::now();
    let mut reserved = Rooms {
        handover,
        rooms: HashMap::new(),
    };
    let queues: Vec<Vec<ToQueue<'_>>> = groups
        .values()
        .map(|jobs| {
            let delivery = &jobs[0].0.delivery;
            let source = delivery.source.as_str();
            delivery
                .forward
                .iter()
                .map(
                    |target| match handover.and_then(|h| h.reserve(source, target)) {
                        Some(room) => {
                            let lease = Lease {
                                until: now
                                    + chrono::Duration::from_std(room.lease)
                                        .unwrap_or(chrono::Duration::hours(1)),
                                by: room.holder,
                            };
                            reserved
                                .rooms
                                .insert((source, delivery.event_id.as_str(), target), room);
                            ToQueue {
                                target,
                                lease: Some(lease),
                            }
                        }
                        None => ToQueue::target(target),
                    },
                )
                .collect()
        })
        .collect();
    let mut lanes: BTreeSet<(String, String)> = BTreeSet::new();
    for (jobs, queue) in groups.values().zip(&queues) {
        for to in queue.iter().filter(|to| to.lease.is_none()) {
            let source = jobs[0].0.delivery.source.as_str();
            lanes.insert((source.to_owned(), to.target.to_owned()));
        }
    }
    let queued = if lanes.is_empty() {
        Queued::Nothing
    } else {
        Queued::Lanes(lanes.into_iter().collect())
    };
    let rows: Vec<_> = groups
        .values()
        .zip(&queues)
        .map(|(jobs, queue)| {
            let (job, response) = &jobs[0];
            (
                new_event(&job.delivery, job.received_at, Some(answer(response))),
                &queue[..],
            )
        })
        .collect();
    // On an error the rooms are given back as `reserved` is dropped.
    let stored = events::claim_and_queue(conn, &rows)?;
    let events_by_row: HashMap<i64, (&str, &str)> = stored
        .claimed
        .iter()
        .map(|c| (c.row, (c.source.as_str(), c.event_id.as_str())))
        .collect();
    let mut handed = Vec::with_capacity(stored.leased.len());
    for leased in stored.leased {
        let Some(&(source, event_id)) = events_by_row.get(&leased.event_row) else {
            continue;
        };
        let Some(jobs) = groups.get(&(source.to_owned(), event_id.to_owned())) else {
            continue;
        };
        let delivery = &jobs[0].0.delivery;
        let Some(target) = delivery.forward.iter().find(|t| **t == leased.target) else {
            continue;
        };
        let key = (
            delivery.source.as_str(),
            delivery.event_id.as_str(),
            target.as_str(),
        );
        let Some(room) = reserved.rooms.remove(&key) else {
            continue;
        };
        handed.push((room, due(delivery, leased)));
    }
    // The rooms left, of events another delivery had stored (nothing was queued for them),
    // are given back as `reserved` is dropped.
    drop(reserved);
    let keys = stored
        .claimed
        .into_iter()
        .map(|claimed| (claimed.source, claimed.event_id))
        .collect();
    Ok((keys, handed, queued))
}

/// The room reserved in lanes for rows a batch may hand over, by (source, event id, target).
/// What is left when it is dropped is given back: rows that were not stored, and every one if
/// the batch fails or panics on the way (a reservation never handed back would shrink its
/// lane's window for good).
struct Rooms<'a> {
    handover: Option<&'a Handover>,
    rooms: HashMap<(&'a str, &'a str, &'a str), Reserved>,
}

impl Drop for Rooms<'_> {
    fn drop(&mut self) {
        if let Some(handover) = self.handover {
            for (_, room) in self.rooms.drain() {
                handover.unreserve(room);
            }
        }
    }
}

/// The first attempt of a row queued leased, as the dispatcher would have taken it.
fn due(delivery: &Delivery, leased: Leased) -> Due {
    Due {
        id: leased.id,
        attempt: 1,
        series: 0,
        source: delivery.source.as_str().to_owned(),
        target: leased.target,
        event_id: delivery.event_id.as_str().to_owned(),
        event_type: delivery.event_type.as_ref().map(|t| t.as_str().to_owned()),
        payload: delivery.body.to_vec(),
        content_type: delivery
            .headers
            .get("content-type")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        queued_at_micros: leased.queued_at.timestamp_micros(),
    }
}

/// Answers the groups whose rows another delivery committed, from what it stored, and returns
/// those it could not answer so (purged meanwhile, or the read failed), to be claimed one by one.
fn answer_from_store(conn: &mut db::DbConnection, groups: Groups) -> Groups {
    let mut by_source: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (source, event_id) in groups.keys() {
        by_source
            .entry(source.clone())
            .or_default()
            .push(event_id.clone());
    }
    let mut found: BTreeMap<(String, String), (Vec<u8>, StoredResponse)> = BTreeMap::new();
    for (source, ids) in by_source {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let Ok(rows) = events::answers(conn, &source, &ids).map_err(|e| conn.note(&e)) else {
            return groups;
        };
        for row in rows {
            let (event_id, fingerprint) = (row.event_id.clone(), row.fingerprint.clone());
            if let Some(stored) = StoredResponse::read(row) {
                found.insert((source.clone(), event_id), (fingerprint, stored));
            }
        }
    }
    let mut missing = BTreeMap::new();
    for (key, jobs) in groups {
        match found.get(&key) {
            Some((fingerprint, stored)) => {
                for (job, _) in jobs {
                    let outcome = if job.delivery.fingerprint[..] == fingerprint[..] {
                        Outcome::Replay(stored.clone())
                    } else {
                        Outcome::Mismatch
                    };
                    let _ = job.reply.send(Ok(outcome));
                }
            }
            // Purged between the INSERT's conflict and this read: claim afresh.
            None => {
                missing.insert(key, jobs);
            }
        }
    }
    missing
}

/// Claims each delivery on its own, as the single-statement path does.
fn one_by_one(pool: &DbPool, groups: Groups) {
    for (_, jobs) in groups {
        for (job, _) in jobs {
            let outcome = on_its_own(pool, &job, job.delivery.deadline);
            let _ = job.reply.send(outcome);
        }
    }
}

/// After a batch waited [`db::CLAIM_BATCH_LOCK_WAIT`] for a row another session holds: each
/// delivery is claimed on its own, waiting as briefly (on a writer's connection, whose session
/// waits so long already), and the deliveries of an event still held up (a duplicate of an
/// event another session's claim has not committed, or any while a table is locked) wait out
/// the rest of their in-flight wait apart (see [`Held`]), while the writer goes on with the
/// claims behind them. Each is answered as it would have been in the writer (its wait is not
/// started over).
fn apart_from_the_held(pools: &Writes, groups: Groups, queue: &Queue) {
    let pool = &pools.one_by_one;
    let mut held: Vec<((String, String), Vec<Job>)> = Vec::new();
    // A table locked holds up every claim: the rest wait apart without a try of their own.
    let mut locked = false;
    for (key, jobs) in groups {
        let mut waiting = Vec::new();
        for (job, _) in jobs {
            // The deliveries of one event: once one is held up, so are the others.
            if locked || !waiting.is_empty() {
                waiting.push(job);
                continue;
            }
            let deadline = job.delivery.deadline;
            let brief = deadline.min(std::time::Instant::now() + db::CLAIM_BATCH_LOCK_WAIT);
            match on_its_own(&pools.batches, &job, brief) {
                Ok(outcome @ (Outcome::InFlight | Outcome::Locked))
                    if std::time::Instant::now() < deadline =>
                {
                    locked |= matches!(outcome, Outcome::Locked);
                    waiting.push(job);
                }
                outcome => {
                    let _ = job.reply.send(outcome);
                }
            }
        }
        if !waiting.is_empty() {
            held.push((key, waiting));
        }
    }
    for (key, jobs) in held {
        let mut apart = queue.held.lock();
        if let Some(waiting) = apart.get_mut(&key) {
            waiting.extend(jobs);
            continue;
        }
        if apart.len() >= pools.held_apart_at_most {
            drop(apart);
            // On the writer's own connection, as before: waiting on the main pool's, it took
            // one the others need.
            in_turn(&pools.batches, jobs, &queue.wake);
            continue;
        }
        apart.insert(key.clone(), jobs);
        drop(apart);
        let (pool, held, wake) = (pool.clone(), queue.held.clone(), queue.wake.clone());
        let ours = key.clone();
        let waits = move || loop {
            let jobs = {
                let mut apart = held.lock();
                match apart.get_mut(&ours) {
                    Some(jobs) if !jobs.is_empty() => std::mem::take(jobs),
                    _ => {
                        apart.remove(&ours);
                        return;
                    }
                }
            };
            in_turn(&pool, jobs, &wake);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("hookbox-claims-held".to_owned())
            .spawn(waits)
        {
            // No thread to be had: the jobs, dropped with the map's entry, are answered 500.
            queue.held.lock().remove(&key);
            tracing::error!(error = %e, "cannot start a thread for claims held up by another's");
        }
    }
}

/// Claims each of `jobs` on its own, in turn, each waiting until its own deadline; wakes the
/// dispatcher after, if any forwards.
fn in_turn(pool: &DbPool, jobs: Vec<Job>, wake: &Wake) {
    let forwards = jobs.iter().any(|job| !job.delivery.forward.is_empty());
    for job in jobs {
        let outcome = on_its_own(pool, &job, job.delivery.deadline);
        let _ = job.reply.send(outcome);
    }
    if forwards {
        wake.queued();
    }
}

/// Claims `job`'s delivery on its own, waiting for another's claim of it until `until`: on a
/// connection that turns out dead (the database restarted, or ended the session), once more
/// on a fresh one. That is safe whatever the dead one managed to commit: a committed claim
/// comes back as a replay of the same stored bytes.
fn on_its_own(pool: &DbPool, job: &Job, until: std::time::Instant) -> Result<Outcome, ClaimError> {
    let claim_on_its_own = || match pool.get() {
        Ok(mut conn) => {
            let outcome = claim_until(&mut conn, &job.delivery, job.handler.as_ref(), until);
            let dead = match &outcome {
                Err(ClaimError::Database(e)) => conn.note(e),
                _ => false,
            };
            (outcome, dead)
        }
        Err(e) => (
            Err(shared_failure(&format!("no database connection: {e}"))),
            false,
        ),
    };
    match claim_on_its_own() {
        (_, true) if std::time::Instant::now() < until => claim_on_its_own().0,
        (outcome, _) => outcome,
    }
}
