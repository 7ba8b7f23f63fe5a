//! The log of the real binary: each failure is one line, written where it is answered, and
//! every line of a request carries the request id its answer shows in `X-Request-Id`.

use std::time::{Duration, Instant};

use diesel::prelude::*;

use crate::helpers::*;

/// The request id an answer carries, checked to be a UUID.
fn request_id(answer: &Answer) -> String {
    let id = answer
        .header("X-Request-Id")
        .unwrap_or_else(|| panic!("no X-Request-Id in {:?}", answer.headers))
        .to_owned();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(id.matches('-').count(), 4, "a UUID: {id}");
    id
}

/// The log's lines that carry `request_id` (once some line does: stderr is read on a thread).
fn lines_of(process: &Process, request_id: &str) -> Vec<String> {
    let field = format!("request_id={request_id}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = process.log();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains(&field))
            .map(str::to_owned)
            .collect();
        if !lines.is_empty() {
            return lines;
        }
        assert!(Instant::now() < deadline, "no line carries {field}:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a delivery to a source that does not exist and waits for its line: every line of the
/// requests answered before it is then in the log (they are written before their answers).
async fn barrier(process: &Process) {
    let delivery = Delivery {
        source: "barrier".to_owned(),
        headers: Vec::new(),
        body: b"{}".to_vec(),
    };
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 404);
    lines_of(process, &request_id(&answer));
}

/// Asserts that the delivery `answer` answered has exactly one line, the failure's, and that every line
/// containing `naming` (its event) carries the answer's request id.
fn assert_one_line(process: &Process, answer: &Answer, naming: &str, wanted: &[&str]) {
    let id = request_id(answer);
    let lines = lines_of(process, &id);
    let log = process.log();
    assert_eq!(lines.len(), 1, "one line for the failure:\n{log}");
    for part in wanted {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
    let of_the_event: Vec<&str> = log.lines().filter(|l| l.contains(naming)).collect();
    assert!(!of_the_event.is_empty(), "a line has {naming}:\n{log}");
    for line in of_the_event {
        assert!(
            line.contains(&format!("request_id={id}")),
            "a line of the delivery without its request id {id}: {line}"
        );
    }
}

#[actix_web::test]
async fn a_refused_delivery_is_one_line_carrying_the_request_id_of_its_answer() {
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let config = parse_config(&text);
    let process = Process::serve(&text);

    let id = unique_id("evt_refused");
    let delivery = delivery_for(&config, "acme", r#"{"type":"t"}"#, &id, unix_now())
        .with_header("X-Acme-Signature", "sha256=00");
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    barrier(&process).await;
    // The id is not read before the signature is checked: the line names the source.
    assert_one_line(
        &process,
        &answer,
        "webhook{source=acme",
        &[
            "INFO",
            "delivery refused",
            "status=401",
            "invalid_signature",
        ],
    );
}

#[actix_web::test]
async fn a_delivery_the_database_fails_is_one_line_carrying_the_request_id_of_its_answer() {
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let id = unique_id("evt_refused_by_db");
    // The claim's INSERT of this one event fails in the database (the tables exist once the
    // server has started: it migrates first).
    let mut conn = db.connect();
    match &mut conn {
        hookbox::AnyConnection::Postgres(c) => {
            diesel::sql_query(
                "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN \
                 RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql",
            )
            .execute(c)
            .expect("create the function");
            diesel::sql_query(format!(
                "CREATE TRIGGER refuse BEFORE INSERT ON events FOR EACH ROW \
                 WHEN (NEW.event_id = '{id}') EXECUTE FUNCTION refuse()"
            ))
            .execute(c)
            .expect("create the trigger");
        }
        hookbox::AnyConnection::Sqlite(c) => {
            diesel::sql_query(format!(
                "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.event_id = '{id}' \
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            ))
            .execute(c)
            .expect("create the trigger");
        }
    }
    drop(conn);

    let delivery = delivery_for(&config, "acme", r#"{"type":"t"}"#, &id, unix_now());
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert_eq!(answer.error(), "unavailable");
    barrier(&process).await;
    assert_one_line(
        &process,
        &answer,
        &id,
        &[
            "WARN",
            "delivery failed",
            "status=503",
            "error=\"unavailable\"",
            "refused by the test",
            "source=acme",
        ],
    );

    // Another event of the same source is stored: the failure was this event's alone.
    let other = unique_id("evt_stored");
    let answer = send(
        &process.address,
        &delivery_for(&config, "acme", r#"{"type":"t"}"#, &other, unix_now()),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    request_id(&answer);
}

#[actix_web::test]
async fn a_stale_delivery_is_logged_with_what_this_hosts_clock_read() {
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let id = unique_id("evt_stale");
    let body = stripe_event(&id, "a", 1);
    let delivery = delivery_for(&config, "stripe", &body, &id, unix_now() - 3600);
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(answer.error(), "stale_timestamp");
    barrier(&process).await;
    let year = chrono::Utc::now().format("%Y-").to_string();
    let read = format!("host's clock, which read {year}");
    assert_one_line(
        &process,
        &answer,
        "webhook{source=stripe",
        &["INFO", "delivery refused", "stale_timestamp", &read],
    );
}

#[actix_web::test]
async fn a_connection_lost_mid_body_is_counted_incomplete_and_not_as_a_refusal() {
    use std::io::Write;
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let id = unique_id("evt_cut");
    let delivery = delivery_for(&config, "acme", r#"{"type":"t"}"#, &id, unix_now());
    // The head announces the whole body; a third of it is sent, then the client closes its
    // side (as a client that gives up does, or a proxy that cuts the connection).
    let length = ("Content-Length".to_owned(), delivery.body.len().to_string());
    let headers: Vec<(&str, &[u8])> = delivery
        .headers
        .iter()
        .chain([&length])
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    let whole = crate::raw::request("POST", "/webhooks/acme", &headers, &delivery.body);
    let mut stream = crate::raw::connect(&process.address, Duration::from_secs(10));
    let cut = whole.len() - delivery.body.len() * 2 / 3;
    stream.write_all(&whole[..cut]).expect("send part");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("close our side");
    // Whatever comes back (an answer the client may never read), the line says what happened.
    let _ = crate::raw::read_answer(&mut stream);
    barrier(&process).await;
    let log = process.log();
    let line = log
        .lines()
        .find(|l| l.contains("delivery incomplete"))
        .unwrap_or_else(|| panic!("a line says the delivery was incomplete:\n{log}"));
    assert!(
        line.contains("INFO") && line.contains("source=acme"),
        "{line}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("delivery refused") && l.contains("source=acme")),
        "no refusal is logged:\n{log}"
    );

    let metrics = get(&process.address, "/metrics", None).await.text();
    for wanted in [
        "hookbox_webhooks_total{source=\"acme\",outcome=\"incomplete\"} 1",
        "hookbox_webhooks_total{source=\"acme\",outcome=\"rejected\"} 0",
    ] {
        assert!(metrics.contains(wanted), "{wanted} in\n{metrics}");
    }
    // Nothing of it is stored: the whole delivery, sent again, is its first.
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["status"], "processed", "{}", answer.text());
}

#[actix_web::test]
async fn every_answer_carries_a_request_id_of_its_own() {
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, ""));
    let mut seen = std::collections::HashSet::new();
    for path in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/admin/events",
        "/no/such/path",
    ] {
        let answer = get(&process.address, path, None).await;
        assert!(seen.insert(request_id(&answer)), "{path}: a fresh id");
    }
    let answer = client()
        .get(format!("{}/healthz", process.address))
        .insert_header(("X-Request-Id", "chosen-by-the-client"))
        .send()
        .await
        .expect("the server answers");
    let answer = read(answer).await;
    assert_ne!(
        answer.header("X-Request-Id"),
        Some("chosen-by-the-client"),
        "an incoming id is not taken"
    );
    assert!(seen.insert(request_id(&answer)));
    // The startup lines still say where it listens and which sources are live.
    let log = process.log();
    assert!(
        log.contains("hookbox listening on http://127.0.0.1:"),
        "{log}"
    );
    for source in SOURCES {
        assert!(
            log.contains(&format!("source live at POST /webhooks/{source}")),
            "{source} in {log}"
        );
    }
    if store_is_sqlite() {
        // The file in full, whatever the working directory.
        assert!(
            log.lines()
                .any(|l| l.contains("database ready: SQLite file /")),
            "{log}"
        );
    } else {
        // pool_size = 4: one claim writer, whatever the cores.
        assert!(
            log.lines()
                .any(|l| l.contains("database ready: PostgreSQL") && l.contains("claim_writers=1")),
            "{log}"
        );
    }
}

#[actix_web::test]
async fn the_startup_log_says_when_the_environment_overrides_the_config_file() {
    // An SRE reading the log must see that the file's database and listen address are not the
    // ones in use: the file names a database nothing listens for.
    let db = TestDb::create();
    let unused = "postgres://postgres@127.0.0.1:9/named_by_the_file";
    let config = config_text(unused, "");
    let process = Process::serve_with_env(
        &config,
        &[("DATABASE_URL", &db.url), ("HOOKBOX_LISTEN", "127.0.0.1:0")],
    );
    let answer = get(&process.address, "/readyz", None).await;
    assert_eq!(
        answer.status,
        200,
        "DATABASE_URL's store is used: {}",
        answer.text()
    );
    let log = process.log();
    assert!(
        log.lines().any(|l| l.contains("database ready")
            && l.contains("DATABASE_URL, which overrides the config file's [database].url")),
        "{log}"
    );
    assert!(
        log.contains("the listen address is HOOKBOX_LISTEN's"),
        "{log}"
    );
    assert!(!log.contains("named_by_the_file"), "{log}");

    // Without them, the line names the file's key; the first line names the file.
    let process = Process::serve(&config_text(&db.url, ""));
    let log = process.log();
    assert!(
        log.lines().any(|l| l.contains("hookbox starting")
            && l.contains("config=")
            && !l.contains("config=none")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("database ready") && l.contains("[database].url")),
        "{log}"
    );
    assert!(!log.contains("HOOKBOX_LISTEN"), "{log}");
}

#[actix_web::test]
async fn a_path_a_client_chose_cannot_forge_a_log_line_or_flood_the_log() {
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, ""));
    let forged = "x%0a2026-12-05T00:00:00.000000Z%20ERROR%20FORGED%1b%5b31m";
    let long = "y".repeat(20_000);
    let mut ids = Vec::new();
    for name in [forged, long.as_str()] {
        let answer = client()
            .post(format!("{}/webhooks/{name}", process.address))
            .send_body("{}")
            .await
            .expect("the server answers");
        let answer = read(answer).await;
        assert_eq!(answer.status, 404, "{}", answer.text());
        ids.push(request_id(&answer));
    }
    barrier(&process).await;
    let log = process.log();
    assert!(
        !log.contains('\u{1b}'),
        "a terminal escape reached the log:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-12-05T00:00:00.000000Z")),
        "a forged line:\n{log}"
    );
    let refused = lines_of(&process, &ids[0]);
    assert_eq!(refused.len(), 1, "{log}");
    assert!(
        refused[0].contains(r"source=x\n2026-12-05T00:00:00.000000Z ERROR FORGED\u{1b}[31m"),
        "the name is shown, escaped: {}",
        refused[0]
    );
    let long_line = lines_of(&process, &ids[1]);
    assert_eq!(long_line.len(), 1, "{log}");
    assert!(long_line[0].len() < 2_000, "{} bytes", long_line[0].len());
}

#[test]
fn a_rust_log_that_cannot_be_read_is_said_and_the_default_level_used() {
    let db = TestDb::create();
    let process = Process::serve_with_env(&config_text(&db.url, ""), &[("RUST_LOG", "hookbox=[")]);
    let log = process.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("RUST_LOG=\"hookbox=[\" cannot be read")
            && l.contains("default level, info")),
        "{log}"
    );
    assert!(
        log.contains("INFO") && log.contains("source live at POST"),
        "{log}"
    );
    // Set but empty, as an env file writes it: not set, rather than every line off.
    let process = Process::serve_with_env(&config_text(&db.url, ""), &[("RUST_LOG", "")]);
    let log = process.log();
    assert!(
        log.contains("INFO") && log.contains("source live at POST"),
        "{log}"
    );
    assert!(!log.contains("cannot be read"), "{log}");
}

#[test]
fn the_source_live_line_says_how_a_source_tells_replays_and_what_it_checks_against() {
    let db = TestDb::create();
    // RFC 8032's first test key, as Discord's Developer Portal shows a public key (hex).
    let discord = "\n[sources.discord]\nscheme = \"discord\"\npublic_keys = [\"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a\"]\n";
    let text = config_text(&db.url, discord).replace(
        "[sources.stripe]\nscheme = \"stripe\"\n",
        "[sources.stripe]\nscheme = \"stripe\"\ndedupe = \"body\"\n",
    );
    let process = Process::serve(&text);
    let log = process.log();
    let live = |source: &str| {
        log.lines()
            .find(|l| l.contains(&format!("source live at POST /webhooks/{source} ")))
            .unwrap_or_else(|| panic!("no line for {source}:\n{log}"))
            .to_owned()
    };
    assert!(live("stripe").contains("dedupe=\"body\""), "{log}");
    assert!(live("standard").contains("dedupe=\"id\""), "{log}");
    // Each says what its signatures are checked against: secrets, or public keys.
    assert!(live("stripe").contains("secrets=2 "), "{log}");
    assert!(!live("stripe").contains("public_keys"), "{log}");
    let discord = live("discord");
    assert!(discord.contains("secrets=0 public_keys=1 "), "{discord}");
}

#[actix_web::test]
async fn a_host_clock_far_from_the_databases_is_warned_about_and_followed() {
    if skip_on_sqlite(
        "a_host_clock_far_from_the_databases_is_warned_about_and_followed",
        "an SQLite file has no clock of its own",
    ) {
        return;
    }
    // libfaketime puts this process's wall clock 30 s behind (the monotonic clock left alone).
    let faketime = libfaketime();
    let thirty_seconds_behind = [
        ("LD_PRELOAD", faketime),
        ("FAKETIME", "-30s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_NO_CACHE", "1"),
    ];
    let db = TestDb::create();
    let forward = "\n[sources.stripe.forward]\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";
    let config = config_text(&db.url, forward);
    let behind = Process::serve_with_env(&config, &thirty_seconds_behind);
    behind.wait_for_log("this host's clock is");
    behind.wait_for_log("forward dispatcher registered");
    let log = behind.log();
    // Once, though the start and the dispatcher's first look both measure it.
    assert_eq!(log.matches("this host's clock is").count(), 1, "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("this host's clock is"))
        .expect("the warning");
    assert!(
        line.contains("WARN") && line.contains("behind the database's") && line.contains("NTP"),
        "{line}"
    );
    // And its times are on the database's clock: a Retry-After of 3 s is waited out, where
    // a due time on this host's clock (30 s behind) would have been due at once.
    let downstream = crate::downstream::Downstream::start(|_, earlier| match earlier {
        0 => (503, Duration::ZERO),
        _ => (200, Duration::ZERO),
    });
    downstream.retry_after("3");
    let forward = format!(
        "\n[sources.stripe.forward]\nurl = \"{}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        downstream.url
    );
    let db = TestDb::create();
    let config = config_text(&db.url, &forward);
    let behind = Process::serve_with_env(&config, &thirty_seconds_behind);
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.refunded", 1);
    let delivery = delivery_for(&parse_config(&config), "stripe", &body, &id, unix_now());
    let answer = try_send(&behind.address, &delivery, Duration::from_secs(10))
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let key = format!("stripe:{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while downstream.for_key(&key).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "never retried");
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let attempts = downstream.for_key(&key);
    let waited = attempts[1].at - attempts[0].at;
    assert!(
        waited >= Duration::from_millis(2900),
        "retried after {waited:?}, before its Retry-After of 3 s"
    );
    // Its attempts are signed at the database's time, which the downstream's tolerance takes
    // (on this host's, every one was 30 s old).
    let signed_at: i64 = attempts[1]
        .header("webhook-timestamp")
        .parse()
        .expect("a timestamp");
    assert!(
        (signed_at - unix_now()).abs() <= 5,
        "signed at {signed_at}, now {}",
        unix_now()
    );
    // And "a duration ago" is counted back from the database's time, as stored times are.
    insert_events(
        &db.url,
        &[RawEvent {
            source: "stripe".to_owned(),
            event_id: "evt_twenty_seconds_old".to_owned(),
            received_at: chrono::Utc::now() - chrono::Duration::seconds(20),
            payload: b"{}".to_vec(),
        }],
    );
    let recent = get(
        &behind.address,
        "/admin/events?source=stripe&since=10s",
        Some(ADMIN_TOKEN),
    )
    .await
    .text();
    assert!(
        recent.contains(&id) && !recent.contains("evt_twenty_seconds_old"),
        "{recent}"
    );

    // A host whose clock agrees says nothing of it.
    let in_step = Process::serve(&config);
    in_step.wait_for_log("forward dispatcher registered");
    assert!(
        !in_step.log().contains("this host's clock"),
        "{}",
        in_step.log()
    );
}

/// A host clock that steps a day ahead for a moment, long enough for a look to measure it,
/// then back: the events received after it are on the database's time. The difference
/// measured during the step, added to the host's clock once it was back, dated them a day
/// early until the next look (a black-box run); it is carried on by the monotonic clock.
#[actix_web::test]
async fn a_moments_step_of_the_host_clock_dates_no_later_event_wrong() {
    if skip_on_sqlite(
        "a_moments_step_of_the_host_clock_dates_no_later_event_wrong",
        "an SQLite file has no clock of its own",
    ) {
        return;
    }
    let faketime = libfaketime();
    let clock = TempFile::new("+0");
    let clock_path = clock.path();
    let jumping = [
        ("LD_PRELOAD", faketime),
        ("FAKETIME_TIMESTAMP_FILE", clock_path.as_str()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let db = TestDb::create();
    // Forwarding, so that its clock is measured every 2 s.
    let forward = "\n[sources.stripe.forward]\nurl = \"http://127.0.0.1:9/hook\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";
    let config = config_text(&db.url, forward);
    let server = Process::serve_with_env(&config, &jumping);
    server.wait_for_log("forward dispatcher registered");
    std::fs::write(&clock_path, "+1d").expect("step the clock");
    server.wait_for_log("86400.0 s ahead of the database's");
    std::fs::write(&clock_path, "+0").expect("step it back");
    let id = unique_id("gh_after_the_step");
    let signed = delivery_for(
        &parse_config(&config),
        "github",
        "{}",
        "placeholder",
        unix_now(),
    )
    .with_header("X-GitHub-Delivery", &id);
    let answer = send(&server.address, &signed).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let received = answer.json()["received_at"]
        .as_str()
        .expect("a received time")
        .to_owned();
    let at = chrono::DateTime::parse_from_rfc3339(&received).expect("RFC 3339");
    let off = (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .num_seconds()
        .abs();
    assert!(
        off <= 5,
        "received at {received}, {off} s from now:\n{}",
        server.log()
    );
}

/// A downstream that answers 200, and a server on a fresh database whose `stripe` source
/// forwards to it: the downstream, the database, the config's text and the server.
fn forwarding_to_a_sink() -> (crate::downstream::Downstream, TestDb, String, Process) {
    let downstream = crate::downstream::Downstream::start(crate::downstream::always(200));
    let forward = format!(
        "\n[sources.stripe.forward]\nurl = \"{}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        downstream.url
    );
    let db = TestDb::create();
    let config = config_text(&db.url, &forward);
    let process = Process::serve(&config);
    (downstream, db, config, process)
}

#[actix_web::test]
async fn an_instance_taken_for_dead_while_alive_is_told_and_goes_on() {
    // Another instance takes this one for dead (found its lock free long enough: a lock
    // connection lost) by deleting its row and taking back its rows. Done here by hand, as
    // that look would: the instance, alive, finds its row gone at its next look.
    let (downstream, db, config, process) = forwarding_to_a_sink();
    process.wait_for_log("forward dispatcher registered");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while db.count("instances") == 0 {
        assert!(std::time::Instant::now() < deadline, "never listed");
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !process.log().contains("took this one for dead"),
        "{}",
        process.log()
    );
    diesel::sql_query("DELETE FROM instances")
        .execute(&mut db.connect())
        .expect("the row goes");
    process.wait_for_log("took this one for dead");
    let log = process.log();
    let line = log
        .lines()
        .find(|l| l.contains("took this one for dead"))
        .expect("the warning");
    assert!(line.contains("WARN") && line.contains("same key"), "{line}");
    // Listed again, once, and forwarding goes on.
    assert_eq!(db.count("instances"), 1);
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.refunded", 1);
    let delivery = delivery_for(&parse_config(&config), "stripe", &body, &id, unix_now());
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let key = format!("stripe:{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while downstream.for_key(&key).is_empty() {
        assert!(std::time::Instant::now() < deadline, "never forwarded");
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let log = process.log();
    assert_eq!(
        log.matches("took this one for dead").count(),
        1,
        "told once:\n{log}"
    );
}

#[actix_web::test]
async fn an_event_id_is_logged_with_its_bidi_override_escaped() {
    // An id is the client's choice (where it travels unsigned, anyone holding one delivery may
    // resend it under another): a bidi override in it reversed the rest of the log line as a
    // terminal shows it (bb61). Logged as the console shows it, and the forward span too.
    let (_downstream, _db, config, process) = forwarding_to_a_sink();
    let id = format!("{}_\u{202e}lanigiro", unique_id("evt"));
    let body = stripe_event(&id, "charge.refunded", 1);
    let delivery = delivery_for(&parse_config(&config), "stripe", &body, &id, unix_now());
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // The same id with another body: refused, and logged with the request's span.
    let other = stripe_event(&id, "charge.succeeded", 1);
    let reused = delivery_for(&parse_config(&config), "stripe", &other, &id, unix_now());
    let answer = send(&process.address, &reused).await;
    assert_eq!(answer.status, 422, "{}", answer.text());
    process.wait_for_log("forwarded");
    process.wait_for_log("event_id_reused");
    let log = process.log();
    assert!(!log.contains('\u{202e}'), "{log}");
    let escaped = id.replace('\u{202e}', "\\u{202e}");
    for line in ["event_id_reused", "forwarded"] {
        assert!(
            log.lines()
                .any(|l| l.contains(line) && l.contains(&format!("event.id={escaped}"))),
            "{line}: {log}"
        );
    }
}

#[actix_web::test]
async fn a_nats_server_that_is_down_is_told_by_hookbox_not_by_the_clients_info_lines() {
    // The NATS client's own INFO line came every few seconds while the server was down, naming
    // no target (bb61); each attempt's WARN says it, with the target.
    let db = TestDb::create();
    let target = "\n[[sources.stripe.forward]]\nname = \"bus\"\nurl = \"nats://127.0.0.1:1\"\n\
                  subject = \"x.{source}\"\ntimeout = \"1s\"\n";
    let config = config_text(&db.url, target);
    // RUST_LOG empty: the default filter.
    let process = Process::serve_with_env(&config, &[("RUST_LOG", "")]);
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.refunded", 1);
    let delivery = delivery_for(&parse_config(&config), "stripe", &body, &id, unix_now());
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    process.wait_for_log("forward attempt failed");
    let log = process.log();
    assert!(
        log.lines()
            .any(|l| l.contains("forward attempt failed") && l.contains("target=bus")),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(" INFO ") && l.contains("client error")),
        "{log}"
    );
}

#[actix_web::test]
async fn adyen_basic_credentials_that_do_not_match_are_told_apart_from_the_signature_in_the_log() {
    use base64::Engine;
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        "[sources.adyen]\nscheme = \"adyen\"\n\
         secrets = [\"44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056\"]\n\
         basic_auth = \"adyen:s3cret\"\n",
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let source = source_named(&config, "adyen");
    let provider = source
        .scheme
        .build(&source.secrets, source.tolerance)
        .expect("a valid key");
    let body = serde_json::json!({"live": "false", "notificationItems": [{"NotificationRequestItem": {
        "pspReference": "8816178914079738", "eventCode": "AUTHORISATION",
        "merchantAccountCode": "HookboxTestECOM", "merchantReference": "order-1",
        "amount": {"value": 1000, "currency": "EUR"}, "success": "true",
    }}]});
    let signed = provider.sign_delivery(
        &serde_json::to_vec(&body).expect("JSON"),
        unix_now(),
        "",
        None,
    );
    let delivery = |credentials: &str| {
        let basic = base64::engine::general_purpose::STANDARD.encode(credentials);
        Delivery {
            source: "adyen".to_owned(),
            headers: signed.headers.clone(),
            body: signed.body.clone(),
        }
        .with_header("Content-Type", "application/json")
        .with_header("Authorization", &format!("Basic {basic}"))
    };

    // The items are signed with the key; the credentials are another's.
    let wrong = send(&process.address, &delivery("adyen:other")).await;
    assert_eq!(wrong.status, 401, "{}", wrong.text());
    assert_eq!(wrong.error(), "invalid_signature");
    // A forged item with the right credentials: the same answer, word for word.
    let mut forged = delivery("adyen:s3cret");
    forged.body = String::from_utf8(forged.body)
        .expect("UTF-8")
        .replace("1000", "9000")
        .into_bytes();
    let forged = send(&process.address, &forged).await;
    assert_eq!(forged.status, 401, "{}", forged.text());
    assert_eq!(
        forged.text(),
        wrong.text(),
        "the answer tells nothing apart"
    );
    barrier(&process).await;
    assert_one_line(
        &process,
        &wrong,
        "the signature matched, but the HTTP Basic credentials",
        &[
            "webhook{source=adyen",
            "delivery refused",
            "invalid_signature",
        ],
    );
    let forged_line = lines_of(&process, &request_id(&forged));
    assert!(
        !forged_line[0].contains("credentials"),
        "{}",
        forged_line[0]
    );

    let right = send(&process.address, &delivery("adyen:s3cret")).await;
    assert_eq!(right.status, 200, "{}", right.text());
}
