//! The operator console over plain HTTP: what it counts, who gets in, and what it refuses.

use std::time::{Duration, Instant};

use crate::helpers::*;

/// Polls `check` every 50 ms until it holds, failing with `what` after `limit`.
pub async fn poll_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn replays_are_added_to_the_events_row_in_batches() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let delivery = app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id);
    assert_eq!(app.send(&delivery).await.status, 200);
    for _ in 0..3 {
        assert!(app.send(&delivery).await.replayed());
    }
    let other = unique_id("evt");
    let untouched = app.delivery(
        "stripe",
        &stripe_event(&other, "charge.succeeded", 1),
        &other,
    );
    assert_eq!(app.send(&untouched).await.status, 200);

    poll_until(
        "the three replays are flushed",
        Duration::from_secs(10),
        || {
            app.db
                .count(&format!("events WHERE event_id = '{id}' AND replays = 3"))
                == 1
        },
    )
    .await;
    assert_eq!(
        app.db.count(&format!(
            "events WHERE event_id = '{other}' AND replays = 0"
        )),
        1,
        "an event never replayed counts none"
    );
}
