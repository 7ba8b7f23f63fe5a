//! Several forward targets per source, each with its `events` patterns, against real
//! downstream servers: who gets what, and the single-table form named `default`.

use std::time::Duration;

use hookbox::Handlers;

use crate::downstream::{always, Downstream};
use crate::forward::{deliveries, forward_extra};
use crate::helpers::*;

const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// One `[[sources.stripe.forward]]` table.
pub fn target(name: &str, url: &str, events: Option<&str>) -> String {
    let events = events.map_or(String::new(), |e| format!("events = {e}\n"));
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\ntimeout = \"5s\"\nmax_attempts = 3\nsecret = \"{FORWARD_SECRET}\"\n{events}"
    )
}

/// Sends one stripe event of type `kind`; returns its id.
pub async fn send_event(app: &TestApp, kind: &str) -> String {
    let id = unique_id("evt");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, kind, 1), &id))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    id
}

/// Waits until every delivery of each event is in `state`; returns the last listing of each.
pub async fn settled(app: &TestApp, ids: &[&str], state: &str) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut listed = Vec::new();
        for id in ids {
            listed.push(deliveries(app, id).await);
        }
        let done = listed.iter().all(|l| {
            l.as_array()
                .is_some_and(|l| l.iter().all(|d| d["state"] == state))
        });
        if done {
            return listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "deliveries never all {state}: {listed:?}"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The targets named in a listing of one event's deliveries, sorted.
fn targets_of(listed: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|d| d["target"].as_str().expect("a target name").to_owned())
        .collect();
    names.sort();
    names
}

/// The distinct keys a downstream received.
fn keys(downstream: &Downstream) -> Vec<String> {
    let mut keys: Vec<String> = downstream
        .received()
        .iter()
        .map(|r| r.header("idempotency-key").to_owned())
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

#[actix_web::test]
async fn two_targets_each_get_exactly_the_events_their_patterns_match() {
    let billing = Downstream::start(always(200));
    let audit = Downstream::start(always(204));
    let app = TestApp::spawn_with(
        &format!(
            "{}{}",
            target(
                "billing",
                &billing.url,
                Some(r#"["payment_intent.*", "charge.refunded"]"#)
            ),
            target(
                "audit",
                &audit.url,
                Some(r#"["*.created", "payment_intent.succeeded"]"#)
            ),
        ),
        Handlers::default(),
    )
    .await;
    let both = send_event(&app, "payment_intent.succeeded").await;
    let billing_only = send_event(&app, "charge.refunded").await;
    let audit_only = send_event(&app, "customer.created").await;
    let neither = send_event(&app, "invoice.paid").await;

    let listed = settled(&app, &[&both, &billing_only, &audit_only], "delivered").await;
    assert_eq!(targets_of(&listed[0]), ["audit", "billing"]);
    assert_eq!(targets_of(&listed[1]), ["billing"]);
    assert_eq!(targets_of(&listed[2]), ["audit"]);

    // Every row is delivered, so nothing more will be sent: what arrived is all there is.
    let key = |id: &str| format!("stripe:{id}");
    let mut expected = vec![key(&both), key(&billing_only)];
    expected.sort();
    assert_eq!(keys(&billing), expected);
    let mut expected = vec![key(&both), key(&audit_only)];
    expected.sort();
    assert_eq!(keys(&audit), expected);
    assert_eq!(billing.received().len(), 2, "each sent once");
    assert_eq!(audit.received().len(), 2, "each sent once");

    // Both targets got the one event with the same key, each told which target it is.
    let (to_billing, to_audit) = (
        &billing.for_key(&key(&both))[0],
        &audit.for_key(&key(&both))[0],
    );
    assert_eq!(
        to_billing.header("idempotency-key"),
        to_audit.header("idempotency-key")
    );
    assert_eq!(to_billing.header("x-hookbox-target"), "billing");
    assert_eq!(to_audit.header("x-hookbox-target"), "audit");
    assert_eq!(to_billing.body, to_audit.body);

    // The event no pattern matches is stored, and queued nowhere.
    let stored = app
        .get(
            &format!("/admin/events/stripe/{neither}"),
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    assert_eq!(deliveries(&app, &neither).await, serde_json::json!([]));
    assert_eq!(app.db.count("deliveries"), 4);
    assert_eq!(app.db.count("events"), 4);
}

#[actix_web::test]
async fn the_single_table_form_is_one_target_named_default() {
    let downstream = Downstream::start(always(200));
    let app = TestApp::spawn_with(
        &forward_extra(&downstream.url, "5s", 3),
        Handlers::default(),
    )
    .await;
    let id = send_event(&app, "anything.at_all").await;
    let listed = settled(&app, &[&id], "delivered").await;
    assert_eq!(targets_of(&listed[0]), ["default"]);
    let received = downstream.for_key(&format!("stripe:{id}"));
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].header("x-hookbox-target"), "default");
}
