//! A handler that fails or panics mid-transaction leaves nothing behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use hookbox::{AnyConnection, Event, Handler, Handlers, Response};

use crate::helpers::*;
use crate::provider::{eventually, Counting};

/// Writes a row of its own, then fails or panics on its first `failures` calls.
struct Flaky {
    calls: Arc<AtomicUsize>,
    failures: usize,
    panics: bool,
}

impl Handler for Flaky {
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        diesel::sql_query("CREATE TABLE IF NOT EXISTS side_effects (event_row BIGINT NOT NULL REFERENCES events (id) ON DELETE CASCADE)")
            .execute(conn)?;
        Ok(())
    }

    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        diesel::sql_query(format!(
            "INSERT INTO side_effects VALUES ({})",
            event.row_id
        ))
        .execute(conn)?;
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            if self.panics {
                panic!("the handler panicked mid-transaction (on purpose)");
            }
            anyhow::bail!("the ledger service said no (on purpose)");
        }
        Ok(Response::processed(event))
    }
}

async fn failing_then_recovering(panics: bool) {
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = Flaky {
        calls: calls.clone(),
        failures: 1,
        panics,
    };
    let app = TestApp::spawn_with("", Handlers::default().with("stripe", handler)).await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "payment_intent.succeeded", 1);

    let failed = app.send(&app.delivery("stripe", &body, &id)).await;
    assert_eq!(
        (failed.status, failed.error().as_str()),
        (500, "processing_failed")
    );
    assert_eq!(app.db.count("events"), 0, "the claim was rolled back");
    assert_eq!(
        app.db.count("side_effects"),
        0,
        "the handler's write was rolled back"
    );

    let retried = app.send(&app.delivery("stripe", &body, &id)).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert!(!retried.replayed(), "the retry processes the event afresh");
    assert_eq!(app.db.count("side_effects"), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let again = app.send(&app.delivery("stripe", &body, &id)).await;
    assert!(again.replayed());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "a replay never reaches the handler"
    );
}

#[actix_web::test]
async fn a_handler_error_rolls_everything_back_and_the_retry_processes_the_event() {
    failing_then_recovering(false).await;
}

#[actix_web::test]
async fn a_handler_panic_rolls_everything_back_and_the_retry_processes_the_event() {
    failing_then_recovering(true).await;
}

#[actix_web::test]
async fn a_failed_first_delivery_lets_a_concurrent_duplicate_claim_the_event() {
    // The first claim fails and rolls back while its duplicate waits on the row: the duplicate
    // then claims the event itself instead of finding nothing.
    struct SlowFail(Arc<AtomicUsize>);
    impl Handler for SlowFail {
        fn handle(&self, _conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(500));
                anyhow::bail!("first attempt fails (on purpose)");
            }
            Ok(Response::processed(event))
        }
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let app = TestApp::spawn_with(
        "",
        Handlers::default().with("stripe", SlowFail(calls.clone())),
    )
    .await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "a", 1);
    let first = app.delivery("stripe", &body, &id);
    let second = delivery_for(&app.config, "stripe", &body, &id, unix_now() - 1);
    let (a, b) = tokio::join!(app.send(&first), async {
        // The duplicate arrives once the original is inside its handler, holding the claim.
        eventually(
            "the original is in its handler",
            Duration::from_secs(10),
            || calls.load(Ordering::SeqCst) == 1,
        )
        .await;
        app.send(&second).await
    });
    assert_eq!(a.status, 500);
    assert_eq!(b.status, 200, "{}", b.text());
    assert!(!b.replayed());
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn a_duplicate_of_a_delivery_slower_than_in_flight_wait_gets_409_then_a_replay() {
    let db = TestDb::create();
    let text =
        config_text(&db.url, "").replace("in_flight_wait = \"3s\"", "in_flight_wait = \"1s\"");
    // Holds its transaction open for 2.5 s, well past the 1 s in-flight wait.
    let slow = Counting::new(Duration::from_millis(2500));
    let entered = slow.entered.clone();
    let app = TestApp::spawn_on(
        db,
        parse_config(&text),
        Handlers::default().with("stripe", slow),
    )
    .await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "a", 1);
    let first = app.delivery("stripe", &body, &id);
    let second = delivery_for(&app.config, "stripe", &body, &id, unix_now() - 1);
    let (a, b) = tokio::join!(app.send(&first), async {
        // The duplicate arrives once the original is inside its handler, holding the claim.
        eventually(
            "the original is in its handler",
            Duration::from_secs(10),
            || entered.load(Ordering::SeqCst) == 1,
        )
        .await;
        app.send(&second).await
    });
    assert_eq!(a.status, 200, "the original still commits");
    assert_eq!((b.status, b.error().as_str()), (409, "in_progress"));
    assert!(b
        .header("Retry-After")
        .is_some_and(|v| v.parse::<u64>().is_ok()));
    let retry = app.send(&second).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, a.body);
    assert_eq!(entered.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(app.db.count("side_effects"), 1);
}
