//! The rows of the contract's HTTP table that are not about signatures.

use crate::helpers::*;

#[actix_web::test]
async fn a_first_delivery_is_stored_with_its_payload_headers_and_response() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 1);
    let answer = app.send(&app.delivery("stripe", &body, &id)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/json"));

    let event = app
        .get(&format!("/admin/events/stripe/{id}"), Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(
        event["payload"],
        body.as_str(),
        "the raw body, byte for byte"
    );
    assert_eq!(event["event_type"], "charge.succeeded");
    assert_eq!(event["status"], 200);
    assert_eq!(event["body"], answer.text().as_str());
    let headers = event["headers"].as_object().expect("headers object");
    assert!(headers.contains_key("stripe-signature"));
    assert_eq!(headers["content-type"], "application/json");
    assert!(
        !headers.contains_key("user-agent"),
        "only the scheme's headers are kept"
    );
}

#[actix_web::test]
async fn the_same_event_id_with_another_payload_is_422_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let first = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(first.status, 200);
    let other = stripe_event(&id, "charge.refunded", 1);
    let answer = app.send(&app.delivery("stripe", &other, &id)).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (422, "event_id_reused")
    );
    let again = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(again.body, first.body, "the stored response is unchanged");
    assert!(again.replayed());
    assert_eq!(app.db.count("events"), 1);

    // The same for a scheme whose id travels in a header: any byte changed is another payload.
    let gh = unique_id("delivery");
    assert_eq!(
        app.send(&app.delivery("github", r#"{"a":1}"#, &gh))
            .await
            .status,
        200
    );
    let answer = app.send(&app.delivery("github", r#"{"a":2}"#, &gh)).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (422, "event_id_reused")
    );
}

#[actix_web::test]
async fn a_stripe_retry_whose_pending_webhooks_changed_is_a_replay_not_a_422() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let first = app
        .send(&app.delivery("stripe", &stripe_event(&id, "invoice.paid", 3), &id))
        .await;
    assert_eq!(first.status, 200);
    let retry = app
        .send(&app.delivery("stripe", &stripe_event(&id, "invoice.paid", 1), &id))
        .await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
}

/// Stripe's fingerprint is over the parsed JSON less `pending_webhooks`; a number the parse
/// rounded (past 64 bits, or more digits than an f64 keeps) made another payload under a stored
/// id a replay, not a 422 (a black-box run).
#[actix_web::test]
async fn a_stripe_payload_that_differs_past_an_f64s_digits_is_a_422() {
    let app = TestApp::spawn().await;
    for (one, other) in [
        ("12345678901234567890123", "12345678901234567890124"),
        ("0.1000000000000000055511151231257827", "0.1"),
    ] {
        let id = unique_id("evt");
        let body = |amount: &str| {
            stripe_event(&id, "invoice.paid", 3).replacen(
                '{',
                &format!("{{\"amount\": {amount},"),
                1,
            )
        };
        let first = app.send(&app.delivery("stripe", &body(one), &id)).await;
        assert_eq!(first.status, 200, "{}", first.text());
        let again = app.send(&app.delivery("stripe", &body(one), &id)).await;
        assert!(again.replayed(), "{}", again.text());
        let reused = app.send(&app.delivery("stripe", &body(other), &id)).await;
        assert_eq!(
            (reused.status, reused.error().as_str()),
            (422, "event_id_reused"),
            "{one} then {other}"
        );
    }
}

#[actix_web::test]
async fn an_unknown_source_is_404() {
    let app = TestApp::spawn().await;
    let mut delivery = app.delivery("stripe", &stripe_event("evt_x", "a", 1), "evt_x");
    delivery.source = "paypal".to_owned();
    let answer = app.send(&delivery).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (404, "unknown_source")
    );
    // A trailing slash, or a path below a source's, is no source's route: the 404 says where
    // deliveries go.
    for source in ["stripe/", "stripe/events", ""] {
        delivery.source = source.to_owned();
        let answer = app.send(&delivery).await;
        assert_eq!((answer.status, answer.error().as_str()), (404, "not_found"));
        assert!(
            answer.message().contains("POST /webhooks/{source}"),
            "{}",
            answer.text()
        );
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_body_over_max_body_bytes_is_413_with_or_without_a_content_length() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    // The test config allows 65536 bytes.
    let padding = "x".repeat(70_000);
    let body = format!(r#"{{"id":"{id}","type":"a","padding":"{padding}"}}"#);
    let delivery = app.delivery("stripe", &body, &id);
    let answer = app.send(&delivery).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (413, "payload_too_large")
    );

    // Chunked, so the server only learns the size by reading.
    let mut request = awc::Client::new().post(format!("{}/webhooks/stripe", app.address));
    for (name, value) in &delivery.headers {
        request = request.insert_header((name.as_str(), value.as_str()));
    }
    let chunks: Vec<Result<actix_web::web::Bytes, std::io::Error>> = delivery
        .body
        .chunks(8192)
        .map(|c| Ok(actix_web::web::Bytes::copy_from_slice(c)))
        .collect();
    let mut response = request
        .send_stream(futures_util::stream::iter(chunks))
        .await
        .expect("the server answers");
    assert_eq!(response.status().as_u16(), 413);
    let body = response.body().await.expect("body");
    assert!(String::from_utf8_lossy(&body).contains("payload_too_large"));
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_body_that_is_not_json_is_400_where_the_scheme_needs_json() {
    let app = TestApp::spawn().await;
    for source in ["stripe", "slack", "acmejson"] {
        let answer = app
            .send(&app.delivery(source, "id=evt_1&type=x", "evt_1"))
            .await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "malformed_payload"),
            "{source}"
        );
    }
    // Valid JSON with a number past what an f64 holds is refused as such, not as "not JSON".
    for number in ["1e400", &"9".repeat(400)] {
        let body = format!(r#"{{"id":"evt_big","type":"a","amount":{number}}}"#);
        let answer = app.send(&app.delivery("stripe", &body, "evt_big")).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "malformed_payload"),
            "{}",
            answer.text()
        );
        assert!(
            answer.message().contains("number too large"),
            "{}",
            answer.text()
        );
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn schemes_with_the_id_in_a_header_take_any_body() {
    let app = TestApp::spawn().await;
    for source in ["standard", "github", "shopify", "acme"] {
        let id = unique_id(source);
        let answer = app
            .send(&app.delivery(source, "plain text, not JSON", &id))
            .await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
    }
    assert_eq!(app.db.count("events"), 4);
}

#[actix_web::test]
async fn a_delivery_without_an_event_id_is_400_missing_event_id() {
    let app = TestApp::spawn().await;
    let answer = app
        .send(&app.delivery("stripe", r#"{"object":"event","type":"a"}"#, ""))
        .await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "missing_event_id")
    );
    let github = app
        .delivery("github", r#"{"a":1}"#, "gh")
        .without_header("X-GitHub-Delivery");
    let answer = app.send(&github).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "missing_event_id")
    );
    let slack = app.delivery(
        "slack",
        r#"{"type":"event_callback","event":{"type":"m"}}"#,
        "",
    );
    let answer = app.send(&slack).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "missing_event_id")
    );
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn an_overlong_or_unprintable_event_id_is_400_invalid_event_id() {
    let app = TestApp::spawn().await;
    let long = "e".repeat(256);
    let answer = app.send(&app.delivery("github", "{}", &long)).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "invalid_event_id")
    );
    let tab = app.send(&app.delivery("github", "{}", "evt\t1")).await;
    assert_eq!(
        (tab.status, tab.error().as_str()),
        (400, "invalid_event_id")
    );
    let control = r#"{"id":"evt\u0001x","type":"a"}"#;
    let answer = app.send(&app.delivery("stripe", control, "")).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "invalid_event_id")
    );
    let newline = r#"{"id":"evt\nx","type":"a"}"#;
    let answer = app.send(&app.delivery("stripe", newline, "")).await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "invalid_event_id")
    );
    // Whitespace at either end: a forwarded id travels in headers, which HTTP trims.
    for id in ["evt_x ", " evt_x", "evt_x\u{a0}"] {
        let body = format!(r#"{{"id":"{id}","type":"a"}}"#);
        let answer = app.send(&app.delivery("stripe", &body, "")).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "invalid_event_id"),
            "{id:?}: {}",
            answer.text()
        );
        assert!(answer.message().contains("whitespace"), "{}", answer.text());
    }
    // So too an id in a signed header with Unicode whitespace at an end (which HTTP does not
    // trim): the signature is checked over the header as sent, and holds, so the id is what
    // is refused, not the signature (a black-box run got 401 invalid_signature, as though the
    // secret were wrong, where the sender's own library verified the delivery).
    for id in ["\u{a0}msg_1", "msg_1\u{3000}", "\u{2028}msg_1"] {
        let answer = app.send(&app.delivery("standard", "{}", id)).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "invalid_event_id"),
            "{id:?}: {}",
            answer.text()
        );
    }
    // 255 bytes is still fine, and so is whitespace inside an id.
    let answer = app
        .send(&app.delivery("github", "{}", &"e".repeat(255)))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let inner = r#"{"id":"evt x","type":"a"}"#;
    let answer = app.send(&app.delivery("stripe", inner, "")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(app.db.count("events"), 2);
}

#[actix_web::test]
async fn sql_metacharacters_in_an_event_id_are_just_characters() {
    let app = TestApp::spawn().await;
    let id = "evt'); DROP TABLE events; --";
    let body = format!(r#"{{"id":"{id}","object":"event","type":"a"}}"#);
    let first = app.send(&app.delivery("stripe", &body, id)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let again = app.send(&app.delivery("stripe", &body, id)).await;
    assert!(again.replayed());
    assert_eq!(first.json()["event_id"], id);
}

#[actix_web::test]
async fn slack_url_verification_is_answered_with_its_challenge_and_not_stored() {
    let app = TestApp::spawn().await;
    let body = r#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    let answer = app.send(&app.delivery("slack", body, "")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        answer.json()["challenge"],
        "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    );
    assert_eq!(app.db.count("events"), 0);
    // Counted as what it is: a handshake, not a processed event.
    let metrics = app.get("/metrics", None).await.text();
    for line in [
        "hookbox_webhooks_total{source=\"slack\",outcome=\"handshake\"} 1",
        "hookbox_webhooks_total{source=\"slack\",outcome=\"processed\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    // The handshake is signed like any Slack request.
    let forged = app
        .delivery("slack", body, "")
        .with_header("X-Slack-Signature", &format!("v0={}", "0".repeat(64)));
    assert_eq!(app.send(&forged).await.status, 401);
    // One without a challenge to answer is refused and not stored.
    let answer = app
        .send(&app.delivery(
            "slack",
            r#"{"type":"url_verification","event_id":"Ev1"}"#,
            "",
        ))
        .await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (400, "malformed_payload"),
        "{}",
        answer.text()
    );
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn error_bodies_are_json_with_a_code_and_a_message_and_no_secret() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let delivery = app
        .delivery("stripe", &stripe_event(&id, "a", 1), &id)
        .with_header("Stripe-Signature", "t=1,v1=deadbeef");
    let answer = app.send(&delivery).await;
    let json = answer.json();
    assert_eq!(json["error"], "invalid_signature");
    assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
    let text = answer.text();
    for secret in ["whsec_test_secret", "whsec_old_rotated_out", "deadbeef"] {
        assert!(!text.contains(secret), "{text}");
    }
}
