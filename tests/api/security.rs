//! Security properties: no secret in the logs at any level, in an answer, in `/metrics` or in
//! `Debug` output; and a captured request cannot be replayed once its timestamp is stale.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hookbox::Handlers;

use crate::downstream::{always, Downstream};
use crate::helpers::*;
use crate::provider::eventually;

const DB_PASSWORD: &str = "pw-never-logged-7731";

/// A Standard Webhooks secret for the forward target.
fn forward_secret() -> String {
    format!("whsec_{}", BASE64.encode("forward-key-never-logged-0042"))
}

/// `url` with a password, unless it has one already (the test server trusts local users, so
/// the password is never checked, but hookbox still holds it).
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    match rest.split_once('@') {
        Some((user, host)) if !user.contains(':') => {
            format!("{scheme}://{user}:{DB_PASSWORD}@{host}")
        }
        _ => url.to_owned(),
    }
}

/// Everything a log line, an answer or a metric must never contain: every signing secret
/// (and a Standard Webhooks key's base64 and hex), the forward secret, the admin token, the
/// database password.
fn secrets(config: &hookbox::Config) -> Vec<String> {
    let mut all: Vec<String> = config
        .sources
        .iter()
        .flat_map(|s| s.secrets.iter().map(|secret| secret.expose().to_owned()))
        .collect();
    let forward = forward_secret();
    all.push(forward.clone());
    for standard in all.clone().iter().filter_map(|s| s.strip_prefix("whsec_")) {
        all.push(standard.to_owned());
        if let Ok(key) = BASE64.decode(standard) {
            all.push(hex::encode(key));
        }
    }
    all.push(ADMIN_TOKEN.to_owned());
    all.push(DB_PASSWORD.to_owned());
    all
}

/// The MAC in a signature header value: its longest run of hex or base64 characters.
fn mac_of(value: &str) -> String {
    value
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '/'))
        .max_by_key(|run| run.len())
        .unwrap_or("")
        .to_owned()
}

#[actix_web::test]
async fn no_secret_reaches_the_logs_at_trace_level_an_answer_or_the_metrics() {
    let db = TestDb::create();
    let downstream = Downstream::start(always(200));
    let forward = format!(
        "[sources.stripe.forward]\nurl = \"{}\"\nsecret = \"{}\"\n",
        downstream.url,
        forward_secret()
    );
    let text = config_text(&with_password(&db.url), &forward);
    let mut server = Process::serve_with_env(&text, &[("RUST_LOG", "trace")]);
    let config = parse_config(&text);
    let mut seen: Vec<String> = Vec::new();
    let mut record = |answer: &Answer| {
        seen.push(format!(
            "{} {:?} {}",
            answer.status,
            answer.headers,
            answer.text()
        ));
    };
    // Computed signatures must not be echoed either: the MAC hookbox computes for a tampered
    // body is what a forger would want to see.
    let mut computed: Vec<String> = Vec::new();

    for source in SOURCES {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        let genuine = delivery_for(&config, source, &body, &id, unix_now());
        let header = signature_header(source);
        record(&send(&server.address, &genuine).await);
        record(&send(&server.address, &genuine).await);
        let tampered_body = body.replacen('"', "'", 1);
        let mut tampered = genuine.clone();
        tampered.body = tampered_body.clone().into_bytes();
        let expected = delivery_for(&config, source, &tampered_body, &id, unix_now());
        computed.push(mac_of(expected.header(header)));
        record(&send(&server.address, &tampered).await);
        let forged = genuine
            .clone()
            .with_header(header, "v1=0000,sha256=0000,v0=0000");
        record(&send(&server.address, &forged).await);
        let stale = delivery_for(&config, source, &body, &id, unix_now() - 3600);
        record(&send(&server.address, &stale).await);
    }
    for token in [Some(ADMIN_TOKEN), Some("wrong"), None] {
        record(&get(&server.address, "/admin/events?limit=5", token).await);
    }
    // The console's login takes the token in a form; its pages show stored events.
    for token in [ADMIN_TOKEN, "wrong-token"] {
        let response = client()
            .post(format!("{}/console/login", server.address))
            .insert_header(("Content-Type", "application/x-www-form-urlencoded"))
            .send_body(format!("token={token}"))
            .await
            .expect("the server answers");
        let login = read(response).await;
        record(&login);
        // The right token must sign in, so the console's pages are always part of this check;
        // the wrong one must not.
        let cookie = login.header("Set-Cookie");
        assert_eq!(
            cookie.is_some(),
            token == ADMIN_TOKEN,
            "only the right token signs in: {:?}",
            login.status
        );
        if let Some(cookie) = cookie {
            let session = cookie.split(';').next().unwrap_or("").to_owned();
            let page = client()
                .get(format!("{}/console/events", server.address))
                .insert_header(("Cookie", session))
                .send()
                .await
                .expect("the server answers");
            let page = read(page).await;
            assert_eq!(page.status, 200, "the console shows its events");
            record(&page);
        }
    }
    let stripe_id = unique_id("evt");
    record(
        &send(
            &server.address,
            &delivery_for(
                &config,
                "stripe",
                &stripe_event(&stripe_id, "a", 1),
                &stripe_id,
                unix_now(),
            ),
        )
        .await,
    );
    record(
        &get(
            &server.address,
            &format!("/admin/events/stripe/{stripe_id}"),
            Some(ADMIN_TOKEN),
        )
        .await,
    );
    // The forward dispatcher has signed and sent with its secret.
    eventually("the event is forwarded", Duration::from_secs(10), || {
        !downstream.received().is_empty()
    })
    .await;
    record(&get(&server.address, "/readyz", None).await);
    let metrics = get(&server.address, "/metrics", None).await;
    record(&metrics);

    // Stop it, so every line it wrote is in.
    let pid = server.child.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("send SIGTERM");
    server.wait_exit(Duration::from_secs(30));
    eventually("the last log line is read", Duration::from_secs(5), || {
        server.log().contains("hookbox stopped")
    })
    .await;
    let log = server.log();
    assert!(
        log.contains("DEBUG") && log.contains("TRACE"),
        "the debug and trace levels were on:\n{log}"
    );
    let answers = seen.join("\n");
    for secret in secrets(&config).iter().chain(&computed) {
        assert!(!secret.is_empty());
        assert!(
            !log.contains(secret.as_str()),
            "{secret} is in the log:\n{log}"
        );
        assert!(
            !answers.contains(secret.as_str()),
            "{secret} is in an answer:\n{answers}"
        );
    }
}

#[actix_web::test]
async fn debug_output_of_the_config_shows_no_secret() {
    let text = config_text(
        &with_password("postgres://postgres@127.0.0.1:5432/hookbox"),
        &format!(
            "[sources.stripe.forward]\nurl = \"http://127.0.0.1:9/x\"\nsecret = \"{}\"\n",
            forward_secret()
        ),
    );
    let config = parse_config(&text);
    let shown = format!("{config:?} {config:#?} {:?}", config.database.display_url());
    for secret in secrets(&config) {
        assert!(!shown.contains(&secret), "{secret} is in:\n{shown}");
    }
    assert!(shown.contains("redacted"), "secrets are shown as redacted");
}

#[actix_web::test]
async fn a_captured_request_replayed_after_its_tolerance_is_refused_though_the_event_is_stored() {
    let db = TestDb::create();
    let text = config_text(&db.url, "")
        .replace(
            "scheme = \"stripe\"\n",
            "scheme = \"stripe\"\ntolerance = \"1s\"\n",
        )
        .replace(
            "scheme = \"standard\"\n",
            "scheme = \"standard\"\ntolerance = \"1s\"\n",
        )
        .replace(
            "scheme = \"slack\"\n",
            "scheme = \"slack\"\ntolerance = \"1s\"\n",
        );
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    let mut captured = Vec::new();
    let mut last_signed = 0;
    for source in ["stripe", "standard", "slack"] {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        // Signed just before it is sent, so that a slow moment of the machine between two
        // sources cannot make a first delivery stale already.
        last_signed = unix_now();
        let delivery = delivery_for(&app.config, source, &body, &id, last_signed);
        let first = app.send(&delivery).await;
        assert_eq!(first.status, 200, "{source}: {}", first.text());
        captured.push((source, id, body, delivery, first));
    }
    // The same bytes again, past the tolerance: refused, whatever is stored under the id.
    eventually("the tolerance has passed", Duration::from_secs(5), || {
        unix_now() > last_signed + 1
    })
    .await;
    for (source, id, body, delivery, first) in &captured {
        let replayed = app.send(delivery).await;
        assert_eq!(
            (replayed.status, replayed.error().as_str()),
            (401, "stale_timestamp"),
            "{source}: a stale capture gets no stored answer"
        );
        assert_ne!(replayed.body, first.body);
        // The provider's own retry, signed afresh, gets the stored answer.
        let retry = app
            .send(&delivery_for(&app.config, source, body, id, unix_now()))
            .await;
        assert!(retry.replayed(), "{source}: {}", retry.text());
        assert_eq!(retry.body, first.body);
    }
}
