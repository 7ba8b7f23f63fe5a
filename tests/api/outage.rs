//! The database going away under a running server, and coming back.

use std::time::Duration;

use hookbox::Handlers;

use crate::helpers::*;
use crate::proxy::Proxy;

#[actix_web::test]
async fn while_the_database_is_unreachable_deliveries_get_503_and_the_server_recovers_by_itself() {
    if skip_on_sqlite(
        "while_the_database_is_unreachable_deliveries_get_503_and_the_server_recovers_by_itself",
        "an embedded store cannot become unreachable",
    ) {
        return;
    }
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let config = parse_config(&config_text(&proxied_url, ""));
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;

    let stored_id = unique_id("evt");
    let stored_body = stripe_event(&stored_id, "charge.succeeded", 1);
    let stored = app
        .send(&app.delivery("stripe", &stored_body, &stored_id))
        .await;
    assert_eq!(stored.status, 200);
    assert_eq!(app.get("/readyz", None).await.status, 200);

    proxy.cut();
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 1);
    for _ in 0..3 {
        let answer = app.send(&app.delivery("stripe", &body, &id)).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (503, "unavailable"),
            "{}",
            answer.text()
        );
        assert!(answer
            .header("Retry-After")
            .is_some_and(|v| v.parse::<u64>().is_ok()));
    }
    // An admin read is refused as unavailable too; its sentence says what is wrong, and not
    // that "nothing was stored" (it asked to store nothing; a black-box run).
    let admin = app.get("/admin/events", Some(ADMIN_TOKEN)).await;
    assert_eq!(
        (admin.status, admin.error().as_str()),
        (503, "unavailable"),
        "{}",
        admin.text()
    );
    assert!(
        admin.message().contains("unreachable") && !admin.message().contains("stored"),
        "{}",
        admin.text()
    );
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 503);
    assert_eq!(
        app.get("/healthz", None).await.status,
        200,
        "the process itself is up"
    );

    proxy.restore();
    let mut answer = app.send(&app.delivery("stripe", &body, &id)).await;
    for _ in 0..20 {
        if answer.status == 200 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(250)).await;
        answer = app.send(&app.delivery("stripe", &body, &id)).await;
    }
    assert_eq!(
        answer.status,
        200,
        "recovered without a restart: {}",
        answer.text()
    );
    assert!(!answer.replayed(), "the refused delivery was not stored");
    assert_eq!(app.get("/readyz", None).await.status, 200);

    let again = app
        .send(&app.delivery("stripe", &stored_body, &stored_id))
        .await;
    assert!(
        again.replayed(),
        "an event stored before the outage is still a replay"
    );
    assert_eq!(again.body, stored.body);
}

/// How many lines of `server`'s log hold both `level` and `text`.
fn lines_of(server: &Process, level: &str, text: &str) -> usize {
    server
        .log()
        .lines()
        .filter(|line| line.contains(level) && line.contains(text))
        .count()
}

/// A database behind a proxy, and the config of a source that forwards to a target nobody
/// listens on: nothing is queued, so only the dispatcher's takes touch the outbox.
fn forwarding_behind_a_proxy() -> (TestDb, Proxy, String) {
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let config = config_text(
        &proxied_url,
        &crate::forward::forward_extra("http://127.0.0.1:1/hook", "2s", 3),
    );
    (db, proxy, config)
}

/// The dispatcher retries its take at every look (at least every 250 ms); an outage of the
/// database is one WARN, not four lines a second, and its end is said once.
#[actix_web::test]
async fn an_outbox_that_cannot_be_read_is_warned_about_once_and_its_end_is_logged() {
    if skip_on_sqlite(
        "an_outbox_that_cannot_be_read_is_warned_about_once_and_its_end_is_logged",
        "an embedded store cannot become unreachable",
    ) {
        return;
    }
    let (_db, proxy, config) = forwarding_behind_a_proxy();
    let server = Process::serve_with_env(&config, &[("RUST_LOG", "info,hookbox=debug")]);
    let lines = |level: &str, text: &str| lines_of(&server, level, text);

    proxy.cut();
    crate::forward::poll_until("three takes failed", Duration::from_secs(60), || {
        lines("DEBUG", "cannot read the outbox") >= 3
    })
    .await;
    proxy.restore();
    crate::forward::poll_until(
        "the end of the outage is logged",
        Duration::from_secs(60),
        || lines(" INFO", "the outbox can be read again") == 1,
    )
    .await;
    let log = server.log();
    assert_eq!(
        lines(" WARN", "cannot read the outbox"),
        1,
        "one warning for the whole outage:\n{log}"
    );
    let ended = log
        .lines()
        .find(|line| line.contains("the outbox can be read again"))
        .expect("found above");
    let failed: u64 = ended
        .split("failed_tries=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the end says how many tries failed: {ended}"));
    assert!(failed >= 3, "{ended}");
}

/// A forwarding server whose database stalls (bytes held, no error), once it has said that
/// its read of the outbox has waited 10 s.
async fn an_outbox_read_stalled_for_10_s() -> (TestDb, Proxy, Process) {
    let (db, proxy, config) = forwarding_behind_a_proxy();
    let server = Process::serve(&config);
    proxy.stall();
    crate::forward::poll_until("the stalled read is said", Duration::from_secs(30), || {
        server.log().contains("reading the outbox has waited 10s")
    })
    .await;
    (db, proxy, server)
}

/// A database that stalls without an error (frozen, black-holed) held the dispatcher's read of
/// the outbox, and with it all forwarding, with nothing in its log (a black-box run: only the
/// requests' 503s and `/readyz` said anything). The wait is said once it has lasted 10 s, and
/// its end.
#[actix_web::test]
async fn an_outbox_read_the_database_does_not_answer_is_said_and_so_is_its_end() {
    if skip_on_sqlite(
        "an_outbox_read_the_database_does_not_answer_is_said_and_so_is_its_end",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    let (_db, proxy, server) = an_outbox_read_stalled_for_10_s().await;
    proxy.restore();
    crate::forward::poll_until("its end is said", Duration::from_secs(30), || {
        server
            .log()
            .contains("the database answered the outbox's read")
    })
    .await;
    let log = server.log();
    let said = log
        .lines()
        .find(|line| line.contains("reading the outbox has waited"))
        .expect("found above");
    assert!(said.contains(" WARN"), "{said}");
    assert_eq!(
        log.matches("reading the outbox has waited").count(),
        1,
        "once per stall:\n{log}"
    );
}

/// Replays answered while the database is away are counted in memory and flushed every 2 s; a
/// black-box run's log had a WARN at every flush that failed (12 in 36 s). One WARN, at most
/// one a minute, and its end.
#[actix_web::test]
async fn replay_counts_that_cannot_be_flushed_are_warned_about_once_and_their_end_is_logged() {
    if skip_on_sqlite(
        "replay_counts_that_cannot_be_flushed_are_warned_about_once_and_their_end_is_logged",
        "an embedded store cannot become unreachable",
    ) {
        return;
    }
    let (_db, proxy, server) = replayed_with_the_database_cut().await;
    let lines = |level: &str, text: &str| lines_of(&server, level, text);
    crate::forward::poll_until("three flushes failed", Duration::from_secs(30), || {
        lines("DEBUG", "replay counts not flushed") >= 3
    })
    .await;
    proxy.restore();
    crate::forward::poll_until(
        "the flushes' return is logged",
        Duration::from_secs(30),
        || lines(" INFO", "replay counts are flushed again") == 1,
    )
    .await;
    assert_eq!(
        lines(" WARN", "replay counts not flushed"),
        1,
        "one warning for the whole outage:\n{}",
        server.log()
    );
}

/// Each delivery the database fails is a WARN of its own, and no line said when they stopped:
/// an operator paged for the 503s could not read when storing came back. The first delivery
/// stored after them is said once, with how many failed.
#[actix_web::test]
async fn the_first_delivery_stored_after_an_outage_is_said_with_how_many_failed() {
    if skip_on_sqlite(
        "the_first_delivery_stored_after_an_outage_is_said_with_how_many_failed",
        "an embedded store cannot become unreachable",
    ) {
        return;
    }
    let (db, proxy, server) = replayed_with_the_database_cut().await;
    // Signed as the proxied config signs: the same sources and secrets.
    let config = parse_config(&config_text(&db.url, ""));
    let fresh = || {
        let id = unique_id("evt");
        let body = stripe_event(&id, "charge.succeeded", 1);
        delivery_for(&config, "stripe", &body, &id, unix_now())
    };
    let delivery = fresh();
    let mut failed = 0;
    for _ in 0..2 {
        assert_eq!(send(&server.address, &delivery).await.status, 503);
        failed += 1;
    }
    assert!(!server.log().contains("the store takes deliveries again"));
    proxy.restore();
    loop {
        let answer = send(&server.address, &delivery).await;
        if answer.status == 200 {
            break;
        }
        assert_eq!(answer.status, 503, "{}", answer.text());
        assert!(failed < 40, "never stored again:\n{}", server.log());
        failed += 1;
        actix_web::rt::time::sleep(Duration::from_millis(250)).await;
    }
    let stored = send(&server.address, &fresh()).await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    let log = server.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("the store takes deliveries again"))
        .collect();
    assert!(
        said.len() == 1
            && said[0].contains(" INFO")
            && said[0].contains(&format!("failed={failed}")),
        "one line, after the {failed} that failed: {said:?}"
    );
}

/// A serve (its own debug lines on) whose database sits behind a proxy: one event stored, the
/// proxy cut, and the event replayed from memory, its replay count waiting for a flush that
/// cannot be written: the database, the proxy, the process.
async fn replayed_with_the_database_cut() -> (TestDb, Proxy, Process) {
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = config_text(&proxied_url, "");
    let config = parse_config(&text);
    let server = Process::serve_with_env(&text, &[("RUST_LOG", "info,hookbox=debug")]);
    let id = unique_id("evt");
    let delivery = delivery_for(
        &config,
        "stripe",
        &stripe_event(&id, "charge.succeeded", 1),
        &id,
        unix_now(),
    );
    assert_eq!(send(&server.address, &delivery).await.status, 200);
    proxy.cut();
    let again = send(&server.address, &delivery).await;
    assert!(again.replayed(), "{}", again.text());
    (db, proxy, server)
}

/// Replay counts the stop's last flush cannot write are said lost, not "kept and retried"
/// (a black-box run: that WARN came at the stop itself, and the counts were gone).
#[actix_web::test]
async fn replay_counts_the_stop_cannot_write_are_said_lost() {
    if skip_on_sqlite(
        "replay_counts_the_stop_cannot_write_are_said_lost",
        "an embedded store cannot become unreachable",
    ) {
        return;
    }
    let (_db, proxy, mut server) = replayed_with_the_database_cut().await;
    crate::forward::poll_until("a flush failed", Duration::from_secs(30), || {
        lines_of(&server, "DEBUG", "replay counts not flushed") >= 1
    })
    .await;
    server.terminate();
    server.wait_exit(Duration::from_secs(60));
    let log = server.log();
    let lost = log
        .lines()
        .find(|l| l.contains("could not be written before the stop"))
        .unwrap_or_else(|| panic!("the stop says the counts are lost:\n{log}"));
    assert!(lost.contains("WARN") && lost.contains("events=1"), "{lost}");
    let stop = log.find("shutting down").expect("the stop began");
    assert!(
        !log[stop..].contains("kept and retried"),
        "nothing is retried after the stop:\n{log}"
    );
    proxy.restore();
}

/// A read that waited on a stalled database and then ended in an error (the connection found
/// dead) was said to be answered: "the database answered the outbox's read; forwarding goes
/// on", while the database was still cut off (a black-box run).
#[actix_web::test]
async fn a_stalled_outbox_read_that_ends_in_an_error_is_not_said_to_be_answered() {
    if skip_on_sqlite(
        "a_stalled_outbox_read_that_ends_in_an_error_is_not_said_to_be_answered",
        "an embedded store has no connection to stall",
    ) {
        return;
    }
    let (_db, proxy, server) = an_outbox_read_stalled_for_10_s().await;
    // The connection ends under the stalled read: an error, not an answer.
    proxy.cut();
    crate::forward::poll_until("the read's end is said", Duration::from_secs(30), || {
        server
            .log()
            .contains("the outbox's read that waited for the database ended with an error")
    })
    .await;
    assert!(
        !server
            .log()
            .contains("the database answered the outbox's read"),
        "{}",
        server.log()
    );
    proxy.restore();
}
