//! `/healthz`, `/readyz`, `/metrics`, and the startup log of a real process.

use crate::helpers::*;

#[actix_web::test]
async fn healthz_and_readyz_answer_200_when_all_is_well() {
    let app = TestApp::spawn().await;
    assert_eq!(app.get("/healthz", None).await.status, 200);
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
}

#[actix_web::test]
async fn metrics_count_each_outcome_per_source_and_time_requests() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let delivery = app.delivery("stripe", &stripe_event(&id, "a", 1), &id);
    app.send(&delivery).await;
    app.send(&delivery).await;
    app.send(
        &delivery
            .clone()
            .with_header("Stripe-Signature", "t=1,v1=00"),
    )
    .await;
    let mut unknown = delivery.clone();
    unknown.source = "nope".to_owned();
    app.send(&unknown).await;

    let metrics = app.get("/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/plain")));
    let text = metrics.text();
    for line in [
        "hookbox_webhooks_total{source=\"stripe\",outcome=\"processed\"} 1",
        "hookbox_webhooks_total{source=\"stripe\",outcome=\"replayed\"} 1",
        "hookbox_webhooks_total{source=\"stripe\",outcome=\"rejected\"} 1",
        "hookbox_webhooks_total{source=\"stripe\",outcome=\"failed\"} 0",
        "hookbox_webhooks_total{source=\"_unknown\",outcome=\"rejected\"} 1",
        "hookbox_webhook_duration_seconds_count{source=\"stripe\"} 3",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    let build = format!("hookbox_build_info{{version=\"{}\"}} 1", hookbox::VERSION);
    assert!(text.contains(&build), "missing {build} in\n{text}");
    assert!(!text.contains("whsec_"), "no secret in /metrics");
}

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=9", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    let (code, stdout, _) = run_hookbox(&["--version"], &[]);
    assert_eq!(code, 0);
    assert_eq!(stdout.trim(), format!("hookbox {}", hookbox::VERSION));
    // Built in a checkout: two builds of one package version are told apart by their commit.
    if let Some(head) = head {
        assert_eq!(
            hookbox::VERSION,
            format!("{}+{head}", env!("CARGO_PKG_VERSION")),
            "built from HEAD"
        );
    }
}

#[actix_web::test]
async fn a_started_server_says_where_it_listens_and_which_sources_are_live() {
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, ""));
    let log = process.log();
    assert!(log.contains("listening on http://127.0.0.1:"), "{log}");
    // Which build it is, for a rolling deploy of old and new side by side.
    assert!(
        log.contains(&format!("version=\"{}\"", hookbox::VERSION)),
        "{log}"
    );
    for source in SOURCES {
        assert!(
            log.contains(&format!("POST /webhooks/{source}")),
            "{source} in {log}"
        );
    }
    assert!(log.contains("admin API on"), "{log}");
    assert!(
        log.contains("default_window=3days"),
        "the purge's window is named as the default: {log}"
    );
    for secret in [
        "whsec_test_secret",
        "It's a Secret to Everybody",
        "acme-secret",
        ADMIN_TOKEN,
    ] {
        assert!(!log.contains(secret), "a secret in the startup log");
    }
    let health = get(&process.address, "/healthz", None).await;
    assert_eq!(health.status, 200);
}

#[actix_web::test]
async fn sigterm_lets_an_in_flight_delivery_finish_then_exits_cleanly() {
    use std::io::{Read, Write};
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let mut process = Process::serve(&text);
    let id = unique_id("evt");
    let delivery = delivery_for(
        &parse_config(&text),
        "stripe",
        &stripe_event(&id, "a", 1),
        &id,
        unix_now(),
    );

    // A delivery whose body is still arriving when the signal comes.
    let authority = process.address.trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&authority).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .expect("set a read timeout");
    let mut head = format!("POST /webhooks/stripe HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\nConnection: close\r\n", delivery.body.len());
    for (name, value) in &delivery.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let (first_half, second_half) = delivery.body.split_at(delivery.body.len() / 2);
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(first_half).expect("write half the body");
    // The kernel has the connection; actix's accept thread must have taken it too before the
    // signal closes the listener, and nothing outside the server shows when it has.
    std::thread::sleep(std::time::Duration::from_millis(200));

    process.terminate();
    process.wait_for_log("shutting down");
    // Held by a body still arriving, the stop says so rather than going quiet.
    process.wait_for_log("still letting requests in flight finish");
    stream
        .write_all(second_half)
        .expect("write the rest of the body");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the answer");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    let exit = process.wait_exit(std::time::Duration::from_secs(20));
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
    assert_eq!(
        db.count("events"),
        1,
        "the in-flight delivery was committed"
    );
}

#[actix_web::test]
async fn a_sighup_is_logged_and_ignored_and_the_server_goes_on() {
    // By default SIGHUP (a closed terminal, an operator expecting a reload) ends a process at
    // once, with no graceful stop.
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let mut process = Process::serve(&text);
    process.signal("HUP");
    process.wait_for_log("SIGHUP ignored");
    let health = get(&process.address, "/healthz", None).await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert!(
        !process.log().contains("shutting down"),
        "{}",
        process.log()
    );
    process.terminate();
    let exit = process.wait_exit(std::time::Duration::from_secs(20));
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
}

#[actix_web::test]
async fn after_a_clean_stop_the_sqlite_file_alone_holds_every_event() {
    if !store_is_sqlite() {
        eprintln!("after_a_clean_stop_the_sqlite_file_alone_holds_every_event: SQLite only");
        return;
    }
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let mut process = Process::serve(&text);
    let ids: Vec<String> = (0..3).map(|_| unique_id("evt")).collect();
    for id in &ids {
        let delivery = delivery_for(
            &parse_config(&text),
            "stripe",
            &stripe_event(id, "a", 1),
            id,
            unix_now(),
        );
        let answer = send(&process.address, &delivery).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    process.terminate();
    let exit = process.wait_exit(std::time::Duration::from_secs(20));
    assert!(exit.success(), "exit status after SIGTERM: {exit:?}");
    // The log's reader may not have read the last lines yet when the exit is seen.
    process.wait_for_log("write-ahead log checkpointed");

    // The backup a user makes of hookbox.db alone, without its -wal and -shm files.
    let file = db.url.trim_start_matches("sqlite://").to_owned();
    let wal = std::fs::metadata(format!("{file}-wal")).map_or(0, |m| m.len());
    assert_eq!(wal, 0, "the write-ahead log was emptied into the file");
    let dir = TempDir::new();
    let copy = dir.0.join("backup.db");
    std::fs::copy(&file, &copy).expect("copy the database file alone");
    let in_copy = count_at(
        &format!("sqlite://{}", copy.display()),
        "events WHERE source = 'stripe'",
    );
    assert_eq!(in_copy, 3, "every event is in the file copied on its own");
}

#[test]
fn malformed_request_heads_are_a_rate_limited_warning_never_an_error() {
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, ""));
    let garbage: [&[u8]; 3] = [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon in this header\r\n\r\n",
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nContent-Length: 3\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n",
    ];
    for request in garbage {
        let answer = crate::raw::exchange(
            &process.address,
            request,
            std::time::Duration::from_secs(10),
        );
        if let Ok(answer) = answer {
            assert_eq!(answer.status, 400, "{request:?}");
        }
    }
    // The report comes from a thread of its own: wait for it (or for an ERROR line).
    let warning = "a client sent a request that could not be read";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !process.log().contains(warning) && !process.log().contains("ERROR") {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning about the malformed requests:\n{}",
            process.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The server still answers, and every malformed request has been handled by now.
    let ready = crate::raw::exchange(
        &process.address,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        std::time::Duration::from_secs(10),
    )
    .expect("healthz answers");
    assert_eq!(ready.status, 200);
    let log = process.log();
    assert!(
        !log.lines().any(|l| l.contains("ERROR")),
        "a client's mistake logged as an error:\n{log}"
    );
    let warnings = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(warning))
        .count();
    assert_eq!(warnings, 1, "one warning a minute at most:\n{log}");
}

/// Sends `method` to `path` with the admin token if given, and reads the answer.
async fn call(app: &TestApp, method: &str, path: &str, token: Option<&str>) -> Answer {
    let method = awc::http::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut request = client().request(method, format!("{}{path}", app.address));
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    read(request.send().await.expect("the server answers")).await
}

#[actix_web::test]
async fn head_checks_health_and_a_method_a_path_does_not_take_is_405_naming_the_ones_it_does() {
    let app = TestApp::spawn().await;
    // HEAD, as a load balancer's health check may send it: the GET's status, no body.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let answer = call(&app, "HEAD", path, None).await;
        assert_eq!(answer.status, 200, "HEAD {path}");
        assert!(answer.body.is_empty(), "HEAD {path}: {}", answer.text());
    }

    for (method, path, token, status, error, allow) in [
        (
            "GET",
            "/webhooks/stripe",
            None,
            405,
            "method_not_allowed",
            Some("POST"),
        ),
        (
            "PUT",
            "/webhooks/stripe",
            None,
            405,
            "method_not_allowed",
            Some("POST"),
        ),
        (
            "GET",
            "/webhooks/nosuchsource",
            None,
            404,
            "unknown_source",
            None,
        ),
        (
            "POST",
            "/healthz",
            None,
            405,
            "method_not_allowed",
            Some("GET, HEAD"),
        ),
        (
            "DELETE",
            "/metrics",
            None,
            405,
            "method_not_allowed",
            Some("GET, HEAD"),
        ),
        ("POST", "/nowhere", None, 404, "not_found", None),
        // Admin routes look at the token first, as their own methods do.
        (
            "GET",
            "/admin/deliveries/requeue",
            None,
            401,
            "unauthorized",
            None,
        ),
        (
            "GET",
            "/admin/deliveries/requeue",
            Some(ADMIN_TOKEN),
            405,
            "method_not_allowed",
            Some("POST"),
        ),
        (
            "DELETE",
            "/admin/events",
            Some(ADMIN_TOKEN),
            405,
            "method_not_allowed",
            Some("GET, HEAD"),
        ),
    ] {
        let answer = call(&app, method, path, token).await;
        let case = format!("{method} {path}: {}", answer.text());
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (status, error),
            "{case}"
        );
        assert_eq!(answer.header("allow"), allow, "{case}");
        if status == 405 {
            assert!(answer.message().contains(allow.unwrap()), "{case}");
        }
    }

    // None of them is a delivery.
    let metrics = app.get("/metrics", None).await.text();
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("hookbox_webhooks_total{") && !line.ends_with(" 0"))
        .collect();
    assert!(counted.is_empty(), "no delivery counted: {counted:?}");
}

#[actix_web::test]
async fn migrate_and_serve_say_so_when_a_newer_hookbox_migrated_the_database() {
    use diesel::RunQueryDsl;
    let db = TestDb::create();
    let config = TempFile::new(&format!("[database]\nurl = \"{}\"\n", db.url));
    let (code, stdout, stderr) = run_hookbox(&["migrate", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("applied"), "{stdout}");
    assert!(!stderr.contains("does not know"), "{stderr}");

    // A migration from a later version, as a newer hookbox records it.
    diesel::sql_query("INSERT INTO __diesel_schema_migrations (version) VALUES ('29991231000000')")
        .execute(&mut db.connect())
        .expect("a later migration recorded");

    let (code, stdout, stderr) = run_hookbox(&["migrate", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("29991231000000") && stderr.contains("newer hookbox"),
        "names the version and what it means: {stderr}"
    );
    assert!(!stdout.contains("up to date"), "{stdout}");

    // `serve` still starts (instances of the older version keep serving through a rolling
    // deploy), and warns.
    let process = Process::serve(&config_text(&db.url, ""));
    let log = process.log();
    assert!(
        log.contains("WARN") && log.contains("29991231000000") && log.contains("newer hookbox"),
        "{log}"
    );
    assert!(!log.contains("up to date"), "{log}");
    assert_eq!(get(&process.address, "/healthz", None).await.status, 200);
}

/// A serve stopped right after it starts (its pool, purge pass and workers still starting)
/// exits 0, cleanly: ending the process with exit handlers that ran while the runtime's
/// threads were at work panicked after `hookbox stopped` in about 2 % of such stops (found by a
/// black-box run), and now and then died of SIGSEGV.
#[test]
fn a_short_request_timeout_still_gives_the_headers_a_second() {
    use std::io::{Read, Write};
    // Below about half a second, actix's coarse timer for the headers cut off requests that
    // came in time with a bare 408 (a black-box run: 30 of 40 at 150 ms).
    let db = TestDb::create();
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"150ms\"");
    let process = Process::serve(&text);
    let address = process.address.trim_start_matches("http://").to_owned();
    // A new connection each time, spread over two seconds: the coarse clock is met at every
    // staleness.
    for round in 0..40 {
        let mut stream = std::net::TcpStream::connect(&address).expect("connect");
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: hookbox\r\nConnection: close\r\n\r\n")
            .expect("send the request");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "round {round}: {answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The names of the dispatchers' lock files beside the SQLite store `db`
/// (`<file>-hookbox-<id>.lock`).
fn lock_files_of(db: &TestDb) -> Vec<String> {
    let file = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
    let dir = file.parent().expect("a directory");
    let prefix = format!(
        "{}-hookbox-",
        file.file_name().expect("a name").to_string_lossy()
    );
    std::fs::read_dir(dir)
        .expect("the directory")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix) && name.ends_with(".lock"))
        .collect()
}

#[test]
fn a_forwarding_serve_on_sqlite_leaves_no_lock_file_once_stopped() {
    if !store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    let locks = || lock_files_of(&db);
    let config = config_text(
        &db.url,
        &crate::forward::forward_extra("http://127.0.0.1:9/hooks", "1s", 3),
    );
    // Each stop, of several starts, takes its own lock file with it.
    // A stop right after the registration comes while its look is still under way (it
    // left the file behind, seen under load).
    for round in 0..12 {
        let mut process = Process::serve(&config);
        process.wait_for_log("forward dispatcher registered");
        assert_eq!(locks().len(), 1, "round {round}: its lock, while it runs");
        process.terminate();
        assert!(process
            .wait_exit(std::time::Duration::from_secs(20))
            .success());
        assert_eq!(
            locks(),
            Vec::<String>::new(),
            "round {round}: {}",
            process.log()
        );
    }
}

#[test]
fn a_lock_file_removed_under_a_running_serve_is_made_again() {
    // A clean-up job that deleted a stray-looking `*.lock` file left the instance with a lock
    // no one could see: another instance took it for dead at every look, for good, and sent
    // its deliveries under way again while it still sent them (a black-box run).
    if !store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    let config = config_text(
        &db.url,
        &crate::forward::forward_extra("http://127.0.0.1:9/hooks", "1s", 3),
    );
    let process = Process::serve(&config);
    process.wait_for_log("forward dispatcher registered");
    let locks = lock_files_of(&db);
    assert_eq!(locks.len(), 1, "its lock: {locks:?}");
    let store = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
    let path = store.parent().expect("a directory").join(&locks[0]);
    std::fs::remove_file(&path).expect("remove the lock file");
    // Looked at every 2 s.
    process.wait_for_log("lock file was removed or replaced");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "made again:\n{}",
            process.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(lock_files_of(&db), locks, "the same instance's, no other");
}

#[actix_web::test]
async fn a_serve_stopped_right_after_it_starts_exits_cleanly_every_time() {
    let db = TestDb::create();
    let config = config_text(&db.url, "");
    for round in 0..150 {
        let mut process = Process::serve(&config);
        let ready = get(&process.address, "/readyz", None).await;
        assert_eq!(ready.status, 200, "{}", ready.text());
        process.terminate();
        let status = process.wait_exit(std::time::Duration::from_secs(30));
        let log = process.log();
        assert!(
            status.success() && !log.contains("panicked"),
            "round {round}: {status:?}\n{log}"
        );
    }
}
