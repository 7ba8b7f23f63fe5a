//! A bad config exits 2, naming the key and the problem, before anything listens.

use crate::helpers::*;

/// `serve` with `config`: its exit code and stderr. A config taken by mistake would serve for
/// ever: it is stopped after 20 s, as exit code -1, so the test fails rather than hangs.
fn serve_with(config: &str) -> (i32, String) {
    let file = TempFile::new(config);
    let path = file.0.to_string_lossy().into_owned();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args(["serve", "--config", &path])
        .env_remove("DATABASE_URL")
        .env_remove("HOOKBOX_CONFIG")
        .env_remove("HOOKBOX_LISTEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run hookbox");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().expect("wait for hookbox").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("hookbox's stderr");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn each_kind_of_bad_config_exits_2_and_names_the_key() {
    let cases = [
        (
            "[server]\nlisten = \"127.0.0.1:0\"\nlisten_addr = \"x\"\n",
            "listen_addr",
        ),
        (
            "[server]\nin_flight_wait = \"forever\"\n",
            "server.in_flight_wait",
        ),
        (
            "[sources.stripe]\nscheme = \"stripe\"\n",
            "sources.stripe.secrets",
        ),
        (
            "[sources.pp]\nscheme = \"papyal\"\nsecrets = [\"x\"]\n",
            "sources.pp.scheme",
        ),
        (
            "[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"W\"\nsecrets = [\"x\"]\n",
            "sources.pp.secrets: a paypal source takes no secrets (nor secrets_env): PayPal signs \
             with the certificate at PAYPAL-CERT-URL, so no public_keys either",
        ),
        (
            "[sources.sn]\nscheme = \"sns\"\nsecrets = [\"x\"]\n",
            "sources.sn.secrets: an sns source takes no secrets (nor secrets_env): SNS signs with \
             the certificate at each message's SigningCertURL, so no public_keys either",
        ),
        (
            "[sources.pp]\nscheme = \"paypal\"\n",
            "sources.pp.webhook_id",
        ),
        // A scheme that takes no secrets does not list them among the keys it takes.
        (
            "[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"W\"\npublic_keys = [\"k\"]\n",
            "sources.pp.public_keys: unknown field `public_keys`: a paypal source takes scheme, \
             retention",
        ),
        (
            "[sources.ad]\nscheme = \"adyen\"\nsecrets = [\"00\"]\ntolerance = \"5m\"\n",
            "sources.ad.tolerance: an adyen source checks no signed timestamp",
        ),
        (
            "[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"W\"\nsecrets_env = \"HOME\"\n",
            "sources.pp.secrets",
        ),
        (
            "[sources.sq]\nscheme = \"square\"\nsecrets = [\"x\"]\n",
            "sources.sq.public_url",
        ),
        (
            "[sources.bt]\nscheme = \"braintree\"\nsecrets = [\"x\"]\n",
            "sources.bt.public_key",
        ),
        (
            "[sources.tw]\nscheme = \"twilio\"\nsecrets = [\"x\"]\n",
            "sources.tw.public_url",
        ),
        // A credential is never an event's id or type: they are shown everywhere.
        (
            "[sources.h]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"header:authorization\"\n",
            "sources.h.event_id: authorization carries the sender's credentials",
        ),
        (
            "[sources.h]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n\
             event_id = \"json:/id\"\nevent_type = \"header:Cookie\"\n",
            "sources.h.event_type: Cookie carries the sender's credentials",
        ),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\ntolerance = \"5 fortnights\"\n",
            "sources.s.tolerance",
        ),
        // Only whitespace, as an empty one, is a paste gone wrong (a black-box run saw it
        // taken).
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\", \"  \"]\n",
            "sources.s.secrets",
        ),
        (
            "[sources._unknown]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n",
            "sources._unknown: the source name \"_unknown\" is reserved",
        ),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets_env = \"HOOKBOX_TEST_NOT_SET\"\n",
            "sources.s.secrets_env",
        ),
        ("[retention]\nwindow = \"-1h\"\n", "retention.window"),
        (
            "[database]\nurl = \"mysql://hookbox:hunter2@db/hookbox\"\n",
            "database.url",
        ),
        ("[database]\nurl = \"sqlite://\"\n", "database.url"),
        ("[server\n", "line 1"),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[[sources.s.forward]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n[[sources.s.forward]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
            "sources.s.forward[1].name",
        ),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[[sources.s.forward]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nevents = [\"\"]\n",
            "sources.s.forward[0].events[0]",
        ),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[[sources.s.forward]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nrate = \"lots\"\n",
            "sources.s.forward[0].rate",
        ),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[[sources.s.forward]]\nname = \"a\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nconcurrency = 0\n",
            "sources.s.forward[0].concurrency",
        ),
    ];
    for (config, key) in cases {
        let (code, stderr) = serve_with(config);
        assert_eq!(code, 2, "{config:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].contains(key),
            "{config:?} should name {key}: {stderr}"
        );
        assert!(!stderr.contains("listening"), "nothing listens");
        assert!(
            !stderr.contains("hunter2"),
            "no password in the message: {stderr}"
        );
    }
}

#[test]
fn a_config_file_that_does_not_exist_is_exit_2_with_what_to_do() {
    let (code, _, stderr) = run_hookbox(&["serve", "--config", "/nonexistent/hookbox.toml"], &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--config") && stderr.contains("/nonexistent/hookbox.toml"),
        "{stderr}"
    );
}

#[test]
fn a_secret_in_a_bad_config_is_never_printed() {
    let (code, stderr) = serve_with(
        "[sources.s]\nscheme = \"standard\"\nsecrets = [\"whsec_!!notbase64-topsecret\"]\n",
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("sources.s.secrets"), "{stderr}");
    assert!(!stderr.contains("topsecret"), "{stderr}");
}

#[test]
fn migrate_applies_the_schema_and_says_so() {
    let db = TestDb::create();
    let (code, stdout, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("applied"), "{stdout}");
    assert_eq!(db.count("events"), 0, "the events table exists");
    let (code, stdout, _) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0);
    assert!(stdout.contains("up to date"), "{stdout}");
}

#[test]
fn migrate_run_from_another_directory_says_it_made_a_new_store_and_where() {
    // A deploy step run from the wrong directory: the relative path is that directory's.
    let dir = TempDir::new();
    let full = dir.0.join("events.db").display().to_string();
    let env = [("DATABASE_URL", "sqlite://events.db")];
    let migrate = || run_hookbox_in(&["migrate", "--config", "/dev/null"], &env, Some(&dir.0));
    let (code, stdout, stderr) = migrate();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(&format!("created a new, empty SQLite store: {full}")),
        "{stdout}"
    );
    let (code, stdout, _) = migrate();
    assert_eq!(code, 0);
    assert!(!stdout.contains("created"), "the file was there: {stdout}");
    // A file it cannot open is named in full too.
    let env = [("DATABASE_URL", "sqlite://missing-dir/events.db")];
    let (code, _, stderr) =
        run_hookbox_in(&["migrate", "--config", "/dev/null"], &env, Some(&dir.0));
    assert_eq!(code, 1, "{stderr}");
    let missing = dir.0.join("missing-dir/events.db").display().to_string();
    assert!(stderr.contains(&missing), "{stderr}");
}

#[test]
fn another_programs_sqlite_file_is_refused_and_left_as_it_was() {
    use diesel::connection::SimpleConnection;
    use diesel::prelude::*;
    use diesel::sqlite::SqliteConnection;
    #[derive(QueryableByName)]
    struct Mode {
        #[diesel(sql_type = diesel::sql_types::Text)]
        journal_mode: String,
    }
    let dir = TempDir::new();
    let file = dir.0.join("app.db");
    let path = file.display().to_string();
    // Made as another program makes it: no setup of hookbox's (its journal in the default mode).
    SqliteConnection::establish(&path)
        .expect("open")
        .batch_execute(
            "CREATE TABLE events (id INTEGER, name TEXT); CREATE TABLE users (id INTEGER)",
        )
        .expect("another program's tables");
    every_command_refuses(&path, "events, users");
    let mut conn = SqliteConnection::establish(&path).expect("open");
    let tables: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "(SELECT count(*) FROM sqlite_master WHERE type = 'table')",
    ))
    .get_result(&mut conn)
    .expect("count");
    assert_eq!(tables, 2, "nothing added to it");
    let mode: Mode = diesel::sql_query("PRAGMA journal_mode")
        .get_result(&mut conn)
        .expect("journal mode");
    assert_eq!(mode.journal_mode, "delete", "its journal left as it was");
}

/// Every command given the SQLite file at `path` exits 1 saying it holds another program's
/// `tables`.
fn every_command_refuses(path: &str, tables: &str) {
    let config = TempFile::new(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite://{path}\"\n"
    ));
    for command in ["migrate", "serve", "purge", "export"] {
        let (code, _, stderr) = run_hookbox(&[command, "--config", &config.path()], &[]);
        assert_eq!(code, 1, "{command}: {stderr}");
        assert!(
            stderr.contains(path)
                && stderr.contains(&format!("another program's tables ({tables})")),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn migrate_needs_only_the_database_not_the_sources_secrets() {
    let db = TestDb::create();
    // A deploy step that migrates has the database's URL, not the webhook secrets.
    let config = TempFile::new(
        "[sources.stripe]\nscheme = \"stripe\"\nsecrets_env = \"HOOKBOX_TEST_UNSET_SECRET\"\n",
    );
    let (code, stdout, stderr) = run_hookbox(
        &["migrate", "--config", &config.path()],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("applied"), "{stdout}");
    // The rest of the file is still checked, and so is `[sources]` when its secrets are at
    // hand: an unknown key, a key the scheme refuses.
    for (text, names) in [
        ("[database]\npool_size = 0\n", "pool_size"),
        (
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x1234567\"]\nbogus_key = 1\n",
            "bogus_key",
        ),
        (
            "[sources.s]\nscheme = \"sendgrid\"\nsecrets = [\"topsecret\"]\n",
            "public_keys",
        ),
    ] {
        let config = TempFile::new(text);
        let (code, _, stderr) = run_hookbox(
            &["migrate", "--config", &config.path()],
            &[("DATABASE_URL", &db.url)],
        );
        assert_eq!(code, 2, "{text}: {stderr}");
        assert!(stderr.contains(names), "{text}: {stderr}");
        assert!(!stderr.contains("topsecret"), "{stderr}");
    }
}

#[test]
fn an_unreachable_database_is_exit_1_with_what_to_check() {
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/hookbox")],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("cannot connect to the database") && stderr.contains("DATABASE_URL"),
        "{stderr}"
    );
}

#[test]
fn a_database_that_is_not_there_or_never_answers_is_named_for_what_it_is() {
    if store_is_sqlite() {
        return;
    }
    // A database name that does not exist on a running server: not "is PostgreSQL running?".
    let missing = with_database(&server_url(), "hookbox_no_such_database");
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &missing)],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("createdb"), "{stderr}");
    assert!(!stderr.contains("is PostgreSQL running"), "{stderr}");
    // export and purge read what is there: making a database is never their fix.
    for (command, nothing) in [
        ("export", "nothing to export"),
        ("purge", "nothing to purge"),
    ] {
        let (code, _, stderr) = run_hookbox(
            &[command, "--config", "/dev/null"],
            &[("DATABASE_URL", &missing)],
        );
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains(nothing) && stderr.contains("the database serve uses"),
            "{stderr}"
        );
        assert!(!stderr.contains("createdb"), "{stderr}");
    }

    // A URL libpq cannot read (a bad sslmode, a port that is none): the URL is named, not
    // the server, and it is bad config (exit 2), which no retry mends.
    for unreadable in [
        format!("{}?sslmode=sometimes", with_database(&server_url(), "x")),
        "postgres://postgres@127.0.0.1:99999/x".to_owned(),
    ] {
        for command in ["migrate", "export", "purge"] {
            let (code, _, stderr) = run_hookbox(
                &[command, "--config", "/dev/null"],
                &[("DATABASE_URL", &unreadable)],
            );
            assert_eq!(code, 2, "{command} {unreadable}: {stderr}");
            assert!(stderr.contains("cannot read the URL"), "{stderr}");
            assert!(!stderr.contains("is PostgreSQL running"), "{stderr}");
        }
        // serve says so before anything listens: its port taken already, the URL is what it
        // refuses (bad config, exit 2), not the port.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let listen = taken.local_addr().expect("its address").to_string();
        let (code, _, stderr) = run_hookbox(
            &["serve", "--config", "/dev/null"],
            &[("DATABASE_URL", &unreadable), ("HOOKBOX_LISTEN", &listen)],
        );
        assert_eq!(code, 2, "serve {unreadable}: {stderr}");
        assert!(stderr.contains("config error: "), "{stderr}");
        assert!(stderr.contains("cannot read the URL"), "{stderr}");
        assert!(!stderr.contains("cannot listen"), "{stderr}");
    }

    // A host that takes the connection and never answers: without a connect_timeout in the
    // URL, hookbox's own (10 s) ends the wait, instead of waiting forever in silence.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = silent.local_addr().expect("its address").port();
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten().take(4) {
            held.push(stream);
        }
        held
    });
    let started = std::time::Instant::now();
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[(
            "DATABASE_URL",
            &format!("postgres://postgres@127.0.0.1:{port}/x"),
        )],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("connect_timeout"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "gave up after {:?}",
        started.elapsed()
    );
    drop(held);
}

/// `hookbox serve` with `config` and its events in an SQLite file of a directory of its own:
/// (exit code, stderr, whether the database file was made, which is the migrations' first step).
fn serve_in_scratch(config: &str, env: &[(&str, &str)]) -> (i32, String, bool) {
    let dir = TempDir::new();
    let db = dir.0.join("hookbox.db");
    let url = format!("sqlite://{}", db.display());
    let file = TempFile::new(config);
    let mut env = env.to_vec();
    env.push(("DATABASE_URL", &url));
    let (code, _stdout, stderr) = run_hookbox(&["serve", "--config", &file.path()], &env);
    (code, stderr, db.exists())
}

#[test]
fn a_bad_listen_address_exits_2_naming_the_key_before_the_migrations() {
    for listen in ["nohost", "127.0.0.1:99999", "", "nohost.invalid:8080"] {
        let (code, stderr, migrated) =
            serve_in_scratch(&format!("[server]\nlisten = {listen:?}\n"), &[]);
        assert_eq!(code, 2, "{listen:?}: {stderr}");
        assert!(stderr.contains("server.listen: "), "{listen:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(!migrated, "{listen:?}: nothing ran before the refusal");
    }
    let (code, stderr, migrated) = serve_in_scratch(
        "[server]\nlisten = \"127.0.0.1:0\"\n",
        &[("HOOKBOX_LISTEN", "garbage")],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("HOOKBOX_LISTEN: "), "{stderr}");
    assert!(!migrated);
}

#[test]
fn a_listen_port_already_taken_is_a_runtime_failure_before_the_database_is_touched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port();
    let (code, stderr, migrated) =
        serve_in_scratch("", &[("HOOKBOX_LISTEN", &format!("127.0.0.1:{port}"))]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert!(
        !migrated,
        "an instance that cannot serve never migrates a (shared) schema: {stderr}"
    );
}

#[test]
fn a_key_a_scheme_does_not_use_or_a_window_no_store_holds_exits_2() {
    // Held, so that a config wrongly accepted fails to listen (exit 1) rather than serve on.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port();
    let server = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n");
    let source = |scheme: &str, extra: &str| {
        format!("{server}[sources.s]\nscheme = \"{scheme}\"\nsecrets = [\"whsec_x\"]\n{extra}")
    };
    for (config, key) in [
        (
            source("github", "tolerance = \"1m\"\n"),
            "sources.s.tolerance",
        ),
        (
            source("shopify", "tolerance = \"1m\"\n"),
            "sources.s.tolerance",
        ),
        (
            source("gitlab", "tolerance = \"1m\"\n"),
            "sources.s.tolerance",
        ),
        (
            source(
                "hmac-sha256",
                "signature_header = \"X-Sig\"\nevent_id = \"header:X-Id\"\ntolerance = \"1m\"\n",
            ),
            "sources.s.tolerance",
        ),
        (
            source("stripe", "tolerance = \"0s\"\n"),
            "sources.s.tolerance",
        ),
        (
            source("stripe", "retention = \"0s\"\n"),
            "sources.s.retention",
        ),
        (
            source("stripe", "retention = \"10000y\"\n"),
            "sources.s.retention",
        ),
        (
            format!("{server}[retention]\nwindow = \"0s\"\n"),
            "retention.window",
        ),
        (
            format!("{server}[retention]\nwindow = \"10000y\"\n"),
            "retention.window",
        ),
    ] {
        let (code, stderr, migrated) = serve_in_scratch(&config, &[]);
        assert_eq!(code, 2, "{config:?}: {stderr}");
        assert!(
            stderr.contains(key),
            "{config:?} should name {key}: {stderr}"
        );
        assert!(!migrated, "{config:?}");
    }
}

#[test]
fn a_key_variable_set_but_empty_is_said_to_be_empty() {
    // `SENDGRID_KEYS=` in an env file: "not set" would send the SRE looking for a missing line.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port();
    let server = format!("[server]\nlisten = \"127.0.0.1:{port}\"\n");
    for (source, key) in [
        (
            "scheme = \"sendgrid\"\npublic_keys_env = \"HOOKBOX_TEST_EMPTY\"\n",
            "sources.s.public_keys_env",
        ),
        (
            "scheme = \"adyen\"\nsecrets = [\"00\"]\nbasic_auth_env = \"HOOKBOX_TEST_EMPTY\"\n",
            "sources.s.basic_auth_env",
        ),
    ] {
        let config = format!("{server}[sources.s]\n{source}");
        let (code, stderr, migrated) = serve_in_scratch(&config, &[("HOOKBOX_TEST_EMPTY", " ")]);
        assert_eq!(code, 2, "{config:?}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains("HOOKBOX_TEST_EMPTY is set but empty"),
            "{config:?}: {stderr}"
        );
        assert!(!migrated, "{config:?}");
    }
}

#[test]
fn no_secret_shows_in_a_config_error() {
    for config in [
        "[sources.s]\nscheme = \"stripe\"\nsecrets = \"whsec_TOPSECRET1\"\n",
        "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_TOPSECRET1\n",
        "[sources.s]\nscheme = \"stripe\"\nsecrets = [whsec_TOPSECRET1]\n",
        "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\nforward = \"amqp://guest:TOPSECRET1@mq/\"\n",
        "[database]\nurl = \"postgres://u:TOPSECRET1@h/db\"\npool_size = \"postgres://u:TOPSECRET1@h/db\"\n",
    ] {
        let (code, stderr) = serve_with(config);
        assert_eq!(code, 2, "{config:?}: {stderr}");
        assert!(stderr.contains(".toml: "), "the file is named: {stderr}");
        assert!(!stderr.contains("TOPSECRET1"), "{stderr}");
    }
}

#[test]
fn migrate_waiting_for_another_instances_migration_lock_says_so() {
    use diesel::RunQueryDsl;
    if store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    // Another instance applying migrations holds the lock.
    const MIGRATION_LOCK_KEY: i64 = 0x686f_6f6b_626f_7801;
    let mut holder = db.connect();
    diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))
        .execute(&mut holder)
        .expect("the lock is taken");
    let migrate = Watched::start(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    // It says what it waits for, rather than hanging silently.
    migrate.says("waiting for the migration lock");
    diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))
        .execute(&mut holder)
        .expect("the lock is let go");
    assert!(migrate.succeeded());
    assert_eq!(db.count("events"), 0, "migrated once the lock was free");
}

#[test]
fn migrate_waiting_for_a_table_another_session_holds_names_the_session() {
    if store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    // A database an older hookbox migrated, with the newest migration (an ALTER TABLE of
    // `instances`) still to apply, while a pg_dump reads the table.
    crate::upgrade::migrate_before(&mut db.connect(), "20261212090000");
    let mut dump = HeldTableLock::take(&db.url, "instances", "ACCESS SHARE");
    let migrate = Watched::start(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    // It says what it waits for, and who holds it, rather than hanging silently.
    let said = migrate.says("migrations wait for hookbox's tables");
    let pid = dump.pid();
    assert!(
        said.contains(&format!("pid {pid} (")) && said.contains("instances"),
        "names the session and the table: {said}"
    );
    drop(dump);
    let (code, stderr, stdout) = migrate.ended();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("applied 1 migration(s)") && stdout.contains("20261212090000"),
        "what the tries applied in all: {stdout}"
    );
    // The column the migration adds is there (the count fails without it).
    assert_eq!(db.count("instances WHERE locks_taken >= 0"), 0);
}

#[test]
fn migrate_on_sqlite_waits_for_another_process_write_and_says_so() {
    use diesel::connection::SimpleConnection;
    if !store_is_sqlite() {
        return;
    }
    let db = TestDb::create();
    let (code, _, stderr) = run_hookbox(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    assert_eq!(code, 0, "{stderr}");
    // Another process writes, longer than a connection's busy timeout (a long purge batch).
    let mut holder = db.connect();
    holder
        .batch_execute("BEGIN IMMEDIATE")
        .expect("the write lock is taken");
    let migrate = Watched::start(
        &["migrate", "--config", "/dev/null"],
        &[("DATABASE_URL", &db.url)],
    );
    migrate.says("waiting for the SQLite write lock");
    holder
        .batch_execute("ROLLBACK")
        .expect("the lock is let go");
    assert!(
        migrate.succeeded(),
        "it waited its turn rather than failing"
    );
}

#[test]
fn every_commands_help_says_what_its_exit_codes_mean() {
    for command in ["serve", "migrate", "purge", "export", "replay", "send"] {
        let (code, stdout, stderr) = run_hookbox(&[command, "--help"], &[]);
        assert_eq!(code, 0, "{command}: {stderr}");
        assert!(
            stdout.contains("Exit 0") && stdout.contains(" 2 "),
            "{command} --help names its exit codes:\n{stdout}"
        );
    }
    let (_, serve, _) = run_hookbox(&["serve", "--help"], &[]);
    assert!(
        serve.contains("RUST_LOG") && serve.contains("token_env"),
        "{serve}"
    );
    // And the top level says where to start (it listed the commands, and nothing more).
    for flag in ["-h", "--help"] {
        let (code, top, _) = run_hookbox(&[flag], &[]);
        assert_eq!(code, 0);
        assert!(
            top.contains("Start with `hookbox serve --config")
                && top.contains("README.md and docs/"),
            "{top}"
        );
    }
}

#[test]
fn a_database_url_that_reaches_another_kind_of_server_is_not_called_unreadable() {
    if store_is_sqlite() {
        return;
    }
    // An HTTP server at the URL's port (nginx answers 400 to anything): libpq's "received
    // invalid response to SSL negotiation" was read as a URL libpq cannot read, exit 2, where
    // a supervisor's restart (exit 1) may find the right server there later.
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = http.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in http.incoming().flatten() {
            let mut first = [0u8; 512];
            let _ = stream.read(&mut first);
            let _ = stream.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    for sslmode in ["prefer", "disable"] {
        let url = format!("postgres://postgres@127.0.0.1:{port}/x?sslmode={sslmode}");
        for command in ["migrate", "export", "purge"] {
            let (code, _, stderr) = run_hookbox(
                &[command, "--config", "/dev/null"],
                &[("DATABASE_URL", &url), ("PGSSLMODE", sslmode)],
            );
            assert_eq!(code, 1, "{command} {sslmode}: {stderr}");
            assert!(stderr.contains("but not as PostgreSQL"), "{stderr}");
            assert!(!stderr.contains("cannot read the URL"), "{stderr}");
        }
    }
}
