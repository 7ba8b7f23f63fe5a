//! The claim of several events and their outbox rows at once (`db::events::claim_and_queue`,
//! the batched claim of a forwarding source), against the store itself: each event is queued
//! if and only if it is stored, whatever made a row not come back.

use chrono::{DateTime, Utc};
use hookbox::db::deliveries::{Lease, ToQueue};
use hookbox::db::events::{self, Answer, Claimed, NewEvent};
use hookbox::db::{self, deliveries, AnyConnection};

use crate::helpers::*;

/// A migrated test database and a connection to it.
fn migrated() -> (TestDb, AnyConnection) {
    let db = TestDb::create();
    let mut conn = db.connect();
    db::migrate(&mut conn, |_| Ok(())).expect("the migrations apply");
    (db, conn)
}

/// A claim's row of the `held` source, answered, with the payload key `dedupe_key` if given.
fn row<'a>(
    event_id: &'a str,
    dedupe_key: Option<&'a [u8]>,
    received_at: DateTime<Utc>,
    headers: &'a serde_json::Value,
) -> NewEvent<'a> {
    NewEvent {
        source: "held",
        event_id,
        event_type: Some("test.event"),
        fingerprint: event_id.as_bytes(),
        received_at,
        payload: event_id.as_bytes(),
        headers,
        dedupe_key,
        answer: Some(Answer {
            status: 200,
            content_type: "application/json",
            body: b"{}",
        }),
    }
}

/// Rows queued for a take, the normal way, to each of `targets`.
fn to(targets: &[&'static str]) -> Vec<ToQueue<'static>> {
    targets.iter().map(|t| ToQueue::target(t)).collect()
}

fn ids(claimed: &[Claimed]) -> Vec<&str> {
    claimed.iter().map(|c| c.event_id.as_str()).collect()
}

fn targets(conn: &mut AnyConnection, claimed: &Claimed) -> Vec<String> {
    deliveries::of_event(conn, claimed.row)
        .expect("the deliveries read")
        .into_iter()
        .map(|d| d.target)
        .collect()
}

#[test]
fn a_batch_with_a_stored_id_and_a_stored_payload_queues_deliveries_only_for_what_it_stored() {
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({ "content-type": "application/json" });
    let (t1, t2) = (to(&["t1", "t2"]), to(&["t2", "t1"]));
    let first_at = db::now();
    let first = events::claim_and_queue(
        &mut conn,
        &[
            (row("a", None, first_at, &headers), &t1[..]),
            (row("b", Some(b"key-1"), first_at, &headers), &t1[..1]),
        ],
    )
    .expect("the first batch is stored")
    .claimed;
    assert_eq!(ids(&first), ["a", "b"]);

    // "a" again (its id is stored), "c" with b's payload key (dedupe = "body"), "d" and "e"
    // new, "e" forwarding nowhere, and "f" and "g" new but sharing a payload key between them.
    let at = db::now();
    let second = events::claim_and_queue(
        &mut conn,
        &[
            (row("a", None, at, &headers), &t1[..]),
            (row("c", Some(b"key-1"), at, &headers), &t1[..]),
            (row("d", None, at, &headers), &t2[..]),
            (row("e", None, at, &headers), &[][..]),
            (row("f", Some(b"key-2"), at, &headers), &t1[..1]),
            (row("g", Some(b"key-2"), at, &headers), &t1[..]),
        ],
    )
    .expect("the second batch is stored")
    .claimed;

    assert_eq!(
        ids(&second),
        ["d", "e", "f"],
        "only the rows that did not conflict"
    );
    assert!(
        second.windows(2).all(|w| w[0].row < w[1].row),
        "the rows went in in the order given: {second:?}"
    );
    assert_eq!(targets(&mut conn, &first[0]), ["t1", "t2"]);
    assert_eq!(targets(&mut conn, &first[1]), ["t1"]);
    assert_eq!(
        targets(&mut conn, &second[0]),
        ["t2", "t1"],
        "in the order named"
    );
    assert!(targets(&mut conn, &second[1]).is_empty());
    assert_eq!(targets(&mut conn, &second[2]), ["t1"]);
    assert_eq!(db.count("events"), 5, "a, b, d, e and f");
    assert_eq!(
        db.count("deliveries"),
        6,
        "a's two, b's one, d's two, f's one"
    );
    assert_eq!(
        db.count(
            "deliveries d JOIN events e ON e.id = d.event_row \
             WHERE d.source = e.source AND d.received_at = e.received_at"
        ),
        6,
        "each row carries its event's source and received time"
    );
}

#[test]
fn a_batch_that_forwards_nowhere_is_a_plain_claim() {
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let at = db::now();
    let claimed = events::claim_and_queue(
        &mut conn,
        &[
            (row("x", None, at, &headers), &[][..]),
            (row("y", None, at, &headers), &[][..]),
        ],
    )
    .expect("the batch is stored")
    .claimed;
    assert_eq!(ids(&claimed), ["x", "y"]);
    assert_eq!(db.count("deliveries"), 0);
}

#[test]
fn a_row_queued_leased_is_attempt_one_due_when_its_lease_ends_and_comes_back_with_its_id() {
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let at = db::now();
    let until = at + chrono::Duration::seconds(60);
    let leased = [
        ToQueue {
            target: "fast",
            lease: Some(Lease { until, by: 7 }),
        },
        ToQueue::target("slow"),
    ];
    let first = events::claim_and_queue(&mut conn, &[(row("p", None, at, &headers), &leased[..])])
        .expect("the batch is stored");
    assert_eq!(ids(&first.claimed), ["p"]);
    assert_eq!(first.leased.len(), 1, "{:?}", first.leased);
    let handed = &first.leased[0];
    assert_eq!(handed.target, "fast");
    assert_eq!(handed.event_row, first.claimed[0].row);
    let rows = deliveries::of_event(&mut conn, first.claimed[0].row).expect("the deliveries read");
    let fast = rows
        .iter()
        .find(|d| d.target == "fast")
        .expect("fast is queued");
    let slow = rows
        .iter()
        .find(|d| d.target == "slow")
        .expect("slow is queued");
    assert_eq!(fast.id, handed.id);
    assert_eq!((fast.attempts, slow.attempts), (1, 0));
    let (fast_due, slow_due) = (
        fast.next_attempt_at
            .expect("a pending row is due some time"),
        slow.next_attempt_at
            .expect("a pending row is due some time"),
    );
    assert!(
        fast_due >= until - chrono::Duration::milliseconds(1),
        "leased: {fast_due:?}"
    );
    assert!(slow_due <= db::now(), "due now: {slow_due:?}");

    // Claimed again: a replay queues nothing, leased or not.
    let again = events::claim_and_queue(&mut conn, &[(row("p", None, at, &headers), &leased[..])])
        .expect("the batch is stored");
    assert!(again.claimed.is_empty() && again.leased.is_empty());
    assert_eq!(db.count("deliveries"), 2);
}

#[test]
fn rows_leased_to_several_targets_with_different_leases_come_back_each_with_its_own_id() {
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let at = db::now();
    let (short, long) = (
        at + chrono::Duration::seconds(25),
        at + chrono::Duration::seconds(65),
    );
    let leased = [
        ToQueue {
            target: "a",
            lease: Some(Lease {
                until: short,
                by: 7,
            }),
        },
        ToQueue {
            target: "b",
            lease: Some(Lease { until: long, by: 7 }),
        },
        ToQueue::target("c"),
    ];
    let batch: Vec<_> = ["p", "q", "r", "s"]
        .iter()
        .map(|id| (row(id, None, at, &headers), &leased[..]))
        .collect();
    let stored = events::claim_and_queue(&mut conn, &batch).expect("the batch is stored");
    assert_eq!(ids(&stored.claimed), ["p", "q", "r", "s"]);
    assert_eq!(stored.leased.len(), 8, "{:?}", stored.leased);
    for claimed in &stored.claimed {
        let rows = deliveries::of_event(&mut conn, claimed.row).expect("the deliveries read");
        assert_eq!(rows.len(), 3, "{}: {rows:?}", claimed.event_id);
        for (target, until) in [("a", short), ("b", long)] {
            let handed: Vec<_> = stored
                .leased
                .iter()
                .filter(|l| l.event_row == claimed.row && l.target == target)
                .collect();
            assert_eq!(handed.len(), 1, "{} {target}", claimed.event_id);
            let row = rows
                .iter()
                .find(|d| d.target == target)
                .expect("the leased row is queued");
            assert_eq!(row.id, handed[0].id, "{} {target}", claimed.event_id);
            assert_eq!(row.attempts, 1);
            let due = row.next_attempt_at.expect("a pending row is due some time");
            assert!(
                (due - until).num_milliseconds().abs() <= 1,
                "{} {target}: leased until {due:?}, not {until:?}",
                claimed.event_id
            );
        }
        let queued = rows.iter().find(|d| d.target == "c").expect("c is queued");
        assert_eq!(queued.attempts, 0);
    }
    assert_eq!(db.count("deliveries"), 12);
    assert_eq!(
        db.count(
            "deliveries d JOIN events e ON e.id = d.event_row \
             WHERE d.source = e.source AND d.received_at = e.received_at"
        ),
        12,
        "each row carries its event's source and received time"
    );
}

/// A setting of the connection, as text: whether its commits wait for the disk.
#[derive(diesel::QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    value: String,
}

fn waits_for_disk(conn: &mut AnyConnection) -> String {
    use diesel::RunQueryDsl;
    let read = |sql| diesel::sql_query(sql);
    let setting: Setting = match conn {
        AnyConnection::Postgres(c) => read("SELECT current_setting('synchronous_commit') AS value")
            .get_result(c)
            .expect("the setting reads"),
        AnyConnection::Sqlite(c) => {
            read("SELECT CAST(synchronous AS TEXT) AS value FROM pragma_synchronous")
                .get_result(c)
                .expect("the pragma reads")
        }
    };
    setting.value
}

#[test]
fn outcomes_apply_at_their_attempt_and_the_connection_waits_for_the_disk_again_after() {
    use deliveries::{Settle, Settled};
    let (_db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let at = db::now();
    let leased = [ToQueue {
        target: "t",
        lease: Some(Lease {
            until: at + chrono::Duration::seconds(60),
            by: 7,
        }),
    }];
    let names = ["delivered", "late", "also-delivered", "retried"];
    let rows: Vec<_> = names
        .iter()
        .map(|name| (row(name, None, at, &headers), &leased[..]))
        .collect();
    let batch = events::claim_and_queue(&mut conn, &rows).expect("the batch is stored");
    assert_eq!(batch.leased.len(), 4, "{:?}", batch.leased);
    let id_of = |name: &str| {
        let event = batch
            .claimed
            .iter()
            .find(|c| c.event_id == name)
            .expect("claimed");
        batch
            .leased
            .iter()
            .find(|l| l.event_row == event.row)
            .expect("leased")
            .id
    };
    let row_of = |conn: &mut AnyConnection, name: &str| {
        let event = batch
            .claimed
            .iter()
            .find(|c| c.event_id == name)
            .expect("claimed");
        deliveries::of_event(conn, event.row)
            .expect("the deliveries read")
            .remove(0)
    };
    let before = waits_for_disk(&mut conn);
    let delivered = |name: &str, attempt| Settled {
        id: id_of(name),
        attempt,
        series: 0,
        outcome: Settle::Delivered { status: Some(200) },
    };

    // Every outcome delivered (on PostgreSQL one statement), one of them for an attempt the
    // row is not at (its lease ran out and it was taken again): that one changes nothing,
    // and is not counted as recorded (the dispatcher says so).
    let recorded = deliveries::settle(
        &mut conn,
        &[delivered("delivered", 1), delivered("late", 2)],
    )
    .expect("the outcomes are stored");
    assert_eq!(recorded, 1);
    // Delivered and retried together (a transaction).
    let recorded = deliveries::settle(
        &mut conn,
        &[
            delivered("also-delivered", 1),
            Settled {
                id: id_of("retried"),
                attempt: 1,
                series: 0,
                outcome: Settle::Retry {
                    status: Some(503),
                    error: "the downstream answered 503".to_owned(),
                    after: std::time::Duration::from_secs(30),
                },
            },
        ],
    )
    .expect("the outcomes are stored");
    assert_eq!(recorded, 2);

    for name in ["delivered", "also-delivered"] {
        let row = row_of(&mut conn, name);
        assert_eq!(
            (row.state.as_str(), row.last_status),
            ("delivered", Some(200)),
            "{name}"
        );
        assert!(row.delivered_at.is_some(), "{name}");
    }
    let late = row_of(&mut conn, "late");
    assert_eq!((late.state.as_str(), late.attempts), ("pending", 1));
    assert!(late.delivered_at.is_none());
    let retried = row_of(&mut conn, "retried");
    assert_eq!(retried.state, "pending");
    assert_eq!(retried.last_status, Some(503));
    assert_eq!(
        retried.last_error.as_deref(),
        Some("the downstream answered 503")
    );
    let due = retried.next_attempt_at.expect("a pending row is due");
    assert!(
        due > db::now() + chrono::Duration::seconds(20),
        "due after the backoff: {due:?}"
    );

    // The outcomes' commits did not wait for the disk; the connection's next transaction (a
    // claim, maybe) does again.
    assert_eq!(waits_for_disk(&mut conn), before);
    assert!(
        before == "on" || before == "2",
        "every connection opens waiting for the disk: {before}"
    );
}

/// The lane `held`/`t`, as the dispatcher asks for it.
fn lane_t(ordered: bool) -> deliveries::Want {
    deliveries::Want {
        source: "held".to_owned(),
        target: "t".to_owned(),
        limit: 10,
        ordered,
        lease: std::time::Duration::from_secs(60),
    }
}

fn delivered(due: &deliveries::Due) -> deliveries::Settled {
    deliveries::Settled {
        id: due.id,
        attempt: due.attempt,
        series: due.series,
        outcome: deliveries::Settle::Delivered { status: Some(200) },
    }
}

/// `due`'s attempt failed with a 503: retried in 30 s.
fn retried(due: &deliveries::Due) -> deliveries::Settled {
    deliveries::Settled {
        outcome: deliveries::Settle::Retry {
            status: Some(503),
            error: "the downstream answered 503".to_owned(),
            after: std::time::Duration::from_secs(30),
        },
        ..delivered(due)
    }
}

#[test]
fn an_outcome_of_an_attempt_series_a_requeue_replaced_changes_nothing() {
    let (_db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    let stored =
        events::claim_and_queue(&mut conn, &[(row("e", None, db::now(), &headers), &t[..])])
            .expect("the event is stored")
            .claimed;
    let first = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].attempt, first[0].series), (1, 0));
    // Its lease runs out, another instance takes it, it goes dead there and is re-queued: a new
    // series, whose first attempt is attempt 1 again.
    deliveries::settle(
        &mut conn,
        &[deliveries::Settled {
            outcome: deliveries::Settle::Dead {
                status: Some(400),
                error: "the downstream answered 400".to_owned(),
            },
            ..delivered(&first[0])
        }],
    )
    .expect("the outcome is stored");
    assert!(deliveries::requeue(&mut conn, first[0].id)
        .expect("the requeue runs")
        .is_some_and(|r| r.is_ok()));
    let second = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
    assert_eq!(second.len(), 1);
    assert_eq!((second[0].attempt, second[0].series), (1, 1));

    // The first attempt's outcome, come late, names attempt 1 of the old series: nothing, and
    // a late retry neither. The new series' own outcome applies.
    let event_row = stored[0].row;
    let mut after = |outcome: deliveries::Settled| {
        deliveries::settle(&mut conn, &[outcome]).expect("the outcome is stored");
        let d = deliveries::of_event(&mut conn, event_row)
            .expect("reads")
            .remove(0);
        (d.state, d.attempts, d.last_status)
    };
    // (The requeue cleared the old series' last status; a late outcome puts none back.)
    assert_eq!(after(delivered(&first[0])), ("pending".to_owned(), 1, None));
    assert_eq!(after(retried(&first[0])), ("pending".to_owned(), 1, None));
    assert_eq!(
        after(delivered(&second[0])),
        ("delivered".to_owned(), 1, Some(200))
    );
}

#[test]
fn a_row_given_back_untried_is_due_later_as_the_same_attempt_of_the_same_series() {
    let (_db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    events::claim_and_queue(&mut conn, &[(row("e", None, db::now(), &headers), &t[..])])
        .expect("the event is stored");
    let taken = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
    assert_eq!(taken[0].attempt, 1);
    // Its paced target's schedule was booked beyond what it could wait for: back, for 400 ms.
    let given_back = std::time::Instant::now();
    deliveries::settle(
        &mut conn,
        &[deliveries::Settled {
            outcome: deliveries::Settle::Untried {
                after: std::time::Duration::from_millis(400),
            },
            ..delivered(&taken[0])
        }],
    )
    .expect("the outcome is stored");
    assert!(
        deliveries::take_due(&mut conn, &[lane_t(false)], 7)
            .expect("the take runs")
            .is_empty(),
        "not due until then"
    );
    // Taken again once due: looked for until then, and not before.
    let deadline = given_back + std::time::Duration::from_secs(10);
    let again = loop {
        let taken = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
        if !taken.is_empty() || std::time::Instant::now() > deadline {
            break taken;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        given_back.elapsed() >= std::time::Duration::from_millis(400),
        "due 400 ms after it was given back"
    );
    assert_eq!(
        again
            .iter()
            .map(|d| (d.attempt, d.series))
            .collect::<Vec<_>>(),
        [(1, 0)],
        "its first attempt again, in the same series"
    );
}

#[test]
fn an_ordered_lane_gives_nothing_while_any_of_its_rows_is_leased_even_one_behind_its_head() {
    let (_db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    // Received a second ago: an ordered lane's head is sent once it settled (ORDER_SETTLE).
    let at = db::now() - chrono::Duration::seconds(1);
    let stored = events::claim_and_queue(
        &mut conn,
        &[
            (row("first", None, at, &headers), &t[..]),
            (
                row(
                    "second",
                    None,
                    at + chrono::Duration::milliseconds(1),
                    &headers,
                ),
                &t[..],
            ),
        ],
    )
    .expect("the events are stored")
    .claimed;
    let ordered = [lane_t(true)];
    let head = deliveries::take_due(&mut conn, &ordered, 7).expect("the take runs");
    assert_eq!(
        head.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
        ["first"]
    );
    assert!(deliveries::take_due(&mut conn, &ordered, 7)
        .expect("the take runs")
        .is_empty());
    deliveries::settle(&mut conn, &[delivered(&head[0])]).expect("the outcome is stored");
    let next = deliveries::take_due(&mut conn, &ordered, 7).expect("the take runs");
    assert_eq!(
        next.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
        ["second"]
    );

    // "first" is redelivered while "second" is being sent (by this instance or another): it is
    // the lane's head again, due now, and still waits until "second"'s attempt has ended.
    let first_row = stored
        .iter()
        .find(|c| c.event_id == "first")
        .expect("stored")
        .row;
    assert_eq!(
        deliveries::redeliver(&mut conn, first_row, &["t".to_owned()]).expect("runs"),
        1
    );
    assert!(
        deliveries::take_due(&mut conn, &ordered, 7)
            .expect("the take runs")
            .is_empty(),
        "two attempts of an ordered lane at once"
    );
    // A failed attempt ends the lease too: then the head goes.
    deliveries::settle(&mut conn, &[retried(&next[0])]).expect("the outcome is stored");
    let again = deliveries::take_due(&mut conn, &ordered, 7).expect("the take runs");
    assert_eq!(
        again
            .iter()
            .map(|d| (d.event_id.as_str(), d.attempt, d.series))
            .collect::<Vec<_>>(),
        [("first", 1, 1)]
    );
}

#[test]
fn two_takes_of_an_ordered_lane_at_once_never_lease_two_of_its_rows() {
    // SQLite takes under its one write lock, so takes go one at a time there by construction.
    if store_is_sqlite() {
        return;
    }
    use diesel::Connection;
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    // Received a second ago: an ordered lane's head is sent once it settled (ORDER_SETTLE).
    let at = db::now() - chrono::Duration::seconds(1);
    let ordered = [lane_t(true)];
    // "second" is stored first, so it is the lane's head while "first" is not there yet.
    events::claim_and_queue(&mut conn, &[(row("second", None, at, &headers), &t[..])])
        .expect("stored");
    let mut b = db.connect();
    let (by_b, other) = b
        .transaction(|b| {
            // Instance B leases "second"; its take has not committed yet.
            let by_b = deliveries::take_due(b, &ordered, 8)?;
            // "first", received before it, commits now, and instance A takes the lane.
            let earlier = at - chrono::Duration::milliseconds(1);
            events::claim_and_queue(
                &mut conn,
                &[(row("first", None, earlier, &headers), &t[..])],
            )
            .expect("stored");
            let url = db.url.clone();
            let by_a = std::thread::spawn(move || {
                let mut a = connect_url(&url);
                deliveries::take_due(&mut a, &ordered, 7).expect("the take runs")
            });
            // B commits once A's take is under way: ended, or waiting for B's.
            let started = std::time::Instant::now();
            while !by_a.is_finished()
                && db.count(
                    "pg_stat_activity WHERE datname = current_database() \
                     AND wait_event = 'advisory'",
                ) == 0
            {
                assert!(started.elapsed() < std::time::Duration::from_secs(10));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok::<_, diesel::result::Error>((by_b, by_a))
        })
        .expect("B's take commits");
    let by_a = other.join().expect("A's take ends");
    assert_eq!(
        by_b.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>(),
        ["second"]
    );
    assert!(
        by_a.is_empty(),
        "A leased {:?} while B's lease of \"second\" was under way: two attempts at once",
        by_a.iter().map(|d| d.event_id.as_str()).collect::<Vec<_>>()
    );
}

#[test]
fn a_purge_takes_its_events_outbox_rows_and_no_others_and_a_purged_event_queues_nothing() {
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let old = db::now() - chrono::Duration::days(10);
    let recent = db::now();
    let (two, one) = (to(&["t1", "t2"]), to(&["t1"]));
    let stored = events::claim_and_queue(
        &mut conn,
        &[
            (row("old-1", None, old, &headers), &two[..]),
            (row("old-2", None, old, &headers), &one[..]),
            (row("recent", None, recent, &headers), &two[..]),
        ],
    )
    .expect("the batch is stored")
    .claimed;
    assert_eq!(db.count("deliveries"), 5);

    // One of the old events' rows was delivered; the other two are still pending.
    use diesel::RunQueryDsl;
    diesel::sql_query(format!(
        "UPDATE deliveries SET state = 'delivered' WHERE event_row = {} AND target = 't1'",
        stored[0].row
    ))
    .execute(&mut conn)
    .expect("one row delivered");
    let cutoff = db::now() - chrono::Duration::days(1);
    let removed = events::purge_batch(&mut conn, Some("held"), &[], cutoff, db::now(), 100)
        .expect("the purge runs");
    assert_eq!(removed.sources, ["held", "held"]);
    assert_eq!(
        removed.pending_forwards, 2,
        "the pending rows purged unsent are counted"
    );
    assert_eq!(db.count("events"), 1);
    assert_eq!(
        db.count("deliveries"),
        2,
        "only the recent event's two rows are left"
    );
    let recent_row = stored
        .iter()
        .find(|c| c.event_id == "recent")
        .expect("claimed")
        .row;
    assert_eq!(targets(&mut conn, &stored[2]), ["t1", "t2"]);
    assert_eq!(
        db.count(&format!("deliveries WHERE event_row = {recent_row}")),
        2
    );

    // Queueing for an event row that is no longer stored queues nothing.
    let purged_row = stored[0].row;
    deliveries::enqueue_many(&mut conn, &[(purged_row, "t3"), (recent_row, "t3")])
        .expect("the rows queue");
    assert_eq!(
        db.count(&format!("deliveries WHERE event_row = {purged_row}")),
        0
    );
    assert_eq!(
        db.count(&format!("deliveries WHERE event_row = {recent_row}")),
        3
    );
}

/// Waits (up to 10 s) until `n` sessions of the database at `url` wait for a row lock.
fn until_waiting_for_locks(url: &str, n: i64) {
    let database = url.rsplit('/').next().expect("a database name");
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count_at(
        url,
        &format!("pg_stat_activity WHERE datname = '{database}' AND wait_event_type = 'Lock'"),
    ) < n
    {
        assert!(
            std::time::Instant::now() < limit,
            "{n} sessions never waited for a lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_purge_and_a_batch_of_outcomes_on_the_same_rows_never_deadlock() {
    if skip_on_sqlite(
        "a_purge_and_a_batch_of_outcomes_on_the_same_rows_never_deadlock",
        "one writer at a time: no row locks taken in an order",
    ) {
        return;
    }
    let (db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    events::claim_and_queue(
        &mut conn,
        &[
            (row("a", None, db::now(), &headers), &t[..]),
            (row("b", None, db::now(), &headers), &t[..]),
        ],
    )
    .expect("the events are stored");
    let mut taken = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
    taken.sort_by_key(|d| d.id);
    let [a, b] = &taken[..] else {
        panic!("two rows taken: {taken:?}")
    };
    // Another session holds the first row a moment, so that both transactions below queue
    // for it. The purge locked the rows it deleted as it found them (the first first), the
    // dispatcher's batch as its outcomes came (the second, delivered, then the first): once
    // the first was let go, each held what the other waited for, and PostgreSQL ended one.
    let mut holder = db.connect();
    let AnyConnection::Postgres(pg) = &mut holder else {
        unreachable!("PostgreSQL, as skip_on_sqlite let through")
    };
    diesel::connection::SimpleConnection::batch_execute(
        pg,
        &format!(
            "BEGIN; SELECT id FROM deliveries WHERE id = {} FOR UPDATE",
            a.id
        ),
    )
    .expect("the first row is held");
    let url = db.url.clone();
    // A pass as of after the rows' leases end (a purge leaves an event whose attempt is under
    // way), and with both events past its cutoff.
    let purge = std::thread::spawn(move || {
        let later = db::now() + chrono::Duration::hours(1);
        events::purge_batch(&mut connect_url(&url), None, &[], later, later, 100)
            .map(|purged| purged.sources.len())
    });
    until_waiting_for_locks(&db.url, 1);
    let (url, outcomes) = (db.url.clone(), vec![delivered(b), retried(a)]);
    let settle = std::thread::spawn(move || deliveries::settle(&mut connect_url(&url), &outcomes));
    until_waiting_for_locks(&db.url, 2);
    diesel::connection::SimpleConnection::batch_execute(pg, "ROLLBACK")
        .expect("the first row is let go");
    assert_eq!(
        purge.join().expect("the purge's thread"),
        Ok(2),
        "the purge removed both events"
    );
    assert_eq!(
        settle.join().expect("the batch's thread"),
        Ok(0),
        "the outcomes of rows purged meanwhile change nothing, and are counted as not recorded"
    );
    assert_eq!(db.count("deliveries"), 0);
}

#[test]
fn a_batch_of_outcomes_of_every_kind_applies_each_to_its_own_row() {
    let (_db, mut conn) = migrated();
    let headers = serde_json::json!({});
    let t = to(&["t"]);
    let ids = ["r1", "r2", "d", "x", "stale"];
    let rows: Vec<_> = ids
        .iter()
        .map(|id| (row(id, None, db::now(), &headers), &t[..]))
        .collect();
    events::claim_and_queue(&mut conn, &rows).expect("the events are stored");
    let mut taken = deliveries::take_due(&mut conn, &[lane_t(false)], 7).expect("the take runs");
    taken.sort_by_key(|d| d.id);
    assert_eq!(taken.len(), 5);
    let (r1, r2, d, x, stale) = (&taken[0], &taken[1], &taken[2], &taken[3], &taken[4]);
    // Two attempts to be made again (on PostgreSQL in one statement), one delivered, one dead,
    // and a retry of an attempt the row is no longer at, which changes nothing.
    let again_in = |secs| deliveries::Settle::Retry {
        status: Some(503),
        error: format!("the downstream answered 503, again in {secs} s"),
        after: std::time::Duration::from_secs(secs),
    };
    deliveries::settle(
        &mut conn,
        &[
            deliveries::Settled {
                outcome: again_in(600),
                ..delivered(r2)
            },
            delivered(d),
            deliveries::Settled {
                outcome: again_in(30),
                ..delivered(r1)
            },
            deliveries::Settled {
                outcome: deliveries::Settle::Dead {
                    status: Some(410),
                    error: "the downstream answered 410".to_owned(),
                },
                ..delivered(x)
            },
            deliveries::Settled {
                attempt: stale.attempt + 1,
                ..retried(stale)
            },
        ],
    )
    .expect("the outcomes are stored");
    let view = |conn: &mut AnyConnection, id: &str| {
        let row = events::row_of(conn, "held", id)
            .expect("reads")
            .expect("stored");
        deliveries::of_event(conn, row).expect("reads").remove(0)
    };
    let now = db::now();
    for (id, secs) in [("r1", 30), ("r2", 600)] {
        let v = view(&mut conn, id);
        assert_eq!(
            (v.state.as_str(), v.last_status),
            ("pending", Some(503)),
            "{id}"
        );
        assert_eq!(
            v.last_error.as_deref(),
            Some(format!("the downstream answered 503, again in {secs} s").as_str()),
            "{id}"
        );
        let due = v.next_attempt_at.expect("due") - now;
        assert!(
            due > chrono::Duration::seconds(secs - 5) && due <= chrono::Duration::seconds(secs),
            "{id}: due in {due}"
        );
    }
    let v = view(&mut conn, "d");
    assert_eq!((v.state.as_str(), v.last_status), ("delivered", Some(200)));
    let v = view(&mut conn, "x");
    assert_eq!((v.state.as_str(), v.last_status), ("dead", Some(410)));
    let v = view(&mut conn, "stale");
    assert_eq!(
        (v.state.as_str(), v.last_status, v.last_error),
        ("pending", None, None),
        "an outcome of another attempt changes nothing"
    );
    // Let go: the two retried rows are taken again once due, not before.
    assert!(deliveries::take_due(&mut conn, &[lane_t(false)], 7)
        .expect("the take runs")
        .is_empty());
}
