//! The store as `database.url` picks it: the SQLite file hookbox keeps when nothing is
//! configured, an in-memory store, and the README's quick start, run as written.

use crate::helpers::*;

/// A config with one Stripe source and no `[database]` at all.
fn config_without_database() -> String {
    "[server]\nlisten = \"127.0.0.1:0\"\n\n[sources.stripe]\nscheme = \"stripe\"\nsecrets = [\"whsec_test_secret\"]\n"
        .to_owned()
}

#[actix_web::test]
async fn with_no_database_configured_serve_keeps_events_in_hookbox_db_in_its_working_directory() {
    let dir = TempDir::new();
    let text = config_without_database();
    let config = parse_config(&text);
    let id = unique_id("evt");
    let body = stripe_event(&id, "payment_intent.succeeded", 1);

    let first = Process::serve_in(&text, &[], Some(&dir.0));
    let log = first.log();
    assert!(
        log.contains("no database configured") && log.contains("hookbox.db"),
        "the startup log says where events are kept:\n{log}"
    );
    let processed = send(
        &first.address,
        &delivery_for(&config, "stripe", &body, &id, unix_now()),
    )
    .await;
    assert_eq!(processed.status, 200, "{}", processed.text());
    assert!(!processed.replayed());
    // It holds payment payloads and whole signatures: its owner's only, as an export is, with
    // its write-ahead log and shared memory, whatever the umask.
    for name in ["hookbox.db", "hookbox.db-wal", "hookbox.db-shm"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.0.join(name))
            .unwrap_or_else(|e| panic!("{name} while serve runs: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} is {:o}", mode & 0o777);
    }
    drop(first);

    let file = dir.0.join("hookbox.db");
    assert!(file.exists(), "the store is ./hookbox.db");
    let url = format!("sqlite://{}", file.display());
    assert_eq!(count_at(&url, "events"), 1);

    // A new process on the same file answers the redelivery from what the first one stored.
    let second = Process::serve_in(&text, &[], Some(&dir.0));
    let redelivery = delivery_for(&config, "stripe", &body, &id, unix_now() - 5);
    let replayed = send(&second.address, &redelivery).await;
    assert!(replayed.replayed(), "{}", replayed.text());
    assert_eq!(
        (replayed.status, &replayed.body),
        (processed.status, &processed.body),
        "the same status and bytes"
    );
    assert_eq!(count_at(&url, "events"), 1);
}

#[actix_web::test]
async fn an_in_memory_store_processes_and_replays_and_the_commands_say_they_cannot_reach_it() {
    let text = config_without_database().replace(
        "[sources.stripe]",
        "[database]\nurl = \"sqlite::memory:\"\n\n[sources.stripe]",
    );
    let config = parse_config(&text);
    let server = Process::serve(&text);
    assert!(server.log().contains("in memory"), "{}", server.log());
    let id = unique_id("evt");
    let body = stripe_event(&id, "payment_intent.succeeded", 1);
    let first = send(
        &server.address,
        &delivery_for(&config, "stripe", &body, &id, unix_now()),
    )
    .await;
    let again = send(
        &server.address,
        &delivery_for(&config, "stripe", &body, &id, unix_now() - 1),
    )
    .await;
    assert_eq!(
        (first.status, first.replayed()),
        (200, false),
        "{}",
        first.text()
    );
    assert_eq!(
        (again.status, again.replayed()),
        (200, true),
        "{}",
        again.text()
    );
    assert_eq!(again.body, first.body);

    let file = TempFile::new(&text);
    let (code, _, stderr) = run_hookbox(&["export", "--config", &file.path()], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("sqlite::memory:"), "{stderr}");
}

#[test]
fn the_readmes_quick_start_processes_then_replays() {
    // As the README has it: `serve --config examples/hookbox.toml`, then the same `send` twice.
    // Only the port differs (HOOKBOX_LISTEN), so the test does not need 8080 free.
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = TempDir::new();
    let example = std::fs::read_to_string(format!("{root}/examples/hookbox.toml"))
        .expect("examples/hookbox.toml");
    let server = Process::serve_in(&example, &[("HOOKBOX_LISTEN", "127.0.0.1:0")], Some(&dir.0));
    assert!(
        dir.0.join("hookbox.db").exists(),
        "the example keeps ./hookbox.db"
    );
    let send = || {
        run_hookbox_in(
            &[
                "send",
                "--config",
                &format!("{root}/examples/hookbox.toml"),
                "--to",
                &server.address,
                "--source",
                "stripe",
                &format!("{root}/examples/event.json"),
            ],
            &[],
            Some(&dir.0),
        )
    };
    let (code, first, stderr) = send();
    assert_eq!(code, 0, "{first}{stderr}");
    assert!(first.contains("200 OK: processed"), "{first}");
    let (code, second, stderr) = send();
    assert_eq!(code, 0, "{second}{stderr}");
    assert!(second.contains("200 OK: replayed"), "{second}");
    let body = |out: &str| out.lines().last().unwrap_or_default().to_owned();
    assert_eq!(
        body(&first),
        body(&second),
        "the same answer, byte for byte"
    );
}

#[test]
fn a_store_file_in_a_missing_directory_fails_at_once_and_says_what_to_check() {
    let config = TempFile::new(
        "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite:///nonexistent-hookbox-dir/events.db\"\n",
    );
    let started = std::time::Instant::now();
    let (code, _, stderr) = run_hookbox(&["serve", "--config", &config.path()], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("/nonexistent-hookbox-dir/events.db") && stderr.contains("directory"),
        "{stderr}"
    );
    assert!(!stderr.contains("listening"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "at once, not after a checkout timeout"
    );
}
