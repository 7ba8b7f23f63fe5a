//! The owner of the `paces` table: one schedule per paced forward target (`rate`), shared by
//! every instance on the store, so that a target's rate holds across all of them and not per
//! process.
//!
//! A target's row holds `next_start`, the moment from which its next attempt may start
//! (microseconds since the Unix epoch). An instance with attempts waiting for their turn books
//! starts for them ([`book`]): in one transaction it locks the row, takes as many starts as it
//! wants from there on, one `interval` apart, and moves `next_start` past them. It then starts
//! each attempt at its moment. Starts booked by different instances never fall within an
//! interval of each other; the interval is the pace's (`forward::pace`), a little over the
//! rate's window over N, so that a start that comes a little late still leaves N in any window.
//!
//! A booking knows where its moments fall on the caller's clock only as closely as its read's
//! round trip: the schedule was read somewhere between the statement's sending and its answer.
//! The caller counts its moments from the answer (never early), so each may be up to that round
//! trip late on the schedule; the booking therefore leaves the schedule free for as long after
//! its last start ([`plan`]'s `answered_in`), and a start of the next booking never comes
//! closer to it than an interval. It also books its first start no sooner than two such round
//! trips ahead (the update and the commit are still to come), so that a database far away
//! (a round trip of 12 ms once left a target at `100/s` with every moment missed before the
//! booking was back, and nothing sent) still gets moments it can keep. A read answered later
//! than the caller's `widest` books nothing ([`Booked::too_slow`]): so long a gap would hold
//! every instance's starts up.
//!
//! Each booking also writes its interval (`interval_us`) and reads the one before it: an
//! instance whose `rate` for the target differs from the last booker's learns of it
//! ([`Booked::other_interval`]).
//!
//! A booking never takes a start further ahead than `within` (what a row may wait for its turn
//! under its lease): when other instances have booked the schedule beyond that, it takes none
//! and says when there will be room again, and the caller gives its rows back for then.
//!
//! On PostgreSQL a booking's commit does not wait for the disk (the row is locked until the
//! commit, and every booking of the target waits for it): a booking lost to a crash of the
//! database's machine only lets a few starts after it come early, once.
//!
//! On PostgreSQL the moments are on the database server's clock, read in the same statement, so
//! instances whose hosts' clocks differ still book one schedule; the caller turns "this long
//! from the read" into its own clock, knowing the read happened between the moment it sent
//! the statement and the moment the answer arrived (`Booked::sent`, `Booked::as_of`). On SQLite every process sharing the file
//! runs on one host, and the moments are that host's.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};

use super::{now, on_backend, write_transaction, AnyConnection};

/// A schedule further ahead than any booking could have taken it (more than `within` and an
/// interval past the moment it was made) by more than this is a clock that went back, or a
/// row left by another config: it starts again from now, rather than holding the target up.
const CLOCK_SLACK: Duration = Duration::from_secs(60);

/// How long a booking waits for the target's row on PostgreSQL, where another booking holds
/// it for a round trip or two: longer means that one's instance stopped mid-booking (the server
/// ends such a transaction after [`IDLE_LIMIT`]), and the booking fails; its instance books
/// again a moment later, rather than every booking queuing behind the stopped one.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// How long a booking's session may sit idle inside its transaction on PostgreSQL before the
/// server ends it (`idle_in_transaction_session_timeout`): a booking is two statements a round
/// trip apart, so only an instance stopped (or cut off) in the middle of one gets there, and
/// the target's row it holds is let go rather than holding every instance's attempts up.
const IDLE_LIMIT: Duration = Duration::from_secs(2);

/// What [`book`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    /// How many starts, one interval apart, the first of them [`Booked::first_in`] from now.
    /// None when the schedule is booked beyond `within`.
    pub count: u32,
    /// How long from [`Booked::as_of`] the first start booked is; when none was, how long
    /// until the first free one.
    pub first_in: Duration,
    /// When the answer to the statement that read the schedule arrived, on this process's
    /// clock: the read was no later, so a moment counted from here is never early.
    pub as_of: std::time::Instant,
    /// When that statement was sent: the read was no earlier. Far from `as_of` (the process
    /// stopped a while, or the database was slow), the moments are known only that roughly.
    pub sent: std::time::Instant,
    /// The interval of the instance that booked the schedule before this booking, when it
    /// differs from this one's: the instances sharing the store disagree on the target's
    /// `rate` (during a rolling change of it, or by mistake).
    pub other_interval: Option<Duration>,
    /// Whether the read was answered later than `widest` after it was sent, so that nothing
    /// was booked (`count` is 0): the caller books again.
    pub too_slow: bool,
}

#[derive(QueryableByName)]
struct Schedule {
    #[diesel(sql_type = BigInt)]
    next_start: i64,
    #[diesel(sql_type = BigInt)]
    now: i64,
    #[diesel(sql_type = BigInt)]
    interval_us: i64,
}

/// Books up to `want` starts of `source`'s target `target`, `interval` apart, none later than
/// `within` from now, after every start booked before (by any instance); none when the
/// schedule's read is answered later than `widest`.
pub fn book(
    conn: &mut AnyConnection,
    source: &str,
    target: &str,
    want: u32,
    interval: Duration,
    within: Duration,
    widest: Duration,
) -> QueryResult<Booked> {
    write_transaction(conn, |conn| {
        // Inserted the first time, locked (and read) every time: one booking at a time per
        // target, however many instances book.
        let mut sent = std::time::Instant::now();
        let schedule: Schedule = match conn {
            AnyConnection::Postgres(c) => {
                // One round trip: the commit does not wait for the disk, the lock is waited
                // for briefly (see `LOCK_WAIT`), and held for `IDLE_LIMIT` at most.
                c.batch_execute(&format!(
                    "SET LOCAL synchronous_commit = off; SET LOCAL lock_timeout = {}; \
                     SET LOCAL idle_in_transaction_session_timeout = {}",
                    LOCK_WAIT.as_millis(),
                    IDLE_LIMIT.as_millis()
                ))?;
                // The read's round trip, not the settings' before it.
                sent = std::time::Instant::now();
                diesel::sql_query(
                    "INSERT INTO paces (source, target, next_start) VALUES ($1, $2, 0) \
                     ON CONFLICT (source, target) DO UPDATE SET next_start = paces.next_start \
                     RETURNING next_start, interval_us, \
                     (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now",
                )
                .bind::<Text, _>(source)
                .bind::<Text, _>(target)
                .get_result(c)?
            }
            // The clock read as the statement goes, and the moment taken as it answers: at
            // most a round trip on this host apart.
            AnyConnection::Sqlite(c) => diesel::sql_query(
                "INSERT INTO paces (source, target, next_start) VALUES (?, ?, 0) \
                 ON CONFLICT (source, target) DO UPDATE SET next_start = paces.next_start \
                 RETURNING next_start, interval_us, ? AS now",
            )
            .bind::<Text, _>(source)
            .bind::<Text, _>(target)
            .bind::<BigInt, _>(now().timestamp_micros())
            .get_result(c)?,
        };
        let as_of = std::time::Instant::now();
        let answered_in = as_of.saturating_duration_since(sent);
        let interval = micros(interval);
        let other_interval = (schedule.interval_us > 0 && schedule.interval_us != interval)
            .then(|| Duration::from_micros(schedule.interval_us.unsigned_abs()));
        if answered_in > widest {
            // Nothing written: the transaction ends with the schedule as it was.
            return Ok(Booked {
                count: 0,
                first_in: Duration::ZERO,
                as_of,
                sent,
                other_interval,
                too_slow: true,
            });
        }
        let (first, count, next) = plan(
            schedule.next_start,
            schedule.now,
            want,
            interval,
            micros(within),
            micros(answered_in),
        );
        if count > 0 {
            on_backend!(conn, c => diesel::update(paces::table.find((source, target)))
                .set((paces::next_start.eq(next), paces::interval_us.eq(interval)))
                .execute(c))?;
        }
        Ok(Booked {
            count,
            first_in: Duration::from_micros(u64::try_from(first - schedule.now).unwrap_or(0)),
            as_of,
            sent,
            other_interval,
            too_slow: false,
        })
    })
}

pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1)
}

/// A booking on a schedule free from `next`, read at `now` by a statement answered in
/// `answered_in`: the first start, how many (`want`, but no more than half of those that fit
/// within `within`, rounded up), and where the schedule is free from after them (all in
/// microseconds). The first start is two `answered_in` ahead of `now` at the soonest,
/// and the schedule stays free for `answered_in` after the last (see the module's docs). The
/// pace's unit tests book through it too, from a schedule kept in memory.
pub(crate) fn plan(
    next: i64,
    now: i64,
    want: u32,
    interval: i64,
    within: i64,
    answered_in: i64,
) -> (i64, u32, i64) {
    let furthest = now
        .saturating_add(within)
        .saturating_add(interval)
        .saturating_add(micros(CLOCK_SLACK));
    let next = if next > furthest { now } else { next };
    let first = next.max(now.saturating_add(answered_in.saturating_mul(2)));
    let room = now.saturating_add(within) - first;
    if room < 0 {
        return (first, 0, next);
    }
    // Half of what is free within reach at most (rounded up): instances that book whenever
    // their moments run out otherwise fall into step, one of them always booking just after
    // another filled the reach, and it got one start a booking, about one a second of `20/s`
    // while two others shared the rest (found by a black-box run). Halving leaves room for the
    // next booker, whoever it is, and each gets its share; alone, an instance finds the reach
    // free and still books its whole `want`.
    let fits = u32::try_from(room / interval + 1).unwrap_or(u32::MAX);
    let count = want.min(fits.div_ceil(2));
    (
        first,
        count,
        first
            .saturating_add(interval.saturating_mul(i64::from(count)))
            .saturating_add(answered_in),
    )
}

#[cfg(test)]
mod tests {
    use super::plan;

    const MS: i64 = 1000;

    #[test]
    fn a_free_schedule_books_from_now_and_moves_past_what_it_booked() {
        // 20/s: 50 ms apart, within a second.
        assert_eq!(
            plan(0, 10_000 * MS, 4, 50 * MS, 1000 * MS, 0),
            (10_000 * MS, 4, 10_200 * MS)
        );
    }

    #[test]
    fn a_booking_comes_after_the_starts_booked_before_it() {
        assert_eq!(
            plan(10_300 * MS, 10_000 * MS, 2, 50 * MS, 1000 * MS, 0),
            (10_300 * MS, 2, 10_400 * MS)
        );
    }

    #[test]
    fn a_booking_takes_at_most_half_the_starts_free_within_its_reach() {
        // Free from 800 ms ahead: 800, 850, ..., 1000 ms are within a second; three of them.
        assert_eq!(
            plan(10_800 * MS, 10_000 * MS, 16, 50 * MS, 1000 * MS, 0),
            (10_800 * MS, 3, 10_950 * MS)
        );
        // Free now: 21 fit, 11 taken.
        assert_eq!(
            plan(0, 10_000 * MS, 16, 50 * MS, 1000 * MS, 0),
            (10_000 * MS, 11, 10_550 * MS)
        );
        // The last one free is taken.
        assert_eq!(
            plan(11_000 * MS, 10_000 * MS, 16, 50 * MS, 1000 * MS, 0),
            (11_000 * MS, 1, 11_050 * MS)
        );
    }

    #[test]
    fn a_schedule_booked_beyond_reach_books_nothing_and_says_when_it_frees() {
        let (first, count, next) = plan(11_500 * MS, 10_000 * MS, 3, 50 * MS, 1000 * MS, 0);
        assert_eq!((first, count, next), (11_500 * MS, 0, 11_500 * MS));
    }

    #[test]
    fn a_schedule_no_booking_could_have_made_starts_again_from_now() {
        // Ten minutes ahead, where bookings reach 1.05 s: the clock went back.
        assert_eq!(
            plan(610_000 * MS, 10_000 * MS, 1, 50 * MS, 1000 * MS, 0),
            (10_000 * MS, 1, 10_050 * MS)
        );
    }

    #[test]
    fn a_booking_answered_slowly_starts_two_answers_ahead_and_leaves_one_free_after() {
        // Read at 10 s, answered 12 ms after it was sent: the first start 24 ms ahead (the
        // update and the commit are still to come), and the schedule free 12 ms after the last
        // start's interval (where on the booker's clock its starts fall is known no closer).
        assert_eq!(
            plan(0, 10_000 * MS, 2, 10 * MS, 1000 * MS, 12 * MS),
            (10_024 * MS, 2, 10_056 * MS)
        );
        // A schedule booked further ahead than that is booked from where it is free.
        assert_eq!(
            plan(10_100 * MS, 10_000 * MS, 1, 10 * MS, 1000 * MS, 12 * MS),
            (10_100 * MS, 1, 10_122 * MS)
        );
    }

    #[test]
    fn a_slow_rate_books_one_start_an_interval_ahead() {
        // 2/m: 30 s apart, within 30 s.
        let s = 1_000_000;
        assert_eq!(
            plan(0, 100 * s, 3, 30 * s, 30 * s, 0),
            (100 * s, 1, 130 * s)
        );
        assert_eq!(
            plan(160 * s, 100 * s, 1, 30 * s, 30 * s, 0),
            (160 * s, 0, 160 * s)
        );
    }
}
