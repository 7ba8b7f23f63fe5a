//! `in_flight_wait` bounds the whole wait of a duplicate, however many waits it is made of: a
//! claim batch that times out and falls back to claims one by one does not start the wait over.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use futures_util::future::join_all;
use hookbox::{AnyConnection, Handlers};

use crate::helpers::*;

/// An uncommitted claim of `source`'s event `event_id`, held on a connection of the test's own
/// (another process, as far as the server can tell) until it is dropped, then rolled back.
pub struct HeldClaim(AnyConnection);

impl HeldClaim {
    pub fn take(url: &str, source: &str, event_id: &str) -> HeldClaim {
        let mut conn = connect_url(url);
        // On SQLite the claim takes the file's one write lock, as a claiming process would.
        let begin = match conn {
            AnyConnection::Postgres(_) => "BEGIN",
            AnyConnection::Sqlite(_) => "BEGIN IMMEDIATE",
        };
        conn.batch_execute(begin).expect("begin the held claim");
        hookbox::on_backend!(&mut conn, c => diesel::insert_into(events::table)
            .values((
                events::source.eq(source),
                events::event_id.eq(event_id),
                events::fingerprint.eq(&[0u8][..]),
                events::received_at.eq(chrono::Utc::now()),
                events::payload.eq(&b"{}"[..]),
                events::headers.eq(serde_json::json!({})),
            ))
            .execute(c))
        .expect("insert the held claim");
        HeldClaim(conn)
    }
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        let _ = self.0.batch_execute("ROLLBACK");
    }
}

/// The in-flight wait of the test config below.
const WAIT: Duration = Duration::from_secs(2);

async fn spawn(extra: &str, handlers: Handlers) -> TestApp {
    let db = TestDb::create();
    let config = config_with(&db, extra, "2s", 4);
    TestApp::spawn_on(db, config, handlers).await
}

/// The test config over `db` with `extra`, an in-flight wait of `wait` and `pool_size`.
fn config_with(db: &TestDb, extra: &str, wait: &str, pool_size: u32) -> hookbox::config::Config {
    parse_config(
        &config_text(&db.url, extra)
            .replace(
                "in_flight_wait = \"3s\"",
                &format!("in_flight_wait = \"{wait}\""),
            )
            .replace("pool_size = 4", &format!("pool_size = {pool_size}")),
    )
}

async fn duplicate_behind_a_held_claim_gets_409_within_the_wait(app: &TestApp, source: &str) {
    // A first delivery opens the pool's connections, so what is timed below is the wait alone.
    let warm = unique_id("evt_warm");
    let answer = app
        .send(&app.delivery(source, &sample_body(source, &warm), &warm))
        .await;
    assert_eq!(answer.status, 200, "{source}: {}", answer.text());

    let id = unique_id("evt_held");
    let body = sample_body(source, &id);
    let held = HeldClaim::take(&app.db.url, source, &id);

    let started = Instant::now();
    let answer = app.send(&app.delivery(source, &body, &id)).await;
    let waited = started.elapsed();
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (409, "in_progress"),
        "{source}: {}",
        answer.text()
    );
    // On SQLite any writer may hold the one write lock, so the answer says only that.
    let message = answer.json()["message"].as_str().unwrap_or("").to_owned();
    let expected = if store_is_sqlite() {
        "the store is busy with another write"
    } else {
        "another delivery of this event is still being processed"
    };
    assert!(message.starts_with(expected), "{source}: {message}");
    assert!(
        waited >= WAIT - Duration::from_millis(100) && waited <= WAIT + Duration::from_secs(1),
        "{source}: the 409 came after {waited:?}, not within in_flight_wait ({WAIT:?}) + 1 s"
    );

    // Once the held claim rolls back, the provider's retry claims the event.
    drop(held);
    let retried = app.send(&app.delivery(source, &body, &id)).await;
    assert_eq!(retried.status, 200, "{source}: {}", retried.text());
    assert!(!retried.replayed(), "{source}");
}

#[actix_web::test]
async fn a_batched_claim_behind_an_uncommitted_claim_gets_409_within_in_flight_wait() {
    // The built-in handler answers from the event alone: its claims go in batches.
    let app = spawn("", Handlers::default()).await;
    duplicate_behind_a_held_claim_gets_409_within_the_wait(&app, "stripe").await;
}

/// The claim writers keep connections of their own out of `pool_size` where there is room for
/// them (PostgreSQL), and share the pool's where there is not: with one or two connections,
/// concurrent deliveries and their duplicates are each stored once and answered alike, and on
/// PostgreSQL a duplicate behind an uncommitted claim still gets its 409 within the wait and no
/// more connections open.
#[actix_web::test]
async fn a_pool_of_one_or_two_connections_claims_each_event_once_and_opens_no_more() {
    for size in [1, 2] {
        let db = TestDb::create();
        let config = config_with(&db, "", "2s", size);
        let app = TestApp::spawn_on(db, config, Handlers::default()).await;
        let ids: Vec<String> = (0..12).map(|_| unique_id("evt_small")).collect();
        let deliveries: Vec<_> = ids
            .iter()
            .flat_map(|id| {
                let delivery = app.delivery("stripe", &stripe_event(id, "charge.refunded", 1), id);
                [delivery.clone(), delivery]
            })
            .collect();
        let answers = join_all(deliveries.iter().map(|d| app.send(d))).await;
        for (pair, id) in answers.chunks(2).zip(&ids) {
            for answer in pair {
                assert_eq!(answer.status, 200, "pool_size {size}: {}", answer.text());
            }
            assert_eq!(pair[0].body, pair[1].body, "pool_size {size}: {id}");
            assert_eq!(stored(&app, id), 1, "pool_size {size}: {id}");
        }
        // On SQLite every writer waits for the one write lock, and with one connection a
        // background write holding it waits too: the duplicate's wait is not measured there.
        if !store_is_sqlite() {
            duplicate_behind_a_held_claim_gets_409_within_the_wait(&app, "stripe").await;
            let open = count_at(
                &app.db.url,
                "pg_stat_activity WHERE datname = current_database() \
                 AND application_name = 'hookbox'",
            );
            assert!(
                open <= i64::from(size),
                "pool_size {size}: {open} connections open"
            );
        }
    }
}

/// Deliveries held up by another's claim wait on the main pool's connections for up to their
/// in-flight wait, never on more than half of them: with four such waits on a pool of two,
/// every other checkout timed out, and the deliveries of a source that claims in a
/// transaction were answered 503 "unreachable" for the whole hold (a black-box run). Past
/// half, a held event waits in the writer, on its own connection, as before.
#[actix_web::test]
async fn held_duplicates_leave_connections_for_deliveries_that_claim_in_a_transaction() {
    if skip_on_sqlite(
        "held_duplicates_leave_connections_for_deliveries_that_claim_in_a_transaction",
        "SQLite's one write lock holds every writer up alike",
    ) {
        return;
    }
    for size in [2, 4] {
        let db = TestDb::create();
        let config = config_with(&db, "", "6s", size);
        let handlers = Handlers::default().with("github", crate::concurrency::ledger::Ledger);
        let app = TestApp::spawn_on(db, config, handlers).await;
        let ids: Vec<String> = (0..3).map(|_| unique_id("evt_held")).collect();
        let held: Vec<HeldClaim> = ids
            .iter()
            .map(|id| HeldClaim::take(&app.db.url, "stripe", id))
            .collect();
        let waiting: Vec<_> = ids
            .iter()
            .map(|id| {
                let delivery = app.delivery("stripe", &stripe_event(id, "charge.refunded", 1), id);
                let address = app.address.clone();
                actix_web::rt::spawn(async move { send(&address, &delivery).await })
            })
            .collect();
        // A held duplicate waits past its batch's brief wait (100 ms), apart or in the writer.
        crate::provider::eventually("a duplicate waits out a held claim", WAIT * 2, || {
            count_at(
                &app.db.url,
                "pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND application_name = 'hookbox' \
                 AND query_start < now() - interval '500 milliseconds'",
            ) >= 1
        })
        .await;
        for n in 0..4 {
            let id = unique_id("gh");
            let answer = app.send(&app.delivery("github", "{}", &id)).await;
            assert_eq!(
                answer.status,
                200,
                "pool_size {size}, github delivery {n}: {}",
                answer.text()
            );
        }
        drop(held);
        for answer in join_all(waiting).await {
            let answer = answer.expect("the duplicate's request");
            assert_eq!(answer.status, 200, "pool_size {size}: {}", answer.text());
        }
    }
}

/// Where no source's claims go in batches (every source's handler writes), the claim writers
/// keep no connection of their own: all of `pool_size` serves the handlers' transactions.
#[actix_web::test]
async fn with_no_batched_source_every_pooled_connection_serves_the_handlers() {
    if skip_on_sqlite(
        "with_no_batched_source_every_pooled_connection_serves_the_handlers",
        "SQLite's writers take turns whatever the pool",
    ) {
        return;
    }
    let db = TestDb::create();
    let config = config_with(&db, "", "3s", 2);
    let entered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handlers = Handlers::default();
    for source in &config.sources {
        let handler = crate::provider::Counting {
            delay: Duration::from_millis(1500),
            entered: entered.clone(),
        };
        handlers = handlers.with(source.name.as_str(), handler);
    }
    let app = TestApp::spawn_on(db, config, handlers).await;
    let ids = [unique_id("evt_both"), unique_id("evt_both")];
    let answers = join_all(ids.iter().map(|id| {
        let delivery = app.delivery("stripe", &stripe_event(id, "charge.refunded", 1), id);
        let address = app.address.clone();
        async move {
            let started = Instant::now();
            let answer = send(&address, &delivery).await;
            (answer, started.elapsed())
        }
    }))
    .await;
    for (answer, took) in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        // One after the other, through one connection, the second would take two handlers' time.
        assert!(
            took < &Duration::from_millis(2800),
            "{took:?}: the handlers ran in turn"
        );
    }
    assert_eq!(entered.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[actix_web::test]
async fn a_claim_in_a_transaction_behind_an_uncommitted_claim_gets_409_within_in_flight_wait() {
    // A handler that writes claims in a transaction of its own.
    let handlers = Handlers::default().with("stripe", crate::concurrency::ledger::Ledger);
    let app = spawn("", handlers).await;
    duplicate_behind_a_held_claim_gets_409_within_the_wait(&app, "stripe").await;
}

#[actix_web::test]
async fn a_forwarding_claim_behind_an_uncommitted_claim_gets_409_within_in_flight_wait() {
    // A forwarding source's claims go in batches, each with its outbox rows.
    let extra = crate::forward::forward_extra("http://127.0.0.1:9/unused", "1s", 1);
    let app = spawn(&extra, Handlers::default()).await;
    duplicate_behind_a_held_claim_gets_409_within_the_wait(&app, "stripe").await;
}

/// A duplicate waiting on another session's uncommitted claim held up the one claim writer,
/// and with it every other delivery to the instance, for its whole in-flight wait (a black-box
/// run: 55 unrelated deliveries held up to 10 s each); then each further duplicate for 0.1 s.
/// The duplicates wait apart, each held event on its own; the deliveries behind them are
/// stored meanwhile, and each is still answered as before once its held claim goes.
#[actix_web::test]
async fn duplicates_waiting_on_uncommitted_claims_hold_up_no_other_delivery() {
    if skip_on_sqlite(
        "duplicates_waiting_on_uncommitted_claims_hold_up_no_other_delivery",
        "SQLite's one write lock holds every writer up alike",
    ) {
        return;
    }
    for extra in [
        String::new(),
        crate::forward::forward_extra("http://127.0.0.1:9/unused", "1s", 1),
    ] {
        let db = TestDb::create();
        // Two held events wait apart, a connection each, which may be half the pool beside
        // the writer's own at most: six connections in all.
        let config = config_with(&db, &extra, "8s", 6);
        let app = TestApp::spawn_on(db, config, Handlers::default()).await;
        let (long, short) = (unique_id("evt_long"), unique_id("evt_short"));
        let long_held = HeldClaim::take(&app.db.url, "stripe", &long);
        let short_held = HeldClaim::take(&app.db.url, "stripe", &short);
        let duplicates = |id: &str, n: usize| {
            (0..n)
                .map(|_| {
                    let delivery =
                        app.delivery("stripe", &stripe_event(id, "charge.refunded", 1), id);
                    let address = app.address.clone();
                    actix_web::rt::spawn(async move { send(&address, &delivery).await })
                })
                .collect::<Vec<_>>()
        };
        let long_waiting = duplicates(&long, 5);
        let short_waiting = duplicates(&short, 1);
        for _ in 0..5 {
            let fresh = unique_id("evt_fresh");
            let answer = app
                .send(&app.delivery(
                    "stripe",
                    &stripe_event(&fresh, "charge.refunded", 1),
                    &fresh,
                ))
                .await;
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
        assert!(
            long_waiting
                .iter()
                .chain(&short_waiting)
                .all(|d| !d.is_finished()),
            "the deliveries behind the duplicates were answered only after them ({extra})"
        );
        // One held claim rolls back: its duplicate claims the event, while the other's wait.
        drop(short_held);
        for waiting in short_waiting {
            let answer = waiting.await.expect("the duplicate's request");
            assert_eq!(answer.status, 200, "{}", answer.text());
            assert!(!answer.replayed(), "{}", answer.text());
        }
        assert!(
            long_waiting.iter().all(|d| !d.is_finished()),
            "one held event's duplicates waited for another's ({extra})"
        );
        drop(long_held);
        let mut processed = 0;
        for waiting in long_waiting {
            let answer = waiting.await.expect("the duplicate's request");
            assert_eq!(answer.status, 200, "{}", answer.text());
            processed += usize::from(!answer.replayed());
        }
        assert_eq!(
            processed, 1,
            "one duplicate claims it, the others replay it"
        );
        assert_eq!((stored(&app, &long), stored(&app, &short)), (1, 1));
        // The claim writers' own connections are counted in `pool_size` (a forwarding
        // instance holds one more, for its lock).
        let open = app.db.count(
            "pg_stat_activity WHERE datname = current_database() AND application_name = 'hookbox'",
        );
        let most = i64::from(app.config.database.pool_size) + i64::from(!extra.is_empty());
        assert!(
            (1..=most).contains(&open),
            "{open} connections, at most {most} ({extra})"
        );
    }
}

/// How many outbox rows the stripe event `id` has (none when it is not stored).
fn queued(app: &TestApp, id: &str) -> i64 {
    app.db.count(&format!(
        "deliveries d JOIN events e ON e.id = d.event_row \
         WHERE e.source = 'stripe' AND e.event_id = '{id}'"
    ))
}

fn stored(app: &TestApp, id: &str) -> i64 {
    app.db.count(&format!(
        "events WHERE source = 'stripe' AND event_id = '{id}'"
    ))
}

#[actix_web::test]
async fn a_forwarding_batch_that_falls_back_to_claims_one_by_one_queues_each_stored_event_once() {
    // The downstream is never reached (nothing listens there): the rows stay queued, countable.
    let extra = crate::forward::forward_extra("http://127.0.0.1:9/unused", "1s", 1);
    let app = spawn(&extra, Handlers::default()).await;
    let held_id = unique_id("evt_held");
    let fresh: Vec<String> = (0..10).map(|_| unique_id("evt_fresh")).collect();
    let ids: Vec<&String> = std::iter::once(&held_id).chain(&fresh).collect();
    let deliveries: Vec<Delivery> = ids
        .iter()
        .map(|id| app.delivery("stripe", &stripe_event(id, "charge.refunded", 1), id))
        .collect();

    // On PostgreSQL a batch that holds the held id waits for it, times out and falls back to
    // claims one by one, which store the others; on SQLite the held claim has the one write
    // lock, so nothing is stored until it goes.
    let held = HeldClaim::take(&app.db.url, "stripe", &held_id);
    let answers = join_all(deliveries.iter().map(|d| app.send(d))).await;
    drop(held);
    for (id, answer) in ids.iter().zip(&answers) {
        match answer.status {
            200 => assert_eq!(
                (stored(&app, id), queued(&app, id)),
                (1, 1),
                "{id}: answered 200, so stored and queued once"
            ),
            409 | 503 => assert_eq!(
                (stored(&app, id), queued(&app, id)),
                (0, 0),
                "{id}: refused ({}), so neither stored nor queued",
                answer.text()
            ),
            other => panic!("{id}: {other} {}", answer.text()),
        }
    }
    assert_eq!(answers[0].status, 409, "{}", answers[0].text());
    if !store_is_sqlite() {
        assert!(
            answers[1..].iter().all(|a| a.status == 200),
            "the claims one by one store the events the held one did not block"
        );
    }

    // The provider's retries: whatever was stored is a replay of its first answer, the rest is
    // claimed now, and every event ends with its one row.
    let again = join_all(deliveries.iter().map(|d| app.send(d))).await;
    for ((id, first), second) in ids.iter().zip(&answers).zip(&again) {
        assert_eq!(second.status, 200, "{id}: {}", second.text());
        assert_eq!(second.replayed(), first.status == 200, "{id}");
        if first.status == 200 {
            assert_eq!(second.body, first.body, "{id}: the same answer");
        }
        assert_eq!((stored(&app, id), queued(&app, id)), (1, 1), "{id}");
    }
    assert_eq!(app.db.count("deliveries"), 11);
}

#[actix_web::test]
async fn a_fresh_delivery_behind_a_locked_table_is_503_unavailable_not_409_in_progress() {
    // A migration's ALTER, a LOCK TABLE or an index built without CONCURRENTLY: no duplicate is
    // in flight, so "another delivery of this event is still being processed" would be false.
    if skip_on_sqlite(
        "a_fresh_delivery_behind_a_locked_table_is_503_unavailable_not_409_in_progress",
        "SQLite's busy store is already answered as such",
    ) {
        return;
    }
    let app = spawn("", Handlers::default()).await;
    for (table, mode) in [("events", "SHARE"), ("events", "ACCESS EXCLUSIVE")] {
        let warm = unique_id("evt_warm");
        let answer = app
            .send(&app.delivery("stripe", &sample_body("stripe", &warm), &warm))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());

        let id = unique_id("evt_locked");
        let body = sample_body("stripe", &id);
        let held = HeldTableLock::take(&app.db.url, table, mode);
        let answer = app.send(&app.delivery("stripe", &body, &id)).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (503, "unavailable"),
            "{table}: {}",
            answer.text()
        );
        assert!(answer.message().contains("locked"), "{}", answer.text());
        assert!(answer.header("retry-after").is_some(), "{table}");

        drop(held);
        let retried = app.send(&app.delivery("stripe", &body, &id)).await;
        assert_eq!(retried.status, 200, "{table}: {}", retried.text());
        assert!(!retried.replayed(), "{table}");
    }
}
