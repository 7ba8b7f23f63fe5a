//! Pooled connections that died while idle (the database restarted, `pg_terminate_backend`, an
//! `idle_session_timeout`) are found and replaced before a request depends on them: once the
//! database answers, the next request succeeds.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use hookbox::{AnyConnection, Event, Handler, Handlers, Response};

use crate::forward::poll_until;
use crate::helpers::*;

/// Answers after a statement of its own, so its claims go through a transaction.
struct Touches;

impl Handler for Touches {
    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(Response::processed(event))
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Terminates every backend connected to `database`, and waits until those are gone (the pool
/// may open new ones meanwhile: those are alive, and not waited for).
async fn terminate_every_connection(database: &str) {
    #[derive(QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    let mut server = PgConnection::establish(&server_url()).expect("connect to the server");
    let terminated: Vec<i32> = diesel::sql_query(
        // In the select list, so that it runs only on the rows the filter kept.
        "SELECT pid, pg_terminate_backend(pid) AS terminated FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind::<diesel::sql_types::Text, _>(database)
    .load::<Pid>(&mut server)
    .expect("terminate the backends")
    .into_iter()
    .map(|row| row.pid)
    .collect();
    poll_until(
        "every terminated backend is gone",
        Duration::from_secs(10),
        || {
            diesel::sql_query("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind::<diesel::sql_types::Array<diesel::sql_types::Integer>, _>(&terminated)
                .get_result::<Count>(&mut server)
                .expect("count the backends")
                .n
                == 0
        },
    )
    .await;
}

/// Opens up to the whole pool: several deliveries at once, each of its own event.
async fn fill_the_pool(app: &TestApp) {
    let sends: Vec<_> = (0..8)
        .map(|n| {
            let source = if n % 2 == 0 { "stripe" } else { "github" };
            let id = unique_id("evt_fill");
            let delivery = app.delivery(source, &sample_body(source, &id), &id);
            async move { app.send(&delivery).await }
        })
        .collect();
    for answer in futures_util::future::join_all(sends).await {
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
}

#[actix_web::test]
async fn after_every_pooled_connection_is_terminated_the_next_requests_all_succeed() {
    if skip_on_sqlite(
        "after_every_pooled_connection_is_terminated_the_next_requests_all_succeed",
        "an SQLite connection is a file, with no server to terminate it",
    ) {
        return;
    }
    let app = TestApp::spawn_with("", Handlers::default().with("github", Touches)).await;
    fill_the_pool(&app).await;

    terminate_every_connection(&app.db.name).await;
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "/readyz: {}", ready.text());

    terminate_every_connection(&app.db.name).await;
    let mut statuses = Vec::new();
    for n in 0..10 {
        // Both ways of claiming: batched (stripe) and in a transaction (github).
        let source = if n % 2 == 0 { "stripe" } else { "github" };
        let id = unique_id("evt_after_kill");
        let answer = app
            .send(&app.delivery(source, &sample_body(source, &id), &id))
            .await;
        statuses.push((source, answer.status, answer.text()));
    }
    assert!(
        statuses.iter().all(|(_, status, _)| *status == 200),
        "{statuses:#?}"
    );

    terminate_every_connection(&app.db.name).await;
    let listed = app.get("/admin/events?limit=1", Some(ADMIN_TOKEN)).await;
    assert_eq!(listed.status, 200, "/admin/events: {}", listed.text());
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "/readyz: {}", ready.text());
}

/// A connection the pool cannot open is logged with its cause, once, whatever the requests
/// that found no connection say: r2d2 hands the cause to one of them only (a black-box run
/// out of file descriptors read "the database is unreachable", and "Too many open files"
/// was in no line).
#[actix_web::test]
async fn connections_the_pool_cannot_open_are_logged_with_their_cause() {
    use diesel::connection::SimpleConnection;
    if skip_on_sqlite(
        "connections_the_pool_cannot_open_are_logged_with_their_cause",
        "an embedded store keeps its connections open",
    ) {
        return;
    }
    let db = TestDb::create();
    let text = config_text(&db.url, "");
    let process = Process::serve(&text);
    let mut server = PgConnection::establish(&server_url()).expect("connect to the server");
    let allow = |server: &mut PgConnection, allowed: bool| {
        server
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS {allowed}",
                db.name
            ))
            .expect("alter the database");
    };
    allow(&mut server, false);
    terminate_every_connection(&db.name).await;
    let id = unique_id("evt_no_connection");
    let delivery = delivery_for(
        &parse_config(&text),
        "stripe",
        &stripe_event(&id, "charge.succeeded", 1),
        &id,
        unix_now(),
    );
    let refused = send(&process.address, &delivery).await;
    // Read once the reader has the line: the answer can come before it.
    process.wait_for_log("a database connection failed");
    let log = process.log();
    allow(&mut server, true);
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        log.lines()
            .any(|line| line.contains("a database connection failed")
                && line.contains("is not currently accepting connections")),
        "{log}"
    );
}
