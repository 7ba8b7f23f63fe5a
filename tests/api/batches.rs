//! Batches (`adyen`, `gocardless`) through the real server: every item an event of its own, all
//! claimed in one transaction; redeliveries, reused ids, handler failures and concurrent
//! deliveries of one batch; export and replay item by item; GoCardless's 498.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hookbox::config::Config;
use hookbox::{AnyConnection, Event, Handler, Handlers, Response};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::provider::Counting;

/// The current Adyen key is the second: the first is rotated out, and signs too.
const ADYEN_KEYS: [&str; 2] = [
    "0E0C8D4B6A2F3E1D5C7B9A0F1E2D3C4B5A69788796A5B4C3D2E1F00112233445",
    "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
];
const GOCARDLESS_SECRET: &str = "ElCXUGyFPfdNTqKhAHMjENhvQeIBXGzZ8dSpLNlT";

fn sources() -> String {
    format!(
        r#"
[sources.adyen]
scheme = "adyen"
secrets = ["{}", "{}"]

[sources.gocardless]
scheme = "gocardless"
secrets = ["{GOCARDLESS_SECRET}"]
"#,
        ADYEN_KEYS[0], ADYEN_KEYS[1]
    )
}

/// A server with the batch sources, both handled by `handler`.
async fn spawn(handler: impl Handler + Clone + 'static) -> TestApp {
    TestApp::spawn_with(
        &sources(),
        Handlers::default()
            .with("adyen", handler.clone())
            .with("gocardless", handler),
    )
    .await
}

/// An Adyen notification item, unsigned.
fn adyen_item(psp: &str, code: &str, value: u32) -> Value {
    json!({
        "pspReference": psp,
        "eventCode": code,
        "merchantAccountCode": "HookboxTestECOM",
        "merchantReference": format!("order-{psp}"),
        "amount": {"value": value, "currency": "EUR"},
        "success": "true",
        "additionalData": {"authCode": "088088"},
    })
}

/// A GoCardless event.
fn gocardless_event(id: &str, action: &str) -> Value {
    json!({
        "id": id,
        "created_at": "2026-12-02T09:00:00.000Z",
        "resource_type": "payments",
        "action": action,
        "links": {"payment": "PM00BV9HFKW8QZ"},
        "details": {"origin": "gocardless", "cause": format!("payment_{action}")},
    })
}

/// `items` as one delivery to `source`, signed as the provider signs it, with the source's
/// secret number `key` (0 for the first).
fn batch(config: &Config, source: &str, key: usize, items: &[Value]) -> Delivery {
    let source_config = source_named(config, source);
    let provider = source_config
        .scheme
        .build(&source_config.secrets[key..=key], source_config.tolerance)
        .expect("valid keys");
    let body = match source {
        "adyen" => json!({
            "live": "false",
            "notificationItems": items
                .iter()
                .map(|item| json!({"NotificationRequestItem": item}))
                .collect::<Vec<_>>(),
        }),
        _ => json!({"events": items, "meta": {"webhook_id": unique_id("WB")}}),
    };
    let signed = provider.sign_delivery(
        &serde_json::to_vec(&body).expect("JSON"),
        unix_now(),
        "",
        None,
    );
    let mut headers = signed.headers;
    headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    Delivery {
        source: source.to_owned(),
        headers,
        body: signed.body,
    }
}

/// The side effects recorded per event id, sorted.
pub(crate) fn side_effects(app: &TestApp) -> Vec<(String, i64)> {
    use diesel::prelude::*;
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        event_id: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let rows: Vec<Row> = diesel::sql_query(
        "SELECT event_id, COUNT(*) AS n FROM side_effects GROUP BY event_id ORDER BY event_id",
    )
    .load(&mut app.db.connect())
    .expect("side effects");
    rows.into_iter().map(|row| (row.event_id, row.n)).collect()
}

pub(crate) fn once_each(ids: &[&str]) -> Vec<(String, i64)> {
    let mut ids: Vec<(String, i64)> = ids.iter().map(|id| ((*id).to_owned(), 1)).collect();
    ids.sort();
    ids
}

/// Status, content type and body: what two answers to one delivery must share.
pub(crate) fn seen(answer: &Answer) -> (u16, Option<String>, Vec<u8>) {
    (
        answer.status,
        answer.header("content-type").map(str::to_owned),
        answer.body.clone(),
    )
}

#[derive(Clone)]
pub(crate) struct Shared(Arc<Counting>);

impl Handler for Shared {
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        self.0.prepare(conn)
    }

    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        self.0.handle(conn, event)
    }
}

pub(crate) fn counting(delay: Duration) -> Shared {
    Shared(Arc::new(Counting::new(delay)))
}

#[actix_web::test]
async fn a_batch_of_three_is_three_events_answered_accepted_and_its_redelivery_a_replay() {
    let app = spawn(counting(Duration::ZERO)).await;
    let psp = [unique_id("A"), unique_id("C"), unique_id("R")];
    let items = [
        adyen_item(&psp[0], "AUTHORISATION", 2599),
        adyen_item(&psp[1], "CAPTURE", 2599),
        adyen_item(&psp[2], "REFUND", 599),
    ];
    let first = app.send(&batch(&app.config, "adyen", 1, &items)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("content-type"), Some("text/plain"));
    assert_eq!(first.text(), "[accepted]");
    assert!(!first.replayed());
    let ids = [
        format!("{}:AUTHORISATION", psp[0]),
        format!("{}:CAPTURE", psp[1]),
        format!("{}:REFUND", psp[2]),
    ];
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(side_effects(&app), once_each(&ids));
    assert_eq!(app.db.count("events"), 3);
    // What Adyen was answered, beside the item's stored response, for whoever looks it up.
    let looked_up = app
        .get(
            &format!("/admin/events/adyen/{}", ids[0]),
            Some(ADMIN_TOKEN),
        )
        .await
        .json();
    assert_eq!(
        looked_up["answered"],
        json!({"status": 200, "content_type": "text/plain", "body": "[accepted]"}),
        "{looked_up}"
    );
    assert_eq!(looked_up["content_type"], "application/json", "{looked_up}");
    let cookie = crate::console::log_in(&app).await;
    let page = crate::console::event_page(&app, &cookie, "adyen", ids[0])
        .await
        .text();
    assert!(
        page.contains("id=\"answered\"") && page.contains("[accepted]"),
        "{page}"
    );
    // Each item is stored as itself: its own type and payload.
    let stored: Vec<(String, Option<String>, Vec<u8>)> = {
        use diesel::prelude::*;
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            event_id: String,
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            event_type: Option<String>,
            #[diesel(sql_type = diesel::sql_types::Binary)]
            payload: Vec<u8>,
        }
        let rows: Vec<Row> =
            diesel::sql_query("SELECT event_id, event_type, payload FROM events ORDER BY event_id")
                .load(&mut app.db.connect())
                .expect("events");
        rows.into_iter()
            .map(|row| (row.event_id, row.event_type, row.payload))
            .collect()
    };
    for (event_id, event_type, payload) in &stored {
        let item: Value = serde_json::from_slice(payload).expect("an item's JSON");
        assert_eq!(
            format!(
                "{}:{}",
                item["pspReference"].as_str().unwrap(),
                item["eventCode"].as_str().unwrap()
            ),
            *event_id
        );
        assert_eq!(event_type.as_deref(), item["eventCode"].as_str());
        assert!(item["additionalData"]["hmacSignature"].is_string());
    }

    // The same batch again, and once more signed with the other key (its signatures differ,
    // which the fingerprint leaves out): replays, the same answer, nothing processed again.
    for key in [1, 0] {
        let again = app.send(&batch(&app.config, "adyen", key, &items)).await;
        assert!(again.replayed(), "{}", again.text());
        assert_eq!(seen(&again), seen(&first));
    }
    assert_eq!(side_effects(&app), once_each(&ids));

    // One tampered item refuses the whole delivery; nothing of it is stored.
    let mut tampered = batch(
        &app.config,
        "adyen",
        1,
        &[
            adyen_item(&unique_id("N"), "CAPTURE", 1),
            adyen_item(&unique_id("M"), "CAPTURE", 1),
        ],
    );
    tampered.body = String::from_utf8(tampered.body)
        .expect("UTF-8")
        .replacen("\"value\":1", "\"value\":2", 1)
        .into_bytes();
    let refused = app.send(&tampered).await;
    assert_eq!(
        (refused.status, refused.error().as_str()),
        (401, "invalid_signature")
    );
    assert_eq!(app.db.count("events"), 3);

    // The delivery counts once, however many items it carried.
    let metrics = app.get("/metrics", None).await.text();
    for (outcome, n) in [("processed", 1), ("replayed", 2)] {
        let line = format!("hookbox_webhooks_total{{source=\"adyen\",outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

#[actix_web::test]
async fn a_stored_batch_is_answered_from_the_store_while_it_refuses_writes() {
    // A stored batch's redelivery (an Adyen notification is always one) was a 503 while the
    // store refused writes (a read-only file, a full disk), where a single event's got its
    // stored answer (a black-box run): a batch whose every item is stored needs only reads.
    if !store_is_sqlite() {
        eprintln!(
            "a_stored_batch_is_answered_from_the_store_while_it_refuses_writes: skipped on \
             PostgreSQL: the file made read-only is the SQLite store's"
        );
        return;
    }
    let Some(as_nobody) = as_nobody() else {
        eprintln!(
            "a_stored_batch_is_answered_from_the_store_while_it_refuses_writes: skipped: it \
             runs serve as another user, which takes root and setpriv"
        );
        return;
    };
    let dir = std::env::temp_dir().join(unique_id("hookbox-read-only-batch"));
    std::fs::create_dir_all(&dir).expect("a directory");
    set_mode(&dir, 0o777);
    let file = dir.join("hookbox.db");
    let text = config_text(&format!("sqlite://{}", file.display()), &sources());
    let config = parse_config(&text);
    let ids = [unique_id("EV"), unique_id("EV")];
    let items = [
        gocardless_event(&ids[0], "confirmed"),
        gocardless_event(&ids[1], "paid_out"),
    ];
    // Stored by nobody while the file is writable: the -wal and -shm a stop may leave are
    // nobody's too.
    let config_file = TempFile::new(&text);
    set_mode(std::path::Path::new(&config_file.path()), 0o644);
    let (code, _, stderr) = run_hookbox(&["migrate", "--config", &config_file.path()], &[]);
    assert_eq!(code, 0, "{stderr}");
    set_mode(&file, 0o666);
    let mut writable = Process::serve_through(&as_nobody, &text);
    let first = send(&writable.address, &batch(&config, "gocardless", 0, &items)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    writable.terminate();
    assert!(writable.wait_exit(Duration::from_secs(20)).success());
    // Readable by nobody, not writable.
    set_mode(&file, 0o644);
    let server = Process::serve_through(&as_nobody, &text);
    let again = send(&server.address, &batch(&config, "gocardless", 0, &items)).await;
    assert_eq!(
        seen(&again),
        seen(&first),
        "{}\n{}",
        again.text(),
        server.log()
    );
    assert_eq!(again.header("Idempotent-Replayed"), Some("true"));
    let reused = [
        gocardless_event(&ids[0], "cancelled"),
        gocardless_event(&ids[1], "paid_out"),
    ];
    let refused = send(&server.address, &batch(&config, "gocardless", 0, &reused)).await;
    assert_eq!(
        (refused.status, refused.error().as_str()),
        (422, "event_id_reused"),
        "{}",
        refused.text()
    );
    let new = [gocardless_event(&unique_id("EV"), "confirmed")];
    let unstored = send(&server.address, &batch(&config, "gocardless", 0, &new)).await;
    assert_eq!(unstored.status, 503, "{}", unstored.text());
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[actix_web::test]
async fn a_batch_with_an_item_stored_before_processes_only_the_new_ones() {
    let app = spawn(counting(Duration::ZERO)).await;
    let [a, b, c] = [unique_id("EV"), unique_id("EV"), unique_id("EV")];
    let first = app
        .send(&batch(
            &app.config,
            "gocardless",
            0,
            &[gocardless_event(&a, "confirmed")],
        ))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let events = [
        gocardless_event(&a, "confirmed"),
        gocardless_event(&b, "paid_out"),
        gocardless_event(&c, "failed"),
    ];
    let next = app
        .send(&batch(&app.config, "gocardless", 0, &events))
        .await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert!(!next.replayed(), "two of its items are new");
    assert_eq!(side_effects(&app), once_each(&[&a, &b, &c]));
    assert_eq!(app.db.count("events"), 3);
    let again = app
        .send(&batch(&app.config, "gocardless", 0, &events))
        .await;
    assert!(again.replayed());
    assert_eq!(seen(&again), seen(&next));
    assert_eq!(side_effects(&app), once_each(&[&a, &b, &c]));
}

#[actix_web::test]
async fn a_reused_id_with_another_payload_refuses_the_whole_batch_and_stores_nothing_of_it() {
    let app = spawn(counting(Duration::ZERO)).await;
    let [a, b] = [unique_id("EV"), unique_id("EV")];
    let first = app
        .send(&batch(
            &app.config,
            "gocardless",
            0,
            &[gocardless_event(&a, "confirmed")],
        ))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let reused = batch(
        &app.config,
        "gocardless",
        0,
        &[
            gocardless_event(&b, "confirmed"),
            gocardless_event(&a, "cancelled"),
        ],
    );
    let refused = app.send(&reused).await;
    assert_eq!(
        (refused.status, refused.error().as_str()),
        (422, "event_id_reused")
    );
    assert_eq!(
        app.db.count("events"),
        1,
        "the new item is not stored either"
    );
    assert_eq!(side_effects(&app), once_each(&[&a]));
    // The same id twice in one delivery with two payloads is refused alike.
    let twice = batch(
        &app.config,
        "gocardless",
        0,
        &[
            gocardless_event(&b, "confirmed"),
            gocardless_event(&b, "cancelled"),
        ],
    );
    let refused = app.send(&twice).await;
    assert_eq!(
        (refused.status, refused.error().as_str()),
        (422, "event_id_reused")
    );
    assert_eq!(app.db.count("events"), 1);
}

/// Fails the first time it meets event `fail_on`, after writing its side effect.
#[derive(Clone)]
pub(crate) struct FailsOn {
    pub(crate) inner: Shared,
    pub(crate) fail_on: String,
    pub(crate) failures: Arc<AtomicUsize>,
}

impl Handler for FailsOn {
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        self.inner.prepare(conn)
    }

    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        let response = self.inner.handle(conn, event)?;
        if event.event_id.as_str() == self.fail_on
            && self.failures.fetch_add(1, Ordering::SeqCst) == 0
        {
            anyhow::bail!("the ledger said no to this item (on purpose)");
        }
        Ok(response)
    }
}

#[actix_web::test]
async fn a_handler_failure_on_the_second_item_rolls_the_whole_batch_back() {
    let psp = [unique_id("A"), unique_id("B"), unique_id("C")];
    let handler = FailsOn {
        inner: counting(Duration::ZERO),
        fail_on: format!("{}:CAPTURE", psp[1]),
        failures: Arc::default(),
    };
    let app = spawn(handler).await;
    let items = [
        adyen_item(&psp[0], "AUTHORISATION", 100),
        adyen_item(&psp[1], "CAPTURE", 100),
        adyen_item(&psp[2], "CAPTURE", 100),
    ];
    let failed = app.send(&batch(&app.config, "adyen", 1, &items)).await;
    assert_eq!(
        (failed.status, failed.error().as_str()),
        (500, "processing_failed")
    );
    assert_eq!(app.db.count("events"), 0, "no item is stored");
    assert_eq!(
        app.db.count("side_effects"),
        0,
        "no item's side effect is kept"
    );

    let retried = app.send(&batch(&app.config, "adyen", 1, &items)).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(retried.text(), "[accepted]");
    assert!(!retried.replayed());
    assert_eq!(app.db.count("events"), 3);
    assert_eq!(app.db.count("side_effects"), 3);
}

#[actix_web::test]
async fn concurrent_deliveries_of_one_batch_process_each_item_once_with_identical_answers() {
    // Slow enough that the deliveries overlap inside the claim.
    let app = spawn(counting(Duration::from_millis(100))).await;
    let ids: Vec<String> = (0..3).map(|_| unique_id("EV")).collect();
    let events: Vec<Value> = ids
        .iter()
        .map(|id| gocardless_event(id, "confirmed"))
        .collect();
    let deliveries: Vec<Delivery> = (0..50)
        .map(|_| batch(&app.config, "gocardless", 0, &events))
        .collect();
    let answers =
        futures_util::future::join_all(deliveries.iter().map(|delivery| app.send(delivery))).await;
    let processed = answers
        .iter()
        .filter(|a| a.status == 200 && !a.replayed())
        .count();
    assert_eq!(processed, 1, "{answers:?}");
    for answer in &answers {
        assert_eq!(seen(answer), seen(&answers[0]), "{answers:?}");
    }
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(side_effects(&app), once_each(&ids));
    assert_eq!(app.db.count("events"), 3);
}

#[actix_web::test]
async fn fifty_deliveries_of_one_batch_split_across_two_processes_store_each_item_once() {
    let db = TestDb::create();
    let text = config_text(&db.url, &sources());
    let one = Process::serve(&text);
    let two = Process::serve(&text);
    let config = parse_config(&text);
    let items: Vec<Value> = (0..3)
        .map(|n| adyen_item(&unique_id("PSP"), "AUTHORISATION", 1000 + n))
        .collect();
    let deliveries: Vec<(String, Delivery)> = (0..50)
        .map(|i| {
            let address = if i % 2 == 0 {
                &one.address
            } else {
                &two.address
            };
            (address.clone(), batch(&config, "adyen", i % 2, &items))
        })
        .collect();
    let answers = futures_util::future::join_all(
        deliveries
            .iter()
            .map(|(address, delivery)| send(address, delivery)),
    )
    .await;

    let processed = answers.iter().filter(|a| !a.replayed()).count();
    assert_eq!(
        processed, 1,
        "exactly one delivery processes the batch: {answers:?}"
    );
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(seen(answer), seen(&answers[0]), "{answers:?}");
    }
    assert_eq!(answers[0].text(), "[accepted]");
    assert_eq!(db.count("events"), 3, "each item stored once");
    let replayed_by_each = [&one.address, &two.address].map(|address| {
        deliveries
            .iter()
            .zip(&answers)
            .filter(|((to, _), answer)| to == address && answer.replayed())
            .count()
    });
    assert!(
        replayed_by_each.iter().all(|n| *n >= 24),
        "both processes answered: {replayed_by_each:?}"
    );
}

#[actix_web::test]
async fn export_writes_a_line_per_item_and_replay_sends_an_item_as_a_delivery_of_one() {
    let app = spawn(counting(Duration::ZERO)).await;
    let ids: Vec<String> = (0..3).map(|_| unique_id("EV")).collect();
    let events: Vec<Value> = ids
        .iter()
        .map(|id| gocardless_event(id, "confirmed"))
        .collect();
    let psp = unique_id("P");
    let answer = app
        .send(&batch(&app.config, "gocardless", 0, &events))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let answer = app
        .send(&batch(
            &app.config,
            "adyen",
            1,
            &[
                adyen_item(&psp, "CAPTURE", 10),
                adyen_item(&psp, "REFUND", 10),
            ],
        ))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    let config = TempFile::new(&config_text(&app.db.url, &sources()));
    let (code, stdout, stderr) = run_hookbox_async(&[
        "export",
        "--config",
        &config.path(),
        "--source",
        "gocardless",
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a capture line"))
        .collect();
    let mut exported: Vec<&str> = lines
        .iter()
        .map(|l| l["event_id"].as_str().unwrap())
        .collect();
    exported.sort();
    let mut expected: Vec<&str> = ids.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(exported, expected, "one line per item");
    for line in &lines {
        let item: Value = serde_json::from_str(line["body"].as_str().unwrap()).expect("JSON");
        assert_eq!(item["id"], line["event_id"], "the body is the item alone");
        assert_eq!(line["event_type"], "payments.confirmed");
    }

    // One item of each source replayed into an empty server: each a delivery of one there.
    let (code, stdout, stderr) = run_hookbox_async(&["export", "--config", &config.path()]).await;
    assert_eq!(code, 0, "{stderr}");
    let one_each: Vec<&str> = ["gocardless", "adyen"]
        .iter()
        .map(|source| {
            stdout
                .lines()
                .find(|line| line.contains(&format!("\"source\":\"{source}\"")))
                .expect("a line of the source")
        })
        .collect();
    let capture = TempFile::with_extension((one_each.join("\n") + "\n").as_bytes(), "ndjson");
    let other = spawn(counting(Duration::ZERO)).await;
    let counts = replay_counts(&capture, &other.address, &config).await;
    assert_eq!(
        (counts["processed"].as_u64(), counts["rejected"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(other.db.count("events"), 2);
    let stored_there: Vec<String> = one_each
        .iter()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for event_id in &stored_there {
        let sql = format!("events WHERE event_id = '{event_id}'");
        assert_eq!(
            other.db.count(&sql),
            1,
            "{event_id} is stored under its own id"
        );
    }
    // Replayed into the first server, each item is the event stored there: a replay.
    let counts = replay_counts(&capture, &app.address, &config).await;
    assert_eq!(
        (counts["replayed"].as_u64(), counts["processed"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(app.db.count("events"), 5);
    assert_eq!(app.db.count("side_effects"), 5);
}

/// Runs `hookbox replay CAPTURE --to TO --config CONFIG` and returns the report's counts.
async fn replay_counts(capture: &TempFile, to: &str, config: &TempFile) -> Value {
    let report = TempFile::with_extension(b"", "json");
    let (code, out, err) = run_hookbox_async(&[
        "replay",
        &capture.path(),
        "--to",
        to,
        "--config",
        &config.path(),
        "--report",
        &report.path(),
    ])
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let report: Value = serde_json::from_str(&report.read()).expect("a JSON report");
    report["counts"].clone()
}

/// A batch of thousands of items (a provider's backlog after an outage: SendGrid and
/// GoCardless put hundreds in a delivery) is stored whole on both stores; SQLite holds at most
/// 32,766 bound values in a statement, and 2,979 items in one INSERT were refused on every retry.
#[actix_web::test]
async fn a_batch_of_thousands_of_items_is_stored_whole_and_answered_once() {
    let db = TestDb::create();
    let text = config_text(&db.url, &sources())
        .replace("max_body_bytes = 65536", "max_body_bytes = 4194304");
    let app = TestApp::spawn_on(
        db,
        parse_config(&text),
        Handlers::default().with("gocardless", counting(Duration::ZERO)),
    )
    .await;
    let prefix = unique_id("EV");
    let ids: Vec<String> = (0..3500).map(|i| format!("{prefix}-{i:04}")).collect();
    let items: Vec<Value> = ids
        .iter()
        .map(|id| gocardless_event(id, "confirmed"))
        .collect();
    let delivery = batch(&app.config, "gocardless", 0, &items);
    let first = app.send(&delivery).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    assert_eq!(app.db.count("events"), 3500);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(side_effects(&app), once_each(&ids));
    let again = app.send(&delivery).await;
    assert!(again.replayed());
    assert_eq!(seen(&again), seen(&first));
    assert_eq!(side_effects(&app), once_each(&ids));
}

#[actix_web::test]
async fn a_gocardless_delivery_with_a_wrong_signature_is_498_and_nothing_is_stored() {
    let app = spawn(counting(Duration::ZERO)).await;
    let delivery = batch(
        &app.config,
        "gocardless",
        0,
        &[gocardless_event(&unique_id("EV"), "paid")],
    );
    let wrong = delivery
        .clone()
        .with_header("Webhook-Signature", &"0".repeat(64));
    let refused = app.send(&wrong).await;
    assert_eq!(refused.status, 498);
    assert_eq!(refused.error(), "invalid_signature");
    assert!(refused.json()["message"].is_string());
    let missing = app
        .send(&delivery.clone().without_header("Webhook-Signature"))
        .await;
    assert_eq!(
        (missing.status, missing.error().as_str()),
        (498, "invalid_signature")
    );
    assert_eq!(app.db.count("events"), 0);
    let good = app.send(&delivery).await;
    assert_eq!(good.status, 200, "{}", good.text());

    // `hookbox send` with a wrong secret says so; 498 has no standard reason phrase.
    let body =
        TempFile::new(&json!({"events": [gocardless_event(&unique_id("EV"), "paid")]}).to_string());
    let (code, out, _) = run_hookbox_async(&[
        "send",
        "--to",
        &app.address,
        "--source",
        "gocardless",
        "--scheme",
        "gocardless",
        "--secret",
        "not-the-secret",
        &body.path(),
    ])
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("498: rejected (invalid_signature)"), "{out}");
}

#[actix_web::test]
async fn a_batch_behind_another_copy_and_a_held_item_gets_409_within_in_flight_wait() {
    if skip_on_sqlite(
        "a_batch_behind_another_copy_and_a_held_item_gets_409_within_in_flight_wait",
        "the one write lock is one wait",
    ) {
        return;
    }
    // A second copy of a batch waited for the first copy's claims of the other items, then
    // for the held item: PostgreSQL's lock_timeout bounds each wait on its own, so it waited
    // the in-flight wait twice (bb59: 19 and 28 s against a wait of 10 s).
    const WAIT: Duration = Duration::from_secs(3);
    let app = spawn(counting(Duration::ZERO)).await;
    // A first delivery opens the pool's connections, so what is timed below is the wait alone.
    let warm = [gocardless_event(&unique_id("EV"), "confirmed")];
    let answer = app.send(&batch(&app.config, "gocardless", 0, &warm)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    // Claimed in id order: the held one last.
    let mut ids: Vec<String> = (0..4).map(|_| unique_id("EV_A")).collect();
    ids.push(unique_id("EV_Z"));
    let held = crate::in_flight::HeldClaim::take(&app.db.url, "gocardless", &ids[4]);
    let events: Vec<Value> = ids
        .iter()
        .map(|id| gocardless_event(id, "confirmed"))
        .collect();
    let (first, second) = (
        batch(&app.config, "gocardless", 0, &events),
        batch(&app.config, "gocardless", 0, &events),
    );
    let waiting =
        "pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let (first, (second, waited)) = futures_util::future::join(app.send(&first), async {
        // Once the first copy waits on the held item (holding the other four), the second.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while app.db.count(waiting) == 0 {
            assert!(std::time::Instant::now() < deadline, "never waited");
            actix_web::rt::time::sleep(Duration::from_millis(10)).await;
        }
        let started = std::time::Instant::now();
        let answer = app.send(&second).await;
        (answer, started.elapsed())
    })
    .await;
    for answer in [&first, &second] {
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (409, "in_progress"),
            "{}",
            answer.text()
        );
    }
    assert!(
        waited <= WAIT + Duration::from_secs(1),
        "the second copy's 409 came after {waited:?}, not within in_flight_wait ({WAIT:?}) + 1 s"
    );
    assert_eq!(app.db.count("events"), 1, "only the warm-up's item");

    // Once the held claim goes, the provider's retry stores every item once.
    drop(held);
    let retried = app
        .send(&batch(&app.config, "gocardless", 0, &events))
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(app.db.count("events"), 6);
}
