//! Several forward targets per source, each with its `events` patterns, against real
//! downstream servers: who gets what, and the single-table form named `default`.

use std::time::Duration;

use futures_util::future::join_all;
use hookbox::Handlers;

use crate::downstream::{always, Downstream};
use crate::forward::{deliveries, forward_extra, poll_until};
use crate::helpers::*;

const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// One `[[sources.stripe.forward]]` table.
pub fn target(name: &str, url: &str, events: Option<&str>) -> String {
    let events = events.map_or(String::new(), |e| format!("events = {e}\n"));
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\ntimeout = \"5s\"\nmax_attempts = 3\nsecret = \"{FORWARD_SECRET}\"\n{events}"
    )
}

/// A server whose `stripe` source forwards to these `[[sources.stripe.forward]]` tables.
async fn spawn_targets(tables: &[String]) -> TestApp {
    TestApp::spawn_with(&tables.concat(), Handlers::default()).await
}

/// Stores a dead delivery of stripe event `id` to `gone`, a target no config names (one
/// removed from it since).
pub fn dead_to_a_removed_target(app: &TestApp, id: &str) {
    use diesel::RunQueryDsl;
    diesel::sql_query(format!(
        "INSERT INTO deliveries (event_row, target, source, received_at, queued_at, state) \
         SELECT id, 'gone', source, received_at, received_at, 'dead' FROM events \
         WHERE source = 'stripe' AND event_id = '{id}'"
    ))
    .execute(&mut app.db.connect())
    .expect("a dead row to a removed target");
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
    let app = spawn_targets(&[
        target(
            "billing",
            &billing.url,
            Some(r#"["payment_intent.*", "charge.refunded"]"#),
        ),
        target(
            "audit",
            &audit.url,
            Some(r#"["*.created", "payment_intent.succeeded"]"#),
        ),
    ])
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

/// An admin POST; its status and JSON body.
async fn admin_post(app: &TestApp, path: &str) -> (u16, serde_json::Value) {
    crate::helpers::admin_post(&app.address, path).await
}

/// The state of each of the event's deliveries, by target.
async fn states(app: &TestApp, id: &str) -> Vec<(String, String)> {
    let mut states: Vec<(String, String)> = deliveries(app, id)
        .await
        .as_array()
        .expect("a list")
        .iter()
        .map(|d| {
            (
                d["target"].as_str().unwrap_or_default().to_owned(),
                d["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    states.sort();
    states
}

#[actix_web::test]
async fn an_event_is_redelivered_to_each_target_or_to_one_with_the_same_key() {
    let (a, b) = (
        Downstream::start(always(200)),
        Downstream::start(always(200)),
    );
    let app = spawn_targets(&[target("a", &a.url, None), target("b", &b.url, None)]).await;
    let id = send_event(&app, "payment_intent.succeeded").await;
    let key = format!("stripe:{id}");
    settled(&app, &[&id], "delivered").await;

    let path = format!("/admin/events/stripe/{id}/redeliver");
    assert_eq!(
        admin_post(&app, &path).await,
        (202, serde_json::json!({"requeued": 2}))
    );
    settled(&app, &[&id], "delivered").await;
    for downstream in [&a, &b] {
        let received = downstream.for_key(&key);
        assert_eq!(received.len(), 2, "sent again");
        assert!(received.iter().all(|r| r.header("idempotency-key") == key));
        assert_eq!(received[1].header("x-hookbox-attempt"), "1", "a new series");
    }

    assert_eq!(
        admin_post(&app, &format!("{path}?target=a")).await,
        (202, serde_json::json!({"requeued": 1}))
    );
    settled(&app, &[&id], "delivered").await;
    assert_eq!(a.for_key(&key).len(), 3, "a got it again");
    assert_eq!(b.for_key(&key).len(), 2, "b did not");

    let (status, body) = admin_post(&app, &format!("{path}?target=nope")).await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("not_found"))
    );
    let (status, body) = admin_post(&app, "/admin/events/stripe/evt_never_stored/redeliver").await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("not_found"))
    );
    let unauthorised = awc::Client::new()
        .post(format!("{}{path}", app.address))
        .send()
        .await
        .expect("answers");
    assert_eq!(unauthorised.status().as_u16(), 401);
}

#[actix_web::test]
async fn dead_deliveries_are_requeued_in_bulk_by_source_and_target() {
    let (a, b) = (
        Downstream::start(always(200)),
        Downstream::start(always(410)),
    );
    let app = spawn_targets(&[target("a", &a.url, None), target("b", &b.url, None)]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(send_event(&app, "charge.refunded").await);
    }
    let expected = |b: &str| {
        vec![
            ("a".to_owned(), "delivered".to_owned()),
            ("b".to_owned(), b.to_owned()),
        ]
    };
    for id in &ids {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while states(&app, id).await != expected("dead") {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                states(&app, id).await
            );
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }
    b.behave(always(200));

    let none = serde_json::json!({"requeued": 0});
    for query in [
        "source=stripe&target=a",
        "source=stripe&target=b&since=2999-01-01",
    ] {
        assert_eq!(
            admin_post(&app, &format!("/admin/deliveries/requeue?{query}")).await,
            (202, none.clone()),
            "{query}"
        );
    }
    // A target the config does not have (for that source): as for a redeliver, 404 rather
    // than a count of rows no instance would send.
    // A target of spaces is a name no target has, not an empty filter (it re-queued every
    // target's dead deliveries, found by a black-box run).
    for query in [
        "source=github&target=b",
        "source=stripe&target=c",
        "target=c",
        "target=%20",
        "source=stripe&target=%09",
    ] {
        let (status, body) = admin_post(&app, &format!("/admin/deliveries/requeue?{query}")).await;
        assert_eq!(
            (status, &body["error"]),
            (404, &serde_json::json!("not_found")),
            "{query}"
        );
    }
    // A source the config does not have is named as the unknown one.
    let (status, body) = admin_post(&app, "/admin/deliveries/requeue?source=nosuch&target=b").await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("no source \"nosuch\"")),
        "{body}"
    );
    let (status, body) = admin_post(&app, "/admin/deliveries/requeue?since=whenever").await;
    assert_eq!(
        (status, &body["error"]),
        (400, &serde_json::json!("invalid_query"))
    );
    // An offset's `+` left unescaped reads as a space: the refusal says how to write it.
    let (status, body) = admin_post(
        &app,
        "/admin/deliveries/requeue?since=2026-12-07T10:00:00+02:00",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("%2B")),
        "{body}"
    );
    // A misspelt filter is refused, not ignored: ignored, it would requeue every dead delivery
    // (the count of 3 below shows this one requeued nothing).
    let (status, body) = admin_post(&app, "/admin/deliveries/requeue?soruce=github&target=b").await;
    assert_eq!(
        (status, &body["error"]),
        (400, &serde_json::json!("invalid_query"))
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("soruce")),
        "{body}"
    );

    // `since` is when a delivery was last queued (its claim, or its last requeue or
    // redeliver), not when it was first: rows first queued two hours ago and queued again
    // since (as here, by their claim a moment ago) count for `since=1h`.
    {
        use diesel::prelude::*;
        use hookbox::db::pg_schema::deliveries as pg;
        use hookbox::db::sqlite_schema::deliveries as lite;
        let two_hours_ago = chrono::Utc::now() - chrono::Duration::hours(2);
        let aged = match &mut app.db.connect() {
            hookbox::db::AnyConnection::Postgres(c) => diesel::update(pg::table)
                .set(pg::created_at.eq(two_hours_ago))
                .execute(c),
            hookbox::db::AnyConnection::Sqlite(c) => diesel::update(lite::table)
                .set(lite::created_at.eq(two_hours_ago))
                .execute(c),
        }
        .expect("age the rows");
        assert_eq!(aged, 6);
    }
    assert_eq!(
        admin_post(
            &app,
            "/admin/deliveries/requeue?source=stripe&target=b&since=1h"
        )
        .await,
        (202, serde_json::json!({"requeued": 3}))
    );
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    settled(&app, &refs, "delivered").await;
    for id in &ids {
        let key = format!("stripe:{id}");
        let to_b = b.for_key(&key);
        let statuses: Vec<u16> = to_b.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [410, 200], "dead once, then sent again");
        assert!(to_b.iter().all(|r| r.header("idempotency-key") == key));
        assert_eq!(
            a.for_key(&key).len(),
            1,
            "a's delivered rows are left alone"
        );
    }
    assert_eq!(
        admin_post(&app, "/admin/deliveries/requeue?source=stripe").await,
        (202, none),
        "nothing dead is left"
    );

    let metrics = app.get("/metrics", None).await.text();
    for line in [
        "hookbox_forward_total{source=\"stripe\",target=\"a\",result=\"delivered\"} 3",
        "hookbox_forward_total{source=\"stripe\",target=\"b\",result=\"dead\"} 3",
        "hookbox_forward_total{source=\"stripe\",target=\"b\",result=\"delivered\"} 3",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[actix_web::test]
async fn pending_deliveries_are_counted_per_target() {
    let fast = Downstream::start(always(200));
    let slow = Downstream::start(|_, _| (200, Duration::from_secs(30)));
    let app = spawn_targets(&[
        target("fast", &fast.url, None),
        target("slow", &slow.url, None).replace("timeout = \"5s\"", "timeout = \"60s\""),
    ])
    .await;
    let first = send_event(&app, "a").await;
    let second = send_event(&app, "b").await;
    let key = |id: &str| format!("stripe:{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = app.get("/metrics", None).await.text();
        // The total is the targets' counts added up.
        if metrics.contains("hookbox_forward_pending{source=\"stripe\",target=\"slow\"} 2")
            && metrics.contains("hookbox_forward_pending{source=\"stripe\",target=\"fast\"} 0")
            && metrics.contains("hookbox_forward_outbox{state=\"pending\"} 2")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        fast.for_key(&key(&first)).len() + fast.for_key(&key(&second)).len(),
        2
    );
}

#[actix_web::test]
async fn a_burst_of_concurrent_deliveries_queues_one_row_per_event_and_target_in_shared_batches() {
    // A forwarding source's claims go in batches with their outbox rows: a burst of events,
    // each delivered three times at once, lands many of them in the same transactions.
    let all = Downstream::start(always(200));
    let refunds = Downstream::start(always(200));
    let app = spawn_targets(&[
        target("all", &all.url, None),
        target("refunds", &refunds.url, Some(r#"["charge.refunded"]"#)),
    ])
    .await;
    let events: Vec<(String, &str)> = (0..30)
        .map(|n| {
            let kind = if n % 2 == 0 {
                "charge.refunded"
            } else {
                "charge.succeeded"
            };
            (unique_id("evt"), kind)
        })
        .collect();
    let mut requests = Vec::new();
    for (id, kind) in &events {
        for copy in 0..3 {
            // Stripe signs each retry afresh and counts down pending_webhooks.
            let body = stripe_event(id, kind, 3 - copy);
            requests.push(delivery_for(
                &app.config,
                "stripe",
                &body,
                id,
                unix_now() - i64::from(copy),
            ));
        }
    }
    let answers = join_all(requests.iter().map(|d| app.send(d))).await;
    for (n, (id, _)) in events.iter().enumerate() {
        let group = &answers[n * 3..n * 3 + 3];
        crate::concurrency::assert_one_processed_and_identical(group);
        assert_eq!(group[0].json()["event_id"], id.as_str());
    }

    let refunded: Vec<&str> = events
        .iter()
        .filter(|(_, kind)| *kind == "charge.refunded")
        .map(|(id, _)| id.as_str())
        .collect();
    assert_eq!(app.db.count("events"), 30);
    assert_eq!(app.db.count("deliveries WHERE target = 'all'"), 30);
    assert_eq!(app.db.count("deliveries WHERE target = 'refunds'"), 15);
    assert_eq!(
        app.db.count("deliveries"),
        45,
        "one row per (event, matching target), none more"
    );
    // The outbox rows a batch queues share their transaction (on PostgreSQL its id, `xmin`;
    // on SQLite the queued time the transaction writes); claims one by one each have their own.
    let shared = if store_is_sqlite() {
        "(SELECT queued_at FROM deliveries GROUP BY queued_at \
          HAVING count(DISTINCT event_row) > 1) shared"
    } else {
        "(SELECT xmin::text FROM deliveries GROUP BY xmin::text \
          HAVING count(DISTINCT event_row) > 1) shared"
    };
    assert!(
        app.db.count(shared) > 0,
        "no two events were claimed in one batch"
    );

    let ids: Vec<&str> = events.iter().map(|(id, _)| id.as_str()).collect();
    let listed = settled(&app, &ids, "delivered").await;
    for ((id, kind), listed) in events.iter().zip(&listed) {
        let expected: &[&str] = if *kind == "charge.refunded" {
            &["all", "refunds"]
        } else {
            &["all"]
        };
        assert_eq!(targets_of(listed), expected, "{id}");
    }
    let key = |id: &str| format!("stripe:{id}");
    let mut expected: Vec<String> = ids.iter().map(|id| key(id)).collect();
    expected.sort();
    assert_eq!(keys(&all), expected);
    assert_eq!(all.received().len(), 30, "each sent once");
    let mut expected: Vec<String> = refunded.iter().map(|id| key(id)).collect();
    expected.sort();
    assert_eq!(keys(&refunds), expected);
    assert_eq!(refunds.received().len(), 15, "each sent once");

    // Redelivered at once again: each a replay with the first answer, and nothing queued.
    let again = join_all(requests.iter().map(|d| app.send(d))).await;
    for (first, second) in answers.iter().zip(&again) {
        assert_eq!(second.status, 200, "{}", second.text());
        assert!(second.replayed());
        assert_eq!(second.body, first.body);
    }
    assert_eq!(app.db.count("deliveries"), 45);
    assert_eq!(app.db.count("deliveries WHERE state = 'delivered'"), 45);
}

#[actix_web::test]
async fn odd_admin_requests_get_their_contract_answers_and_never_a_5xx() {
    let sink = Downstream::start(always(410));
    let app = spawn_targets(&[target("a", &sink.url, None)]).await;
    let id = send_event(&app, "charge.refunded").await;
    settled(&app, &[id.as_str()], "dead").await;

    // A delivery id that is not a number is a delivery that does not exist, after the token
    // is checked as on every admin route.
    for path in [
        "/admin/deliveries/abc/requeue",
        "/admin/deliveries/99999999999999999999/requeue",
    ] {
        let (status, body) = admin_post(&app, path).await;
        assert_eq!(
            (status, &body["error"]),
            (404, &serde_json::json!("not_found")),
            "{path}"
        );
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no delivery")),
            "{path}: {body}"
        );
        let unauthorised = awc::Client::new()
            .post(format!("{}{path}", app.address))
            .insert_header(("Authorization", "Bearer nope"))
            .send()
            .await
            .expect("answers");
        assert_eq!(unauthorised.status().as_u16(), 401, "{path}");
    }
    // A method the route does not take: 405 `method_not_allowed`, as JSON, naming the one it
    // does.
    let answer = app
        .get("/admin/deliveries/requeue", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        (
            answer.status,
            answer.error().as_str(),
            answer.header("allow")
        ),
        (405, "method_not_allowed", Some("POST"))
    );

    // Values no store can hold, and a time before any store's: nothing matches, no 503.
    let none = serde_json::json!({"requeued": 0});
    assert_eq!(
        admin_post(&app, "/admin/deliveries/requeue?source=%00").await,
        (202, none.clone())
    );
    let (status, body) = admin_post(&app, "/admin/deliveries/requeue?target=a%00").await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("not_found")),
        "no target of that name is in the config"
    );
    // A redeliver to a target the config does not have (a typo, one since removed) would wait
    // for a target no instance sends to: 404, naming the ones there are.
    for target in ["%00", "nosuch"] {
        let path = format!("/admin/events/stripe/{id}/redeliver?target={target}");
        let (status, body) = admin_post(&app, &path).await;
        assert_eq!(
            (status, &body["error"]),
            (404, &serde_json::json!("not_found")),
            "{path}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains("its targets: a"), "{path}: {message}");
    }
    // A misspelt `target` is refused, not read as "every target".
    let (status, body) = admin_post(
        &app,
        &format!("/admin/events/stripe/{id}/redeliver?tagret=a"),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (400, &serde_json::json!("invalid_query"))
    );
    assert_eq!(app.db.count("deliveries WHERE state = 'pending'"), 0);
    for since in ["-5000-01-01", "10000y"] {
        let answer = app
            .get(&format!("/admin/events?since={since}"), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(answer.status, 200, "{since}: {}", answer.text());
        assert!(
            answer.text().contains(&id),
            "{since}: every event is since then"
        );
    }

    // Empty values, as the route is written (`?source=&target=&since=`), are no filter.
    assert_eq!(
        admin_post(&app, "/admin/deliveries/requeue?source=&target=&since=").await,
        (202, serde_json::json!({"requeued": 1}))
    );
    settled(&app, &[id.as_str()], "dead").await;
    // But a redeliver's one `target=`, given empty (a script's unset variable), would widen a
    // redeliver to one target to every target: refused, and nothing re-queued.
    let (status, body) = admin_post(
        &app,
        &format!("/admin/events/stripe/{id}/redeliver?target="),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_query"))
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("leave target out"),
        "{body}"
    );
    assert_eq!(app.db.count("deliveries WHERE state = 'pending'"), 0);
    assert_eq!(
        admin_post(&app, &format!("/admin/events/stripe/{id}/redeliver")).await,
        (202, serde_json::json!({"requeued": 1}))
    );
}

#[actix_web::test]
async fn a_redeliver_or_requeue_the_moment_the_downstream_answers_takes_the_event() {
    // An outcome is written some milliseconds after the downstream answered (the answer is
    // read, then outcomes are written in batches); asked in between, or while the attempt is
    // still under way, the admin API waits for it rather than finding the row still pending.
    let ok = Downstream::start(always(200));
    let gone = Downstream::start(|_, _| (410, Duration::from_millis(200)));
    let app = spawn_targets(&[target("ok", &ok.url, None), target("gone", &gone.url, None)]).await;
    let seen = |sink: &Downstream, key: &str, n: usize| sink.for_key(key).len() >= n;
    for _ in 0..3 {
        // Only this event's dead row: those of the rounds before are dead again by now.
        let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let id = send_event(&app, "charge.refunded").await;
        let key = format!("stripe:{id}");
        // Looked at every millisecond (not poll_until's 50 ms): the admin calls must come
        // within the few milliseconds before the outcomes are written.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !(seen(&ok, &key, 1) && gone.answering() == 1) {
            assert!(std::time::Instant::now() < deadline, "never forwarded");
            actix_web::rt::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            admin_post(
                &app,
                &format!("/admin/events/stripe/{id}/redeliver?target=ok")
            )
            .await,
            (202, serde_json::json!({"requeued": 1})),
            "redelivered the moment the downstream answered"
        );
        assert_eq!(
            admin_post(
                &app,
                &format!("/admin/deliveries/requeue?source=stripe&target=gone&since={since}")
            )
            .await,
            (202, serde_json::json!({"requeued": 1})),
            "re-queued while the attempt that ends it dead was under way"
        );
        poll_until("both were sent again", Duration::from_secs(10), || {
            seen(&ok, &key, 2) && seen(&gone, &key, 2)
        })
        .await;
    }
}

#[actix_web::test]
async fn a_redeliver_does_not_wait_for_another_events_attempt() {
    // The admin API waits for outcomes of the event it redelivers, not of every attempt under
    // way: one to a slow downstream for another event must not hold the call up.
    let slow_now = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let downstream = Downstream::start({
        let slow_now = slow_now.clone();
        move |_, _| {
            let slow = slow_now.load(std::sync::atomic::Ordering::SeqCst);
            (200, Duration::from_millis(if slow { 1500 } else { 0 }))
        }
    });
    let app = spawn_targets(&[target("app", &downstream.url, None)]).await;
    let done = send_event(&app, "charge.refunded").await;
    settled(&app, &[&done], "delivered").await;
    slow_now.store(true, std::sync::atomic::Ordering::SeqCst);
    let slow = send_event(&app, "charge.refunded").await;
    poll_until(
        "the slow attempt is under way",
        Duration::from_secs(10),
        || downstream.answering() == 1,
    )
    .await;
    assert_eq!(
        admin_post(&app, &format!("/admin/events/stripe/{done}/redeliver")).await,
        (202, serde_json::json!({"requeued": 1}))
    );
    assert!(
        downstream.for_key(&format!("stripe:{slow}")).is_empty(),
        "the redeliver waited for the other event's attempt to end"
    );
    poll_until("the event was sent again", Duration::from_secs(10), || {
        downstream.for_key(&format!("stripe:{done}")).len() == 2
    })
    .await;
}

#[actix_web::test]
async fn a_dead_delivery_to_a_target_since_removed_from_the_config_is_not_requeued() {
    let a = Downstream::start(always(200));
    let app = spawn_targets(&[target("a", &a.url, None)]).await;
    let id = send_event(&app, "charge.refunded").await;
    settled(&app, &[id.as_str()], "delivered").await;
    // A dead delivery of the event to a target an earlier config had.
    dead_to_a_removed_target(&app, &id);
    let gone = app
        .db
        .count("deliveries WHERE target = 'gone' AND state = 'dead'");
    assert_eq!(gone, 1);

    assert_eq!(
        admin_post(&app, "/admin/deliveries/requeue").await,
        (202, serde_json::json!({"requeued": 0})),
        "no instance would send it"
    );
    let (status, body) = admin_post(&app, "/admin/deliveries/requeue?target=gone").await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("not_found"))
    );
    let row = app.db.count("deliveries WHERE target = 'gone'");
    assert_eq!(row, 1);
    let listed = app
        .get(
            &format!("/admin/events/stripe/{id}/deliveries"),
            Some(ADMIN_TOKEN),
        )
        .await
        .json();
    let gone_id = listed["deliveries"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["target"] == "gone"))
        .map(|r| r["id"].clone())
        .expect("the row is listed");
    let (status, body) = admin_post(&app, &format!("/admin/deliveries/{gone_id}/requeue")).await;
    assert_eq!(
        (status, &body["error"]),
        (404, &serde_json::json!("not_found"))
    );
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("not in the config any more")),
        "{body}"
    );
    assert_eq!(
        app.db
            .count("deliveries WHERE target = 'gone' AND state = 'dead'"),
        1,
        "it stays dead"
    );
}

#[actix_web::test]
async fn patterns_match_the_event_type_as_kept_cut_at_255_bytes() {
    // The type is kept cut at 255 bytes for the admin API and the X-Hookbox-Event-Type
    // header; the filter matched the whole type, so a pattern on what was cut off queued a
    // row whose header showed a type the pattern does not match (bb56).
    let tail = Downstream::start(always(200));
    let head = Downstream::start(always(200));
    let app = spawn_targets(&[
        target("tail", &tail.url, Some(r#"["*z"]"#)),
        target("head", &head.url, Some(r#"["aaa*"]"#)),
    ])
    .await;
    let long = format!("{}z", "a".repeat(300));
    let id = send_event(&app, &long).await;
    let listed = settled(&app, &[&id], "delivered").await;
    assert_eq!(targets_of(&listed[0]), ["head"]);
    let sent = &head.for_key(&format!("stripe:{id}"))[0];
    assert_eq!(sent.header("x-hookbox-event-type"), "a".repeat(255));
    assert!(tail.received().is_empty());
}
