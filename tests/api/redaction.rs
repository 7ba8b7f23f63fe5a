//! A database URL's passwords (the userinfo's, `?password=`, `?sslpassword=`) never appear in
//! what hookbox prints: startup logs, `migrate` output, connection errors.

use crate::helpers::*;

const SECRET: &str = "hunter2-sEcReT";

/// `url` with a userinfo password and both query passwords added. The test server trusts its
/// clients, so it accepts them unread.
fn with_passwords(url: &str) -> String {
    let url = url.replacen("://postgres@", &format!("://postgres:{SECRET}-user@"), 1);
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}password={SECRET}-query&sslpassword={SECRET}-ssl")
}

fn assert_redacted(output: &str) {
    assert!(!output.contains("sEcReT"), "a password leaked:\n{output}");
}

#[test]
fn startup_logs_show_the_database_url_with_its_passwords_masked() {
    if skip_on_sqlite("startup_logs_redacted", "an SQLite path holds no password") {
        return;
    }
    let db = TestDb::create();
    let url = with_passwords(&db.url);
    assert!(
        url.contains(":hunter2"),
        "the server URL names user postgres: {url}"
    );
    let server = Process::serve(&config_text(&url, ""));
    let log = server.log();
    assert!(
        log.contains("password=***") && log.contains("sslpassword=***"),
        "the log names the database it uses:\n{log}"
    );
    assert_redacted(&log);
}

#[test]
fn migrate_prints_the_database_url_with_its_passwords_masked() {
    if skip_on_sqlite("migrate_redacted", "an SQLite path holds no password") {
        return;
    }
    let db = TestDb::create();
    let url = with_passwords(&db.url);
    let (code, stdout, stderr) = run_hookbox(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("password=***"), "{stdout}");
    assert_redacted(&stdout);
    assert_redacted(&stderr);
}

#[test]
fn connection_errors_show_no_password_even_where_libpq_quotes_one() {
    // Port 1: nothing listens. A malformed percent sequence: libpq quotes the whole value.
    let unreachable = format!(
        "postgres://postgres:{SECRET}-user@127.0.0.1:1/db?password={SECRET}-query&sslpassword={SECRET}-ssl"
    );
    let malformed = format!("postgres://postgres@127.0.0.1:1/db?password={SECRET}%zz");
    let malformed_userinfo = format!("postgres://postgres:{SECRET}%zz@127.0.0.1:1/db");
    // A URL libpq cannot read is bad config (exit 2); one it reads and cannot reach, 1.
    for (url, exit) in [(unreachable, 1), (malformed, 2), (malformed_userinfo, 2)] {
        for command in ["migrate", "export"] {
            let (code, stdout, stderr) = run_hookbox(&[command], &[("DATABASE_URL", &url)]);
            assert_eq!(code, exit, "{command} with {url}: {stdout}{stderr}");
            assert!(stderr.contains("cannot connect"), "{command}: {stderr}");
            assert_redacted(&stdout);
            assert_redacted(&stderr);
        }
    }
}

#[test]
fn a_password_holding_an_unencoded_question_mark_or_slash_is_masked_whole() {
    if skip_on_sqlite("password_delimiters", "an SQLite path holds no password") {
        return;
    }
    // libpq reads a '?' before the '@' as part of the password: the URL works, and nothing of
    // the password is printed (it was, whole, and the connect timeout hookbox adds went into
    // the database's name).
    let db = TestDb::create();
    let url = db
        .url
        .replacen("://postgres@", &format!("://postgres:ab?{SECRET}@"), 1);
    assert!(
        url.contains("?hunter2"),
        "the server URL names user postgres: {url}"
    );
    let (code, stdout, stderr) = run_hookbox(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("postgres:***@"), "{stdout}");
    assert_redacted(&stdout);
    assert_redacted(&stderr);
    // An unencoded '/' libpq cannot read: it takes what is before it for the port, and its
    // error quotes it.
    let slashed = format!("postgres://postgres:{SECRET}/xyz@127.0.0.1:1/db");
    let (code, stdout, stderr) = run_hookbox(&["migrate"], &[("DATABASE_URL", &slashed)]);
    assert_ne!(code, 0, "{stdout}{stderr}");
    assert_redacted(&stdout);
    assert_redacted(&stderr);
}
