//! SendGrid's Signed Event Webhook through the real server: ECDSA P-256 over the timestamp and
//! the body, a batch of events per delivery. Deliveries are signed here with p256 directly, as
//! SendGrid signs them (base64 DER over `{timestamp}{body}`), not with hookbox's own signer, so
//! these tests also hold hookbox's check to the format; `send` and `replay` are then checked
//! against the same server. The keys come from fixed seeds, so every run signs the same.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hookbox::Handlers;
use p256::ecdsa::signature::MultipartSigner;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use serde_json::{json, Value};

use crate::batches::{counting, once_each, seen, side_effects, FailsOn, Shared};
use crate::helpers::*;

const SIGNATURE: &str = "X-Twilio-Email-Event-Webhook-Signature";
const TIMESTAMP: &str = "X-Twilio-Email-Event-Webhook-Timestamp";

/// The key SendGrid signs with now, the one it signed with before the rotation, and one no
/// source knows.
fn current() -> SigningKey {
    key(0x11)
}
fn previous() -> SigningKey {
    key(0x22)
}
fn stranger() -> SigningKey {
    key(0x33)
}

fn key(seed: u8) -> SigningKey {
    SigningKey::from_slice(&[seed; 32]).expect("a seed below the order is a key")
}

/// The verification key of `key`, as SendGrid's dashboard shows it: base64 of the DER
/// SubjectPublicKeyInfo.
fn shown(key: &SigningKey) -> String {
    let der = key
        .verifying_key()
        .to_public_key_der()
        .expect("a P-256 key encodes");
    base64::engine::general_purpose::STANDARD.encode(der.as_bytes())
}

/// The source, with both keys while the old one is rotated out.
fn source() -> String {
    format!(
        "\n[sources.sendgrid]\nscheme = \"sendgrid\"\npublic_keys = [{:?}, {:?}]\n",
        shown(&current()),
        shown(&previous())
    )
}

async fn spawn(handler: Shared) -> TestApp {
    TestApp::spawn_with(&source(), Handlers::default().with("sendgrid", handler)).await
}

async fn spawn_with(handler: FailsOn) -> TestApp {
    TestApp::spawn_with(&source(), Handlers::default().with("sendgrid", handler)).await
}

/// One SendGrid event.
fn event(id: &str, kind: &str) -> Value {
    json!({
        "email": "ada@example.com",
        "timestamp": 1_763_648_986,
        "smtp-id": "<Rk1fT3pZQW5WSzJWbXdNd0RyY2x4dw@geopod-ismtpd-3>",
        "event": kind,
        "category": ["receipts"],
        "sg_event_id": id,
        "sg_message_id": "Rk1fT3pZQW5WSzJWbXdNd0RyY2x4dw.recvd-7b5d8c6f4-x2kqp-1-6921E6DE-3.0",
    })
}

/// The events as SendGrid posts them: a JSON array, ending in CRLF.
fn body_of(events: &[Value]) -> Vec<u8> {
    let mut body = serde_json::to_vec(events).expect("JSON");
    body.extend_from_slice(b"\r\n");
    body
}

/// `body` signed by `key` at `timestamp`, as SendGrid signs it.
fn signed_at(key: &SigningKey, body: &[u8], timestamp: i64) -> Delivery {
    let stamp = timestamp.to_string();
    let signature: Signature = key.multipart_sign(&[stamp.as_bytes(), body]);
    Delivery {
        source: "sendgrid".to_owned(),
        headers: vec![
            ("Content-Type".to_owned(), "application/json".to_owned()),
            ("User-Agent".to_owned(), "SendGrid Event API".to_owned()),
            (
                SIGNATURE.to_owned(),
                base64::engine::general_purpose::STANDARD.encode(signature.to_der().as_bytes()),
            ),
            (TIMESTAMP.to_owned(), stamp),
        ],
        body: body.to_vec(),
    }
}

/// `events` signed now by `key`.
fn batch(key: &SigningKey, events: &[Value]) -> Delivery {
    signed_at(key, &body_of(events), unix_now())
}

/// Every stored event: id, type and payload, by id.
fn stored(app: &TestApp) -> Vec<(String, Option<String>, Vec<u8>)> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        event_type: Option<String>,
        #[diesel(sql_type = diesel::sql_types::Binary)]
        payload: Vec<u8>,
    }
    let rows: Vec<Row> =
        diesel::sql_query("SELECT event_id, event_type, payload FROM events ORDER BY event_id")
            .load(&mut app.db.connect())
            .expect("events");
    rows.into_iter()
        .map(|row| (row.event_id, row.event_type, row.payload))
        .collect()
}

#[actix_web::test]
async fn a_batch_is_an_event_per_item_and_its_redelivery_a_byte_identical_replay() {
    let app = spawn(counting(Duration::ZERO)).await;
    let ids = [unique_id("cHJv"), unique_id("ZGVs"), unique_id("b3Bl")];
    let events = [
        event(&ids[0], "processed"),
        event(&ids[1], "delivered"),
        event(&ids[2], "open"),
    ];
    let body = body_of(&events);
    let delivery = signed_at(&current(), &body, unix_now());
    let first = app.send(&delivery).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(side_effects(&app), once_each(&ids));

    // Each item stored as itself: its id, its type and its bytes as they stood in the body.
    let mut expected: Vec<(String, Option<String>, Vec<u8>)> = events
        .iter()
        .map(|event| {
            (
                event["sg_event_id"].as_str().unwrap().to_owned(),
                event["event"].as_str().map(str::to_owned),
                serde_json::to_vec(event).expect("JSON"),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(stored(&app), expected);

    // The same request again, and SendGrid's retry signed afresh: replays with the same bytes.
    let retry = signed_at(&current(), &body, unix_now() + 1);
    for again in [&delivery, &retry] {
        let answer = app.send(again).await;
        assert!(answer.replayed(), "{}", answer.text());
        assert_eq!(seen(&answer), seen(&first));
    }
    assert_eq!(side_effects(&app), once_each(&ids));
    assert_eq!(app.db.count("events"), 3);

    // A batch counts once in /metrics, however many items it carried.
    let metrics = app.get("/metrics", None).await.text();
    for (outcome, n) in [("processed", 1), ("replayed", 2)] {
        let line =
            format!("hookbox_webhooks_total{{source=\"sendgrid\",outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

#[actix_web::test]
async fn a_tampered_body_a_wrong_key_or_a_stale_timestamp_is_refused_with_nothing_stored() {
    let app = spawn(counting(Duration::ZERO)).await;
    let events = [
        event(&unique_id("ZGVs"), "delivered"),
        event(&unique_id("b3Bl"), "open"),
    ];
    let body = body_of(&events);
    let now = unix_now();
    let good = signed_at(&current(), &body, now);

    let mut tampered = good.clone();
    tampered.body = String::from_utf8(body.clone())
        .expect("UTF-8")
        .replacen("\"open\"", "\"click\"", 1)
        .into_bytes();
    let mut trimmed = good.clone();
    trimmed.body = body[..body.len() - 2].to_vec();
    let later = good.clone().with_header(TIMESTAMP, &(now + 1).to_string());
    let cases = [
        ("a tampered body", tampered, "invalid_signature"),
        ("the final CRLF trimmed", trimmed, "invalid_signature"),
        ("the timestamp changed", later, "invalid_signature"),
        (
            "a key no source knows",
            signed_at(&stranger(), &body, now),
            "invalid_signature",
        ),
        (
            "no signature",
            good.clone().without_header(SIGNATURE),
            "invalid_signature",
        ),
        (
            "no timestamp",
            good.clone().without_header(TIMESTAMP),
            "invalid_signature",
        ),
        (
            "signed 10 minutes ago",
            signed_at(&current(), &body, now - 600),
            "stale_timestamp",
        ),
        (
            "signed 10 minutes ahead",
            signed_at(&current(), &body, now + 600),
            "stale_timestamp",
        ),
    ];
    for (case, delivery, code) in cases {
        let answer = app.send(&delivery).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (401, code),
            "{case}: {}",
            answer.text()
        );
    }
    assert_eq!(app.db.count("events"), 0);
    assert_eq!(app.db.count("side_effects"), 0);

    // The untouched delivery still goes through afterwards.
    let answer = app.send(&good).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(app.db.count("events"), 2);
}

#[actix_web::test]
async fn either_configured_key_may_sign_while_one_is_rotated() {
    let app = spawn(counting(Duration::ZERO)).await;
    let (a, b) = (unique_id("YQ"), unique_id("Yg"));
    let by_current = app
        .send(&batch(&current(), &[event(&a, "delivered")]))
        .await;
    assert_eq!(by_current.status, 200, "{}", by_current.text());
    let by_previous = app
        .send(&batch(&previous(), &[event(&b, "delivered")]))
        .await;
    assert_eq!(by_previous.status, 200, "{}", by_previous.text());
    assert!(!by_previous.replayed());
    // One batch, signed once by each key: the second is a replay of the first.
    let c = unique_id("Yw");
    let events = [event(&c, "bounce")];
    let first = app.send(&batch(&previous(), &events)).await;
    let again = app.send(&batch(&current(), &events)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(again.replayed());
    assert_eq!(seen(&again), seen(&first));
    assert_eq!(side_effects(&app), once_each(&[&a, &b, &c]));
}

#[actix_web::test]
async fn a_batch_with_items_stored_before_processes_only_the_new_ones() {
    let app = spawn(counting(Duration::ZERO)).await;
    let [a, b, c] = [unique_id("YQ"), unique_id("Yg"), unique_id("Yw")];
    let first = app
        .send(&batch(&current(), &[event(&a, "processed")]))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let events = [
        event(&a, "processed"),
        event(&b, "delivered"),
        event(&c, "open"),
    ];
    let next = app.send(&batch(&current(), &events)).await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert!(!next.replayed(), "two of its items are new");
    assert_eq!(side_effects(&app), once_each(&[&a, &b, &c]));
    let again = app.send(&batch(&current(), &events)).await;
    assert!(again.replayed());
    assert_eq!(seen(&again), seen(&next));
    assert_eq!(app.db.count("events"), 3);
}

#[actix_web::test]
async fn a_reused_sg_event_id_with_another_payload_refuses_the_whole_batch() {
    let app = spawn(counting(Duration::ZERO)).await;
    let [a, b] = [unique_id("YQ"), unique_id("Yg")];
    let first = app.send(&batch(&current(), &[event(&a, "open")])).await;
    assert_eq!(first.status, 200, "{}", first.text());
    for events in [
        [event(&b, "delivered"), event(&a, "click")],
        [event(&b, "delivered"), event(&b, "open")],
    ] {
        let refused = app.send(&batch(&current(), &events)).await;
        assert_eq!(
            (refused.status, refused.error().as_str()),
            (422, "event_id_reused"),
            "{}",
            refused.text()
        );
    }
    assert_eq!(app.db.count("events"), 1, "the new item is not stored");
    assert_eq!(side_effects(&app), once_each(&[&a]));
}

#[actix_web::test]
async fn an_item_without_sg_event_id_or_a_body_that_is_not_an_array_is_refused() {
    let app = spawn(counting(Duration::ZERO)).await;
    let id = unique_id("YQ");
    let no_id = json!({"email": "ada@example.com", "event": "open"});
    for (events, status, code) in [
        (json!([event(&id, "open"), no_id]), 400, "missing_event_id"),
        (json!([]), 400, "missing_event_id"),
        (event(&id, "open"), 400, "malformed_payload"),
    ] {
        let body = serde_json::to_vec(&events).expect("JSON");
        let answer = app.send(&signed_at(&current(), &body, unix_now())).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (status, code),
            "{events}"
        );
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_handler_failure_on_one_item_rolls_the_whole_batch_back() {
    let ids = [unique_id("YQ"), unique_id("Yg"), unique_id("Yw")];
    let app = spawn_with(FailsOn {
        inner: counting(Duration::ZERO),
        fail_on: ids[1].clone(),
        failures: Arc::default(),
    })
    .await;
    let events = [
        event(&ids[0], "processed"),
        event(&ids[1], "delivered"),
        event(&ids[2], "open"),
    ];
    let failed = app.send(&batch(&current(), &events)).await;
    assert_eq!(
        (failed.status, failed.error().as_str()),
        (500, "processing_failed")
    );
    assert_eq!(app.db.count("events"), 0);
    assert_eq!(app.db.count("side_effects"), 0);
    let retried = app.send(&batch(&current(), &events)).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert!(!retried.replayed());
    assert_eq!(app.db.count("events"), 3);
    assert_eq!(app.db.count("side_effects"), 3);
}

#[actix_web::test]
async fn concurrent_deliveries_of_one_batch_process_each_item_once() {
    let app = spawn(counting(Duration::from_millis(100))).await;
    let ids: Vec<String> = (0..3).map(|_| unique_id("ZQ")).collect();
    let events: Vec<Value> = ids.iter().map(|id| event(id, "delivered")).collect();
    let deliveries: Vec<Delivery> = (0..20)
        .map(|i| batch(&if i % 2 == 0 { current() } else { previous() }, &events))
        .collect();
    let answers =
        futures_util::future::join_all(deliveries.iter().map(|delivery| app.send(delivery))).await;
    let processed = answers
        .iter()
        .filter(|a| a.status == 200 && !a.replayed())
        .count();
    assert_eq!(processed, 1, "{answers:?}");
    for answer in &answers {
        assert_eq!(seen(answer), seen(&answers[0]), "{answers:?}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(side_effects(&app), once_each(&ids));
}

#[actix_web::test]
async fn send_and_replay_sign_with_a_p256_key_file_and_name_a_missing_one() {
    let app = spawn(counting(Duration::ZERO)).await;
    let config = TempFile::new(&config_text(&app.db.url, &source()));
    let pkcs8 = TempFile::new(
        current()
            .to_pkcs8_pem(LineEnding::LF)
            .expect("PKCS#8")
            .as_str(),
    );
    let sec1 = TempFile::new(
        p256::SecretKey::from(previous().as_nonzero_scalar())
            .to_sec1_pem(LineEnding::LF)
            .expect("SEC1")
            .as_str(),
    );
    let ids = [unique_id("c2Vu"), unique_id("ZA")];
    let events = [event(&ids[0], "delivered"), event(&ids[1], "open")];
    let body = TempFile::with_extension(&body_of(&events), "json");
    let (config_path, pkcs8_path, sec1_path, body_path) =
        (config.path(), pkcs8.path(), sec1.path(), body.path());
    let to = app.address.as_str();
    let common = ["send", "--to", to, "--source", "sendgrid"];
    let run = |extra: &[&str]| {
        let mut args: Vec<String> = common.iter().map(|a| (*a).to_owned()).collect();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args.push(body_path.clone());
        args
    };

    // With the config and the current key (PKCS#8): processed, then a replay.
    for replayed in [false, true] {
        let args = run(&["--config", &config_path, "--key", &pkcs8_path]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = run_hookbox_async(&args).await;
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert_eq!(stdout.contains("replayed"), replayed, "{stdout}");
    }
    assert_eq!(side_effects(&app), {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        once_each(&ids)
    });

    // Without a config, the scheme named alone with the old key (SEC1): still a replay.
    let args = run(&["--scheme", "sendgrid", "--key", &sec1_path]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("replayed"), "{stdout}");

    // Exported one line per item, replayed into a second server: each item a delivery of one.
    let (code, capture, stderr) =
        run_hookbox_async(&["export", "--config", &config_path, "--source", "sendgrid"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(capture.lines().count(), 2, "{capture}");
    let capture = TempFile::with_extension(capture.as_bytes(), "ndjson");
    let second = spawn(counting(Duration::ZERO)).await;
    let (code, stdout, stderr) = run_hookbox_async(&[
        "replay",
        &capture.path(),
        "--to",
        &second.address,
        "--config",
        &config_path,
        "--key",
        &pkcs8_path,
    ])
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(
        stored(&second),
        stored(&app),
        "the same ids, types and bytes"
    );

    // No --key, or a key that is not P-256: usage errors that name --key, no key shown.
    let (code, _, stderr) = run_hookbox_async(&[
        "send", "--to", to, "--source", "sendgrid", "--scheme", "sendgrid", &body_path,
    ])
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--secret") && stderr.contains("--key"),
        "{stderr}"
    );
    let args = run(&["--config", &config_path]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--key"), "{stderr}");
    let stranger_file = TempFile::new(
        stranger()
            .to_pkcs8_pem(LineEnding::LF)
            .expect("PKCS#8")
            .as_str(),
    );
    let args = run(&["--config", &config_path, "--key", &stranger_file.path()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--key") && stderr.contains(&shown(&stranger())),
        "{stderr}"
    );
    let args = run(&["--config", &config_path, "--key", &config_path]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--key") && stderr.contains("P-256"),
        "{stderr}"
    );
    assert_eq!(app.db.count("events"), 2);
}

#[actix_web::test]
async fn public_keys_env_holds_the_keys_and_secrets_are_refused_naming_public_keys() {
    let db = TestDb::create();
    let keys = format!("{},{}", shown(&current()), shown(&previous()));
    let text = config_text(
        &db.url,
        "\n[sources.sendgrid]\nscheme = \"sendgrid\"\npublic_keys_env = \"TEST_SENDGRID_KEYS\"\n",
    );
    let server = Process::serve_with_env(&text, &[("TEST_SENDGRID_KEYS", &keys)]);
    for signer in [previous(), current()] {
        let answer = send(
            &server.address,
            &batch(&signer, &[event(&unique_id("ZW52"), "delivered")]),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let answer = send(
        &server.address,
        &batch(&stranger(), &[event(&unique_id("ZW52"), "delivered")]),
    )
    .await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(db.count("events"), 2);

    let config = TempFile::new(&config_text(
        &db.url,
        "\n[sources.sendgrid]\nscheme = \"sendgrid\"\nsecrets = [\"whsec_x\"]\n",
    ));
    // Any command that reads the sources refuses it (`migrate` reads only the database).
    let (code, _, stderr) =
        run_hookbox_async(&["purge", "--dry-run", "--config", &config.path()]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("sources.sendgrid.secrets") && stderr.contains("public_keys"),
        "{stderr}"
    );
}
