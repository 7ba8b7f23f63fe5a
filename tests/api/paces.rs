//! The schedule a paced target's instances share (`db::paces::book`), against the store itself:
//! bookings come one after another, never overlap, and never reach past what the booker asked.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use hookbox::db::paces::{self, Booked};
use hookbox::db::{self, AnyConnection};

use crate::helpers::*;

const MS: Duration = Duration::from_millis(1);

/// A migrated test database and a connection to it.
fn migrated() -> (TestDb, AnyConnection) {
    let db = TestDb::create();
    let mut conn = db.connect();
    db::migrate(&mut conn, |_| Ok(())).expect("the migrations apply");
    (db, conn)
}

/// Books `want` starts of the target `t`, `interval` apart, within `reach`.
fn book(conn: &mut AnyConnection, want: u32, interval: Duration, reach: Duration) -> Booked {
    paces::book(
        conn,
        "s",
        "t",
        want,
        interval,
        reach,
        Duration::from_millis(250),
    )
    .expect("a booking")
}

/// The target's `next_start`, in microseconds.
fn next_start(conn: &mut AnyConnection) -> i64 {
    #[derive(QueryableByName)]
    struct Next {
        #[diesel(sql_type = BigInt)]
        next_start: i64,
    }
    let next: Next = match conn {
        AnyConnection::Postgres(c) => {
            diesel::sql_query("SELECT next_start FROM paces").get_result(c)
        }
        AnyConnection::Sqlite(c) => diesel::sql_query("SELECT next_start FROM paces").get_result(c),
    }
    .expect("the schedule reads");
    next.next_start
}

#[test]
fn bookings_of_two_connections_follow_one_another_up_to_their_reach() {
    let (db, mut one) = migrated();
    let mut two = db.connect();
    let (interval, reach) = (50 * MS, 1000 * MS);

    let first = book(&mut one, 4, interval, reach);
    assert_eq!(first.count, 4);
    // The read's round trip: where in it the schedule was read, the booker cannot tell.
    let answered_in = first.as_of - first.sent;
    assert!(
        first.first_in <= 2 * answered_in + 2 * Duration::from_micros(1),
        "a free schedule starts two round trips from now (the update and the commit are still \
         to come): {first:?}"
    );

    let second = book(&mut two, 4, interval, reach);
    assert_eq!(second.count, 4, "{second:?}");
    assert!(
        second.first_in > 150 * MS && second.first_in <= 200 * MS + 3 * answered_in,
        "after the first booking's four starts, and the round trip after them: {second:?}"
    );

    // Free from 400 ms ahead (and the round trips left free after each booking): the starts
    // up to a second ahead fit, 400 ms to 1 s, 12 or 13; a booking takes half of those free
    // (rounded up), so that the next booker, whoever it is, finds room too.
    let third = book(&mut one, 20, interval, reach);
    assert!((6..=7).contains(&third.count), "{third:?}");

    // The next bookings follow, each an interval after the one before as closely as two
    // round trips tell, never beyond reach, until the reach is full.
    let mut before = third;
    let full = loop {
        let next = book(&mut two, 20, interval, reach);
        if next.count == 0 {
            break next;
        }
        let before_last = before.as_of + before.first_in + interval * (before.count - 1);
        let first = next.as_of + next.first_in;
        let known_to = (before.as_of - before.sent) + (next.as_of - next.sent);
        assert!(
            next.first_in + interval * (next.count - 1) <= reach
                && first + known_to >= before_last + interval,
            "booked beyond reach, or beside the booking before: {before:?} then {next:?}"
        );
        before = next;
    };
    assert!(
        full.first_in > reach,
        "says when the schedule has room: {full:?}"
    );
}

#[test]
fn a_booking_answered_later_than_the_widest_kept_books_nothing() {
    let (_db, mut conn) = migrated();
    let (interval, reach) = (50 * MS, 1000 * MS);
    book(&mut conn, 2, interval, reach);
    let before = next_start(&mut conn);
    // No answer comes within no time at all.
    let slow =
        paces::book(&mut conn, "s", "t", 4, interval, reach, Duration::ZERO).expect("a booking");
    assert!(slow.too_slow, "{slow:?}");
    assert_eq!(slow.count, 0, "{slow:?}");
    assert_eq!(next_start(&mut conn), before, "the schedule as it was");
}

#[test]
fn concurrent_bookings_never_take_the_same_start() {
    let (db, mut conn) = migrated();
    let (interval, reach) = (Duration::from_secs(1), Duration::from_secs(3600));
    book(&mut conn, 1, interval, reach);
    let from = next_start(&mut conn);
    // Four connections book 25 starts each, one at a time, all at once: the schedule was
    // booked from its first start on, so every start follows the last, a second apart.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = db.url.clone();
            std::thread::spawn(move || {
                let mut conn = connect_url(&url);
                for _ in 0..25 {
                    assert_eq!(book(&mut conn, 1, interval, reach).count, 1);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a booking thread");
    }
    // A hundred starts a second apart, and after each booking the schedule left free for as
    // long as its read took (under a quarter of a second, or it books nothing).
    let booked = next_start(&mut conn) - from;
    assert!(
        (100 * 1_000_000..100 * 1_250_000).contains(&booked),
        "a hundred starts, none booked twice: {booked} µs"
    );
}

#[test]
fn a_booking_names_another_instances_interval_when_it_differs_from_its_own() {
    let (db, mut one) = migrated();
    let mut two = db.connect();
    let reach = 1000 * MS;
    assert_eq!(
        book(&mut one, 1, 50 * MS, reach).other_interval,
        None,
        "a new schedule was booked at no interval before"
    );
    assert_eq!(book(&mut one, 1, 50 * MS, reach).other_interval, None);
    assert_eq!(
        book(&mut two, 1, 20 * MS, reach).other_interval,
        Some(50 * MS),
        "booked last at another rate"
    );
    assert_eq!(
        book(&mut one, 1, 50 * MS, reach).other_interval,
        Some(20 * MS)
    );
    assert_eq!(book(&mut one, 1, 50 * MS, reach).other_interval, None);
}
