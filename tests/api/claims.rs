//! The claim of several events and their outbox rows at once (`db::events::claim_and_queue`,
//! the batched claim of a forwarding source), against the store itself: each event is queued
//! if and only if it is stored, whatever made a row not come back.

use chrono::{DateTime, Utc};
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
    let (t1, t2) = (
        ["t1".to_owned(), "t2".to_owned()],
        ["t2".to_owned(), "t1".to_owned()],
    );
    let first_at = db::now();
    let first = events::claim_and_queue(
        &mut conn,
        &[
            (row("a", None, first_at, &headers), &t1[..]),
            (row("b", Some(b"key-1"), first_at, &headers), &t1[..1]),
        ],
    )
    .expect("the first batch is stored");
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
    .expect("the second batch is stored");

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
    .expect("the batch is stored");
    assert_eq!(ids(&claimed), ["x", "y"]);
    assert_eq!(db.count("deliveries"), 0);
}
