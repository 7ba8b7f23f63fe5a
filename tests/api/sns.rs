//! AWS SNS through the real server, with a real stand-in for SNS on 127.0.0.1 that serves the
//! signing certificates, answers the `SubscribeURL`'s GET and counts every request it gets. A
//! message signed now by the code `send` and `replay` sign with (SignatureVersion 1 or 2) is
//! processed, a redelivery is a replay, and a tampered one, one signed with another key than
//! the certificate's, or a stale one is refused with nothing stored; a certificate URL outside
//! `cert_urls` is never requested; a burst fetches the certificate once; a certificate SNS moved
//! to a new URL (its key rotation) is taken beside the old one; a `SubscriptionConfirmation` is
//! confirmed by exactly one GET and stores nothing; an `UnsubscribeConfirmation` is an event and
//! its `SubscribeURL` is never fetched. The RSA keys and certificates are made at test time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures_util::future::join_all;
use hookbox::providers::Signing;
use hookbox::replay::signing;
use hookbox::secret::Secret;

use crate::helpers::*;

const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:hookbox-orders";

/// The stand-in for SNS: certificates by path under `/certs/`, the subscription API at `/`.
/// Every request is counted; while `failing` it answers 500; `delay` makes it slow (so a
/// burst's deliveries arrive while the first fetch is under way).
struct Aws {
    certs: Mutex<HashMap<String, String>>,
    requests: AtomicUsize,
    cert_fetches: AtomicUsize,
    /// The query of each GET of `/`, in order: the subscriptions confirmed.
    confirmations: Mutex<Vec<String>>,
    failing: AtomicBool,
    delay: Duration,
}

impl Aws {
    /// Serves `pem` at `{base}/certs/{name}`.
    fn serve(&self, name: &str, pem: &str) {
        self.certs
            .lock()
            .expect("not poisoned")
            .insert(format!("/certs/{name}"), pem.to_owned());
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn cert_fetches(&self) -> usize {
        self.cert_fetches.load(Ordering::SeqCst)
    }

    fn confirmations(&self) -> Vec<String> {
        self.confirmations.lock().expect("not poisoned").clone()
    }
}

async fn answer_as_aws(state: web::Data<Aws>, request: HttpRequest) -> HttpResponse {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let path = request.path().to_owned();
    if path.starts_with("/certs/") {
        state.cert_fetches.fetch_add(1, Ordering::SeqCst);
    } else if path == "/" {
        state
            .confirmations
            .lock()
            .expect("not poisoned")
            .push(request.query_string().to_owned());
    }
    actix_web::rt::time::sleep(state.delay).await;
    if state.failing.load(Ordering::SeqCst) {
        return HttpResponse::InternalServerError().body("down");
    }
    if path == "/" {
        return HttpResponse::Ok().content_type("text/xml").body(
            "<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>\
             arn:aws:sns:us-east-1:123456789012:hookbox-orders:1</SubscriptionArn>\
             </ConfirmSubscriptionResult></ConfirmSubscriptionResponse>",
        );
    }
    match state.certs.lock().expect("not poisoned").get(&path) {
        Some(pem) => HttpResponse::Ok()
            .content_type("application/x-pem-file")
            .body(pem.clone()),
        None => HttpResponse::NotFound().finish(),
    }
}

/// Starts a stand-in for SNS; returns its base URL (`http://127.0.0.1:PORT`).
fn stand_in(delay: Duration) -> (String, web::Data<Aws>) {
    let state = web::Data::new(Aws {
        certs: Mutex::new(HashMap::new()),
        requests: AtomicUsize::new(0),
        cert_fetches: AtomicUsize::new(0),
        confirmations: Mutex::new(Vec::new()),
        failing: AtomicBool::new(false),
        delay,
    });
    let server = HttpServer::new({
        let state = state.clone();
        move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::to(answer_as_aws))
        }
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind the SNS stand-in");
    let port = server.addrs()[0].port();
    actix_web::rt::spawn(server.run());
    (format!("http://127.0.0.1:{port}"), state)
}

/// The SNS source, trusting the stand-in at `base` for certificates and subscriptions, and a
/// second one that takes only another topic.
fn sources(base: &str) -> String {
    format!(
        "\n[sources.sns]\nscheme = \"sns\"\ncert_urls = [\"{base}/\"]\n\
         \n[sources.sns_other]\nscheme = \"sns\"\ncert_urls = [\"{base}/\"]\n\
         topic_arns = [\"arn:aws:sns:us-east-1:123456789012:somebody-else\"]\n"
    )
}

async fn spawn(base: &str) -> TestApp {
    TestApp::spawn_with(&sources(base), Default::default()).await
}

/// A notification with a fresh id, signed as SignatureVersion `version`.
fn notification(text: &str, version: &str) -> (String, String) {
    let id = unique_id("msg");
    let body = serde_json::json!({
        "Type": "Notification",
        "MessageId": id,
        "TopicArn": TOPIC,
        "Subject": "order.paid",
        "Message": text,
        "SignatureVersion": version,
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
    })
    .to_string();
    (id, body)
}

/// A `SubscriptionConfirmation` or `UnsubscribeConfirmation` whose `SubscribeURL` is on `base`:
/// its id, body and the query of that URL.
fn confirmation(kind: &str, base: &str, topic: &str) -> (String, String, String) {
    let id = unique_id("msg");
    let token = format!("tok{}", id.replace('_', ""));
    let query = format!("Action=ConfirmSubscription&TopicArn={topic}&Token={token}");
    let body = serde_json::json!({
        "Type": kind,
        "MessageId": id,
        "Token": token,
        "TopicArn": topic,
        "Message": format!("You have chosen to subscribe to the topic {topic}.\nTo confirm the subscription, visit the SubscribeURL included in this message."),
        "SubscribeURL": format!("{base}/?{query}"),
        "SignatureVersion": "2",
    })
    .to_string();
    (id, body, query)
}

/// `body` signed at `at` for `source` by `send`'s and `replay`'s signing code, with `key` and
/// naming `cert_url`.
fn signed_for(
    app: &TestApp,
    source: &str,
    key: &TestKey,
    cert_url: &str,
    body: &str,
    at: i64,
) -> Delivery {
    let signing = Signing {
        key_pem: Some(Secret::new(key.key_pem.clone())),
        cert_url: Some(cert_url.to_owned()),
        to_query: None,
    };
    // The source's scheme built to sign, as `Signer::from_config` builds it, without its check
    // that the receiver admits `cert_url`: some of these deliveries are to be refused.
    let config = source_named(&app.config, source);
    let verifier = config
        .scheme
        .build_signer(&[], config.tolerance, &signing)
        .expect("the sns source signs");
    let identity = signing::identity(&verifier, body.as_bytes(), None, None);
    let signed = signing::signed(
        &verifier,
        body.as_bytes(),
        at,
        &identity,
        &signing::ContentType::Default,
    );
    Delivery {
        source: source.to_owned(),
        headers: signed.headers,
        body: signed.body,
    }
}

fn signed(app: &TestApp, key: &TestKey, cert_url: &str, body: &str, at: i64) -> Delivery {
    signed_for(app, "sns", key, cert_url, body, at)
}

/// `delivery` with the body's field `name` set to `value` after signing.
fn tampered(delivery: &Delivery, name: &str, value: &str) -> Delivery {
    let mut message: serde_json::Value =
        serde_json::from_slice(&delivery.body).expect("a signed message is JSON");
    message[name] = value.into();
    Delivery {
        body: message.to_string().into_bytes(),
        ..delivery.clone()
    }
}

fn stored(app: &TestApp) -> i64 {
    app.db.count("events WHERE source LIKE 'sns%'")
}

fn metric(metrics: &str, source: &str, outcome: &str) -> String {
    let prefix = format!("hookbox_webhooks_total{{source=\"{source}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{prefix} missing from\n{metrics}"))
        .to_owned()
}

fn assert_refused(answer: &Answer, code: &str, what: &str) {
    assert_eq!(answer.status, 401, "{what}: {}", answer.text());
    assert_eq!(answer.code().as_deref(), Some(code), "{what}");
}

#[actix_web::test]
async fn a_signed_notification_is_processed_a_redelivery_replays_and_bad_ones_store_nothing() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("SimpleNotificationService-1.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/SimpleNotificationService-1.pem");
    let (id, body) = notification("{\"order_id\": \"ord_1042\", \"amount\": \"45.00\"}", "2");

    let delivery = signed(&app, &key, &cert_url, &body, unix_now());
    assert_eq!(
        delivery.header("Content-Type"),
        "text/plain; charset=UTF-8",
        "as SNS posts it"
    );
    let first = app.send(&delivery).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(first.json()["event_id"], id.as_str(), "{}", first.text());
    assert_eq!(first.json()["event_type"], "Notification");

    // SNS's retry is the very same message, byte for byte.
    let again = app.send(&delivery).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(stored(&app), 1);

    let (_, other) = notification("{\"order_id\": \"ord_1043\", \"amount\": \"45.00\"}", "2");
    let good = signed(&app, &key, &cert_url, &other, unix_now());
    let message = "{\"order_id\": \"ord_1043\", \"amount\": \"4.50\"}";
    assert_refused(
        &app.send(&tampered(&good, "Message", message)).await,
        "invalid_signature",
        "tampered Message",
    );
    assert_refused(
        &app.send(&tampered(&good, "Subject", "order.refunded"))
            .await,
        "invalid_signature",
        "tampered Subject",
    );
    // Signed with another key than the certificate's at the URL it names.
    let wrong = TestKey::new();
    assert_refused(
        &app.send(&signed(&app, &wrong, &cert_url, &other, unix_now()))
            .await,
        "invalid_signature",
        "another key",
    );
    // Genuine, but published two hours ago or two hours ahead: past the hour SNS retries for.
    for skew in [-7200, 7200] {
        assert_refused(
            &app.send(&signed(&app, &key, &cert_url, &other, unix_now() + skew))
                .await,
            "stale_timestamp",
            &format!("{skew} s"),
        );
    }
    // Within the hour SNS may still retry: taken.
    let late = app
        .send(&signed(&app, &key, &cert_url, &other, unix_now() - 1800))
        .await;
    assert_eq!(late.status, 200, "{}", late.text());

    assert_eq!(stored(&app), 2, "nothing of a refused message is stored");
    assert_eq!(aws.cert_fetches(), 1, "one certificate URL, fetched once");
}

#[actix_web::test]
async fn signature_versions_1_and_2_are_both_taken_and_each_only_with_its_own_digest() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("SimpleNotificationService-v.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/SimpleNotificationService-v.pem");
    for (version, other) in [("1", "2"), ("2", "1")] {
        let (id, body) = notification("stock fell below 5", version);
        let delivery = signed(&app, &key, &cert_url, &body, unix_now());
        let sent: serde_json::Value = serde_json::from_slice(&delivery.body).expect("JSON");
        assert_eq!(sent["SignatureVersion"], version);
        // The same signature under the other version names the other digest.
        let renamed = tampered(&delivery, "SignatureVersion", other);
        assert_refused(
            &app.send(&renamed).await,
            "invalid_signature",
            &format!("v{version} signature as v{other}"),
        );
        assert_refused(
            &app.send(&tampered(&delivery, "SignatureVersion", "3"))
                .await,
            "invalid_signature",
            "version 3",
        );
        let answer = app.send(&delivery).await;
        assert_eq!(answer.status, 200, "v{version}: {}", answer.text());
        assert_eq!(answer.json()["event_id"], id.as_str());
    }
    assert_eq!(stored(&app), 2);
}

#[actix_web::test]
async fn a_cert_url_outside_the_allowlist_is_401_and_never_requested() {
    let key = TestKey::new();
    let (base, allowed) = stand_in(Duration::ZERO);
    allowed.serve("c.pem", &key.cert_pem);
    // Another host:port serving the very certificate that signed: still not to be asked.
    let (elsewhere, outside) = stand_in(Duration::ZERO);
    outside.serve("c.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let host_port = base.trim_start_matches("http://");
    for cert_url in [
        format!("{elsewhere}/certs/c.pem"),
        format!("https://{host_port}/certs/c.pem"),
        format!("http://sns@{host_port}/certs/c.pem"),
        format!("{base}/certs/../certs/c.pem"),
        format!("{base}/certs/c.crt"),
        format!("{base}/certs/c.pem?x=1"),
        format!("{base}/certs/c.pem#x"),
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-1.pem".to_owned(),
    ] {
        let (_, body) = notification("hello", "2");
        let answer = app
            .send(&signed(&app, &key, &cert_url, &body, unix_now()))
            .await;
        assert_refused(&answer, "invalid_signature", &cert_url);
    }
    assert_eq!(allowed.requests(), 0);
    assert_eq!(outside.requests(), 0);
    assert_eq!(stored(&app), 0);
}

#[actix_web::test]
async fn fifty_concurrent_deliveries_fetch_the_certificate_once() {
    let key = TestKey::new();
    // A slow certificate host: the burst arrives while the first fetch is under way.
    let (base, aws) = stand_in(Duration::from_millis(500));
    aws.serve("burst.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/burst.pem");
    let deliveries: Vec<(String, Delivery)> = (0..50)
        .map(|n| {
            let (id, body) = notification(&format!("message {n}"), "2");
            (id, signed(&app, &key, &cert_url, &body, unix_now()))
        })
        .collect();
    let answers = join_all(deliveries.iter().map(|(_, delivery)| app.send(delivery))).await;
    for ((id, _), answer) in deliveries.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{id}: {}", answer.text());
        assert_eq!(answer.json()["event_id"], id.as_str());
    }
    assert_eq!(stored(&app), 50);
    assert_eq!(aws.cert_fetches(), 1);
}

#[actix_web::test]
async fn a_certificate_that_cannot_be_fetched_is_503_with_nothing_stored_until_it_can() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("flaky.pem", &key.cert_pem);
    aws.failing.store(true, Ordering::SeqCst);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/flaky.pem");
    let (id, body) = notification("hello", "2");
    let delivery = signed(&app, &key, &cert_url, &body, unix_now());

    let answer = app.send(&delivery).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("unavailable"));
    assert!(
        answer.message().contains("certificate") && !answer.message().contains("database"),
        "the sentence names what failed: {}",
        answer.text()
    );
    assert_eq!(stored(&app), 0);

    aws.failing.store(false, Ordering::SeqCst);
    let retry = app.send(&delivery).await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.json()["event_id"], id.as_str());
    assert_eq!(aws.cert_fetches(), 2, "a failed fetch is not kept");
}

#[actix_web::test]
async fn two_certificates_at_two_urls_are_both_taken() {
    // SNS rotates its key by signing with a new certificate at a new SigningCertURL; messages
    // signed with the old one may still be in flight.
    let (old, new) = (TestKey::new(), TestKey::new());
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("SimpleNotificationService-old.pem", &old.cert_pem);
    aws.serve("SimpleNotificationService-new.pem", &new.cert_pem);
    let app = spawn(&base).await;
    let old_url = format!("{base}/certs/SimpleNotificationService-old.pem");
    let new_url = format!("{base}/certs/SimpleNotificationService-new.pem");
    for (key, url) in [(&old, &old_url), (&new, &new_url)] {
        let (id, body) = notification("rotation", "2");
        let answer = app.send(&signed(&app, key, url, &body, unix_now())).await;
        assert_eq!(answer.status, 200, "{url}: {}", answer.text());
        assert_eq!(answer.json()["event_id"], id.as_str());
    }
    // Each key only with its own certificate.
    let (_, body) = notification("crossed", "2");
    assert_refused(
        &app.send(&signed(&app, &old, &new_url, &body, unix_now()))
            .await,
        "invalid_signature",
        "the old key naming the new certificate",
    );
    assert_eq!(stored(&app), 2);
    assert_eq!(aws.cert_fetches(), 2);
}

#[actix_web::test]
async fn a_subscription_confirmation_is_confirmed_by_one_get_and_stores_nothing() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("sub.pem", &key.cert_pem);
    let (elsewhere, outside) = stand_in(Duration::ZERO);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/sub.pem");

    let (_, body, query) = confirmation("SubscriptionConfirmation", &base, TOPIC);
    let answer = app
        .send(&signed(&app, &key, &cert_url, &body, unix_now()))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["status"], "subscription_confirmed");
    assert_eq!(
        aws.confirmations(),
        vec![query],
        "exactly one GET of SubscribeURL"
    );

    // A forged confirmation (the Token changed after signing) is refused and not confirmed.
    let (_, body, _) = confirmation("SubscriptionConfirmation", &base, TOPIC);
    let forged = tampered(
        &signed(&app, &key, &cert_url, &body, unix_now()),
        "Token",
        "tok-forged",
    );
    assert_refused(
        &app.send(&forged).await,
        "invalid_signature",
        "forged Token",
    );
    // Genuinely signed, but its SubscribeURL is on a host outside cert_urls: never requested.
    let (_, body, _) = confirmation("SubscriptionConfirmation", &elsewhere, TOPIC);
    assert_refused(
        &app.send(&signed(&app, &key, &cert_url, &body, unix_now()))
            .await,
        "invalid_signature",
        "SubscribeURL outside the allowlist",
    );
    // A topic the source does not take is not subscribed to.
    let (_, body, _) = confirmation("SubscriptionConfirmation", &base, TOPIC);
    assert_refused(
        &app.send(&signed_for(
            &app,
            "sns_other",
            &key,
            &cert_url,
            &body,
            unix_now(),
        ))
        .await,
        "invalid_signature",
        "a topic not in topic_arns",
    );

    assert_eq!(aws.confirmations().len(), 1, "no other confirmation");
    assert_eq!(outside.requests(), 0);
    assert_eq!(stored(&app), 0);
    let metrics = app.get("/metrics", None).await.text();
    assert_eq!(metric(&metrics, "sns", "handshake"), "1");
    assert_eq!(metric(&metrics, "sns", "processed"), "0");
    assert_eq!(metric(&metrics, "sns", "rejected"), "2");
}

#[actix_web::test]
async fn a_confirmation_whose_get_fails_is_503_so_sns_sends_it_again() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("sub.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/sub.pem");
    // Fetched once, before the subscription API goes down.
    let (_, warm) = notification("warm the certificate cache", "2");
    let answer = app
        .send(&signed(&app, &key, &cert_url, &warm, unix_now()))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    let (_, body, query) = confirmation("SubscriptionConfirmation", &base, TOPIC);
    let delivery = signed(&app, &key, &cert_url, &body, unix_now());
    aws.failing.store(true, Ordering::SeqCst);
    let answer = app.send(&delivery).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("unavailable"));
    assert!(
        answer.message().contains("SubscribeURL") && !answer.message().contains("database"),
        "the sentence names what failed: {}",
        answer.text()
    );
    assert!(!answer.text().contains("tok"), "the token is not echoed");

    aws.failing.store(false, Ordering::SeqCst);
    let answer = app.send(&delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(aws.confirmations(), vec![query.clone(), query]);
    assert_eq!(stored(&app), 1, "only the notification");
}

#[actix_web::test]
async fn an_unsubscribe_confirmation_is_stored_and_its_subscribe_url_never_fetched() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("unsub.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/unsub.pem");
    let (id, body, _) = confirmation("UnsubscribeConfirmation", &base, TOPIC);
    let delivery = signed(&app, &key, &cert_url, &body, unix_now());

    let answer = app.send(&delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["event_id"], id.as_str());
    assert_eq!(answer.json()["event_type"], "UnsubscribeConfirmation");
    let again = app.send(&delivery).await;
    assert!(again.replayed());
    assert_eq!(again.body, answer.body);

    // Its Token is signed like a subscription's.
    assert_refused(
        &app.send(&tampered(&delivery, "Token", "tok-forged")).await,
        "invalid_signature",
        "forged Token",
    );
    assert!(aws.confirmations().is_empty(), "never re-subscribed");
    assert_eq!(stored(&app), 1);
}

#[actix_web::test]
async fn send_and_replay_sign_as_sns_with_key_and_cert_url_and_name_a_missing_flag() {
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("send.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let config = TempFile::new(&config_text(&app.db.url, &sources(&base)));
    let key_file = TempFile::new(&key.key_pem);
    let (id, body) = notification("sent by hookbox send", "1");
    let body_file = TempFile::new(&body);
    let cert_url = format!("{base}/certs/send.pem");
    let (config_path, key_path, body_path) = (config.path(), key_file.path(), body_file.path());
    let send = |extra: &[&str]| {
        let mut args = vec![
            "send",
            "--to",
            app.address.as_str(),
            "--source",
            "sns",
            "--config",
            config_path.as_str(),
        ];
        args.extend_from_slice(extra);
        args.push(body_path.as_str());
        args.iter()
            .map(|a| (*a).to_owned())
            .collect::<Vec<String>>()
    };

    let args = send(&["--key", key_path.as_str(), "--cert-url", cert_url.as_str()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = run_hookbox_async(&refs).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&id) && stdout.contains("processed"),
        "{stdout}"
    );
    assert_eq!(stored(&app), 1);
    let event = app
        .get(&format!("/admin/events/sns/{id}"), Some(ADMIN_TOKEN))
        .await;
    let payload: serde_json::Value =
        serde_json::from_str(event.json()["payload"].as_str().expect("a text payload"))
            .expect("the stored message is JSON");
    assert_eq!(payload["SignatureVersion"], "1", "kept as the body said");
    assert_eq!(payload["SigningCertURL"], cert_url.as_str());

    // Sent again, re-signed at a new time: the same message, so a replay.
    let (code, stdout, stderr) = run_hookbox_async(&refs).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("replayed"), "{stdout}");
    assert_eq!(stored(&app), 1);

    // Exported from this server and replayed into a second one, re-signed with the same key.
    let second = spawn(&base).await;
    export_and_replay_signed(&config_path, "sns", &second, &key_path, &cert_url).await;
    assert_eq!(stored(&second), 1);
    let event = second
        .get(&format!("/admin/events/sns/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(event.status, 200, "{}", event.text());
    assert_eq!(event.json()["event_type"], "Notification");
    assert_eq!(aws.cert_fetches(), 1, "one process, one URL, one fetch");

    let args = send(&["--cert-url", cert_url.as_str()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&refs).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--key"), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");

    // No config needed: the scheme, the key and the certificate's URL are all SNS signs with.
    let (other, body) = notification("sent without a config", "2");
    let other_file = TempFile::new(&body);
    let (code, stdout, stderr) = run_hookbox_async(&[
        "send",
        "--to",
        app.address.as_str(),
        "--source",
        "sns",
        "--scheme",
        "sns",
        "--key",
        key_path.as_str(),
        "--cert-url",
        cert_url.as_str(),
        other_file.path().as_str(),
    ])
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains(&other), "{stdout}");
    assert_eq!(stored(&app), 2);
}

#[actix_web::test]
async fn send_and_replay_refuse_an_sns_body_they_cannot_sign_and_send_nothing() {
    // `send` posted a message without MessageId unsigned (no Signature field), said `200 OK:
    // processed` from a receiver that took anything, and exited 0 (a black-box run).
    let key = TestKey::new();
    let (base, aws) = stand_in(Duration::ZERO);
    aws.serve("send.pem", &key.cert_pem);
    let app = spawn(&base).await;
    let key_file = TempFile::new(&key.key_pem);
    let cert_url = format!("{base}/certs/send.pem");
    let deliveries_counted = async |app: &TestApp| -> Vec<String> {
        app.get("/metrics", None)
            .await
            .text()
            .lines()
            .filter(|l| l.starts_with("hookbox_webhooks_total"))
            .map(str::to_owned)
            .collect()
    };
    let counted_before = deliveries_counted(&app).await;
    let unsignable = [
        (
            r#"{"Type":"Notification","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"m"}"#,
            "MessageId",
        ),
        (
            r#"{"Type":"Notification","MessageId":"m-1","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":{"a":1}}"#,
            "Message",
        ),
        (
            r#"{"Type":"SubscriptionConfirmation","MessageId":"m-2","TopicArn":"arn:aws:sns:us-east-1:1:t","Message":"m","SubscribeURL":"https://example.com"}"#,
            "Token",
        ),
        (r#"{"MessageId":"m-3","Message":"m"}"#, "Type"),
        ("[1, 2]", "JSON object"),
    ];
    for (body, named) in unsignable {
        // A plain body file, which replay signs with --source as send does.
        let file = TempFile::with_extension(body.as_bytes(), "json");
        let args = |command: &'static str| {
            vec![
                command,
                "--to",
                app.address.as_str(),
                "--source",
                "sns",
                "--scheme",
                "sns",
                "--key",
                key_file.0.to_str().expect("a UTF-8 path"),
                "--cert-url",
                cert_url.as_str(),
                file.0.to_str().expect("a UTF-8 path"),
            ]
        };
        let (code, stdout, stderr) = run_hookbox_async(&args("send")).await;
        assert_eq!(code, 2, "{body}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(named) && stderr.contains("nothing was sent"),
            "{body}: {stderr}"
        );
        // Bad usage, as a line of a source whose key replay lacks: checked before it sends.
        let (code, stdout, stderr) = run_hookbox_async(&args("replay")).await;
        assert_eq!(code, 2, "{body}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("cannot_sign") && stderr.contains(named),
            "{body}: {stdout}\n{stderr}"
        );
    }
    assert_eq!(
        deliveries_counted(&app).await,
        counted_before,
        "nothing reached the receiver"
    );
    assert_eq!(stored(&app), 0);
}

#[test]
fn serve_warns_of_an_sns_source_without_topic_arns_at_startup() {
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, &sources("https://sns.example")));
    let log = process.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("no topic_arns"))
        .collect();
    assert_eq!(warnings.len(), 1, "one source lacks topic_arns:\n{log}");
    assert!(
        warnings[0].contains("source sns: no topic_arns"),
        "it names the source: {}",
        warnings[0]
    );
}
