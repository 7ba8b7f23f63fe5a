//! A lane: one (source, target), with the limits this process keeps for it.
//!
//! `concurrency` bounds the attempts in flight (a fair semaphore of slots). A lane takes up to
//! as many rows again ahead of its slots, so the next rows are at hand while a take is under
//! way and no slot idles waiting for the database; the lease covers that wait. It takes in
//! batches: only once half its slots' worth of room is free (at once when it is idle), so under
//! load one statement brings many rows rather than one per ended attempt. `rate` spreads
//! the starts ([`Pace`]) and bounds how many rows wait for one; `ordered` lets a lane hold one
//! row at a time, from its take until its outcome is committed, so the next take sees the head
//! as it stands. Every runner of the process (the dispatcher, and a test's
//! [`super::Outbox::pass`]) shares these counts: a take reserves room first and gives back what
//! it did not fill, so two runners never overfill a lane.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::pace::{Pace, Turn, Waiting};
use super::Target;
use crate::db::deliveries::{Want, ORDER_SETTLE};
use crate::db::paces::Booked;

/// A lease lasts the longest a taken row may wait for a slot and its turn under `rate`, the
/// attempt's timeout, and this, so a slow but live attempt is settled before another
/// dispatcher may take the row.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// An ordered lane's looks at rows that settle are kept to this grain: a row queued now is
/// looked for at most this much after it settles, and a lane keeps at most
/// `ORDER_SETTLE / SETTLE_GRAIN + 1` looks ahead.
const SETTLE_GRAIN: Duration = Duration::from_millis(10);

/// How long an ordered lane's lock may be found held by another database session, take after
/// take, before it is said (once per hold, at WARN). A hookbox instance holds it only inside its
/// take, for milliseconds (at most `deliveries::TAKE_IDLE_LIMIT` when stopped there).
const HELD_TOLD_AFTER: Duration = Duration::from_secs(5);

/// Looks at a held lane further apart than this are two holds, not one: the lane was not
/// asked for in between (nothing was due).
const HELD_GAP: Duration = Duration::from_secs(2);

/// How long every attempt of a lane must have failed, none delivered in between, before it is
/// said (once per run of failures, at WARN). Shorter runs (a redeploy, a blip) pass in
/// silence beyond each attempt's own line.
const FAILING_TOLD_AFTER: Duration = Duration::from_secs(5);

/// Failed attempts of a lane further apart than this are two runs, not one, until one is
/// said: the target was not tried in between (nothing was due), so nothing says it was down.
/// One event's failed series, an idle spell, then another event's first failure read as 16 s
/// of outage (a black-box run). Longer than the backoff's gaps while a run is young (the
/// fifth attempt of one event comes 4-8 s after the fourth), so a target down with a single
/// event to send is still said.
const FAILING_GAP: Duration = Duration::from_secs(10);

/// A lane's attempts failing in a row since `since`, none delivered in between.
struct Failing {
    since: Instant,
    /// The latest failed attempt's end.
    last: Instant,
    attempts: u64,
    /// Every one of them was answered 429: the target is up, and asks for fewer.
    throttled: bool,
    /// Said, and whether as throttling (a failure other than a 429 after it is said again,
    /// as down).
    told: Option<bool>,
}

/// An ordered lane's lock found held by another session at each take since `since`.
struct Held {
    since: Instant,
    last: Instant,
    told: bool,
}

/// One (source, target) and its counts in this process.
pub struct Lane {
    /// The source's name.
    pub source: String,
    /// The target, with its config.
    pub target: Arc<Target>,
    /// Its `rate`, if it has one.
    pace: Option<Pace>,
    /// One permit per attempt in flight: `concurrency` of them.
    slots: Semaphore,
    /// Rows taken (or room reserved for a take) that have not started.
    waiting: AtomicUsize,
    /// Attempts under way.
    in_flight: AtomicUsize,
    /// Rows taken whose outcome is not yet committed.
    unsettled: AtomicUsize,
    /// Held while room is read and reserved, so two runners on two threads reserve in turn.
    reserving: Mutex<()>,
    /// Whether rows of this lane may be due in the outbox that this process has not taken: set
    /// when the dispatcher looks at every lane (rows queued the normal way, a poll, a retry
    /// coming due), cleared when a take brings fewer rows than it asked for. While it is clear,
    /// a claim may hand its rows straight over ([`Lane::reserve_handover`]) and the dispatcher
    /// does not ask the outbox for this lane.
    backlog: AtomicBool,
    /// Set by the dispatcher's poll (and by a retry of its own coming due): rows of this lane
    /// may have come due in the outbox with no claim here queuing them (retries, leases run
    /// out, rows of other instances). The next take asks for them, as for a backlog; unlike a
    /// backlog it does not stop claims from handing rows over meanwhile (such rows are late
    /// already, and a lane under load would otherwise go the long way after every poll).
    polled: AtomicBool,
    /// An ordered lane's looks to come: when rows it queued settle ([`ORDER_SETTLE`] after
    /// they were received, which was before they were queued), earliest first, each on a
    /// [`SETTLE_GRAIN`] from `born`. Without them an idle ordered lane's new row, not yet
    /// settled when its claim woke the dispatcher, waited for the next poll (up to 250 ms).
    settles: Mutex<VecDeque<Instant>>,
    /// When the lane was made: the origin of the settle looks' grain.
    born: Instant,
    /// An ordered lane whose lock another database session holds, take after take: said once
    /// it has lasted [`HELD_TOLD_AFTER`], and again when it ends.
    held: Mutex<Option<Held>>,
    /// Attempts failing in a row: a target down is said once, after [`FAILING_TOLD_AFTER`],
    /// and its return too, beside each attempt's own line.
    failing: Mutex<Option<Failing>>,
}

impl Lane {
    /// The lane of `source`'s `target`.
    pub fn new(source: String, target: Arc<Target>) -> Lane {
        let pace = target.config.rate.map(Pace::new);
        let slots = Semaphore::new(target.config.concurrency as usize);
        Lane {
            source,
            target,
            pace,
            slots,
            waiting: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            unsettled: AtomicUsize::new(0),
            reserving: Mutex::new(()),
            backlog: AtomicBool::new(true),
            polled: AtomicBool::new(false),
            settles: Mutex::new(VecDeque::new()),
            born: Instant::now(),
            held: Mutex::new(None),
            failing: Mutex::new(None),
        }
    }

    /// The latest a row of this lane leased at `since` (or later) may start its attempt: late
    /// enough for every wait the lease allows (a slot, its turn), early enough that the attempt
    /// ends, and its outcome is written, before the lease does. A row past it (its process was
    /// stopped or starved meanwhile) may have been taken by another instance, and an ordered
    /// lane's later events sent: it is not sent.
    pub fn start_by(&self, since: tokio::time::Instant) -> tokio::time::Instant {
        since
            + self
                .lease()
                .saturating_sub(self.target.config.timeout + LEASE_MARGIN / 2)
    }

    /// How long a row of this lane is leased when taken: a row taken ahead waits for a slot at
    /// most one attempt's timeout (no more rows wait than there are slots, and each slot is
    /// free again within a timeout), then for its turn under `rate`, then its own attempt.
    pub fn lease(&self) -> Duration {
        let wait = self
            .pace
            .as_ref()
            .map_or(Duration::ZERO, Pace::longest_wait);
        let slot_wait = if self.target.config.ordered {
            // One row at a time: it never waits for a slot.
            Duration::ZERO
        } else {
            self.target.config.timeout
        };
        slot_wait + self.target.config.timeout + wait + LEASE_MARGIN
    }

    /// How many rows a take may ask for now: up to twice `concurrency` taken and unfinished
    /// (as many waiting as in flight), and nothing until at least half of `concurrency` is free,
    /// so that a busy lane takes in batches.
    fn room(&self) -> usize {
        let concurrency = self.target.config.concurrency as usize;
        let busy = self.waiting.load(Ordering::SeqCst) + self.in_flight.load(Ordering::SeqCst);
        let mut room = (2 * concurrency).saturating_sub(busy);
        if room < concurrency.div_ceil(2) {
            return 0;
        }
        if let Some(pace) = &self.pace {
            room = room.min(
                pace.queue()
                    .saturating_sub(self.waiting.load(Ordering::SeqCst)),
            );
        }
        if self.target.config.ordered && self.unsettled.load(Ordering::SeqCst) > 0 {
            room = 0;
        }
        if self.target.config.ordered {
            room = room.min(1);
        }
        if !self.backlog.load(Ordering::SeqCst) {
            // A poll's take, with claims handing rows over meanwhile: the room it reserves is
            // not theirs until it is back, so it asks for a quarter of `concurrency` at most
            // (more, if it finds that many, at the next take). Reserving the whole window
            // four times a second made claims under load fail to hand over and queue their
            // rows for takes instead, a third of them.
            room = room.min(concurrency.div_ceil(4));
        }
        room
    }

    /// Reserves the lane's room for a take and says what to ask for; `None` when it has none.
    /// The caller hands back what the take did not fill with [`Lane::taken`].
    pub fn reserve(&self) -> Option<Want> {
        let _turn = self.reserving.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.room();
        if room == 0 {
            return None;
        }
        self.waiting.fetch_add(room, Ordering::SeqCst);
        self.unsettled.fetch_add(room, Ordering::SeqCst);
        Some(Want {
            source: self.source.clone(),
            target: self.target.config.name.clone(),
            limit: i64::try_from(room).unwrap_or(i64::MAX),
            ordered: self.target.config.ordered,
            lease: self.lease(),
        })
    }

    /// The take of a reservation of `reserved` rows brought `taken`: the rest is given back.
    /// A take that brought fewer than it asked for found every due row of the lane: until the
    /// dispatcher looks again, nothing is left for a take, and claims may hand rows over.
    pub fn taken(&self, reserved: usize, taken: usize) {
        self.give_back(reserved.saturating_sub(taken));
        if taken < reserved {
            self.polled.store(false, Ordering::SeqCst);
            if self.hands_over() {
                self.backlog.store(false, Ordering::SeqCst);
            }
        }
    }

    /// An ordered lane's take at `at` found its lock held by another database session
    /// (`held`), or took it. A hold that lasts [`HELD_TOLD_AFTER`] is logged at WARN (its
    /// events wait, and nothing else says why), and its end at INFO once told.
    pub fn held_elsewhere(&self, held: bool, at: Instant) {
        let mut hold = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held {
            if let Some(ended) = hold.take().filter(|h| h.told) {
                tracing::info!(
                    source = %self.source,
                    target = %self.target.config.name,
                    held_for = %crate::config::Spelt(crate::outage::round_to_seconds(at - ended.since)),
                    "the ordered target's lane is free again; its events go on in order"
                );
            }
            return;
        }
        let on = match hold.as_mut() {
            Some(on) if at.saturating_duration_since(on.last) <= HELD_GAP => on,
            _ => hold.insert(Held {
                since: at,
                last: at,
                told: false,
            }),
        };
        on.last = at;
        if !on.told && at - on.since >= HELD_TOLD_AFTER {
            on.told = true;
            let lock = crate::db::deliveries::lane_lock_key(&self.source, &self.target.config.name);
            tracing::warn!(
                source = %self.source,
                target = %self.target.config.name,
                lock,
                held_for = %crate::config::Spelt(crate::outage::round_to_seconds(at - on.since)),
                "the ordered target's lane is held by another PostgreSQL session: its events wait \
                 until it lets go. A hookbox instance holds it only inside a take, for \
                 milliseconds; a longer hold is a session that is not hookbox's, or one cut off \
                 while PostgreSQL was still sending it rows. Its end is said too. This finds \
                 the holder's pid: SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND \
                 ((classid::bigint << 32) | objid::bigint) = {lock};"
            );
        }
    }

    /// An attempt of this lane failed with `error` (the target's `status`, where it answered)
    /// and is to be retried. Each failed attempt has its own WARN; during an outage those come
    /// by the hundred, and none says the target itself is down, nor when it is back. So a run
    /// of failures that has lasted [`FAILING_TOLD_AFTER`] with no delivery in between (nor,
    /// before it is said, a spell of [`FAILING_GAP`] without a failed attempt) is said once,
    /// and its end (the next delivery) once told. A run of 429s alone is said as the
    /// target throttling hookbox, not as down (a target that is up and asks for fewer
    /// attempts is helped by a `rate` or a lower `concurrency`, not by looking for an outage).
    pub fn attempt_failed(&self, status: Option<u16>, error: &str) {
        let at = Instant::now();
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = Failing {
            since: at,
            last: at,
            attempts: 0,
            throttled: true,
            told: None,
        };
        let run = match failing.as_mut() {
            Some(run) if run.told.is_some() || at - run.last <= FAILING_GAP => run,
            _ => failing.insert(fresh),
        };
        run.attempts += 1;
        run.last = at;
        run.throttled &= status == Some(429);
        // Untold, or told as throttling and now failing otherwise too (429s, then 503s).
        let untold = run.told.is_none_or(|throttled| throttled && !run.throttled);
        if untold && at - run.since >= FAILING_TOLD_AFTER {
            run.told = Some(run.throttled);
            let failing_for = crate::config::Spelt(crate::outage::round_to_seconds(at - run.since));
            let attempts = run.attempts;
            let (what, advice) = if run.throttled {
                (
                    format!(
                        "forward target throttling: every attempt for {failing_for} ({attempts} \
                         attempts) was answered 429 Too Many Requests"
                    ),
                    ", never sooner than its Retry-After (dead-lettered after max_attempts); if \
                     it stays so, give the target a `rate` or a lower `concurrency` within what \
                     it takes",
                )
            } else {
                (
                    format!(
                        "forward target down: every attempt has failed for {failing_for} \
                         ({attempts} attempts), the latest with: {error}"
                    ),
                    " (dead-lettered after max_attempts)",
                )
            };
            tracing::warn!(
                source = %self.source,
                target = %self.target.config.name,
                failing_for = %failing_for,
                failed_attempts = attempts,
                "{what}. Its deliveries wait in the outbox and are retried with backoff{advice}; \
                 a line says when it delivers again"
            );
        }
    }

    /// An attempt of this lane was delivered: a run of failures that was said ends.
    pub fn attempt_delivered(&self) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(run) = failing.take().filter(|run| run.told.is_some()) {
            tracing::info!(
                source = %self.source,
                target = %self.target.config.name,
                failed_for = %crate::config::Spelt(crate::outage::round_to_seconds(run.since.elapsed())),
                failed_attempts = run.attempts,
                "forward target delivers again, after {} failed attempts",
                run.attempts
            );
        }
    }

    /// Gives back `n` rows of reserved room: a take that could not read the outbox, which says
    /// nothing of what is due there.
    pub fn give_back(&self, n: usize) {
        self.waiting.fetch_sub(n, Ordering::SeqCst);
        self.unsettled.fetch_sub(n, Ordering::SeqCst);
    }

    /// Whether claims may hand this lane's rows straight over: neither `ordered` (its order is
    /// kept by the outbox, across processes) nor paced.
    fn hands_over(&self) -> bool {
        !self.target.config.ordered && self.pace.is_none()
    }

    /// Rows of this lane may be due in the outbox: the next take asks for them, and claims
    /// queue rows the normal way until a take has caught up.
    pub fn look_again(&self) {
        self.backlog.store(true, Ordering::SeqCst);
        if self.target.config.ordered {
            self.look_when_settled(Instant::now());
        }
    }

    /// An ordered lane's rows queued at `now` are taken once they settle: the dispatcher looks
    /// at the lane again then ([`Lane::settle_look`]), on the grain's next step.
    fn look_when_settled(&self, now: Instant) {
        let grain = SETTLE_GRAIN.as_nanos();
        let since = (now + ORDER_SETTLE).duration_since(self.born).as_nanos();
        let nanos = since.div_ceil(grain) * grain;
        let at = self.born + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let mut settles = self.settles.lock().unwrap_or_else(|e| e.into_inner());
        if settles.back().is_none_or(|last| *last < at) {
            settles.push_back(at);
        }
    }

    /// The dispatcher's next look at an ordered lane's rows that settle, if one is to come: at
    /// or before `now` when one came due (take again now; it is then done with).
    pub fn settle_look(&self, now: Instant) -> Option<Instant> {
        if !self.target.config.ordered {
            // Asked on every wake of the dispatcher: an unordered lane has none to look at.
            return None;
        }
        let mut settles = self.settles.lock().unwrap_or_else(|e| e.into_inner());
        let mut due = None;
        while let Some(at) = settles.front().copied().filter(|at| *at <= now) {
            settles.pop_front();
            due = due.or(Some(at));
        }
        due.or_else(|| settles.front().copied())
    }

    /// Rows of this lane may have come due in the outbox without a claim here queuing them:
    /// the next take asks for them, while claims go on handing rows over.
    pub fn poll(&self) {
        self.polled.store(true, Ordering::SeqCst);
    }

    /// Whether a take should ask for this lane's rows: they may be due in the outbox.
    pub fn worth_a_take(&self) -> bool {
        self.backlog.load(Ordering::SeqCst) || self.polled.load(Ordering::SeqCst)
    }

    /// Reserves room for one row a claim inserts already leased to this process and hands
    /// straight to the dispatcher, with no take: only when the lane hands over, has room in its
    /// window, and has no backlog in the outbox (a handed row would overtake it). The caller
    /// hands the row over, or gives the room back with [`Lane::taken`]`(1, 0)`.
    pub fn reserve_handover(&self) -> bool {
        if !self.hands_over() || self.backlog.load(Ordering::SeqCst) {
            return false;
        }
        let _turn = self.reserving.lock().unwrap_or_else(|e| e.into_inner());
        let busy = self.waiting.load(Ordering::SeqCst) + self.in_flight.load(Ordering::SeqCst);
        if busy >= 2 * self.target.config.concurrency as usize {
            return false;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.unsettled.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Gives back a handover reservation whose row was not queued (its claim did not store it).
    pub fn unreserve_handover(&self) {
        self.give_back(1);
    }

    /// Waits for a slot, then for the row's turn under `rate` (holding the slot, so the
    /// attempt starts the moment its turn comes), and counts it in flight. The slot is the
    /// attempt's until the permit is dropped, after [`Lane::finished`]. `book` books starts in
    /// the store's schedule of a paced lane (see [`Pace::start`]). `Err(after)`: the schedule
    /// is booked by other instances beyond what the row may wait; give it back, due in `after`.
    pub async fn start<F, B>(&self, book: B) -> Result<SemaphorePermit<'_>, Duration>
    where
        B: FnMut(u32) -> F,
        F: Future<Output = Result<Booked, String>>,
    {
        // The row waits no more once this returns, or is dropped (a stop gave the row back).
        let _waiting = Waiting(&self.waiting);
        let slot = self
            .slots
            .acquire()
            .await
            .expect("a lane's semaphore is never closed");
        if let Some(pace) = &self.pace {
            if let Turn::Later(after) = pace
                .start(&self.source, &self.target.config.name, book)
                .await
            {
                return Err(after);
            }
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Ok(slot)
    }

    /// An attempt ended (its outcome is not yet committed); its slot goes with `slot`.
    pub fn finished(&self, slot: SemaphorePermit<'_>) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        drop(slot);
    }

    /// `n` outcomes were committed, or failed to be (the rows' leases then run out).
    pub fn settled(&self, n: usize) {
        self.unsettled.fetch_sub(n, Ordering::SeqCst);
    }

    /// Rows taken whose outcome is not yet committed.
    pub fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::SeqCst)
    }

    /// Its pace, if it has a `rate`.
    pub fn pace(&self) -> Option<&Pace> {
        self.pace.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(extra: &str) -> Lane {
        let text = format!(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_test\"]\n\
             [sources.s.forward]\nurl = \"http://127.0.0.1:9/\"\n\
             secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n{extra}\n"
        );
        let config = crate::config::Config::parse(&text, &|_: &str| None).expect("a config");
        let forward = config.sources[0].forward[0].clone();
        Lane::new(
            "s".to_owned(),
            Arc::new(Target::new(forward).expect("a target")),
        )
    }

    /// The booking of a lane without `rate`, which never books.
    async fn unpaced(_: u32) -> Result<Booked, String> {
        unreachable!("a lane without a rate books nothing")
    }

    #[tokio::test]
    async fn a_busy_lane_takes_in_batches_of_at_least_half_its_slots() {
        let lane = lane("concurrency = 4");
        let want = lane.reserve().expect("an idle lane has room");
        assert_eq!(want.limit, 8, "as many rows again as slots");
        lane.taken(8, 8);
        assert!(lane.reserve().is_none(), "the window is full");
        let mut slots = Vec::new();
        for _ in 0..4 {
            slots.push(
                lane.start(unpaced)
                    .await
                    .expect("an unpaced lane always starts"),
            );
        }
        // One attempt ends: one row of room is not worth a take.
        lane.finished(slots.pop().expect("a slot"));
        lane.settled(1);
        assert!(lane.reserve().is_none(), "one row of room");
        lane.finished(slots.pop().expect("a slot"));
        lane.settled(1);
        let want = lane.reserve().expect("half the slots are free");
        assert_eq!(want.limit, 2);
    }

    #[test]
    fn claims_hand_over_only_once_a_take_has_caught_up_and_within_the_window() {
        let lane = lane("concurrency = 2");
        assert!(!lane.reserve_handover(), "a new lane may have a backlog");
        let want = lane.reserve().expect("room");
        lane.taken(usize::try_from(want.limit).expect("a count"), 1);
        // The take came back short: the outbox has nothing more due for this lane.
        assert!(lane.reserve_handover());
        assert!(lane.reserve_handover());
        assert!(lane.reserve_handover());
        assert!(
            !lane.reserve_handover(),
            "four rows (twice the slots) are taken"
        );
        lane.unreserve_handover();
        assert!(lane.reserve_handover(), "a row given back frees its room");
        lane.look_again();
        lane.unreserve_handover();
        assert!(!lane.reserve_handover(), "rows were queued the normal way");
    }

    #[test]
    fn a_poll_asks_for_a_small_take_and_claims_go_on_handing_over() {
        let lane = lane("concurrency = 8");
        let want = lane.reserve().expect("room");
        assert_eq!(want.limit, 16, "a backlog's take fills the window");
        lane.taken(usize::try_from(want.limit).expect("a count"), 0);
        assert!(!lane.worth_a_take(), "the outbox had nothing for it");
        lane.poll();
        assert!(lane.worth_a_take(), "a poll looks again");
        assert!(lane.reserve_handover(), "and claims still hand rows over");
        lane.unreserve_handover();
        let want = lane.reserve().expect("room");
        assert_eq!(
            want.limit, 2,
            "a poll's take asks for a quarter of concurrency"
        );
        let reserved = usize::try_from(want.limit).expect("a count");
        lane.taken(reserved, reserved);
        assert!(lane.worth_a_take(), "a full take may have left rows behind");
        // As if they had been sent and their outcomes written.
        lane.give_back(reserved);
        let want = lane.reserve().expect("room");
        lane.taken(usize::try_from(want.limit).expect("a count"), 0);
        assert!(!lane.worth_a_take(), "a short take found every due row");
    }

    #[test]
    fn an_ordered_lane_looks_again_when_the_rows_it_queued_settle() {
        let ordered = lane("ordered = true");
        let before = Instant::now();
        assert_eq!(ordered.settle_look(before), None, "nothing queued yet");
        ordered.look_again();
        ordered.look_again();
        let after = Instant::now();
        let at = ordered.settle_look(after).expect("a look to come");
        assert!(at >= before + ORDER_SETTLE, "not before the rows settle");
        assert!(
            at <= after + ORDER_SETTLE + SETTLE_GRAIN,
            "within a grain of it"
        );
        // Rows queued a grain later are looked for in a look of their own, after the first.
        let later = at + SETTLE_GRAIN * 2 - ORDER_SETTLE;
        ordered.look_when_settled(later);
        assert_eq!(
            ordered.settle_look(at),
            Some(at),
            "the first look is due at its time"
        );
        let next = ordered.settle_look(at).expect("the later rows' look");
        assert!(next >= later + ORDER_SETTLE, "{next:?}");
        assert_eq!(ordered.settle_look(next), Some(next));
        assert_eq!(ordered.settle_look(next), None, "every look is done with");
        let unordered = lane("concurrency = 2");
        unordered.look_again();
        assert_eq!(
            unordered.settle_look(Instant::now()),
            None,
            "only an ordered lane waits for its rows to settle"
        );
    }

    #[test]
    fn ordered_and_paced_lanes_never_hand_over() {
        for extra in ["ordered = true", "rate = \"5/s\""] {
            let lane = lane(extra);
            let want = lane.reserve().expect("room");
            lane.taken(usize::try_from(want.limit).expect("a count"), 0);
            assert!(!lane.reserve_handover(), "{extra}");
        }
    }
}
