//! The forward dispatcher's limits, with the real dispatcher of a real server running against
//! real local sinks: `concurrency`, `rate`, `ordered`, and a SIGKILL with hundreds pending.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use hookbox::db::AnyConnection;
use hookbox::Handlers;

use crate::downstream::Downstream;
use crate::forward::poll_until;
use crate::helpers::*;
use crate::proxy::Proxy;

const FORWARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A `[[sources.stripe.forward]]` target named `name` at `url`, with `extra` keys.
fn target(name: &str, url: &str, extra: &str) -> String {
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\nsecret = \"{FORWARD_SECRET}\"\n{extra}\n"
    )
}

/// `n` fresh event ids.
fn ids(n: usize) -> Vec<String> {
    (0..n).map(|_| unique_id("evt")).collect()
}

/// Sends every event to `address`, `at_once` at a time, and asserts each was stored.
async fn send_all(address: &str, config: &hookbox::config::Config, ids: &[String], at_once: usize) {
    for chunk in ids.chunks(at_once) {
        let sends = chunk.iter().map(|id| {
            let delivery =
                delivery_for(config, "stripe", &stripe_event(id, "a", 1), id, unix_now());
            async move { send(address, &delivery).await.status }
        });
        let statuses = futures_util::future::join_all(sends).await;
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    }
}

/// Whether every event of `ids` was answered 200 by `downstream` (to `target`, if given).
fn all_delivered(downstream: &Downstream, ids: &[String], target: Option<&str>) -> bool {
    let received = downstream.received();
    ids.iter().all(|id| {
        let key = format!("stripe:{id}");
        received.iter().any(|r| {
            r.status == 200
                && r.header("idempotency-key") == key
                && target.is_none_or(|t| r.header("x-hookbox-target") == t)
        })
    })
}

#[actix_web::test]
async fn a_target_with_concurrency_two_never_has_more_than_two_requests_in_flight() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(150)));
    let app = TestApp::spawn_with(
        &target("slow", &downstream.url, "concurrency = 2"),
        Handlers::default(),
    )
    .await;
    let ids = ids(20);
    send_all(&app.address, &app.config, &ids, 20).await;
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    assert_eq!(
        downstream.most_in_flight(),
        2,
        "two at once, and never more, with 20 waiting"
    );
}

#[actix_web::test]
async fn a_target_with_rate_twenty_per_second_gets_a_hundred_events_over_five_seconds() {
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let app = TestApp::spawn_with(
        &target("paced", &downstream.url, "rate = \"20/s\""),
        Handlers::default(),
    )
    .await;
    let ids = ids(100);
    send_all(&app.address, &app.config, &ids, 25).await;
    // Stored far faster than 20/s: the pace, not the intake, is what holds the rest back.
    let arrived_while_storing = downstream.received().len();
    assert!(
        arrived_while_storing < 80,
        "{arrived_while_storing} of 100 already arrived while they were being stored"
    );
    assert_twenty_a_second(&downstream, &ids).await;
}

#[actix_web::test]
async fn a_fast_rate_sends_at_least_as_fast_as_a_slow_one() {
    // An interval of 10 µs is shorter than any booking's round trip and any timer's grain; a
    // rate that high once sent nothing at all.
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let app = TestApp::spawn_with(
        &target("fast", &downstream.url, "rate = \"100000/s\""),
        Handlers::default(),
    )
    .await;
    let ids = ids(200);
    send_all(&app.address, &app.config, &ids, 25).await;
    poll_until(
        "every event reached the sink",
        Duration::from_secs(20),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
}

/// Waits until every event of `ids` (100) reached the sink, then asserts it got one attempt
/// each, at 20 a second: over at least 4.5 s, and no one-second window starting more than 21.
/// hookbox starts no more than 20 in any second (`forward::pace`'s tests hold it to that); at
/// the sink an arrival also waits for the connection and the machine, which on two busy cores
/// moved single arrivals by 40 ms, so the sink's count is allowed the one more the issue's
/// acceptance allows.
async fn assert_twenty_a_second(downstream: &Downstream, ids: &[String]) {
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(downstream, ids, None),
    )
    .await;
    let mut starts: Vec<_> = downstream.received().iter().map(|r| r.at).collect();
    starts.sort();
    assert_eq!(starts.len(), 100, "one attempt each");
    let took = starts[99] - starts[0];
    assert!(
        took >= Duration::from_millis(4500),
        "100 attempts in {took:?}"
    );
    for (i, start) in starts.iter().enumerate() {
        let in_window = starts[i..]
            .iter()
            .take_while(|at| **at - *start < Duration::from_secs(1))
            .count();
        assert!(
            in_window <= 21,
            "{in_window} attempts started in the second from attempt {i}: {:?}",
            starts[i..i + in_window]
                .iter()
                .map(|at| *at - starts[i])
                .collect::<Vec<_>>()
        );
    }
}

#[actix_web::test]
async fn a_rate_of_twenty_per_second_holds_across_two_processes_sharing_the_database() {
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let (db, config, one, two) = two_processes(&downstream, "rate = \"20/s\"");
    let ids = ids(100);
    // Half the events to each process, so each has rows of its own to send.
    let (first, second) = ids.split_at(50);
    futures_util::future::join(
        send_all(&one.address, &config, first, 25),
        send_all(&two.address, &config, second, 25),
    )
    .await;
    assert_twenty_a_second(&downstream, &ids).await;
    // Each process says at startup what it does with the source's events.
    let log = one.log();
    assert!(
        log.lines().any(|l| l.contains("forwarding stripe events")
            && l.contains("target=ledger")
            && l.contains("events=all")
            && l.contains("concurrency=16 rate=20/s ordered=false")),
        "{log}"
    );
    poll_until("every outcome is written", Duration::from_secs(10), || {
        db.count("deliveries WHERE state = 'delivered'") == 100
    })
    .await;
    assert_eq!(
        db.count("deliveries WHERE attempts = 1"),
        100,
        "each delivered at its first attempt: a row given back for later is not counted"
    );
}

#[actix_web::test]
async fn instances_that_pace_one_target_at_different_rates_warn_of_it() {
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let db = TestDb::create();
    let paced = |rate: &str| {
        config_text(
            &db.url,
            &target("ledger", &downstream.url, &format!("rate = \"{rate}\"")),
        )
    };
    let (slow, fast) = (paced("20/s"), paced("50/s"));
    let config = parse_config(&slow);
    let (one, two) = (Process::serve(&slow), Process::serve(&fast));
    // One event at a time to each in turn: each books after the other.
    let ids = ids(10);
    for (i, id) in ids.iter().enumerate() {
        send_all(in_turn(i, &one, &two), &config, std::slice::from_ref(id), 1).await;
        poll_until("the event is delivered", Duration::from_secs(10), || {
            all_delivered(&downstream, &ids[..=i], None)
        })
        .await;
    }
    // The least time between two starts: the rate's window over N, widened by its slack
    // (`forward::pace`): 51.25 ms at 20/s, 20.2 ms at 50/s.
    for (process, this, other) in [(&one, "51.25ms", "20.2ms"), (&two, "20.2ms", "51.25ms")] {
        let log = process.log();
        assert!(
            log.lines()
                .any(|l| l.contains("pace this target at different rates")
                    && l.contains("target=\"ledger\"")
                    && l.contains(&format!("this_instance={this} another_instance={other}"))),
            "{log}"
        );
    }
}

/// Waits (up to 10 s) until `process` has logged a line with `words`.
async fn until_logged(process: &Process, words: &str) {
    poll_until(
        &format!("the process logs {words:?}"),
        Duration::from_secs(10),
        || process.log().contains(words),
    )
    .await;
}

#[actix_web::test]
async fn a_paced_target_whose_schedule_is_held_starts_nothing_until_it_is_let_go() {
    if skip_on_sqlite(
        "a_paced_target_whose_schedule_is_held_starts_nothing_until_it_is_let_go",
        "no row lock: SQLite's writers take turns for the whole file",
    ) {
        return;
    }
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &target("ledger", &downstream.url, "rate = \"20/s\""),
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    // Another session holds the target's schedule locked (as an instance stopped in the middle
    // of a booking would, until the server ends its session).
    let mut holder = db.connect();
    let AnyConnection::Postgres(pg) = &mut holder else {
        unreachable!("PostgreSQL, as skip_on_sqlite let through")
    };
    pg.batch_execute(
        "INSERT INTO paces (source, target, next_start) VALUES ('stripe', 'ledger', 0); \
         BEGIN; SELECT next_start FROM paces FOR UPDATE",
    )
    .expect("the schedule is held");

    let ids = ids(20);
    send_all(&process.address, &config, &ids, 20).await;
    until_logged(&process, "cannot book this target's starts in the store").await;
    // Held for a while longer: several bookings fail meanwhile, and nothing is sent unbooked.
    actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        downstream.received().is_empty(),
        "nothing starts while the schedule is held"
    );
    pg.batch_execute("ROLLBACK")
        .expect("the schedule is let go");

    poll_until(
        "every event reached the sink",
        Duration::from_secs(10),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    let mut starts: Vec<_> = downstream.received().iter().map(|r| r.at).collect();
    starts.sort();
    assert!(
        starts[19] - starts[0] >= Duration::from_millis(850),
        "at 20/s once let go, not in a burst: {starts:?}"
    );
    until_logged(&process, "booking this target's starts in the store again").await;
}

#[actix_web::test]
async fn a_paced_target_behind_a_database_far_away_is_sent_never_faster_than_its_rate() {
    if skip_on_sqlite(
        "a_paced_target_behind_a_database_far_away_is_sent_never_faster_than_its_rate",
        "no network between hookbox and its SQLite file",
    ) {
        return;
    }
    // A round trip of 16 ms to PostgreSQL (another zone, a busy server). A booking's moments
    // were counted from its question, and at 100/s (10 ms apart) every one was past before
    // the booking was back: the target was sent nothing, and nothing was logged.
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let db = TestDb::create();
    let (proxy, proxied_url) = Proxy::in_front_of(&db.url);
    let text = config_text(
        &proxied_url,
        &target("ledger", &downstream.url, "rate = \"100/s\""),
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    proxy.delay(Duration::from_millis(8));
    let ids = ids(40);
    send_all(&process.address, &config, &ids, 20).await;
    poll_until(
        "every event reached the sink",
        Duration::from_secs(30),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    let mut starts: Vec<_> = downstream.received().iter().map(|r| r.at).collect();
    starts.sort();
    assert_eq!(starts.len(), 40, "one attempt each");
    assert!(
        starts[39] - starts[0] >= Duration::from_millis(390),
        "at 100/s, not faster: {:?}",
        starts[39] - starts[0]
    );
}

/// A sink that answers 200 after a few milliseconds, except the first two attempts of
/// `failing` (an idempotency key), which get 503.
fn sink_failing_twice(failing: String) -> Downstream {
    Downstream::start(move |key, earlier| {
        if key == failing && earlier < 2 {
            (503, Duration::ZERO)
        } else {
            (200, Duration::from_millis(5))
        }
    })
}

/// Asserts the sink got the events of `ids` one at a time and strictly in that order: the
/// attempts in arrival order, repeats of one event run together, are `ids`; the 10th event
/// took three attempts (two refused), every other one.
fn assert_in_order(downstream: &Downstream, ids: &[String]) {
    let mut received = downstream.received();
    received.sort_by_key(|r| r.at);
    let mut order: Vec<String> = Vec::new();
    for r in &received {
        let key = r.header("idempotency-key").to_owned();
        if order.last() != Some(&key) {
            order.push(key);
        }
    }
    let expected: Vec<String> = ids.iter().map(|id| format!("stripe:{id}")).collect();
    assert_eq!(order, expected, "the events in the order the sink got them");
    let tenth = format!("stripe:{}", ids[9]);
    assert_eq!(downstream.for_key(&tenth).len(), 3, "two 503s, then a 200");
    assert_eq!(received.len(), ids.len() + 2, "every other event once");
    assert_eq!(downstream.most_in_flight(), 1, "one at a time");
}

/// A server whose one target, at `downstream`, is ordered; `ids` sent to it `at_once` at a
/// time, and every one of them delivered.
async fn ordered_and_delivered(downstream: &Downstream, ids: &[String], at_once: usize) -> TestApp {
    let app = TestApp::spawn_with(
        &target("ledger", &downstream.url, "ordered = true"),
        Handlers::default(),
    )
    .await;
    send_all(&app.address, &app.config, ids, at_once).await;
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(downstream, ids, None),
    )
    .await;
    app
}

#[actix_web::test]
async fn an_ordered_target_gets_events_in_received_order_and_a_retry_holds_back_the_rest() {
    let ids = ids(100);
    let downstream = sink_failing_twice(format!("stripe:{}", ids[9]));
    // One at a time, so each is received after the one before.
    let _app = ordered_and_delivered(&downstream, &ids, 1).await;
    assert_in_order(&downstream, &ids);
}

#[actix_web::test]
async fn an_idle_ordered_target_gets_a_new_event_once_it_settles_not_at_the_next_poll() {
    // A new event is sent 100 ms after it was received (ORDER_SETTLE); the dispatcher polls
    // every 250 ms. Looking only at the poll, an event waited 100-350 ms after its answer;
    // looking when it settles, 100 ms and a take. Each event alone, the target idle between.
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let app = TestApp::spawn_with(
        &target("ledger", &downstream.url, "ordered = true"),
        Handlers::default(),
    )
    .await;
    let ids = ids(6);
    let mut waits = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        send_all(&app.address, &app.config, std::slice::from_ref(id), 1).await;
        let answered = std::time::Instant::now();
        poll_until(
            "the event reaches the sink",
            Duration::from_secs(10),
            || downstream.received().len() > i,
        )
        .await;
        let arrived = downstream.received()[i].at;
        waits.push(arrived.saturating_duration_since(answered));
    }
    assert_in_order_once(&downstream, &ids);
    // Most, not all: a busy machine may hold one up (the poll was late for about 3 in 5).
    let prompt = waits
        .iter()
        .filter(|wait| **wait < Duration::from_millis(200))
        .count();
    assert!(prompt >= 5, "waits after the answer: {waits:?}");
}

/// Asserts `downstream` got each event of `ids` once, in that order.
fn assert_in_order_once(downstream: &Downstream, ids: &[String]) {
    let keys: Vec<String> = downstream
        .received()
        .iter()
        .map(|r| r.header("idempotency-key").to_owned())
        .collect();
    let expected: Vec<String> = ids.iter().map(|id| format!("stripe:{id}")).collect();
    assert_eq!(keys, expected);
}

/// A database and two processes sharing it, with one target at `downstream` (its `extra`
/// keys given).
fn two_processes(
    downstream: &Downstream,
    extra: &str,
) -> (TestDb, hookbox::config::Config, Process, Process) {
    let db = TestDb::create();
    let text = config_text(&db.url, &target("ledger", &downstream.url, extra));
    let config = parse_config(&text);
    let (one, two) = (Process::serve(&text), Process::serve(&text));
    (db, config, one, two)
}

/// Sends `signal` (`STOP`, `CONT`) to `process`.
fn signal(process: &Process, signal: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(process.child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal}");
}

/// The events of `downstream` that arrived with an attempt number lower than one of theirs
/// that arrived before: an attempt whose row had been taken by another instance since.
fn stale_arrivals(downstream: &Downstream) -> Vec<(String, String)> {
    let mut highest: std::collections::HashMap<String, u32> = Default::default();
    let mut stale = Vec::new();
    for received in downstream.received() {
        let key = received.header("idempotency-key").to_owned();
        let attempt: u32 = received.header("x-hookbox-attempt").parse().unwrap_or(0);
        let seen = highest.entry(key.clone()).or_default();
        if attempt < *seen {
            stale.push((key, format!("attempt {attempt} after {seen}")));
        }
        *seen = (*seen).max(attempt);
    }
    stale
}

#[actix_web::test]
async fn a_process_stopped_past_its_leases_does_not_send_the_rows_another_took_since() {
    if skip_on_sqlite(
        "a_process_stopped_past_its_leases_does_not_send_the_rows_another_took_since",
        "a process stopped inside a write holds SQLite's one write lock, and every other \
         process's writes wait for it; the check before a send is the same on both stores",
    ) {
        return;
    }
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    // Paced, so that rows wait in the process for their turns; leases of 9.5 s.
    let (db, config, one, two) = two_processes(&downstream, "rate = \"2/s\"\ntimeout = \"1s\"");
    let ids = ids(6);
    send_all(&one.address, &config, &ids, 6).await;
    poll_until("the first attempt arrives", Duration::from_secs(10), || {
        !downstream.received().is_empty()
    })
    .await;
    // A row waiting for its turn when the stop comes (at 2/s a process holds one at a time,
    // and takes the next as it starts it): a process that held none would have nothing to
    // give up.
    let held_by_one = format!(
        "deliveries WHERE state = 'pending' AND leased_by IN \
         (SELECT id FROM instances WHERE pid = {})",
        one.child.id()
    );
    poll_until(
        "the first process holds rows waiting for their turns",
        Duration::from_secs(10),
        || db.count(&held_by_one) >= 1,
    )
    .await;
    // Stopped with rows waiting for their turns; the other process takes them once their
    // leases run out, and delivers every event.
    signal(&one, "STOP");
    poll_until(
        "the other process delivers every event",
        Duration::from_secs(40),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    signal(&one, "CONT");
    // Within seconds; the limit is for a machine busy with other work (10 s was once too few).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !one.log().contains("lease ran out before its turn")
        && stale_arrivals(&downstream).is_empty()
    {
        // Once in a CI run under two other loads it came to neither: what each said, then.
        assert!(
            std::time::Instant::now() < deadline,
            "the resumed process neither gave up the rows it held nor sent them:\n\
             the resumed one:\n{}\nthe other:\n{}",
            one.log(),
            two.log()
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stale_arrivals(&downstream), Vec::new());
    assert!(one.log().contains("lease ran out before its turn"));
}

/// The address of the process whose turn the `i`th event is: one, two, one, two...
fn in_turn<'a>(i: usize, one: &'a Process, two: &'a Process) -> &'a str {
    if i.is_multiple_of(2) {
        &one.address
    } else {
        &two.address
    }
}

#[actix_web::test]
async fn an_ordered_target_gets_events_in_received_order_across_two_processes() {
    let ids = ids(100);
    let downstream = sink_failing_twice(format!("stripe:{}", ids[9]));
    let (_db, config, one, two) = two_processes(&downstream, "ordered = true");
    for (i, id) in ids.iter().enumerate() {
        send_all(in_turn(i, &one, &two), &config, std::slice::from_ref(id), 1).await;
    }
    poll_until(
        "every event reached the sink",
        Duration::from_secs(60),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    // Which process sends is up to scheduling: the one whose attempt just settled is often the
    // first to see the next head, so one process may send all of them. The order is the promise.
    assert_in_order(&downstream, &ids);
    for process in [&one, &two] {
        assert!(
            !process.log().contains("sends it unordered"),
            "instances that agree are not warned:\n{}",
            process.log()
        );
    }
}

#[actix_web::test]
async fn an_event_received_first_whose_claim_commits_a_moment_later_is_still_sent_first() {
    use diesel::RunQueryDsl;
    if skip_on_sqlite(
        "ordered_claim_race",
        "a claim is held in the database by a trigger that sleeps, which SQLite has not",
    ) {
        return;
    }
    let downstream = Downstream::start(crate::downstream::always(200));
    let (db, config, one, two) = two_processes(&downstream, "ordered = true");
    let (first, second) = (unique_id("evt_first"), unique_id("evt_second"));
    // The first event's claim (received, its time taken) sleeps 80 ms in the database before
    // its row is written; the second, received meanwhile by the other instance, commits first.
    let AnyConnection::Postgres(mut conn) = db.connect() else {
        unreachable!("skipped on SQLite")
    };
    conn.batch_execute(&format!(
        "CREATE FUNCTION hold_claim() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.08); \
         RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER hold_claim BEFORE INSERT ON events FOR EACH ROW \
         WHEN (NEW.event_id = '{first}') EXECUTE FUNCTION hold_claim()"
    ))
    .expect("a trigger that holds the first claim");
    let delivery =
        |id: &str| delivery_for(&config, "stripe", &stripe_event(id, "a", 1), id, unix_now());
    let (to_first, to_second) = (delivery(&first), delivery(&second));
    let address = one.address.clone();
    let first_answer = actix_web::rt::spawn(async move { send(&address, &to_first).await });
    // The first claim is asleep in the database: its received time is taken.
    poll_until(
        "the first claim waits in the trigger",
        Duration::from_secs(5),
        || {
            #[derive(diesel::QueryableByName)]
            struct Sleeping {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE wait_event = 'PgSleep' AND datname = current_database()",
            )
            .get_result::<Sleeping>(&mut conn)
            .is_ok_and(|s| s.n > 0)
        },
    )
    .await;
    assert_eq!(send(&two.address, &to_second).await.status, 200);
    assert_eq!(first_answer.await.expect("the first send").status, 200);
    let ids = [first.clone(), second.clone()];
    poll_until("both reach the sink", Duration::from_secs(10), || {
        all_delivered(&downstream, &ids, None)
    })
    .await;
    let mut received = downstream.received();
    received.sort_by_key(|r| r.at);
    let order: Vec<&str> = received
        .iter()
        .map(|r| r.header("idempotency-key"))
        .collect();
    assert_eq!(
        order,
        [format!("stripe:{first}"), format!("stripe:{second}")],
        "received first, sent first"
    );
}

#[actix_web::test]
async fn an_instance_that_sends_an_ordered_target_unordered_is_warned_of() {
    // The order is kept only if every instance orders the target; one that does not (a rolling
    // change of `ordered`) sends several at once, and the one that orders says so.
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(2000)));
    let db = TestDb::create();
    let ordered = config_text(
        &db.url,
        &target("ledger", &downstream.url, "ordered = true"),
    );
    let unordered = config_text(
        &db.url,
        &target(
            "ledger",
            &downstream.url,
            "ordered = false\nconcurrency = 8",
        ),
    );
    let keeper = Process::serve(&ordered);
    let other = Process::serve(&unordered);
    // 48 events, 8 at a time for 2 s each: the other instance has several under way for 12 s,
    // more than two of the keeper's counts of the outbox (every 5 s).
    send_all(&other.address, &parse_config(&unordered), &ids(48), 16).await;
    let leased = || db.count("deliveries WHERE state = 'pending' AND leased_by IS NOT NULL");
    poll_until(
        "several are under way at once",
        Duration::from_secs(10),
        || leased() > 1,
    )
    .await;
    keeper.wait_for_log_within("sends it unordered", Duration::from_secs(30));
    let log = keeper.log();
    let warning = log
        .lines()
        .find(|line| line.contains("sends it unordered"))
        .expect("the warning");
    assert!(
        warning.contains("WARN") && warning.contains("target=ledger"),
        "{warning}"
    );
}

#[actix_web::test]
async fn an_older_event_redelivered_while_another_process_sends_a_later_one_waits_for_it() {
    let ids = ids(2);
    let (older, later) = (ids[0].clone(), ids[1].clone());
    let later_key = format!("stripe:{later}");
    // The later event's first attempt is held at the sink for a while.
    let downstream = Downstream::start(move |key, earlier| {
        let held = key == later_key && earlier == 0;
        (200, Duration::from_millis(if held { 1500 } else { 0 }))
    });
    let (db, config, one, two) = two_processes(&downstream, "ordered = true");
    send_all(&one.address, &config, std::slice::from_ref(&older), 1).await;
    poll_until(
        "the older event is delivered",
        Duration::from_secs(30),
        || db.count("deliveries WHERE state = 'delivered'") == 1,
    )
    .await;
    send_all(&two.address, &config, std::slice::from_ref(&later), 1).await;
    poll_until(
        "the later event's attempt is under way",
        Duration::from_secs(30),
        || downstream.answering() == 1,
    )
    .await;

    // The older event is the lane's head again, due now; whichever process is not sending the
    // later one must still wait for that attempt to end.
    let (status, _) = admin_post(
        &one.address,
        &format!("/admin/events/stripe/{older}/redeliver"),
    )
    .await;
    assert_eq!(status, 202);
    let older_key = format!("stripe:{older}");
    poll_until(
        "the older event arrived again",
        Duration::from_secs(30),
        || downstream.for_key(&older_key).len() == 2,
    )
    .await;
    assert_eq!(
        downstream.most_in_flight(),
        1,
        "an ordered target had two requests in flight at once"
    );
    let later_attempt = &downstream.for_key(&format!("stripe:{later}"))[0];
    let again = &downstream.for_key(&older_key)[1];
    assert!(again.at >= later_attempt.at + Duration::from_millis(1500));
}

#[actix_web::test]
async fn after_a_sigkill_with_hundreds_pending_on_two_targets_every_pair_arrives_with_its_key() {
    // A slow sink, so most rows are still waiting when the process dies, some of them leased
    // to it: a 60 s timeout leases each attempt for 125 s.
    let downstream = Downstream::start(|_, _| (200, Duration::from_secs(2)));
    let db = TestDb::create();
    let targets = format!(
        "{}{}",
        target("billing", &downstream.url, "timeout = \"60s\""),
        target("audit", &downstream.url, "timeout = \"60s\"")
    );
    let text = config_text(&db.url, &targets);
    let config = parse_config(&text);
    let mut first = Process::serve(&text);
    let ids = ids(300);
    send_all(&first.address, &config, &ids, 50).await;
    poll_until("attempts are under way", Duration::from_secs(30), || {
        downstream.received().len() >= 10
    })
    .await;
    first.child.kill().expect("SIGKILL");
    let _ = first.child.wait();
    let pending = db.count("deliveries WHERE state = 'pending'");
    assert!(pending >= 400, "only {pending} deliveries were pending");
    let leased = db.count("deliveries WHERE state = 'pending' AND leased_by IS NOT NULL");
    assert!(leased > 0, "no delivery was leased to the killed process");

    downstream.behave(|_, _| (200, Duration::ZERO));
    let _second = Process::serve(&text);
    // Well within the leases' 125 s: the new process finds the old one's lock gone and takes
    // its rows back at once.
    poll_until(
        "every (event, target) pair reached the sink",
        Duration::from_secs(30),
        || {
            all_delivered(&downstream, &ids, Some("billing"))
                && all_delivered(&downstream, &ids, Some("audit"))
        },
    )
    .await;
    poll_until(
        "every delivery is recorded delivered",
        Duration::from_secs(30),
        || db.count("deliveries WHERE state = 'delivered'") == 2 * ids.len() as i64,
    )
    .await;
    assert_eq!(db.count("instances"), 1, "the dead instance is forgotten");
    for r in downstream.received() {
        let key = format!("stripe:{}", r.header("x-hookbox-event-id"));
        assert_eq!(r.header("idempotency-key"), key, "one key per event");
        assert_eq!(r.header("webhook-id"), key);
    }
}

#[actix_web::test]
async fn retries_come_due_while_other_events_keep_arriving() {
    // Ten events refused once each, then a steady stream of others. The dispatcher is woken
    // every few milliseconds by the stream (claims handing rows over, outcomes recorded); the
    // retries, due 0.5-1 s after each refusal and not all at once, must still be found then,
    // not once the stream stops.
    let failing = ids(10);
    let keys: Vec<String> = failing.iter().map(|id| format!("stripe:{id}")).collect();
    let downstream = Downstream::start(move |key, earlier| {
        if keys.iter().any(|k| k == key) && earlier == 0 {
            (503, Duration::ZERO)
        } else {
            (200, Duration::ZERO)
        }
    });
    let app = TestApp::spawn_with(&target("app", &downstream.url, ""), Handlers::default()).await;
    send_all(&app.address, &app.config, &failing, 10).await;

    let streaming = std::rc::Rc::new(std::cell::Cell::new(true));
    let stream = actix_web::rt::spawn({
        let (address, config, streaming) =
            (app.address.clone(), app.config.clone(), streaming.clone());
        async move {
            let mut sent = 0;
            while streaming.get() {
                send_all(&address, &config, &ids(2), 2).await;
                sent += 2;
            }
            sent
        }
    });
    poll_until(
        "the refused events were retried and delivered while the stream went on",
        Duration::from_secs(6),
        || all_delivered(&downstream, &failing, None),
    )
    .await;
    streaming.set(false);
    let sent = stream.await.expect("the stream ran");
    assert!(sent >= 20, "the stream sent {sent} events meanwhile");
    for id in &failing {
        let attempts = downstream.for_key(&format!("stripe:{id}"));
        assert_eq!(attempts.len(), 2, "{id}: refused once, then delivered");
    }
}

#[actix_web::test]
async fn an_ordered_target_gets_events_that_arrive_together_in_the_order_they_were_received() {
    // Twenty at a time: claims that wait together are stored by one batch, in one statement.
    // Each still gets its own received time, in the order it reached the claim, and the
    // ordered target gets them in that order.
    let ids = ids(60);
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let app = ordered_and_delivered(&downstream, &ids, 20).await;

    let mut received_at = Vec::new();
    for id in &ids {
        let answer = app
            .get(&format!("/admin/events/stripe/{id}"), Some(ADMIN_TOKEN))
            .await;
        let event: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
        let at = event["received_at"]
            .as_str()
            .expect("a received time")
            .to_owned();
        received_at.push((at, format!("stripe:{id}")));
    }
    received_at.sort();
    assert!(
        received_at.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "no two events share a received time: {received_at:?}"
    );
    let expected: Vec<String> = received_at.into_iter().map(|(_, key)| key).collect();
    let mut arrivals = downstream.received();
    arrivals.sort_by_key(|r| r.at);
    let order: Vec<String> = arrivals
        .iter()
        .map(|r| r.header("idempotency-key").to_owned())
        .collect();
    assert_eq!(order, expected, "the sink's order is the received order");
    assert_eq!(downstream.most_in_flight(), 1, "one at a time");
}

#[actix_web::test]
async fn a_process_stopped_past_its_timeout_mid_attempt_keeps_the_answer_that_came_meanwhile() {
    // The process wakes to its attempt's timer and to the answer that came while it was
    // stopped at once: the timer won, the attempt was counted unanswered, and the event sent
    // again (bb58: every attempt in flight at a SIGSTOP longer than the timeout).
    let downstream = Downstream::start(|_, _| (200, Duration::from_millis(300)));
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &target("ledger", &downstream.url, "timeout = \"1s\""),
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let ids = ids(1);
    send_all(&process.address, &config, &ids, 1).await;
    poll_until(
        "the attempt reaches the downstream",
        Duration::from_secs(10),
        || downstream.answering() > 0,
    )
    .await;
    signal(&process, "STOP");
    // Stopped past the 1 s timeout, the downstream's answer (after 300 ms) waits in its socket.
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(downstream.received().len(), 1, "answered while stopped");
    signal(&process, "CONT");
    poll_until("the row is settled", Duration::from_secs(10), || {
        db.count("deliveries WHERE state = 'delivered'") == 1
    })
    .await;
    assert_eq!(
        db.count("deliveries WHERE attempts = 1"),
        1,
        "{}",
        process.log()
    );
    assert_eq!(downstream.received().len(), 1, "sent once");
    assert!(
        !process.log().contains("no answer within"),
        "{}",
        process.log()
    );
}

#[actix_web::test]
async fn an_ordered_target_whose_lane_is_held_elsewhere_for_long_is_said_and_so_is_its_end() {
    if skip_on_sqlite(
        "an_ordered_target_whose_lane_is_held_elsewhere_for_long_is_said_and_so_is_its_end",
        "the lanes' locks are PostgreSQL advisory locks",
    ) {
        return;
    }
    // A lane whose lock another session held was skipped in silence, take after take: its
    // events waited, and nothing said why (a black-box run).
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &target("ledger", &downstream.url, "ordered = true"),
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let key = hookbox::db::deliveries::lane_lock_key("stripe", "ledger");
    let AnyConnection::Postgres(mut holder) = db.connect() else {
        unreachable!("skipped on SQLite")
    };
    holder
        .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({key})"))
        .expect("the lane's lock");
    let ids = ids(3);
    send_all(&process.address, &config, &ids, 1).await;
    until_logged(&process, "lane is held by another PostgreSQL session").await;
    let log = process.log();
    let line = log
        .lines()
        .find(|l| l.contains("lane is held by another PostgreSQL session"))
        .expect("the line");
    assert!(line.contains("WARN"), "{line}");
    assert!(
        line.contains("target=ledger") || line.contains("target=\"ledger\""),
        "{line}"
    );
    assert!(line.contains(&format!("lock={key}")), "{line}");
    // The query that finds the holder, ready to paste.
    assert!(line.contains(&format!("objid::bigint) = {key};")), "{line}");
    assert!(
        downstream.received().is_empty(),
        "nothing goes while it is held"
    );
    holder.batch_execute("COMMIT").expect("let go");
    poll_until(
        "every event reached the sink once let go",
        Duration::from_secs(10),
        || all_delivered(&downstream, &ids, None),
    )
    .await;
    until_logged(&process, "lane is free again").await;
    assert_eq!(
        process
            .log()
            .matches("lane is held by another PostgreSQL session")
            .count(),
        1,
        "said once per hold"
    );
}

#[actix_web::test]
async fn an_ordered_target_held_by_a_stopped_take_elsewhere_holds_up_only_itself() {
    if skip_on_sqlite(
        "an_ordered_target_held_by_a_stopped_take_elsewhere_holds_up_only_itself",
        "the lanes' locks are PostgreSQL advisory locks; on SQLite a stopped writer holds the \
         file's one write lock, and every process's writes wait for it",
    ) {
        return;
    }
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let targets =
        target("ledger", &downstream.url, "ordered = true") + &target("audit", &downstream.url, "");
    let app = TestApp::spawn_with(&targets, Handlers::default()).await;
    // Another instance's take of the ordered target, stopped inside its transaction: it holds
    // the lane's lock. Taking every lane waited on it, and forwarded nothing meanwhile.
    let AnyConnection::Postgres(mut holder) = app.db.connect() else {
        unreachable!("skipped on SQLite")
    };
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            hookbox::db::deliveries::lane_lock_key("stripe", "ledger")
        ))
        .expect("the lane's lock");
    let ids = ids(10);
    // One at a time, so each is received after the one before.
    send_all(&app.address, &app.config, &ids, 1).await;
    poll_until(
        "the unordered target gets every event while the ordered one is held",
        Duration::from_secs(10),
        || all_delivered(&downstream, &ids, Some("audit")),
    )
    .await;
    let received = downstream.received();
    let first_attempts: Vec<&str> = received
        .iter()
        .map(|r| r.header("x-hookbox-attempt"))
        .collect();
    assert!(
        first_attempts.iter().all(|attempt| *attempt == "1"),
        "each sent once, as its first attempt: {first_attempts:?}"
    );
    assert!(
        received
            .iter()
            .all(|r| r.header("x-hookbox-target") == "audit"),
        "nothing went to the held target"
    );
    holder.batch_execute("COMMIT").expect("let go");
    poll_until(
        "the ordered target gets every event once let go",
        Duration::from_secs(10),
        || all_delivered(&downstream, &ids, Some("ledger")),
    )
    .await;
    let ledger: Vec<String> = downstream
        .received()
        .iter()
        .filter(|r| r.header("x-hookbox-target") == "ledger")
        .map(|r| r.header("idempotency-key").to_owned())
        .collect();
    let sent: Vec<String> = ids.iter().map(|id| format!("stripe:{id}")).collect();
    assert_eq!(ledger, sent, "in received order, once each");
}

/// A process forwarding to a target that answers `status` to every attempt (its config given
/// `extra`), sent four events,
/// once it has logged `words` (each event is retried after about 1, 2, 4 and 8 s: its fifth
/// attempt comes 7.5 s in at least): its database, the target, the process, its config, and
/// the lines that say `words`.
async fn failing_target_said(
    status: u16,
    extra: &str,
    words: &str,
) -> (
    TestDb,
    Downstream,
    Process,
    hookbox::config::Config,
    Vec<String>,
) {
    let downstream = Downstream::start(crate::downstream::always(status));
    let db = TestDb::create();
    let text = config_text(&db.url, &target("ledger", &downstream.url, extra));
    let config = parse_config(&text);
    let process = Process::serve(&text);
    send_all(&process.address, &config, &ids(4), 4).await;
    poll_until(
        &format!("the process logs {words:?}"),
        Duration::from_secs(30),
        || process.log().contains(words),
    )
    .await;
    let said = process
        .log()
        .lines()
        .filter(|l| l.contains(words))
        .map(str::to_owned)
        .collect();
    (db, downstream, process, config, said)
}

/// A target down until its events died was never said down: only attempts to be retried
/// counted, and with `max_attempts = 4` the last (about 7 s in, past the 5 s the run must
/// last) was dead-lettered instead (a black-box run).
#[actix_web::test]
async fn a_target_down_until_its_events_die_is_said_down() {
    let (db, _downstream, process, _config, down) =
        failing_target_said(503, "max_attempts = 4\n", "forward target down").await;
    poll_until("every event dead", Duration::from_secs(30), || {
        db.count("deliveries WHERE state = 'dead'") == 4
    })
    .await;
    assert_eq!(down.len(), 1, "{down:?}");
    let log = process.log();
    assert_eq!(log.matches("forward target down").count(), 1, "{log}");
}

#[actix_web::test]
async fn a_target_down_for_a_while_is_said_once_and_so_is_its_return() {
    // During an outage each failed attempt had its own WARN, by the hundred at concurrency 64,
    // and no line said the target itself was down or back (a black-box run).
    let (_db, downstream, process, config, down) =
        failing_target_said(503, "", "forward target down").await;
    let log = process.log();
    assert_eq!(down.len(), 1, "said once per outage: {down:?}");
    assert!(down[0].contains("WARN"), "{}", down[0]);
    assert!(
        down[0].contains("target=ledger") || down[0].contains("target=\"ledger\""),
        "{}",
        down[0]
    );
    assert!(down[0].contains("503"), "the latest error: {}", down[0]);
    assert!(
        log.matches("forward attempt failed").count() > 4,
        "each attempt still has its own line"
    );
    downstream.behave(|_, _| (200, Duration::ZERO));
    let fresh = ids(1);
    send_all(&process.address, &config, &fresh, 1).await;
    poll_until(
        "a fresh event is delivered",
        Duration::from_secs(10),
        || all_delivered(&downstream, &fresh, None),
    )
    .await;
    until_logged(&process, "forward target delivers again").await;
    let log = process.log();
    let back = log
        .lines()
        .find(|l| l.contains("forward target delivers again"))
        .expect("the line");
    assert!(back.contains("INFO"), "{back}");
    assert!(back.contains("failed attempts"), "{back}");
    assert_eq!(log.matches("forward target down").count(), 1);
}

#[actix_web::test]
async fn failures_a_quiet_spell_apart_are_not_said_as_an_outage() {
    // One event's failed series, 11 s with nothing to send, then another event's first
    // failure was said as `forward target down: every attempt has failed for 16s`, though the
    // target was never tried in between (a black-box run).
    let downstream = Downstream::start(crate::downstream::always(503));
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &target("ledger", &downstream.url, "max_attempts = 2"),
    );
    let config = parse_config(&text);
    let process = Process::serve(&text);
    let process = &process;
    let gave_up = |n: usize| move || process.log().matches("forward gave up").count() >= n;
    send_all(&process.address, &config, &ids(1), 1).await;
    poll_until(
        "the first event is dead",
        Duration::from_secs(10),
        gave_up(1),
    )
    .await;
    // The quiet spell: longer than the 10 s that make two runs of failures.
    actix_web::rt::time::sleep(Duration::from_millis(10_500)).await;
    send_all(&process.address, &config, &ids(1), 1).await;
    poll_until(
        "the second event is dead",
        Duration::from_secs(10),
        gave_up(2),
    )
    .await;
    let log = process.log();
    assert_eq!(log.matches("forward attempt failed").count(), 2, "{log}");
    assert!(!log.contains("forward target down"), "{log}");
}

#[actix_web::test]
async fn a_target_answering_429_for_a_while_is_said_to_throttle_not_to_be_down() {
    // A target that answered 429 for 5 s was logged `forward target down`: an operator looked
    // for an outage where the target was up and asking for fewer attempts, which a `rate`
    // would give it.
    let (_db, downstream, process, config, said) =
        failing_target_said(429, "", "forward target throttling").await;
    let log = process.log();
    assert_eq!(said.len(), 1, "said once: {said:?}");
    assert!(said[0].contains("WARN"), "{}", said[0]);
    assert!(
        said[0].contains("answered 429 Too Many Requests") && said[0].contains("`rate`"),
        "says what the target asks and what helps: {}",
        said[0]
    );
    assert!(!log.contains("forward target down"), "{log}");
    // Then down as well (429s, then 503s): said again, as down, not left as throttling.
    downstream.behave(|_, _| (503, Duration::ZERO));
    send_all(&process.address, &config, &ids(1), 1).await;
    until_logged(&process, "forward target down").await;
    downstream.behave(|_, _| (200, Duration::ZERO));
    send_all(&process.address, &config, &ids(1), 1).await;
    until_logged(&process, "forward target delivers again").await;
    let log = process.log();
    assert_eq!(log.matches("forward target throttling").count(), 1, "{log}");
    assert_eq!(log.matches("forward target down").count(), 1, "{log}");
}

#[actix_web::test]
async fn an_outcome_that_comes_after_its_delivery_moved_on_is_said_not_recorded() {
    // A paused process's attempt that another instance took again at the end of its lease
    // was logged `forwarded`, its outcome dropped unsaid: nothing told an operator why the
    // downstream got the event twice (a black-box run).
    let downstream = Downstream::start(|_, _| (200, Duration::from_secs(2)));
    let db = TestDb::create();
    let text = config_text(&db.url, &target("ledger", &downstream.url, ""));
    let config = parse_config(&text);
    let process = Process::serve(&text);
    send_all(&process.address, &config, &ids(1), 1).await;
    poll_until("the attempt is under way", Duration::from_secs(10), || {
        downstream.answering() == 1
    })
    .await;
    // As another instance does when it takes the row again: the next attempt.
    use diesel::connection::SimpleConnection;
    connect_url(&db.url)
        .batch_execute("UPDATE deliveries SET attempts = attempts + 1")
        .expect("the row moved on");
    until_logged(&process, "forward attempt outcomes were not recorded").await;
    let log = process.log();
    let said = log
        .lines()
        .find(|l| l.contains("were not recorded"))
        .expect("the line");
    assert!(said.contains("1 of 1"), "{said}");
}

#[actix_web::test]
async fn an_idle_instance_that_dies_is_said_by_the_one_that_finds_it() {
    // The surviving instance said nothing of an instance that died with nothing under way:
    // the line came only with deliveries to take back (a black-box run).
    let downstream = Downstream::start(|_, _| (200, Duration::ZERO));
    let db = TestDb::create();
    let text = config_text(&db.url, &target("ledger", &downstream.url, ""));
    let mut first = Process::serve(&text);
    until_logged(&first, "forward dispatcher registered").await;
    let second = Process::serve(&text);
    until_logged(&second, "forward dispatcher registered").await;
    let pid = first.child.id();
    first.child.kill().expect("SIGKILL");
    let _ = first.child.wait();
    // Its lock is free at once; it is taken for dead once free for 2.5 s, at a look every 2 s.
    poll_until(
        "the surviving instance says the other has stopped",
        Duration::from_secs(20),
        || {
            second.log().lines().any(|line| {
                line.contains("an instance sharing this database has stopped")
                    && line.contains(&format!("pid={pid}"))
            })
        },
    )
    .await;
    let log = second.log();
    let line = log
        .lines()
        .find(|line| line.contains("an instance sharing this database has stopped"))
        .expect("found above");
    assert!(line.contains("deliveries=0"), "{line}");
}
