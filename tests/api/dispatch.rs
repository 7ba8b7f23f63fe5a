//! The forward dispatcher's limits, with the real dispatcher of a real server running against
//! real local sinks: `concurrency`, `rate`, `ordered`, and a SIGKILL with hundreds pending.

use std::time::Duration;

use hookbox::Handlers;

use crate::downstream::Downstream;
use crate::forward::poll_until;
use crate::helpers::*;

const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A `[[sources.stripe.forward]]` target named `name` at `url`, with `extra` keys.
fn target(name: &str, url: &str, extra: &str) -> String {
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{FORWARD_SECRET}\"\n{extra}\n"
    )
}

/// `n` fresh event ids.
fn ids(n: usize) -> Vec<String> {
    (0..n).map(|_| unique_id("evt")).collect()
}

/// Sends every event to `address`, `at_once` at a time, and asserts each was stored.
async fn send_all(address: &str, config: &hookbox::config::Config, ids: &[String], at_once: usize) {
    for chunk in ids.chunks(at_once) {
        let sends = chunk.iter().map(|id| {
            let delivery =
                delivery_for(config, "stripe", &stripe_event(id, "a", 1), id, unix_now());
            async move { send(address, &delivery).await.status }
        });
        let statuses = futures_util::future::join_all(sends).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
}

/// Whether every event of `ids` was answered 200 by `downstream` (to `target`, if given).
fn all_delivered(downstream: &Downstream, ids: &[String], target: Option<&str>) -> bool {
    let received = downstream.received();
    ids.iter().all(|id| {
        let key = format!("stripe:{id}");
        received.iter().any(|r| {
            r.status == 200
                && r.header("idempotency-key") == key
                && target.is_none_or(|t| r.header("x-hookbox-target") == t)
        })
    })
}

#[actix_web::test]
async fn a_target_with_concurrency_two_never_has_more_than_two_requests_in_flight() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(150)));
    let app = TestApp::spawn_with(
        &target("slow", &downstream.url, "concurrency = 2"),
        Handlers::default(),
    )
    .await;
    let ids = ids(20);
    send_all(&app.address, &app.config, &ids, 20).await;
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    assert_eq!(
        downstream.most_in_flight(),
        2,
        "two at once, and never more, with 20 waiting"
    );
}
