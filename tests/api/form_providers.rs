//! Braintree and Twilio through the real server: form bodies kept as raw bytes, Braintree's
//! derived id and `bt_challenge` GET handshake, Twilio's URL-signed forms and JSON bodies
//! checked against the configured `public_url` (the test server's own address is another), each
//! delivery signed now by the code `send` and `replay` sign with.

use base64::Engine;
use hookbox::providers::{Identity, Signing};
use hookbox::replay::{signing, Signer};
use sha2::{Digest, Sha256};

use crate::helpers::*;

/// The two sources, besides the test config's own. Twilio's `public_url` is not the address the
/// test server listens on: it is checked against what is configured, never the request's Host.
const SOURCES: &str = r#"
[sources.braintree]
scheme = "braintree"
secrets = ["bt-private-key-current", "bt-private-key-older"]
public_key = "btpublickey1"

[sources.twilio]
scheme = "twilio"
secrets = ["twilio-auth-token", "twilio-auth-token-next"]
public_url = "https://hooks.example.com/webhooks/twilio"
"#;

const FORM: &str = "application/x-www-form-urlencoded";

async fn spawn() -> TestApp {
    TestApp::spawn_with(SOURCES, Default::default()).await
}

/// A request as the provider sends it: the query on the URL, the headers and the body.
struct Signed {
    source: &'static str,
    query: Option<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// `body` signed now for `source` by the signing code of `send` and `replay`.
fn signed(app: &TestApp, source: &'static str, body: &[u8], event_id: &str) -> Signed {
    signed_with(&app.config, source, body, event_id)
}

/// `body` signed now for `source` as `config` (whose first secret signs) has it.
fn signed_with(
    config: &hookbox::Config,
    source: &'static str,
    body: &[u8],
    event_id: &str,
) -> Signed {
    let signer = Signer::from_config(config, Vec::new(), &Signing::default())
        .expect("the test config signs");
    let verifier = signer.for_source(source).expect("a configured source");
    let identity = Identity {
        event_id: Some(event_id.to_owned()),
        event_type: None,
    };
    let signed = signing::signed(
        verifier,
        body,
        unix_now(),
        &identity,
        &signing::ContentType::Default,
    );
    Signed {
        source,
        query: signed.query,
        headers: signed.headers,
        body: signed.body,
    }
}

async fn post(app: &TestApp, request: &Signed) -> Answer {
    let url = signing::with_query(
        &format!("{}/webhooks/{}", app.address, request.source),
        request.query.as_deref(),
    );
    let mut builder = client().post(url);
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

/// A Braintree notification's XML, unique per `subject`.
fn notification(kind: &str, subject: &str) -> String {
    format!(
        "<notification>\n  <timestamp type=\"datetime\">2026-01-02T03:04:05Z</timestamp>\n  \
         <kind>{kind}</kind>\n  <subject><subscription><id>{subject}</id>\
         <status>Active</status></subscription></subject>\n</notification>\n"
    )
}

/// The decoded value of a form field.
fn field(form: &[u8], name: &str) -> String {
    form_urlencoded::parse(form)
        .find(|(field, _)| field == name)
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| panic!("no {name} field"))
}

/// Hex HMAC-SHA1 of `content` under `key`.
fn sha1_hmac_hex(key: &[u8], content: &str) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(key).expect("any key");
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

#[actix_web::test]
async fn a_braintree_form_is_processed_under_its_derived_id_and_a_redelivery_is_a_replay() {
    let app = spawn().await;
    let xml = notification("subscription_charged_successfully", &unique_id("sub"));
    let first = signed(&app, "braintree", xml.as_bytes(), "ignored");
    assert!(first
        .headers
        .contains(&("Content-Type".to_owned(), FORM.to_owned())));
    let payload = field(&first.body, "bt_payload");
    let id = format!("sha256:{}", hex::encode(Sha256::digest(payload.as_bytes())));

    let answer = post(&app, &first).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["event_id"], id.as_str());
    assert_eq!(
        answer.json()["event_type"],
        "subscription_charged_successfully"
    );

    // The same bytes again, and the same notification re-signed (here with a pair for another
    // API key first, as Braintree sends while a merchant has two): both replays.
    let again = post(&app, &first).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, answer.body);
    let text = String::from_utf8(first.body.clone()).expect("ASCII");
    let two_pairs = text.replacen("bt_signature=", "bt_signature=otherkey%7Cabcdef%26", 1);
    let rotated = Signed {
        body: two_pairs.into_bytes(),
        ..signed(&app, "braintree", xml.as_bytes(), "ignored")
    };
    let resent = post(&app, &rotated).await;
    assert_eq!(resent.status, 200, "{}", resent.text());
    assert!(resent.replayed());

    // Braintree's own form of a notification ends its payload in a line break, and its SDKs
    // check a signature over the payload with and without one: sent without it under the
    // genuine signature, it is the same notification, a replay, never a second event.
    let key = sha1::Sha1::digest(b"bt-private-key-current");
    let form = |payload: &str, signed_over: &str| Signed {
        body: form_urlencoded::Serializer::new(String::new())
            .append_pair(
                "bt_signature",
                &format!("btpublickey1|{}", sha1_hmac_hex(&key, signed_over)),
            )
            .append_pair("bt_payload", payload)
            .finish()
            .into_bytes(),
        ..signed(&app, "braintree", xml.as_bytes(), "ignored")
    };
    let other_xml = notification("subscription_went_past_due", &unique_id("sub"));
    let with_break = format!(
        "{}\n",
        base64::engine::general_purpose::STANDARD.encode(&other_xml)
    );
    let genuine = post(&app, &form(&with_break, &with_break)).await;
    assert_eq!(genuine.status, 200, "{}", genuine.text());
    assert!(!genuine.replayed());
    let without_break = with_break.trim_end_matches('\n');
    let stripped = post(&app, &form(without_break, &with_break)).await;
    assert_eq!(stripped.status, 200, "{}", stripped.text());
    assert!(stripped.replayed(), "{}", stripped.text());
    assert_eq!(stripped.body, genuine.body);
    // And the other way: signed over the payload and its line break, sent with and without.
    let third_xml = notification("subscription_canceled", &unique_id("sub"));
    let bare = base64::engine::general_purpose::STANDARD.encode(&third_xml);
    let signed_over = format!("{bare}\n");
    let first_form = post(&app, &form(&bare, &signed_over)).await;
    assert_eq!(first_form.status, 200, "{}", first_form.text());
    assert!(!first_form.replayed());
    let added = post(&app, &form(&signed_over, &signed_over)).await;
    assert_eq!(added.status, 200, "{}", added.text());
    assert!(added.replayed(), "{}", added.text());
    assert_eq!(added.body, first_form.body);

    // The raw form is what is stored, byte for byte.
    let event = app
        .get(
            &format!("/admin/events/braintree/{}", id.replace(':', "%3A")),
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(event.status, 200, "{}", event.text());
    assert_eq!(event.json()["payload"], text.as_str(), "{}", event.text());
    assert_eq!(
        app.db.count("events"),
        3,
        "three notifications, each stored once"
    );
}

#[actix_web::test]
async fn a_tampered_braintree_payload_or_a_wrong_key_is_401_and_nothing_is_stored() {
    let app = spawn().await;
    let xml = notification("subscription_went_past_due", &unique_id("sub"));
    let good = signed(&app, "braintree", xml.as_bytes(), "");
    let text = String::from_utf8(good.body.clone()).expect("ASCII");
    let tampered_xml = notification("subscription_went_past_due", &unique_id("sub"));
    let tampered = format!(
        "bt_signature={}&bt_payload={}",
        text.split('&')
            .next()
            .and_then(|pair| pair.strip_prefix("bt_signature="))
            .expect("signature first"),
        form_urlencoded::byte_serialize(
            base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                tampered_xml.as_bytes()
            )
            .as_bytes()
        )
        .collect::<String>()
    );
    let payload = field(&good.body, "bt_payload");
    let wrong_key = format!(
        "bt_signature=btpublickey1%7C{}&bt_payload={}",
        sha1_hmac_hex(&sha1::Sha1::digest(b"not-our-private-key"), &payload),
        form_urlencoded::byte_serialize(payload.as_bytes()).collect::<String>()
    );
    for body in [tampered, wrong_key] {
        let request = Signed {
            body: body.into_bytes(),
            ..signed(&app, "braintree", xml.as_bytes(), "")
        };
        let answer = post(&app, &request).await;
        assert_eq!(answer.status, 401, "{}", answer.text());
        assert_eq!(answer.error(), "invalid_signature");
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_delivery_signed_with_the_second_secret_verifies_for_both_schemes() {
    let app = spawn().await;
    // The signing code signs with a source's first secret: reversed, the second one signs.
    let mut config = app.config.clone();
    for source in &mut config.sources {
        if ["braintree", "twilio"].contains(&source.name.as_str()) {
            assert_eq!(
                source.secrets.len(),
                2,
                "{} is mid-rotation",
                source.name.as_str()
            );
            source.secrets.reverse();
        }
    }
    let xml = notification("subscription_charged_successfully", &unique_id("sub"));
    let form = format!("CallSid={}&CallStatus=completed", unique_id("CA"));
    for (source, body) in [("braintree", xml.as_bytes()), ("twilio", form.as_bytes())] {
        let request = signed_with(&config, source, body, &unique_id("tok"));
        let answer = post(&app, &request).await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
        assert!(!answer.replayed(), "{source}");
    }
    assert_eq!(app.db.count("events"), 2);
}

/// Braintree's destination check, `GET ?bt_challenge=C`, answered 200.
async fn challenge_answer(app: &TestApp, challenge: &str) -> Answer {
    let answer = app
        .get(
            &format!("/webhooks/braintree?bt_challenge={challenge}"),
            None,
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

#[actix_web::test]
async fn braintree_s_challenge_get_is_answered_never_stored_and_counted_as_a_handshake() {
    let app = spawn().await;
    let challenge = "20f9f8ed05f77439fe955c977e4c8a53";
    let answer = challenge_answer(&app, challenge).await;
    assert_eq!(answer.header("content-type"), Some("text/plain"));
    // PUBLIC_KEY|hex(HMAC-SHA1(SHA-1(first private key), challenge)).
    let key = sha1::Sha1::digest(b"bt-private-key-current");
    assert_eq!(
        answer.text(),
        format!("btpublickey1|{}", sha1_hmac_hex(&key, challenge))
    );

    // A GET without a well-formed challenge is malformed; a GET to a source whose provider
    // sends no GET handshake is 405 `method_not_allowed` (not counted as a delivery).
    let bad = app.get("/webhooks/braintree?bt_challenge=XYZ", None).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert_eq!(bad.error(), "malformed_payload");
    assert!(
        bad.message().contains("bt_challenge") && !bad.message().contains("JSON"),
        "the sentence names what is wrong: {}",
        bad.text()
    );
    let stripe = app.get("/webhooks/stripe?bt_challenge=abc", None).await;
    assert_eq!(stripe.status, 405, "{}", stripe.text());
    assert_eq!(stripe.error(), "method_not_allowed");
    assert_eq!(stripe.header("allow"), Some("POST"));
    let unknown = app.get("/webhooks/nosuchsource", None).await;
    assert_eq!(unknown.status, 404, "{}", unknown.text());

    assert_eq!(app.db.count("events"), 0);
    let metrics = app.get("/metrics", None).await.text();
    assert_eq!(metric(&metrics, "braintree", "handshake"), "1");
    assert_eq!(metric(&metrics, "braintree", "processed"), "0");
    assert_eq!(metric(&metrics, "braintree", "rejected"), "1");
    assert_eq!(metric(&metrics, "stripe", "rejected"), "0");
}

#[actix_web::test]
async fn the_challenge_answer_signs_no_delivery_braintree_s_payload_must_be_a_notification() {
    let app = spawn().await;
    // Anyone may ask for the challenge's answer, and it is the very tag a `bt_payload` of the
    // challenge's text would carry: such a form verifies, but it is no notification.
    let mut forms = Vec::new();
    for challenge in ["0123456789abcdef0123456789abcdef", "20f9f8ed05f77439fe95"] {
        let answer = challenge_answer(&app, challenge).await;
        forms.push(format!(
            "bt_signature={}&bt_payload={challenge}",
            form_urlencoded::byte_serialize(answer.text().as_bytes()).collect::<String>()
        ));
    }
    // Signed as `send` signs, XML that is not a notification is refused the same way.
    let other_root = signed(&app, "braintree", b"<n><kind>x</kind></n>", "");
    forms.push(String::from_utf8(other_root.body).expect("ASCII"));
    for form in forms {
        let request = Signed {
            body: form.clone().into_bytes(),
            ..signed(&app, "braintree", b"", "")
        };
        let answer = post(&app, &request).await;
        assert_eq!(answer.status, 400, "{form}: {}", answer.text());
        assert_eq!(answer.error(), "malformed_payload");
        assert!(
            answer.message().contains("notification"),
            "{}",
            answer.text()
        );
    }
    assert_eq!(app.db.count("events"), 0);
    // A notification signed the same way is stored.
    let xml = notification("check", &unique_id("sub"));
    let answer = post(&app, &signed(&app, "braintree", xml.as_bytes(), "")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn a_twilio_form_is_processed_under_its_token_a_redelivery_is_a_replay_and_a_change_is_401() {
    let app = spawn().await;
    let token = unique_id("tok");
    let sid = unique_id("SM");
    let body = format!(
        "AccountSid=AC1&MessageSid={sid}&MessageStatus=delivered&SmsStatus=delivered&To=%2B15558675310"
    );
    let request = signed(&app, "twilio", body.as_bytes(), &token);
    assert!(request
        .headers
        .contains(&("Content-Type".to_owned(), FORM.to_owned())));
    let first = post(&app, &request).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["event_id"], token.as_str());
    assert_eq!(first.json()["event_type"], "delivered");
    let again = post(&app, &request).await;
    assert!(again.replayed(), "{}", again.text());
    assert_eq!(again.body, first.body);

    let changed = Signed {
        body: body.replace("delivered&Sms", "failed&Sms").into_bytes(),
        ..signed(&app, "twilio", body.as_bytes(), &unique_id("tok"))
    };
    let refused = post(&app, &changed).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(refused.error(), "invalid_signature");
    // Signed for the URL the request came to rather than the configured one: refused too.
    let own_url_request = {
        use hmac::{KeyInit, Mac};
        let url = format!("{}/webhooks/twilio", app.address);
        let mut mac =
            hmac::Hmac::<sha1::Sha1>::new_from_slice(b"twilio-auth-token").expect("any key");
        mac.update(url.as_bytes());
        let mut fields: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        fields.sort();
        for (name, value) in fields {
            mac.update(name.as_bytes());
            mac.update(value.as_bytes());
        }
        let tag = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            mac.finalize().into_bytes(),
        );
        Signed {
            source: "twilio",
            query: None,
            headers: vec![
                ("X-Twilio-Signature".to_owned(), tag),
                ("I-Twilio-Idempotency-Token".to_owned(), unique_id("tok")),
                ("Content-Type".to_owned(), FORM.to_owned()),
            ],
            body: body.clone().into_bytes(),
        }
    };
    assert_eq!(post(&app, &own_url_request).await.status, 401);
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn with_dedupe_body_a_twilio_form_sent_again_reordered_re_encoded_or_re_split_is_its_replay()
{
    let app = TestApp::spawn_with(
        &SOURCES.replace(
            "scheme = \"twilio\"\n",
            "scheme = \"twilio\"\ndedupe = \"body\"\n",
        ),
        Default::default(),
    )
    .await;
    let sid = unique_id("SM");
    let body = format!(
        "AccountSid=AC1&Body=hi&MessageSid={sid}&MessageStatus=delivered&To=%2B15558675310"
    );
    let genuine = signed(&app, "twilio", body.as_bytes(), &unique_id("tok"));
    let first = post(&app, &genuine).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());

    // Someone who saw it sends it again under a new token (the token is not signed) or none,
    // its fields reordered, re-encoded, repeated, or split otherwise between names: Twilio
    // signs the fields decoded, sorted, each value once and without separators, so each of
    // these verifies under the genuine signature, and each is the first event's replay.
    let variants = [
        format!("To=%2B15558675310&MessageStatus=delivered&MessageSid={sid}&Body=hi&AccountSid=AC1"),
        format!(
            "AccountSid=AC1&Body=h%69&MessageSid={sid}&MessageStatus=delivered&To=%2B15558675310&To=%2B15558675310"
        ),
        format!("AccountSid=AC1Bodyhi&MessageSid={sid}&MessageStatus=delivered&To=%2B15558675310"),
    ];
    for (i, variant) in variants.iter().enumerate() {
        for token in [Some(unique_id("tok")), None] {
            let headers = genuine
                .headers
                .iter()
                .filter_map(|(name, value)| {
                    if name.eq_ignore_ascii_case("I-Twilio-Idempotency-Token") {
                        token.clone().map(|token| (name.clone(), token))
                    } else {
                        Some((name.clone(), value.clone()))
                    }
                })
                .collect();
            let request = Signed {
                source: "twilio",
                query: genuine.query.clone(),
                headers,
                body: variant.clone().into_bytes(),
            };
            let answer = post(&app, &request).await;
            assert_eq!(answer.status, 200, "{i} {token:?}: {}", answer.text());
            assert!(answer.replayed(), "{i} {token:?}: {}", answer.text());
            assert_eq!(answer.body, first.body, "{i} {token:?}");
        }
    }
    assert_eq!(app.db.count("events WHERE source = 'twilio'"), 1);

    // Another message is another event.
    let other = body.replace(&sid, &unique_id("SM"));
    let answer = post(
        &app,
        &signed(&app, "twilio", other.as_bytes(), &unique_id("tok")),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(!answer.replayed());
    assert_eq!(app.db.count("events WHERE source = 'twilio'"), 2);
}

#[actix_web::test]
async fn a_twilio_json_body_verifies_through_body_sha256_on_the_url() {
    let app = spawn().await;
    let body = format!(
        r#"[{{"specversion":"1.0","type":"com.twilio.messaging.message.delivered","id":"{}"}}]"#,
        unique_id("EZ")
    );
    let request = signed(&app, "twilio", body.as_bytes(), "");
    let hash = hex::encode(Sha256::digest(body.as_bytes()));
    assert_eq!(
        request.query.as_deref(),
        Some(&*format!("bodySHA256={hash}"))
    );
    let first = post(&app, &request).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["event_id"], format!("sha256:{hash}").as_str());
    assert!(first.json()["event_type"].is_null(), "{}", first.text());
    assert!(post(&app, &request).await.replayed());

    // Without the query, or with the body changed under it, it does not verify.
    let no_query = Signed {
        query: None,
        ..signed(&app, "twilio", body.as_bytes(), "")
    };
    let changed = Signed {
        body: body.replace("delivered", "undelivered").into_bytes(),
        ..signed(&app, "twilio", body.as_bytes(), "")
    };
    for request in [no_query, changed] {
        let answer = post(&app, &request).await;
        assert_eq!(answer.status, 401, "{}", answer.text());
    }
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn send_then_export_then_replay_round_trips_both_schemes_into_a_second_server() {
    let app = spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, SOURCES));
    let xml = TempFile::with_extension(
        notification("subscription_canceled", &unique_id("sub")).as_bytes(),
        "xml",
    );
    let form = TempFile::with_extension(
        format!("CallSid={}&CallStatus=completed", unique_id("CA")).as_bytes(),
        "txt",
    );
    let json = TempFile::with_extension(
        format!(r#"{{"id":"{}","type":"x"}}"#, unique_id("EZ")).as_bytes(),
        "json",
    );
    // Braintree's id comes from the payload; Twilio's travels in a header, so a second send
    // is the same event only under the same --event-id.
    let (form_id, json_id) = (unique_id("tok"), unique_id("tok"));
    let cases = [
        ("braintree", &xml, None),
        ("twilio", &form, Some(&form_id)),
        ("twilio", &json, Some(&json_id)),
    ];
    // A query on --to stays on the request, and Twilio signs the request's query.
    let to = format!("{}?tenant=a", app.address);
    for (source, body, event_id) in cases {
        for verdict in ["processed", "replayed"] {
            let config_path = config.path();
            let body_path = body.path();
            let mut args = vec![
                "send",
                "--to",
                &to,
                "--source",
                source,
                "--config",
                &config_path,
            ];
            if let Some(id) = event_id {
                args.extend(["--event-id", id.as_str()]);
            }
            args.push(&body_path);
            let (code, out, err) = run_hookbox_async(&args).await;
            assert_eq!(code, 0, "{source}: {out}{err}");
            assert!(
                out.contains(&format!("200 OK: {verdict}")),
                "{source}: {out}"
            );
        }
    }
    assert_eq!(app.db.count("events"), 3);

    let exported = export_all(&config.path()).await;
    let lines = exported.read();
    assert_eq!(lines.lines().count(), 3, "{lines}");
    assert!(lines.contains("bt_signature=btpublickey1%7C"), "{lines}");

    let other = TestApp::spawn_with(SOURCES, Default::default()).await;
    let other_with_query = format!("{}?tenant=b", other.address);
    for (to, processed, replayed) in [(&other_with_query, 3, 0), (&app.address, 0, 3)] {
        let report = TempFile::with_extension(b"", "json");
        let (code, out, err) = run_hookbox_async(&[
            "replay",
            &exported.path(),
            "--to",
            to,
            "--config",
            &config.path(),
            "--report",
            &report.path(),
        ])
        .await;
        assert_eq!(code, 0, "{out}{err}");
        let report: serde_json::Value = serde_json::from_str(&report.read()).expect("JSON");
        assert_eq!(report["counts"]["processed"], processed, "{out}");
        assert_eq!(report["counts"]["replayed"], replayed, "{out}");
    }
    assert_eq!(other.db.count("events"), 3);
    assert_eq!(app.db.count("events"), 3);
}

#[test]
fn a_missing_public_key_or_public_url_exits_2_naming_the_key() {
    for (source, key) in [("braintree", "public_key"), ("twilio", "public_url")] {
        let without = SOURCES
            .lines()
            .filter(|line| !line.starts_with(&format!("{key} =")))
            .collect::<Vec<_>>()
            .join("\n");
        let config = TempFile::new(&config_text("postgres://unused@127.0.0.1:1/x", &without));
        let (code, _, stderr) = run_hookbox(&["serve", "--config", &config.path()], &[]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(&format!("sources.{source}.{key}")),
            "{stderr}"
        );
    }
}
