//! The second-wave payment providers with a shared secret (paddle, checkout, razorpay, mollie,
//! lemonsqueezy, square) over real HTTP: a delivery signed now by the same code `send` uses is
//! processed with the right id and type, a redelivery is a replay with the same bytes, and a
//! tampered or wrongly keyed one is 401 and stores nothing; either of two secrets verifies
//! (rotation); Paddle's stale and future timestamps are 401; and `send`, `export` and `replay`
//! carry an event of each into a second server under the same id, type and payload.

use hookbox::providers::body_hash_id;

use crate::helpers::*;

/// `config` with `source`'s secrets replaced by `secret` alone.
fn keyed(config: &hookbox::Config, source: &str, secret: &str) -> hookbox::Config {
    let mut config = config.clone();
    config
        .sources
        .iter_mut()
        .find(|s| s.name.as_str() == source)
        .expect("test source")
        .secrets = vec![hookbox::secret::Secret::new(secret)];
    config
}

const SOURCES: &str = r#"
[sources.paddle]
scheme = "paddle"
secrets = ["pdl_ntfset_old", "pdl_ntfset_current"]

[sources.checkout]
scheme = "checkout"
secrets = ["cko-signature-key-old", "cko-signature-key"]

[sources.razorpay]
scheme = "razorpay"
secrets = ["rzp_whsec_old", "rzp_whsec"]

[sources.mollie]
scheme = "mollie"
secrets = ["mwhs_old", "mwhs_current"]

[sources.lemonsqueezy]
scheme = "lemonsqueezy"
secrets = ["lmsq-signing-old", "lmsq-signing"]

[sources.square]
scheme = "square"
secrets = ["sq-signature-key-old", "sq-signature-key"]
public_url = "https://hooks.example.com/webhooks/square"
"#;

/// A body for `source` naming `id` where the provider puts it in the body, with an `amount` a
/// tamperer can change; and the id and type the event must be stored under.
fn event(source: &str, id: &str, amount: u32) -> (String, String, String) {
    match source {
        "paddle" => (
            format!(
                r#"{{"event_id":"{id}","event_type":"transaction.completed","notification_id":"ntf_1","amount":{amount}}}"#
            ),
            id.to_owned(),
            "transaction.completed".to_owned(),
        ),
        "checkout" => (
            format!(r#"{{"id":"{id}","type":"payment_captured","amount":{amount}}}"#),
            id.to_owned(),
            "payment_captured".to_owned(),
        ),
        "razorpay" => (
            format!(r#"{{"entity":"event","event":"payment.captured","amount":{amount}}}"#),
            id.to_owned(),
            "payment.captured".to_owned(),
        ),
        "mollie" => (
            format!(
                r#"{{"resource":"event","id":"{id}","type":"payment-link.paid","amount":{amount}}}"#
            ),
            id.to_owned(),
            "payment-link.paid".to_owned(),
        ),
        "lemonsqueezy" => {
            let body = format!(
                r#"{{"meta":{{"event_name":"order_created","nonce":"{id}"}},"amount":{amount}}}"#
            );
            let derived = body_hash_id(body.as_bytes());
            // `delivery` sends the type `test.event` in X-Event-Name.
            (body, derived, "test.event".to_owned())
        }
        "square" => (
            format!(r#"{{"event_id":"{id}","type":"payment.updated","amount":{amount}}}"#),
            id.to_owned(),
            "payment.updated".to_owned(),
        ),
        other => panic!("no body for {other}"),
    }
}

const SCHEMES: [&str; 6] = [
    "paddle",
    "checkout",
    "razorpay",
    "mollie",
    "lemonsqueezy",
    "square",
];

async fn stored(app: &TestApp, source: &str, id: &str) -> u16 {
    app.get(&format!("/admin/events/{source}/{id}"), Some(ADMIN_TOKEN))
        .await
        .status
}

#[actix_web::test]
async fn a_delivery_signed_now_is_processed_and_its_redelivery_is_a_replay() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    for source in SCHEMES {
        let (body, id, kind) = event(source, &unique_id(source), 100);
        let delivery = app.delivery(source, &body, &id);
        let first = app.send(&delivery).await;
        assert_eq!(first.status, 200, "{source}: {}", first.text());
        assert!(!first.replayed(), "{source}");
        assert_eq!(first.json()["event_type"], kind.as_str(), "{source}");
        let event = app
            .get(&format!("/admin/events/{source}/{id}"), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(event.status, 200, "{source}: stored under {id}");
        assert_eq!(event.json()["event_type"], kind.as_str(), "{source}");

        let again = app.send(&delivery).await;
        assert_eq!(again.status, 200, "{source}: {}", again.text());
        assert!(again.replayed(), "{source}: a redelivery is a replay");
        assert_eq!(again.body, first.body, "{source}: the same bytes");
    }
}

#[actix_web::test]
async fn a_tampered_or_wrongly_keyed_delivery_is_refused_and_nothing_is_stored() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    for source in SCHEMES {
        let nonce = unique_id(source);
        let (body, id, _) = event(source, &nonce, 100);
        let (tampered_body, tampered_id, _) = event(source, &nonce, 101);
        let mut tampered = app.delivery(source, &body, &id);
        tampered.body = tampered_body.into_bytes();
        let answer = app.send(&tampered).await;
        assert_eq!(answer.status, 401, "{source}: {}", answer.text());
        assert_eq!(answer.error(), "invalid_signature", "{source}");
        assert_eq!(stored(&app, source, &tampered_id).await, 404, "{source}");

        let config = keyed(&app.config, source, "not-the-secret");
        let wrong = delivery_for(&config, source, &body, &id, unix_now());
        let answer = app.send(&wrong).await;
        assert_eq!(answer.status, 401, "{source}: {}", answer.text());
        assert_eq!(stored(&app, source, &id).await, 404, "{source}");
    }
}

#[actix_web::test]
async fn mollie_signatures_in_repeated_lines_verify_and_are_kept_folded() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    let id = unique_id("event");
    let (body, _, _) = event("mollie", &id, 100);
    let genuine = app.delivery("mollie", &body, &id);
    let good = genuine.header("X-Mollie-Signature").to_owned();
    let retired = format!("sha256={}", "ab".repeat(32));
    // Two header lines, as Mollie sends them while a secret is rotated.
    let mut delivery = genuine.with_header("X-Mollie-Signature", &retired);
    delivery
        .headers
        .push(("X-Mollie-Signature".to_owned(), good.clone()));
    let answer = app.send(&delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let event = app
        .get(&format!("/admin/events/mollie/{id}"), Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(
        event["headers"]["x-mollie-signature"],
        format!("{retired}, {good}")
    );
}

#[actix_web::test]
async fn a_square_source_with_another_public_url_refuses_the_delivery() {
    let other = SOURCES.replace(
        "https://hooks.example.com/webhooks/square",
        "https://hooks.example.com/webhooks/elsewhere",
    );
    let signer = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    let app = TestApp::spawn_with(&other, hookbox::Handlers::default()).await;
    let id = unique_id("sq");
    let (body, _, _) = event("square", &id, 100);
    let answer = app.send(&signer.delivery("square", &body, &id)).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(stored(&app, "square", &id).await, 404);
}

#[actix_web::test]
async fn a_delivery_signed_with_either_of_two_secrets_verifies() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    for source in SCHEMES {
        let secrets: Vec<String> = source_named(&app.config, source)
            .secrets
            .iter()
            .map(|secret| secret.expose().to_owned())
            .collect();
        assert_eq!(secrets.len(), 2, "{source}: a source mid-rotation");
        for secret in &secrets {
            let (body, id, _) = event(source, &unique_id(source), 100);
            let delivery = delivery_for(
                &keyed(&app.config, source, secret),
                source,
                &body,
                &id,
                unix_now(),
            );
            let answer = app.send(&delivery).await;
            assert_eq!(answer.status, 200, "{source}: {}", answer.text());
            assert!(!answer.replayed(), "{source}");
            assert_eq!(stored(&app, source, &id).await, 200, "{source}");
        }
    }
}

#[actix_web::test]
async fn paddle_refuses_a_stale_or_future_timestamp_and_stores_nothing() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    let id = unique_id("evt");
    let (body, _, _) = event("paddle", &id, 100);
    // 302 ahead, not 301: a second that turns between signing and the check takes one off a
    // future skew (and adds one to a past one).
    for skew in [-301, 302, -86_400, 86_400 * 365] {
        let delivery = delivery_for(&app.config, "paddle", &body, &id, unix_now() + skew);
        let answer = app.send(&delivery).await;
        assert_eq!(answer.status, 401, "skew {skew}: {}", answer.text());
        assert_eq!(answer.error(), "stale_timestamp", "skew {skew}");
        assert_eq!(stored(&app, "paddle", &id).await, 404, "skew {skew}");
    }
    assert_eq!(app.db.count("events"), 0);
    let inside = delivery_for(&app.config, "paddle", &body, &id, unix_now() + 200);
    let answer = app.send(&inside).await;
    assert_eq!(
        answer.status,
        200,
        "inside the tolerance: {}",
        answer.text()
    );
}

#[actix_web::test]
async fn send_then_export_then_replay_round_trips_each_scheme_into_a_second_server() {
    let app = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    let config = TempFile::new(&config_text(&app.db.url, SOURCES));
    // (source, stored id, stored type, body)
    let mut sent = Vec::new();
    for source in SCHEMES {
        let (body, id, kind) = event(source, &unique_id(source), 100);
        let kind = if source == "lemonsqueezy" {
            "order_created".to_owned()
        } else {
            kind
        };
        let file = TempFile::with_extension(body.as_bytes(), "json");
        let (config_path, body_path) = (config.path(), file.path());
        let mut args = vec![
            "send",
            "--to",
            &app.address,
            "--source",
            source,
            "--config",
            &config_path,
        ];
        // Razorpay's id travels in a header, so `send` takes it from --event-id.
        if source == "razorpay" {
            args.extend(["--event-id", id.as_str()]);
        }
        // Lemon Squeezy's type travels in X-Event-Name, which `send` sets from --event-type.
        if source == "lemonsqueezy" {
            args.extend(["--event-type", "order_created"]);
        }
        args.push(&body_path);
        let (code, out, err) = run_hookbox_async(&args).await;
        assert_eq!(code, 0, "{source}: {out}{err}");
        assert!(out.contains("200 OK: processed"), "{source}: {out}");
        sent.push((source, id, kind, body));
    }
    assert_eq!(app.db.count("events"), SCHEMES.len() as i64);

    let exported = export_all(&config.path()).await;
    assert_eq!(exported.read().lines().count(), SCHEMES.len());

    let other = TestApp::spawn_with(SOURCES, hookbox::Handlers::default()).await;
    let report = TempFile::with_extension(b"", "json");
    let (code, out, err) = run_hookbox_async(&[
        "replay",
        &exported.path(),
        "--to",
        &other.address,
        "--config",
        &config.path(),
        "--report",
        &report.path(),
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let counts: serde_json::Value = serde_json::from_str(&report.read()).expect("JSON");
    assert_eq!(counts["counts"]["processed"], SCHEMES.len(), "{out}");

    for (source, id, kind, body) in sent {
        let path = format!("/admin/events/{source}/{}", id.replace(':', "%3A"));
        let there = other.get(&path, Some(ADMIN_TOKEN)).await;
        assert_eq!(there.status, 200, "{source}: {id} on the second server");
        let here = app.get(&path, Some(ADMIN_TOKEN)).await.json();
        let there = there.json();
        assert_eq!(there["event_id"], id.as_str(), "{source}");
        assert_eq!(here["event_type"], kind.as_str(), "{source}");
        assert_eq!(there["event_type"], kind.as_str(), "{source}");
        assert_eq!(there["payload"], body.as_str(), "{source}");
    }
    assert_eq!(other.db.count("events"), SCHEMES.len() as i64);
}
