//! `in_flight_wait` bounds the whole wait of a duplicate, however many waits it is made of: a
//! claim batch that times out and falls back to claims one by one does not start the wait over.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use hookbox::{AnyConnection, Handlers};

use crate::helpers::*;

/// An uncommitted claim of `source`'s event `event_id`, held on a connection of the test's own
/// (another process, as far as the server can tell) until it is dropped, then rolled back.
struct HeldClaim(AnyConnection);

impl HeldClaim {
    fn take(url: &str, source: &str, event_id: &str) -> HeldClaim {
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
    let text =
        config_text(&db.url, extra).replace("in_flight_wait = \"3s\"", "in_flight_wait = \"2s\"");
    TestApp::spawn_on(db, parse_config(&text), handlers).await
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

#[actix_web::test]
async fn a_claim_in_a_transaction_behind_an_uncommitted_claim_gets_409_within_in_flight_wait() {
    // A forwarding source claims in a transaction of its own.
    let extra = crate::forward::forward_extra("http://127.0.0.1:9/unused", "1s", 1);
    let app = spawn(&extra, Handlers::default()).await;
    duplicate_behind_a_held_claim_gets_409_within_the_wait(&app, "stripe").await;
}
