//! Forwarding: handing each stored event on to a downstream application, at least once, after
//! the provider has been answered.
//!
//! The claim transaction writes one outbox row (`deliveries`) per target whose `events`
//! patterns match the event, with the claim, so an event is queued if and only if it is
//! stored. The dispatcher (`dispatch.rs`) sends due rows after commit, lane by lane (a lane is
//! one source's target: `lane.rs` keeps its `concurrency`, `rate` (`pace.rs`) and `ordered`):
//! it takes them in batches with `FOR UPDATE SKIP LOCKED` and leases each past the attempt's
//! end, so instances sharing a database never send one row at the same moment; a process killed
//! mid-attempt leaves a lease that runs out, and another attempt follows. The hand-off itself is
//! a [`transport::Transport`] (HTTP, `http.rs`). Every attempt of an event carries the same
//! `Idempotency-Key: {source}:{event_id}` (the same for every target), so a downstream that
//! honours it sees the effect once; `X-Hookbox-Target` names the target.

mod amqp;
mod bus;
mod dispatch;
mod http;
mod lane;
mod nats;
mod pace;
pub mod transport;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::web;
use diesel::QueryResult;

use crate::config::{ForwardConfig, Transport};
use crate::db::instances::{self, Registration};
use crate::db::{self, deliveries, paces, AnyConnection, DbPool, Store};
use crate::metrics::Metrics;
use crate::providers::Standard;
use deliveries::{Due, Settled, Want};
use lane::Lane;

/// How long a take or a batch of outcomes waits for its turn to write on SQLite (where claims
/// and the dispatcher take turns; see `db::WriteTurns`) before it gives up until the next look.
const TURN_WAIT: Duration = Duration::from_secs(5);

/// How long a batch of outcomes is tried again while the store is busy with another process's
/// writes, before its rows are left to be attempted again.
const SETTLE_PATIENCE: Duration = Duration::from_secs(5);

/// A read of the outbox that has waited this long for the database is said (at WARN), and its
/// end (at INFO): a database that stalls without an error (frozen, black-holed) otherwise held
/// forwarding up in silence. Longer than [`TURN_WAIT`], after which a take on SQLite gives up.
const TAKE_TOLD_AFTER: Duration = Duration::from_secs(10);

/// One of a source's downstreams, ready to send to.
pub struct Target {
    /// `[sources.NAME.forward]`, or one of `[[sources.NAME.forward]]`.
    pub config: ForwardConfig,
    /// What its transport keeps for as long as the target lives.
    pub(crate) link: Link,
}

/// What a target's transport keeps across attempts, passes and dispatcher threads.
pub(crate) enum Link {
    /// Signs what hookbox POSTs, the Standard Webhooks way, with the target's secret.
    Http(Box<Standard>),
    /// The target's JetStream connection.
    Nats(Arc<nats::Nats>),
    /// The target's RabbitMQ connection and confirm-mode channel.
    Amqp(Arc<amqp::Amqp>),
}

impl Target {
    /// Builds the target's transport: the signer from an HTTP target's secret; a bus target's
    /// connection is opened by its first attempt.
    pub fn new(config: ForwardConfig) -> Result<Target, String> {
        let link = match &config.transport {
            Transport::Http { secret } => Link::Http(Box::new(
                Standard::new(std::slice::from_ref(secret), Duration::ZERO)
                    .map_err(|e| e.problem)?,
            )),
            Transport::Nats { subject } => Link::Nats(Arc::new(nats::Nats::new(
                &config.url,
                subject.clone(),
                config.timeout,
            )?)),
            Transport::Amqp {
                exchange,
                routing_key,
            } => Link::Amqp(Arc::new(amqp::Amqp::new(
                &config.url,
                exchange.clone(),
                routing_key.clone(),
                config.timeout,
            ))),
        };
        Ok(Target { config, link })
    }
}

/// Starts and stops the dispatcher, and wakes it when a claim queued something.
#[derive(Clone, Default)]
pub struct Wake {
    notify: Arc<tokio::sync::Notify>,
    stop: Arc<AtomicBool>,
    /// Rows were queued the normal way: the next take looks at every lane.
    look: Arc<AtomicBool>,
    /// Attempts started, and those whose outcome is not yet written: see
    /// [`Wake::outcomes_written`].
    unwritten: Arc<Mutex<Unwritten>>,
    written_notify: Arc<tokio::sync::Notify>,
    /// Wakes every row waiting for a slot or a turn when the stop comes.
    stopped: Arc<tokio::sync::Notify>,
}

/// Attempts started in this process whose outcome is not yet written (or failed to be).
#[derive(Default)]
struct Unwritten {
    /// Attempts started so far; each is numbered by this count as it starts.
    started: u64,
    /// The number of each such attempt, by its row (a row has one attempt under way at most).
    by_row: HashMap<i64, u64>,
    /// The same numbers, in order.
    numbers: BTreeSet<u64>,
}

/// The longest an admin requeue or redeliver waits for outcomes to be written first.
const WRITTEN_WAIT: Duration = Duration::from_secs(2);

impl Wake {
    /// Waits until the outcome of every attempt that had started when it was called is written,
    /// for at most [`WRITTEN_WAIT`]. An outcome is written some milliseconds after the
    /// downstream answered (the answer is read, and outcomes are written in batches, up to
    /// 20 ms apart); a redeliver or requeue made in between, say the moment a downstream
    /// answered, would find the row still pending and leave it. So they wait for this first.
    /// `rows`: only the attempts of these rows (a redeliver of one event, a requeue of one
    /// delivery), so that an attempt of another event to a slow downstream does not hold the
    /// call up; `None`: every attempt (a bulk requeue, which may touch any row).
    pub async fn outcomes_written(&self, rows: Option<&[i64]>) {
        let started = self.unwritten().started;
        let deadline = tokio::time::Instant::now() + WRITTEN_WAIT;
        loop {
            let notified = self.written_notify.notified();
            tokio::pin!(notified);
            // Registered before the look, so a write in between still wakes it.
            notified.as_mut().enable();
            let waiting = {
                let unwritten = self.unwritten();
                match rows {
                    None => unwritten
                        .numbers
                        .first()
                        .is_some_and(|oldest| *oldest <= started),
                    Some(rows) => rows.iter().any(|row| {
                        unwritten
                            .by_row
                            .get(row)
                            .is_some_and(|number| *number <= started)
                    }),
                }
            };
            if !waiting {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    fn unwritten(&self) -> std::sync::MutexGuard<'_, Unwritten> {
        self.unwritten.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An attempt of row `id` starts (its request is about to be sent).
    fn attempt_started(&self, id: i64) {
        let mut unwritten = self.unwritten();
        unwritten.started += 1;
        let number = unwritten.started;
        if let Some(earlier) = unwritten.by_row.insert(id, number) {
            // Not while the row's last outcome is unwritten; were it so, the newer counts.
            unwritten.numbers.remove(&earlier);
        }
        unwritten.numbers.insert(number);
    }

    /// The outcomes of the attempts of these rows have been written (or failed to be).
    fn written(&self, ids: impl IntoIterator<Item = i64>) {
        {
            let mut unwritten = self.unwritten();
            for id in ids {
                if let Some(number) = unwritten.by_row.remove(&id) {
                    unwritten.numbers.remove(&number);
                }
            }
        }
        self.written_notify.notify_waiters();
    }

    /// A claim (or a requeue) committed outbox rows: look at every lane now rather than at
    /// the next poll. Call it after the commit, never before: a look before the commit finds
    /// nothing.
    pub fn queued(&self) {
        self.look.store(true, Ordering::SeqCst);
        self.poke();
    }

    /// Whether rows were queued since the last call.
    fn take_look(&self) -> bool {
        self.look.swap(false, Ordering::SeqCst)
    }

    /// Stop taking rows; attempts under way finish and their outcomes are recorded.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.notify.notify_one();
        self.stopped.notify_waiters();
    }

    /// Returns once the stop has come (at once if it has).
    async fn until_stopped(&self) {
        let stopped = self.stopped.notified();
        tokio::pin!(stopped);
        // Registered before the look, so a stop in between still wakes it.
        stopped.as_mut().enable();
        if self.stopping() {
            return;
        }
        stopped.await;
    }

    /// Something changed that may let the dispatcher take more, or rows were handed over.
    fn poke(&self) {
        self.notify.notify_one();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    async fn notified(&self) {
        self.notify.notified().await;
    }
}

/// What the dispatcher works with: the pool, the metrics, and each forwarding source's targets
/// as lanes. Cheap to clone; the clones share the lanes' counts.
#[derive(Clone)]
pub struct Outbox {
    pool: DbPool,
    metrics: Arc<Metrics>,
    lanes: Arc<Vec<Lane>>,
    /// Lanes by (source name, target name).
    index: Arc<HashMap<(String, String), usize>>,
    /// Lanes with pending rows that no configured target matches, already warned about.
    orphans_warned: Arc<Mutex<HashSet<(String, String)>>>,
    /// Ordered lanes seen with several rows leased at once (another instance sends them
    /// unordered), already warned about.
    disorder_warned: Arc<Mutex<HashSet<usize>>>,
    /// Rows claims handed straight over (see [`Handover`]), with their lanes and the latest
    /// each may start ([`Lane::start_by`]), not yet started.
    handed: Arc<Mutex<Vec<(usize, Due, tokio::time::Instant)>>>,
    /// The takes failing in a row, for the log.
    unread: Arc<Mutex<crate::outage::Outage>>,
    /// Where the outbox is, for this instance's registration (`db::instances`).
    store: Store,
    /// This instance's number: every row it leases names it.
    holder: Arc<AtomicI64>,
    /// This instance's registration (`db::instances`), made at the first look.
    registration: Arc<Mutex<Registration>>,
}

impl Outbox {
    /// The outbox of these targets (by source name and target name); `None` when no source
    /// forwards.
    pub fn new(
        pool: DbPool,
        store: Store,
        metrics: Arc<Metrics>,
        targets: HashMap<(String, String), Arc<Target>>,
    ) -> Option<Outbox> {
        if targets.is_empty() {
            return None;
        }
        let mut targets: Vec<_> = targets.into_iter().collect();
        targets.sort_by(|a, b| a.0.cmp(&b.0));
        let index = targets
            .iter()
            .enumerate()
            .map(|(i, (key, _))| (key.clone(), i))
            .collect();
        let lanes = targets
            .into_iter()
            .map(|((source, _), target)| Lane::new(source, target))
            .collect();
        let holder = Arc::new(AtomicI64::new(instances::new_number()));
        Some(Outbox {
            pool,
            metrics,
            lanes: Arc::new(lanes),
            index: Arc::new(index),
            orphans_warned: Arc::default(),
            disorder_warned: Arc::default(),
            handed: Arc::default(),
            unread: Arc::default(),
            registration: Arc::new(Mutex::new(Registration::new(store.clone(), holder.clone()))),
            store,
            holder,
        })
    }

    /// This instance's number, which its leases name.
    fn holder(&self) -> i64 {
        self.holder.load(Ordering::SeqCst)
    }

    /// This instance's registration (`db::instances`).
    fn registration(&self) -> Arc<Mutex<Registration>> {
        self.registration.clone()
    }

    /// Keeps this instance registered, and takes back at once the rows leased by instances
    /// that died (see `db::instances`); whether any came back, or why the look failed. A
    /// failure is left to the next look: meanwhile such rows wait for their leases to run out,
    /// as they would anyway.
    async fn look_after_instances(
        &self,
        registration: &Arc<Mutex<Registration>>,
    ) -> Result<bool, String> {
        let (pool, registration) = (self.pool.clone(), registration.clone());
        let on_postgres = matches!(self.store, Store::Postgres(_));
        let looked = web::block(move || {
            let mut registration = registration.lock().unwrap_or_else(|e| e.into_inner());
            // On PostgreSQL the look runs on the lock's own connection: no wait for a pooled
            // one (held by slow requests) delays taking a broken lock again.
            if on_postgres {
                return registration.look(None).map_err(|e| format!("{e:#}"));
            }
            let mut looked = Err(String::new());
            let turn = in_turn(&pool, |conn| {
                looked = registration.look(Some(conn)).map_err(|e| format!("{e:#}"));
                Ok(())
            });
            turn.map_err(|e| format!("{e:#}")).and(looked)
        })
        .await
        .unwrap_or_else(|_| Err("the look panicked".to_owned()))?;
        // Every one, also with nothing under way: an idle instance's crash or cut-off went
        // unsaid (a black-box run). A clean stop leaves its row for another's look too, so it
        // is said as well.
        for dead in &looked {
            let then = if dead.rows > 0 {
                "its deliveries under way are due again now (they go with the same key, so one \
                 that reached the downstream before it stopped may arrive twice)"
            } else {
                "it had no deliveries under way"
            };
            tracing::info!(
                instance = dead.id,
                host = %dead.host,
                pid = dead.pid,
                deliveries = dead.rows,
                "an instance sharing this database has stopped (a stop, a crash, or its lock was \
                 free for 2.5 s or more: it lost the connection that holds it, and is told at its \
                 next look); {then}"
            );
        }
        Ok(looked.iter().any(|dead| dead.rows > 0))
    }

    /// One pass: takes what is due now (as much as each target's limits allow), sends it,
    /// waits for every outcome to be recorded, and returns how many rows were sent. The
    /// dispatcher runs the same steps continuously; a pass lets a caller (a test) drive it and
    /// see the result. It shares the limits of the dispatcher running beside it.
    pub async fn pass(&self) -> usize {
        dispatch::pass(self).await
    }

    fn lane_of(&self, source: &str, target: &str) -> Option<usize> {
        self.index
            .get(&(source.to_owned(), target.to_owned()))
            .copied()
    }

    /// Takes the rows `wants` asks for; `None` when the outbox cannot be read. The dispatcher
    /// tries again at every look (at least every 250 ms), so a failure that lasts (the database
    /// down or unreachable) is logged as one outage ([`crate::outage::Outage`]): a WARN when
    /// it starts, at most one a minute while it lasts, each failure at DEBUG, and an INFO when
    /// a take works again.
    ///
    /// With the rows come the indexes of `wants` whose lane another database session held
    /// (ordered lanes on PostgreSQL, see `deliveries::take_due_and_held`).
    async fn take(&self, wants: Vec<Want>) -> Option<(Vec<Due>, Vec<usize>)> {
        let pool = self.pool.clone();
        let holder = self.holder();
        let due = web::block(move || {
            in_turn(&pool, |conn| {
                deliveries::take_due_and_held(conn, &wants, holder)
            })
        });
        tokio::pin!(due);
        let began = Instant::now();
        let due = match tokio::time::timeout(TAKE_TOLD_AFTER, &mut due).await {
            Ok(due) => due,
            Err(_) => {
                tracing::warn!(
                    "reading the outbox has waited {} for the database, which does not answer \
                     (frozen, overloaded, or cut off without an error); nothing is forwarded \
                     meanwhile, and its end is said",
                    crate::config::Spelt(TAKE_TOLD_AFTER)
                );
                let due = due.await;
                let waited = crate::config::Spelt(crate::outage::round_to_seconds(began.elapsed()));
                match &due {
                    Ok(Ok(_)) => tracing::info!(
                        waited = %waited,
                        "the database answered the outbox's read; forwarding goes on"
                    ),
                    // A connection found dead at last is no answer (a black-box run read "the
                    // database answered" while it was still cut off).
                    Ok(Err(e)) => tracing::info!(
                        waited = %waited,
                        error = %e,
                        "the outbox's read that waited for the database ended with an error, \
                         not an answer"
                    ),
                    Err(_) => {}
                }
                due
            }
        };
        let failure = match due {
            Ok(Ok(due)) => {
                let ended = self.outage().ended(Instant::now());
                if let Some(ended) = ended {
                    tracing::info!(
                        failed_tries = ended.failed,
                        lasted = %crate::config::Spelt(crate::outage::round_to_seconds(ended.lasted)),
                        "the outbox can be read again; forwarding goes on"
                    );
                }
                return Some(due);
            }
            Ok(Err(e)) => e,
            Err(_) => {
                // A bug of hookbox's own, not an outage.
                tracing::error!("reading the outbox panicked");
                return None;
            }
        };
        // A take reads the due rows and leases them: a store that refuses writes (a full
        // disk, a read-only file) reads fine and refuses the lease, which "cannot read" misnamed
        // (a black-box run).
        let what = if failure
            .downcast_ref::<diesel::result::Error>()
            .is_some_and(|e| crate::db::Failure::of(e).refused_a_write())
        {
            "cannot take rows from the outbox: the database refuses the write that leases them"
        } else {
            "cannot read the outbox"
        };
        tracing::debug!(error = %failure, "{what}");
        let warn = self.outage().failed(Instant::now());
        if let Some(warn) = warn {
            tracing::warn!(
                error = %failure,
                failing_for = %crate::config::Spelt(crate::outage::round_to_seconds(warn.lasted)),
                failed_tries = warn.failed,
                "{what}; nothing is forwarded until it can be (rows stay queued and are sent \
                 then). Retried at every look; at most one such warning a minute, RUST_LOG=debug \
                 shows each"
            );
        }
        None
    }

    /// Books up to `want` starts of `lane`'s target in the store's schedule (`db::paces`),
    /// for its pace; a failure says why, and the pace books again a moment later (see
    /// `pace.rs`).
    fn book(
        &self,
        lane: &Lane,
        want: u32,
    ) -> impl std::future::Future<Output = Result<paces::Booked, String>> + 'static {
        let pool = self.pool.clone();
        let (source, target) = (lane.source.clone(), lane.target.config.name.clone());
        let (interval, reach) = lane.pace().map_or((Duration::ZERO, Duration::ZERO), |p| {
            (p.interval(), p.reach())
        });
        async move {
            web::block(move || {
                in_turn(&pool, |conn| {
                    paces::book(
                        conn,
                        &source,
                        &target,
                        want,
                        interval,
                        reach,
                        pace::WIDEST_ANSWER,
                    )
                })
            })
            .await
            .map_err(|_| "booking panicked".to_owned())?
            .map_err(|e| e.to_string())
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, crate::outage::Outage> {
        self.unread.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a batch of outcomes in one transaction; whether it was stored (a failure is
    /// logged, and the rows' leases run out and they are attempted again: at least once).
    async fn settle(&self, outcomes: Vec<Settled>) -> bool {
        if outcomes.is_empty() {
            return true;
        }
        let pool = self.pool.clone();
        let n = outcomes.len();
        // A store busy with another process's writes (SQLite, where the busy timeout is the
        // short in-flight wait) is waited out for a while, and a batch PostgreSQL ended to break
        // a deadlock is made again: an outcome not recorded is an attempt made again once its
        // lease runs out.
        let stored = web::block(move || {
            let patience = Instant::now() + SETTLE_PATIENCE;
            loop {
                let stored = in_turn(&pool, |conn| deliveries::settle(conn, &outcomes));
                let busy = stored.as_ref().err().is_some_and(|e| {
                    e.downcast_ref::<diesel::result::Error>()
                        .is_some_and(|e| db::is_lock_timeout(e) || db::pg::is_deadlock(e))
                });
                if !busy || Instant::now() >= patience {
                    return stored;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
        match stored {
            Ok(Ok(recorded)) => {
                if recorded < n {
                    // A paused process's attempt that another instance took again at the end
                    // of its lease was logged as `forwarded`, and nothing said why the
                    // downstream got it twice (a black-box run).
                    tracing::info!(
                        outcomes = n,
                        not_recorded = n - recorded,
                        "{} of {n} forward attempt outcomes were not recorded: their deliveries \
                         had moved on meanwhile (taken again by another instance once their \
                         lease ran out, as when this process was paused or cut off past it; \
                         redelivered; or purged), so whoever has them now sends them, with the \
                         same key, and a downstream may get such an event twice",
                        n - recorded
                    );
                }
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    error = %e,
                    outcomes = n,
                    "cannot record forward attempts; they will be attempted again"
                );
                false
            }
            Err(_) => {
                tracing::error!(
                    outcomes = n,
                    "recording forward attempts panicked; they will be attempted again"
                );
                false
            }
        }
    }

    async fn refresh_gauges(&self) {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        let counted = web::block(move || {
            db::with_connection(&pool, |conn| {
                Ok((
                    deliveries::pending_by_target(conn)?,
                    deliveries::dead(conn)?,
                ))
            })
        })
        .await;
        let (by_target, dead) = match counted {
            Ok(Ok(counted)) => counted,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "cannot count the outbox");
                return;
            }
            Err(_) => return,
        };
        self.warn_of_disorder(&by_target);
        let by_target: Vec<(String, String, u64)> = by_target
            .into_iter()
            .map(|count| {
                let n = u64::try_from(count.pending).unwrap_or(0);
                (count.source, count.target, n)
            })
            .collect();
        // Every pending row is in one (source, target): their sum is the total, without
        // reading the pending rows a second time.
        let pending = by_target.iter().map(|(_, _, n)| n).sum();
        metrics.set_outbox(pending, u64::try_from(dead).unwrap_or(0), &by_target);
        let mut warned = self
            .orphans_warned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (source, target, n) in by_target {
            if self.lane_of(&source, &target).is_none()
                && warned.insert((source.clone(), target.clone()))
            {
                tracing::warn!(
                    source = %source,
                    target = %target,
                    pending = n,
                    "deliveries are pending to a forward target this instance does not have in \
                     its config; they wait for an instance that does (configure the target \
                     again to send them)"
                );
            }
        }
    }
}

impl Outbox {
    /// An ordered lane has at most one row leased, whichever instance sends it; more means an
    /// instance sharing the database sends the target unordered (its config says `ordered =
    /// false`, during a rolling change say), and the order this one keeps is not kept. Said
    /// once per lane, as a WARN.
    fn warn_of_disorder(&self, counts: &[deliveries::PendingCount]) {
        let mut warned = self
            .disorder_warned
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for count in counts.iter().filter(|count| count.leased > 1) {
            let Some(lane) = self.lane_of(&count.source, &count.target) else {
                continue;
            };
            if self.lanes[lane].target.config.ordered && warned.insert(lane) {
                tracing::warn!(
                    source = %count.source,
                    target = %count.target,
                    leased = count.leased,
                    "this target is ordered here, but several of its deliveries are being sent \
                     at once: an instance sharing the database sends it unordered. Set ordered \
                     = true for it on every instance; until then its order is not kept"
                );
            }
        }
    }
}

/// What a claim uses to hand its outbox rows straight to this process's dispatcher.
///
/// Under load, most rows are sent moments after their claim commits. Taking them back out of
/// the outbox costs a statement and a second write of each row (its lease). Instead, a claim
/// whose target's lane has room and no backlog inserts the row already leased to this process
/// (attempt 1, `next_attempt_at` past the lease) and, once stored, hands it to the dispatcher
/// in memory. No other process takes a leased row, so each row is still sent by one process at a
/// time. If this one dies first, the lease runs out and any instance takes the row as it would
/// any other. Ordered and paced targets never hand over: their order and pace are kept through
/// the outbox.
#[derive(Clone)]
pub struct Handover {
    outbox: Outbox,
    wake: Wake,
}

/// Room reserved in a lane for one handed-over row.
#[derive(Debug)]
pub struct Reserved {
    lane: usize,
    /// How long the row is leased when inserted.
    pub lease: Duration,
    /// To whom: this instance's number.
    pub holder: i64,
    /// The latest its attempt may start ([`Lane::start_by`]), counted from the reservation,
    /// made before the row's lease was written.
    start_by: tokio::time::Instant,
}

impl Handover {
    /// Hands rows of `outbox`'s lanes to the dispatcher that `wake` wakes.
    pub fn new(outbox: Outbox, wake: Wake) -> Handover {
        Handover { outbox, wake }
    }

    /// Reserves room for a row of `source`'s `target` to be inserted leased and handed over;
    /// `None` when it must be queued the normal way.
    pub fn reserve(&self, source: &str, target: &str) -> Option<Reserved> {
        if self.wake.stopping() {
            return None;
        }
        let lane = self.outbox.lane_of(source, target)?;
        let lane_of = &self.outbox.lanes[lane];
        lane_of.reserve_handover().then(|| Reserved {
            lane,
            lease: lane_of.lease(),
            holder: self.outbox.holder(),
            start_by: lane_of.start_by(tokio::time::Instant::now()),
        })
    }

    /// A claim queued rows of these lanes, each (source, target), the normal way (for a
    /// take): those lanes look at the outbox again, and hand nothing over until a take has
    /// caught up. Only these: a lane that fell behind does not stop the others' handover.
    pub fn queued(&self, lanes: &[(String, String)]) {
        for (source, target) in lanes {
            match self.outbox.lane_of(source, target) {
                Some(lane) => self.outbox.lanes[lane].look_again(),
                None => self.wake.look.store(true, Ordering::SeqCst),
            }
        }
        self.wake.poke();
    }

    /// Gives back the room of a row that was not stored.
    pub fn unreserve(&self, reserved: Reserved) {
        self.outbox.lanes[reserved.lane].unreserve_handover();
    }

    /// Hands stored rows over: the dispatcher starts them as it would rows it took.
    pub fn hand(&self, rows: Vec<(Reserved, Due)>) {
        if rows.is_empty() {
            return;
        }
        self.outbox
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(
                rows.into_iter()
                    .map(|(reserved, due)| (reserved.lane, due, reserved.start_by)),
            );
        self.wake.poke();
    }
}

/// Runs `work` on a pooled connection in this process's turn to write on SQLite (at once on
/// PostgreSQL). A connection that fails under it is dropped from the pool.
fn in_turn<T>(
    pool: &DbPool,
    work: impl FnOnce(&mut AnyConnection) -> QueryResult<T>,
) -> anyhow::Result<T> {
    let mut conn = pool.get()?;
    let _turn = conn
        .write_turn(std::time::Instant::now() + TURN_WAIT)
        .map_err(|_| {
            anyhow::anyhow!(
                "no turn to write within {}s: claims keep the store busy",
                TURN_WAIT.as_secs()
            )
        })?;
    work(&mut conn).map_err(|e| {
        conn.note(&e);
        e.into()
    })
}

/// How long a stop waits for a look under way to end before it lets go of the registration.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// The dispatcher task inside `serve`.
pub struct Dispatcher {
    running: tokio::task::JoinHandle<()>,
    registration: Arc<Mutex<Registration>>,
}

impl Dispatcher {
    /// Spawns the dispatcher on the current actix runtime: it sends `outbox`'s due rows until
    /// `wake` says stop.
    pub fn start(outbox: Outbox, wake: Wake) -> Dispatcher {
        Dispatcher {
            registration: outbox.registration(),
            running: actix_web::rt::spawn(dispatch::run(outbox, wake)),
        }
    }

    /// After [`finish`](Self::finish) found every attempt ended: lets go of this instance's
    /// registration ([`Registration::release`]), once a look still under way (on a thread of
    /// its own, which outlives the dispatcher's task) has ended: a stop that came during a
    /// look left the SQLite lock file behind. Not after [`RELEASE_WAIT`] (a database that
    /// hangs): the process's end lets go of the lock then, and the file stays.
    pub async fn release(&self) {
        let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
        loop {
            if let Ok(mut registration) = self.registration.try_lock() {
                registration.release();
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// After [`Wake::stop`]: waits until every attempt under way has ended and its outcome is
    /// recorded (rows still waiting for a slot or a turn go back to the outbox untried), until
    /// `deadline` at the latest. Says whether it ended by then; if not, the attempts still
    /// under way are abandoned with the process, and their rows are sent again, with the same
    /// key, by whichever instance takes them back.
    /// A wait of more than a second is announced, so the stop is not silent while a slow
    /// target's attempts end.
    pub async fn finish(&mut self, deadline: tokio::time::Instant) -> bool {
        let running = &mut self.running;
        let soon = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        if tokio::time::timeout_at(soon, &mut *running).await.is_ok() {
            return true;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        tracing::info!(
            "waiting up to {} s more for the forward attempts still under way to end and be \
             recorded",
            left.as_secs_f64().ceil()
        );
        tokio::time::timeout_at(deadline, running).await.is_ok()
    }
}
