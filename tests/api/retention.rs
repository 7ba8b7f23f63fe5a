//! Retention: the scheduled purge, `hookbox purge`, and what a redelivery after it means.

use std::time::{Duration, Instant};

use hookbox::Handlers;

use crate::helpers::*;

/// The test config with `github` on a window of its own and the purge running every `every`.
fn config_with_windows(database_url: &str, github_window: &str, every: &str) -> String {
    config_text(
        database_url,
        &format!("\n[retention]\npurge_interval = \"{every}\"\n"),
    )
    .replace(
        "[sources.github]\nscheme = \"github\"\n",
        &format!("[sources.github]\nscheme = \"github\"\nretention = \"{github_window}\"\n"),
    )
}

/// Adds `n` stored events of `source`, received `age` ago (`4 days`), straight into the table,
/// in one statement (hundreds of thousands for the large purge).
fn insert_aged(db: &TestDb, source: &str, prefix: &str, n: u32, age: &str) {
    use diesel::RunQueryDsl;
    let sql = if store_is_sqlite() {
        let age = humantime::parse_duration(&age.replace(' ', "")).expect("an age");
        let received_at = chrono::Utc::now() - chrono::Duration::from_std(age).expect("an age");
        format!(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
             INSERT INTO events (source, event_id, fingerprint, received_at, payload, headers, \
                 response_status, response_content_type, response_body) \
             SELECT '{source}', '{prefix}_' || n, X'00', '{}', X'7B7D', '{{}}', \
                 200, 'application/json', X'7B7D' \
             FROM g",
            received_at.format("%Y-%m-%d %H:%M:%S%.6f+00:00")
        )
    } else {
        format!(
            "INSERT INTO events (source, event_id, fingerprint, received_at, payload, headers, \
                 response_status, response_content_type, response_body) \
             SELECT '{source}', '{prefix}_' || g, '\\x00', now() - interval '{age}', '{{}}', '{{}}', \
                 200, 'application/json', '{{}}' \
             FROM generate_series(1, {n}) g"
        )
    };
    diesel::sql_query(sql)
        .execute(&mut db.connect())
        .expect("insert aged events");
}

/// Writes `text` to a config file and runs `hookbox migrate` with it: the file (kept for the
/// test's life) and its path.
fn migrated_config(text: &str) -> (TempFile, String) {
    let config = TempFile::new(text);
    let path = config.path();
    let (code, _, stderr) = run_hookbox(&["migrate", "--config", &path], &[]);
    assert_eq!(code, 0, "{stderr}");
    (config, path)
}

async fn poll_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_web::test]
async fn an_event_past_its_window_is_purged_on_schedule_and_its_redelivery_is_new() {
    let db = TestDb::create();
    let config = parse_config(&config_with_windows(&db.url, "2s", "300ms"));
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;
    let gh = unique_id("gh");
    let short_lived = app.delivery("github", r#"{"zen":"short"}"#, &gh);
    assert_eq!(app.send(&short_lived).await.status, 200);
    let evt = unique_id("evt");
    let kept = app.delivery("stripe", &stripe_event(&evt, "charge.succeeded", 1), &evt);
    let stored = app.send(&kept).await;
    assert_eq!(stored.status, 200);

    let path = format!("/admin/events/github/{gh}");
    poll_until("the github event is purged", || async {
        app.get(&path, Some(ADMIN_TOKEN)).await.status == 404
    })
    .await;

    let stripe = app
        .get(&format!("/admin/events/stripe/{evt}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(stripe.status, 200, "an event inside its window stays");
    let again = app.send(&kept).await;
    assert!(again.replayed(), "and is still a replay");
    assert_eq!(again.body, stored.body);

    let redelivered = app.send(&short_lived).await;
    assert_eq!(redelivered.status, 200);
    assert!(
        !redelivered.replayed(),
        "after the window the id is forgotten: processed as new"
    );

    // The pass counts what it removed once it ends, a moment after the row is gone.
    poll_until("the purge is counted", || async {
        let metrics = app.get("/metrics", None).await.text();
        let purged: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("hookbox_purged_total{source=\"github\"} "))
            .and_then(|n| n.parse().ok())
            .expect("hookbox_purged_total for github");
        purged >= 1
    })
    .await;
    let metrics = app.get("/metrics", None).await.text();
    assert!(
        !metrics.contains("hookbox_last_purge_timestamp_seconds 0\n"),
        "{metrics}"
    );
}

#[test]
fn purge_dry_run_counts_without_deleting_and_purge_removes_exactly_those() {
    let db = TestDb::create();
    let text = config_with_windows(&db.url, "1h", "10m").replace(
        "[sources.standard]\nscheme = \"standard\"\n",
        "[sources.standard]\nscheme = \"standard\"\nretention = \"30d\"\n",
    );
    let (_config, config_path) = migrated_config(&text);
    insert_aged(&db, "stripe", "old", 5, "4 days");
    insert_aged(&db, "stripe", "new", 2, "1 hour");
    insert_aged(&db, "github", "old", 3, "2 hours");
    insert_aged(&db, "standard", "kept", 4, "10 days");
    insert_aged(&db, "retired", "old", 1, "4 days");

    let (code, stdout, stderr) =
        run_hookbox(&["purge", "--config", &config_path, "--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    for line in [
        "would remove 5 from stripe",
        "would remove 3 from github",
        "would remove 1 from retired",
        "would remove 9 in total",
    ] {
        assert!(stdout.contains(line), "{line} in {stdout}");
    }
    assert!(
        stdout.contains("would remove 0 from standard"),
        "standard keeps 30 days, and says so: {stdout}"
    );
    assert_eq!(db.count("events"), 15, "a dry run deletes nothing");

    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 9 in total"), "{stdout}");
    assert_eq!(db.count("events"), 6);
    assert_eq!(db.count("events WHERE event_id LIKE 'old_%'"), 0);
    assert_eq!(
        db.count("events WHERE event_id LIKE 'new_%' OR event_id LIKE 'kept_%'"),
        6
    );

    let (code, stdout, stderr) = run_hookbox(
        &["purge", "--config", &config_path, "--older-than", "5d"],
        &[],
    );
    assert_eq!(code, 0);
    assert!(stdout.contains("removed 4 from standard"), "{stdout}");
    // Shorter than standard's 30 days: a running serve may still answer those as replays.
    assert!(
        stderr.contains("shorter than a source's retention window")
            && stderr.contains("restart serve"),
        "{stderr}"
    );
    assert_eq!(db.count("events"), 2);
}

/// A command's printing to a stdout or stderr that is full (`> /dev/full`) or closed early
/// (`| head`) is lost; the work is done and the exit code says how it went, never 101.
#[test]
fn purge_and_export_end_by_their_work_when_their_output_cannot_be_written() {
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    insert_aged(&db, "stripe", "old", 3, "4 days");
    let run = |args: &[&str], stdout: std::fs::File, stderr: std::fs::File| {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("HOOKBOX_CONFIG")
            .stdout(stdout)
            .stderr(stderr)
            .status()
            .expect("hookbox runs")
            .code()
    };
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full")
    };
    let null = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null")
    };
    let export = TempFile::with_extension(b"", "ndjson");
    let out = export.path();
    for (args, stdout, stderr, code) in [
        (
            vec!["purge", "--config", &config_path, "--dry-run"],
            full(),
            full(),
            0,
        ),
        (
            vec!["export", "--config", &config_path, "--out", &out],
            null(),
            full(),
            0,
        ),
        // The capture itself cannot be written: that is the export failing.
        (vec!["export", "--config", &config_path], full(), full(), 1),
        (vec!["migrate", "--config", &config_path], full(), full(), 0),
        (vec!["purge", "--config", &config_path], full(), full(), 0),
    ] {
        assert_eq!(run(&args, stdout, stderr), Some(code), "{args:?}");
    }
    assert_eq!(
        std::fs::read_to_string(export.path())
            .expect("written")
            .lines()
            .count(),
        3
    );
    assert_eq!(db.count("events"), 0, "the purge was done");
}

#[test]
fn purge_says_how_many_forward_deliveries_still_pending_go_with_their_events() {
    use diesel::RunQueryDsl;
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    insert_aged(&db, "stripe", "old", 5, "4 days");
    // Each old event queued for one target; two of them delivered, three still pending (a
    // downstream failing for longer than the window).
    for sql in [
        "INSERT INTO deliveries (event_row, target, source, received_at, queued_at) \
         SELECT id, 'default', source, received_at, received_at FROM events",
        "UPDATE deliveries SET state = 'delivered' WHERE event_row IN \
         (SELECT id FROM events WHERE event_id IN ('old_1', 'old_2'))",
    ] {
        diesel::sql_query(sql)
            .execute(&mut db.connect())
            .expect("outbox rows");
    }

    let (code, stdout, stderr) =
        run_hookbox(&["purge", "--config", &config_path, "--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("3 forward deliveries of those events are still pending and would go"),
        "{stdout}"
    );
    assert_eq!(db.count("deliveries"), 5, "a dry run deletes nothing");

    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 5 in total"), "{stdout}");
    assert!(
        stdout.contains("3 forward deliveries of those events were still pending and went"),
        "{stdout}"
    );
    assert!(
        stderr.contains("WARN") && stderr.contains("pending_forwards=3"),
        "the pass's log says so too: {stderr}"
    );

    // One is said as one.
    insert_aged(&db, "stripe", "older", 1, "4 days");
    diesel::sql_query(
        "INSERT INTO deliveries (event_row, target, source, received_at, queued_at) \
         SELECT id, 'default', source, received_at, received_at FROM events",
    )
    .execute(&mut db.connect())
    .expect("an outbox row");
    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "1 forward delivery of those events was still pending and went with its event"
        ),
        "{stdout}"
    );
    assert_eq!(db.count("deliveries"), 0);

    // Nothing pending, nothing said.
    insert_aged(&db, "stripe", "later", 1, "4 days");
    let (code, stdout, _) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("forward deliver"), "{stdout}");
}

#[test]
fn purge_leaves_an_event_whose_forward_attempt_is_under_way_for_the_next_pass() {
    use diesel::RunQueryDsl;
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    insert_aged(&db, "stripe", "old", 3, "4 days");
    // All queued; old_1's attempt under way (leased for an hour more). Deleting its row took
    // the lease an ordered target's other instances wait on, and one of them started the next
    // event while this attempt was in flight. old_3's too, as a claim hands a row straight to
    // its dispatcher: leased to an instance, due when the lease ends, `leased_until` unset (a
    // black-box run saw such events purged while the sink held their attempt).
    let leased_until = if store_is_sqlite() {
        format!(
            "'{}'",
            (chrono::Utc::now() + chrono::Duration::hours(1)).format("%Y-%m-%d %H:%M:%S%.6f+00:00")
        )
    } else {
        "now() + interval '1 hour'".to_owned()
    };
    for sql in [
        "INSERT INTO deliveries (event_row, target, source, received_at, queued_at) \
         SELECT id, 'default', source, received_at, received_at FROM events"
            .to_owned(),
        format!(
            "UPDATE deliveries SET leased_until = {leased_until}, attempts = 1 WHERE event_row IN \
             (SELECT id FROM events WHERE event_id = 'old_1')"
        ),
        format!(
            "UPDATE deliveries SET next_attempt_at = {leased_until}, leased_by = 7, attempts = 1 \
             WHERE event_row IN (SELECT id FROM events WHERE event_id = 'old_3')"
        ),
    ] {
        diesel::sql_query(sql)
            .execute(&mut db.connect())
            .expect("outbox rows");
    }
    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 1 in total"), "{stdout}");
    assert_eq!(
        db.count("events WHERE event_id IN ('old_1', 'old_3')"),
        2,
        "the events whose attempts are under way stay"
    );
    assert_eq!(
        db.count("deliveries"),
        2,
        "and their rows with their leases"
    );

    // Their outcomes written, the next pass takes them.
    diesel::sql_query("UPDATE deliveries SET state = 'delivered'")
        .execute(&mut db.connect())
        .expect("the outcome");
    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 2 in total"), "{stdout}");
    assert_eq!(db.count("events"), 0);
    assert_eq!(db.count("deliveries"), 0);
}

#[test]
fn purge_cuts_on_the_database_s_clock_not_a_host_clock_ahead_of_it() {
    if skip_on_sqlite(
        "purge_cuts_on_the_database_s_clock_not_a_host_clock_ahead_of_it",
        "the file and every process sharing it are on one host's clock",
    ) {
        return;
    }
    let faketime = libfaketime();
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    // Received 15 s ago, by the database's clock (as every instance writes received times).
    insert_aged(&db, "stripe", "recent", 1, "15 seconds");
    // `purge` on a host whose clock is 30 s ahead: its window of 40 s cut at 10 s ago by its
    // own clock, and the event, still within its window, went (a provider's retry of it was
    // then processed a second time).
    let (code, stdout, stderr) = run_hookbox(
        &["purge", "--config", &config_path, "--older-than", "40s"],
        &[
            ("LD_PRELOAD", faketime),
            ("FAKETIME", "+30s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("FAKETIME_NO_CACHE", "1"),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 0 in total"), "{stdout}");
    assert_eq!(
        db.count("events"),
        1,
        "within its window by the database's clock"
    );
}

#[test]
fn a_nonsense_older_than_is_exit_2_with_a_clear_message() {
    let (code, _, stderr) = run_hookbox(&["purge", "--older-than", "a while", "--dry-run"], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--older-than") && stderr.contains("invalid duration"),
        "{stderr}"
    );
}

#[test]
fn an_older_than_too_far_back_is_exit_2_naming_the_flag() {
    let dir = TempDir::new();
    let url = format!("sqlite://{}", dir.0.join("hookbox.db").display());
    let (code, _, stderr) = run_hookbox(
        &["purge", "--older-than", "10000y", "--dry-run"],
        &[("DATABASE_URL", &url)],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--older-than") && stderr.contains("too far in the past"),
        "{stderr}"
    );
}

#[actix_web::test]
async fn a_large_purge_runs_in_batches_while_deliveries_keep_being_answered() {
    // Enough rows that the purge takes a good while even on a fast disk, so "waited for the
    // whole purge" and "waited for one batch" are far apart.
    const EXPIRED: i64 = 300_000;
    let db = TestDb::create();
    let text = config_with_windows(&db.url, "1h", "1h");
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    // The server's own pass at startup must be over, or it and `hookbox purge` would take
    // turns at the lock (correctly) and the command would find nothing to do.
    poll_until("the startup purge pass is done", || async {
        !app.get("/metrics", None)
            .await
            .text()
            .contains("hookbox_last_purge_timestamp_seconds 0\n")
    })
    .await;
    insert_aged(&app.db, "stripe", "expired", EXPIRED as u32, "10 days");
    let config = TempFile::new(&text);
    let config_path = config.0.to_string_lossy().into_owned();

    // A watcher on its own connection: a batched purge commits as it goes, so the count of
    // expired rows is seen somewhere between all and none; one big DELETE would jump.
    let url = app.db.url.clone();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = std::thread::spawn({
        let done = done.clone();
        move || {
            let mut seen = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                seen.push(count_at(&url, "events WHERE event_id LIKE 'expired_%'"));
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        }
    });
    let started = Instant::now();
    let mut purge = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args(["purge", "--config", &config_path])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start hookbox purge");

    let mut latencies = Vec::new();
    while purge.try_wait().expect("poll purge").is_none() {
        let id = unique_id("evt");
        let sent = Instant::now();
        let answer = app
            .send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
            .await;
        latencies.push(sent.elapsed());
        assert_eq!(
            answer.status,
            200,
            "a delivery during the purge: {}",
            answer.text()
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the purge takes too long"
        );
    }
    let purge_took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = watcher.join().expect("the watcher");
    let output = purge.wait_with_output().expect("purge output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("removed {EXPIRED} from stripe")),
        "{stdout}"
    );
    assert_eq!(app.db.count("events WHERE event_id LIKE 'expired_%'"), 0);
    assert_eq!(
        app.db.count("events") as usize,
        latencies.len(),
        "every delivery is stored"
    );

    let between = seen.iter().filter(|n| **n > 0 && **n < EXPIRED).count();
    assert!(
        between >= 2,
        "the purge committed in batches: counts seen {seen:?}"
    );
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    assert!(
        latencies.len() >= 5,
        "deliveries kept flowing: {} in {purge_took:?}",
        latencies.len()
    );
    assert!(
        slowest < purge_took / 2,
        "no delivery waited for the whole purge: slowest {slowest:?} of {purge_took:?}"
    );
}

#[actix_web::test]
async fn two_servers_on_one_database_purge_without_racing_and_keep_serving() {
    let db = TestDb::create();
    let text = config_with_windows(&db.url, "1s", "200ms");
    let one = Process::serve(&text);
    let two = Process::serve(&text);
    insert_aged(&db, "github", "expired", 20_000, "1 day");
    let config = parse_config(&text);
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(3)
        || db.count("events WHERE event_id LIKE 'expired_%'") > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the expired rows were never purged"
        );
        let id = unique_id("evt");
        let address = if sent % 2 == 0 {
            &one.address
        } else {
            &two.address
        };
        let delivery = delivery_for(
            &config,
            "stripe",
            &stripe_event(&id, "a", 1),
            &id,
            unix_now(),
        );
        let answer = send(address, &delivery).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        sent += 1;
    }
    assert_eq!(db.count("events WHERE source = 'stripe'"), sent);
    let logs = format!("{}{}", one.log(), two.log());
    assert!(logs.contains("purge pass done"), "{logs}");
    for bad in ["purge pass failed", "ERROR", "panicked"] {
        assert!(!logs.contains(bad), "{bad} in the logs:\n{logs}");
    }
}

#[test]
fn a_window_shorter_than_the_providers_redelivery_horizon_is_warned_about_at_startup() {
    let db = TestDb::create();
    let short = config_text(&db.url, "").replace(
        "[sources.stripe]\nscheme = \"stripe\"\n",
        "[sources.stripe]\nscheme = \"stripe\"\nretention = \"1h\"\n",
    );
    let process = Process::serve(&short);
    let log = process.log();
    let warning = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("source stripe: retention 1h"))
        .unwrap_or_else(|| panic!("no warning for stripe in:\n{log}"));
    assert!(
        warning.contains("3 days") && warning.contains("sources.stripe.retention"),
        "{warning}"
    );
    drop(process);

    // Left at the defaults, no source warns: each keeps at least its provider's horizon
    // (Standard Webhooks' 76 hours, past the default 72h), even under a short global window.
    for extra in ["", "\n[retention]\nwindow = \"1h\"\n"] {
        let default = Process::serve(&config_text(&db.url, extra));
        let log = default.log();
        assert!(
            !log.contains("shorter than its provider's redelivery horizon"),
            "a source at the defaults warned ({extra:?}):\n{log}"
        );
        assert!(
            log.contains("retention=3days 4h")
                && log.contains("source live at POST /webhooks/standard"),
            "the standard source's window is not logged as 76h:\n{log}"
        );
        // A window lowered below the default does not shorten such a source's: it says so.
        let stretched = log.lines().find(|l| {
            l.contains("WARN")
                && l.contains(
                    "source stripe: keeps its events 3days, longer than retention.window 1h",
                )
        });
        assert_eq!(stretched.is_some(), !extra.is_empty(), "{extra:?}:\n{log}");
        if let Some(line) = stretched {
            assert!(line.contains("sources.stripe.retention"), "{line}");
        }
    }
}

#[test]
fn a_source_without_its_own_window_keeps_events_for_its_providers_horizon() {
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_text(&db.url, ""));
    // 74 hours: past the default 72h window, within Standard Webhooks' 76-hour horizon.
    insert_aged(&db, "standard", "kept", 2, "74 hours");
    insert_aged(&db, "stripe", "old", 3, "74 hours");
    insert_aged(&db, "standard", "old", 1, "77 hours");

    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 4 in total"), "{stdout}");
    assert_eq!(db.count("events WHERE event_id LIKE 'kept_%'"), 2);
    assert_eq!(db.count("events WHERE event_id LIKE 'old_%'"), 0);
}

/// A batch that removes fewer events than it picked does not end the pass while expired events
/// remain. On PostgreSQL a batch picks rows by ctid, so a row updated in the meantime (an old
/// event's replay count) is skipped; a trigger here skips a few rows of the first batch once,
/// the same way, on both stores.
#[test]
fn a_batch_that_skips_rows_does_not_end_the_pass() {
    use diesel::connection::SimpleConnection;
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    let batch = hookbox::retention::BATCH_SIZE as u32;
    insert_aged(&db, "stripe", "old", batch + 1000, "4 days");
    let spare_once = if store_is_sqlite() {
        "CREATE TABLE spared (event_id TEXT PRIMARY KEY);
         INSERT INTO spared SELECT 'old_' || value FROM json_each('[1,2,3,4,5,6,7,8,9,10]');
         CREATE TRIGGER spare_once BEFORE DELETE ON events
         WHEN OLD.event_id IN (SELECT event_id FROM spared)
         BEGIN DELETE FROM spared WHERE event_id = OLD.event_id; SELECT RAISE(IGNORE); END;"
    } else {
        "CREATE TABLE spared (event_id TEXT PRIMARY KEY);
         INSERT INTO spared SELECT 'old_' || g FROM generate_series(1, 10) g;
         CREATE FUNCTION spare_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             DELETE FROM spared WHERE event_id = OLD.event_id;
             IF FOUND THEN RETURN NULL; END IF;
             RETURN OLD;
         END $$;
         CREATE TRIGGER spare_once BEFORE DELETE ON events
         FOR EACH ROW EXECUTE FUNCTION spare_once();"
    };
    db.connect()
        .batch_execute(spare_once)
        .expect("install the trigger");

    let (code, stdout, stderr) = run_hookbox(&["purge", "--config", &config_path], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        db.count("spared"),
        0,
        "the first batch skipped the ten once"
    );
    assert!(
        stdout.contains(&format!("removed {} in total", batch + 1000)),
        "{stdout}"
    );
    assert_eq!(
        db.count("events"),
        0,
        "one pass removed every expired event"
    );
}

#[test]
fn ctrl_c_stops_a_purge_between_batches_and_it_prints_what_it_removed() {
    purge_stopped_by("-INT");
}

#[test]
fn sigterm_stops_a_purge_between_batches_as_ctrl_c_does() {
    purge_stopped_by("-TERM");
}

/// A purge of many expired events, sent `signal` once a batch or two are gone: it stops
/// between batches, exits 130 and prints what it removed.
fn purge_stopped_by(signal: &str) {
    const EXPIRED: i64 = 300_000;
    let db = TestDb::create();
    let text = config_with_windows(&db.url, "1h", "1h");
    let (_config, config_path) = migrated_config(&text);
    insert_aged(&db, "stripe", "expired", EXPIRED as u32, "10 days");
    let expired = "events WHERE event_id LIKE 'expired_%'";

    let purge = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args(["purge", "--config", &config_path])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start hookbox purge");
    // Interrupted once a batch or two are gone, well before the last.
    let started = Instant::now();
    while db.count(expired) == EXPIRED {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing purged"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = std::process::Command::new("kill")
        .args([signal, &purge.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let output = purge.wait_with_output().expect("purge output");

    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stdout}\n{stderr}");
    let left = db.count(expired);
    assert!(left > 0, "stopped before the end: {stdout}");
    let removed = EXPIRED - left;
    assert!(
        stdout.contains(&format!("removed {removed} from stripe"))
            && stdout.contains(&format!("removed {removed} in total"))
            && stdout.contains("interrupted"),
        "{stdout}"
    );
}

/// On PostgreSQL (`None` on SQLite, whose one writer makes a held write lock another wait):
/// a database with three expired events, one of them held by another session's open
/// transaction, and `hookbox purge --older-than 1d` started on it and saying that its batch
/// waits. `then` gets the database and the purge while the row is held; the hold ends after it.
fn purge_held_by_a_locked_row<T>(then: impl FnOnce(&TestDb, Watched) -> T) -> Option<(TestDb, T)> {
    use diesel::{Connection, RunQueryDsl};
    if store_is_sqlite() {
        return None;
    }
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    insert_aged(&db, "stripe", "old", 3, "4 days");
    let mut holder = db.connect();
    let done = holder
        .transaction(|holder| {
            diesel::sql_query("SELECT id FROM events WHERE event_id = 'old_1' FOR UPDATE")
                .execute(holder)?;
            let purge = Watched::start(
                &["purge", "--config", &config_path, "--older-than", "1d"],
                &[],
            );
            purge.says("the batch under way has taken");
            Ok::<_, diesel::result::Error>(then(&db, purge))
        })
        .expect("the holder's transaction ends");
    Some((db, done))
}

#[test]
fn a_purge_batch_kept_waiting_by_a_locked_row_says_so_while_it_waits() {
    // Let go once it said so: the pass goes on and ends.
    let Some((db, purge)) = purge_held_by_a_locked_row(|_, purge| purge) else {
        return;
    };
    assert!(purge.succeeded());
    assert_eq!(db.count("events WHERE event_id LIKE 'old_%'"), 0);
}

/// A purge stopped by SIGTERM while its batch cannot end (a row held elsewhere here; a
/// database that stopped answering is the same to it) quits after a bounded wait instead of
/// waiting with it (a black-box run's purge never ended on one SIGTERM).
#[test]
fn a_purge_stopped_while_its_batch_cannot_end_quits_after_a_bounded_wait() {
    let Some((db, ())) = purge_held_by_a_locked_row(|_, purge| {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &purge.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        // Still held: the purge gives the batch up on its own, and says what it removed.
        let (code, stderr, stdout) = purge.ended();
        assert_eq!(code, Some(130), "{stderr}");
        assert!(
            stderr.contains("did not end within 10 s of the signal"),
            "{stderr}"
        );
        assert!(
            stdout.contains("removed 0 from stripe")
                && stdout.contains("removed 0 in total; interrupted"),
            "{stdout}"
        );
    }) else {
        return;
    };
    assert_eq!(
        db.count("events WHERE event_id LIKE 'old_%'"),
        3,
        "the batch rolled back"
    );
}

/// A purge whose connection is lost part way (its session ended: a restart, a failover) says
/// so and what to do, not only the driver's words (a black-box run got a bare `SSL error:
/// unexpected eof while reading`).
#[test]
fn a_purge_whose_connection_is_lost_part_way_says_so_and_to_run_it_again() {
    purge_held_by_a_locked_row(|db, purge| {
        let ended = db.count(
            "(SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock') AS cut",
        );
        assert_eq!(ended, 1, "the purge's session");
        let (code, stderr, _) = purge.ended();
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("was lost part way")
                && stderr.contains("run purge again once the database answers"),
            "{stderr}"
        );
        // hookbox's sentence first and on one line: libpq's own text ran over three lines
        // before it, the last two indented with tabs.
        let said = stderr
            .lines()
            .find(|l| l.contains("was lost part way"))
            .expect("the line");
        assert!(said.contains("run purge again"), "{stderr}");
        assert!(
            !stderr.lines().any(|l| l.starts_with('\t')),
            "no line of libpq's own: {stderr}"
        );
        assert!(
            stderr.find("was lost part way") < stderr.find("the database's client said"),
            "{stderr}"
        );
    });
}

#[test]
fn a_purge_on_sqlite_waits_for_another_process_write_rather_than_failing() {
    use diesel::connection::SimpleConnection;
    if !store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    let (_config, config_path) = migrated_config(&config_with_windows(&db.url, "1h", "10m"));
    insert_aged(&db, "stripe", "old", 3, "4 days");
    // serve (another process) holds the one write lock, past a delivery's 5 s busy wait.
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN IMMEDIATE")
        .expect("the write lock is taken");
    let purge = Watched::start(
        &["purge", "--config", &config_path, "--older-than", "1d"],
        &[],
    );
    purge.says("the batch under way has taken 6 s (the SQLite file's write lock is held");
    holder
        .batch_execute("ROLLBACK")
        .expect("the lock is let go");
    assert!(purge.succeeded(), "it waited rather than failing the pass");
    assert_eq!(db.count("events WHERE event_id LIKE 'old_%'"), 0);
}
