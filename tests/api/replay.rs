//! `hookbox replay`: captures re-sent to a real server (re-signed, or as they were), bad lines
//! reported by line number, and the pace and bound of what is in flight, measured by a
//! receiver that counts.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use hookbox::Handlers;
use serde_json::{json, Value};

use crate::helpers::*;

/// A capture line written by hand, the way the contract spells one.
fn capture_line(
    source: &str,
    event_id: &str,
    event_type: Option<&str>,
    headers: &[(String, String)],
    body: &str,
) -> String {
    let headers: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(name, value)| (name.to_lowercase(), value.as_str().into()))
        .collect();
    json!({
        "source": source,
        "event_id": event_id,
        "event_type": event_type,
        "received_at": "2026-12-02T09:00:00Z",
        "headers": headers,
        "body": body,
    })
    .to_string()
}

fn capture(lines: &[String]) -> TempFile {
    TempFile::with_extension((lines.join("\n") + "\n").as_bytes(), "ndjson")
}

/// What a replay run came to.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    report: Value,
}

/// Runs `hookbox replay ARGS --report FILE` and reads the report.
async fn replay(args: &[&str]) -> Run {
    let report = TempFile::with_extension(b"", "json");
    let report_path = report.path();
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--report", &report_path]);
    let (code, stdout, stderr) = run_hookbox_async(&all).await;
    let text = report.read();
    let report = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the report is not JSON ({e}): {text}\nstderr: {stderr}"));
    Run {
        code,
        stdout,
        stderr,
        report,
    }
}

fn counts(sent: u64, processed: u64, replayed: u64, rejected: u64, failed: u64) -> Value {
    json!({"sent": sent, "processed": processed, "replayed": replayed,
           "rejected": rejected, "failed": failed})
}

/// The report's failure rows, by line.
fn failures(run: &Run) -> Vec<Value> {
    let mut rows = run.report["failures"]
        .as_array()
        .expect("failures is a list")
        .clone();
    rows.sort_by_key(|row| row["line"].as_u64());
    rows
}

#[actix_web::test]
async fn an_export_replayed_into_its_own_store_is_all_replays_and_into_an_empty_one_all_processed()
{
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let mut sent = Vec::new();
    for source in SOURCES {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        let answer = app.send(&app.delivery(source, &body, &id)).await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
        sent.push((source, id, body));
    }
    let exported = export_all(&config.path()).await;

    // Into the same store: every scheme re-signed and recognised as the event it was.
    let same = replay(&[
        &exported.path(),
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(same.code, 0, "{}\n{}", same.stdout, same.stderr);
    assert_eq!(
        same.report["counts"],
        counts(7, 0, 7, 0, 0),
        "{}",
        same.stdout
    );
    assert_eq!(same.report["failures"], json!([]));
    assert!(same.report["latency_ms"]["p99"].is_number());
    assert!(same.stdout.contains("replayed"), "{}", same.stdout);
    assert_eq!(app.db.count("events"), 7);

    // Into a second server on an empty database: every delivery processed there...
    let other = TestApp::spawn().await;
    let fresh = replay(&[
        &exported.path(),
        "--to",
        &other.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(fresh.code, 0, "{}\n{}", fresh.stdout, fresh.stderr);
    assert_eq!(
        fresh.report["counts"],
        counts(7, 7, 0, 0, 0),
        "{}",
        fresh.stdout
    );
    assert_eq!(other.db.count("events"), 7);
    // ... under the captured ids, with the same payloads: a provider's next retry of any of
    // them is a replay there, not a new event and not a 422.
    for (source, id, body) in &sent {
        let answer = other.send(&other.delivery(source, body, id)).await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
        assert!(answer.replayed(), "{source}: the replayed event is stored");
    }
}

#[actix_web::test]
async fn as_is_replays_of_stale_signatures_are_rejected_and_re_signed_ones_are_processed() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    // Signed an hour ago: past the 5 minute tolerance of every scheme that signs a timestamp.
    let an_hour_ago = unix_now() - 3600;
    let lines: Vec<String> = [
        ("stripe", "payment_intent.succeeded"),
        ("standard", "invoice.paid"),
        ("slack", "message"),
    ]
    .iter()
    .map(|(source, event_type)| {
        let id = unique_id(source);
        let body = sample_body(source, &id);
        let signed = delivery_for(&app.config, source, &body, &id, an_hour_ago);
        capture_line(source, &id, Some(event_type), &signed.headers, &body)
    })
    .collect();
    let old = capture(&lines);

    let as_is = replay(&[&old.path(), "--to", &app.address, "--as-is"]).await;
    assert_eq!(as_is.code, 1, "{}\n{}", as_is.stdout, as_is.stderr);
    assert_eq!(as_is.report["counts"], counts(3, 0, 0, 3, 0));
    assert_eq!(
        as_is.report["rejected_by_code"],
        json!({"stale_timestamp": 3})
    );
    let rows = failures(&as_is);
    for (row, line) in rows.iter().zip(1..) {
        assert_eq!(row["line"], line);
        assert_eq!(row["status"], 401);
        assert_eq!(row["error"], "stale_timestamp");
        assert_eq!(row["file"], old.path().as_str());
    }
    assert!(
        as_is.stdout.contains("stale_timestamp 3"),
        "{}",
        as_is.stdout
    );
    assert!(
        as_is
            .stderr
            .contains("3 delivery(ies) refused stale_timestamp")
            && as_is.stderr.contains("Leave out --as-is"),
        "what to do next: {}",
        as_is.stderr
    );
    assert_eq!(app.db.count("events"), 0);

    let resigned = replay(&[
        &old.path(),
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(resigned.code, 0, "{}\n{}", resigned.stdout, resigned.stderr);
    assert_eq!(resigned.report["counts"], counts(3, 3, 0, 0, 0));
    assert_eq!(app.db.count("events"), 3);
}

#[actix_web::test]
async fn a_line_that_is_not_json_or_names_a_source_the_config_lacks_is_reported_and_the_rest_sent()
{
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let good = |source: &str| {
        let id = unique_id(source);
        capture_line(
            source,
            &id,
            Some("test.event"),
            &[],
            &sample_body(source, &id),
        )
    };
    // The first line after a byte-order mark, as a Windows editor saves a file.
    let file = capture(&[
        format!("\u{feff}{}", good("stripe")),
        "{\"source\": \"stripe\", this is not JSON".to_owned(),
        good("github"),
        capture_line("paypal", "PAY-1", None, &[], "{}"),
        good("shopify"),
        r#"{"source": "github", "event_id": "gh-no-body"}"#.to_owned(),
    ]);

    let run = replay(&[
        &file.path(),
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report["counts"], counts(3, 3, 0, 0, 3));
    let rows = failures(&run);
    assert_eq!(rows.len(), 3, "{rows:?}");
    // A line that names its source and event id but cannot be sent is reported under them.
    assert_eq!(
        (&rows[2]["line"], &rows[2]["source"], &rows[2]["event_id"]),
        (&json!(6), &json!("github"), &json!("gh-no-body"))
    );
    assert_eq!(
        (&rows[0]["line"], &rows[0]["error"], &rows[0]["status"]),
        (&json!(2), &json!("invalid_capture"), &Value::Null)
    );
    assert_eq!(
        (&rows[1]["line"], &rows[1]["error"], &rows[1]["source"]),
        (&json!(4), &json!("source_not_configured"), &json!("paypal"))
    );
    for line in [2, 4, 6] {
        let place = format!("{}:{line}", file.path());
        assert!(run.stdout.contains(&place), "{place} in {}", run.stdout);
    }
    assert_eq!(app.db.count("events"), 3, "the other lines were sent");

    // To one source's URL, a capture of several: said before the other sources' lines are
    // refused there.
    let to_stripe = format!("{}/webhooks/stripe", app.address);
    let run = replay(&[&file.path(), "--to", &to_stripe, "--config", &config.path()]).await;
    assert!(
        run.stderr.contains("warning: --to has a path")
            && run.stderr.contains("github, paypal, shopify, stripe"),
        "{}",
        run.stderr
    );
    // And the hint after the refusals names the path, not only the secret.
    assert!(
        run.stderr
            .contains("refused invalid_signature: --to has a path, so every line was posted"),
        "{}",
        run.stderr
    );
}

#[actix_web::test]
async fn deliveries_refused_for_their_signature_are_followed_by_what_to_change() {
    let app = TestApp::spawn().await;
    let file = github_capture(2);
    let wrong = replay(&[
        &file.path(),
        "--to",
        &app.address,
        "--scheme",
        "github",
        "--secret",
        "not-the-receivers",
    ])
    .await;
    assert_eq!(wrong.code, 1, "{}", wrong.stdout);
    assert_eq!(wrong.report["counts"], counts(2, 0, 0, 2, 0));
    assert!(
        wrong.stderr.contains(
            "2 delivery(ies) refused invalid_signature: the receiver checks with another secret"
        ),
        "{}",
        wrong.stderr
    );
    let as_is = replay(&[&file.path(), "--to", &app.address, "--as-is"]).await;
    assert!(
        as_is
            .stderr
            .contains("refused invalid_signature: --as-is sends"),
        "{}",
        as_is.stderr
    );
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_directory_of_body_files_replays_under_source_and_a_second_run_is_all_replays() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    let dir = std::env::temp_dir().join(unique_id("hookbox-bodies"));
    std::fs::create_dir(&dir).expect("create the directory");
    for n in 0..3 {
        let id = unique_id("evt");
        std::fs::write(
            dir.join(format!("{n}.json")),
            stripe_event(&id, "charge.succeeded", 1),
        )
        .expect("write a body");
    }
    let dir_arg = dir.to_string_lossy().into_owned();
    let args = [
        dir_arg.as_str(),
        "--source",
        "stripe",
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ];

    let first = replay(&args).await;
    let second = replay(&args).await;
    let (code, _, stderr) = run_hookbox_async(&["replay", &dir_arg, "--to", &app.address]).await;
    // A --source the config does not have is a bad flag (2), as for send: nothing is sent.
    let (unknown_code, _, unknown_stderr) = run_hookbox_async(&[
        "replay",
        &dir_arg,
        "--source",
        "strpe",
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    std::fs::remove_dir_all(&dir).expect("remove the directory");
    assert_eq!(unknown_code, 2, "{unknown_stderr}");
    assert!(
        unknown_stderr.contains("--source") && unknown_stderr.contains("nothing was sent"),
        "{unknown_stderr}"
    );

    assert_eq!(first.code, 0, "{}\n{}", first.stdout, first.stderr);
    assert_eq!(first.report["counts"], counts(3, 3, 0, 0, 0));
    assert_eq!(second.report["counts"], counts(3, 0, 3, 0, 0));
    // The body file is named, since a directory may hold captures too.
    assert_eq!(
        (
            code,
            stderr.contains("--source"),
            stderr.contains(&format!("{}/", dir.display())) && stderr.contains(".json:")
        ),
        (2, true, true),
        "{stderr}"
    );
}

/// A receiver that counts what arrives: how many are in flight at most, and when each came.
/// It takes `delay` over each request; with `busy_first`, it answers each event's first
/// delivery 409 `in_progress` with `Retry-After: 1`, as hookbox does while another delivery of
/// the event is still in its transaction.
#[derive(Default)]
struct Counter {
    delay: Duration,
    busy_first: bool,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    arrivals: Mutex<Vec<(Instant, String)>>,
    seen: Mutex<HashSet<String>>,
}

async fn count_and_answer(state: web::Data<Counter>, request: HttpRequest) -> HttpResponse {
    let id = request
        .headers()
        .get("X-GitHub-Delivery")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    state
        .arrivals
        .lock()
        .expect("arrivals lock")
        .push((Instant::now(), id.clone()));
    if !state.delay.is_zero() {
        // The receiver's work: what keeps requests in flight long enough to overlap.
        actix_web::rt::time::sleep(state.delay).await;
    }
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    if state.busy_first && state.seen.lock().expect("seen lock").insert(id) {
        return HttpResponse::Conflict()
            .insert_header(("Retry-After", "1"))
            .json(json!({"error": "in_progress", "message": "Still being processed."}));
    }
    HttpResponse::Ok().json(json!({"status": "processed"}))
}

/// Starts the counting receiver; returns its URL (with a path, so replay posts to it as is).
fn receiver(counter: Counter) -> (String, web::Data<Counter>) {
    let state = web::Data::new(counter);
    let server = HttpServer::new({
        let state = state.clone();
        move || {
            App::new()
                .app_data(state.clone())
                .route("/hook", web::post().to(count_and_answer))
        }
    })
    .workers(2)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind the counting receiver");
    let port = server.addrs()[0].port();
    actix_web::rt::spawn(server.run());
    (format!("http://127.0.0.1:{port}/hook"), state)
}

/// A capture of `n` GitHub deliveries with ids `d-0`..: signed afresh by `--scheme github`.
fn github_capture(n: usize) -> TempFile {
    let lines: Vec<String> = (0..n)
        .map(|i| capture_line("github", &format!("d-{i}"), Some("push"), &[], "{}"))
        .collect();
    capture(&lines)
}

/// Replays `file` to `to`, signed by `--scheme github`, with `extra` options.
async fn replay_github(file: &TempFile, to: &str, extra: &[&str]) -> Run {
    let path = file.path();
    let mut args = vec![
        path.as_str(),
        "--to",
        to,
        "--scheme",
        "github",
        "--secret",
        "s3cret",
    ];
    args.extend_from_slice(extra);
    replay(&args).await
}

#[actix_web::test]
async fn concurrency_bounds_the_requests_in_flight() {
    let (url, counter) = receiver(Counter {
        delay: Duration::from_millis(50),
        ..Counter::default()
    });
    let file = github_capture(30);
    let run = replay_github(&file, &url, &["--concurrency", "3"]).await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report["counts"], counts(30, 30, 0, 0, 0));
    assert_eq!(counter.arrivals.lock().expect("lock").len(), 30);
    assert_eq!(
        counter.max_in_flight.load(Ordering::SeqCst),
        3,
        "three at a time, and no more"
    );
}

#[actix_web::test]
async fn rate_holds_the_pace_within_ten_percent() {
    let (url, counter) = receiver(Counter::default());
    // Three seconds of sending: a stall of the machine longer than the pacer makes good (ten
    // intervals) weighs a third less than over two.
    let file = github_capture(450);
    let run = replay_github(&file, &url, &["--rate", "150/s", "--concurrency", "8"]).await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let mut arrivals: Vec<Instant> = counter
        .arrivals
        .lock()
        .expect("lock")
        .iter()
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(arrivals.len(), 450);
    arrivals.sort();
    let span = arrivals[449] - arrivals[0];
    let rate = 449.0 / span.as_secs_f64();
    assert!(
        (135.0..=165.0).contains(&rate),
        "asked for 150/s, measured {rate:.1}/s over {span:?}"
    );
}

#[actix_web::test]
async fn an_in_progress_answer_is_retried_after_its_retry_after() {
    let (url, counter) = receiver(Counter {
        busy_first: true,
        ..Counter::default()
    });
    let file = github_capture(2);
    let run = replay_github(&file, &url, &[]).await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report["counts"], counts(2, 2, 0, 0, 0));
    let arrivals = counter.arrivals.lock().expect("lock").clone();
    assert_eq!(arrivals.len(), 4, "each delivery twice");
    for id in ["d-0", "d-1"] {
        let times: Vec<Instant> = arrivals
            .iter()
            .filter(|(_, seen)| seen == id)
            .map(|(at, _)| *at)
            .collect();
        assert!(
            times[1] - times[0] >= Duration::from_millis(950),
            "{id}: retried after Retry-After"
        );
    }
}

#[actix_web::test]
async fn send_says_why_it_tries_again_after_an_in_progress_answer() {
    let (url, counter) = receiver(Counter {
        busy_first: true,
        ..Counter::default()
    });
    let body = TempFile::with_extension(b"{}", "json");
    let (code, stdout, stderr) = run_hookbox_async(&[
        "send",
        "--scheme",
        "github",
        "--secret",
        "s",
        "--source",
        "gh",
        "--event-id",
        "d-send",
        "--to",
        &url,
        &body.path(),
    ])
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(counter.arrivals.lock().expect("lock").len(), 2);
    assert!(
        stderr.contains("409 in_progress") && stderr.contains("trying again in 1s (1 of 5)"),
        "{stderr}"
    );
}

#[actix_web::test]
async fn a_receiver_that_never_answers_is_retried_then_counted_failed() {
    // Port 1, where nothing listens (as in the other tests that need a refused connection): a
    // port taken from the ephemeral range and let go could be handed to another test's server
    // during the retries, which then answered them (a CI run counted the delivery rejected).
    let file = github_capture(2);
    let started = Instant::now();
    let run = replay_github(&file, "http://127.0.0.1:1", &[]).await;

    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report["counts"], counts(2, 0, 0, 0, 2));
    assert_eq!(failures(&run)[0]["error"], "network");
    // Why is said as the first one ends, once, not only in the summary (bb57).
    let told: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("replay: a delivery got no answer"))
        .collect();
    assert_eq!(told.len(), 1, "{}", run.stderr);
    assert!(
        told[0].contains("check --to") && told[0].contains("tried 4 times"),
        "{}",
        told[0]
    );
    // Steps of 250, 500 and 1000 ms, each waited at least half of (equal jitter).
    assert!(
        started.elapsed() >= Duration::from_millis(875),
        "three retries with backoff (at least 125 + 250 + 500 ms) before giving up"
    );
}

#[actix_web::test]
async fn dry_run_prints_each_delivery_and_sends_nothing() {
    let (url, counter) = receiver(Counter::default());
    let file = github_capture(2);
    let run = replay_github(&file, &url, &["--dry-run"]).await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.report["counts"], counts(0, 0, 0, 0, 0));
    assert!(counter.arrivals.lock().expect("lock").is_empty());
    assert_eq!(
        run.stdout.matches(&format!("POST {url}")).count(),
        2,
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("X-GitHub-Delivery: d-1"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("X-Hub-Signature-256: sha256="),
        "{}",
        run.stdout
    );
}

/// The headers of each request a receiver got, names lowercase.
type Seen = web::Data<Mutex<Vec<Vec<(String, String)>>>>;

async fn record_headers(seen: Seen, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let mut headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    headers.push(("(body length)".to_owned(), body.len().to_string()));
    seen.lock().expect("seen lock").push(headers);
    HttpResponse::Ok().json(json!({"status": "processed"}))
}

/// A receiver that records every request's headers; returns its URL (with a path) and port.
fn recorder() -> (String, u16, Seen) {
    let seen: Seen = web::Data::new(Mutex::new(Vec::new()));
    let server = HttpServer::new({
        let seen = seen.clone();
        move || {
            App::new()
                .app_data(seen.clone())
                .route("/hook", web::post().to(record_headers))
        }
    })
    .workers(1)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind the recording receiver");
    let port = server.addrs()[0].port();
    actix_web::rt::spawn(server.run());
    (format!("http://127.0.0.1:{port}/hook"), port, seen)
}

#[actix_web::test]
async fn as_is_never_sends_credentials_the_host_or_framing_headers_a_capture_holds() {
    let (url, port, seen) = recorder();
    let body = r#"{"ref":"main"}"#;
    let hostile: Vec<(String, String)> = [
        ("Authorization", "Bearer stolen"),
        ("proxy-authorization", "Basic c3RvbGVu"),
        ("cookie", "session=stolen"),
        ("set-cookie", "session=stolen"),
        ("host", "evil.example"),
        ("content-length", "9999"),
        ("transfer-encoding", "chunked"),
        ("connection", "close"),
        ("x-github-delivery", "d-hostile"),
        ("x-github-event", "push"),
        ("content-type", "application/json"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    let file = capture(&[capture_line(
        "github",
        "d-hostile",
        Some("push"),
        &hostile,
        body,
    )]);
    let path = file.path();

    let run = replay(&[&path, "--to", &url, "--as-is"]).await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let seen = seen.lock().expect("seen lock");
    assert_eq!(seen.len(), 1, "one delivery");
    let header = |name: &str| -> Vec<&str> {
        seen[0]
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    for never in [
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "transfer-encoding",
    ] {
        assert_eq!(header(never), Vec::<&str>::new(), "{never} was sent");
    }
    assert_eq!(header("host"), [format!("127.0.0.1:{port}")]);
    assert_eq!(header("content-length"), [body.len().to_string()]);
    assert_eq!(header("(body length)"), [body.len().to_string()]);
    assert_eq!(header("x-github-delivery"), ["d-hostile"]);
    assert_eq!(header("content-type"), ["application/json"]);
}

#[actix_web::test]
async fn a_capture_that_came_with_svix_names_is_re_signed_under_them() {
    // Svix's senders (Clerk, Resend) send `svix-id`, `svix-timestamp` and `svix-signature`; a
    // handler written as their docs show reads those. A re-signing replay sent `webhook-*`
    // instead, and such a handler refused every replayed event (a black-box run).
    let (url, _, seen) = recorder();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = r#"{"type":"user.created","data":{"id":"user_1"}}"#;
    let header = |names: [&str; 3]| -> Vec<(String, String)> {
        names
            .iter()
            .zip(["msg_svix_1", "1700000000", "v1,c3RhbGU="])
            .map(|(n, v)| ((*n).to_owned(), v.to_owned()))
            .chain([("content-type".to_owned(), "application/json".to_owned())])
            .collect()
    };
    let svix = header(["svix-id", "svix-timestamp", "svix-signature"]);
    let webhook = header(["webhook-id", "webhook-timestamp", "webhook-signature"]);
    let file = capture(&[
        capture_line("clerk", "msg_svix_1", Some("user.created"), &svix, body),
        capture_line("acme", "msg_svix_1", Some("user.created"), &webhook, body),
    ]);
    let path = file.path();

    let run = replay(&[
        &path, "--to", &url, "--scheme", "standard", "--secret", secret,
    ])
    .await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let seen = seen.lock().expect("seen lock");
    assert_eq!(seen.len(), 2, "two deliveries");
    let names = |delivery: &[(String, String)]| -> Vec<String> {
        let mut names: Vec<String> = delivery
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| n.starts_with("svix-") || n.starts_with("webhook-"))
            .collect();
        names.sort();
        names
    };
    let sent = |id_header: &str| -> &Vec<(String, String)> {
        seen.iter()
            .find(|d| d.iter().any(|(n, _)| n == id_header))
            .unwrap_or_else(|| panic!("a delivery with {id_header}: {seen:?}"))
    };
    assert_eq!(
        names(sent("svix-id")),
        ["svix-id", "svix-signature", "svix-timestamp"]
    );
    assert_eq!(
        names(sent("webhook-id")),
        ["webhook-id", "webhook-signature", "webhook-timestamp"]
    );
    // Re-signed, not the captured stale signature.
    let signature = sent("svix-id")
        .iter()
        .find(|(n, _)| n == "svix-signature")
        .map(|(_, v)| v.clone())
        .expect("signed");
    assert_ne!(signature, "v1,c3RhbGU=");
}

#[actix_web::test]
async fn a_header_http_cannot_carry_is_a_usage_error_and_nothing_is_sent() {
    let (url, _, seen) = recorder();
    let good = capture_line("github", "d-good", Some("push"), &[], "{}");
    let bad_value = capture_line(
        "github",
        "d-bad",
        Some("push"),
        &[("x-note".to_owned(), "a\r\nx-injected: 1".to_owned())],
        "{}",
    );
    // Re-signed, the id travels in a header: a CR/LF there is the same fault.
    let bad_id = capture_line("github", "d-\r\nx-injected: 1", Some("push"), &[], "{}");
    for (lines, extra, place) in [
        (vec![good.clone(), bad_value], vec!["--as-is"], ":2:"),
        (
            vec![good.clone(), bad_id],
            vec!["--scheme", "github", "--secret", "s3cret"],
            ":2:",
        ),
    ] {
        let file = capture(&lines);
        let path = file.path();
        let mut args = vec!["replay", path.as_str(), "--to", url.as_str()];
        args.extend(extra);
        let (code, stdout, stderr) = run_hookbox_async(&args).await;
        assert_eq!(code, 2, "{stdout}\n{stderr}");
        assert!(
            stderr.contains(place) && stderr.contains("CR, LF"),
            "names the line and the fault: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert_eq!(seen.lock().expect("seen lock").len(), 0, "nothing was sent");
}

#[actix_web::test]
async fn a_report_that_cannot_be_written_is_a_usage_error_before_anything_is_sent() {
    let (url, _, seen) = recorder();
    let file = capture(&[capture_line("github", "d-1", Some("push"), &[], "{}")]);
    let path = file.path();
    let nowhere = std::env::temp_dir()
        .join(unique_id("no-such-dir"))
        .join("report.json");
    let nowhere = nowhere.to_str().expect("a UTF-8 temp dir");
    let (code, stdout, stderr) = run_hookbox_async(&[
        "replay", &path, "--to", &url, "--as-is", "--report", nowhere,
    ])
    .await;
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--report") && stderr.contains("nothing was sent"),
        "says which flag and that nothing went: {stderr}"
    );
    assert_eq!(seen.lock().expect("seen lock").len(), 0, "nothing was sent");
}

#[actix_web::test]
async fn a_report_is_its_owners_only_and_a_link_is_written_where_it_leads() {
    use std::os::unix::fs::PermissionsExt;
    let (url, _, _) = recorder();
    let file = capture(&[capture_line("github", "d-1", Some("push"), &[], "{}")]);
    let path = file.path();
    let dir = TempDir::new();
    // A link to a report not made yet: made where it leads, the link left a link.
    let link = dir.0.join("report.json");
    std::os::unix::fs::symlink("made.json", &link).expect("a link");
    let report = link.to_str().expect("a UTF-8 temp dir");
    let (code, stdout, stderr) = run_hookbox_async(&[
        "replay", &path, "--to", &url, "--scheme", "github", "--secret", "s3cret", "--report",
        report,
    ])
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(std::fs::symlink_metadata(&link)
        .expect("the link")
        .file_type()
        .is_symlink());
    let made = dir.0.join("made.json");
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&made).expect("made"))
        .expect("the report is JSON");
    assert_eq!(written["counts"]["sent"], 1, "{written}");
    let mode = std::fs::metadata(&made).expect("made").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the report is {mode:o}");
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("the directory")
        .map(|entry| entry.expect("an entry").file_name())
        .collect();
    assert_eq!(names.len(), 2, "no partial file left: {names:?}");
}

#[actix_web::test]
async fn a_report_naming_one_of_the_captures_is_a_usage_error_and_the_capture_stays() {
    let (url, _, seen) = recorder();
    let file = capture(&[capture_line("github", "d-1", Some("push"), &[], "{}")]);
    let path = file.path();
    let before = file.read();
    let link = std::env::temp_dir().join(unique_id("report-link"));
    std::os::unix::fs::symlink(&path, &link).expect("a symlink to the capture");
    let link = link.to_str().expect("a UTF-8 temp dir").to_owned();
    // By its own name, and by another way to it.
    for report in [path.as_str(), link.as_str()] {
        let (code, stdout, stderr) = run_hookbox_async(&[
            "replay", &path, "--to", &url, "--scheme", "github", "--secret", "s3cret", "--report",
            report,
        ])
        .await;
        assert_eq!(code, 2, "{stdout}\n{stderr}");
        assert!(
            stderr.contains("one of the captures") && stderr.contains("nothing was sent"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_file(&link);
    assert_eq!(file.read(), before, "the capture is as it was");
    assert_eq!(seen.lock().expect("seen lock").len(), 0, "nothing was sent");
}

#[actix_web::test]
async fn a_capture_saved_as_json_is_replayed_line_by_line_not_as_one_body() {
    let (url, counter) = receiver(Counter::default());
    let lines: Vec<String> = (0..3)
        .map(|i| capture_line("github", &format!("j-{i}"), Some("push"), &[], "{}"))
        .collect();
    let file = TempFile::with_extension((lines.join("\n") + "\n").as_bytes(), "json");
    let run = replay_github(&file, &url, &[]).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("holds capture lines"), "{}", run.stderr);
    assert_eq!(
        run.report["counts"],
        counts(3, 3, 0, 0, 0),
        "{}",
        run.report
    );
    let ids: HashSet<String> = counter
        .arrivals
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(ids.len(), 3, "each line its own delivery: {ids:?}");

    // Its first line one that cannot be read whole: still a capture, that line failing alone.
    let mut lines = vec![
        json!({"source": "github", "event_id": "j-bad", "received_at": "yesterday",
                                "headers": {}, "body": "{}"})
        .to_string(),
    ];
    lines
        .extend((3..5).map(|i| capture_line("github", &format!("j-{i}"), Some("push"), &[], "{}")));
    let file = TempFile::with_extension((lines.join("\n") + "\n").as_bytes(), "json");
    let run = replay_github(&file, &url, &[]).await;
    assert_eq!(
        run.report["counts"],
        counts(2, 2, 0, 0, 1),
        "{}",
        run.report
    );
}

#[actix_web::test]
async fn a_received_at_in_another_form_is_read_and_one_that_is_no_time_is_named() {
    let (url, _) = receiver(Counter::default());
    let line = |id: &str, received_at: Value| {
        json!({"source": "github", "event_id": id, "event_type": "push",
               "received_at": received_at, "headers": {}, "body": "{}"})
        .to_string()
    };
    let file = capture(&[
        line("r-1", json!("2026-12-02 09:00:00")),
        line("r-2", json!("2026-12-02T09:00")),
        line("r-3", json!("2026-12-02")),
        line("r-4", Value::Null),
        line("r-5", json!("not a time")),
        line("r-6", json!(1796605233)),
    ]);
    let run = replay_github(&file, &url, &[]).await;
    assert_eq!(
        run.report["counts"],
        counts(4, 4, 0, 0, 2),
        "{}",
        run.report
    );
    let rows = failures(&run);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        let message = row["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("received_at") && message.contains("leave it out"),
            "names the field and what to do: {row}"
        );
        assert!(!message.contains("end of input"), "{row}");
    }
}

#[test]
fn a_to_url_that_would_not_be_sent_as_written_is_a_usage_error() {
    let file = github_capture(1);
    let path = file.path();
    for (to, says) in [
        ("http://127.0.0.1:99999", "port"),
        ("http://127.0.0.1:0/hook", "port"),
        ("http://127.0.0.1:8080/hook#part", "fragment"),
        ("http://admin:hunter2@127.0.0.1:8080", "user:password@"),
    ] {
        for command in [
            vec!["replay", path.as_str(), "--to", to, "--as-is"],
            vec![
                "send",
                "--to",
                to,
                "--source",
                "github",
                "--scheme",
                "github",
                "--secret",
                "s3cret",
                path.as_str(),
            ],
        ] {
            let (code, stdout, stderr) = run_hookbox(&command, &[]);
            assert_eq!(code, 2, "{command:?}: {stdout}\n{stderr}");
            assert!(stderr.contains(says), "{command:?}: {stderr}");
            assert!(
                !stderr.contains("hunter2"),
                "the password is not repeated: {stderr}"
            );
        }
    }
}

#[actix_web::test]
async fn a_closed_stdout_ends_the_printing_quietly_not_in_a_panic() {
    let (url, _, seen) = recorder();
    let file = github_capture(3);
    let path = file.path();
    for dry_run in [true, false] {
        let mut args: Vec<String> = [
            "replay", &path, "--to", &url, "--scheme", "github", "--secret", "s3cret",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        if dry_run {
            args.push("--dry-run".to_owned());
        }
        let (code, stderr) = actix_web::rt::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_into_a_closed_pipe(&args)
        })
        .await
        .expect("the command's thread");
        assert_eq!(code, 0, "dry run {dry_run}: {stderr}");
        assert!(!stderr.contains("panicked"), "dry run {dry_run}: {stderr}");
    }
    assert_eq!(
        seen.lock().expect("seen lock").len(),
        3,
        "the real run sent all three; the dry run none"
    );
}

/// Sources of four schemes that share one secret, so `--secret` alone can sign for them all;
/// `gh` (GitHub) and `wa` (Meta) both sign with `X-Hub-Signature-256`.
const SHARED_SECRET_SOURCES: &str = r#"
[sources.pay]
scheme = "stripe"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]

[sources.gh]
scheme = "github"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]

[sources.wa]
scheme = "meta"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
verify_token = "vt"
"#;

#[actix_web::test]
async fn secret_alone_signs_each_exported_line_with_the_scheme_its_headers_show() {
    let app = TestApp::spawn_with(SHARED_SECRET_SOURCES, Handlers::default()).await;
    let config = TempFile::new(&config_text(&app.db.url, SHARED_SECRET_SOURCES));
    for (source, body) in [
        ("standard", sample_body("standard", "")),
        (
            "pay",
            stripe_event(&unique_id("evt"), "charge.succeeded", 1),
        ),
        ("gh", sample_body("github", "")),
        (
            "wa",
            r#"{"object":"whatsapp_business_account","entry":[]}"#.to_owned(),
        ),
    ] {
        let answer = app
            .send(&app.delivery(source, &body, &unique_id(source)))
            .await;
        assert_eq!(answer.status, 200, "{source}: {}", answer.text());
    }
    let exported = export_all(&config.path()).await;

    let run = replay(&[
        &exported.path(),
        "--to",
        &app.address,
        "--secret",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ])
    .await;

    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // Every line re-signed by its own scheme, so each passed and was known as the event it was.
    assert_eq!(
        run.report["counts"],
        counts(4, 0, 4, 0, 0),
        "{}",
        run.stdout
    );
    assert_eq!(app.db.count("events"), 4);
}

#[actix_web::test]
async fn secret_alone_on_a_line_whose_headers_tell_no_scheme_is_a_usage_error_naming_the_line() {
    let (url, _, seen) = recorder();
    let stripe = capture_line(
        "stripe",
        "evt_1",
        Some("charge.succeeded"),
        &[("stripe-signature".to_owned(), "t=1,v1=00".to_owned())],
        r#"{"id":"evt_1","type":"charge.succeeded"}"#,
    );
    let acme = capture_line(
        "acme",
        "a-1",
        Some("thing.happened"),
        &[
            ("x-acme-signature".to_owned(), "sha256=00".to_owned()),
            ("x-acme-event-id".to_owned(), "a-1".to_owned()),
        ],
        r#"{"type":"thing.happened"}"#,
    );
    let file = capture(&[stripe, acme]);
    let body = TempFile::with_extension(br#"{"id":"evt_2"}"#, "json");
    // A Square line: its scheme signs its public_url, which only a config has, so it is no
    // candidate here; the message names it among those that need more than a secret.
    let square = capture(&[capture_line(
        "sq",
        "sq-1",
        Some("payment.updated"),
        &[(
            "x-square-hmacsha256-signature".to_owned(),
            "AAAA".to_owned(),
        )],
        r#"{"event_id":"sq-1","type":"payment.updated"}"#,
    )]);
    let mut all = vec!["replay".to_owned(), square.path(), "--to".to_owned()];
    all.extend([url.clone(), "--secret".to_owned(), "s3cret".to_owned()]);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = run_hookbox_async(&all).await;
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("square") && stderr.contains("more than a secret"),
        "{stderr}"
    );

    for (args, says) in [
        (
            vec![file.path(), "--to".to_owned(), url.clone()],
            format!("{}:2: ", file.path()),
        ),
        (
            vec![
                body.path(),
                "--source".to_owned(),
                "stripe".to_owned(),
                "--to".to_owned(),
                url.clone(),
            ],
            ".json body file".to_owned(),
        ),
    ] {
        let mut all = vec!["replay"];
        all.extend(args.iter().map(String::as_str));
        all.extend(["--secret", "s3cret"]);
        let (code, stdout, stderr) = run_hookbox_async(&all).await;
        assert_eq!(code, 2, "{stdout}\n{stderr}");
        assert!(
            stderr.contains(&says) && stderr.contains("add --scheme"),
            "names the place and the fix: {stderr}"
        );
    }
    assert_eq!(seen.lock().expect("seen lock").len(), 0, "nothing was sent");
}

#[actix_web::test]
async fn a_replayed_line_carries_its_captured_content_type_or_none_when_it_had_none() {
    let (url, _, seen) = recorder();
    let bare = capture_line(
        "github",
        "d-bare",
        Some("push"),
        &[("x-github-delivery".to_owned(), "d-bare".to_owned())],
        "payload=1",
    );
    let typed = capture_line(
        "github",
        "d-typed",
        Some("push"),
        &[
            ("x-github-delivery".to_owned(), "d-typed".to_owned()),
            (
                "content-type".to_owned(),
                "text/plain; charset=utf-8".to_owned(),
            ),
        ],
        "payload=2",
    );
    let file = capture(&[bare, typed]);
    let path = file.path();

    for mode in [
        vec!["--scheme", "github", "--secret", "s3cret"],
        vec!["--as-is"],
    ] {
        let mut args = vec![path.as_str(), "--to", url.as_str(), "--concurrency", "1"];
        args.extend(&mode);
        let run = replay(&args).await;
        assert_eq!(run.code, 0, "{mode:?}: {}\n{}", run.stdout, run.stderr);
    }

    let seen = seen.lock().expect("seen lock");
    assert_eq!(seen.len(), 4, "two lines, twice");
    let content_types: Vec<Vec<&str>> = seen
        .iter()
        .map(|headers| {
            headers
                .iter()
                .filter(|(name, _)| name == "content-type")
                .map(|(_, value)| value.as_str())
                .collect()
        })
        .collect();
    let none: Vec<&str> = Vec::new();
    let text = vec!["text/plain; charset=utf-8"];
    assert_eq!(
        content_types,
        [none.clone(), text.clone(), none, text],
        "re-signed, then as is"
    );
}

/// Sends `signal` (`-INT`, as Ctrl-C in a terminal does; `-TERM`, as a supervisor does) to
/// `pid`.
fn interrupt(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

#[actix_web::test]
async fn ctrl_c_stops_sending_waits_for_what_is_in_flight_and_still_reports_it() {
    interrupted_replay("-INT").await;
}

#[actix_web::test]
async fn sigterm_is_taken_as_ctrl_c_and_the_summary_and_report_still_come() {
    interrupted_replay("-TERM").await;
}

/// Starts `hookbox replay ARGS`, signed by `--scheme github --secret s3cret`, with no config
/// and stdin, stdout and stderr piped.
fn replay_child(args: &[&str]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .arg("replay")
        .args(args)
        .args(["--scheme", "github", "--secret", "s3cret"])
        .env_remove("DATABASE_URL")
        .env_remove("HOOKBOX_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start hookbox replay")
}

/// Replays the 40 GitHub deliveries of a capture that holds 40 of another source between them
/// (`--source github`) to a slow receiver, and stops it with `signal` after a few arrived.
async fn interrupted_replay(signal: &str) {
    let (url, counter) = receiver(Counter {
        delay: Duration::from_millis(400),
        ..Counter::default()
    });
    let lines: Vec<String> = (0..40)
        .flat_map(|i| {
            [
                capture_line("github", &format!("d-{i}"), Some("push"), &[], "{}"),
                capture_line("shopify", &format!("s-{i}"), None, &[], "{}"),
            ]
        })
        .collect();
    let file = capture(&lines);
    let report = TempFile::with_extension(b"", "json");
    let path = file.path();
    let report_path = report.path();
    let child = replay_child(&[
        &path,
        "--source",
        "github",
        "--to",
        &url,
        "--concurrency",
        "2",
        "--report",
        &report_path,
    ]);
    let started = Instant::now();
    while counter.arrivals.lock().expect("lock").len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replay never sent"
        );
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }

    interrupt(child.id(), signal);
    let output = actix_web::rt::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("the waiting thread")
        .expect("hookbox replay ends");

    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(stdout.contains("interrupted"), "the summary: {stdout}");
    let report: Value = serde_json::from_str(&report.read()).expect("the report is JSON");
    assert_eq!(report["interrupted"], true, "{report}");
    // What was in flight was waited for: every request that arrived is counted, processed.
    let arrived = counter.arrivals.lock().expect("lock").len() as u64;
    let sent = report["counts"]["sent"].as_u64().expect("sent");
    assert!((3..40).contains(&sent), "stopped early: {report}");
    assert_eq!(report["counts"], counts(arrived, arrived, 0, 0, 0));
    assert_eq!(report["abandoned_in_flight"], 0);
    // The rest of the 40 were never posted, and the summary says how many: the other
    // source's lines not reached are no part of it, as --source never sends them.
    assert_eq!(report["not_sent"], 40 - sent, "{report}");
    let not_sent = stdout.lines().any(|line| {
        line.split_whitespace().take(3).collect::<Vec<_>>()
            == ["not", "sent", &(40 - sent).to_string()]
    });
    assert!(not_sent, "the summary: {stdout}");
}

#[actix_web::test]
async fn a_dry_run_never_prints_a_secret_a_scheme_sends_as_it_is() {
    // GitLab sends its secret token itself in X-Gitlab-Token: a dry run shows the delivery,
    // not the token.
    let body = TempFile::with_extension(br#"{"object_kind":"push"}"#, "json");
    let (code, out, err) = run_hookbox_async(&[
        "replay",
        &body.path(),
        "--to",
        "http://127.0.0.1:9",
        "--source",
        "gl",
        "--scheme",
        "gitlab",
        "--secret",
        "SEKRETgitlab19",
        "--dry-run",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !out.contains("SEKRETgitlab19") && !err.contains("SEKRETgitlab19"),
        "{out}{err}"
    );
    assert!(out.contains("X-Gitlab-Token: ***"), "{out}");
    assert!(
        out.contains("X-Gitlab-Event-UUID: "),
        "the rest is shown: {out}"
    );
}

/// Waits for `child` (off the test's thread), asserts it exited 0, and gives its stdout.
async fn succeeded(child: std::process::Child) -> String {
    let output = actix_web::rt::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("the waiting thread")
        .expect("the command ends");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    stdout
}

#[actix_web::test]
async fn a_capture_from_a_pipe_or_a_fifo_is_read_once_and_replayed_whole() {
    // `hookbox export | hookbox replay -` and `replay <(hookbox export)`: a pipe gives its
    // bytes once, and replay reads its inputs more than once (to check, to count, to send).
    let (url, counter) = receiver(Counter::default());
    let text = std::fs::read(github_capture(5).0.clone()).expect("the capture");
    let run = |input: &str| replay_child(&[input, "--to", &url]);

    let mut child = run("-");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &text).expect("write");
    let stdout = succeeded(child).await;
    assert_eq!(counter.arrivals.lock().expect("lock").len(), 5, "{stdout}");

    let dir = TempDir::new();
    let fifo = dir.0.join("capture.ndjson");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let writer = {
        let (fifo, text) = (fifo.clone(), text.clone());
        std::thread::spawn(move || std::fs::write(fifo, text).expect("write the fifo"))
    };
    let child = run(&fifo.to_string_lossy());
    let pid = child.id();
    let stdout = succeeded(child).await;
    writer.join().expect("the writer");
    // Replayed again: the receiver counts every arrival.
    assert_eq!(counter.arrivals.lock().expect("lock").len(), 10, "{stdout}");
    // Its copy is gone with it.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("the temp dir")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("hookbox-replay-{pid}-"))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_source_no_capture_line_is_from_is_a_usage_error_naming_the_ones_there() {
    // `--source stripee`: every line would be skipped, and the replay would say it was done.
    let file = github_capture(2);
    let path = file.path();
    let dir = TempDir::new();
    let report = dir.0.join("report.json");
    let (code, stdout, stderr) = run_hookbox(
        &[
            "replay",
            &path,
            "--to",
            "http://127.0.0.1:9",
            "--as-is",
            "--source",
            "githb",
            "--report",
            &report.to_string_lossy(),
        ],
        &[],
    );
    assert_eq!(code, 2, "{stdout}{stderr}");
    // No empty report is left to read as a replay that ran.
    assert!(!report.exists(), "a report was left behind");
    assert!(
        stderr.contains("--source githb") && stderr.contains("the captures hold github"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was sent"), "{stderr}");
}

#[test]
fn a_replay_stopped_while_it_reads_a_pipe_leaves_no_copy_of_the_capture() {
    // Ctrl-C while stdin is still being copied: the copy (bodies and signatures) must not stay
    // in the temporary directory.
    let mut child = replay_child(&["-", "--to", "http://127.0.0.1:9"]);
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, b"{\"source\":\"github\",").expect("write");
    // Its copy is open (and, on Linux, already nameless) while the pipe is read.
    let fds = format!("/proc/{}/fd", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let copying = || {
        std::fs::read_dir(&fds)
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|to| to.to_string_lossy().contains("hookbox-replay-"))
            })
    };
    while !copying() {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy was never made"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let prefix = format!("hookbox-replay-{}-", child.id());
    interrupt(child.id(), "-INT");
    let _ = child.wait();
    drop(stdin);
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .expect("the temp dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_empty_input_says_there_was_nothing_to_replay() {
    // `hookbox export ... | hookbox replay -` where the export failed: not a silent success.
    let empty = TempFile::with_extension(b"", "ndjson");
    let (code, stdout, stderr) = run_hookbox(
        &[
            "replay",
            &empty.path(),
            "--to",
            "http://127.0.0.1:9",
            "--as-is",
        ],
        &[],
    );
    assert_eq!(code, 0, "an empty capture is no failure: {stdout}{stderr}");
    assert!(stderr.contains("nothing to replay"), "{stderr}");
}

#[test]
fn a_replay_with_no_sources_to_sign_with_stops_before_sending() {
    // No --config, no HOOKBOX_CONFIG, no ./hookbox.toml: every line would be refused alike.
    let empty = TempDir::new();
    let file = github_capture(2);
    let (code, stdout, stderr) = run_hookbox_in(
        &["replay", &file.path(), "--to", "http://127.0.0.1:9"],
        &[],
        Some(&empty.0),
    );
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("no sources at all") && stderr.contains("nothing was sent"),
        "{stderr}"
    );
}

#[actix_web::test]
async fn a_line_stored_under_another_id_than_its_own_is_said_in_the_summary_and_report() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    // A hand-edited line: its event_id says one thing, its Stripe body (where Stripe's id is
    // read) another.
    let (line_id, body_id) = (unique_id("evt_line"), unique_id("evt_body"));
    let body = stripe_event(&body_id, "payment_intent.succeeded", 1);
    let edited = capture(&[capture_line("stripe", &line_id, None, &[], &body)]);
    let run = replay(&[
        &edited.path(),
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("stored under another id")
            && run
                .stdout
                .contains(&format!("stripe {line_id}: stored as {body_id}")),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.report["stored_under_another_id"][0]["stored_as"],
        body_id.as_str()
    );
    // A line that says its own id says nothing of the kind.
    let id = unique_id("evt");
    let fine = capture(&[capture_line(
        "stripe",
        &id,
        None,
        &[],
        &sample_body("stripe", &id),
    )]);
    let run = replay(&[
        &fine.path(),
        "--to",
        &app.address,
        "--config",
        &config.path(),
    ])
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains("another id"), "{}", run.stdout);
    assert!(run.report.get("stored_under_another_id").is_none());
}
