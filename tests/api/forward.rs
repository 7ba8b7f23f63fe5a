//! Forwarding through the outbox, against a real downstream server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use diesel::RunQueryDsl;
use hmac::{KeyInit, Mac};
use hookbox::forward::{Outbox, Target};
use hookbox::metrics::Metrics;
use hookbox::Handlers;

use crate::downstream::{always, Downstream};
use crate::helpers::*;

const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

pub fn forward_extra(url: &str, timeout: &str, max_attempts: u32) -> String {
    format!(
        "\n[sources.stripe.forward]\nurl = \"{url}\"\ntimeout = \"{timeout}\"\nmax_attempts = {max_attempts}\nsecret = \"{FORWARD_SECRET}\"\n"
    )
}

pub async fn poll_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks a Standard Webhooks signature by the spec, by hand: HMAC-SHA256 keyed by the
/// base64-decoded secret over `{id}.{timestamp}.{body}`, base64, as `v1,<sig>`.
fn assert_standard_signature(received: &crate::downstream::Received) {
    let key = base64::engine::general_purpose::STANDARD
        .decode(FORWARD_SECRET.trim_start_matches("whsec_"))
        .expect("base64 secret");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(received.header("webhook-id").as_bytes());
    mac.update(b".");
    mac.update(received.header("webhook-timestamp").as_bytes());
    mac.update(b".");
    mac.update(&received.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    let signatures: Vec<&str> = received.header("webhook-signature").split(' ').collect();
    assert!(
        signatures.contains(&expected.as_str()),
        "{signatures:?} lacks {expected}"
    );
    let timestamp: i64 = received
        .header("webhook-timestamp")
        .parse()
        .expect("a unix timestamp");
    assert!((unix_now() - timestamp).abs() < 60, "a fresh timestamp");
}

/// The admin API's list of the stripe event's deliveries.
pub async fn deliveries(app: &TestApp, id: &str) -> serde_json::Value {
    let answer = app
        .get(
            &format!("/admin/events/stripe/{id}/deliveries"),
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["deliveries"].clone()
}

/// The event's deliveries once the first is in `state` (as the admin API lists them), polled
/// for up to `limit`; the last listing, whatever it says, when the time is up.
pub async fn first_delivery_in(
    app: &TestApp,
    id: &str,
    state: &str,
    limit: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let listed = deliveries(app, id).await;
        if listed[0]["state"] == state || Instant::now() >= deadline {
            return listed;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server whose stripe source forwards to `downstream`.
async fn forwarding_app(downstream: &Downstream, timeout: &str, max_attempts: u32) -> TestApp {
    TestApp::spawn_with(
        &forward_extra(&downstream.url, timeout, max_attempts),
        Handlers::default(),
    )
    .await
}

/// What reached `downstream` of the stripe event `id`, once something has (within 5 s).
async fn arrived(downstream: &Downstream, id: &str) -> Vec<crate::downstream::Received> {
    let key = format!("stripe:{id}");
    poll_until(
        "the event reaches the downstream",
        Duration::from_secs(5),
        || !downstream.for_key(&key).is_empty(),
    )
    .await;
    downstream.for_key(&key)
}

#[actix_web::test]
async fn a_delivery_without_a_content_type_is_forwarded_without_one() {
    let downstream = Downstream::start(always(200));
    let app = forwarding_app(&downstream, "5s", 12).await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "payment_intent.succeeded", 1);
    let delivery = app
        .delivery("stripe", &body, &id)
        .without_header("content-type");
    assert_eq!(app.send(&delivery).await.status, 200);

    let got = &arrived(&downstream, &id).await[0];
    assert_eq!(got.body, body.as_bytes());
    assert!(
        !got.headers.contains_key("content-type"),
        "the original had none, and none is made up: {:?}",
        got.headers
    );
}

#[actix_web::test]
async fn an_event_type_of_many_kilobytes_is_forwarded_cut_in_its_header_and_whole_in_the_body() {
    let downstream = Downstream::start(always(200));
    let app = forwarding_app(&downstream, "5s", 12).await;
    let id = unique_id("evt");
    let kind = "t".repeat(40_000);
    let body = stripe_event(&id, &kind, 1);
    let answer = app.send(&app.delivery("stripe", &body, &id)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // Many receivers refuse a header of 40 KB (431), which would make the delivery dead.
    let got = &arrived(&downstream, &id).await[0];
    let header = got.header("x-hookbox-event-type");
    assert_eq!(header.len(), 255, "the type's header is cut at 255 bytes");
    assert!(header.bytes().all(|b| b == b't'));
    assert!(got.body == body.as_bytes(), "the body keeps the type whole");
}

#[actix_web::test]
async fn a_stored_event_is_forwarded_once_signed_with_its_key_and_a_redelivery_queues_nothing() {
    let downstream = Downstream::start(always(200));
    let app = forwarding_app(&downstream, "5s", 12).await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "payment_intent.succeeded", 1);
    let answer = app.send(&app.delivery("stripe", &body, &id)).await;
    assert_eq!(answer.status, 200);

    let key = format!("stripe:{id}");
    let received = arrived(&downstream, &id).await;
    assert_eq!(received.len(), 1);
    let got = &received[0];
    assert_eq!(
        got.body,
        body.as_bytes(),
        "the original body, byte for byte"
    );
    assert_eq!(got.header("webhook-id"), key);
    assert_eq!(got.header("content-type"), "application/json");
    assert_eq!(got.header("x-hookbox-source"), "stripe");
    assert!(
        got.header("user-agent").starts_with("hookbox/"),
        "{:?}",
        got.headers
    );
    assert_eq!(got.header("x-hookbox-event-id"), id);
    assert_eq!(
        got.header("x-hookbox-event-type"),
        "payment_intent.succeeded"
    );
    assert_eq!(got.header("x-hookbox-attempt"), "1");
    assert_standard_signature(got);

    let redelivery = app.send(&app.delivery("stripe", &body, &id)).await;
    assert!(redelivery.replayed());
    let listed = deliveries(&app, &id).await;
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "a replay queues nothing: {listed}"
    );
    let mut state = String::new();
    for _ in 0..50 {
        state = deliveries(&app, &id).await[0]["state"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if state == "delivered" {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "delivered");
    assert_eq!(app.forward_pass().await, 0, "nothing is due once delivered");
    assert_eq!(downstream.for_key(&key).len(), 1, "sent once");
    assert_eq!(app.db.count("deliveries"), 1);

    // A source without a forward target queues nothing.
    let gh = unique_id("gh");
    assert_eq!(
        app.send(&app.delivery("github", "{}", &gh)).await.status,
        200
    );
    assert_eq!(app.db.count("deliveries"), 1);
}

/// Sends one new stripe event to `app`; returns its id and its `Idempotency-Key`.
async fn send_one(app: &TestApp) -> (String, String) {
    let id = unique_id("evt");
    app.send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
        .await;
    let key = format!("stripe:{id}");
    (id, key)
}

#[actix_web::test]
async fn a_failing_downstream_is_retried_with_growing_gaps_and_the_same_key() {
    let downstream =
        Downstream::start(|_, earlier| (if earlier < 3 { 503 } else { 200 }, Duration::ZERO));
    let app = forwarding_app(&downstream, "5s", 12).await;
    let (id, key) = send_one(&app).await;
    poll_until(
        "the fourth attempt succeeds",
        Duration::from_secs(20),
        || downstream.for_key(&key).iter().any(|r| r.status == 200),
    )
    .await;
    let attempts = downstream.for_key(&key);
    assert_eq!(attempts.len(), 4);
    let numbers: Vec<&str> = attempts
        .iter()
        .map(|r| r.header("x-hookbox-attempt"))
        .collect();
    assert_eq!(numbers, ["1", "2", "3", "4"]);
    assert!(attempts.iter().all(|r| r.header("webhook-id") == key));
    // Each attempt is signed afresh: its own timestamp, and a signature over it (as
    // docs/forwarding.md says), while the key stays.
    for attempt in &attempts {
        assert_standard_signature(attempt);
    }
    let (first, last) = (&attempts[0], &attempts[3]);
    assert_ne!(
        first.header("webhook-timestamp"),
        last.header("webhook-timestamp")
    );
    assert_ne!(
        first.header("webhook-signature"),
        last.header("webhook-signature")
    );
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(400)),
        "backed off: {gaps:?}"
    );
    assert!(gaps[2] > gaps[0], "the gaps grow: {gaps:?}");
    let listed = deliveries(&app, &id).await;
    assert_eq!(listed[0]["attempts"], 4);
}

#[actix_web::test]
async fn a_429_waits_for_its_retry_after_another_4xx_is_not_retried_and_no_answer_is_retried() {
    // Three targets of one source: a downstream that answers 429 (Retry-After: 2) once, one
    // that answers 400, and a port where nothing listens.
    let limited =
        Downstream::start(|_, earlier| (if earlier == 0 { 429 } else { 200 }, Duration::ZERO));
    limited.retry_after("2");
    let refusing = Downstream::start(always(400));
    let targets: String = [("limited", limited.url.as_str()), ("refusing", refusing.url.as_str()), ("gone", "http://127.0.0.1:1/")]
        .iter()
        .map(|(name, url)| {
            format!(
                "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{FORWARD_SECRET}\"\ntimeout = \"2s\"\nmax_attempts = 12\n"
            )
        })
        .collect();
    let app = TestApp::spawn_with(&targets, Handlers::default()).await;
    let (id, key) = send_one(&app).await;
    poll_until(
        "the 429 is followed by a delivered attempt",
        Duration::from_secs(20),
        || limited.for_key(&key).iter().any(|r| r.status == 200),
    )
    .await;
    let attempts = limited.for_key(&key);
    assert_eq!(attempts.len(), 2, "429, then 200");
    let gap = attempts[1].at - attempts[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "retried {gap:?} after a Retry-After of 2 s (the backoff alone is 0.5-1 s)"
    );

    let state_of = |listed: &serde_json::Value, target: &str| {
        listed
            .as_array()
            .expect("a list")
            .iter()
            .find(|d| d["target"] == target)
            .cloned()
            .expect("a delivery to each target")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let listed = deliveries(&app, &id).await;
        let gone = state_of(&listed, "gone");
        if gone["attempts"].as_i64().unwrap_or(0) >= 2 {
            assert_eq!(
                gone["state"], "pending",
                "a connection refused is retried: {gone}"
            );
            assert!(gone["last_status"].is_null(), "{gone}");
            assert!(
                gone["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("cannot reach")),
                "{gone}"
            );
            let refused = state_of(&listed, "refusing");
            assert_eq!(refused["state"], "dead", "{refused}");
            assert_eq!(refused["attempts"], 1, "a 400 is not retried: {refused}");
            assert_eq!(refused["last_status"], 400);
            // Every time to the microsecond on both stores (a retry's due time was computed
            // with nanoseconds, which SQLite's text kept).
            let times = [&gone["created_at"], &gone["next_attempt_at"]];
            for time in times {
                let text = time.as_str().unwrap_or_default();
                assert!(
                    text.len() == 27 && text.as_bytes()[19] == b'.' && text.ends_with('Z'),
                    "{time} in {listed}"
                );
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{listed}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refusing.for_key(&key).len(), 1);
}

#[actix_web::test]
async fn a_410_stops_the_delivery_at_once() {
    let downstream = Downstream::start(always(410));
    let app = forwarding_app(&downstream, "5s", 12).await;
    let (id, key) = send_one(&app).await;
    poll_until("the 410 arrives", Duration::from_secs(5), || {
        !downstream.for_key(&key).is_empty()
    })
    .await;
    let listed = first_delivery_in(&app, &id, "dead", Duration::from_millis(2500)).await;
    assert_eq!(listed[0]["state"], "dead");
    assert_eq!(listed[0]["last_status"], 410);
    assert_eq!(app.forward_pass().await, 0, "nothing is due once dead");
    assert_eq!(
        downstream.for_key(&key).len(),
        1,
        "no further attempt after 410"
    );
}

#[actix_web::test]
async fn a_dispatcher_pass_sends_what_is_due_and_then_nothing() {
    // The server does not forward, so no dispatcher of its own races the pass: the test queues
    // the stored event by hand and drives an outbox over the same database.
    let downstream = Downstream::start(always(200));
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "a", 1);
    assert_eq!(
        app.send(&app.delivery("stripe", &body, &id)).await.status,
        200
    );
    diesel::sql_query(format!(
        "INSERT INTO deliveries (event_row, source, received_at, queued_at) \
         SELECT id, source, received_at, received_at FROM events \
         WHERE source = 'stripe' AND event_id = '{id}'"
    ))
    .execute(&mut app.db.connect())
    .expect("queue the event");

    let forwarding = parse_config(&config_text(
        &app.db.url,
        &forward_extra(&downstream.url, "5s", 12),
    ));
    let stripe = source_named(&forwarding, "stripe");
    let config = stripe.forward.first().expect("it forwards").clone();
    let target = Target::new(config).expect("a target");
    let outbox = Outbox::new(
        hookbox::db::pool(&forwarding.database, Duration::from_secs(3)).expect("a pool"),
        forwarding.database.store.clone(),
        Arc::new(Metrics::new(forwarding.sources.iter().map(|s| &s.name))),
        HashMap::from([(
            ("stripe".to_owned(), "default".to_owned()),
            Arc::new(target),
        )]),
    )
    .expect("one source forwards");

    assert_eq!(outbox.pass().await, 1, "the queued delivery is sent");
    let key = format!("stripe:{id}");
    let received = downstream.for_key(&key);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, body.as_bytes());
    assert_standard_signature(&received[0]);
    assert_eq!(deliveries(&app, &id).await[0]["state"], "delivered");
    assert_eq!(outbox.pass().await, 0, "nothing is due once delivered");
    assert_eq!(downstream.for_key(&key).len(), 1);
}

/// A server whose stripe source forwards to a downstream that never answers within the 300 ms
/// timeout, with 2 attempts: each delivery is dead-lettered within about two seconds.
pub async fn forwarding_to_a_silent_downstream() -> (Downstream, TestApp) {
    let downstream = Downstream::start(|_, _| (200, Duration::from_secs(3)));
    let app = forwarding_app(&downstream, "300ms", 2).await;
    (downstream, app)
}

#[actix_web::test]
async fn a_downstream_that_never_answers_is_dead_lettered_and_can_be_requeued() {
    let (downstream, app) = forwarding_to_a_silent_downstream().await;
    let id = unique_id("evt");
    app.send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
        .await;

    let listed = first_delivery_in(&app, &id, "dead", Duration::from_secs(10)).await;
    assert_eq!(listed[0]["state"], "dead", "{listed}");
    assert_eq!(listed[0]["attempts"], 2);
    assert!(
        listed[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("no answer within")),
        "{listed}"
    );
    let metrics = app.get("/metrics", None).await.text();
    assert!(
        metrics.contains(
            "hookbox_forward_total{source=\"stripe\",target=\"default\",result=\"dead\"} 1"
        ),
        "{metrics}"
    );

    downstream.behave(always(200));
    let delivery_id = listed[0]["id"].as_i64().expect("delivery id");
    let requeue_path = format!("/admin/deliveries/{delivery_id}/requeue");
    // The route takes no query: a parameter is refused, as on the routes that take some.
    let (status, refused) =
        admin_post(&app.address, &format!("{requeue_path}?target=default")).await;
    assert_eq!(
        (status, &refused["error"]),
        (400, &serde_json::json!("invalid_query")),
        "{refused}"
    );
    let (status, shown) = admin_post(&app.address, &requeue_path).await;
    assert_eq!(status, 200, "{shown}");
    // A new series, with nothing of the old one's last answer.
    assert_eq!(
        (
            &shown["state"],
            &shown["attempts"],
            &shown["last_status"],
            &shown["last_error"]
        ),
        (
            &serde_json::json!("pending"),
            &serde_json::json!(0),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ),
        "{shown}"
    );
    let key = format!("stripe:{id}");
    poll_until(
        "the re-queued delivery gets through",
        Duration::from_secs(10),
        || downstream.first_attempt_succeeded(&key),
    )
    .await;
    let (status, again) = admin_post(&app.address, &requeue_path).await;
    assert_eq!(
        status, 409,
        "only a dead delivery can be re-queued: {again}"
    );
}

#[actix_web::test]
async fn a_slow_downstream_does_not_slow_the_providers_answers() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_secs(3)));
    let app = forwarding_app(&downstream, "10s", 12).await;
    // A first request opens the server's database connections, which on a busy machine takes
    // its own while; the answers timed below are those of a server already up.
    let warm = unique_id("gh");
    assert_eq!(
        app.send(&app.delivery("github", "{}", &warm)).await.status,
        200
    );
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let id = unique_id("evt");
        let sent = Instant::now();
        let answer = app
            .send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
            .await;
        slowest = slowest.max(sent.elapsed());
        assert_eq!(answer.status, 200);
    }
    // An answer that waited for the downstream would take its 3 s; the margin below that is
    // for a busy machine, not a speed requirement.
    assert!(
        slowest < Duration::from_millis(2500),
        "slowest provider answer {slowest:?} with a 3 s downstream"
    );
}

#[actix_web::test]
async fn after_a_sigkill_every_pending_delivery_reaches_the_downstream() {
    let downstream = Downstream::start(always(503));
    let db = TestDb::create();
    let text = config_text(&db.url, &forward_extra(&downstream.url, "1s", 50));
    let config = parse_config(&text);
    let mut first = Process::serve(&text);
    let ids: Vec<String> = (0..30).map(|_| unique_id("evt")).collect();
    for id in &ids {
        let delivery = delivery_for(&config, "stripe", &stripe_event(id, "a", 1), id, unix_now());
        assert_eq!(send(&first.address, &delivery).await.status, 200);
    }
    poll_until("attempts are under way", Duration::from_secs(5), || {
        downstream.received().len() >= 10
    })
    .await;
    first.child.kill().expect("SIGKILL");
    let _ = first.child.wait();
    assert!(
        db.count("deliveries WHERE state = 'pending'") > 0,
        "deliveries were pending"
    );

    downstream.behave(always(200));
    let _second = Process::serve(&text);
    poll_until(
        "every event reached the downstream",
        Duration::from_secs(30),
        || {
            let received = downstream.received();
            ids.iter().all(|id| {
                let key = format!("stripe:{id}");
                received
                    .iter()
                    .any(|r| r.status == 200 && r.header("idempotency-key") == key)
            })
        },
    )
    .await;
    poll_until(
        "every delivery is recorded delivered",
        Duration::from_secs(10),
        || db.count("deliveries WHERE state = 'delivered'") == ids.len() as i64,
    )
    .await;
}

#[actix_web::test]
async fn two_processes_share_the_outbox_and_never_send_one_event_twice_at_once() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(30)));
    let db = TestDb::create();
    let text = config_text(&db.url, &forward_extra(&downstream.url, "5s", 12));
    let config = parse_config(&text);
    let one = Process::serve(&text);
    let two = Process::serve(&text);
    let ids: Vec<String> = (0..200).map(|_| unique_id("evt")).collect();
    let sends = ids.iter().enumerate().map(|(i, id)| {
        let address = if i % 2 == 0 {
            one.address.clone()
        } else {
            two.address.clone()
        };
        let delivery = delivery_for(&config, "stripe", &stripe_event(id, "a", 1), id, unix_now());
        async move { send(&address, &delivery).await.status }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    poll_until("every event arrived", Duration::from_secs(60), || {
        db.count("deliveries WHERE state = 'delivered'") == ids.len() as i64
    })
    .await;
    let received = downstream.received();
    for id in &ids {
        let key = format!("stripe:{id}");
        assert!(
            received.iter().any(|r| r.header("idempotency-key") == key),
            "{key} never arrived"
        );
    }
    assert_eq!(
        downstream.overlaps(),
        0,
        "no key was delivered twice at the same moment"
    );
    let logs = format!("{}{}", one.log(), two.log());
    assert!(logs.contains("forwarded"), "{logs}");
}

#[actix_web::test]
async fn a_stop_waits_for_the_attempt_under_way_and_records_it_so_it_is_not_sent_again() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(1500)));
    let db = TestDb::create();
    let text = config_text(&db.url, &forward_extra(&downstream.url, "10s", 12));
    let mut process = Process::serve(&text);
    let id = unique_id("evt");
    let delivery = delivery_for(
        &parse_config(&text),
        "stripe",
        &stripe_event(&id, "a", 1),
        &id,
        unix_now(),
    );
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    poll_until("the attempt is under way", Duration::from_secs(20), || {
        downstream.answering() == 1
    })
    .await;

    process.terminate();
    let exit = process.wait_exit(Duration::from_secs(40));
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
    let log = process.log();
    assert_eq!(
        db.count("deliveries WHERE state = 'delivered' AND attempts = 1"),
        1,
        "the attempt under way at the stop ended and was recorded as delivered, so no \
         instance sends it again:\n{log}"
    );
    assert_eq!(downstream.for_key(&format!("stripe:{id}")).len(), 1);
    assert!(!log.contains("abandoned"), "{log}");
    assert!(
        log.contains("waiting up to") && log.contains("forward attempts still under way"),
        "a stop that waits more than a second says so:\n{log}"
    );
}

#[actix_web::test]
async fn a_stop_gives_back_the_rows_waiting_for_their_turn_at_once() {
    let downstream = Downstream::start(always(200));
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &format!(
            "{}rate = \"1/m\"\n",
            forward_extra(&downstream.url, "10s", 12)
        ),
    );
    let mut process = Process::serve(&text);
    let config = parse_config(&text);
    for _ in 0..3 {
        let id = unique_id("evt");
        let delivery = delivery_for(
            &config,
            "stripe",
            &stripe_event(&id, "a", 1),
            &id,
            unix_now(),
        );
        let answer = send(&process.address, &delivery).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    poll_until("the first is delivered", Duration::from_secs(20), || {
        db.count("deliveries WHERE state = 'delivered'") == 1
    })
    .await;

    // The other two wait a minute each for their turns; the stop does not wait for them.
    let stopped = Instant::now();
    process.terminate();
    let exit = process.wait_exit(Duration::from_secs(40));
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
    let log = process.log();
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "the stop waited {:?} for rows that had not started:\n{log}",
        stopped.elapsed()
    );
    assert!(!log.contains("abandoned"), "{log}");
    assert_eq!(
        db.count("deliveries WHERE state = 'pending' AND attempts = 0 AND leased_until IS NULL"),
        2,
        "the rows not started went back to the outbox untried:\n{log}"
    );
    assert_eq!(downstream.received().len(), 1);
}

/// Reads one request (head and `Content-Length` body) off a connection; false at its end.
fn read_request(reader: &mut impl std::io::BufRead) -> bool {
    let mut length = 0;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).is_ok()
}

/// A downstream that answers `200` at once, then sends its 100-byte body a byte every 30 ms
/// (3 s in all), on connections kept alive; and the count of requests it has read.
fn dripping_downstream() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("an address"));
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                while read_request(&mut reader) {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n";
                    if stream.write_all(head).is_err() {
                        return;
                    }
                    for _ in 0..100 {
                        std::thread::sleep(Duration::from_millis(30));
                        if stream.write_all(b".").is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, requests)
}

/// A downstream that reads each request whole, writes `answer` (which may be nothing, or not
/// HTTP) and closes the connection.
fn raw_downstream(answer: &'static [u8]) -> String {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("an address"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut stream = stream;
            if read_request(&mut reader) {
                let _ = stream.write_all(answer);
            }
        }
    });
    url
}

#[actix_web::test]
async fn a_downstream_that_hangs_up_or_answers_garbage_is_named_for_what_it_did() {
    // awc reports a peer that closed after reading the request as a failure "to connect";
    // the delivery's last_error says what the downstream did instead.
    for (answer, said) in [
        (
            &b""[..],
            "the downstream closed the connection without answering",
        ),
        (
            &b"SMTP READY\r\n\r\n"[..],
            "the downstream's answer is not HTTP that can be read",
        ),
    ] {
        let url = raw_downstream(answer);
        let app = TestApp::spawn_with(&forward_extra(&url, "2s", 1), Handlers::default()).await;
        let (id, _) = send_one(&app).await;
        let states = &crate::targets::settled(&app, &[&id], "dead").await[0];
        let error = states[0]["last_error"].as_str().unwrap_or_default();
        assert!(error.starts_with(said), "{said}: {states}");
        assert!(states[0]["last_status"].is_null(), "{states}");
    }
}

#[actix_web::test]
async fn a_2xx_whose_body_is_slower_than_the_timeout_is_delivered_not_sent_again() {
    let (url, requests) = dripping_downstream();
    let app = TestApp::spawn_with(&forward_extra(&url, "1s", 3), Handlers::default()).await;
    let (id, _) = send_one(&app).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let states = deliveries(&app, &id).await;
        if states[0]["state"] == "delivered" {
            assert_eq!(states[0]["attempts"], 1, "{states}");
            assert_eq!(states[0]["last_status"], 200, "{states}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered within 10 s: {states}"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        requests.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sent once"
    );
}

#[actix_web::test]
async fn an_outcome_waits_out_another_process_holding_the_sqlite_write_lock_and_is_not_sent_again()
{
    use diesel::connection::SimpleConnection;
    // The write lock of a file is SQLite's.
    if !store_is_sqlite() {
        return;
    }
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(600)));
    let db = TestDb::create();
    // A short busy wait, as an operator may set: the outcome meets the lock held past it.
    let text = config_text(&db.url, &forward_extra(&downstream.url, "5s", 3))
        .replace("in_flight_wait = \"3s\"", "in_flight_wait = \"100ms\"");
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    let (id, key) = send_one(&app).await;
    poll_until("the attempt is under way", Duration::from_secs(10), || {
        downstream.answering() == 1
    })
    .await;
    // Another process (a tool, another serve) takes the file's write lock while the attempt
    // is answered, and keeps it a while after.
    let mut holder = app.db.connect();
    holder
        .batch_execute("BEGIN IMMEDIATE")
        .expect("the write lock");
    poll_until("the attempt is answered", Duration::from_secs(10), || {
        downstream.answering() == 0
    })
    .await;
    actix_web::rt::time::sleep(Duration::from_millis(700)).await;
    holder.batch_execute("ROLLBACK").expect("let go");

    poll_until("the delivery is recorded", Duration::from_secs(30), || {
        app.db.count("deliveries WHERE state = 'delivered'") == 1
    })
    .await;
    let rows = deliveries(&app, &id).await;
    assert_eq!(rows[0]["attempts"], 1, "{rows}");
    assert_eq!(downstream.for_key(&key).len(), 1, "sent once");
}

#[actix_web::test]
async fn the_forward_lag_runs_from_the_claim_s_commit_not_from_a_wait_before_it() {
    if skip_on_sqlite(
        "the_forward_lag_runs_from_the_claim_s_commit_not_from_a_wait_before_it",
        "the claim is held back by a table lock another session takes",
    ) {
        return;
    }
    let downstream = Downstream::start(always(200));
    let app = forwarding_app(&downstream, "5s", 3).await;
    // The claim waits a second for a table lock, then commits and is handed over.
    let lock = HeldTableLock::take(&app.db.url, "events", "ACCESS EXCLUSIVE");
    let id = unique_id("evt");
    let delivery = app.delivery("stripe", &stripe_event(&id, "a", 1), &id);
    let sending = {
        let (app_address, delivery) = (app.address.clone(), delivery.clone());
        actix_web::rt::spawn(async move { send(&app_address, &delivery).await })
    };
    poll_until(
        "the claim waits for the lock",
        Duration::from_secs(10),
        || {
            app.db.count(
                "pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ) > 0
        },
    )
    .await;
    actix_web::rt::time::sleep(Duration::from_secs(1)).await;
    drop(lock);
    let answer = sending.await.expect("the delivery's task");
    assert_eq!(answer.status, 200, "{}", answer.text());
    arrived(&downstream, &id).await;
    poll_until("the delivery is recorded", Duration::from_secs(10), || {
        app.db.count("deliveries WHERE state = 'delivered'") == 1
    })
    .await;
    let metrics = app.get("/metrics", None).await.text();
    let sum: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("hookbox_forward_lag_seconds_sum{source=\"stripe\",target=\"default\"} ")
        })
        .unwrap_or_else(|| panic!("no lag sum in\n{metrics}"))
        .parse()
        .expect("a number");
    assert!(
        sum < 0.5,
        "the second the claim waited is not forwarding's lag: {sum} s"
    );
}

#[actix_web::test]
async fn a_connection_to_a_target_gives_up_on_unacknowledged_data_with_the_attempt() {
    // An attempt timed out into a black hole; its connection was dropped, but the kernel went
    // on sending the request it held, and it reached the target a minute later, after the
    // attempts that followed it (a black-box run: an ordered target got an old event after
    // newer ones). Each connection to a target now has TCP_USER_TIMEOUT at its timeout.
    let downstream = Downstream::start(always(200));
    let app = forwarding_app(&downstream, "3s", 12).await;
    let (id, _) = send_one(&app).await;
    arrived(&downstream, &id).await;
    let port = downstream
        .url
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the downstream's port");
    let timeouts = user_timeouts_of_connections_to(port);
    assert!(
        !timeouts.is_empty(),
        "the kept-alive connection to the target"
    );
    for (fd, timeout) in timeouts {
        assert_eq!(timeout, Some(Duration::from_secs(3)), "descriptor {fd}");
    }
}
