//! `hookbox export`: stored deliveries as a capture, filtered by source and time, every body
//! byte for byte, and only the scheme's headers and content-type.

use base64::Engine;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::helpers::*;

/// A delivery as the test sent it, and what its capture line must say.
struct Sent {
    source: &'static str,
    event_id: String,
    expected: Value,
}

fn time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"))
        .with_timezone(&Utc)
}

/// The capture's lines, each parsed, with `received_at` checked to be RFC 3339 and put in one
/// spelling so lines compare whole.
fn parse_capture(text: &str) -> Vec<Value> {
    text.lines()
        .map(|line| {
            let mut value: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            let received_at = time(value["received_at"].as_str().expect("received_at"));
            value["received_at"] = received_at.to_rfc3339().into();
            value
        })
        .collect()
}

async fn export(config: &TempFile, filters: &[&str]) -> Vec<Value> {
    let path = config.path();
    let mut args = vec!["export", "--config", &path];
    args.extend_from_slice(filters);
    let (code, stdout, stderr) = run_hookbox_async(&args).await;
    assert_eq!(code, 0, "{stderr}");
    parse_capture(&stdout)
}

fn ids(lines: &[Value]) -> Vec<&str> {
    lines
        .iter()
        .map(|l| l["event_id"].as_str().expect("event_id"))
        .collect()
}

#[actix_web::test]
async fn export_filters_by_source_and_time_and_keeps_bodies_byte_for_byte_without_credentials() {
    let app = TestApp::spawn().await;
    let config = TempFile::new(&config_text(&app.db.url, ""));
    // Bodies a re-serialization would change: odd spacing, escapes, non-ASCII, a trailing
    // newline; and, for github (whose id is in a header), one that is not UTF-8 at all.
    let stripe_body = |id: &str| {
        format!("{}\n", stripe_event(id, "charge.succeeded", 1)).replace(
            "\"usd\"",
            "\"usd\" ,\t\"note\": \"caf\u{e9} \\u00e9 \\\"q\\\"\"",
        )
    };
    let github_bodies: [Vec<u8>; 2] = [
        b"{ \"action\" :\"opened\",\n\t\"number\": 7 }".to_vec(),
        vec![0xff, 0xfe, b'{', 0x00, b'}', b'\n'],
    ];
    let plan: [(&'static str, usize); 5] = [
        ("stripe", 0),
        ("stripe", 1),
        ("github", 0),
        ("stripe", 2),
        ("github", 1),
    ];
    let mut sent = Vec::new();
    for (index, (source, n)) in plan.into_iter().enumerate() {
        let event_id = unique_id(if source == "stripe" { "evt" } else { "dlv" });
        let body = match source {
            "stripe" => stripe_body(&event_id).into_bytes(),
            _ => github_bodies[n].clone(),
        };
        let mut delivery = delivery_of_bytes(&app.config, source, &body, &event_id, unix_now());
        if index == 0 {
            delivery = delivery
                .with_header("Authorization", "Bearer leaked-token")
                .with_header("Cookie", "session=leaked-cookie");
        }
        let answer = app.send(&delivery).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let stored = app
            .get(
                &format!("/admin/events/{source}/{event_id}"),
                Some(ADMIN_TOKEN),
            )
            .await
            .json();
        let kept: &[&str] = match source {
            "stripe" => &["stripe-signature"],
            _ => &["x-hub-signature-256", "x-github-delivery", "x-github-event"],
        };
        let mut headers = serde_json::Map::new();
        for name in kept.iter().chain(&["content-type"]) {
            headers.insert((*name).to_owned(), delivery.header(name).into());
        }
        let mut expected = json!({
            "source": source,
            "event_id": event_id,
            "event_type": if source == "stripe" { "charge.succeeded" } else { "test.event" },
            "received_at": time(stored["received_at"].as_str().expect("received_at")).to_rfc3339(),
            "headers": headers,
        });
        match String::from_utf8(body.clone()) {
            Ok(text) => expected["body"] = text.into(),
            Err(_) => {
                expected["body_base64"] = base64::engine::general_purpose::STANDARD
                    .encode(&body)
                    .into()
            }
        }
        sent.push(Sent {
            source,
            event_id,
            expected,
        });
    }
    let received_at = |i: usize| sent[i].expected["received_at"].as_str().expect("set above");

    let everything = export(&config, &[]).await;
    let expected: Vec<&Value> = sent.iter().map(|s| &s.expected).collect();
    assert_eq!(
        everything.iter().collect::<Vec<_>>(),
        expected,
        "in received order"
    );
    let text = everything
        .iter()
        .map(Value::to_string)
        .collect::<String>()
        .to_lowercase();
    assert!(!text.contains("authorization") && !text.contains("cookie"));
    assert!(!text.contains("leaked"));

    // --since is inclusive, --until exclusive; each filters on the received time.
    let stripe_since_second =
        export(&config, &["--source", "stripe", "--since", received_at(1)]).await;
    assert_eq!(
        ids(&stripe_since_second),
        [&sent[1].event_id, &sent[3].event_id]
    );
    let until_last = export(&config, &["--until", received_at(4)]).await;
    assert_eq!(until_last.len(), 4);
    assert_eq!(until_last[..], everything[..4]);
    let between = export(
        &config,
        &["--since", received_at(1), "--until", received_at(3)],
    )
    .await;
    assert_eq!(ids(&between), [&sent[1].event_id, &sent[2].event_id]);
    // A duration means that long ago.
    assert_eq!(export(&config, &["--since", "1h"]).await.len(), 5);
    assert!(export(&config, &["--until", "1h"]).await.is_empty());

    // --out writes the same lines to a file, and stderr says how many.
    let out = TempFile::with_extension(b"", "ndjson");
    let (code, stdout, stderr) = run_hookbox_async(&[
        "export",
        "--config",
        &config.path(),
        "--source",
        "github",
        "--out",
        &out.path(),
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("exported 2 event(s)"), "{stderr}");
    let github: Vec<&Value> = sent
        .iter()
        .filter(|s| s.source == "github")
        .map(|s| &s.expected)
        .collect();
    assert_eq!(
        parse_capture(&out.read()).iter().collect::<Vec<_>>(),
        github
    );
}

#[test]
fn export_refuses_a_bad_time_with_exit_2() {
    let (code, _, stderr) = run_hookbox(&["export", "--since", "last tuesday"], &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
    // A window that holds nothing is a mistake (the two swapped), not an empty export.
    for window in [
        ["--since", "1h", "--until", "2h"],
        ["--since", "2026-12-02", "--until", "2026-12-02"],
    ] {
        let args: Vec<&str> = ["export"].into_iter().chain(window).collect();
        let (code, stdout, stderr) = run_hookbox(&args, &[]);
        assert_eq!(code, 2, "{window:?}: {stderr}");
        assert!(stderr.contains("is not before --until"), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
    }
}

#[test]
fn export_from_a_database_with_no_hookbox_tables_says_what_to_check() {
    // A database that was never migrated (not the one serve uses, say).
    let db = TestDb::create();
    if let Some(file) = &db.sqlite_file {
        std::fs::write(file, b"").expect("an empty SQLite file");
    }
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("no hookbox tables") && stderr.contains("hookbox migrate"),
        "{stderr}"
    );
}

#[test]
fn export_pages_through_more_than_a_batch_in_received_order_with_ties_broken_by_row() {
    let db = TestDb::create();
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    // 1201 events in three runs of 400 that share a received time, stored newest run first:
    // the export crosses batches inside runs of equal times.
    let total = 1201;
    let newest: chrono::DateTime<chrono::Utc> = "2026-12-01T00:00:00Z".parse().expect("a time");
    let rows: Vec<RawEvent> = (0..total)
        .map(|i| RawEvent {
            source: "stripe".to_owned(),
            event_id: format!("evt_{i}"),
            received_at: newest - chrono::Duration::seconds((i / 400) as i64),
            payload: format!("{{\"id\":\"evt_{i}\"}}").into_bytes(),
        })
        .collect();
    insert_events(&db.url, &rows);
    let config = TempFile::new(&format!("[database]\nurl = \"{}\"\n", db.url));

    let (code, stdout, stderr) = run_hookbox(&["export", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    let got: Vec<String> = parse_capture(&stdout)
        .iter()
        .map(|line| line["event_id"].as_str().expect("event_id").to_owned())
        .collect();
    let mut expected: Vec<usize> = (0..total).collect();
    expected.sort_by_key(|i| (std::cmp::Reverse(i / 400), *i));
    let expected: Vec<String> = expected.iter().map(|i| format!("evt_{i}")).collect();
    assert_eq!(got.len(), total, "every event once");
    assert_eq!(got, expected);
    assert!(
        stderr.contains(&format!("exported {total} event(s)")),
        "{stderr}"
    );
}

/// Times stored in another spelling than hookbox writes (on SQLite, text: `.100000` where it
/// writes `.100`, as another tool may have stored them) are paged through once each: pages
/// started after the last time as hookbox spelt it, which sorted before the stored text, so
/// rows were read again, and 500 at one such time made an export that never ended (a
/// black-box run: 25 GB in 10 minutes).
#[test]
fn export_pages_through_times_stored_in_another_spelling_once_each() {
    let (db, config) = stored_events(1300);
    for (rows, at) in [
        ("id <= 450", "2026-12-01 12:00:00.100000+00:00"),
        (
            "id > 450 AND id <= 1000",
            "2026-12-01 12:00:01.000000+00:00",
        ),
        ("id > 1000", "2026-12-01 12:00:01.500+00:00"),
    ] {
        diesel::RunQueryDsl::execute(
            diesel::sql_query(format!(
                "UPDATE events SET received_at = '{at}' WHERE {rows}"
            )),
            &mut db.connect(),
        )
        .expect("another spelling of the time");
    }
    let (code, stdout, stderr) = run_hookbox(&["export", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    let lines = parse_capture(&stdout);
    let got = ids(&lines);
    let mut once = got.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!((got.len(), once.len()), (1300, 1300), "every event once");
    let times: Vec<DateTime<Utc>> = lines
        .iter()
        .map(|line| time(line["received_at"].as_str().expect("a time")))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "oldest first");
}

/// An export the database keeps waiting (a read held behind a lock here; a stalled connection
/// is the same to it) says so every few seconds instead of going quiet, then finishes.
#[test]
fn an_export_the_database_keeps_waiting_says_so_and_finishes_once_it_answers() {
    if skip_on_sqlite(
        "an_export_the_database_keeps_waiting_says_so_and_finishes_once_it_answers",
        "an SQLite reader is never held behind a writer",
    ) {
        return;
    }
    let (db, config) = stored_events(3);
    let lock = HeldTableLock::take(&db.url, "events", "ACCESS EXCLUSIVE");
    let out = TempFile::with_extension(b"", "ndjson");
    let export = Watched::start(
        &["export", "--config", &config.path(), "--out", &out.path()],
        &[],
    );
    export.says("waiting 5 s for the database to answer");
    drop(lock);
    assert!(export.succeeded());
    assert_eq!(
        std::fs::read_to_string(out.path())
            .expect("the capture")
            .lines()
            .count(),
        3
    );
}

/// An export whose session is ended before it read anything (an administrator, a failover)
/// says nothing was exported and what to do, to a file and to stdout alike.
#[test]
fn an_export_whose_database_goes_before_its_first_event_says_nothing_was_exported() {
    if skip_on_sqlite(
        "an_export_whose_database_goes_before_its_first_event_says_nothing_was_exported",
        "an embedded store has no connection to cut",
    ) {
        return;
    }
    let (db, config) = stored_events(3);
    let out = TempFile::with_extension(b"the capture before\n", "ndjson");
    for to_file in [true, false] {
        let lock = HeldTableLock::take(&db.url, "events", "ACCESS EXCLUSIVE");
        let (config_path, path) = (config.path(), out.path());
        let mut args = vec!["export", "--config", &config_path];
        if to_file {
            args.extend(["--out", &path]);
        }
        let export = Watched::start(&args, &[]);
        // The export's read waits behind the lock; its session is then ended.
        let ended = (0..600).any(|_| {
            let cut = db.count(
                "(SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND pid <> pg_backend_pid()) AS cut",
            );
            if cut == 0 {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            cut == 1
        });
        assert!(ended, "the export's read never waited behind the lock");
        let (code, stderr, _) = export.ended();
        drop(lock);
        assert_eq!(code, Some(1), "{stderr}");
        let expected = if to_file {
            format!(
                "nothing was exported to {} (a file there is as it was); run it again once \
                 the database answers",
                out.path()
            )
        } else {
            "nothing was exported; run it again once the database answers".to_owned()
        };
        assert!(stderr.contains(&expected), "{stderr}");
    }
    assert_eq!(
        std::fs::read_to_string(out.path()).expect("the file"),
        "the capture before\n"
    );
}

/// A migrated test database holding `n` stripe events, and a config file naming it.
fn stored_events(n: usize) -> (TestDb, TempFile) {
    stored_events_at(&vec!["2026-12-01T00:00:00Z"; n])
}

/// A migrated test database holding a stripe event `evt_{i}` received at each of `times`, and
/// a config file naming it.
fn stored_events_at(times: &[&str]) -> (TestDb, TempFile) {
    let db = TestDb::create();
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<RawEvent> = times
        .iter()
        .enumerate()
        .map(|(i, at)| RawEvent {
            source: "stripe".to_owned(),
            event_id: format!("evt_{i}"),
            received_at: time(at),
            payload: format!("{{\"id\":\"evt_{i}\"}}").into_bytes(),
        })
        .collect();
    insert_events(&db.url, &rows);
    let config = TempFile::new(&format!("[database]\nurl = \"{}\"\n", db.url));
    (db, config)
}

/// A FIFO named `fifo` in `dir`.
fn fifo_in(dir: &TempDir) -> std::path::PathBuf {
    let fifo = dir.0.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    fifo
}

/// The names of what `dir` holds, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list the directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn export_out_never_writes_through_a_link_planted_at_a_partial_path() {
    let (_db, config) = stored_events(3);
    let dir = TempDir::new();
    let victim = dir.0.join("victim");
    std::fs::write(&victim, "precious").expect("write the victim");
    let out = dir.0.join("capture.ndjson");
    // The name a partial file had before, and a link at the target itself.
    let planted = dir.0.join("capture.ndjson.partial");
    std::os::unix::fs::symlink(&victim, &planted).expect("plant a link");

    let out_arg = out.to_string_lossy();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &out_arg],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&victim).expect("the victim"),
        "precious"
    );
    assert!(std::fs::symlink_metadata(&planted)
        .expect("the planted link")
        .file_type()
        .is_symlink());
    let written = std::fs::read_to_string(&out).expect("the capture");
    assert_eq!(ids(&parse_capture(&written)), ["evt_0", "evt_1", "evt_2"]);
    let left = names_in(&dir.0);
    assert_eq!(
        left,
        ["capture.ndjson", "capture.ndjson.partial", "victim"],
        "no partial file left behind"
    );
}

#[test]
fn export_out_writes_straight_through_a_fifo_and_a_link_to_stdout() {
    let (_db, config) = stored_events(2);
    let dir = TempDir::new();
    let fifo = fifo_in(&dir);
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read_to_string(fifo).expect("read the FIFO")
    });
    let fifo_arg = fifo.to_string_lossy();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &fifo_arg],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .expect("the FIFO")
            .file_type()
            .is_fifo(),
        "the FIFO is still a FIFO, not replaced by a file"
    );
    let read = reader.join().expect("the reader");
    assert_eq!(ids(&parse_capture(&read)), ["evt_0", "evt_1"]);

    // A link to /dev/stdout, so that nothing outside the test's directory is at stake.
    let stdout_link = dir.0.join("stdout");
    std::os::unix::fs::symlink("/dev/stdout", &stdout_link).expect("link to stdout");
    let link_arg = stdout_link.to_string_lossy();
    let (code, stdout, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &link_arg],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ids(&parse_capture(&stdout)), ["evt_0", "evt_1"]);
    assert!(std::fs::symlink_metadata(&stdout_link)
        .expect("the link")
        .file_type()
        .is_symlink());
}

#[test]
fn export_out_to_a_fifo_whose_reader_goes_away_says_so_and_how_far_it_got() {
    // More than a pipe holds (64 KB), so the export is still writing when the reader leaves.
    let (_db, config) = stored_events(1500);
    let dir = TempDir::new();
    let fifo = fifo_in(&dir);
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || {
            use std::io::Read;
            let mut first = [0u8; 16];
            std::fs::File::open(fifo)
                .expect("open the FIFO")
                .read_exact(&mut first)
                .expect("a first line begins");
        }
    });
    let fifo_arg = fifo.to_string_lossy();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &fifo_arg],
        &[],
    );
    reader.join().expect("the reader");
    assert_eq!(code, 1, "a capture cut short is a failure: {stderr}");
    assert!(
        stderr.contains(&format!("the reader of {fifo_arg} closed it after"))
            && stderr.contains("whole line(s)")
            && !stderr.contains("database"),
        "{stderr}"
    );
}

#[test]
fn export_takes_dates_and_zoneless_times_as_utc_like_the_console() {
    let (_db, config) = stored_events_at(&[
        "2026-12-01T23:59:59Z",
        "2026-12-02T00:00:00Z",
        "2026-12-02T09:00:00Z",
        "2026-12-03T00:00:00Z",
    ]);
    for (since, until, expected) in [
        ("2026-12-02", "2026-12-03", vec!["evt_1", "evt_2"]),
        ("2026-12-02 09:00", "2026-12-04", vec!["evt_2", "evt_3"]),
        ("2026-12-01T23:59:59", "2026-12-02T00:00", vec!["evt_0"]),
    ] {
        let (code, stdout, stderr) = run_hookbox(
            &[
                "export",
                "--config",
                &config.path(),
                "--since",
                since,
                "--until",
                until,
            ],
            &[],
        );
        assert_eq!(code, 0, "{since}..{until}: {stderr}");
        assert_eq!(ids(&parse_capture(&stdout)), expected, "{since}..{until}");
    }
}

#[test]
fn export_of_a_source_neither_configured_nor_stored_says_so_and_a_removed_one_still_exports() {
    let (_db, config) = stored_events(2);
    // The config names no source; the two events are a stripe source's, since removed.
    let (code, stdout, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--source", "stripe"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(parse_capture(&stdout).len(), 2);
    assert!(!stderr.contains("no source named"), "{stderr}");

    let (code, stdout, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--source", "strpe"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout, "");
    assert!(
        stderr.contains("exported 0 event(s)")
            && stderr.contains("no source named \"strpe\" is configured")
            && stderr.contains("--source"),
        "{stderr}"
    );
}

#[test]
fn export_out_to_a_place_it_cannot_write_exits_2_naming_it_before_any_work() {
    let (_db, config) = stored_events(2);
    let dir = TempDir::new();
    let missing = dir.0.join("no-such-dir").join("capture.ndjson");
    let missing_arg = missing.to_string_lossy().into_owned();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &missing_arg],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("--out: cannot write {missing_arg}")),
        "named as given: {stderr}"
    );
    assert!(!stderr.contains(".partial"), "{stderr}");
    assert!(stderr.contains("nothing was exported"), "{stderr}");
    // A directory is no file to write: refused the same way, before any work.
    let dir_arg = dir.0.to_string_lossy().into_owned();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &dir_arg],
        &[],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("is a directory") && stderr.contains("nothing was exported"),
        "{stderr}"
    );
    // A directory that can be written leaves no probe behind.
    let out = dir.0.join("capture.ndjson");
    let out_arg = out.to_string_lossy().into_owned();
    let (code, _, stderr) = run_hookbox(
        &["export", "--config", &config.path(), "--out", &out_arg],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(names_in(&dir.0), ["capture.ndjson"]);
}

#[test]
fn export_and_purge_with_older_than_need_no_source_secret_but_purge_by_window_does() {
    // An ops box or a cron job holds the database URL, not every webhook secret.
    let (db, _) = stored_events(2);
    let unset = "HOOKBOX_TEST_SECRET_NOT_ON_THIS_BOX";
    let config = TempFile::new(&format!(
        "[database]\nurl = \"{}\"\n[sources.stripe]\nscheme = \"stripe\"\nsecrets_env = \"{unset}\"\n",
        db.url
    ));
    let (code, stdout, stderr) = run_hookbox(&["export", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ids(&parse_capture(&stdout)), ["evt_0", "evt_1"]);

    let (code, _, stderr) = run_hookbox(&["purge", "--config", &config.path(), "--dry-run"], &[]);
    assert_eq!(code, 2, "each source's window is in [sources]: {stderr}");
    assert!(
        stderr.contains(unset) && stderr.contains("--older-than"),
        "says which variable, and the way round it: {stderr}"
    );
    let (code, stdout, stderr) = run_hookbox(
        &["purge", "--config", &config.path(), "--older-than", "0s"],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("removed 2 in total"), "{stdout}");
    assert_eq!(db.count("events"), 0);
}

#[test]
fn export_and_purge_with_no_store_there_say_where_they_looked_and_make_no_file() {
    // No config file, no DATABASE_URL: the default SQLite file, which is not there.
    let dir = TempDir::new();
    for (args, nothing) in [
        (&["export"][..], "nothing to export"),
        (&["purge", "--dry-run"][..], "nothing to purge"),
    ] {
        let (code, _, stderr) = run_hookbox_in(args, &[], Some(&dir.0));
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("no SQLite store at hookbox.db")
                && stderr.contains("the default")
                && stderr.contains(nothing),
            "{args:?}: {stderr}"
        );
        assert!(
            !dir.0.join("hookbox.db").exists(),
            "{args:?}: an empty store was made"
        );
    }
}

#[actix_web::test]
async fn an_id_header_beyond_ascii_is_kept_so_export_and_replay_as_is_carry_it() {
    // GitHub's delivery id travels in a header; one with letters beyond ASCII (UTF-8) is the
    // id the event is stored under, so the capture must carry it for an as-is replay.
    let app = TestApp::spawn().await;
    let id = format!("café_{}", unique_id("gh"));
    let body = r#"{"zen":"non-ascii ids"}"#;
    send_github_as(&app, &id, body).await;

    let config = TempFile::new(&config_text(&app.db.url, ""));
    let lines = export(&config, &["--source", "github"]).await;
    assert_eq!(ids(&lines), [id.as_str()]);
    assert_eq!(
        lines[0]["headers"]["x-github-delivery"],
        id.as_str(),
        "{}",
        lines[0]
    );

    let other = TestApp::spawn().await;
    let capture = TempFile::with_extension(format!("{}\n", lines[0]).as_bytes(), "ndjson");
    let (code, out, err) =
        run_hookbox_async(&["replay", &capture.path(), "--as-is", "--to", &other.address]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(other.db.count("events"), 1);
}

#[test]
fn an_export_out_stopped_by_ctrl_c_or_sigterm_leaves_no_partial_file_and_the_old_capture() {
    if skip_on_sqlite(
        "an_export_out_stopped_by_ctrl_c_or_sigterm_leaves_no_partial_file_and_the_old_capture",
        "the export is held mid-way by a table lock, which SQLite has not",
    ) {
        return;
    }
    let (db, config) = stored_events(3);
    let dir = TempDir::new();
    let out = dir.0.join("capture.ndjson");
    for signal in ["-INT", "-TERM"] {
        std::fs::write(&out, "the capture before\n").expect("an old capture");
        // The export's read waits behind the lock, its partial file made.
        let lock = HeldTableLock::take(&db.url, "events", "ACCESS EXCLUSIVE");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
            .args(["export", "--config", &config.path(), "--out"])
            .arg(&out)
            .env_remove("DATABASE_URL")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start hookbox export");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while db.count(
            "pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' \
             AND query LIKE '%events%'",
        ) == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the export never waited"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            names_in(&dir.0)
                .iter()
                .any(|name| name.ends_with(".partial")),
            "{:?}",
            names_in(&dir.0)
        );
        let sent = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
        let output = child.wait_with_output().expect("export ends");
        drop(lock);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "{signal}: {stderr}");
        assert!(
            stderr.contains("nothing was written to"),
            "{signal}: {stderr}"
        );
        assert_eq!(names_in(&dir.0), ["capture.ndjson"], "{signal}");
        assert_eq!(
            std::fs::read_to_string(&out).expect("the capture"),
            "the capture before\n"
        );
    }
}

#[test]
fn an_export_out_over_a_private_capture_keeps_it_private_and_a_new_one_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_db, config) = stored_events(2);
    let dir = TempDir::new();
    // `export --out path`, then the mode of what it left there.
    let export_to = |path: &std::path::Path| {
        let (code, _, stderr) = run_hookbox(
            &[
                "export",
                "--config",
                &config.path(),
                "--out",
                &path.to_string_lossy(),
            ],
            &[],
        );
        assert_eq!(code, 0, "{stderr}");
        std::fs::metadata(path)
            .expect("the capture")
            .permissions()
            .mode()
    };
    // A new capture holds payloads and signatures: its owner's only.
    let mode = export_to(&dir.0.join("new.ndjson"));
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    let out = dir.0.join("capture.ndjson");
    std::fs::write(&out, "").expect("a capture");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mode = export_to(&out);
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert_eq!(
        std::fs::read_to_string(&out).expect("read").lines().count(),
        2
    );
}

/// A reader that stops reading (a full pipe) holds the export up; the progress line said it
/// was waiting for the database, which was idle (a black-box run).
#[test]
fn an_export_held_up_by_its_reader_says_so_not_that_the_database_is_slow() {
    let (_db, config) = stored_events(5_000);
    let mut export = Watched::start_unread(&["export", "--config", &config.path()], &[]);
    let waiting = export.says("waiting");
    export.read_stdout();
    let (code, rest, stdout) = export.ended();
    assert_eq!(code, Some(0), "{rest}");
    assert_eq!(stdout.lines().count(), 5_000);
    assert!(
        waiting.contains("for the reader of stdout to take more"),
        "{waiting}"
    );
}

#[test]
fn an_export_whose_reader_stops_early_ends_quietly() {
    // `hookbox export | head -1`: the reader's choice, not a failure of the export.
    let (_db, config) = stored_events(600);
    let (code, stderr) = run_into_a_closed_pipe(&["export", "--config", &config.path()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

/// `hookbox export` to a piped stdout, `interrupt`ed (given its process id) once its first line
/// is out: (exit code, the lines read from its stdout, its stderr). With `read_on`, stdout is
/// read on at once after; without, not until the process has ended (its reader "stopped
/// reading").
fn export_interrupted(
    config: &TempFile,
    interrupt: impl FnOnce(u32),
    read_on: bool,
) -> (Option<i32>, String, String) {
    use std::io::{BufRead, Read};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args(["export", "--config", &config.path()])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start hookbox export");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut read = String::new();
    stdout.read_line(&mut read).expect("the first line");
    interrupt(child.id());
    let code = if read_on {
        stdout.read_to_string(&mut read).expect("the rest");
        None
    } else {
        Some(child.wait().expect("export ends").code())
    };
    stdout.read_to_string(&mut read).expect("the rest");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let code = code.unwrap_or_else(|| child.wait().expect("export ends").code());
    (code, read, stderr)
}

/// [`export_interrupted`] by SIGTERM.
fn export_to_stdout_stopped(config: &TempFile, read_on: bool) -> (Option<i32>, String, String) {
    let sigterm = |pid: u32| {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
    };
    export_interrupted(config, sigterm, read_on)
}

#[test]
fn an_export_to_stdout_stopped_by_sigterm_ends_between_lines_and_says_how_many_went_out() {
    let (_db, config) = stored_events(20_000);
    // Read on: the export stops between two lines, and says how many.
    let (code, read, stderr) = export_to_stdout_stopped(&config, true);
    assert_eq!(code, Some(130), "{stderr}");
    let lines: Vec<&str> = read.lines().collect();
    assert!(lines.len() < 20_000, "it stopped early");
    assert!(read.ends_with('\n'));
    for line in &lines {
        serde_json::from_str::<serde_json::Value>(line).expect("each line whole");
    }
    assert!(
        stderr.contains(&format!(
            "export interrupted: {} whole line(s) went to stdout",
            lines.len()
        )),
        "{} lines read; {stderr}",
        lines.len()
    );

    // Its reader stopped reading. Caught in a write the reader holds up, it gives up waiting
    // for it and says the last line may be cut short; caught between two writes, it says how
    // many whole lines went out, as above.
    let (code, read, stderr) = export_to_stdout_stopped(&config, false);
    assert_eq!(code, Some(130), "{stderr}");
    let count_after = |text: &str| {
        stderr
            .split(text)
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
    };
    let lines: Vec<&str> = read.lines().collect();
    let said = match count_after("at least ") {
        Some(said) => said,
        None => {
            let said = count_after("interrupted: ").unwrap_or_else(|| panic!("{stderr}"));
            assert_eq!(lines.len(), said, "{stderr}");
            said
        }
    };
    assert!(
        lines.len() >= said && said > 0,
        "{said} said, {} read",
        lines.len()
    );
    for line in &lines[..said] {
        serde_json::from_str::<serde_json::Value>(line).expect("each line said whole is whole");
    }
}

#[test]
fn an_export_whose_database_goes_away_says_what_stdout_holds() {
    if skip_on_sqlite(
        "an_export_whose_database_goes_away_says_what_stdout_holds",
        "an embedded store has no connection to cut",
    ) {
        return;
    }
    let (db, config) = stored_events(20_000);
    // The export's session goes (an administrator, a failover) while it is part way.
    let cut = |_| {
        let cut = db.count(
            "(SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) AS cut",
        );
        assert_eq!(cut, 1, "the export's one session");
    };
    let (code, read, stderr) = export_interrupted(&config, cut, true);
    assert_eq!(code, Some(1), "{stderr}");
    let lines = read.lines().count();
    assert!(lines < 20_000, "it stopped part way");
    assert!(
        stderr.contains(&format!(
            "the export stopped after {lines} whole line(s) went to stdout"
        )) && stderr.contains("run it again"),
        "{lines} lines read: {stderr}"
    );
}

#[test]
fn an_export_out_through_a_link_writes_where_it_leads_and_a_stream_straight_through() {
    let (_db, config) = stored_events(3);
    let dir = TempDir::new();
    // A link to a capture: the capture is replaced whole, the link stays a link.
    let real = dir.0.join("real.ndjson");
    let link = dir.0.join("link.ndjson");
    std::fs::write(&real, "the capture before\n").expect("an old capture");
    std::os::unix::fs::symlink(&real, &link).expect("a link");
    let (code, _, stderr) = run_hookbox(
        &[
            "export",
            "--config",
            &config.path(),
            "--out",
            &link.to_string_lossy(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(std::fs::symlink_metadata(&link)
        .expect("the link")
        .file_type()
        .is_symlink());
    assert_eq!(
        std::fs::read_to_string(&real)
            .expect("real")
            .lines()
            .count(),
        3
    );
    // A link to a capture not made yet (through a second link, relative): made where it
    // leads, the links left as they are.
    let first = dir.0.join("first.ndjson");
    let second = dir.0.join("second.ndjson");
    std::os::unix::fs::symlink("second.ndjson", &first).expect("a link");
    std::os::unix::fs::symlink("new.ndjson", &second).expect("a link");
    let (code, _, stderr) = run_hookbox(
        &[
            "export",
            "--config",
            &config.path(),
            "--out",
            &first.to_string_lossy(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    for link in [&first, &second] {
        assert!(std::fs::symlink_metadata(link)
            .expect("the link")
            .file_type()
            .is_symlink());
    }
    assert_eq!(
        std::fs::read_to_string(dir.0.join("new.ndjson"))
            .expect("made where the links lead")
            .lines()
            .count(),
        3
    );
    // The same, named by a bare name in the working directory (its parent is "").
    std::os::unix::fs::symlink("bare-target.ndjson", dir.0.join("bare.ndjson")).expect("a link");
    let (code, _, stderr) = run_hookbox_in(
        &["export", "--config", &config.path(), "--out", "bare.ndjson"],
        &[],
        Some(&dir.0),
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.0.join("bare-target.ndjson"))
            .expect("made where the bare link leads")
            .lines()
            .count(),
        3
    );
    // Its own stdout, redirected to a file, named as a path under /proc: written straight
    // through, nothing renamed over it.
    let out = dir.0.join("stdout.ndjson");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args([
            "export",
            "--config",
            &config.path(),
            "--out",
            "/proc/self/fd/1",
        ])
        .env_remove("DATABASE_URL")
        .stdout(std::fs::File::create(&out).expect("a file for stdout"))
        .status()
        .expect("export runs");
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(&out).expect("out").lines().count(),
        3
    );
    let mut names = names_in(&dir.0);
    names.sort();
    assert_eq!(
        names,
        [
            "bare-target.ndjson",
            "bare.ndjson",
            "first.ndjson",
            "link.ndjson",
            "new.ndjson",
            "real.ndjson",
            "second.ndjson",
            "stdout.ndjson"
        ]
    );
}
