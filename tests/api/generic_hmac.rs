//! The generic `hmac` scheme through the real server, describing three real providers by
//! configuration alone, each signed here the way that provider documents (with this test's own
//! HMAC code, not hookbox's):
//! - Lusha: HMAC-SHA256 of `{timestamp}.{body}`, hex, the unix timestamp in `X-Lusha-Timestamp`;
//! - HiBob: HMAC-SHA512 of the body, base64, in `Bob-Signature`, no delivery id;
//! - GitHub's legacy `X-Hub-Signature: sha1=<hex>`, HMAC-SHA1 of the body.
//!
//! Per provider: a delivery is processed and its redelivery is a byte-identical replay; a
//! tampered body, a wrong key and (where signed) a stale or future timestamp are refused with
//! nothing stored; the older secret of a rotation still passes. Then several signatures in one
//! header, a header the template needs that is missing (401, never 5xx), what `send` and
//! `replay` sign, and the config errors, which name the key.

use hmac::{Hmac, KeyInit, Mac};
use hookbox::providers::Signing;
use hookbox::replay::{signing, Signer};
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

use crate::helpers::*;

/// Each source with two secrets: the current one first (what `send` signs with), then the one
/// being rotated out.
const SOURCES: &str = r#"
[sources.lusha]
scheme = "hmac"
secrets = ["lusha-current-secret", "lusha-older-secret"]
algorithm = "sha256"
signed_content = "{timestamp}.{body}"
timestamp_header = "X-Lusha-Timestamp"
signature_header = "X-Lusha-Signature"
encoding = "hex"
event_id = "json:/id"
event_type = "json:/type"

[sources.hibob]
scheme = "hmac"
secrets = ["hibob-current-secret", "hibob-older-secret"]
algorithm = "sha512"
signature_header = "Bob-Signature"
encoding = "base64"
event_id = "sha256"
event_type = "json:/type"

[sources.github-legacy]
scheme = "hmac"
secrets = ["gh-current-secret", "gh-older-secret"]
algorithm = "sha1"
signature_header = "X-Hub-Signature"
signature_prefix = "sha1="
encoding = "hex"
event_id = "header:X-GitHub-Delivery"
event_type = "header:X-GitHub-Event"

[sources.bearer]
scheme = "hmac"
secrets = ["bearer-secret"]
signature_header = "Authorization"
signature_prefix = "HMAC "
event_id = "header:X-Delivery"
event_type = "header:X-Kind"

[sources.nonced]
scheme = "hmac"
secrets = ["nonce-secret"]
signed_content = "{id}:{header:X-Nonce}:{body}"
signature_header = "X-Signature"
event_id = "header:X-Delivery"
"#;

async fn spawn() -> TestApp {
    TestApp::spawn_with(SOURCES, Default::default()).await
}

fn mac<M: Mac + KeyInit>(key: &str, content: &[u8]) -> Vec<u8> {
    let mut mac = <M as KeyInit>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(content);
    mac.finalize().into_bytes().to_vec()
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A request as a provider sends it.
#[derive(Clone, Debug)]
struct Request {
    source: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    /// This request with header `name` set to `value` alone.
    fn with(&self, name: &str, value: &str) -> Request {
        let mut changed = self.clone();
        changed
            .headers
            .retain(|(h, _)| !h.eq_ignore_ascii_case(name));
        changed.headers.push((name.to_owned(), value.to_owned()));
        changed
    }

    /// This request without header `name`.
    fn without(&self, name: &str) -> Request {
        let mut changed = self.clone();
        changed
            .headers
            .retain(|(h, _)| !h.eq_ignore_ascii_case(name));
        changed
    }

    /// This request with its body's `from` replaced by `to`, every header kept.
    fn tampered(&self, from: &str, to: &str) -> Request {
        let text = String::from_utf8(self.body.clone()).expect("UTF-8");
        assert!(text.contains(from), "{from} not in {text}");
        Request {
            body: text.replacen(from, to, 1).into_bytes(),
            ..self.clone()
        }
    }
}

/// Lusha's rule: hex HMAC-SHA256 of `{timestamp}.{body}`, the timestamp in its own header.
fn lusha(secret: &str, body: &str, timestamp: i64) -> Request {
    let signature = hex::encode(mac::<Hmac<Sha256>>(
        secret,
        format!("{timestamp}.{body}").as_bytes(),
    ));
    Request {
        source: "lusha",
        headers: vec![
            ("X-Lusha-Timestamp".into(), timestamp.to_string()),
            ("X-Lusha-Signature".into(), signature),
            ("Content-Type".into(), "application/json".into()),
            ("User-Agent".into(), "Lusha-Webhooks/1.0".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

fn lusha_body(id: &str) -> String {
    format!(
        r#"{{"id":"{id}","type":"promotion","entityType":"contact","entityId":"4158887495","data":{{"currentTitle":"Head of Bar"}}}}"#
    )
}

/// HiBob's rule: base64 HMAC-SHA512 of the body in `Bob-Signature`.
fn hibob(secret: &str, body: &str) -> Request {
    Request {
        source: "hibob",
        headers: vec![
            (
                "Bob-Signature".into(),
                base64(&mac::<Hmac<Sha512>>(secret, body.as_bytes())),
            ),
            ("Content-Type".into(), "application/json".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

fn hibob_body(employee: &str) -> String {
    format!(
        r#"{{"companyId":640126,"type":"employee.updated","triggeredBy":"system","triggeredAt":"2026-12-03T09:00:00.000Z","version":"v2","data":{{"employeeId":"{employee}"}}}}"#
    )
}

/// GitHub's legacy rule: `sha1=` and the hex HMAC-SHA1 of the body in `X-Hub-Signature`.
fn github_legacy(secret: &str, body: &str, delivery: &str) -> Request {
    let signature = format!(
        "sha1={}",
        hex::encode(mac::<Hmac<Sha1>>(secret, body.as_bytes()))
    );
    Request {
        source: "github-legacy",
        headers: vec![
            ("X-Hub-Signature".into(), signature),
            ("X-GitHub-Delivery".into(), delivery.to_owned()),
            ("X-GitHub-Event".into(), "issues".into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

fn issue_body(title: &str) -> String {
    format!(r#"{{"action":"opened","issue":{{"number":1347,"title":"{title}"}}}}"#)
}

async fn post(app: &TestApp, request: &Request) -> Answer {
    let mut builder = client().post(format!("{}/webhooks/{}", app.address, request.source));
    for (name, value) in &request.headers {
        builder = builder.append_header((name.as_str(), value.as_str()));
    }
    read(
        builder
            .send_body(request.body.clone())
            .await
            .expect("the server answers"),
    )
    .await
}

/// Processed under `id` and `kind`, then the same request again is a byte-identical replay.
async fn processed_then_replayed(app: &TestApp, request: &Request, id: &str, kind: &str) {
    let first = post(app, request).await;
    assert_eq!(first.status, 200, "{}: {}", request.source, first.text());
    assert!(!first.replayed(), "{}", request.source);
    assert_eq!(first.json()["event_id"], id, "{}", request.source);
    assert_eq!(first.json()["event_type"], kind, "{}", request.source);
    let again = post(app, request).await;
    assert_eq!(again.status, 200, "{}: {}", request.source, again.text());
    assert!(again.replayed(), "{}", request.source);
    assert_eq!(again.body, first.body, "{}", request.source);
}

/// Refused with `status` and `code`, and no more events stored than `stored`.
async fn refused(app: &TestApp, request: &Request, code: &str, stored: i64) {
    let answer = post(app, request).await;
    assert_eq!(answer.status, 401, "{}: {}", request.source, answer.text());
    assert_eq!(answer.error(), code, "{}", request.source);
    assert_eq!(app.db.count("events"), stored, "{}", request.source);
}

#[actix_web::test]
async fn lusha_signs_its_timestamp_with_the_body_and_a_stale_or_future_one_is_refused() {
    let app = spawn().await;
    let id = unique_id("sig");
    let now = unix_now();
    let request = lusha("lusha-current-secret", &lusha_body(&id), now);
    processed_then_replayed(&app, &request, &id, "promotion").await;
    // A retry Lusha stamps anew is the same event.
    let retry = lusha("lusha-current-secret", &lusha_body(&id), now - 30);
    let answer = post(&app, &retry).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.replayed());

    let other = unique_id("sig");
    let fresh = lusha_body(&other);
    refused(
        &app,
        &lusha("lusha-current-secret", &fresh, now).tampered("Head of Bar", "Head of Bars"),
        "invalid_signature",
        1,
    )
    .await;
    refused(
        &app,
        &lusha("not-lushas-secret", &fresh, now),
        "invalid_signature",
        1,
    )
    .await;
    for skew in [-600, 600] {
        refused(
            &app,
            &lusha("lusha-current-secret", &fresh, now + skew),
            "stale_timestamp",
            1,
        )
        .await;
    }
    // A fresh timestamp on an old signature: the timestamp is signed.
    let old = lusha("lusha-current-secret", &fresh, now - 600);
    refused(
        &app,
        &old.with("X-Lusha-Timestamp", &now.to_string()),
        "invalid_signature",
        1,
    )
    .await;
    // No timestamp at all: the content cannot be built, so the signature is refused.
    refused(
        &app,
        &lusha("lusha-current-secret", &fresh, now).without("X-Lusha-Timestamp"),
        "invalid_signature",
        1,
    )
    .await;
    // The secret being rotated out still signs.
    let rotated = lusha("lusha-older-secret", &fresh, now);
    processed_then_replayed(&app, &rotated, &other, "promotion").await;
    assert_eq!(app.db.count("events"), 2);
}

#[actix_web::test]
async fn hibob_signs_the_body_with_sha512_in_base64_and_its_hash_is_the_id() {
    let app = spawn().await;
    let body = hibob_body(&unique_id("emp"));
    let request = hibob("hibob-current-secret", &body);
    let id = format!("sha256:{}", hex::encode(Sha256::digest(body.as_bytes())));
    processed_then_replayed(&app, &request, &id, "employee.updated").await;

    let fresh = hibob_body(&unique_id("emp"));
    refused(
        &app,
        &hibob("hibob-current-secret", &fresh).tampered("updated", "created"),
        "invalid_signature",
        1,
    )
    .await;
    refused(
        &app,
        &hibob("not-hibobs-secret", &fresh),
        "invalid_signature",
        1,
    )
    .await;
    // The right MAC under another hash, or in hex, is not HiBob's signature.
    let sha256 = base64(&mac::<Hmac<Sha256>>(
        "hibob-current-secret",
        fresh.as_bytes(),
    ));
    let in_hex = hex::encode(mac::<Hmac<Sha512>>(
        "hibob-current-secret",
        fresh.as_bytes(),
    ));
    for wrong in [sha256, in_hex] {
        let forged = hibob("hibob-current-secret", &fresh).with("Bob-Signature", &wrong);
        refused(&app, &forged, "invalid_signature", 1).await;
    }
    let rotated = hibob("hibob-older-secret", &fresh);
    let id = format!("sha256:{}", hex::encode(Sha256::digest(fresh.as_bytes())));
    processed_then_replayed(&app, &rotated, &id, "employee.updated").await;
}

#[actix_web::test]
async fn github_legacy_signs_with_sha1_behind_its_prefix() {
    let app = spawn().await;
    let delivery = unique_id("dlv");
    let body = issue_body("Replay loses content-type");
    let request = github_legacy("gh-current-secret", &body, &delivery);
    processed_then_replayed(&app, &request, &delivery, "issues").await;

    let other = unique_id("dlv");
    let fresh = github_legacy("gh-current-secret", &body, &other);
    refused(
        &app,
        &fresh.tampered("opened", "closed"),
        "invalid_signature",
        1,
    )
    .await;
    refused(
        &app,
        &github_legacy("not-the-secret", &body, &other),
        "invalid_signature",
        1,
    )
    .await;
    let signature = fresh.headers[0].1.clone();
    let unprefixed = signature.trim_start_matches("sha1=");
    let sha256 = format!(
        "sha1={}",
        hex::encode(mac::<Hmac<Sha256>>("gh-current-secret", body.as_bytes()))
    );
    for wrong in [unprefixed, &sha256] {
        refused(
            &app,
            &fresh.with("X-Hub-Signature", wrong),
            "invalid_signature",
            1,
        )
        .await;
    }
    let rotated = github_legacy("gh-older-secret", &body, &other);
    processed_then_replayed(&app, &rotated, &other, "issues").await;
}

#[actix_web::test]
async fn a_signature_in_authorization_verifies_and_is_never_stored() {
    let app = spawn().await;
    let body = issue_body("signed in Authorization");
    let signature = hex::encode(mac::<Hmac<Sha256>>("bearer-secret", body.as_bytes()));
    let request = Request {
        source: "bearer",
        headers: vec![
            ("Authorization".into(), format!("HMAC {signature}")),
            ("X-Delivery".into(), "d-1".into()),
            ("X-Kind".into(), "issues".into()),
            ("Content-Type".into(), "application/json".into()),
        ],
        body: body.into_bytes(),
    };
    processed_then_replayed(&app, &request, "d-1", "issues").await;
    refused(
        &app,
        &request.tampered("signed", "forged"),
        "invalid_signature",
        1,
    )
    .await;
    let stored = |text: &str| {
        app.db.count(&format!(
            "events WHERE source = 'bearer' AND CAST(headers AS TEXT) LIKE '%{text}%'"
        ))
    };
    assert_eq!(stored("x-delivery"), 1, "its other headers are kept");
    assert_eq!(stored("authorization"), 0, "Authorization never is");
    assert_eq!(stored(&signature), 0);

    // A row an older hookbox stored with it: the admin API and the console leave it out.
    use diesel::RunQueryDsl;
    diesel::sql_query(
        "UPDATE events SET headers = '{\"Authorization\": \"HMAC old\", \"cookie\": \"c=1\", \
         \"x-delivery\": \"d-1\"}' WHERE source = 'bearer'",
    )
    .execute(&mut app.db.connect())
    .expect("the old row");
    let shown = app.get("/admin/events/bearer/d-1", Some(ADMIN_TOKEN)).await;
    assert_eq!(shown.status, 200, "{}", shown.text());
    assert_eq!(
        shown.json()["headers"],
        serde_json::json!({"x-delivery": "d-1"}),
        "{}",
        shown.text()
    );
}

#[actix_web::test]
async fn several_signatures_in_one_header_or_in_repeated_lines_pass_when_any_matches() {
    let app = spawn().await;
    let wrong_sha1 = format!("sha1={}", "0".repeat(40));
    let delivery = unique_id("dlv");
    let request = github_legacy("gh-older-secret", &issue_body("rotation"), &delivery);
    let right = request.headers[0].1.clone();
    // Two lines, the first made with a key the source does not have.
    let mut lines = request.without("X-Hub-Signature");
    lines
        .headers
        .insert(0, ("X-Hub-Signature".into(), wrong_sha1.clone()));
    lines
        .headers
        .insert(1, ("X-Hub-Signature".into(), right.clone()));
    processed_then_replayed(&app, &lines, &delivery, "issues").await;
    // One line, comma-separated; the kept header is what came.
    let delivery = unique_id("dlv");
    let listed = github_legacy("gh-current-secret", &issue_body("listed"), &delivery);
    let listed = listed.with(
        "X-Hub-Signature",
        &format!("{wrong_sha1}, {}", listed.headers[0].1),
    );
    processed_then_replayed(&app, &listed, &delivery, "issues").await;
    // Wrong ones only: refused.
    let delivery = unique_id("dlv");
    let forged = github_legacy("gh-current-secret", &issue_body("forged"), &delivery)
        .with("X-Hub-Signature", &format!("{wrong_sha1} {wrong_sha1}"));
    refused(&app, &forged, "invalid_signature", 2).await;

    // HiBob's base64, space-separated.
    let body = hibob_body(&unique_id("emp"));
    let old = hibob("hibob-older-secret", &body);
    let new = hibob("hibob-current-secret", &body);
    let both = new.with(
        "Bob-Signature",
        &format!("{} {}", "A".repeat(86) + "==", old.headers[0].1),
    );
    let id = format!("sha256:{}", hex::encode(Sha256::digest(body.as_bytes())));
    processed_then_replayed(&app, &both, &id, "employee.updated").await;
}

#[actix_web::test]
async fn a_header_the_template_signs_is_checked_and_its_absence_is_a_401() {
    let app = spawn().await;
    let body = r#"{"hello":"world"}"#;
    let delivery = unique_id("dlv");
    let content = format!("{delivery}:n-42:{body}");
    let request = Request {
        source: "nonced",
        headers: vec![
            (
                "X-Signature".into(),
                hex::encode(mac::<Hmac<Sha256>>("nonce-secret", content.as_bytes())),
            ),
            ("X-Delivery".into(), delivery.clone()),
            ("X-Nonce".into(), "n-42".into()),
        ],
        body: body.as_bytes().to_vec(),
    };
    let first = post(&app, &request).await;
    assert_eq!(first.status, 200, "{}", first.text());
    // A missing or repeated signed header, or another value in it (the id included), is a
    // refused signature, never a server error.
    refused(&app, &request.without("X-Nonce"), "invalid_signature", 1).await;
    let mut twice = request.clone();
    twice.headers.push(("X-Nonce".into(), "n-42".into()));
    refused(&app, &twice, "invalid_signature", 1).await;
    refused(
        &app,
        &request.with("X-Nonce", "n-43"),
        "invalid_signature",
        1,
    )
    .await;
    let moved = request.with("X-Delivery", &unique_id("dlv"));
    refused(&app, &moved, "invalid_signature", 1).await;
}

/// `body` signed now for `source` by the code `send` and `replay` sign with.
fn signed_by_hookbox(
    app: &TestApp,
    source: &'static str,
    body: &str,
    event_id: &str,
    event_type: Option<&str>,
) -> Request {
    let signer = Signer::from_config(&app.config, Vec::new(), &Signing::default())
        .expect("the test config signs");
    let verifier = signer.for_source(source).expect("a configured source");
    let identity = signing::identity(verifier, body.as_bytes(), Some(event_id), event_type);
    let signed = signing::signed(
        verifier,
        body.as_bytes(),
        unix_now(),
        &identity,
        &signing::ContentType::Default,
    );
    Request {
        source,
        headers: signed.headers,
        body: signed.body,
    }
}

#[actix_web::test]
async fn send_and_replay_sign_each_source_as_its_provider_does() {
    let app = spawn().await;
    let id = unique_id("sig");
    let request = signed_by_hookbox(&app, "lusha", &lusha_body(&id), "ignored", None);
    processed_then_replayed(&app, &request, &id, "promotion").await;
    // Signed with the first secret, exactly as Lusha's rule gives it.
    let stamp = request
        .headers
        .iter()
        .find(|(name, _)| name == "X-Lusha-Timestamp")
        .expect("a timestamp")
        .1
        .parse::<i64>()
        .expect("unix seconds");
    let lushas = lusha("lusha-current-secret", &lusha_body(&id), stamp);
    assert_eq!(request.headers[0], lushas.headers[1]);

    let body = hibob_body(&unique_id("emp"));
    let request = signed_by_hookbox(&app, "hibob", &body, "ignored", None);
    let hash = format!("sha256:{}", hex::encode(Sha256::digest(body.as_bytes())));
    processed_then_replayed(&app, &request, &hash, "employee.updated").await;
    assert_eq!(
        request.headers[0],
        hibob("hibob-current-secret", &body).headers[0]
    );

    let delivery = unique_id("dlv");
    let body = issue_body("signed by send");
    let request = signed_by_hookbox(&app, "github-legacy", &body, &delivery, Some("issues"));
    processed_then_replayed(&app, &request, &delivery, "issues").await;
    assert_eq!(
        request.headers[0],
        github_legacy("gh-current-secret", &body, &delivery).headers[0]
    );

    // A header only the provider can fill goes out empty, signed so.
    let delivery = unique_id("dlv");
    let request = signed_by_hookbox(&app, "nonced", r#"{"a":1}"#, &delivery, None);
    assert!(request
        .headers
        .contains(&("X-Nonce".to_owned(), String::new())));
    let answer = post(&app, &request).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["event_id"], delivery.as_str());
}

#[actix_web::test]
async fn hookbox_send_signs_a_timestamped_source_and_the_second_send_is_a_replay() {
    let app = spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, SOURCES));
    let id = unique_id("sig");
    let body = TempFile::with_extension(lusha_body(&id).as_bytes(), "json");
    let args = [
        "send",
        "--to",
        &app.address,
        "--source",
        "lusha",
        "--config",
        &config.path(),
        &body.path(),
    ];
    let (code, first, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 0, "{first}{stderr}");
    assert!(first.contains("200 OK: processed"), "{first}");
    assert!(first.contains(&format!("(event {id})")), "{first}");
    let (code, second, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 0, "{second}{stderr}");
    assert!(second.contains("200 OK: replayed"), "{second}");
    assert_eq!(app.db.count("events"), 1);
}

#[test]
fn a_generic_source_that_cannot_work_exits_2_naming_the_key() {
    let source = |keys: &str| {
        format!(
            "[sources.h]\nscheme = \"hmac\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"header:X-Id\"\n{keys}\n"
        )
    };
    let cases = [
        (
            source("algorithm = \"md5\""),
            "sources.h.algorithm: unknown algorithm \"md5\": expected one of sha1, sha256, sha512",
        ),
        (
            source("signed_content = \"{timestamp}.{bdy}\"\ntimestamp_header = \"X-Ts\""),
            "sources.h.signed_content: unknown placeholder {bdy}",
        ),
        (
            source("signed_content = \"{timestamp}.{body}\""),
            "sources.h.timestamp_header: signed_content signs {timestamp}",
        ),
        (
            source("timestamp_header = \"X-Ts\""),
            "sources.h.timestamp_header: X-Ts is not signed",
        ),
        (
            source("signed_content = \"{url}{body}\""),
            "sources.h.public_url: signed_content signs {url}",
        ),
        (
            source("signed_content = \"{timestamp}\"\ntimestamp_header = \"X-Ts\""),
            "sources.h.signed_content: \"{timestamp}\" does not sign {body}",
        ),
        (
            "[sources.h]\nscheme = \"hmac\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"json:/id\"\nsigned_content = \"{id}.{body}\"\n"
                .to_owned(),
            "sources.h.signed_content: {id} with a json: event_id",
        ),
        (
            "[sources.h]\nscheme = \"hmac\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"sha512\"\n"
                .to_owned(),
            "sources.h.event_id: event id \"sha512\" must be",
        ),
        (
            "[sources.h]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"sha256\"\nalgorithm = \"sha512\"\n"
                .to_owned(),
            "sources.h.algorithm: unknown field `algorithm`",
        ),
    ];
    for (config, says) in cases {
        let file = TempFile::new(&config);
        let (code, _, stderr) = run_hookbox(&["serve", "--config", &file.path()], &[]);
        assert_eq!(code, 2, "{config}\n{stderr}");
        assert!(
            stderr.contains(says),
            "{config}\nexpected {says:?} in\n{stderr}"
        );
    }
}
