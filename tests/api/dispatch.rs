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

#[actix_web::test]
async fn a_target_with_rate_twenty_per_second_gets_a_hundred_events_over_five_seconds() {
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let app = TestApp::spawn_with(
        &target("paced", &downstream.url, "rate = \"20/s\""),
        Handlers::default(),
    )
    .await;
    let ids = ids(100);
    send_all(&app.address, &app.config, &ids, 25).await;
    // Stored far faster than 20/s: the pace, not the intake, is what holds the rest back.
    let arrived_while_storing = downstream.received().len();
    assert!(
        arrived_while_storing < 80,
        "{arrived_while_storing} of 100 already arrived while they were being stored"
    );
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(&downstream, &ids, None),
    )
    .await;

    let mut starts: Vec<_> = downstream.received().iter().map(|r| r.at).collect();
    starts.sort();
    assert_eq!(starts.len(), 100, "one attempt each");
    let took = starts[99] - starts[0];
    assert!(
        took >= Duration::from_millis(4500),
        "100 attempts in {took:?}"
    );
    for (i, start) in starts.iter().enumerate() {
        let in_window = starts[i..]
            .iter()
            .take_while(|at| **at - *start < Duration::from_secs(1))
            .count();
        assert!(
            in_window <= 21,
            "{in_window} attempts started in the second from attempt {i}"
        );
    }
}
