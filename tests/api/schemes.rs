//! Each scheme over real HTTP: a valid delivery is processed, a redelivery is a replay with the
//! same bytes, and every kind of bad signature is 401 and stores nothing.

use hookbox::providers::Scheme;
use hookbox::secret::Secret;

use crate::helpers::*;

/// `delivery`, re-signed with a secret the source does not have.
fn signed_with_wrong_secret(app: &TestApp, source: &str, body: &str, id: &str) -> Delivery {
    let config = source_named(&app.config, source);
    // A Standard Webhooks secret must be base64 after whsec_; this one is, and is still wrong.
    let wrong = Secret::new("whsec_d3Jvbmcgc2VjcmV0IHdyb25nIHNlY3JldA==");
    let verifier = config
        .scheme
        .build(&[wrong], config.tolerance)
        .expect("key");
    let mut headers = verifier.sign(body.as_bytes(), unix_now(), id, Some("test.event"));
    headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    Delivery {
        source: source.to_owned(),
        headers,
        body: body.as_bytes().to_vec(),
    }
}

fn empty_signature(source: &str, genuine: &Delivery) -> String {
    match source {
        "stripe" => {
            let t = genuine
                .header("Stripe-Signature")
                .split(',')
                .next()
                .expect("t=")
                .to_owned();
            format!("{t},v1=")
        }
        "standard" => "v1,".to_owned(),
        "github" | "acme" => "sha256=".to_owned(),
        "slack" => "v0=".to_owned(),
        _ => String::new(),
    }
}

async fn assert_refused_and_nothing_stored(
    app: &TestApp,
    delivery: &Delivery,
    id: &str,
    what: &str,
) {
    let answer = app.send(delivery).await;
    assert_eq!(
        answer.status,
        401,
        "{} {what}: {}",
        delivery.source,
        answer.text()
    );
    assert_eq!(
        answer.error(),
        "invalid_signature",
        "{} {what}",
        delivery.source
    );
    let signature = delivery
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(signature_header(&delivery.source)))
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    if signature.len() > 8 {
        assert!(
            !answer.text().contains(&signature),
            "the error echoes the signature"
        );
    }
    assert_eq!(
        app.db.count(&format!("events WHERE event_id = '{id}'")),
        0,
        "{} {what} stored something",
        delivery.source
    );
}

#[actix_web::test]
async fn every_scheme_processes_a_valid_delivery_and_replays_its_redelivery_byte_for_byte() {
    let app = TestApp::spawn().await;
    for source in SOURCES {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        let delivery = app.delivery(source, &body, &id);

        let first = app.send(&delivery).await;
        assert_eq!(first.status, 200, "{source}: {}", first.text());
        assert!(
            !first.replayed(),
            "{source}: a first delivery is not a replay"
        );
        let json = first.json();
        assert_eq!(json["status"], "processed", "{source}");
        assert_eq!(json["source"], source);
        assert_eq!(json["event_id"], id.as_str(), "{source}");
        assert!(json.get("event_type").is_some(), "{source}");

        // The provider's retry is signed afresh: a new timestamp, so new signature bytes.
        let retry = delivery_for(&app.config, source, &body, &id, unix_now() - 30);
        let again = app.send(&retry).await;
        assert_eq!(again.status, first.status, "{source}");
        assert_eq!(again.body, first.body, "{source}: replay bytes differ");
        assert!(
            again.replayed(),
            "{source}: a redelivery says Idempotent-Replayed"
        );
        assert_eq!(app.db.count(&format!("events WHERE event_id = '{id}'")), 1);
    }
}

#[actix_web::test]
async fn event_types_are_found_where_each_scheme_puts_them() {
    let app = TestApp::spawn().await;
    let expected = [
        ("stripe", "payment_intent.succeeded"),
        ("standard", "invoice.paid"),
        ("github", "test.event"),
        ("shopify", "test.event"),
        ("slack", "message"),
        ("acme", "thing.happened"),
    ];
    for (source, event_type) in expected {
        let id = unique_id(source);
        let answer = app
            .send(&app.delivery(source, &sample_body(source, &id), &id))
            .await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
        assert_eq!(answer.json()["event_type"], event_type, "{source}");
    }
    // acmejson configures no event_type: the type is simply absent.
    let id = unique_id("acmejson");
    let answer = app
        .send(&app.delivery("acmejson", &sample_body("acmejson", &id), &id))
        .await;
    assert_eq!(answer.json()["event_type"], serde_json::Value::Null);
}

#[actix_web::test]
async fn bad_signatures_of_every_kind_are_refused_and_the_genuine_delivery_is_then_new() {
    let app = TestApp::spawn().await;
    for source in SOURCES {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        let genuine = app.delivery(source, &body, &id);
        let header = signature_header(source);
        let value = genuine.header(header).to_owned();

        let wrong_secret = signed_with_wrong_secret(&app, source, &body, &id);
        assert_refused_and_nothing_stored(&app, &wrong_secret, &id, "wrong secret").await;

        let mut tampered = genuine.clone();
        let at = tampered.body.len() / 2;
        tampered.body[at] = if tampered.body[at] == b'1' {
            b'2'
        } else {
            b'1'
        };
        assert_refused_and_nothing_stored(&app, &tampered, &id, "tampered body").await;

        let reserialized: serde_json::Value = serde_json::from_str(&body).expect("JSON sample");
        let mut reserialized_delivery = genuine.clone();
        reserialized_delivery.body = serde_json::to_vec_pretty(&reserialized).expect("JSON");
        assert_refused_and_nothing_stored(&app, &reserialized_delivery, &id, "re-serialized body")
            .await;

        let missing = genuine.clone().without_header(header);
        assert_refused_and_nothing_stored(&app, &missing, &id, "missing header").await;

        let empty = genuine
            .clone()
            .with_header(header, &empty_signature(source, &genuine));
        assert_refused_and_nothing_stored(&app, &empty, &id, "empty signature").await;

        let truncated = genuine
            .clone()
            .with_header(header, &value[..value.len() - 10]);
        assert_refused_and_nothing_stored(&app, &truncated, &id, "truncated signature").await;

        let answer = app.send(&genuine).await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
        assert!(
            !answer.replayed(),
            "{source}: processed as new after the refusals"
        );
    }
}

#[actix_web::test]
async fn timestamped_schemes_refuse_stale_and_future_timestamps_even_with_a_valid_mac() {
    let app = TestApp::spawn().await;
    for source in ["stripe", "standard", "slack"] {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        // 10 s past the 300 s tolerance, so a second ticking between signing and checking
        // cannot bring a skew back inside it.
        for skew in [-310, 310, -86_400, 86_400 * 365] {
            let delivery = delivery_for(&app.config, source, &body, &id, unix_now() + skew);
            let answer = app.send(&delivery).await;
            assert_eq!(
                answer.status,
                401,
                "{source} skew {skew}: {}",
                answer.text()
            );
            assert_eq!(answer.error(), "stale_timestamp", "{source} skew {skew}");
        }
        assert_eq!(app.db.count(&format!("events WHERE event_id = '{id}'")), 0);
        let inside = delivery_for(&app.config, source, &body, &id, unix_now() + 200);
        assert_eq!(
            app.send(&inside).await.status,
            200,
            "{source}: inside the tolerance"
        );
    }
}

#[actix_web::test]
async fn stripe_accepts_a_header_whose_second_v1_is_the_right_one_and_refuses_v0_only() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 2);
    let genuine = app.delivery("stripe", &body, &id);
    let header = genuine.header("Stripe-Signature").to_owned();
    let (t, v1) = header.split_once(",v1=").expect("t=..,v1=..");

    let v0_only = genuine
        .clone()
        .with_header("Stripe-Signature", &format!("{t},v0={v1}"));
    let answer = app.send(&v0_only).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (401, "invalid_signature")
    );
    assert_eq!(app.db.count("events"), 0);

    let two = format!("{t},v1={},v1={v1}", "0".repeat(64));
    let answer = app
        .send(&genuine.clone().with_header("Stripe-Signature", &two))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[actix_web::test]
async fn a_source_with_rotated_secrets_accepts_either() {
    let app = TestApp::spawn().await;
    // The test stripe source has two secrets; deliveries are normally signed with the second.
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 1);
    let first_secret = source_named(&app.config, "stripe").secrets[0].clone();
    let verifier = Scheme::builtin("stripe")
        .expect("built in")
        .build(&[first_secret], std::time::Duration::from_secs(300))
        .expect("key");
    let mut headers = verifier.sign(body.as_bytes(), unix_now(), &id, None);
    headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    let old_key = Delivery {
        source: "stripe".to_owned(),
        headers,
        body: body.into_bytes(),
    };
    let answer = app.send(&old_key).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

#[actix_web::test]
async fn a_body_id_that_is_no_string_nor_a_64_bit_number_says_what_an_id_can_be() {
    // `"id": 10^30` is a number, but no id hookbox can store as the provider sent it.
    let app = TestApp::spawn().await;
    for body in [
        r#"{"id": 1000000000000000000000000000000, "type": "x"}"#,
        r#"{"id": 1.5, "type": "x"}"#,
        r#"{"type": "x"}"#,
    ] {
        let delivery = delivery_for(&app.config, "acmejson", body, "", unix_now());
        let answer = app.send(&delivery).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "missing_event_id"),
            "{body}"
        );
        assert!(
            answer.message().contains("fits in 64 bits"),
            "{}",
            answer.text()
        );
    }
    assert_eq!(app.db.count("events"), 0);
}
