//! `hookbox send`: one body signed as the provider would, posted to a real server; the output
//! tells a first delivery from a replay.

use crate::helpers::*;
use hookbox::Handlers;

async fn send_body(app: &TestApp, args: &[&str], body: &TempFile) -> (i32, String, String) {
    let path = body.path();
    let mut all = vec!["send", "--to", &app.address];
    all.extend_from_slice(args);
    all.push(&path);
    run_hookbox_async(&all).await
}

#[actix_web::test]
async fn sending_the_same_body_twice_is_processed_then_a_replay() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let id = unique_id("evt");
    let body =
        TempFile::with_extension(stripe_event(&id, "charge.succeeded", 1).as_bytes(), "json");
    let args = ["--source", "stripe", "--config", &config.path()];

    let (first_code, first, stderr) = send_body(&app, &args, &body).await;
    assert_eq!(first_code, 0, "{first}{stderr}");
    let (second_code, second, stderr) = send_body(&app, &args, &body).await;
    assert_eq!(second_code, 0, "{second}{stderr}");

    assert!(first.contains(&format!("(event {id})")), "{first}");
    assert!(first.contains("200 OK: processed"), "{first}");
    assert!(second.contains("200 OK: replayed"), "{second}");
    // Both print the answer's body: the stored response, the same both times.
    let answer = |out: &str| out.lines().nth(2).unwrap_or_default().to_owned();
    assert!(
        answer(&first).contains("\"status\":\"processed\""),
        "{first}"
    );
    assert_eq!(answer(&first), answer(&second));
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn send_and_replay_need_only_the_secret_of_the_source_they_sign_for() {
    // A laptop with the Stripe secret, and not every other source's: what it signs for works,
    // and the source whose variable is unset says which variable when asked to sign.
    let app = TestApp::spawn().await;
    let unset = "HOOKBOX_TEST_LEDGER_SECRET_NOT_HERE";
    let config = TempFile::new(&format!(
        "{}\n[sources.ledger]\nscheme = \"github\"\nsecrets_env = \"{unset}\"\n",
        config_text(&app.db.url, "")
    ));
    let id = unique_id("evt");
    let body =
        TempFile::with_extension(stripe_event(&id, "charge.succeeded", 1).as_bytes(), "json");

    let replay_body = |source: &'static str| {
        let (address, config, body) = (app.address.clone(), config.path(), body.path());
        async move {
            run_hookbox_async(&[
                "replay", "--to", &address, "--config", &config, "--source", source, &body,
            ])
            .await
        }
    };
    let args = ["--source", "stripe", "--config", &config.path()];
    let (code, out, stderr) = send_body(&app, &args, &body).await;
    assert_eq!(code, 0, "{out}{stderr}");
    assert!(out.contains("200 OK: processed"), "{out}");

    let (code, out, stderr) = replay_body("stripe").await;
    assert_eq!(code, 0, "{out}{stderr}");
    let replayed = format!("{out}{stderr}")
        .lines()
        .any(|line| line.split_whitespace().collect::<Vec<_>>() == ["replayed", "1"]);
    assert!(replayed, "{out}{stderr}");

    let args = ["--source", "ledger", "--config", &config.path()];
    let (code, out, stderr) = send_body(&app, &args, &body).await;
    assert_eq!(code, 2, "{out}{stderr}");
    assert!(
        stderr.contains(&format!(
            "sources.ledger.secrets_env: the environment variable {unset} is not set"
        )),
        "{stderr}"
    );
    let (code, out, stderr) = replay_body("ledger").await;
    assert_eq!(code, 2, "the environment must change first: {out}{stderr}");
    assert!(
        stderr.contains(unset) && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    assert_eq!(app.db.count("events"), 1);
}

#[actix_web::test]
async fn a_header_id_scheme_takes_event_id_or_a_fresh_one_and_a_wrong_secret_exits_1() {
    let app = TestApp::spawn().await;
    let body = TempFile::with_extension(sample_body("github", "").as_bytes(), "json");
    // The test config's github secret, given on the command line instead of a config.
    let keys = [
        "--source",
        "github",
        "--scheme",
        "github",
        "--secret",
        "It's a Secret to Everybody",
    ];
    // An id HTTP cannot carry is the command line's to change: nothing is sent.
    let injected: Vec<&str> = keys
        .iter()
        .copied()
        .chain(["--event-id", "a\r\nX-Injected: 1"])
        .collect();
    let (code, out, stderr) = send_body(&app, &injected, &body).await;
    assert_eq!(code, 2, "{out}{stderr}");
    assert!(
        stderr.contains("--event-id") && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    assert_eq!(app.db.count("events"), 0);
    // An empty id (`--event-id "$(uuidgen)"` without uuidgen) is the command line's too.
    let empty: Vec<&str> = keys.iter().copied().chain(["--event-id", ""]).collect();
    let (code, out, stderr) = send_body(&app, &empty, &body).await;
    assert_eq!(code, 2, "{out}{stderr}");
    assert!(stderr.contains("--event-id is empty"), "{stderr}");
    assert_eq!(app.db.count("events"), 0);

    let with_id: Vec<&str> = keys
        .iter()
        .copied()
        .chain(["--event-id", "dlv-42", "--event-type", "push"])
        .collect();

    let (code, first, said) = send_body(&app, &with_id, &body).await;
    assert_eq!(code, 0, "{first}");
    assert!(!said.contains("event type"), "{said}");
    let (_, again, _) = send_body(&app, &with_id, &body).await;
    assert!(
        first.contains("processed") && again.contains("replayed"),
        "{first}{again}"
    );
    let stored = app
        .get("/admin/events/github/dlv-42", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(stored["event_type"], "push");

    // Without --event-id, each send is a new event. Without --event-type, GitHub's type
    // header is not sent, and send says what that means for the stored event.
    for _ in 0..2 {
        let (code, out, stderr) = send_body(&app, &keys, &body).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("processed"), "{out}");
        assert!(
            stderr.contains("takes the event type from a header")
                && stderr.contains("stored with no type"),
            "{stderr}"
        );
    }
    assert_eq!(app.db.count("events"), 3);

    let wrong = [
        "--source", "github", "--scheme", "github", "--secret", "not it",
    ];
    let (code, out, stderr) = send_body(&app, &wrong, &body).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("401 Unauthorized: rejected (invalid_signature)"),
        "{out}"
    );
    assert!(
        stderr.contains("the receiver checks with another secret than send signed with"),
        "{stderr}"
    );

    // hmac-sha256 needs its header and id location from a config source.
    let generic = [
        "--source",
        "acme",
        "--scheme",
        "hmac-sha256",
        "--secret",
        "x",
    ];
    let (code, _, stderr) = send_body(&app, &generic, &body).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("config"), "{stderr}");
}

/// What `send` and `replay` sign GitHub deliveries with here.
const GITHUB_KEYS: [&str; 4] = [
    "--scheme",
    "github",
    "--secret",
    "It's a Secret to Everybody",
];

/// `hookbox send` of GitHub's sample body to `to`.
async fn send_github_to(to: &str) -> (i32, String, String) {
    let body = TempFile::with_extension(sample_body("github", "").as_bytes(), "json");
    let path = body.path();
    let mut send = vec!["send", "--to", to, "--source", "github"];
    send.extend_from_slice(&GITHUB_KEYS);
    send.push(&path);
    run_hookbox_async(&send).await
}

#[actix_web::test]
async fn a_to_url_with_a_query_but_no_path_posts_to_the_webhook_path_with_the_query() {
    let app = TestApp::spawn().await;
    let to = format!("{}?q=1", app.address);
    let (code, out, stderr) = send_github_to(&to).await;
    assert_eq!(code, 0, "{out}{stderr}");
    let posted = format!("POST {}/webhooks/github?q=1 ", app.address);
    assert!(out.starts_with(&posted), "{out}");

    let capture = TempFile::with_extension(
        br#"{"source":"github","event_id":"d-q","event_type":"push","headers":{},"body":"{}"}"#,
        "ndjson",
    );
    let path = capture.path();
    let mut replay = vec!["replay", &path, "--to", &to];
    replay.extend_from_slice(&GITHUB_KEYS);
    let (code, out, stderr) = run_hookbox_async(&replay).await;
    assert_eq!(code, 0, "{out}{stderr}");
    assert_eq!(app.db.count("events"), 2);
}

#[actix_web::test]
async fn a_credential_in_the_to_urls_query_is_sent_and_never_printed() {
    let app = TestApp::spawn().await;
    let to = format!("{}?token=URLTOKENuu1&q=1", app.address);
    let (code, out, stderr) = send_github_to(&to).await;
    assert_eq!(code, 0, "{out}{stderr}");
    let posted = format!("POST {}/webhooks/github?token=***&q=1 ", app.address);
    assert!(out.starts_with(&posted), "{out}");
    assert!(
        !format!("{out}{stderr}").contains("URLTOKEN"),
        "{out}{stderr}"
    );

    // Nothing listens on port 1: the failure names where, the report too, without the token.
    let capture = TempFile::with_extension(
        br#"{"source":"github","event_id":"d-t","event_type":"push","headers":{},"body":"{}"}"#,
        "ndjson",
    );
    let report = TempFile::with_extension(b"", "json");
    let (path, report_path) = (capture.path(), report.path());
    let unreachable = "http://127.0.0.1:1/x?api_key=URLTOKENuu1";
    let mut replay = vec![
        "replay",
        &path,
        "--to",
        unreachable,
        "--report",
        &report_path,
    ];
    replay.extend_from_slice(&GITHUB_KEYS);
    let (code, out, stderr) = run_hookbox_async(&replay).await;
    assert_eq!(code, 1, "{out}{stderr}");
    let written = std::fs::read_to_string(&report_path).expect("the report");
    assert!(written.contains("api_key=***"), "{written}");
    for text in [&out, &stderr, &written] {
        assert!(!text.contains("URLTOKEN"), "{text}");
    }
}

#[actix_web::test]
async fn an_id_or_type_flag_a_scheme_reads_from_the_body_is_a_usage_error_and_nothing_is_sent() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let id = unique_id("evt");
    let body =
        TempFile::with_extension(stripe_event(&id, "charge.succeeded", 1).as_bytes(), "json");
    for (flag, value, says) in [
        ("--event-id", "evt_other", "--event-id does not apply"),
        (
            "--event-type",
            "invoice.paid",
            "--event-type does not apply",
        ),
    ] {
        let args = [
            "--source",
            "stripe",
            "--config",
            &config.path(),
            flag,
            value,
        ];
        let (code, stdout, stderr) = send_body(&app, &args, &body).await;
        assert_eq!(code, 2, "{flag}: {stdout}{stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("stripe"),
            "{flag}: {stderr}"
        );
    }
    assert_eq!(app.db.count("events"), 0, "nothing was sent");

    // The type the body names is no contradiction.
    let args = [
        "--source",
        "stripe",
        "--config",
        &config.path(),
        "--event-type",
        "charge.succeeded",
    ];
    let (code, stdout, stderr) = send_body(&app, &args, &body).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(app.db.count("events"), 1);
}

/// `--secret` for a scheme that signs with a private key is a usage error that names `--key`
/// (and for SNS `--cert-url`), not the receiving source's `public_keys`. (PayPal's says to use
/// a config: its webhook_id is a config's.)
#[test]
fn a_secret_given_for_a_scheme_that_signs_with_a_key_names_the_key_flag() {
    let body = TempFile::with_extension(b"[]", "json");
    let body = body.path();
    for (scheme, names) in [
        ("sendgrid", &["--key FILE"][..]),
        ("discord", &["--key FILE"][..]),
        ("sns", &["--key FILE", "--cert-url URL"][..]),
    ] {
        let (code, _, stderr) = run_hookbox(
            &[
                "send",
                "--to",
                "http://127.0.0.1:9",
                "--source",
                "s",
                "--scheme",
                scheme,
                "--secret",
                "x",
                &body,
            ],
            &[],
        );
        assert_eq!(code, 2, "{scheme}: {stderr}");
        for name in names {
            assert!(stderr.contains(name), "{scheme} names {name}: {stderr}");
        }
        assert!(!stderr.contains("public_keys ="), "{scheme}: {stderr}");
    }
}

#[test]
fn a_source_no_config_names_is_told_apart_from_no_config_at_all() {
    let body = TempFile::with_extension(b"{}", "json");
    let body = body.path();
    // No --config, no HOOKBOX_CONFIG, no ./hookbox.toml: the tool says no sources were read.
    let empty = TempDir::new();
    let (code, _, stderr) = run_hookbox_in(
        &[
            "send",
            "--to",
            "http://127.0.0.1:9",
            "--source",
            "stripe",
            &body,
        ],
        &[],
        Some(&empty.0),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("no sources at all") && stderr.contains("./hookbox.toml"),
        "{stderr}"
    );
    // A config with other sources: they are named.
    let config = TempFile::new("[sources.github]\nscheme = \"github\"\nsecrets = [\"s\"]\n");
    let (code, _, stderr) = run_hookbox(
        &[
            "send",
            "--to",
            "http://127.0.0.1:9",
            "--config",
            &config.path(),
            "--source",
            "stripe",
            &body,
        ],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("(it has github)"), "{stderr}");
}

#[actix_web::test]
async fn a_handshake_sent_is_said_to_be_one_not_processed() {
    // Slack's URL check: answered with its challenge and never stored. "200 OK: processed",
    // with an event id, told a newcomer it was stored.
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let body = TempFile::with_extension(
        br#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV","type":"url_verification"}"#,
        "json",
    );
    let (code, out, stderr) = send_body(
        &app,
        &["--source", "slack", "--config", &config.path()],
        &body,
    )
    .await;
    assert_eq!(code, 0, "{out}{stderr}");
    assert!(out.contains("(a handshake)"), "{out}");
    assert!(
        out.contains("200 OK: answered as a handshake") && out.contains("never stored"),
        "{out}"
    );
    assert!(
        out.contains("3eZbrw1aBm2rZgRNFdxV"),
        "the answer is shown: {out}"
    );
    assert_eq!(app.db.count("events"), 0);

    // Twitch's verification: sent as one (its message type header says so), not as a
    // notification that carries a challenge (400).
    let source = "[sources.twitch]\nscheme = \"twitch\"\nsecrets = [\"s3cre7s3cre7\"]\n";
    let app = TestApp::spawn_with(source, Handlers::default()).await;
    let twitch = TempFile::new(&config_text(&app.db.url, source));
    let body = TempFile::with_extension(
        br#"{"challenge":"pogchamp-kappa","subscription":{"type":"stream.online","version":"1"}}"#,
        "json",
    );
    let (code, out, stderr) = send_body(
        &app,
        &["--source", "twitch", "--config", &twitch.path()],
        &body,
    )
    .await;
    assert_eq!(code, 0, "{out}{stderr}");
    assert!(out.contains("200 OK: answered as a handshake"), "{out}");
    assert!(out.contains("pogchamp-kappa"), "{out}");
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_redirect_says_where_it_points_and_a_derived_id_is_not_told_to_be_changed() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    // `send` against a URL that answers 302 printed `302 Found: rejected` and a blank line
    // (the body is empty); replay names the Location (a black-box run).
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(|| async {
            HttpResponse::Found()
                .insert_header(("Location", "https://hooks.example/webhooks/github"))
                .finish()
        }))
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let to = format!("http://127.0.0.1:{}", server.addrs()[0].port());
    actix_web::rt::spawn(server.run());
    let (code, out, stderr) = send_github_to(&to).await;
    assert_eq!(code, 1, "{out}{stderr}");
    assert!(
        out.contains("redirected to https://hooks.example/webhooks/github (not followed"),
        "{out}"
    );
    // Failed, as replay counts a redirect, not "rejected" as a 4xx is.
    assert!(
        out.contains("302 Found: failed") && !out.contains("rejected"),
        "{out}"
    );

    // Lemon Squeezy sends no id: hookbox derives one from the body, which has none to change.
    let body = TempFile::with_extension(br#"{"meta":{"event_name":"order_created"}}"#, "json");
    let path = body.path();
    let (code, out, stderr) = run_hookbox_async(&[
        "send",
        "--to",
        &to,
        "--source",
        "ls",
        "--scheme",
        "lemonsqueezy",
        "--secret",
        "s3cret",
        "--event-id",
        "ord_1",
        &path,
    ])
    .await;
    assert_eq!(code, 2, "{out}{stderr}");
    assert!(
        stderr.contains("derives the event id from the body")
            && !stderr.contains("change the id in the body"),
        "{stderr}"
    );
}
