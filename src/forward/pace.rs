//! `rate = "N/s"` or `"N/m"`: a target's attempts spread evenly, at most N started in any
//! sliding window of a second (or a minute), across every instance sharing the store.
//!
//! The schedule is the store's (`db::paces`): an attempt ready to start books its moment there,
//! one `per / N` after the last start any instance booked, and starts then. A process books for
//! the attempts of the target waiting for their turn at once (one statement for a batch, up
//! to half the reach's worth, so that instances sharing the target take turns), and keeps
//! what it booked in order; waiters go in turn (tokio's mutex is fair), each holding the
//! gate while it waits for its moment. Its own moments are an interval apart (a start waits
//! for the later of its moment and an interval after the last one started at), and a start
//! woken late does not push the next back; a moment missed by half an interval (a busy
//! machine, before or while it waits) is dropped and another booked, so a dispatcher that
//! falls behind never makes up for lost time by starting several at once. Across instances, each start falls in the first half of an interval of the
//! schedule of its own: any window of the rate's length holds N of them, N + 1 at most where
//! one started late at its edge, and two starts are never closer than half an interval (so
//! what the downstream sees stays within N + 1 unless the network shifts an arrival by that
//! much).
//!
//! Instances that keep booking the schedule at different intervals (different `rate`s for the
//! target) warn of it, once each (`Pace::heard`).
//!
//! A booking reaches at most [`Pace::reach`] ahead: a row waits for its turn under its lease,
//! which allows that long. When other instances have booked the schedule beyond it, the row
//! is given back, due when the schedule has room again ([`Turn::Later`]).
//!
//! Should the store not answer a booking (or the target's row stay locked past
//! `db::paces`' short lock wait), no attempt of the target starts in this process: it books
//! again every [`RETRY_BOOKING_AFTER`] until the store answers, with one WARN as that begins and
//! an INFO as it ends. Pacing alone meanwhile would let each instance start up to N per window
//! (two instances, one stopped while it held the target's row, made 40 a second of a rate of
//! 20); a target is paced to protect its downstream, and waiting costs a delivery only time. An
//! instance stopped in the middle of a booking holds the row for `db::paces`' idle limit at
//! most: the server then ends its session.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::Rate;
use crate::db::paces::Booked;

/// How far ahead a paced target's rows are taken: as many as may start within this, so rows
/// wait in memory under their lease for a bounded time.
pub const HORIZON: Duration = Duration::from_secs(1);

/// The pace of one target, shared by every runner of the process.
pub struct Pace {
    /// The least time between two starts: the window over N.
    interval: Duration,
    /// What this process booked and has not started, in order, and when it last started one.
    booked: Mutex<Gate>,
    /// Attempts in [`Pace::start`] (those waiting for the gate included): how many to book.
    waiting: AtomicUsize,
}

#[derive(Default)]
struct Gate {
    moments: VecDeque<Moment>,
    /// The moment this process last started an attempt at: its own moments are an interval
    /// apart (each start comes within its slack after its moment).
    last: Option<Instant>,
    /// Whether the last booking failed (logged once, until one works again).
    failing: bool,
    /// Bookings that found the schedule last booked at another interval, while they go on.
    disagreement: Option<Disagreement>,
}

/// Bookings of this process that found the target's schedule last booked by an instance with
/// another interval (another `rate`).
#[derive(Debug, Clone, Copy)]
struct Disagreement {
    /// When the last of them was made.
    last: Instant,
    /// How many, since the first (the second is logged).
    seen: u32,
}

/// How long after the last booking that found another interval the instances are taken to
/// agree again (another booking that finds one warns again).
const AGREED_AFTER: Duration = Duration::from_secs(30);

/// When an attempt may start: from `at`, and before `until` (after which the moment is
/// another's to take).
#[derive(Debug, Clone, Copy)]
struct Moment {
    at: Instant,
    until: Instant,
}

/// What [`Pace::book`] gives.
enum Booking {
    /// The moment to start at.
    Moment(Moment),
    /// Give the row back, due in this long: the schedule is booked beyond reach.
    Later(Duration),
    /// Book again: the moments booked are known too roughly to be kept, or already missed.
    Again,
    /// The booking failed: wait a while and book again.
    Failed,
}

/// One attempt counted in a `waiting` count until dropped, however its wait ends.
pub(super) struct Waiting<'a>(pub(super) &'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The least a start may come after its booked moment, and the least a booking's answer may
/// take before its moments are too rough to keep: half an interval, but never under this. A
/// booking knows its moments only as closely as the store's answer takes to come (a round
/// trip), and a timer wakes within a millisecond or so; at a fast rate half an interval is
/// less than either, and no booking could ever be kept (a target at 5000/s started nothing,
/// found by a black-box run). So up to 100/s a window of the rate's length holds N + 1 starts
/// at most, as before; faster, N and the starts of 6 ms more (a start may also come a timer's
/// grain early there, see [`Pace::grain`]): N + 6 at 1000/s.
const LEAST_SLACK: Duration = Duration::from_millis(5);

/// What a timer's wait is rounded up to (tokio's timer wheel ticks each millisecond).
const TIMER_GRAIN: Duration = Duration::from_millis(1);

/// After a booking failed, how long this process waits before it books again.
pub const RETRY_BOOKING_AFTER: Duration = Duration::from_millis(250);

/// What an attempt is to do, once [`Pace::start`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Start now.
    Now,
    /// The target's schedule is booked (by other instances) beyond what the row may wait
    /// under its lease: give it back, due in this long.
    Later(Duration),
}

impl Pace {
    /// The pace of `rate`.
    pub fn new(rate: Rate) -> Pace {
        Pace {
            interval: rate.per / rate.count.max(1),
            booked: Mutex::new(Gate::default()),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The least time between two starts.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How late after its moment a start may come: half an interval, or [`LEAST_SLACK`].
    fn slack(&self) -> Duration {
        (self.interval / 2).max(LEAST_SLACK)
    }

    /// How early before its moment a start may come: none, but at a fast rate (an interval
    /// under [`LEAST_SLACK`]) a timer's grain, since a timer wakes on a millisecond's grain and
    /// cannot wait out a shorter interval: every start would wait for the next millisecond,
    /// and a rate of 100000/s would start a thousand a second.
    fn grain(&self) -> Duration {
        if self.interval < LEAST_SLACK {
            TIMER_GRAIN
        } else {
            Duration::ZERO
        }
    }

    /// The furthest ahead a booking reaches: a row taken waits at most this for its turn, and
    /// as long again for the gate (the attempts ahead of it waiting for theirs).
    pub fn reach(&self) -> Duration {
        HORIZON.max(self.interval)
    }

    /// Waits for this attempt's turn; returns as it starts, or says to give the row back.
    /// `book(want)` books up to `want` starts in the store's schedule (`db::paces::book`, with
    /// this pace's interval and reach).
    pub async fn start<F, B>(&self, source: &str, target: &str, mut book: B) -> Turn
    where
        B: FnMut(u32) -> F,
        F: Future<Output = Result<Booked, String>>,
    {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // It waits no more once this returns, or is dropped (a stop gave its row back).
        let _waiting = Waiting(&self.waiting);
        let mut booked = self.booked.lock().await;
        // Whether a booking whose moments were known too roughly to keep was made already.
        let mut rough = false;
        let turn = loop {
            let turn = match self.next_booked(&mut booked) {
                Some(moment) => moment,
                None => match self
                    .book(&mut booked, source, target, &mut book, rough)
                    .await
                {
                    Booking::Moment(moment) => moment,
                    Booking::Later(after) => break Turn::Later(after),
                    Booking::Again => {
                        rough = true;
                        continue;
                    }
                    Booking::Failed => {
                        tokio::time::sleep(RETRY_BOOKING_AFTER).await;
                        // Afresh: a database slow before the pause may not be after it.
                        rough = false;
                        continue;
                    }
                },
            };
            if turn.at > Instant::now() + self.grain() {
                tokio::time::sleep_until(turn.at).await;
            }
            // Woken too late (the machine was busy, or the process stopped a while): the
            // moment is not this process's any more, as another instance's may be near.
            if Instant::now() < turn.until {
                // The moment, not the wake-up: a timer wakes a millisecond or so late, and
                // spacing the next start from the wake-up slipped each start by that much
                // until a moment fell outside its slack and went unused (`100/s` delivered
                // about 80 a second, found by a black-box run).
                booked.last = Some(turn.at);
                break Turn::Now;
            }
        };
        turn
    }

    /// Books moments for the attempts waiting, and gives the first, or says the booking
    /// `Failed` (the caller waits and books again).
    /// A booking whose answer took half an interval or more (the process stopped a while, or
    /// the database was slow) knows its moments only that roughly, too roughly to start in
    /// the first half of their intervals: it is dropped and booked `Again`, once; a second such
    /// booking (`rough`: the database is that slow at this rate) is kept, its moments counted
    /// from its answer, and should those be missed too, it says `Failed`: the caller pauses
    /// and books afresh, and nothing starts off the schedule.
    async fn book<F, B>(
        &self,
        booked: &mut Gate,
        source: &str,
        target: &str,
        book: &mut B,
        rough: bool,
    ) -> Booking
    where
        B: FnMut(u32) -> F,
        F: Future<Output = Result<Booked, String>>,
    {
        // Half the reach's worth at a time at most: one instance with many rows waiting never
        // books the whole reach ahead alone, so another sharing the target finds room within
        // its own reach at each of its bookings, and the two take turns. Booking all it had
        // waiting, one instance took 19 moments of 20, and the other's rows, getting one
        // moment a booking, waited 15 s and went back (found by a black-box run).
        let fair = self.waiting.load(Ordering::SeqCst).min(self.queue() / 2);
        let want = u32::try_from(fair).unwrap_or(u32::MAX);
        let got = match book(want.max(1)).await {
            Ok(got) => got,
            Err(e) => {
                // Logged as it starts failing, not at every try.
                if !std::mem::replace(&mut booked.failing, true) {
                    tracing::warn!(
                        source, target, error = %e,
                        "cannot book this target's starts in the store; none starts here \
                         until a booking works (tried again every {} ms), so that the rate \
                         holds across instances",
                        RETRY_BOOKING_AFTER.as_millis()
                    );
                }
                return Booking::Failed;
            }
        };
        if std::mem::take(&mut booked.failing) {
            tracing::info!(
                source,
                target,
                "booking this target's starts in the store again: its attempts go on at its rate"
            );
        }
        self.heard(booked, source, target, got.other_interval);
        if got.count == 0 {
            // Due when the schedule has room again within reach of a take then.
            let after = got.first_in.saturating_sub(self.reach());
            return Booking::Later(after.max(self.interval));
        }
        // Not before the moment counted from the answer (never early), and only within the
        // slack (half an interval, or 5 ms at a fast rate) of it counted from the question.
        let (as_of, sent) = (Instant::from_std(got.as_of), Instant::from_std(got.sent));
        let slack = self.slack();
        if as_of.saturating_duration_since(sent) >= slack && !rough {
            return Booking::Again;
        }
        // A rough booking may start later, but always less than an interval after its moment
        // (counted from the question, where the moment is earliest here; at a fast rate, the
        // least slack): so a window of the rate's length never holds more than one start beyond
        // the rate (or the least slack's worth). One answered later than that cannot be kept.
        let late = if rough {
            self.interval
                .saturating_sub(Duration::from_micros(1))
                .max(LEAST_SLACK)
        } else {
            slack
        };
        booked.moments.extend((0..got.count).map(|i| Moment {
            at: as_of + got.first_in + self.interval * i,
            until: sent + got.first_in + self.interval * i + late,
        }));
        match self.next_booked(booked) {
            Some(moment) => Booking::Moment(moment),
            // Missed already (this task waited for a thread that long).
            None if !rough => Booking::Again,
            // Twice: the database (or this process) is too slow at this rate for a booked
            // moment to be kept. Nothing starts without one, since a start off the schedule
            // may come right beside another instance's: book again after a pause.
            None => Booking::Failed,
        }
    }

    /// Notes what a booking found of the interval the schedule was booked at before it: a
    /// second booking of this process's (within [`AGREED_AFTER`] of the last such) that
    /// finds another interval than this one's warns, once, that the instances sharing the
    /// store disagree on the target's `rate`. Not the first: after a restart with a new `rate`,
    /// the first booking finds the old process's interval, and the next its own.
    fn heard(&self, gate: &mut Gate, source: &str, target: &str, other: Option<Duration>) {
        let now = Instant::now();
        let going_on = gate.disagreement.filter(|d| now < d.last + AGREED_AFTER);
        let Some(other) = other else {
            gate.disagreement = going_on;
            return;
        };
        let mut disagreement = going_on.unwrap_or(Disagreement { last: now, seen: 0 });
        disagreement.last = now;
        disagreement.seen = disagreement.seen.saturating_add(1);
        if disagreement.seen == 2 {
            tracing::warn!(
                source,
                target,
                this_instance = ?self.interval,
                another_instance = ?other,
                "instances sharing the database pace this target at different rates (the \
                 least time between two starts is shown for each); each books its starts at \
                 its own, so the pace follows whichever booked last. Give every instance the \
                 same `rate` for this target (expected for a while during a rolling change of it)"
            );
        }
        gate.disagreement = Some(disagreement);
    }

    /// When to start on the next moment booked that is still this process's to use: the
    /// moment itself, or an interval after the moment of this process's last start if that is
    /// later (so its own moments are never closer than an interval). A moment that would be started its slack
    /// late or more is dropped (the next moment, perhaps another instance's, is an interval
    /// after it).
    fn next_booked(&self, booked: &mut Gate) -> Option<Moment> {
        let now = Instant::now();
        while let Some(moment) = booked.moments.pop_front() {
            let at = booked
                .last
                .map_or(moment.at, |last| moment.at.max(last + self.interval));
            if at.max(now) < moment.until {
                return Some(Moment {
                    at,
                    until: moment.until,
                });
            }
        }
        None
    }

    /// How many taken rows may wait for their turn at once: those that can start within
    /// [`HORIZON`], and at least one.
    pub fn queue(&self) -> usize {
        let per_horizon = HORIZON.as_nanos() / self.interval.as_nanos().max(1);
        usize::try_from(per_horizon).unwrap_or(usize::MAX).max(1)
    }

    /// The longest a row taken within [`Pace::queue`] waits for its turn: for the gate (the
    /// rows ahead of it, each booked within reach), then for its own moment.
    pub fn longest_wait(&self) -> Duration {
        2 * self.reach() + self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::paces;

    /// A schedule in memory, shared as the store's would be, booked by the store's own
    /// arithmetic ([`paces::plan`]): free from `next`, in microseconds since `base`, last
    /// booked at `last_interval`.
    struct Schedule {
        base: Instant,
        booked: std::sync::Mutex<Free>,
        interval: Duration,
        reach: i64,
    }

    /// Where the in-memory schedule is free from, and the interval it was last booked at.
    #[derive(Default)]
    struct Free {
        next: i64,
        last_interval: i64,
    }

    impl Schedule {
        fn new(pace: &Pace) -> Schedule {
            Schedule {
                base: Instant::now(),
                booked: Default::default(),
                interval: pace.interval(),
                reach: paces::micros(pace.reach()),
            }
        }

        async fn book(&self, want: u32) -> Result<Booked, String> {
            self.book_as(want, self.interval).await
        }

        /// A booking of an instance whose starts are `interval` apart.
        /// [`Schedule::book`], answered 60 ms after the question when `late` (the process
        /// stopped, or the database was slow, in between): where in those 60 ms the schedule
        /// was read, the booking cannot tell.
        async fn book_answered_late(&self, want: u32, late: bool) -> Result<Booked, String> {
            let sent = std::time::Instant::now();
            let mut got = self.book(want).await?;
            if late {
                std::thread::sleep(Duration::from_millis(60));
                got.sent = sent;
                got.as_of = std::time::Instant::now();
            }
            Ok(got)
        }

        async fn book_as(&self, want: u32, interval: Duration) -> Result<Booked, String> {
            let mut booked = self.booked.lock().unwrap();
            let at = Instant::now();
            let now = paces::micros(at - self.base);
            let interval = paces::micros(interval);
            let (first, count, after) = paces::plan(booked.next, now, want, interval, self.reach);
            let last_interval = std::mem::replace(&mut booked.last_interval, interval);
            booked.next = after;
            Ok(Booked {
                count,
                first_in: Duration::from_micros(u64::try_from(first - now).unwrap()),
                as_of: at.into_std(),
                sent: at.into_std(),
                other_interval: (last_interval > 0 && last_interval != interval)
                    .then(|| Duration::from_micros(last_interval.unsigned_abs())),
            })
        }

        /// Where the schedule is free from.
        fn next(&self) -> Instant {
            let next = self.booked.lock().unwrap().next;
            self.base + Duration::from_micros(u64::try_from(next).unwrap())
        }

        /// Books the schedule up to `at`, as another instance would.
        fn book_until(&self, at: Instant) {
            self.booked.lock().unwrap().next = paces::micros(at - self.base);
        }
    }

    /// Sorted starts keep to moments an interval apart: each comes at its moment or within its
    /// slack after it (a timer wakes late, which the next does not make up), so the `i`th is
    /// at least `i` intervals after the first, less the slack, and no two are closer than an
    /// interval less the slack (half an interval up to 100/s; faster, the 5 ms least slack).
    fn assert_spread(starts: &mut [Duration], pace: &Pace) {
        let (interval, slack) = (pace.interval(), pace.slack());
        starts.sort();
        for pair in starts.windows(2) {
            // Read just after each start, so a hair later than the gate did.
            assert!(
                pair[1] - pair[0] >= interval.saturating_sub(slack),
                "{starts:?}"
            );
        }
        for (i, start) in starts.iter().enumerate() {
            let moments = interval * u32::try_from(i).expect("a few starts");
            assert!(
                *start + slack >= starts[0] + moments,
                "start {i} before its moment: {starts:?}"
            );
        }
    }

    #[tokio::test]
    async fn starts_are_spread_a_window_over_n_apart_even_when_asked_at_once() {
        let pace = Pace::new("200/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let begin = Instant::now();
        let mut starts = futures_util::future::join_all((0..21).map(|_| async {
            let turn = pace.start("s", "t", |want| schedule.book(want)).await;
            assert_eq!(turn, Turn::Now);
            Instant::now() - begin
        }))
        .await;
        assert_spread(&mut starts, &pace);
        assert!(starts[20] >= Duration::from_millis(100), "{starts:?}");
        assert_eq!(pace.queue(), 200);
    }

    #[tokio::test]
    async fn two_processes_booking_one_schedule_keep_one_pace_between_them() {
        // Two processes' paces, one store's schedule: together, 100/s.
        let (one, two) = (
            Pace::new("100/s".parse().expect("a rate")),
            Pace::new("100/s".parse().expect("a rate")),
        );
        let schedule = Schedule::new(&one);
        let begin = Instant::now();
        let mut starts = futures_util::future::join_all((0..30).map(|i| {
            let (pace, schedule) = (if i % 2 == 0 { &one } else { &two }, &schedule);
            async move {
                let turn = pace.start("s", "t", |want| schedule.book(want)).await;
                assert_eq!(turn, Turn::Now);
                Instant::now() - begin
            }
        }))
        .await;
        starts.sort();
        // Each process's own starts are an interval apart; between the two, each start has an
        // interval of the schedule to itself, so any 100 ms holds ten, or eleven where one
        // started late at its edge.
        for (i, start) in starts.iter().enumerate() {
            let in_window = starts[i..]
                .iter()
                .take_while(|at| **at - *start < Duration::from_millis(100))
                .count();
            assert!(in_window <= 11, "{in_window} from start {i}: {starts:?}");
        }
        assert!(starts[29] >= Duration::from_millis(285), "{starts:?}");
    }

    #[tokio::test]
    async fn an_instance_with_a_few_rows_waiting_is_not_starved_by_one_with_many() {
        // Two processes pace one target at 50/s. The first has 60 rows waiting, more than the
        // reach holds (51), and books first; the second has 10. Booking all it had, the first
        // filled the reach, and the second found no room: its rows went back, and under a
        // steady load got a moment a booking. Each now books at most half the reach at a time.
        let many: &'static Pace = Box::leak(Box::new(Pace::new("50/s".parse().expect("a rate"))));
        let few: &'static Pace = Box::leak(Box::new(Pace::new("50/s".parse().expect("a rate"))));
        let schedule: &'static Schedule = Box::leak(Box::new(Schedule::new(many)));
        let begin = Instant::now();
        let start = |pace: &'static Pace| async move {
            let turn = pace.start("s", "t", |want| schedule.book(want)).await;
            (turn, Instant::now() - begin)
        };
        // All 60 of the first process's rows wait for its gate before its first booking.
        let gate = many.booked.lock().await;
        let many_starts = futures_util::future::join_all((0..60).map(|_| start(many)));
        tokio::pin!(many_starts);
        tokio::select! {
            biased;
            _ = &mut many_starts => unreachable!("the gate is held"),
            () = std::future::ready(()) => {}
        }
        drop(gate);
        let (many_starts, few_starts) = tokio::join!(
            many_starts,
            futures_util::future::join_all((0..10).map(|_| start(few))),
        );
        assert!(
            few_starts.iter().all(|(turn, _)| *turn == Turn::Now),
            "the second instance's rows found no room: {few_starts:?}"
        );
        // Its rows start among the first's, not after all of them: the two take turns (about
        // 1.2 s for the last of the ten on a quiet machine). Told by order rather than by
        // time, which a busy machine stretches for both alike.
        let last_of_few = few_starts.iter().map(|(_, at)| *at).max().expect("ten");
        let last_of_many = many_starts.iter().map(|(_, at)| *at).max().expect("sixty");
        assert!(
            last_of_few < last_of_many,
            "{last_of_few:?}, after the first's last start at {last_of_many:?}"
        );
        // Together, still the one pace: no second holds more than 51 starts.
        let mut all: Vec<Duration> = many_starts
            .iter()
            .chain(&few_starts)
            .filter(|(turn, _)| *turn == Turn::Now)
            .map(|(_, at)| *at)
            .collect();
        all.sort();
        for (i, at) in all.iter().enumerate() {
            let in_window = all[i..]
                .iter()
                .take_while(|later| **later - *at < Duration::from_secs(1))
                .count();
            assert!(in_window <= 51, "{in_window} from start {i}: {all:?}");
        }
    }

    #[tokio::test]
    async fn a_moment_woken_for_a_whole_interval_late_is_given_up_and_another_booked() {
        let pace = Pace::new("20/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let begin = Instant::now();
        schedule.book_until(begin + Duration::from_millis(100));
        let bookings = std::sync::atomic::AtomicU32::new(0);
        let book = |want| {
            bookings.fetch_add(1, Ordering::SeqCst);
            schedule.book(want)
        };
        // The thread is held (as a busy machine or a stopped process would) from 20 ms to
        // 220 ms: the pace wakes 70 ms after its moment's interval ended.
        let held = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            std::thread::sleep(Duration::from_millis(200));
        };
        let (turn, ()) = tokio::join!(pace.start("s", "t", book), held);
        assert_eq!(turn, Turn::Now);
        assert_eq!(
            bookings.load(Ordering::SeqCst),
            2,
            "the late moment was booked again"
        );
        let started = Instant::now() - begin;
        assert!(started >= Duration::from_millis(220), "{started:?}");
        assert!(
            schedule.next() >= begin + Duration::from_millis(270),
            "the second booking's moment is now, not the one missed"
        );
    }

    #[tokio::test]
    async fn a_start_woken_late_does_not_push_the_next_back() {
        // A timer wakes a millisecond or so late; spacing each start from the one before's
        // wake-up slipped every start by that much, and `100/s` started about 80 a second.
        // Here the thread is held from well before the first moment (80 ms) to 110 ms, so the
        // first start comes about 30 ms late (of a 50 ms slack); the second must still come at
        // its own moment (180 ms), not 100 ms after the late start (210 ms).
        let pace = Pace::new("10/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let begin = Instant::now();
        schedule.book_until(begin + Duration::from_millis(80));
        let held = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            std::thread::sleep(Duration::from_millis(100));
        };
        let starts = async {
            futures_util::future::join_all((0..2).map(|_| async {
                let turn = pace.start("s", "t", |want| schedule.book(want)).await;
                assert_eq!(turn, Turn::Now);
                Instant::now() - begin
            }))
            .await
        };
        let (mut starts, ()) = tokio::join!(starts, held);
        starts.sort();
        assert!(starts[0] >= Duration::from_millis(105), "late: {starts:?}");
        assert!(
            starts[1] >= Duration::from_millis(175),
            "not before its moment: {starts:?}"
        );
        assert!(
            starts[1] - starts[0] < Duration::from_millis(92),
            "the second start came at its moment: {starts:?}"
        );
    }

    #[tokio::test]
    async fn a_fast_rate_starts_at_its_rate_though_each_booking_takes_a_round_trip() {
        // At 5000/s an interval is 200 µs: a booking answered 1 ms after it was asked (a
        // database on another host) could never be kept within half of one, and nothing
        // started. With the least slack it starts as fast as asked, and never faster.
        for rate in ["5000/s", "100000/s"] {
            let pace = Pace::new(rate.parse().expect("a rate"));
            let schedule = &Schedule::new(&pace);
            let book = move |want| async move {
                let sent = std::time::Instant::now();
                let mut got = schedule.book(want).await?;
                tokio::time::sleep(Duration::from_millis(1)).await;
                got.sent = sent;
                got.as_of = std::time::Instant::now();
                Ok::<_, String>(got)
            };
            let begin = Instant::now();
            let turns =
                futures_util::future::join_all((0..200).map(|_| pace.start("s", "t", book))).await;
            assert!(
                turns.iter().all(|turn| *turn == Turn::Now),
                "{rate}: {turns:?}"
            );
            let took = begin.elapsed();
            // 200 starts at 5000/s take 40 ms (at 100000/s, 2 ms); a booking at a time, each
            // a round trip, adds some.
            assert!(took < Duration::from_millis(500), "{rate}: {took:?}");
            assert!(
                took + TIMER_GRAIN + LEAST_SLACK >= pace.interval() * 199,
                "{rate}: never faster than the rate and its grain: {took:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_booking_answered_half_an_interval_late_is_booked_again() {
        let pace = Pace::new("20/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let bookings = std::sync::atomic::AtomicU32::new(0);
        // The first answer comes 60 ms late, more than half the 50 ms interval.
        let book = |want| {
            let first = bookings.fetch_add(1, Ordering::SeqCst) == 0;
            schedule.book_answered_late(want, first)
        };
        let begin = Instant::now();
        assert_eq!(pace.start("s", "t", book).await, Turn::Now);
        assert_eq!(
            bookings.load(Ordering::SeqCst),
            2,
            "the rough booking was made again"
        );
        // The second booking's moment came after the stall, the first's going unused.
        assert!(
            schedule.next() >= begin + Duration::from_millis(110),
            "booked twice, the second from after the stall"
        );
    }

    #[tokio::test]
    async fn bookings_answered_an_interval_late_twice_start_nothing_until_one_is_prompt() {
        let pace = Pace::new("20/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let bookings = std::sync::atomic::AtomicU32::new(0);
        // The first two answers come 60 ms late, more than the 50 ms interval: where the
        // moment falls in that time cannot be told closely enough to keep it.
        let book = |want| {
            let slow = bookings.fetch_add(1, Ordering::SeqCst) < 2;
            schedule.book_answered_late(want, slow)
        };
        let begin = Instant::now();
        assert_eq!(pace.start("s", "t", book).await, Turn::Now);
        assert_eq!(
            bookings.load(Ordering::SeqCst),
            3,
            "neither slow booking was started on; the third, prompt, was"
        );
        assert!(
            begin.elapsed() >= RETRY_BOOKING_AFTER,
            "it paused before booking afresh: {:?}",
            begin.elapsed()
        );
    }

    #[tokio::test]
    async fn a_schedule_booked_beyond_reach_gives_the_row_back_for_when_it_has_room() {
        let pace = Pace::new("10/s".parse().expect("a rate"));
        let turn = pace
            .start("s", "t", |_| async {
                Ok(Booked {
                    count: 0,
                    first_in: Duration::from_millis(3000),
                    as_of: std::time::Instant::now(),
                    sent: std::time::Instant::now(),
                    other_interval: None,
                })
            })
            .await;
        assert_eq!(turn, Turn::Later(Duration::from_millis(2000)));
    }

    /// Whether `pace` warned that the instances disagree on its target's rate.
    async fn warned(pace: &Pace) -> bool {
        pace.booked
            .lock()
            .await
            .disagreement
            .is_some_and(|d| d.seen >= 2)
    }

    #[tokio::test]
    async fn instances_booking_one_schedule_at_different_rates_are_warned_of() {
        // 100/s here, 50/s at the other instance: each finds the schedule last booked at the
        // other's interval.
        let pace = Pace::new("100/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        let other = Duration::from_millis(20);
        schedule.book_as(1, other).await.unwrap();
        assert_eq!(pace.start("s", "t", |w| schedule.book(w)).await, Turn::Now);
        assert!(
            !warned(&pace).await,
            "not at the first booking that finds it"
        );
        schedule.book_as(1, other).await.unwrap();
        assert_eq!(pace.start("s", "t", |w| schedule.book(w)).await, Turn::Now);
        assert!(warned(&pace).await, "at the second");
    }

    #[tokio::test]
    async fn a_restart_with_a_new_rate_is_not_taken_for_a_disagreement() {
        // The schedule was last booked by this instance's predecessor at 50/s; it runs at
        // 100/s, alone: its first booking finds the old interval, every one after its own.
        let pace = Pace::new("100/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        schedule
            .book_as(1, Duration::from_millis(20))
            .await
            .unwrap();
        for _ in 0..5 {
            assert_eq!(pace.start("s", "t", |w| schedule.book(w)).await, Turn::Now);
        }
        assert!(!warned(&pace).await);
    }

    #[tokio::test]
    async fn without_the_store_nothing_starts_until_a_booking_works() {
        let pace = Pace::new("100/s".parse().expect("a rate"));
        let schedule = Schedule::new(&pace);
        // The store fails the first two bookings, then answers.
        let failures = std::sync::atomic::AtomicU32::new(0);
        let begin = Instant::now();
        let mut starts = futures_util::future::join_all((0..5).map(|_| async {
            let turn = pace
                .start("s", "t", |want| {
                    let (failures, schedule) = (&failures, &schedule);
                    async move {
                        if failures.fetch_add(1, Ordering::SeqCst) < 2 {
                            Err("no store".to_owned())
                        } else {
                            schedule.book(want).await
                        }
                    }
                })
                .await;
            assert_eq!(turn, Turn::Now);
            Instant::now() - begin
        }))
        .await;
        assert!(
            starts.iter().all(|s| *s >= RETRY_BOOKING_AFTER * 2),
            "none before the third booking: {starts:?}"
        );
        assert_spread(&mut starts, &pace);
        assert!(!pace.booked.lock().await.failing, "booking works again");
    }

    #[test]
    fn a_slow_rate_queues_one_row_and_waits_up_to_its_interval() {
        let pace = Pace::new("2/m".parse().expect("a rate"));
        assert_eq!(pace.queue(), 1);
        assert_eq!(pace.reach(), Duration::from_secs(30));
        assert!(pace.longest_wait() >= Duration::from_secs(90));
    }
}
