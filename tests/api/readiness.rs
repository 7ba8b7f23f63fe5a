//! Honest 503s: `/readyz` checks that the store takes a write, and an answer says what went
//! wrong (a permission, not "unreachable") without quoting the database.

use diesel::prelude::*;
use hookbox::Handlers;

use crate::helpers::*;

/// A login role of the test's own, dropped (with what it owns) when it goes.
struct Role(String);

impl Role {
    fn create(name: &str) -> Role {
        let mut server = PgConnection::establish(&server_url()).expect("connect to the server");
        diesel::sql_query(format!("CREATE ROLE {name} LOGIN"))
            .execute(&mut server)
            .expect("create the role");
        Role(name.to_owned())
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut server) = PgConnection::establish(&server_url()) {
            let _ =
                diesel::sql_query(format!("DROP ROLE IF EXISTS {}", self.0)).execute(&mut server);
        }
    }
}

/// The server's URL, when `test` can swap a role of its own in: on PostgreSQL, connected as
/// the postgres user. `None` (the test is skipped, and says why) otherwise.
fn server_for_roles(test: &str) -> Option<String> {
    if skip_on_sqlite(test, "SQLite has no roles") {
        return None;
    }
    let server = server_url();
    if !server.contains("://postgres@") {
        eprintln!(
            "skipped: DATABASE_URL does not name the postgres user, so no role can be swapped in"
        );
        return None;
    }
    Some(server)
}

/// `statement`, run by the superuser in the test's database.
fn as_superuser(db: &TestDb, statement: &str) {
    let mut conn =
        PgConnection::establish(&with_database(&server_url(), &db.name)).expect("connect");
    diesel::sql_query(statement)
        .execute(&mut conn)
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// A role of the test's own that owns `db` and its schema (so it migrates), and the URL of
/// `db` on `server` as that role.
fn owned_by_a_role(server: &str, db: &TestDb) -> (Role, String) {
    let role = Role::create(&format!("{}_role", db.name));
    as_superuser(
        db,
        &format!("ALTER DATABASE {} OWNER TO {}", db.name, role.0),
    );
    as_superuser(db, &format!("ALTER SCHEMA public OWNER TO {}", role.0));
    let url = with_database(server, &db.name).replace("://postgres@", &format!("://{}@", role.0));
    (role, url)
}

#[actix_web::test]
async fn after_revoke_insert_readyz_is_not_ready_and_a_delivery_says_permission() {
    let Some(server) =
        server_for_roles("after_revoke_insert_readyz_is_not_ready_and_a_delivery_says_permission")
    else {
        return;
    };
    let db = TestDb::create();
    // Dropped after the app's database, which is dropped with the app, declared later.
    let (role, url) = owned_by_a_role(&server, &db);
    let config = parse_config(&config_text(&url, ""));
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;

    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    as_superuser(&app.db, &format!("REVOKE INSERT ON events FROM {}", role.0));
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.error(), "unavailable");
    let message = ready.json()["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains("permission"), "{message}");
    assert!(!message.contains("unreachable"), "{message}");

    let id = unique_id("evt_revoked");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (503, "unavailable")
    );
    let message = answer.json()["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains("permission"), "{message}");
    assert!(
        !message.contains("events"),
        "the database's own words stay out: {message}"
    );

    as_superuser(&app.db, &format!("GRANT INSERT ON events TO {}", role.0));
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
}

#[actix_web::test]
async fn a_role_that_may_only_read_and_write_rows_serves_and_migrates_a_migrated_database() {
    // The usual split: the owner migrates (a deploy step), the app's role only reads and
    // writes rows. PostgreSQL 15 grants no CREATE on `public` to other roles.
    let Some(server) = server_for_roles(
        "a_role_that_may_only_read_and_write_rows_serves_and_migrates_a_migrated_database",
    ) else {
        return;
    };
    // Declared first, so it is dropped after the database its grants are in.
    let role = Role::create(&unique_id("hb_rows_only").to_lowercase());
    let db = TestDb::create();
    let owner_config = TempFile::new(&config_text(&db.url, ""));
    let (code, _, stderr) = run_hookbox_async(&["migrate", "--config", &owner_config.path()]).await;
    assert_eq!(code, 0, "{stderr}");
    for statement in [
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
        format!("GRANT USAGE ON SCHEMA public TO {}", role.0),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}",
            role.0
        ),
        format!(
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}",
            role.0
        ),
    ] {
        as_superuser(&db, &statement);
    }
    let url = with_database(&server, &db.name).replace("://postgres@", &format!("://{}@", role.0));
    let text = config_text(&url, "");

    let rows_only = TempFile::new(&text);
    let (code, stdout, stderr) =
        run_hookbox_async(&["migrate", "--config", &rows_only.path()]).await;
    assert_eq!(
        code, 0,
        "nothing to apply, nothing to create: {stdout}{stderr}"
    );

    let process = Process::serve(&text);
    let ready = get(&process.address, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    let config = parse_config(&text);
    let id = unique_id("evt_rows_only");
    let delivery = delivery_for(
        &config,
        "stripe",
        &stripe_event(&id, "charge.succeeded", 1),
        &id,
        unix_now(),
    );
    let answer = send(&process.address, &delivery).await;
    assert_eq!(answer.status, 200, "{}\n{}", answer.text(), process.log());
    drop(process);
    assert_eq!(db.count("events"), 1);

    // A migration pending (as after an upgrade): the role reads the table but may not create,
    // and is told which versions wait and who applies them.
    as_superuser(
        &db,
        "DELETE FROM __diesel_schema_migrations \
         WHERE version = (SELECT max(version) FROM __diesel_schema_migrations)",
    );
    let (code, stdout, stderr) =
        run_hookbox_async(&["migrate", "--config", &rows_only.path()]).await;
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.contains("1 migration(s) pending: 2026")
            && stderr.contains("as the schema's owner")
            && !stderr.contains("nor read the migrations table"),
        "{stderr}"
    );
}

#[actix_web::test]
async fn a_role_without_the_grants_it_needs_is_told_what_to_grant_at_the_start() {
    let Some(server) =
        server_for_roles("a_role_without_the_grants_it_needs_is_told_what_to_grant_at_the_start")
    else {
        return;
    };
    // Declared first, so it is dropped after the database its grants are in.
    let role = Role::create(&unique_id("hb_read_only").to_lowercase());
    let db = TestDb::create();
    let owner_config = TempFile::new(&config_text(&db.url, ""));
    let (code, _, stderr) = run_hookbox_async(&["migrate", "--config", &owner_config.path()]).await;
    assert_eq!(code, 0, "{stderr}");
    as_superuser(&db, "REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let url = with_database(&server, &db.name).replace("://postgres@", &format!("://{}@", role.0));
    let text = config_text(&url, "");

    // No grants at all: it cannot even read the migrations table, and is told who migrates.
    let bare = TempFile::new(&text);
    let (code, _, stderr) = run_hookbox_async(&["migrate", "--config", &bare.path()]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("as the schema's owner") && stderr.contains("docs/stores.md"),
        "{stderr}"
    );

    // Reads only: serve starts, and says at once that deliveries will fail, and why.
    as_superuser(&db, &format!("GRANT USAGE ON SCHEMA public TO {}", role.0));
    as_superuser(
        &db,
        &format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}", role.0),
    );
    let process = Process::serve(&text);
    let log = process.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("does not take hookbox's writes")),
        "{log}"
    );
    let ready = get(&process.address, "/readyz", None).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
}

#[actix_web::test]
async fn readyz_says_the_tables_are_locked_rather_than_that_migrations_are_pending() {
    if skip_on_sqlite(
        "readyz_says_the_tables_are_locked_rather_than_that_migrations_are_pending",
        "SQLite's busy store counts as ready (another process is writing)",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    assert_eq!(app.get("/readyz", None).await.status, 200);

    let mut holder =
        PgConnection::establish(&with_database(&server_url(), &app.db.name)).expect("connect");
    // The events table (LOCK TABLE, an ALTER), or the migrations table (a migration under way).
    for table in ["events", "__diesel_schema_migrations"] {
        diesel::connection::SimpleConnection::batch_execute(
            &mut holder,
            &format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
        )
        .expect("lock the table");
        let ready = app.get("/readyz", None).await;
        diesel::connection::SimpleConnection::batch_execute(&mut holder, "COMMIT").expect("commit");
        assert_eq!(ready.status, 503, "{table}: {}", ready.text());
        assert_eq!(ready.error(), "unavailable");
        assert_eq!(ready.header("retry-after"), Some("5"));
        let message = ready.message();
        assert!(
            message.contains("locked by another database session"),
            "{table}: {message}"
        );
        assert!(
            !message.contains("pending") && !message.contains("stored"),
            "a probe neither sends anyone to migrate nor speaks of storing: {message}"
        );
        assert_eq!(app.get("/readyz", None).await.status, 200);
    }
}

#[actix_web::test]
async fn readyz_and_deliveries_say_so_while_the_sqlite_file_is_deleted_or_replaced_under_serve() {
    if !store_is_sqlite() {
        return;
    }
    let app = TestApp::spawn().await;
    let event = |id: &str| app.delivery("stripe", &stripe_event(id, "charge.succeeded", 1), id);
    let (before, during) = (unique_id("evt_before"), unique_id("evt_during"));
    assert_eq!(app.send(&event(&before)).await.status, 200);
    let path = app
        .db
        .url
        .strip_prefix("sqlite://")
        .expect("a file store")
        .to_owned();
    let moved = format!("{path}.moved");
    assert_eq!(app.get("/readyz", None).await.status, 200);
    std::fs::rename(&path, &moved).expect("move the file away");
    let gone = app.get("/readyz", None).await;
    let fresh = app.send(&event(&during)).await;
    // Stored before, and answered from memory: not an answer the file at the path holds.
    let again = app.send(&event(&before)).await;
    // A file of the same name is not the one serve opened either.
    std::fs::write(&path, b"").expect("another file");
    let replaced_ready = app.get("/readyz", None).await;
    let replaced = app.send(&event(&during)).await;
    std::fs::remove_file(&path).expect("the other file removed");
    std::fs::rename(&moved, &path).expect("put it back");
    assert_eq!(app.get("/readyz", None).await.status, 200);
    for refused in [&gone, &fresh, &again, &replaced_ready, &replaced] {
        assert_eq!(refused.status, 503, "{}", refused.text());
        assert_eq!(refused.error(), "unavailable");
        assert!(refused.header("retry-after").is_some());
        assert!(
            refused.message().contains("deleted or replaced"),
            "{}",
            refused.text()
        );
    }
    // Back on its path: the retry is answered as the claim made while it was away stored it.
    let retried = app.send(&event(&during)).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert!(retried.replayed(), "stored once, while the file was moved");
    assert_eq!(app.send(&event(&before)).await.status, 200);
    assert_eq!(app.db.count("events"), 2, "each event stored once");
}

/// A database owned by a role of its own, migrated by `hookbox migrate` with the config text
/// `config` makes for its URL, holding one `source` event ten days old, and the role's right
/// `revoked` (`DELETE ON events`) taken away: the database, the role and the config file (drop
/// the database first).
fn migrated_by_a_role_with_an_old_event(
    server: &str,
    config: impl Fn(&str) -> String,
    source: &str,
    revoked: &str,
) -> (TestDb, Role, TempFile) {
    let db = TestDb::create();
    let (role, url) = owned_by_a_role(server, &db);
    let config = TempFile::new(&config(&url));
    let (code, _, stderr) = run_hookbox(&["migrate", "--config", &config.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    insert_events(
        &db.url,
        &[RawEvent {
            source: source.to_owned(),
            event_id: unique_id("evt_old"),
            received_at: chrono::Utc::now() - chrono::Duration::days(10),
            payload: b"{}".to_vec(),
        }],
    );
    as_superuser(&db, &format!("REVOKE {revoked} FROM {}", role.0));
    (db, role, config)
}

#[test]
fn a_purge_by_a_role_that_may_not_delete_says_what_to_grant() {
    let Some(server) = server_for_roles("a_purge_by_a_role_that_may_not_delete_says_what_to_grant")
    else {
        return;
    };
    // The database's own words alone ("permission denied for table events") said nothing of
    // what to do (bb57, a read-only SQLite file; the same failure as a role here).
    let (db, role, config) = migrated_by_a_role_with_an_old_event(
        &server,
        |url| config_text(url, ""),
        "stripe",
        "DELETE ON events",
    );
    let (code, _, stderr) = run_hookbox(
        &["purge", "--config", &config.path(), "--older-than", "1d"],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("does not take this user's deletes") && stderr.contains("grant"),
        "{stderr}"
    );
    assert!(!stderr.contains("  "), "one space between words: {stderr}");
    assert_eq!(db.count("events"), 1, "nothing removed");
    drop(db);
    drop(role);
}

#[test]
fn a_purge_that_fails_past_its_first_batches_says_what_they_removed() {
    let Some(server) =
        server_for_roles("a_purge_that_fails_past_its_first_batches_says_what_they_removed")
    else {
        return;
    };
    // A role granted before a migration added `transmissions` (an upgrade without the GRANT
    // run again): the pass removes the events, then is refused on the transmission ids. It
    // exited 1 without a word of what it had removed, and the hint named other tables.
    let (db, role, config) = migrated_by_a_role_with_an_old_event(
        &server,
        |url| config_text(url, ""),
        "stripe",
        "DELETE ON transmissions",
    );
    let (code, stdout, stderr) = run_hookbox(
        &["purge", "--config", &config.path(), "--older-than", "1d"],
        &[],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains("removed 1 from stripe before the failure"),
        "{stdout}"
    );
    assert!(
        stderr.contains("transmissions") && stderr.contains("GRANT"),
        "{stderr}"
    );
    assert_eq!(db.count("events"), 0, "the events went");
    drop(db);
    drop(role);
}

#[actix_web::test]
async fn serve_s_purge_that_fails_past_its_first_batches_counts_what_they_removed() {
    let Some(server) = server_for_roles(
        "serve_s_purge_that_fails_past_its_first_batches_counts_what_they_removed",
    ) else {
        return;
    };
    // As above, in serve's scheduled pass: its metrics and log lines left out what the
    // committed batches removed (a black-box run's counts were a batch of 5000 short). An
    // event of the first source in the pass's order, whose transmission ids go right after.
    let (db, role, config) = migrated_by_a_role_with_an_old_event(
        &server,
        |url| {
            format!(
                "{}\n[retention]\nwindow = \"5d\"\npurge_interval = \"1s\"\n",
                config_text(url, "")
            )
        },
        "acme",
        "DELETE ON transmissions",
    );
    let process = Process::serve(&std::fs::read_to_string(config.path()).expect("the config"));
    process.wait_for_log("purge pass failed");
    let line = process
        .log()
        .lines()
        .find(|l| l.contains("purge pass failed"))
        .map(str::to_owned)
        .expect("the line");
    assert!(
        line.contains("removed=1") && line.contains("by_source=acme=1"),
        "{line}"
    );
    let metrics = get(&process.address, "/metrics", None).await.text();
    assert!(
        metrics.contains("hookbox_purged_total{source=\"acme\"} 1"),
        "{metrics}"
    );
    assert_eq!(db.count("events"), 0);
    drop(process);
    drop(db);
    drop(role);
}
