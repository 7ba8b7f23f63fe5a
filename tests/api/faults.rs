//! Faults under load: the server killed, the database restarted, its connection cut or
//! stalled, more deliveries than connections. After each, the invariants of
//! [`assert_invariants`] hold: nothing acknowledged is lost or answered differently, nothing is
//! processed twice, nothing is left that blocks a retry.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use futures_util::future::join_all;
use hookbox::Handlers;

use crate::cluster::{self, Cluster};
use crate::helpers::*;
use crate::provider::*;
use crate::proxy::Proxy;

#[actix_web::test]
async fn a_server_killed_mid_load_loses_nothing_and_the_providers_retries_complete_on_restart() {
    let db = TestDb::create();
    let config = config_text(&db.url, "");
    let mut first = Process::serve(&config);
    count_side_effects_with_a_trigger(&db.url);
    let provider = Provider::new(&parse_config(&config));
    let all = webhooks(300);

    // Every event once, all at once; SIGKILL once a few dozen are answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut delivered, in_flight) = tokio::join!(
        join_all(
            all.iter()
                .map(|w| provider.deliver(&first.address, w, 1, deadline))
        ),
        async {
            provider.until_acked(30, Duration::from_secs(30)).await;
            first.child.kill().expect("SIGKILL hookbox");
            let in_flight = all.len() - provider.acked.load(Ordering::SeqCst);
            first.child.wait().expect("reap hookbox");
            in_flight
        }
    );
    assert!(
        in_flight >= 100,
        "hundreds of deliveries were in flight at the kill ({in_flight})"
    );
    let unanswered = delivered.iter().filter(|d| d.acked.is_none()).count();
    assert!(
        unanswered >= 100,
        "the kill cut {unanswered} deliveries short"
    );

    // The provider retries everything that got no 2xx, against the restarted server.
    let second = Process::serve(&config);
    let deadline = Instant::now() + Duration::from_secs(60);
    join_all(
        delivered
            .iter_mut()
            .map(|d| provider.deliver_more(&second.address, d, 50, deadline)),
    )
    .await;
    assert_invariants(&provider, &second.address, &db.url, &delivered).await;
}

#[actix_web::test]
async fn a_postgres_fast_restart_mid_load_is_503_with_retry_after_then_recovers_by_itself() {
    if skip_on_sqlite(
        "a_postgres_fast_restart_mid_load_is_503_with_retry_after_then_recovers_by_itself",
        "it restarts a PostgreSQL server",
    ) {
        return;
    }
    let cluster =
        match Cluster::start() {
            Ok(cluster) => cluster,
            Err(reason) => return cluster::skip(
                "a_postgres_fast_restart_mid_load_is_503_with_retry_after_then_recovers_by_itself",
                &reason,
            ),
        };
    cluster.create_database("hookbox");
    let url = cluster.url("hookbox");
    let config = parse_config(&config_text(&url, ""));
    let address = serve_in_process(
        config.clone(),
        Handlers::default().with("stripe", Counting::new(Duration::from_millis(20))),
    );
    let provider = Provider::new(&config);
    let all = webhooks(120);

    let deadline = Instant::now() + Duration::from_secs(60);
    let (delivered, ()) = tokio::join!(
        join_all(
            all.iter()
                .map(|w| provider.deliver(&address, w, 200, deadline))
        ),
        async {
            provider.until_acked(20, Duration::from_secs(30)).await;
            cluster.stop_fast();
            eventually(
                "a 503 while PostgreSQL is down",
                Duration::from_secs(20),
                || provider.unavailable.load(Ordering::SeqCst) > 0,
            )
            .await;
            let ready = get(&address, "/readyz", None).await;
            assert_eq!(ready.status, 503, "not ready while PostgreSQL is down");
            cluster.start_again();
        }
    );

    let attempts: Vec<&Attempt> = delivered.iter().flat_map(|d| &d.attempts).collect();
    let unexpected: Vec<_> = attempts
        .iter()
        .filter(|a| !matches!(a.status, Some(200) | Some(503)))
        .collect();
    assert!(unexpected.is_empty(), "only 200 and 503: {unexpected:?}");
    assert!(
        attempts
            .iter()
            .filter(|a| a.status == Some(503))
            .all(|a| a.retry_after && a.error == "unavailable"),
        "every 503 is `unavailable` with a Retry-After"
    );
    assert_eq!(get(&address, "/readyz", None).await.status, 200);
    // The connections that died with the old server were dropped, not handed out again, and
    // the pool holds no more than its size.
    let live = count_at(&url, "pg_stat_activity WHERE application_name = 'hookbox'");
    assert!(
        (1..=i64::from(config.database.pool_size)).contains(&live),
        "{live} connections"
    );
    assert_invariants(&provider, &address, &url, &delivered).await;
}

/// Whether the proxy cuts the connections or stalls them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Loss {
    Cut,
    Stall,
}

/// Deliveries whose transactions are open when the connection to PostgreSQL is lost: each
/// is answered 503 within the request timeout, PostgreSQL rolls the transactions back (at
/// once on a cut, after its idle-in-transaction timeout on a stall), a second instance on a
/// working connection then processes the retries without waiting on anything, and the first
/// instance recovers once the connection is back.
async fn connection_lost_mid_transaction(loss: Loss) {
    if skip_on_sqlite(
        &format!("connection_lost_mid_transaction({loss:?})"),
        "an embedded store has no connection to cut or stall",
    ) {
        return;
    }
    let db = TestDb::create();
    // What a stall leaves behind is abandoned by the server after this long.
    diesel::sql_query(format!(
        "ALTER DATABASE {} SET idle_in_transaction_session_timeout = '2s'",
        db.name
    ))
    .execute(&mut db.connect())
    .expect("set the database's idle timeout");
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"3s\"");
    let direct = parse_config(&text);
    let proxied = parse_config(&text.replace(&db.url, &proxied_url));
    let handler = Counting::new(Duration::from_millis(400));
    let entered = handler.entered.clone();
    let behind_proxy = serve_in_process(proxied, Handlers::default().with("stripe", handler));
    let other = serve_in_process(
        direct.clone(),
        Handlers::default().with("stripe", Counting::new(Duration::ZERO)),
    );
    let provider = Provider::new(&direct);
    let all = webhooks(8);

    // Eight at once through a pool of four: three in their handlers (the fourth connection is
    // the claim writer's own, for the other sources' batched claims), five waiting for a
    // connection, when the connection is lost.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut delivered, ()) = tokio::join!(
        join_all(
            all.iter()
                .map(|w| provider.deliver(&behind_proxy, w, 1, deadline))
        ),
        async {
            eventually("three handlers running", Duration::from_secs(10), || {
                entered.load(Ordering::SeqCst) >= 3
            })
            .await;
            match loss {
                Loss::Cut => proxy.cut(),
                Loss::Stall => proxy.stall(),
            }
        }
    );
    for d in &delivered {
        let attempt = &d.attempts[0];
        assert_eq!(
            (attempt.status, attempt.error.as_str(), attempt.retry_after),
            (Some(503), "unavailable", true),
            "{loss:?}: {attempt:?}"
        );
        assert!(
            attempt.elapsed < Duration::from_secs(5),
            "{loss:?}: answered within the 3 s request timeout: {attempt:?}"
        );
    }
    eventually(
        "PostgreSQL rolls the lost transactions back",
        Duration::from_secs(15),
        || open_transactions(&db.url) == 0,
    )
    .await;

    // Nothing the lost transactions claimed blocks the retries.
    let deadline = Instant::now() + Duration::from_secs(20);
    join_all(
        delivered
            .iter_mut()
            .map(|d| provider.deliver_more(&other, d, 1, deadline)),
    )
    .await;
    for d in &delivered {
        let acked = d
            .acked
            .as_ref()
            .unwrap_or_else(|| panic!("{loss:?}: {:?}", d.attempts));
        assert!(
            !acked.replayed(),
            "{loss:?}: rolled back, so processed afresh"
        );
    }

    proxy.restore();
    let mut probe = vec![
        provider
            .deliver(&behind_proxy, &webhooks(1)[0], 100, deadline)
            .await,
    ];
    assert!(
        probe[0].acked.is_some(),
        "{loss:?}: the first instance recovers: {:?}",
        probe[0].attempts
    );
    delivered.append(&mut probe);
    assert_invariants(&provider, &behind_proxy, &db.url, &delivered).await;
}

#[actix_web::test]
async fn a_connection_to_postgres_cut_mid_transaction_is_503_rolled_back_and_retried_cleanly() {
    connection_lost_mid_transaction(Loss::Cut).await;
}

#[actix_web::test]
async fn a_stalled_connection_to_postgres_times_out_is_rolled_back_and_retried_cleanly() {
    connection_lost_mid_transaction(Loss::Stall).await;
}

#[actix_web::test]
async fn three_hundred_deliveries_at_once_through_four_connections_are_each_200_or_503() {
    let db = TestDb::create();
    let config = parse_config(&config_text(&db.url, ""));
    // 300 handlers of 60 ms through four connections take 4.5 s, past the 3 s a request waits
    // for a connection: the later ones must be turned away with a 503, not queued for ever.
    let address = serve_in_process(
        config.clone(),
        Handlers::default().with("stripe", Counting::new(Duration::from_millis(60))),
    );
    let mut provider = Provider::new(&config);
    provider.patience = Duration::from_secs(20);
    let all = webhooks(300);

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delivered = join_all(
        all.iter()
            .map(|w| provider.deliver(&address, w, 1, deadline)),
    )
    .await;
    // On SQLite the wait is for the one write lock, past the in-flight wait: 409 `in_progress`
    // with a Retry-After, the answer for a delivery that waited too long on another's write.
    let turned_away_with = |attempt: &Attempt| match attempt.status {
        Some(503) => true,
        Some(409) => store_is_sqlite() && attempt.error == "in_progress",
        _ => false,
    };
    for d in &delivered {
        let attempt = &d.attempts[0];
        assert!(
            attempt.status == Some(200) || turned_away_with(attempt),
            "200 or 503 (409 on SQLite), none 500, none unanswered: {attempt:?}"
        );
        if attempt.status != Some(200) {
            assert!(attempt.retry_after, "{attempt:?}");
        }
    }
    let turned_away = delivered
        .iter()
        .filter(|d| turned_away_with(&d.attempts[0]))
        .count();
    assert!(
        (1..all.len()).contains(&turned_away),
        "some were served and some turned away: {turned_away} of 300 got 503 (or 409)"
    );
    join_all(
        delivered
            .iter_mut()
            .map(|d| provider.deliver_more(&address, d, 50, deadline)),
    )
    .await;
    assert_invariants(&provider, &address, &db.url, &delivered).await;
}

#[actix_web::test]
async fn a_stalled_connection_under_the_built_in_handler_is_503_in_time_then_recovers() {
    if skip_on_sqlite(
        "a_stalled_connection_under_the_built_in_handler_is_503_in_time_then_recovers",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    // The built-in handler's claims go through the batch writer, not a transaction per
    // delivery: a stall must not hold them past the request timeout either.
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"3s\"");
    let config = parse_config(&text.replace(&db.url, &proxied_url));
    let address = serve_in_process(config, Handlers::default());
    count_side_effects_with_a_trigger(&db.url);
    let provider = Provider::new(&parse_config(&text));
    let deadline = Instant::now() + Duration::from_secs(40);
    let warm = provider
        .deliver(&address, &webhooks(1)[0], 1, deadline)
        .await;
    assert!(warm.acked.is_some(), "{:?}", warm.attempts);

    proxy.stall();
    let stalled = webhooks(8);
    let mut delivered = join_all(
        stalled
            .iter()
            .map(|w| provider.deliver(&address, w, 1, deadline)),
    )
    .await;
    for d in &delivered {
        let attempt = &d.attempts[0];
        assert_eq!(
            (attempt.status, attempt.retry_after),
            (Some(503), true),
            "{attempt:?}"
        );
        assert!(attempt.elapsed < Duration::from_secs(5), "{attempt:?}");
    }

    proxy.restore();
    // The claims may still commit now that the stall has ended: the answers must not have
    // said that nothing was stored. (Checked once the proxy lets the claims go.)
    for d in &delivered {
        let attempt = &d.attempts[0];
        assert!(
            attempt.message.contains("may still be stored")
                && !attempt.message.contains("nothing was stored"),
            "{attempt:?}"
        );
    }
    join_all(
        delivered
            .iter_mut()
            .map(|d| provider.deliver_more(&address, d, 200, deadline)),
    )
    .await;
    delivered.push(warm);
    assert_invariants(&provider, &address, &db.url, &delivered).await;
}

#[actix_web::test]
async fn a_claim_whose_turn_comes_after_its_503_is_not_made_once_the_stall_ends() {
    if skip_on_sqlite(
        "a_claim_whose_turn_comes_after_its_503_is_not_made_once_the_stall_ends",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    // Claims queued behind a stalled connection were made whenever it came back (a black-box
    // run: 9 minutes after their 503s, under their old received times, and an ordered target
    // got them far out of order). Both claim paths: the batch writer's (the built-in handler)
    // and a transaction's (a handler that writes).
    for handlers in [
        Handlers::default(),
        Handlers::default().with("stripe", Counting::new(Duration::ZERO)),
    ] {
        let db = TestDb::create();
        let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
        let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"2s\"");
        let config = parse_config(&text.replace(&db.url, &proxied_url));
        let address = serve_in_process(config, handlers);
        let parsed = parse_config(&text);
        let post = |id: &str| {
            delivery_for(
                &parsed,
                "stripe",
                &stripe_event(id, "charge.succeeded", 1),
                id,
                unix_now(),
            )
        };
        let warm = unique_id("evt_warm");
        assert_eq!(send(&address, &post(&warm)).await.status, 200);

        proxy.stall();
        // The first takes the connection or the writer, and waits in the stall; those after
        // it wait their turns behind it.
        let first = unique_id("evt_first");
        let waiting: Vec<String> = (0..6).map(|_| unique_id("evt_behind")).collect();
        let first_delivery = post(&first);
        let first_sent = send(&address, &first_delivery);
        let behind_deliveries: Vec<_> = waiting.iter().map(|id| post(id)).collect();
        let behind = async {
            actix_web::rt::time::sleep(Duration::from_millis(800)).await;
            join_all(behind_deliveries.iter().map(|d| send(&address, d))).await
        };
        let (first_answer, behind_answers) = tokio::join!(first_sent, behind);
        assert_eq!(first_answer.status, 503, "{}", first_answer.text());
        for answer in &behind_answers {
            assert_eq!(answer.status, 503, "{}", answer.text());
        }
        proxy.restore();
        // A delivery after the stall is claimed behind whatever still waited.
        let after = unique_id("evt_after");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = send(&address, &post(&after)).await;
            if answer.status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "{}", answer.text());
        }
        let stored = |id: &str| db.count(&format!("events WHERE event_id = '{id}'"));
        let late: Vec<&String> = waiting.iter().filter(|id| stored(id) > 0).collect();
        assert!(late.is_empty(), "claimed after their 503s: {late:?}");
    }
}

#[actix_web::test]
async fn readyz_answers_503_within_the_request_timeout_while_the_database_stalls() {
    if skip_on_sqlite(
        "readyz_answers_503_within_the_request_timeout_while_the_database_stalls",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"2s\"");
    let config = parse_config(&text.replace(&db.url, &proxied_url));
    let address = serve_in_process(config, Handlers::default());
    let ready = get(&address, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    proxy.stall();
    let stalled =
        actix_web::rt::time::timeout(Duration::from_secs(10), get(&address, "/readyz", None)).await;
    proxy.restore();
    let stalled = stalled.expect("/readyz answered nothing within 10 s while the database stalled");
    assert_eq!(stalled.status, 503, "{}", stalled.text());
    assert_eq!(stalled.json()["error"], "unavailable");

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let again = get(&address, "/readyz", None).await;
        if again.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready again: {}",
            again.text()
        );
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The admin API and the console answer 503 within the request timeout while the database
/// stalls, as a delivery does (a black-box run's console pages and admin reads were still
/// unanswered after 150 s).
#[actix_web::test]
async fn the_admin_api_and_the_console_answer_503_in_time_while_the_database_stalls() {
    if skip_on_sqlite(
        "the_admin_api_and_the_console_answer_503_in_time_while_the_database_stalls",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"2s\"");
    let config = parse_config(&text.replace(&db.url, &proxied_url));
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;
    let cookie = crate::console::log_in(&app).await;
    let listed = app.get("/admin/events", Some(ADMIN_TOKEN)).await;
    assert_eq!(listed.status, 200, "{}", listed.text());

    proxy.stall();
    let within = Duration::from_secs(10);
    let admin =
        actix_web::rt::time::timeout(within, app.get("/admin/events", Some(ADMIN_TOKEN))).await;
    let page = actix_web::rt::time::timeout(
        within,
        crate::console::get_page(&app, "/console/events", Some(&cookie)),
    )
    .await;
    proxy.restore();
    let admin = admin.expect("the admin API answered nothing within 10 s");
    assert_eq!(admin.status, 503, "{}", admin.text());
    assert_eq!(admin.json()["error"], "unavailable");
    assert!(admin.header("Retry-After").is_some(), "{:?}", admin.headers);
    // A read: its answer speaks of no change that may still be made.
    assert!(!admin.message().contains("change"), "{}", admin.text());
    let page = page.expect("the console answered nothing within 10 s");
    assert_eq!(page.status, 503, "{}", page.text());
    assert!(!page.text().contains("re-queue"), "{}", page.text());
}

#[actix_web::test]
async fn readyz_answers_within_5_s_while_the_database_stalls_whatever_the_request_timeout() {
    if skip_on_sqlite(
        "readyz_answers_within_5_s_while_the_database_stalls_whatever_the_request_timeout",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    // With the default request timeout (30 s) a probe waited 28 s for its 503 while the
    // database was cut off; a load balancer's probe gives up long before (a black-box run).
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let address = serve_in_process(
        parse_config(&config_text(&proxied_url, "")),
        Handlers::default(),
    );
    let ready = get(&address, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    proxy.stall();
    let asked = Instant::now();
    let stalled =
        actix_web::rt::time::timeout(Duration::from_secs(9), get(&address, "/readyz", None)).await;
    let took = asked.elapsed();
    proxy.restore();
    let stalled = stalled.expect("/readyz answered nothing within 9 s while the database stalled");
    assert_eq!(stalled.status, 503, "{}", stalled.text());
    assert!(
        stalled.message().contains("at most 5 s"),
        "{}",
        stalled.text()
    );
    assert!(took >= Duration::from_secs(5), "waited its bound: {took:?}");
}

/// Work left waiting on a database that stopped answering (a `/readyz` check, an admin read,
/// a purge batch: each on a thread of its own, blocked in a query) does not keep `serve` alive
/// once it has stopped: a black-box run's serve logged `hookbox stopped` and was still there 70 s
/// later, until SIGKILL.
#[actix_web::test]
async fn serve_exits_once_stopped_though_queries_wait_on_a_stalled_database() {
    if skip_on_sqlite(
        "serve_exits_once_stopped_though_queries_wait_on_a_stalled_database",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    // A purge pass every second, so one is sure to wait on the stall too.
    let text = format!(
        "{}\n[retention]\npurge_interval = \"1s\"\n",
        with_server_keys(&config_text(&db.url, ""), "request_timeout = \"2s\"")
    );
    let mut process = Process::serve(&text.replace(&db.url, &proxied_url));
    let ready = get(&process.address, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());

    proxy.stall();
    // Answered 503 in time; the queries stay blocked on their threads.
    let stalled = get(&process.address, "/readyz", None).await;
    assert_eq!(stalled.status, 503, "{}", stalled.text());
    let listed = get(&process.address, "/admin/events", Some(ADMIN_TOKEN)).await;
    assert_eq!(listed.status, 503, "{}", listed.text());
    // The next pass starts, and waits.
    let passes = |log: &str| log.matches("purge pass done").count();
    let before = passes(&process.log());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(passes(&process.log()), before, "{}", process.log());
    process.terminate();
    process.wait_for_log("hookbox stopped");
    let status = process.wait_exit(Duration::from_secs(10));
    proxy.restore();
    assert!(status.success(), "{status:?}\n{}", process.log());
    // The pass left waiting is said, as no `purge pass` line of its own comes.
    let log = process.log();
    assert!(log.contains("purge pass abandoned at the stop"), "{log}");
}

/// A store that may not grow past the process's file-size limit (`ulimit -f`): the deliveries
/// that need it to grow get a 503 and serve stays up (SIGXFSZ ended it mid-load, found by a
/// black-box run; a supervisor then restarted it into the same limit).
#[actix_web::test]
async fn a_file_size_limit_reached_is_a_503_not_the_end_of_serve() {
    if !store_is_sqlite() {
        eprintln!(
            "a_file_size_limit_reached_is_a_503_not_the_end_of_serve: skipped on PostgreSQL: \
             the limit is on the files this process writes, and PostgreSQL's are its server's"
        );
        return;
    }
    let db = TestDb::create();
    let config = config_text(&db.url, "");
    // 2 MB, in the shell's 512-byte blocks: the migrated store and a few dozen events.
    let mut server = Process::serve_after("ulimit -f 4096", &config);
    let refused = first_refusal_of_big_events(&server, &config).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    // Said as what it is, not as migrations pending.
    assert!(refused.text().contains("I/O error"), "{}", refused.text());
    assert!(refused.header("Retry-After").is_some());
    assert!(
        server.child.try_wait().expect("poll").is_none(),
        "serve is still up:\n{}",
        server.log()
    );
    let health = client()
        .get(format!("{}/healthz", server.address))
        .send()
        .await
        .expect("serve answers");
    assert_eq!(health.status().as_u16(), 200);
    // Logged by the signal's own task, which may run after the 503 is answered.
    server.wait_for_log("file-size limit");
}

/// Sends events of about 40 KB to `server` (serving `config`) until one is not answered 200,
/// and returns that answer: the store has run out of room (400 events at most).
async fn first_refusal_of_big_events(server: &Process, config: &str) -> Answer {
    let parsed = parse_config(config);
    for i in 0..400 {
        let id = unique_id("evt");
        let body = stripe_event(&id, &format!("big.{}", "x".repeat(40_000 + i)), 1);
        let delivery = delivery_for(&parsed, "stripe", &body, &id, unix_now());
        let answer = try_send(&server.address, &delivery, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("no answer ({e}), serve still up?\n{}", server.log()));
        if answer.status != 200 {
            return answer;
        }
    }
    panic!("400 events of 40 KB were all stored: the store never ran out of room")
}

/// A filesystem of its own, `size` big, mounted for a test (tmpfs) and unmounted when dropped.
/// Mounting takes root; where it is refused, [`SmallDisk::mount`] says so and gives `None`.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = std::env::temp_dir().join(unique_id("hookbox-small-disk"));
        std::fs::create_dir_all(&dir).expect("make the mount point");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .map(|out| out.status.success())
            .unwrap_or(false);
        if !mounted {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(SmallDisk { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A store that was not writable as serve started is taken as soon as it is made writable:
/// SQLite opened it read-only on each pooled connection, which stayed so until the pool retired
/// it, and every delivery was 503 for ten minutes more (a black-box run). The log says both
/// ends: the outbox's take refused (not "cannot read", which it can), and the first delivery
/// stored again, after how many failed (no line said so).
#[actix_web::test]
async fn a_store_made_writable_again_takes_deliveries_at_once() {
    if !store_is_sqlite() {
        eprintln!(
            "a_store_made_writable_again_takes_deliveries_at_once: skipped on PostgreSQL: the \
             file made writable is the SQLite store's"
        );
        return;
    }
    // The file modes bind only a user other than root: serve runs as nobody.
    let Some(as_nobody) = as_nobody() else {
        eprintln!(
            "a_store_made_writable_again_takes_deliveries_at_once: skipped: it runs serve as \
             another user, which takes root and setpriv"
        );
        return;
    };
    let dir = std::env::temp_dir().join(unique_id("hookbox-read-only"));
    std::fs::create_dir_all(&dir).expect("a directory");
    // Nobody makes its -shm and -wal here.
    set_mode(&dir, 0o777);
    let file = dir.join("hookbox.db");
    let config = config_text(
        &format!("sqlite://{}", file.display()),
        &crate::forward::forward_extra("http://127.0.0.1:9/hooks", "1s", 12),
    );
    let parsed = parse_config(&config);
    let post = |id: &str| {
        let body = stripe_event(id, "charge.succeeded", 1);
        delivery_for(&parsed, "stripe", &body, id, unix_now())
    };
    // One delivery queued while the file is writable, for the outbox's take to lease.
    let mut writable = Process::serve(&config);
    let queued = send(&writable.address, &post(&unique_id("evt"))).await;
    assert_eq!(queued.status, 200, "{}", queued.text());
    writable.terminate();
    writable.wait_exit(Duration::from_secs(30));
    // Readable by nobody, not writable; the -wal and -shm a stop may leave are nobody's to
    // open.
    set_mode(&file, 0o644);
    for suffix in ["-wal", "-shm"] {
        let left = dir.join(format!("hookbox.db{suffix}"));
        if left.exists() {
            set_mode(&left, 0o666);
        }
    }
    let server = Process::serve_through(&as_nobody, &config);
    for _ in 0..2 {
        let refused = send(&server.address, &post(&unique_id("evt"))).await;
        assert_eq!(refused.status, 503, "{}", refused.text());
    }
    server.wait_for_log_within(
        "cannot take rows from the outbox: the database refuses the write that leases them",
        Duration::from_secs(30),
    );
    assert!(
        !server.log().contains("cannot read the outbox"),
        "{}",
        server.log()
    );
    set_mode(&file, 0o666);
    let taken = send(&server.address, &post(&unique_id("evt"))).await;
    assert_eq!(taken.status, 200, "{}\n{}", taken.text(), server.log());
    let ready = get(&server.address, "/readyz", None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    server.wait_for_log("the outbox can be read again");
    let stored_again: Vec<String> = server
        .log()
        .lines()
        .filter(|line| line.contains("the store takes deliveries again"))
        .map(str::to_owned)
        .collect();
    assert!(
        stored_again.len() == 1 && stored_again[0].contains("failed=2"),
        "one line, after the two that failed: {stored_again:?}\n{}",
        server.log()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A redelivery needs no room: on a full disk a stored event's same payload is still its
/// stored answer, and another payload under its id still `422 event_id_reused`, also from a
/// process started on the full disk (both were 503s "retry later", the 422 for a delivery no
/// retry makes storable, found by a black-box run).
#[actix_web::test]
async fn on_a_full_disk_a_reused_event_id_is_still_a_422() {
    if !store_is_sqlite() {
        eprintln!(
            "on_a_full_disk_a_reused_event_id_is_still_a_422: skipped on PostgreSQL: the disk \
             filled is the SQLite file's"
        );
        return;
    }
    let Some(disk) = SmallDisk::mount("8m") else {
        eprintln!(
            "on_a_full_disk_a_reused_event_id_is_still_a_422: skipped: a tmpfs cannot be \
             mounted here (it takes root)"
        );
        return;
    };
    let url = format!("sqlite://{}", disk.dir.join("hookbox.db").display());
    // A forwarding source, as in the black-box run: with its dispatcher reading beside the
    // writes, the log is left long.
    let config = config_text(
        &url,
        &crate::forward::forward_extra("http://127.0.0.1:9/hooks", "1s", 3),
    );
    let parsed = parse_config(&config);
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 1);
    let server = Process::serve(&config);
    let first = send(
        &server.address,
        &delivery_for(&parsed, "stripe", &body, &id, unix_now()),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    // Full: events of 2 KB, eight at a time, until one is refused.
    'full: loop {
        let sends = (0..8).map(|_| {
            let id = unique_id("evt");
            let small = stripe_event(&id, &format!("small.{}", "x".repeat(2000)), 1);
            let delivery = delivery_for(&parsed, "stripe", &small, &id, unix_now());
            let address = server.address.clone();
            async move { send(&address, &delivery).await }
        });
        for answer in futures_util::future::join_all(sends).await {
            if answer.status != 200 {
                assert!(answer.text().contains("disk is full"), "{}", answer.text());
                break 'full;
            }
        }
    }
    // A new process, killed and started again on the full disk: nothing answered from
    // memory, and SQLite refuses even an INSERT that would conflict (seen with a log of more
    // than 1,000 pages left by the old process: hence a disk of 8 MB).
    drop(server);
    let server = Process::serve(&config);
    // Each more than once: the first write after the start could still be made.
    let other = stripe_event(&id, "charge.refunded", 1);
    for round in 0..5 {
        let same = send(
            &server.address,
            &delivery_for(&parsed, "stripe", &body, &id, unix_now()),
        )
        .await;
        assert_eq!(same.status, 200, "round {round}: {}", same.text());
        assert_eq!(same.header("Idempotent-Replayed"), Some("true"));
        let reused = send(
            &server.address,
            &delivery_for(&parsed, "stripe", &other, &id, unix_now()),
        )
        .await;
        assert_eq!(reused.status, 422, "round {round}: {}", reused.text());
        assert!(
            reused.text().contains("event_id_reused"),
            "{}",
            reused.text()
        );
    }
    drop(server);
    drop(disk);
}

/// `/readyz`'s own write is rolled back before SQLite needs a new page, so it cannot see a full
/// disk; once a delivery failed for one, it answers not ready (for 30 s after the last such
/// failure), so a load balancer stops sending to an instance whose every delivery fails. The
/// stop that cannot checkpoint and a purge that cannot delete say what that means and what to
/// do.
#[actix_web::test]
async fn a_full_disk_is_said_by_readyz_by_the_stop_and_by_purge() {
    if !store_is_sqlite() {
        eprintln!(
            "a_full_disk_is_said_by_readyz_by_the_stop_and_by_purge: skipped on \
             PostgreSQL: the disk filled is the SQLite file's"
        );
        return;
    }
    let Some(disk) = SmallDisk::mount("3m") else {
        eprintln!(
            "a_full_disk_is_said_by_readyz_by_the_stop_and_by_purge: skipped: a tmpfs \
             cannot be mounted here (it takes root)"
        );
        return;
    };
    let url = format!("sqlite://{}", disk.dir.join("hookbox.db").display());
    let config = config_text(&url, "");
    let server = Process::serve(&config);
    assert_eq!(get(&server.address, "/readyz", None).await.status, 200);
    let refused = first_refusal_of_big_events(&server, &config).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(
        refused.text().contains("disk is full"),
        "{}",
        refused.text()
    );
    let ready = get(&server.address, "/readyz", None).await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert!(ready.text().contains("disk is full"), "{}", ready.text());
    assert!(ready.header("Retry-After").is_some());
    // What it means and what to do, with the file's disk, said once while it lasts.
    let again = first_refusal_of_big_events(&server, &config).await;
    assert_eq!(again.status, 503, "{}", again.text());
    let log = server.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("the database's disk is full"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains(&disk.dir.display().to_string()) && said[0].contains("free space"),
        "{}",
        said[0]
    );
    // The clean stop cannot move the log into the file on a full disk: said with what it
    // means for a backup (a copy of the file alone, the usual backup after a clean stop, read
    // as malformed in a black-box run).
    server.terminate();
    server.wait_for_log("hookbox stopped");
    let log = server.log();
    let said = log
        .lines()
        .find(|l| l.contains("checkpoint failed"))
        .unwrap_or_else(|| panic!("the stop says the checkpoint failed:\n{log}"));
    assert!(
        said.contains("not a backup") && said.contains("-wal"),
        "{said}"
    );
    drop(server);
    // purge cannot free a full disk (its deletes need room too), and says what to do instead
    // rather than only the database's words (a black-box run).
    let file = TempFile::new(&config);
    let (code, _, stderr) = run_hookbox(
        &["purge", "--config", &file.path(), "--older-than", "0s"],
        &[],
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("free space on that disk by other means first"),
        "{stderr}"
    );
    drop(disk);
}
