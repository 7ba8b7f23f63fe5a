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

/// One row of the system's TCP tables (`/proc/net/tcp` and `tcp6`): `sl local rem st tx:rx
/// tr:when retrnsmt uid timeout inode`.
struct TcpRow {
    local_port: u16,
    remote_port: u16,
    /// `01` is ESTABLISHED.
    state: String,
    /// `tr:when`: `tr` 2 is the keepalive timer, `when` in clock ticks (USER_HZ, 100 a
    /// second) until it fires; `01` the retransmission timer (bytes in flight).
    timer: String,
    inode: u64,
}

fn tcp_rows() -> Vec<TcpRow> {
    let port = |field: &str| {
        field
            .rsplit_once(':')
            .and_then(|(_, port)| u16::from_str_radix(port, 16).ok())
    };
    let mut rows = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(state), Some(timer), Some(inode)) = (
                fields.get(1).and_then(|f| port(f)),
                fields.get(2).and_then(|f| port(f)),
                fields.get(3),
                fields.get(5),
                fields.get(9).and_then(|f| f.parse().ok()),
            ) else {
                continue;
            };
            rows.push(TcpRow {
                local_port: local,
                remote_port: remote,
                state: (*state).to_owned(),
                timer: (*timer).to_owned(),
                inode,
            });
        }
    }
    rows
}

/// The socket inodes process `pid` holds.
fn sockets_of(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's descriptors")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            link.strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Whether every timer of `rows` is a keepalive due within 10 s (or a retransmission: bytes in
/// flight as the table was read) and at least one is a keepalive (an idle connection); if not,
/// why.
fn probed_within_10_s(rows: &[&TcpRow], whose: &str) -> Result<(), String> {
    let timers: Vec<&str> = rows.iter().map(|row| row.timer.as_str()).collect();
    for timer in &timers {
        let (kind, when) = timer.split_once(':').expect("tr:when");
        let ticks = u64::from_str_radix(when, 16).expect("hex ticks");
        if !(kind == "01" || (kind == "02" && ticks <= 10 * 100 + 50)) {
            return Err(format!(
                "{whose}: a connection whose keepalive probe is not due within 10 s: {timer} \
                 ({timers:?})"
            ));
        }
    }
    if timers.iter().any(|timer| timer.starts_with("02:")) {
        Ok(())
    } else {
        Err(format!("{whose}: no idle connection found ({timers:?})"))
    }
}

#[actix_web::test]
async fn connections_to_postgresql_probe_a_silent_server_within_seconds() {
    if skip_on_sqlite(
        "connections_to_postgresql_probe_a_silent_server_within_seconds",
        "an embedded store has no connection",
    ) {
        return;
    }
    // A server that vanished without a word (a failover that black-holed the old address) was
    // found only by the system's TCP defaults: 2 hours for an idle connection. libpq's
    // keepalives are now asked of every connection: the first probe after 10 s of silence.
    // And the server's side of each (a black-box run): a session whose hookbox vanished kept
    // the instance's lock for 2 hours, and no other instance learnt of its death.
    let db = TestDb::create();
    let process = Process::serve(&config_text(&db.url, ""));
    let port = host_port(&db.url)
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .expect("the server's port");
    // A connection with bytes in flight as the table is read shows its retransmission timer
    // instead (it is not idle then), and one the pool has just opened shows the server's
    // default until its session is set up: read again until every connection is set up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let sockets = sockets_of(process.child.id());
        let rows = tcp_rows();
        let ours: Vec<&TcpRow> = rows
            .iter()
            .filter(|row| {
                sockets.contains(&row.inode) && row.remote_port == port && row.state == "01"
            })
            .collect();
        let theirs: Vec<&TcpRow> = rows
            .iter()
            .filter(|row| {
                row.local_port == port
                    && row.state == "01"
                    && ours.iter().any(|o| o.local_port == row.remote_port)
            })
            .collect();
        assert_eq!(theirs.len(), ours.len(), "each connection's server side");
        let checked = probed_within_10_s(&ours, "hookbox's side")
            .and_then(|()| probed_within_10_s(&theirs, "PostgreSQL's side"));
        match checked {
            Ok(()) => return,
            Err(why) => assert!(std::time::Instant::now() < deadline, "for 10 s: {why}"),
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
}
