//! GitLab, Bitbucket, Linear, Zoom, Twitch and Meta through the real server: per scheme, a
//! delivery signed now by the code `send` and `replay` sign with is processed under the right
//! id and type, the same delivery again is a replay, and a tampered (or stale) one is refused
//! with nothing stored; Zoom's and Twitch's signed handshakes and Meta's verification GET are
//! answered exactly, never stored, and counted as `outcome="handshake"`.

use hookbox::providers::{Identity, Signing};
use hookbox::replay::{signing, Signer};
use sha2::{Digest, Sha256};

use crate::helpers::*;

/// Each source with two secrets, the first of which signs (so rotation is in play), and Meta's
/// verify token.
const SOURCES: &str = r#"
[sources.gitlab]
scheme = "gitlab"
secrets = ["glwht-current-token", "glwht-older-token"]

[sources.bitbucket]
scheme = "bitbucket"
secrets = ["bbws-current", "bbws-older"]

[sources.linear]
scheme = "linear"
secrets = ["lin_wh_current", "lin_wh_older"]

[sources.zoom]
scheme = "zoom"
secrets = ["zoom-current", "zoom-older"]

[sources.twitch]
scheme = "twitch"
secrets = ["twitch-current-secret", "twitch-older-secret"]

[sources.meta]
scheme = "meta"
secrets = ["meta-app-secret", "meta-older-secret"]
verify_token = "meta-verify-7f3c9a"
"#;

async fn spawn() -> TestApp {
    TestApp::spawn_with(SOURCES, Default::default()).await
}

/// A request as the provider sends it.
#[derive(Clone)]
struct Request {
    source: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// `body` signed at `timestamp` for `source` by the signing code of `send` and `replay`.
fn signed_at(
    app: &TestApp,
    source: &'static str,
    body: &str,
    event_id: &str,
    event_type: Option<&str>,
    timestamp: i64,
) -> Request {
    let signer = Signer::from_config(&app.config, Vec::new(), &Signing::default())
        .expect("the test config signs");
    let verifier = signer.for_source(source).expect("a configured source");
    let identity = Identity {
        event_id: Some(event_id.to_owned()),
        event_type: event_type.map(str::to_owned),
    };
    let signed = signing::signed(
        verifier,
        body.as_bytes(),
        timestamp,
        &identity,
        &signing::ContentType::Default,
    );
    Request {
        source,
        headers: signed.headers,
        body: signed.body,
    }
}

fn signed(
    app: &TestApp,
    source: &'static str,
    body: &str,
    event_id: &str,
    event_type: Option<&str>,
) -> Request {
    signed_at(app, source, body, event_id, event_type, unix_now())
}

async fn post(app: &TestApp, request: &Request) -> Answer {
    let mut builder = client().post(format!("{}/webhooks/{}", app.address, request.source));
    for (name, value) in &request.headers {
        builder = builder.insert_header((name.as_str(), value.as_str()));
    }
    read(
        builder
            .send_body(request.body.clone())
            .await
            .expect("the server answers"),
    )
    .await
}

/// `request` with its body's `from` replaced by `to`, every header kept.
fn tampered(request: &Request, from: &str, to: &str) -> Request {
    let text = String::from_utf8(request.body.clone()).expect("UTF-8");
    assert!(text.contains(from), "{from} not in {text}");
    Request {
        body: text.replacen(from, to, 1).into_bytes(),
        ..request.clone()
    }
}

/// `request` with header `name` set to `value`.
fn with_header(request: &Request, name: &str, value: &str) -> Request {
    let mut changed = request.clone();
    changed
        .headers
        .retain(|(header, _)| !header.eq_ignore_ascii_case(name));
    changed.headers.push((name.to_owned(), value.to_owned()));
    changed
}

fn body_id(body: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(body)))
}

fn hmac_hex(key: &str, content: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("any key");
    mac.update(content.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn metric(metrics: &str, source: &str, outcome: &str) -> String {
    let prefix = format!("hookbox_webhooks_total{{source=\"{source}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{prefix} missing from\n{metrics}"))
        .to_owned()
}

/// Processed under `id` and `kind`, then the same request again is a byte-identical replay.
async fn processed_then_replayed(app: &TestApp, request: &Request, id: &str, kind: &str) {
    let first = post(app, request).await;
    assert_eq!(first.status, 200, "{}: {}", request.source, first.text());
    assert_eq!(first.json()["event_id"], id, "{}", request.source);
    assert_eq!(first.json()["event_type"], kind, "{}", request.source);
    assert!(!first.replayed());
    let again = post(app, request).await;
    assert_eq!(again.status, 200, "{}: {}", request.source, again.text());
    assert!(again.replayed(), "{}", request.source);
    assert_eq!(again.body, first.body, "{}", request.source);
}

/// Refused with `status` and `code`, and nothing more stored than `stored`.
async fn refused(app: &TestApp, request: &Request, status: u16, code: &str, stored: i64) {
    let answer = post(app, request).await;
    assert_eq!(
        answer.status,
        status,
        "{}: {}",
        request.source,
        answer.text()
    );
    assert_eq!(answer.error(), code, "{}", request.source);
    assert_eq!(app.db.count("events"), stored, "{}", request.source);
}

#[actix_web::test]
async fn gitlab_takes_the_token_and_its_idempotency_key_and_refuses_another_token() {
    let app = spawn().await;
    let key = unique_id("idem");
    let body = format!(r#"{{"object_kind":"push","ref":"refs/heads/main","after":"{key}"}}"#);
    let request = signed(&app, "gitlab", &body, &key, Some("Push Hook"));
    processed_then_replayed(&app, &request, &key, "Push Hook").await;
    // The older token of a rotation is taken too; a retry keeps its Idempotency-Key, so it
    // is a replay whichever token it carries.
    let older = with_header(&request, "X-Gitlab-Token", "glwht-older-token");
    assert!(post(&app, &older).await.replayed());

    let other = unique_id("idem");
    let fresh = signed(&app, "gitlab", &body.replace(&key, &other), &other, None);
    for wrong in ["glwht-current-toke", "glwht-current-tokenx", "another"] {
        let forged = with_header(&fresh, "X-Gitlab-Token", wrong);
        refused(&app, &forged, 401, "invalid_signature", 1).await;
    }
    // The token is a secret: it is not kept with the event.
    let event = app
        .get(&format!("/admin/events/gitlab/{key}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(event.status, 200, "{}", event.text());
    assert!(
        !event.text().contains("glwht-current-token"),
        "{}",
        event.text()
    );
}

#[actix_web::test]
async fn bitbucket_signs_the_body_and_a_tampered_one_is_401() {
    let app = spawn().await;
    let id = unique_id("req");
    let body = format!(r#"{{"push":{{"changes":[{{"new":{{"name":"{id}"}}}}]}}}}"#);
    let request = signed(&app, "bitbucket", &body, &id, Some("repo:push"));
    processed_then_replayed(&app, &request, &id, "repo:push").await;
    let other = unique_id("req");
    let fresh = signed(&app, "bitbucket", &body, &other, Some("repo:push"));
    refused(
        &app,
        &tampered(&fresh, "changes", "chances"),
        401,
        "invalid_signature",
        1,
    )
    .await;
}

#[actix_web::test]
async fn linear_is_stamped_when_sent_a_restamped_retry_is_a_replay_and_a_stale_one_is_refused() {
    let app = spawn().await;
    let delivery = unique_id("del");
    let body = format!(r#"{{"action":"create","type":"Issue","data":{{"id":"{delivery}"}}}}"#);
    let now = unix_now();
    let request = signed_at(&app, "linear", &body, &delivery, Some("Issue"), now);
    processed_then_replayed(&app, &request, &delivery, "Issue").await;
    // Linear stamps each attempt: a retry's body differs only in webhookTimestamp, which the
    // fingerprint leaves out, so it is a replay and not a reused id.
    let retry = signed_at(&app, "linear", &body, &delivery, Some("Issue"), now - 20);
    assert_ne!(retry.body, request.body);
    let answer = post(&app, &retry).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.replayed());

    let other = unique_id("del");
    let fresh = signed(
        &app,
        "linear",
        &body.replace(&delivery, &other),
        &other,
        Some("Issue"),
    );
    refused(
        &app,
        &tampered(&fresh, "create", "remove"),
        401,
        "invalid_signature",
        1,
    )
    .await;
    // Outside Linear's one minute, though well inside the default five.
    let late = signed_at(
        &app,
        "linear",
        &body.replace(&delivery, &other),
        &other,
        None,
        now - 90,
    );
    refused(&app, &late, 401, "stale_timestamp", 1).await;

    // Correctly signed, but not JSON, or without a whole-number time: the signature matched,
    // so 400 malformed_payload, as for every scheme that needs JSON, not a wrong secret.
    for body in [
        "not json".to_owned(),
        r#"{"action":"create","webhookTimestamp":"1763649000000"}"#.to_owned(),
        r#"{"action":"create"}"#.to_owned(),
    ] {
        let unreadable = with_header(
            &Request {
                body: body.clone().into_bytes(),
                ..late.clone()
            },
            "Linear-Signature",
            &hmac_hex("lin_wh_current", &body),
        );
        refused(&app, &unreadable, 400, "malformed_payload", 1).await;
    }

    // Sent or replayed, only the top-level time is stamped: the event's own data keeps a
    // field of that name, and a string that holds it.
    let third = unique_id("del");
    let nested = format!(
        r#"{{"action":"update","data":{{"id":"{third}","webhookTimestamp":1,"title":"\"webhookTimestamp\":2"}},"type":"Issue"}}"#
    );
    let request = signed(&app, "linear", &nested, &third, Some("Issue"));
    let sent = String::from_utf8(request.body.clone()).expect("UTF-8");
    assert!(
        sent.contains(&format!(
            r#""data":{{"id":"{third}","webhookTimestamp":1,"title":"\"webhookTimestamp\":2"}}"#
        )),
        "{sent}"
    );
    processed_then_replayed(&app, &request, &third, "Issue").await;
}

#[actix_web::test]
async fn zoom_is_stored_under_its_body_hash_and_a_tampered_or_stale_one_is_refused() {
    let app = spawn().await;
    let meeting = unique_id("mtg");
    let body =
        format!(r#"{{"event":"meeting.started","payload":{{"object":{{"id":"{meeting}"}}}}}}"#);
    let request = signed(&app, "zoom", &body, "", None);
    processed_then_replayed(&app, &request, &body_id(body.as_bytes()), "meeting.started").await;
    let other = body.replace(&meeting, &unique_id("mtg"));
    let fresh = signed(&app, "zoom", &other, "", None);
    refused(
        &app,
        &tampered(&fresh, "started", "ended"),
        401,
        "invalid_signature",
        1,
    )
    .await;
    let stale = signed_at(&app, "zoom", &other, "", None, unix_now() - 600);
    refused(&app, &stale, 401, "stale_timestamp", 1).await;
}

#[actix_web::test]
async fn twitch_takes_its_message_id_and_refuses_a_tampered_or_stale_message() {
    let app = spawn().await;
    let id = unique_id("msg");
    let body = format!(
        r#"{{"subscription":{{"id":"{id}","type":"stream.online","version":"1"}},"event":{{"broadcaster_user_id":"1337"}}}}"#
    );
    let request = signed(&app, "twitch", &body, &id, None);
    processed_then_replayed(&app, &request, &id, "stream.online").await;
    let other = unique_id("msg");
    let fresh = signed(&app, "twitch", &body, &other, None);
    refused(
        &app,
        &tampered(&fresh, "1337", "1338"),
        401,
        "invalid_signature",
        1,
    )
    .await;
    // Eight minutes is inside Twitch's ten (the scheme's default); eleven is not.
    let eight = signed_at(&app, "twitch", &body, &other, None, unix_now() - 480);
    let answer = post(&app, &eight).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let third = unique_id("msg");
    let eleven = signed_at(&app, "twitch", &body, &third, None, unix_now() - 660);
    refused(&app, &eleven, 401, "stale_timestamp", 2).await;
}

#[actix_web::test]
async fn meta_is_stored_under_its_body_hash_and_a_tampered_one_is_401() {
    let app = spawn().await;
    let entry = unique_id("entry");
    let body = format!(r#"{{"object":"page","entry":[{{"id":"{entry}","time":1763648998}}]}}"#);
    let request = signed(&app, "meta", &body, "", None);
    processed_then_replayed(&app, &request, &body_id(body.as_bytes()), "page").await;
    let other = body.replace(&entry, &unique_id("entry"));
    let fresh = signed(&app, "meta", &other, "", None);
    refused(
        &app,
        &tampered(&fresh, "page", "user"),
        401,
        "invalid_signature",
        1,
    )
    .await;
}

#[actix_web::test]
async fn each_handshake_is_answered_exactly_never_stored_and_counted_as_a_handshake() {
    let app = spawn().await;

    // Zoom: the signed url_validation, answered with the HMAC of the plain token.
    let plain = "qgg8vlvZRS6UYooatFL8Aw";
    let validation = format!(
        r#"{{"payload":{{"plainToken":"{plain}"}},"event_ts":{},"event":"endpoint.url_validation"}}"#,
        unix_now() * 1000
    );
    let zoom = signed(&app, "zoom", &validation, "", None);
    let answer = post(&app, &zoom).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(
        answer.json(),
        serde_json::json!({"plainToken": plain, "encryptedToken": hmac_hex("zoom-current", plain)})
    );
    let forged = with_header(&zoom, "x-zm-signature", &format!("v0={}", "ab".repeat(32)));
    let refused_zoom = post(&app, &forged).await;
    assert_eq!(refused_zoom.status, 401, "{}", refused_zoom.text());
    assert!(!refused_zoom.text().contains("encryptedToken"));

    // Twitch: the signed webhook_callback_verification, answered with its challenge.
    let challenge = "pogchamp-kappa-360noscope-vohiyo";
    let verification = format!(
        r#"{{"challenge":"{challenge}","subscription":{{"id":"s1","status":"webhook_callback_verification_pending","type":"stream.online"}}}}"#
    );
    let twitch = with_header(
        &signed(&app, "twitch", &verification, &unique_id("msg"), None),
        "Twitch-Eventsub-Message-Type",
        "webhook_callback_verification",
    );
    let answer = post(&app, &twitch).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("text/plain"));
    assert_eq!(answer.text(), challenge);
    let forged = tampered(&twitch, "pogchamp", "kappa");
    let refused_twitch = post(&app, &forged).await;
    assert_eq!(refused_twitch.status, 401, "{}", refused_twitch.text());
    assert!(!refused_twitch.text().contains("kappa-360"));

    // A signed handshake without what its answer needs is refused, 400, and never stored as an
    // event (whose id the header or the body's hash would give it).
    let no_token = format!(
        r#"{{"payload":{{}},"event_ts":{},"event":"endpoint.url_validation"}}"#,
        unix_now() * 1000
    );
    let no_challenge = r#"{"challenge":12345,"subscription":{"type":"stream.online"}}"#;
    for delivery in [
        signed(&app, "zoom", &no_token, "", None),
        with_header(
            &signed(&app, "twitch", no_challenge, &unique_id("msg"), None),
            "Twitch-Eventsub-Message-Type",
            "webhook_callback_verification",
        ),
    ] {
        let answer = post(&app, &delivery).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (400, "malformed_payload"),
            "{}",
            answer.text()
        );
    }

    // Meta: the verification GET, echoed only for subscribe and the right token.
    let query = "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meta-verify-7f3c9a";
    let answer = app.get(&format!("/webhooks/meta?{query}"), None).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("content-type"), Some("text/plain"));
    // The echoed challenge is the client's: never sniffed as HTML.
    assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(answer.text(), "1158201444");
    for (wrong, why) in [
        (
            "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meta-verify-7f3c9b",
            "does not match",
        ),
        (
            "hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meta-verify-7f3c9",
            "does not match",
        ),
        (
            "hub.mode=unsubscribe&hub.challenge=1158201444&hub.verify_token=meta-verify-7f3c9a",
            "hub.mode=subscribe",
        ),
        ("hub.challenge=1158201444", "hub.mode=subscribe"),
    ] {
        let refused_meta = app.get(&format!("/webhooks/meta?{wrong}"), None).await;
        assert_eq!(refused_meta.status, 403, "{wrong}: {}", refused_meta.text());
        assert_eq!(refused_meta.error(), "forbidden");
        assert!(
            refused_meta.message().contains(why),
            "{wrong}: {}",
            refused_meta.text()
        );
        assert!(!refused_meta.text().contains("1158201444"));
    }

    assert_eq!(app.db.count("events"), 0);
    let metrics = app.get("/metrics", None).await.text();
    for source in ["zoom", "twitch", "meta"] {
        assert_eq!(metric(&metrics, source, "handshake"), "1", "{source}");
        assert_eq!(metric(&metrics, source, "processed"), "0", "{source}");
    }
    assert_eq!(metric(&metrics, "meta", "rejected"), "4");
    assert_eq!(metric(&metrics, "zoom", "rejected"), "2");
    assert_eq!(metric(&metrics, "twitch", "rejected"), "2");
}
