//! Instances sharing one store (`db::instances`): each registered one is alive while it holds
//! its lock, and the rows one leased are taken back the moment another finds it dead, not when
//! their leases run out. Against the store itself; the SIGKILL of a real process is in
//! `dispatch.rs`.

use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookbox::db::deliveries::{Lease, ToQueue};
use hookbox::db::events::{self, Answer, NewEvent};
use hookbox::db::instances::{Registration, FREE_FOR};
use hookbox::db::{self, deliveries, AnyConnection, Store};

use crate::helpers::*;

fn event<'a>(event_id: &'a str, headers: &'a serde_json::Value) -> NewEvent<'a> {
    NewEvent {
        source: "held",
        event_id,
        event_type: Some("test.event"),
        fingerprint: event_id.as_bytes(),
        received_at: db::now(),
        payload: event_id.as_bytes(),
        headers,
        dedupe_key: None,
        answer: Some(Answer {
            status: 200,
            content_type: "application/json",
            body: b"{}",
        }),
    }
}

/// The rows of lane `held`/`t` due now, taken as the dispatcher would: (event id, attempt,
/// series) each.
fn due_now(conn: &mut AnyConnection) -> Vec<(String, i32, i32)> {
    let want = deliveries::Want {
        source: "held".to_owned(),
        target: "t".to_owned(),
        limit: 100,
        ordered: false,
        lease: Duration::from_secs(60),
    };
    let mut ids: Vec<(String, i32, i32)> = deliveries::take_due(conn, &[want], 3)
        .expect("the take runs")
        .into_iter()
        .map(|d| (d.event_id, d.attempt, d.series))
        .collect();
    ids.sort();
    ids
}

/// A migrated test database, its store, a connection, and a first instance registered on it
/// (asking for number `number`), with the number it got.
fn registered(number: i64) -> (TestDb, Store, AnyConnection, Registration, i64) {
    let db = TestDb::create();
    let store = Store::parse(&db.url).expect("a store");
    let mut conn = db.connect();
    db::migrate(&mut conn, |_| Ok(())).expect("the migrations apply");
    let id = Arc::new(AtomicI64::new(number));
    let mut first = Registration::new(store.clone(), id.clone());
    assert!(first
        .look(Some(&mut conn))
        .expect("it registers")
        .is_empty());
    let number = id.load(std::sync::atomic::Ordering::SeqCst);
    (db, store, conn, first, number)
}

/// Cuts the connection that holds instance `number`'s lock on PostgreSQL (as a restart of
/// PostgreSQL, or a network break, would), and waits until the lock is free.
fn cut_lock_connection(db: &TestDb, number: i64) {
    let cut = db.count(&format!(
        "(SELECT pg_terminate_backend(pid) AS done FROM pg_locks \
          WHERE locktype = 'advisory' AND classid = 1751868024 AND objid = {number} \
            AND granted) AS cut WHERE cut.done"
    ));
    assert_eq!(cut, 1, "one lock connection was cut");
    let deadline = Instant::now() + Duration::from_secs(10);
    while db.count(&format!(
        "pg_locks WHERE locktype = 'advisory' AND objid = {number}"
    )) > 0
    {
        assert!(Instant::now() < deadline, "the lock never went");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second instance on `store` (asking for number `number`), registered.
fn second_registered(store: Store, conn: &mut AnyConnection, number: i64) -> Registration {
    let mut second = Registration::new(store, Arc::new(AtomicI64::new(number)));
    assert!(second.look(Some(conn)).expect("it registers").is_empty());
    second
}

/// Has `looking` look every 20 ms until it takes another instance's rows back (within
/// `limit`); what it took back.
fn until_taken_back(
    looking: &mut Registration,
    conn: &mut AnyConnection,
    limit: Duration,
) -> Vec<hookbox::db::instances::TakenBack> {
    let deadline = Instant::now() + limit;
    loop {
        let taken_back = looking.look(Some(conn)).expect("it looks");
        if !taken_back.is_empty() {
            return taken_back;
        }
        assert!(Instant::now() < deadline, "nothing taken back in {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two instances registered on one fresh PostgreSQL database, the first with event `a`'s row
/// leased to it.
struct Pair {
    db: TestDb,
    conn: AnyConnection,
    first: Registration,
    first_number: i64,
    second: Registration,
}

/// A [`Pair`], the first asking for number `first`, the second for `second`; `None` on SQLite,
/// where a live process cannot lose its file lock (test `test` says it is skipped).
fn pair_with_a_leased_row(test: &str, first: i64, second: i64) -> Option<Pair> {
    if skip_on_sqlite(test, "a file lock cannot be lost by a live process") {
        return None;
    }
    let (db, store, mut conn, first, first_number) = registered(first);
    store_leased(&mut conn, "a", first_number);
    let second = second_registered(store, &mut conn, second);
    Some(Pair {
        db,
        conn,
        first,
        first_number,
        second,
    })
}

/// Stores event `event_id` with its one outbox row leased to instance `holder` for an hour.
fn store_leased(conn: &mut AnyConnection, event_id: &str, holder: i64) {
    let headers = serde_json::json!({});
    let leased = [ToQueue {
        target: "t",
        lease: Some(Lease {
            until: db::now() + chrono::Duration::hours(1),
            by: holder,
        }),
    }];
    events::claim_and_queue(conn, &[(event(event_id, &headers), &leased[..])])
        .expect("the event is stored");
}

#[test]
fn the_rows_an_instance_leased_come_back_once_it_is_gone_and_not_while_it_lives() {
    let (db, store, mut conn, first, first_number) = registered(1001);

    // Two rows handed over to the first instance, leased for an hour; one queued for a take.
    let headers = serde_json::json!({});
    let lease = Lease {
        until: db::now() + chrono::Duration::hours(1),
        by: first_number,
    };
    let leased = [ToQueue {
        target: "t",
        lease: Some(lease),
    }];
    let queued = [ToQueue::target("t")];
    events::claim_and_queue(
        &mut conn,
        &[
            (event("a", &headers), &leased[..]),
            (event("b", &headers), &leased[..]),
            (event("c", &headers), &queued[..]),
        ],
    )
    .expect("the events are stored");
    assert_eq!(
        due_now(&mut conn),
        [("c".to_owned(), 1, 0)],
        "only the row not leased is due"
    );

    // A second instance looks while the first lives: nothing is taken back.
    let mut second = second_registered(store, &mut conn, 2002);
    assert_eq!(db.count("instances"), 2);
    assert!(due_now(&mut conn).is_empty());

    // The first goes (its lock with it), with its two rows leased for another hour.
    drop(first);
    // PostgreSQL lets go of a closed session's locks as its backend exits.
    let taken_back = until_taken_back(&mut second, &mut conn, Duration::from_secs(10));
    assert_eq!(taken_back.len(), 1, "{taken_back:?}");
    assert_eq!((taken_back[0].id, taken_back[0].rows), (first_number, 2));
    assert_eq!(taken_back[0].pid, i64::from(std::process::id()));
    assert_eq!(db.count("instances"), 1, "the dead instance's row is gone");
    // Due now, not in an hour, as attempt 1 again (they were leased, maybe never sent), in a
    // new series (an outcome of the taken-back attempt would change nothing).
    assert_eq!(
        due_now(&mut conn),
        [("a".to_owned(), 1, 1), ("b".to_owned(), 1, 1)]
    );
    // Taken back once: a later look finds nobody else.
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
}

#[test]
fn a_live_instance_whose_lock_connection_broke_keeps_its_rows() {
    let Some(Pair {
        db,
        mut conn,
        mut first,
        first_number,
        mut second,
    }) = pair_with_a_leased_row(
        "a_live_instance_whose_lock_connection_broke_keeps_its_rows",
        3003,
        4004,
    )
    else {
        return;
    };

    // The first instance's lock connection is cut (as a PostgreSQL restart would): its lock
    // is free until its own next look takes it again.
    cut_lock_connection(&db, first_number);
    // The second instance finds it free once: not yet taken for dead.
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(due_now(&mut conn).is_empty());
    // The first takes its lock again, under its own number; the second then finds it alive.
    assert!(first
        .look(Some(&mut conn))
        .expect("it registers again")
        .is_empty());
    assert_eq!(
        db.count(&format!(
            "pg_locks WHERE locktype = 'advisory' AND objid = {first_number} AND granted"
        )),
        1,
        "its lock is held again, under its own number"
    );
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(
        due_now(&mut conn).is_empty(),
        "the live instance's row stays leased"
    );
    assert_eq!(db.count("instances"), 2);
}

#[test]
fn a_lock_found_free_at_looks_closer_than_the_wait_is_not_yet_taken_for_dead() {
    // Two instances started together look within milliseconds of each other. A break of the
    // first's lock connection between their looks was seen at two of the second's looks (a
    // look period apart) before the first's own next look had made its connection again: its
    // attempts under way were sent a second time at once.
    let Some(Pair {
        db,
        mut conn,
        mut first,
        first_number,
        mut second,
    }) = pair_with_a_leased_row(
        "a_lock_found_free_at_looks_closer_than_the_wait_is_not_yet_taken_for_dead",
        7007,
        8008,
    )
    else {
        return;
    };

    cut_lock_connection(&db, first_number);
    let cut_at = Instant::now();
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(
        second.look(Some(&mut conn)).expect("it looks").is_empty(),
        "free at two looks in a row, but not for long enough"
    );
    assert!(due_now(&mut conn).is_empty(), "still leased to the first");
    // The first takes its lock again at its own next look; the second finds it alive, and
    // the time its lock was free counts no more.
    assert!(first.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    while cut_at.elapsed() < FREE_FOR {
        std::thread::sleep(Duration::from_millis(50));
    }
    cut_lock_connection(&db, first_number);
    let free_from = Instant::now();
    assert!(
        second.look(Some(&mut conn)).expect("it looks").is_empty(),
        "free since this look, not since the first break"
    );
    assert!(due_now(&mut conn).is_empty());

    // The first never looks again: once its lock has been free that long, it is dead.
    let taken_back = until_taken_back(&mut second, &mut conn, FREE_FOR + Duration::from_secs(10));
    assert!(free_from.elapsed() >= FREE_FOR, "{:?}", free_from.elapsed());
    assert_eq!((taken_back[0].id, taken_back[0].rows), (first_number, 1));
    assert_eq!(due_now(&mut conn), [("a".to_owned(), 1, 1)]);
}

#[test]
fn a_lock_taken_again_and_lost_again_between_two_looks_starts_the_wait_over() {
    // Two breaks of the first's lock connection a few seconds apart: the second instance saw
    // the lock free, missed the moment it was held again, and saw it free again once the
    // wait was over, so it took back the rows of an instance that was sending them.
    let Some(Pair {
        db,
        mut conn,
        mut first,
        first_number,
        mut second,
    }) = pair_with_a_leased_row(
        "a_lock_taken_again_and_lost_again_between_two_looks_starts_the_wait_over",
        9009,
        9119,
    )
    else {
        return;
    };
    cut_lock_connection(&db, first_number);
    let cut_at = Instant::now();
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(first
        .look(Some(&mut conn))
        .expect("it takes its lock again")
        .is_empty());
    cut_lock_connection(&db, first_number);
    while cut_at.elapsed() < FREE_FOR {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        second.look(Some(&mut conn)).expect("it looks").is_empty(),
        "free again, but held in between: the wait starts over"
    );
    assert!(due_now(&mut conn).is_empty(), "still leased to the first");
    assert!(first
        .look(Some(&mut conn))
        .expect("it takes its lock again")
        .is_empty());
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(due_now(&mut conn).is_empty());
}

#[test]
fn a_lock_still_held_by_a_broken_connections_session_is_waited_for_under_the_same_number() {
    if skip_on_sqlite(
        "a_lock_still_held_by_a_broken_connections_session_is_waited_for_under_the_same_number",
        "a file lock cannot be lost by a live process",
    ) {
        return;
    }
    // The connection broke on the instance's side, but the database has not seen its
    // session end: the lock is still held there. Taking a new number would leave the rows
    // leased under the old one to be taken back, once that session ends, while this
    // instance still sends them.
    let db = TestDb::create();
    let store = Store::parse(&db.url).expect("a store");
    let mut conn = db.connect();
    db::migrate(&mut conn, |_| Ok(())).expect("the migrations apply");
    let number = Arc::new(AtomicI64::new(5005));
    let mut first = Registration::new(store.clone(), number.clone());
    assert!(first
        .look(Some(&mut conn))
        .expect("it registers")
        .is_empty());
    let first_number = number.load(std::sync::atomic::Ordering::SeqCst);
    store_leased(&mut conn, "a", first_number);
    let mut second = second_registered(store, &mut conn, 6006);

    // A session of its own stands for the old one: it waits for the lock, gets it the moment
    // the instance's connection is cut, and holds it.
    let mut zombie = db.connect();
    let waiting = std::thread::spawn(move || {
        use diesel::RunQueryDsl;
        diesel::sql_query(format!(
            "SELECT pg_advisory_lock(1751868024, {first_number})"
        ))
        .execute(&mut zombie)
        .expect("the lock, once cut loose");
        zombie
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.count("pg_locks WHERE locktype = 'advisory' AND NOT granted") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stand-in never waited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let cut = db.count(&format!(
        "(SELECT pg_terminate_backend(pid) AS done FROM pg_locks \
          WHERE locktype = 'advisory' AND classid = 1751868024 AND objid = {first_number} \
            AND granted) AS cut WHERE cut.done"
    ));
    assert_eq!(cut, 1, "the instance's lock connection was cut");
    let zombie = waiting.join().expect("the stand-in holds the lock");

    // The instance cannot take its lock yet: it keeps its number, and waits.
    assert!(first.look(Some(&mut conn)).expect("it looks").is_empty());
    assert_eq!(
        number.load(std::sync::atomic::Ordering::SeqCst),
        first_number,
        "the same number"
    );
    // Each try to take it again is counted before the lock is tried, so a lock held and lost
    // again within moments (its new connection broke at once) is never taken for free all
    // along by another.
    assert_eq!(
        db.count(&format!(
            "instances WHERE id = {first_number} AND locks_taken = 1"
        )),
        1,
        "the try is counted, though it got no lock"
    );
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(due_now(&mut conn).is_empty(), "held for it meanwhile");

    // The old session ends: the instance takes its lock again under its number, and its row
    // stays leased to it.
    drop(zombie);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.count(&format!(
        "pg_locks WHERE locktype = 'advisory' AND objid = {first_number} AND granted"
    )) > 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the stand-in's lock never went"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(first.look(Some(&mut conn)).expect("it looks").is_empty());
    assert_eq!(
        db.count(&format!(
            "pg_locks WHERE locktype = 'advisory' AND objid = {first_number} AND granted"
        )),
        1,
        "held again, under its own number"
    );
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(second.look(Some(&mut conn)).expect("it looks").is_empty());
    assert!(
        due_now(&mut conn).is_empty(),
        "still leased to the live instance"
    );
}
