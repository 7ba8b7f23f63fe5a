//! PayPal through the real server, with a real certificate server on 127.0.0.1 that counts the
//! requests it gets: a delivery signed now (by the code `send` and `replay` sign with) is
//! processed, a redelivery is a replay, a tampered or stale one is 401; a burst fetches the
//! certificate once; a certificate URL outside `cert_urls` is 401 with no request made; a
//! certificate server that fails gives 503 with nothing stored, and recovery needs no restart.
//! The RSA key and its certificate are made at test time, never checked in.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::future::join_all;
use hookbox::providers::Signing;
use hookbox::replay::signing;
use hookbox::secret::Secret;

use crate::helpers::*;

/// A certificate server: it serves one PEM under any path, counting requests; while `failing`
/// it answers 500. `delay` is how slow it is to answer (a slow certificate host, so that a
/// burst's deliveries arrive while the first fetch is under way).
struct CertServer {
    requests: AtomicUsize,
    failing: AtomicBool,
    pem: String,
    delay: Duration,
}

async fn serve_cert(state: web::Data<CertServer>) -> HttpResponse {
    state.requests.fetch_add(1, Ordering::SeqCst);
    actix_web::rt::time::sleep(state.delay).await;
    if state.failing.load(Ordering::SeqCst) {
        return HttpResponse::InternalServerError().body("down");
    }
    HttpResponse::Ok()
        .content_type("application/x-pem-file")
        .body(state.pem.clone())
}

/// Starts a certificate server serving `pem`; returns its base URL (`http://127.0.0.1:PORT`).
fn cert_server(pem: &str, delay: Duration) -> (String, web::Data<CertServer>) {
    let state = web::Data::new(CertServer {
        requests: AtomicUsize::new(0),
        failing: AtomicBool::new(false),
        pem: pem.to_owned(),
        delay,
    });
    let server = HttpServer::new({
        let state = state.clone();
        move || {
            App::new()
                .app_data(state.clone())
                .default_service(web::get().to(serve_cert))
        }
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind the certificate server");
    let port = server.addrs()[0].port();
    actix_web::rt::spawn(server.run());
    (format!("http://127.0.0.1:{port}"), state)
}

/// The PayPal source, trusting certificates under `{base}/certs/` only.
fn source(base: &str) -> String {
    format!(
        "\n[sources.paypal]\nscheme = \"paypal\"\nwebhook_id = \"8PT597110X687430LKGECATA\"\n\
         cert_urls = [\"{base}/certs/\"]\n"
    )
}

async fn spawn(base: &str) -> TestApp {
    TestApp::spawn_with(&source(base), Default::default()).await
}

/// [`spawn`] with a second source, `paypal2`, of the same webhook id: a genuine delivery to
/// one is no delivery to the other.
async fn spawn_two_sources(base: &str) -> TestApp {
    let second = source(base).replace("[sources.paypal]", "[sources.paypal2]");
    TestApp::spawn_with(&format!("{}{second}", source(base)), Default::default()).await
}

/// A PayPal event body with a fresh id.
fn event(kind: &str) -> (String, String) {
    let id = unique_id("WH").replace('_', "-");
    let body = format!(
        r#"{{"id":"{id}","event_version":"1.0","create_time":"2026-01-02T03:04:05.000Z","resource_type":"capture","event_type":"{kind}","resource":{{"id":"42311647XV020574X","status":"COMPLETED","amount":{{"currency_code":"USD","value":"45.00"}}}}}}"#
    );
    (id, body)
}

/// `body` signed at `at` for the `paypal` source by `send`'s and `replay`'s signing code, with
/// `key` and naming `cert_url`.
fn signed(app: &TestApp, key: &TestKey, cert_url: &str, body: &str, at: i64) -> Delivery {
    signed_for(&app.config, key, cert_url, body, at)
}

/// [`signed`], for the `paypal` source of `config`.
fn signed_for(
    config: &hookbox::config::Config,
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
    let source = source_named(config, "paypal");
    let verifier = source
        .scheme
        .build_signer(&[], source.tolerance, &signing)
        .expect("the paypal source signs");
    let identity = signing::identity(&verifier, body.as_bytes(), None, None);
    let signed = signing::signed(
        &verifier,
        body.as_bytes(),
        at,
        &identity,
        &signing::ContentType::Default,
    );
    Delivery {
        source: "paypal".to_owned(),
        headers: signed.headers,
        body: signed.body,
    }
}

fn stored(app: &TestApp) -> i64 {
    app.db.count("events WHERE source = 'paypal'")
}

#[actix_web::test]
async fn a_signed_delivery_is_processed_a_redelivery_replays_and_a_tampered_or_stale_one_is_401() {
    let key = TestKey::new();
    let (base, server) = cert_server(&key.cert_pem, Duration::ZERO);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/CERT-360caa42-fca2a594-a5cafa77");
    let (id, body) = event("PAYMENT.CAPTURE.COMPLETED");

    let first = app
        .send(&signed(&app, &key, &cert_url, &body, unix_now()))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(first.json()["event_id"], id.as_str(), "{}", first.text());
    assert_eq!(first.json()["event_type"], "PAYMENT.CAPTURE.COMPLETED");

    // PayPal's retry: a new transmission (id, time, signature), the same event.
    let again = app
        .send(&signed(&app, &key, &cert_url, &body, unix_now()))
        .await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(stored(&app), 1);

    // Tampered after signing: the body's CRC32 no longer matches the signed string.
    let (_, other) = event("PAYMENT.CAPTURE.REFUNDED");
    let mut tampered = signed(&app, &key, &cert_url, &other, unix_now());
    tampered.body = other.replace("45.00", "45.01").into_bytes();
    let answer = app.send(&tampered).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("invalid_signature"));

    // Another key than the certificate's.
    let wrong = TestKey::new();
    let answer = app
        .send(&signed(&app, &wrong, &cert_url, &other, unix_now()))
        .await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("invalid_signature"));

    // Genuine, but transmitted ten minutes ago, or ten minutes ahead.
    for skew in [-600, 600] {
        let answer = app
            .send(&signed(&app, &key, &cert_url, &other, unix_now() + skew))
            .await;
        assert_eq!(answer.status, 401, "{skew}: {}", answer.text());
        assert_eq!(answer.code().as_deref(), Some("stale_timestamp"));
    }

    // A weaker algorithm named in the header is not honoured.
    let mut sha1 = signed(&app, &key, &cert_url, &other, unix_now());
    for (name, value) in &mut sha1.headers {
        if name.eq_ignore_ascii_case("PAYPAL-AUTH-ALGO") {
            *value = "SHA1withRSA".to_owned();
        }
    }
    let answer = app.send(&sha1).await;
    assert_eq!(answer.status, 401, "{}", answer.text());

    assert_eq!(stored(&app), 1, "nothing of a refused delivery is stored");
    assert_eq!(
        server.requests.load(Ordering::SeqCst),
        1,
        "one certificate URL, fetched once"
    );
}

/// `body` followed by 64 bytes of JSON whitespace (spaces and tabs) chosen so that its CRC32 is
/// `crc`: what someone who has seen one genuine delivery can write in a moment. CRC32 is affine
/// over GF(2), so turning one space into a tab flips a fixed set of its bits whatever the rest
/// says; some subset of the 64 flips makes up any difference.
fn forged_to_crc(body: &str, crc: u32) -> Vec<u8> {
    const PAD: usize = 64;
    let mut bytes = body.as_bytes().to_vec();
    bytes.extend([b' '; PAD]);
    let base = crc32fast::hash(&bytes);
    // Each flip's effect, reduced to a basis: highest bit -> (effect, the flips that make it).
    let mut basis: [Option<(u32, u64)>; 32] = [None; 32];
    for i in 0..PAD {
        bytes[body.len() + i] = b'\t';
        let (mut effect, mut flips) = (crc32fast::hash(&bytes) ^ base, 1u64 << i);
        bytes[body.len() + i] = b' ';
        while effect != 0 {
            let bit = 31 - effect.leading_zeros() as usize;
            match basis[bit] {
                Some((e, f)) => (effect, flips) = (effect ^ e, flips ^ f),
                None => {
                    basis[bit] = Some((effect, flips));
                    break;
                }
            }
        }
    }
    let (mut missing, mut flips) = (base ^ crc, 0u64);
    while missing != 0 {
        let bit = 31 - missing.leading_zeros() as usize;
        let (e, f) = basis[bit].expect("64 flips reach every CRC32");
        (missing, flips) = (missing ^ e, flips ^ f);
    }
    for i in (0..PAD).filter(|i| flips >> i & 1 == 1) {
        bytes[body.len() + i] = b'\t';
    }
    assert_eq!(crc32fast::hash(&bytes), crc, "the forgery matches");
    bytes
}

#[actix_web::test]
async fn another_body_forged_to_a_genuine_deliverys_crc32_is_401_and_stores_nothing() {
    let key = TestKey::new();
    let (base, server) = cert_server(&key.cert_pem, Duration::ZERO);
    let app = spawn_two_sources(&base).await;
    let cert_url = format!("{base}/certs/CERT-360caa42-fca2a594-a5cafa77");
    let (id, body) = event("PAYMENT.CAPTURE.COMPLETED");
    let genuine = signed(&app, &key, &cert_url, &body, unix_now());
    let first = app.send(&genuine).await;
    assert_eq!(first.status, 200, "{}", first.text());

    // Another event, a hundred times the amount, padded to the genuine body's CRC32 and sent
    // with the genuine delivery's headers: the signature matches it.
    let (forged_id, other) = event("PAYMENT.CAPTURE.COMPLETED");
    let other = other.replace("45.00", "4500.00");
    let forged = Delivery {
        body: forged_to_crc(&other, crc32fast::hash(body.as_bytes())),
        ..genuine.clone()
    };
    let answer = app.send(&forged).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("invalid_signature"));
    // The check trims the transmission id, so a space around it is the same id.
    let transmission = genuine
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("PAYPAL-TRANSMISSION-ID"))
        .map(|(_, value)| value.clone())
        .expect("a transmission id");
    let spaced = forged
        .clone()
        .with_header("PAYPAL-TRANSMISSION-ID", &format!(" {transmission} "));
    let answer = app.send(&spaced).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(stored(&app), 1, "the forged event is not stored");
    assert_eq!(
        app.db
            .count(&format!("events WHERE event_id = '{forged_id}'")),
        0
    );

    // The genuine delivery again (PayPal resending the same transmission) is still its replay.
    let again = app.send(&genuine).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(app.db.count(&format!("events WHERE event_id = '{id}'")), 1);

    // PayPal's retry of the event comes under a new transmission, answered as a replay; its
    // headers carry no other body either.
    let retry = signed(&app, &key, &cert_url, &body, unix_now());
    let answer = app.send(&retry).await;
    assert!(answer.replayed(), "{}", answer.text());
    let forged_retry = Delivery {
        body: forged.body.clone(),
        ..retry.clone()
    };
    let answer = app.send(&forged_retry).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    let elsewhere = Delivery {
        source: "paypal2".to_owned(),
        ..retry.clone()
    };
    let answer = app.send(&elsewhere).await;
    assert_eq!(answer.status, 401, "{}", answer.text());

    // A delivery answered 503 because its certificate could not be fetched (a URL not fetched
    // yet, while the certificate host fails): once the certificate can be had, its headers
    // carry its own event and no other.
    server.failing.store(true, Ordering::SeqCst);
    let (late_id, late_body) = event("PAYMENT.CAPTURE.COMPLETED");
    let fresh_cert_url = format!("{base}/certs/CERT-not-fetched-yet");
    let unfetched = signed(&app, &key, &fresh_cert_url, &late_body, unix_now());
    let answer = app.send(&unfetched).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    server.failing.store(false, Ordering::SeqCst);
    let (_, other) = event("PAYMENT.CAPTURE.COMPLETED");
    let forged_late = Delivery {
        body: forged_to_crc(&other, crc32fast::hash(late_body.as_bytes())),
        ..unfetched.clone()
    };
    let answer = app.send(&forged_late).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    // The same event id with another amount, under the same headers: refused as well.
    let same_id = Delivery {
        body: forged_to_crc(
            &late_body.replace("45.00", "4500.00"),
            crc32fast::hash(late_body.as_bytes()),
        ),
        ..unfetched.clone()
    };
    let answer = app.send(&same_id).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    let answer = app.send(&unfetched).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(!answer.replayed());
    assert_eq!(
        app.db
            .count(&format!("events WHERE event_id = '{late_id}'")),
        1
    );
    assert_eq!(stored(&app), 2, "the genuine events, and no forged one");

    // A genuine delivery and a forgery of it sent at once, ten times over: each time one of
    // the two is stored and the other refused, whichever comes first.
    for round in 0..10 {
        let (_, body) = event("PAYMENT.CAPTURE.COMPLETED");
        let genuine = signed(&app, &key, &cert_url, &body, unix_now());
        let (_, other) = event("PAYMENT.CAPTURE.COMPLETED");
        let forged = Delivery {
            body: forged_to_crc(&other, crc32fast::hash(body.as_bytes())),
            ..genuine.clone()
        };
        let (a, b) = tokio::join!(app.send(&genuine), app.send(&forged));
        let mut statuses = [a.status, b.status];
        statuses.sort_unstable();
        assert_eq!(
            statuses,
            [200, 401],
            "round {round}: {} / {}",
            a.text(),
            b.text()
        );
        assert_eq!(
            stored(&app),
            3 + round,
            "round {round}: one of the two is stored"
        );
    }

    // The transmission ids go with the events, by the same window.
    assert_eq!(app.db.count("transmissions"), 13, "one per transmission");
    let config = TempFile::new(&config_text(&app.db.url, &source(&base)));
    let (code, _, stderr) =
        run_hookbox_async(&["purge", "--config", &config.path(), "--older-than", "0s"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!((stored(&app), app.db.count("transmissions")), (0, 0));
}

#[actix_web::test]
async fn a_store_with_the_first_transmissions_table_is_upgraded_and_binds_each_delivery() {
    use diesel::connection::SimpleConnection;
    let key = TestKey::new();
    let (base, _server) = cert_server(&key.cert_pem, Duration::ZERO);
    let cert_url = format!("{base}/certs/CERT-360caa42-fca2a594-a5cafa77");
    // Migrated by a hookbox whose `transmissions` bound an id to an event id per source.
    let db = TestDb::create();
    {
        let mut conn = db.connect();
        crate::upgrade::migrate_before(&mut conn, "20261211100000");
        conn.batch_execute(
            "INSERT INTO transmissions (source, transmission_id, event_id, seen_at) \
             VALUES ('paypal', 'old-id', 'WH-OLD', '2026-12-06T00:00:00Z')",
        )
        .expect("a binding in the old table");
    }
    let config = parse_config(&config_text(&db.url, &source(&base)));
    let app = TestApp::spawn_on(db, config, Default::default()).await;

    let (_, body) = event("PAYMENT.CAPTURE.COMPLETED");
    let genuine = signed(&app, &key, &cert_url, &body, unix_now());
    let first = app.send(&genuine).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let (_, other) = event("PAYMENT.CAPTURE.COMPLETED");
    let forged = Delivery {
        body: forged_to_crc(&other, crc32fast::hash(body.as_bytes())),
        ..genuine.clone()
    };
    let answer = app.send(&forged).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(stored(&app), 1);
}

/// A release of 2026-12-05/06 kept a transmission id's binding in its event's row
/// (`events.dedupe_key`, the SHA-256 of `transmission:` and the id), not in `transmissions`: a
/// body forged to the CRC32 of a delivery it took, sent to this one with that delivery's
/// headers (after an upgrade, or beside it in a rolling deploy), is refused too (a black-box
/// run saw it stored).
#[actix_web::test]
async fn a_transmission_an_older_release_bound_in_its_event_row_carries_no_other_body() {
    use diesel::connection::SimpleConnection;
    use sha2::{Digest, Sha256};
    let key = TestKey::new();
    let (base, _server) = cert_server(&key.cert_pem, Duration::ZERO);
    // The older release's binding holds under the second source too.
    let app = spawn_two_sources(&base).await;
    let cert_url = format!("{base}/certs/CERT-360caa42-fca2a594-a5cafa77");
    let (id, body) = event("PAYMENT.CAPTURE.COMPLETED");
    let genuine = signed(&app, &key, &cert_url, &body, unix_now());
    let first = app.send(&genuine).await;
    assert_eq!(first.status, 200, "{}", first.text());
    // As the older release left it: the binding in the event's row, none in `transmissions`.
    let transmission = genuine
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("PAYPAL-TRANSMISSION-ID"))
        .map(|(_, value)| value.clone())
        .expect("a transmission id");
    let legacy = hex::encode(Sha256::digest(format!("transmission:{transmission}")));
    let literal = if store_is_sqlite() {
        format!("X'{legacy}'")
    } else {
        format!("decode('{legacy}', 'hex')")
    };
    app.db
        .connect()
        .batch_execute(&format!(
            "DELETE FROM transmissions; \
             UPDATE events SET dedupe_key = {literal} WHERE event_id = '{id}'"
        ))
        .expect("an older release's binding");

    // Another event's body, and this event's with another amount, under the genuine headers.
    let (forged_id, other) = event("PAYMENT.CAPTURE.COMPLETED");
    let other = other.replace("45.00", "4500.00");
    let same_id_other_amount = body.replace("45.00", "4500.00");
    for forgery in [other, same_id_other_amount] {
        let forged = Delivery {
            body: forged_to_crc(&forgery, crc32fast::hash(body.as_bytes())),
            ..genuine.clone()
        };
        let answer = app.send(&forged).await;
        assert_eq!(answer.status, 401, "{}", answer.text());
        assert_eq!(answer.code().as_deref(), Some("invalid_signature"));
    }
    let elsewhere = Delivery {
        source: "paypal2".to_owned(),
        ..genuine.clone()
    };
    let answer = app.send(&elsewhere).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(stored(&app), 1, "no forged event is stored");
    assert_eq!(
        app.db
            .count(&format!("events WHERE event_id = '{forged_id}'")),
        0
    );
    assert_eq!(app.db.count("events WHERE source = 'paypal2'"), 0);
    // PayPal sending the same transmission again is still its replay.
    let again = app.send(&genuine).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

#[actix_web::test]
async fn a_burst_of_fifty_deliveries_fetches_the_certificate_once() {
    let key = TestKey::new();
    // A slow certificate host: the burst arrives while the first fetch is under way.
    let (base, server) = cert_server(&key.cert_pem, Duration::from_millis(500));
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/CERT-burst");
    let deliveries: Vec<(String, Delivery)> = (0..50)
        .map(|_| {
            let (id, body) = event("CHECKOUT.ORDER.APPROVED");
            let delivery = signed(&app, &key, &cert_url, &body, unix_now());
            (id, delivery)
        })
        .collect();
    let answers = join_all(deliveries.iter().map(|(_, delivery)| app.send(delivery))).await;
    for ((id, _), answer) in deliveries.iter().zip(&answers) {
        assert_eq!(answer.status, 200, "{id}: {}", answer.text());
        assert_eq!(answer.json()["event_id"], id.as_str());
    }
    assert_eq!(stored(&app), 50);
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);
}

#[actix_web::test]
async fn a_cert_url_outside_the_allowlist_is_401_and_never_fetched() {
    let key = TestKey::new();
    let (base, allowed) = cert_server(&key.cert_pem, Duration::ZERO);
    // Another host:port serving the very certificate that signed: still not to be asked.
    let (elsewhere, outside) = cert_server(&key.cert_pem, Duration::ZERO);
    let app = spawn(&base).await;
    let host_port = base.trim_start_matches("http://");
    for cert_url in [
        format!("{elsewhere}/certs/CERT-1"),
        format!("{base}/other/CERT-1"),
        format!("{base}/certs/../other/CERT-1"),
        format!("{base}/certs/%2e%2e/other/CERT-1"),
        format!("http://paypal@{host_port}/certs/CERT-1"),
        format!("https://{host_port}/certs/CERT-1"),
        format!("{base}/certs/CERT-1#x"),
    ] {
        let (_, body) = event("PAYMENT.CAPTURE.COMPLETED");
        let answer = app
            .send(&signed(&app, &key, &cert_url, &body, unix_now()))
            .await;
        assert_eq!(answer.status, 401, "{cert_url}: {}", answer.text());
        assert_eq!(answer.code().as_deref(), Some("invalid_signature"));
    }
    assert_eq!(allowed.requests.load(Ordering::SeqCst), 0);
    assert_eq!(outside.requests.load(Ordering::SeqCst), 0);
    assert_eq!(stored(&app), 0);
}

#[actix_web::test]
async fn a_failing_certificate_server_gives_503_and_stores_nothing_then_recovers_without_restart() {
    let key = TestKey::new();
    let (base, server) = cert_server(&key.cert_pem, Duration::ZERO);
    server.failing.store(true, Ordering::SeqCst);
    let app = spawn(&base).await;
    let cert_url = format!("{base}/certs/CERT-flaky");
    let (id, body) = event("PAYMENT.CAPTURE.COMPLETED");

    let answer = app
        .send(&signed(&app, &key, &cert_url, &body, unix_now()))
        .await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("unavailable"));
    assert!(
        answer.message().contains("certificate") && !answer.message().contains("database"),
        "the sentence names what failed: {}",
        answer.text()
    );
    assert!(answer.header("retry-after").is_some());
    assert_eq!(stored(&app), 0);

    // A certificate host that is down (nothing listens) is the same.
    let (_, nothing) = event("PAYMENT.CAPTURE.COMPLETED");
    let closed = child_port();
    let down_app = spawn(&format!("http://127.0.0.1:{closed}")).await;
    let down_url = format!("http://127.0.0.1:{closed}/certs/CERT-down");
    let answer = down_app
        .send(&signed(&down_app, &key, &down_url, &nothing, unix_now()))
        .await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(stored(&down_app), 0);

    // PayPal retries once the certificate host is back: a fresh fetch, no restart.
    server.failing.store(false, Ordering::SeqCst);
    let retry = app
        .send(&signed(&app, &key, &cert_url, &body, unix_now()))
        .await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.json()["event_id"], id.as_str());
    assert_eq!(stored(&app), 1);
    assert_eq!(server.requests.load(Ordering::SeqCst), 2);
}

#[actix_web::test]
async fn send_and_replay_sign_as_paypal_with_key_and_cert_url_and_name_a_missing_flag() {
    let key = TestKey::new();
    let (base, server) = cert_server(&key.cert_pem, Duration::ZERO);
    let app = spawn(&base).await;
    let config = TempFile::new(&config_text(&app.db.url, &source(&base)));
    let key_file = TempFile::new(&key.key_pem);
    let (id, body) = event("PAYMENT.CAPTURE.COMPLETED");
    let body_file = TempFile::new(&body);
    let cert_url = format!("{base}/certs/CERT-send");
    let (config_path, key_path, body_path) = (config.path(), key_file.path(), body_file.path());
    let send = |extra: &[&str]| {
        let mut args = vec![
            "send",
            "--to",
            app.address.as_str(),
            "--source",
            "paypal",
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
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);

    // Exported from this server and replayed into a second one, re-signed with the same key.
    let second = spawn(&base).await;
    export_and_replay_signed(&config_path, "paypal", &second, &key_path, &cert_url).await;
    assert_eq!(stored(&second), 1);
    let event = second
        .get(&format!("/admin/events/paypal/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(event.status, 200, "{}", event.text());
    assert_eq!(event.json()["event_type"], "PAYMENT.CAPTURE.COMPLETED");
    assert_eq!(event.json()["payload"], body.as_str(), "{}", event.text());

    let args = send(&["--cert-url", cert_url.as_str()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&refs).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--key"), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");

    // A certificate URL the source's cert_urls do not admit: the receiver with this config
    // would refuse it 401 without fetching it, saying only invalid_signature.
    let elsewhere = "http://127.0.0.1:9/certs/CERT-elsewhere";
    let args = send(&["--key", key_path.as_str(), "--cert-url", elsewhere]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run_hookbox_async(&refs).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(elsewhere)
            && stderr.contains("cert_urls")
            && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    assert_eq!(stored(&app), 1, "nothing more was stored");
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);
}

#[actix_web::test]
async fn a_certificate_that_cannot_be_fetched_is_named_in_the_503_line_and_its_warning() {
    let key = TestKey::new();
    // Nothing listens there.
    let base = format!("http://127.0.0.1:{}", child_port());
    let db = TestDb::create();
    let text = config_text(&db.url, &source(&base));
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let cert_url = format!("{base}/certs/CERT-unreachable");
    let (_, body) = event("PAYMENT.CAPTURE.COMPLETED");

    let answer = send(
        &process.address,
        &signed_for(&config, &key, &cert_url, &body, unix_now()),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.code().as_deref(), Some("unavailable"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (warning, failure) = loop {
        let log = process.log();
        let line = |wanted: &str| log.lines().find(|l| l.contains(wanted)).map(str::to_owned);
        if let (Some(warning), Some(failure)) = (
            line("certificate fetch failed"),
            line("delivery failed; nothing was stored"),
        ) {
            break (warning, failure);
        }
        assert!(std::time::Instant::now() < deadline, "{log}");
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    };
    // The warning has the URL and what went wrong; the delivery's line points at it.
    assert!(
        warning.contains("WARN") && warning.contains(&cert_url),
        "{warning}"
    );
    assert!(warning.contains("request failed"), "{warning}");
    assert!(
        failure.contains("status=503") && failure.contains("could not be fetched"),
        "{failure}"
    );
}

/// A refusal for the certificate itself (expired, or its URL under none of `cert_urls`) is the
/// contract's 401 `invalid_signature`, and its log line says which: it said nothing, though the
/// signature matched, and an operator whose certificate had expired saw every delivery refused
/// with no hint why (a black-box run).
#[actix_web::test]
async fn a_certificate_refused_as_untrusted_is_401_and_its_log_line_says_why() {
    let day = 24 * 3600;
    let expired = TestKey::valid(unix_now() - 2 * day, unix_now() - day);
    let (base, _server) = cert_server(&expired.cert_pem, Duration::ZERO);
    let db = TestDb::create();
    let text = config_text(&db.url, &source(&base));
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let refused = |cert_url: String| {
        let (_, body) = event("PAYMENT.CAPTURE.COMPLETED");
        let delivery = signed_for(&config, &expired, &cert_url, &body, unix_now());
        let address = process.address.clone();
        async move { send(&address, &delivery).await }
    };
    for (cert_url, why) in [
        (
            format!("{base}/certs/CERT-expired"),
            "outside its validity period",
        ),
        (
            format!("{base}/other/CERT-expired"),
            "PAYPAL-CERT-URL is under none of the source's cert_urls",
        ),
    ] {
        let answer = refused(cert_url).await;
        assert_eq!(answer.status, 401, "{}", answer.text());
        assert_eq!(answer.code().as_deref(), Some("invalid_signature"));
        process.wait_for_log(why);
        let log = process.log();
        let line = log.lines().find(|l| l.contains(why)).expect("found above");
        assert!(
            line.contains("delivery refused") && line.contains("not one to trust"),
            "{line}"
        );
    }
}
