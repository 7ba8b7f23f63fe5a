//! Forward targets on an event bus, against the machine's real NATS (JetStream, 127.0.0.1:4222)
//! and RabbitMQ (127.0.0.1:5672), and a private `nats-server` a test starts and stops itself.
//! Each test makes its own stream, or exchange and queue, under a unique name and removes them.
//!
//! Which store: the NATS and RabbitMQ delivery tests, the unroutable one and the outage run on
//! both (`HOOKBOX_TEST_STORE`); the SIGKILL test runs the real binary on PostgreSQL only.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream::StorageType};
use futures_util::future::join_all;
use hookbox::Handlers;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};

use crate::forward::deliveries;
use crate::helpers::*;
use crate::proxy::Proxy;

const NATS: &str = "nats://127.0.0.1:4222";
const RABBIT: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A name no other test or run uses: `hb_<pid>_<n>_<nanos>`.
fn unique_name() -> String {
    unique_id("hb").replace('-', "_")
}

/// A JetStream stream of its own capturing `<prefix>.>` (or the subjects asked for), deleted
/// when dropped.
struct Stream {
    server: String,
    name: String,
    /// The subjects' first token.
    prefix: String,
    jetstream: jetstream::Context,
}

impl Stream {
    /// A file-backed stream on the server at `server` with a two-minute duplicate window.
    async fn create(server: &str) -> Stream {
        Stream::capturing(server, |prefix| vec![format!("{prefix}.>")]).await
    }

    /// [`Stream::create`], capturing the subjects `subjects` makes of its prefix.
    async fn capturing(server: &str, subjects: impl Fn(&str) -> Vec<String>) -> Stream {
        let name = unique_name();
        let prefix = name.clone();
        let client = async_nats::connect(server).await.expect("connect to NATS");
        let jetstream = jetstream::new(client);
        jetstream
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: subjects(&prefix),
                storage: StorageType::File,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .expect("create the stream");
        Stream {
            server: server.to_owned(),
            name,
            prefix,
            jetstream,
        }
    }

    /// How many messages the stream holds.
    async fn messages(&self) -> u64 {
        let mut stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the stream");
        stream.info().await.expect("stream info").state.messages
    }

    /// Every message: (subject, headers by name, payload), in stream order.
    async fn all(&self) -> Vec<(String, BTreeMap<String, String>, Vec<u8>)> {
        let stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the stream");
        let count = self.messages().await;
        let mut all = Vec::new();
        for sequence in 1..=count {
            let message = stream
                .get_raw_message(sequence)
                .await
                .expect("a stored message");
            let headers = message
                .headers
                .iter()
                .map(|(name, values)| {
                    (
                        name.to_string(),
                        values.first().map(|v| v.to_string()).unwrap_or_default(),
                    )
                })
                .collect();
            all.push((
                message.subject.to_string(),
                headers,
                message.payload.to_vec(),
            ));
        }
        all
    }

    /// Waits until the stream holds `n` messages (never more).
    async fn until_holds(&self, n: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let held = self.messages().await;
            assert!(held <= n, "the stream holds {held} messages, more than {n}");
            if held == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the stream holds {held} of {n} messages after {limit:?}"
            );
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        // On a runtime of its own: the test's may be gone, or panicking.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(server).await {
                    let _ = jetstream::new(client).delete_stream(&name).await;
                }
            });
        })
        .join();
    }
}

/// A topic exchange of its own and, unless `bound` is false, a queue bound to it for `#`
/// (or for the pattern [`Rabbit::create_bound_to`] gives); both deleted when dropped.
struct Rabbit {
    exchange: String,
    queue: String,
    channel: lapin::Channel,
    _connection: Connection,
}

impl Rabbit {
    async fn create(bound: bool) -> Rabbit {
        Rabbit::create_bound_to(bound.then_some("#")).await
    }

    async fn create_bound_to(pattern: Option<&str>) -> Rabbit {
        let exchange = unique_name();
        let queue = format!("{exchange}_q");
        let connection = Connection::connect(RABBIT, ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ");
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .exchange_declare(
                exchange.clone().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
        if let Some(pattern) = pattern {
            channel
                .queue_declare(
                    queue.clone().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .expect("declare the queue");
            channel
                .queue_bind(
                    queue.clone().into(),
                    exchange.clone().into(),
                    pattern.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind the queue");
        }
        Rabbit {
            exchange,
            queue,
            channel,
            _connection: connection,
        }
    }

    /// How many messages wait in the queue.
    async fn ready(&self) -> u32 {
        self.channel
            .queue_declare(
                self.queue.clone().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the queue")
            .message_count()
    }

    /// Waits until at least `n` messages wait in the queue.
    async fn until_ready(&self, n: u32, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ready = self.ready().await;
            if ready >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{ready} of {n} messages in the queue after {limit:?}"
            );
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes every message in the queue: (routing key, properties, body).
    async fn drain(&self) -> Vec<(String, BasicProperties, Vec<u8>)> {
        let mut all = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(self.queue.clone().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let delivery = message.delivery;
            all.push((
                delivery.routing_key.to_string(),
                delivery.properties,
                delivery.data,
            ));
        }
        all
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let (exchange, queue) = (self.exchange.clone(), self.queue.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let Ok(connection) =
                    Connection::connect(RABBIT, ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(channel) = connection.create_channel().await {
                    let _ = channel
                        .queue_delete(queue.into(), QueueDeleteOptions::default())
                        .await;
                    let _ = channel
                        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = connection.close(200, "done".into()).await;
            });
        })
        .join();
    }
}

/// A `[[sources.stripe.forward]]` table for a NATS target.
fn nats_target(name: &str, url: &str, subject: &str) -> String {
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\nsubject = \"{subject}\"\ntimeout = \"2s\"\nmax_attempts = 30\n"
    )
}

/// A `[[sources.stripe.forward]]` table for a RabbitMQ target.
fn amqp_target(name: &str, exchange: &str, max_attempts: u32) -> String {
    amqp_target_at(name, RABBIT, exchange, max_attempts)
}

/// [`amqp_target`] for the broker at `url`.
fn amqp_target_at(name: &str, url: &str, exchange: &str, max_attempts: u32) -> String {
    format!(
        "\n[[sources.stripe.forward]]\nname = \"{name}\"\nurl = \"{url}\"\nexchange = \"{exchange}\"\nrouting_key = \"{{source}}.{{event_type}}\"\ntimeout = \"2s\"\nmax_attempts = {max_attempts}\n"
    )
}

/// The event types the tests send, in turn.
const KINDS: [&str; 3] = [
    "payment_intent.succeeded",
    "charge.refunded",
    "customer created",
];

/// `n` stripe events of the tests' types in turn: (id, type, body) of each.
fn make_events(n: usize) -> Vec<(String, String, String)> {
    events_of(n, |i| KINDS[i % KINDS.len()].to_owned())
}

/// `n` stripe events, the `i`th of type `kind(i)`: (id, type, body) of each.
fn events_of(n: usize, kind: impl Fn(usize) -> String) -> Vec<(String, String, String)> {
    (0..n)
        .map(|i| {
            let id = unique_id("evt");
            let kind = kind(i);
            let body = stripe_event(&id, &kind, 1);
            (id, kind, body)
        })
        .collect()
}

/// Delivers `events` to `address`, ten at a time; how many were answered 200. Past a
/// connection error (the server was killed) the rest are not tried.
async fn deliver(
    config: &hookbox::Config,
    address: &str,
    events: &[(String, String, String)],
) -> usize {
    let mut answered = 0;
    for chunk in events.chunks(10) {
        let answers = join_all(chunk.iter().map(|(id, _, body)| {
            let delivery = delivery_for(config, "stripe", body, id, unix_now());
            async move { try_send(address, &delivery, Duration::from_secs(30)).await }
        }))
        .await;
        for answer in answers {
            match answer {
                Ok(answer) => {
                    assert_eq!(answer.status, 200, "{}", answer.text());
                    answered += 1;
                }
                Err(_) => return answered,
            }
        }
    }
    answered
}

/// Sends `n` stripe events to `address`, each answered 200; returns (id, type, body) of each.
async fn send_events(
    config: &hookbox::Config,
    address: &str,
    n: usize,
) -> Vec<(String, String, String)> {
    let events = make_events(n);
    assert_eq!(
        deliver(config, address, &events).await,
        n,
        "every event answered"
    );
    events
}

/// Waits until `n` deliveries of `target` are delivered.
async fn until_delivered(db: &TestDb, target: &str, n: i64, limit: Duration) {
    until_in_state(db, target, "delivered", n, limit).await;
}

/// Waits until `n` deliveries of `target` are dead.
async fn until_dead(db: &TestDb, target: &str, n: i64, limit: Duration) {
    until_in_state(db, target, "dead", n, limit).await;
}

/// Waits until `n` deliveries of `target` are in `state`.
async fn until_in_state(db: &TestDb, target: &str, state: &str, n: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let counted = db.count(&format!(
            "deliveries WHERE target = '{target}' AND state = '{state}'"
        ));
        if counted == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{counted} of {n} deliveries to {target} {state} after {limit:?}"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a NATS subject template renders an event type to in these tests.
fn subject_token(kind: &str) -> String {
    kind.replace(['.', ' '], "_")
}

#[actix_web::test]
async fn a_hundred_events_reach_the_stream_once_each_and_a_redeliver_adds_none() {
    let stream = Stream::create(NATS).await;
    let subject = format!("{}.{{source}}.{{event_type}}", stream.prefix);
    let app = TestApp::spawn_with(&nats_target("bus", NATS, &subject), Handlers::default()).await;

    let events = send_events(&app.config, &app.address, 100).await;
    stream.until_holds(100, Duration::from_secs(60)).await;
    until_delivered(&app.db, "bus", 100, Duration::from_secs(30)).await;

    let by_key: BTreeMap<String, (String, String)> = events
        .iter()
        .map(|(id, kind, body)| (format!("stripe:{id}"), (kind.clone(), body.clone())))
        .collect();
    let stored = stream.all().await;
    let keys: BTreeSet<&str> = stored
        .iter()
        .map(|(_, headers, _)| headers["Nats-Msg-Id"].as_str())
        .collect();
    assert_eq!(keys.len(), 100, "each event once");
    for (subject, headers, payload) in &stored {
        let key = &headers["Nats-Msg-Id"];
        let (kind, body) = by_key.get(key).expect("a message is one of the events");
        assert_eq!(
            subject,
            &format!("{}.stripe.{}", stream.prefix, subject_token(kind))
        );
        assert_eq!(payload, body.as_bytes(), "the body byte for byte");
        assert_eq!(headers["X-Hookbox-Source"], "stripe");
        assert_eq!(headers["X-Hookbox-Target"], "bus");
        assert_eq!(&format!("stripe:{}", headers["X-Hookbox-Event-Id"]), key);
        assert_eq!(&headers["X-Hookbox-Event-Type"], kind);
        assert_eq!(headers["X-Hookbox-Attempt"], "1");
        assert!(headers["Content-Type"].starts_with("application/json"));
    }
    let shown = deliveries(&app, &events[0].0).await;
    assert_eq!(shown[0]["state"], "delivered");
    assert_eq!(shown[0]["last_status"], serde_json::Value::Null, "{shown}");

    // A forced repeat publish of ten events: each is published again and acknowledged, and
    // JetStream drops it as a duplicate.
    let mut before = Vec::new();
    for (id, _, _) in &events[..10] {
        before.push(deliveries(&app, id).await[0]["delivered_at"].clone());
        let answer = client()
            .post(format!(
                "{}/admin/events/stripe/{id}/redeliver",
                app.address
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("redeliver");
        let answer = read(answer).await;
        assert_eq!(answer.status, 202, "{}", answer.text());
        assert_eq!(answer.json()["requeued"], 1);
    }
    for ((id, _, _), before) in events[..10].iter().zip(before) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let shown = deliveries(&app, id).await;
            if shown[0]["state"] == "delivered" && shown[0]["delivered_at"] != before {
                break;
            }
            assert!(Instant::now() < deadline, "never published again: {shown}");
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(stream.messages().await, 100, "no event twice in the stream");
}

#[actix_web::test]
async fn two_targets_whose_subjects_share_a_stream_are_not_both_called_delivered() {
    // The Nats-Msg-Id is the event's, so the stream keeps the first target's publish and drops
    // the second's as a duplicate: that target's consumers never see the event, and saying
    // "delivered" would hide it.
    let stream = Stream::create(NATS).await;
    let targets = ["billing", "audit"]
        .map(|name| {
            nats_target(
                name,
                NATS,
                &format!("{}.{name}.{{event_type}}", stream.prefix),
            )
        })
        .concat();
    let app = TestApp::spawn_with(&targets, Handlers::default()).await;
    let events = send_events(&app.config, &app.address, 3).await;
    stream.until_holds(3, Duration::from_secs(30)).await;
    for (id, _, _) in &events {
        let deadline = Instant::now() + Duration::from_secs(30);
        let shown = loop {
            let shown = deliveries(&app, id).await;
            let held = shown.as_array().expect("deliveries").iter().any(|d| {
                d["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("duplicate"))
            });
            if held {
                break shown;
            }
            assert!(Instant::now() < deadline, "no duplicate said: {shown}");
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        };
        let shown = shown.as_array().expect("deliveries");
        let states: BTreeSet<&str> = shown.iter().filter_map(|d| d["state"].as_str()).collect();
        assert_eq!(
            states,
            BTreeSet::from(["delivered", "pending"]),
            "{shown:?}"
        );
        let delivered = shown
            .iter()
            .find(|d| d["state"] == "delivered")
            .expect("one");
        let held = shown.iter().find(|d| d["state"] == "pending").expect("one");
        let error = held["last_error"].as_str().expect("its error");
        assert!(
            error.contains(&format!("from target {}", delivered["target"]))
                && error.contains("a stream of its own"),
            "{error}"
        );
    }
    assert_eq!(
        stream.messages().await,
        3,
        "one copy each, the first target's"
    );
}

#[actix_web::test]
async fn a_hundred_events_reach_a_bound_queue_persistent_with_their_message_id() {
    let rabbit = Rabbit::create(true).await;
    let app = TestApp::spawn_with(
        &amqp_target("rabbit", &rabbit.exchange, 30),
        Handlers::default(),
    )
    .await;

    let events = send_events(&app.config, &app.address, 100).await;
    until_delivered(&app.db, "rabbit", 100, Duration::from_secs(60)).await;
    rabbit.until_ready(100, Duration::from_secs(10)).await;

    let by_key: BTreeMap<String, (String, String)> = events
        .iter()
        .map(|(id, kind, body)| (format!("stripe:{id}"), (kind.clone(), body.clone())))
        .collect();
    let received = rabbit.drain().await;
    assert_eq!(received.len(), 100, "each event once");
    let mut ids = BTreeSet::new();
    for (routing_key, properties, body) in &received {
        let key = properties
            .message_id()
            .as_ref()
            .expect("a message_id")
            .to_string();
        let (kind, sent) = by_key.get(&key).expect("a message is one of the events");
        ids.insert(key.clone());
        assert_eq!(routing_key, &format!("stripe.{kind}"));
        assert_eq!(body, sent.as_bytes(), "the body byte for byte");
        assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
        assert!(properties
            .content_type()
            .as_ref()
            .is_some_and(|t| t.as_str().starts_with("application/json")));
        let headers = properties.headers().as_ref().expect("headers");
        let header = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(value)) => value.to_string(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(header("X-Hookbox-Source"), "stripe");
        assert_eq!(header("X-Hookbox-Target"), "rabbit");
        assert_eq!(format!("stripe:{}", header("X-Hookbox-Event-Id")), key);
        assert_eq!(&header("X-Hookbox-Event-Type"), kind);
    }
    assert_eq!(ids.len(), 100);
}

#[actix_web::test]
async fn a_publish_no_queue_is_bound_for_is_never_delivered_and_its_body_is_never_logged() {
    let rabbit = Rabbit::create(false).await;
    let db = TestDb::create();
    let config = config_text(&db.url, &amqp_target("rabbit", &rabbit.exchange, 2));
    // At trace level too: the RabbitMQ client logs a returned message whole, and its frames.
    let server = Process::serve_with_env(&config, &[("RUST_LOG", "trace")]);
    let events = send_events(&parse_config(&config), &server.address, 1).await;
    let (id, _, body) = &events[0];

    let deadline = Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let shown = get(
            &server.address,
            &format!("/admin/events/stripe/{id}/deliveries"),
            Some(ADMIN_TOKEN),
        )
        .await
        .json()["deliveries"]
            .clone();
        if shown[0]["state"] == "dead" {
            break shown;
        }
        assert_ne!(shown[0]["state"], "delivered", "{shown}");
        assert!(Instant::now() < deadline, "never dead: {shown}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(shown[0]["attempts"], 2, "{shown}");
    let error = shown[0]["last_error"].as_str().expect("an error");
    assert!(
        error.contains("unroutable") && error.contains(&rabbit.exchange),
        "{error}"
    );
    let log = server.log();
    let as_bytes = format!("{:?}", &body.as_bytes()[..12]);
    assert!(
        !log.contains(as_bytes.trim_end_matches(']')) && !log.contains(&body[..40]),
        "the body is in the log:\n{log}"
    );
}

#[actix_web::test]
async fn routed_and_unroutable_publishes_in_flight_together_are_each_judged_as_their_own() {
    // lapin gives a returned message to whichever confirm it resolves next, and a multiple ack
    // resolves a batch in no set order: judged by its own confirm alone, an unroutable event
    // could be called delivered (and lost), and a routed one returned (and sent twice).
    let rabbit = Rabbit::create_bound_to(Some("stripe.good.#")).await;
    let app = TestApp::spawn_with(
        &amqp_target("rabbit", &rabbit.exchange, 2),
        Handlers::default(),
    )
    .await;
    let events = events_of(300, |i| {
        if i % 2 == 0 { "good.paid" } else { "bad.paid" }.to_owned()
    });
    assert_eq!(deliver(&app.config, &app.address, &events).await, 300);
    until_delivered(&app.db, "rabbit", 150, Duration::from_secs(60)).await;
    until_dead(&app.db, "rabbit", 150, Duration::from_secs(60)).await;
    let good: BTreeSet<&str> = events
        .iter()
        .filter(|(_, kind, _)| kind.starts_with("good"))
        .map(|(id, _, _)| id.as_str())
        .collect();
    for (id, kind, _) in &events {
        let shown = deliveries(&app, id).await;
        let wanted = if kind.starts_with("good") {
            "delivered"
        } else {
            "dead"
        };
        assert_eq!(shown[0]["state"], wanted, "{kind} {id}: {shown}");
        if wanted == "dead" {
            let error = shown[0]["last_error"].as_str().expect("its error");
            assert!(error.contains("unroutable"), "{error}");
        }
    }
    let queued = rabbit.drain().await;
    let ids: Vec<String> = queued
        .iter()
        .map(|(_, properties, _)| {
            let id = properties
                .message_id()
                .as_ref()
                .expect("a message_id")
                .to_string();
            id.strip_prefix("stripe:").expect("the key").to_owned()
        })
        .collect();
    assert_eq!(
        ids.len(),
        150,
        "each routed event once, none returned by mistake"
    );
    let distinct: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    assert_eq!(distinct, good);
}

#[actix_web::test]
async fn a_publish_to_a_missing_exchange_fails_alone() {
    // The broker closes the channel of a publish to an exchange that does not exist; the
    // publishes in flight beside it must not lose their confirms with it.
    let rabbit = Rabbit::create(true).await;
    let app = TestApp::spawn_with(
        &amqp_target("rabbit", "{event_type}", 2),
        Handlers::default(),
    )
    .await;
    let missing = format!("{}_missing", rabbit.exchange);
    let events = events_of(100, |i| {
        if i % 5 == 4 {
            &missing
        } else {
            &rabbit.exchange
        }
        .clone()
    });
    assert_eq!(deliver(&app.config, &app.address, &events).await, 100);
    until_delivered(&app.db, "rabbit", 80, Duration::from_secs(60)).await;
    until_dead(&app.db, "rabbit", 20, Duration::from_secs(60)).await;
    for (id, kind, _) in &events {
        let shown = deliveries(&app, id).await;
        if kind == &missing {
            assert_eq!(shown[0]["state"], "dead", "{shown}");
        } else {
            assert_eq!(shown[0]["state"], "delivered", "{shown}");
            assert_eq!(
                shown[0]["attempts"], 1,
                "never failed with another's: {shown}"
            );
        }
    }
    assert_eq!(rabbit.drain().await.len(), 80, "each routed event once");
}

/// A `nats-server -js` of this test's own on a free port, storing in a directory of its own;
/// stopped (SIGKILL) when dropped.
struct PrivateNats {
    child: Option<Child>,
    port: u16,
    store: TempDir,
    /// More arguments for `nats-server` (a login it asks for).
    extra: Vec<String>,
}

impl PrivateNats {
    fn start() -> PrivateNats {
        PrivateNats::start_with(&[])
    }

    fn start_with(extra: &[&str]) -> PrivateNats {
        let port = child_port();
        let mut server = PrivateNats {
            child: None,
            port,
            store: TempDir::new(),
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
        };
        server.resume();
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port and store; returns once it takes connections.
    fn resume(&mut self) {
        let child = Command::new("/usr/sbin/nats-server")
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.store.0)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server never took connections"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server; its stored streams stay in the store.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.stop();
    }
}

#[actix_web::test]
async fn while_the_bus_is_down_providers_get_fast_200s_and_every_event_arrives_when_it_is_back() {
    let mut nats = PrivateNats::start();
    let stream = Stream::create(&nats.url()).await;
    let subject = format!("{}.{{source}}.{{event_type}}", stream.prefix);
    let app = TestApp::spawn_with(
        &nats_target("bus", &nats.url(), &subject),
        Handlers::default(),
    )
    .await;
    // One event while the bus is up: the connection is open before the outage.
    send_events(&app.config, &app.address, 1).await;
    stream.until_holds(1, Duration::from_secs(30)).await;

    nats.stop();
    let started = Instant::now();
    let events = send_events(&app.config, &app.address, 30).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "30 deliveries answered in {took:?} while the bus is down"
    );
    // Every event has been tried at least once, and none delivered, before the bus returns.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let tried = app.db.count(
            "deliveries WHERE attempts >= 1 AND state = 'pending' AND last_error IS NOT NULL",
        );
        if tried == 30 {
            break;
        }
        assert!(Instant::now() < deadline, "{tried} of 30 deliveries tried");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = app.get("/readyz", None).await;
    assert_eq!(ready.status, 200, "readiness does not hang on the bus");

    nats.resume();
    until_delivered(&app.db, "bus", 31, Duration::from_secs(90)).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let check = Stream {
        server: nats.url(),
        name: stream.name.clone(),
        prefix: stream.prefix.clone(),
        jetstream: jetstream::new(client),
    };
    check.until_holds(31, Duration::from_secs(10)).await;
    let keys: BTreeSet<String> = check
        .all()
        .await
        .into_iter()
        .map(|(_, headers, _)| headers["Nats-Msg-Id"].clone())
        .collect();
    for (id, _, _) in &events {
        assert!(keys.contains(&format!("stripe:{id}")), "{id} arrived");
    }
    drop(check);
}

#[actix_web::test]
async fn after_a_sigkill_mid_stream_every_event_is_in_the_stream_once_and_in_the_queue() {
    if skip_on_sqlite(
        "after_a_sigkill_mid_stream_every_event_is_in_the_stream_once_and_in_the_queue",
        "it runs the real binary against a shared PostgreSQL database",
    ) {
        return;
    }
    let stream = Stream::create(NATS).await;
    let rabbit = Rabbit::create(true).await;
    let db = TestDb::create();
    let subject = format!("{}.{{source}}.{{event_type}}", stream.prefix);
    let config = config_text(
        &db.url,
        &format!(
            "{}{}",
            nats_target("bus", NATS, &subject),
            amqp_target("rabbit", &rabbit.exchange, 30)
        ),
    );
    let parsed = parse_config(&config);
    let first = Process::serve(&config);

    // Events arrive while the first process forwards them; it is killed a few dozen in.
    let events = make_events(200);
    let mut first = first;
    let (_, held_at_kill) = tokio::join!(deliver(&parsed, &first.address, &events), async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while stream.messages().await < 20 {
            assert!(
                Instant::now() < deadline,
                "the first process forwards nothing"
            );
            actix_web::rt::time::sleep(Duration::from_millis(5)).await;
        }
        first.child.kill().expect("SIGKILL hookbox");
        first.child.wait().expect("reap hookbox");
        stream.messages().await
    });
    assert!(
        held_at_kill < 200,
        "the kill came mid-stream: {held_at_kill} of 200 published"
    );

    // The provider retries every event against the restarted server (an answered one is a
    // replay), which forwards the rest, and again what the first had in flight.
    let second = Process::serve(&config);
    assert_eq!(deliver(&parsed, &second.address, &events).await, 200);
    let answered = 200;
    until_delivered(&db, "bus", answered, Duration::from_secs(120)).await;
    until_delivered(&db, "rabbit", answered, Duration::from_secs(60)).await;
    stream
        .until_holds(answered as u64, Duration::from_secs(10))
        .await;
    let keys: BTreeSet<String> = stream
        .all()
        .await
        .into_iter()
        .map(|(_, headers, _)| headers["Nats-Msg-Id"].clone())
        .collect();
    assert_eq!(keys.len() as i64, answered, "every event exactly once");

    rabbit
        .until_ready(answered as u32, Duration::from_secs(10))
        .await;
    let ids: BTreeSet<String> = rabbit
        .drain()
        .await
        .iter()
        .map(|(_, properties, _)| {
            properties
                .message_id()
                .as_ref()
                .expect("a message_id")
                .to_string()
        })
        .collect();
    assert_eq!(
        ids.len() as i64,
        answered,
        "every event at least once, each with its one message_id"
    );
    drop(second);
}

/// Runs `hookbox serve` with `target` as stripe's one forward table; (exit code, stderr).
fn serve_target(target: &str) -> (i32, String) {
    let file = TempFile::new(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[database]\nurl = \"sqlite::memory:\"\n\
         [sources.stripe]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.stripe.forward]\n{target}"
    ));
    let (code, _stdout, stderr) = run_hookbox(&["serve", "--config", &file.path()], &[]);
    (code, stderr)
}

#[test]
fn a_bus_target_config_error_is_exit_2_naming_the_key() {
    let cases = [
        (
            format!("url = \"{NATS}\"\nsubject = \"a.{{source}}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"),
            "sources.stripe.forward.secret",
        ),
        (
            "url = \"amqp://guest:hunter2@127.0.0.1:5672/%2f\"\nexchange = \"x\"\nrouting_key = \"k\"\nsecret_env = \"HOME\"\n".to_owned(),
            "sources.stripe.forward.secret_env",
        ),
        (
            format!("url = \"{NATS}\"\nsubject = \"webhooks.{{source}}.{{type}}\"\n"),
            "sources.stripe.forward.subject",
        ),
        (
            "url = \"amqp://guest:hunter2@127.0.0.1:5672/%2f\"\nexchange = \"{exchange}\"\nrouting_key = \"k\"\n".to_owned(),
            "sources.stripe.forward.exchange",
        ),
        (
            "url = \"amqp://guest:hunter2@127.0.0.1:5672/%2f\"\nexchange = \"x\"\nrouting_key = \"{source\"\n".to_owned(),
            "sources.stripe.forward.routing_key",
        ),
        (
            "url = \"kafka://u:hunter2@127.0.0.1:9092\"\nsubject = \"a\"\n".to_owned(),
            "sources.stripe.forward.url",
        ),
        (
            format!("url = \"{NATS}\"\nsubject = \"webhooks.>\"\n"),
            "sources.stripe.forward.subject",
        ),
    ];
    for (target, key) in cases {
        let (code, stderr) = serve_target(&target);
        assert_eq!(code, 2, "{target:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].contains(key),
            "{target:?} should name {key}: {stderr}"
        );
        assert!(!stderr.contains("listening"), "nothing listens");
        assert!(!stderr.contains("hunter2"), "no password: {stderr}");
    }
}

/// The admin API's deliveries of the stripe event `id` at `address`, once the first is dead
/// (within 30 s).
async fn dead_deliveries(address: &str, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = get(
            address,
            &format!("/admin/events/stripe/{id}/deliveries"),
            Some(ADMIN_TOKEN),
        )
        .await;
        let shown = answer.json()["deliveries"].clone();
        if shown[0]["state"] == "dead" {
            return shown;
        }
        assert!(Instant::now() < deadline, "never dead: {shown}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn an_event_too_large_for_the_nats_server_is_dead_at_once_even_on_a_fresh_connection() {
    // A server that takes at most 2 KB a message. Before the connection is up the client does
    // not know that: a larger message was sent, the server closed the connection, and every
    // publish in flight on it waited out its timeout.
    let config_file = TempFile::new("max_payload: 2048\n");
    let nats = PrivateNats::start_with(&["-c", &config_file.path()]);
    let stream = Stream::create(&nats.url()).await;
    let subject = format!("{}.{{source}}", stream.prefix);
    let db = TestDb::create();
    let config = config_text(&db.url, &nats_target("bus", &nats.url(), &subject));
    let parsed = parse_config(&config);
    let server = Process::serve(&config);
    let mut events = make_events(3);
    let big_id = events[1].0.clone();
    let padding = "x".repeat(5_000);
    events[1].2 = stripe_event(&big_id, "charge.refunded", 1).replacen(
        "\"object\"",
        &format!("\"padding\": \"{padding}\", \"object\""),
        1,
    );
    assert!(events[1].2.contains(&padding), "the big body is padded");
    assert_eq!(deliver(&parsed, &server.address, &events).await, 3);

    let shown = dead_deliveries(&server.address, &big_id).await;
    assert_eq!(
        shown[0]["attempts"], 1,
        "dead at its first attempt: {shown}"
    );
    let error = shown[0]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("Payload size limit"), "{shown}");
    assert!(error.contains("raise it"), "what to mend: {shown}");
    // The small ones beside it went out at their first attempt, not after a timeout. The
    // stream holds them a moment before their outcomes are written: each is waited for.
    stream.until_holds(2, Duration::from_secs(20)).await;
    for (id, _, _) in [&events[0], &events[2]] {
        let deadline = Instant::now() + Duration::from_secs(10);
        let shown = loop {
            let answer = get(
                &server.address,
                &format!("/admin/events/stripe/{id}/deliveries"),
                Some(ADMIN_TOKEN),
            )
            .await;
            let shown = answer.json()["deliveries"].clone();
            if shown[0]["state"] != "pending" || Instant::now() > deadline {
                break shown;
            }
            actix_web::rt::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            (&shown[0]["state"], &shown[0]["attempts"]),
            (&serde_json::json!("delivered"), &serde_json::json!(1)),
            "{shown}"
        );
    }
}

#[actix_web::test]
async fn a_nats_login_refused_is_named_in_the_deliverys_last_error() {
    let nats = PrivateNats::start_with(&["--user", "hookbox", "--pass", "right-Pa55"]);
    let url = format!("nats://hookbox:wr0ng-Pa55@127.0.0.1:{}", nats.port);
    let db = TestDb::create();
    let config = config_text(
        &db.url,
        &nats_target("bus", &url, "webhooks.{source}")
            .replace("max_attempts = 30", "max_attempts = 2"),
    );
    let parsed = parse_config(&config);
    let server = Process::serve(&config);
    let events = send_events(&parsed, &server.address, 1).await;
    let id = &events[0].0;

    let shown = dead_deliveries(&server.address, id).await;
    let error = shown[0]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("authorization violation"), "{shown}");
    // At once, as the docs say, not after the attempt's timeout (bb62).
    assert!(error.contains("refuses the login"), "{shown}");
    assert!(!shown.to_string().contains("wr0ng-Pa55"), "{shown}");
}

#[actix_web::test]
async fn a_bus_password_shows_as_stars_in_the_log_the_admin_api_and_the_console() {
    let password = "wr0ng-Pa55word";
    let url = format!("amqp://guest:{password}@127.0.0.1:5672/%2f");
    let db = TestDb::create();
    let config = config_text(
        &db.url,
        "\n[[sources.stripe.forward]]\nname = \"rabbit\"\nurl_env = \"TEST_RABBIT_URL\"\n\
         exchange = \"amq.topic\"\nrouting_key = \"{source}\"\ntimeout = \"2s\"\nmax_attempts = 2\n",
    );
    let parsed = hookbox::Config::parse(&config, &|name: &str| match name {
        "TEST_RABBIT_URL" => Some(url.clone()),
        other => test_env(other),
    })
    .expect("valid");
    // At trace level: no library hookbox uses prints the password either.
    let server =
        Process::serve_with_env(&config, &[("TEST_RABBIT_URL", &url), ("RUST_LOG", "trace")]);
    let events = send_events(&parsed, &server.address, 1).await;
    let id = &events[0].0;

    // The broker refuses the login: the delivery dies with the broker's reason.
    let shown = dead_deliveries(&server.address, id).await;
    assert!(
        shown[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("RabbitMQ")),
        "{shown}"
    );
    assert!(!shown.to_string().contains(password), "{shown}");

    let log = server.log();
    assert!(
        log.contains("amqp://guest:***@127.0.0.1:5672/%2f"),
        "the startup line shows the URL masked: {log}"
    );
    assert!(!log.contains(password), "{log}");

    let login = client()
        .post(format!("{}/console/login", server.address))
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"))
        .send_body(format!("token={ADMIN_TOKEN}"))
        .await
        .expect("the console answers");
    let login = read(login).await;
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login
        .header("Set-Cookie")
        .and_then(|c| c.split(';').next())
        .expect("a session cookie")
        .to_owned();
    let page = client()
        .get(format!(
            "{}/console/event?source=stripe&id={id}",
            server.address
        ))
        .insert_header(("Cookie", cookie))
        .send()
        .await
        .expect("the console answers");
    let page = read(page).await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("RabbitMQ"), "{}", page.text());
    assert!(!page.text().contains(password), "{}", page.text());
}

/// A healthy RabbitMQ target's startup check logs its INFO and nothing at ERROR (a black-box
/// run saw lapin's `Connection error ... channel.close` before every ready line).
#[actix_web::test]
async fn a_healthy_rabbitmq_target_is_checked_at_startup_without_an_error_line() {
    let rabbit = Rabbit::create(true).await;
    let db = TestDb::create();
    let text = config_text(&db.url, &amqp_target("rabbit", &rabbit.exchange, 2));
    let server = Process::serve(&text);
    let ready = format!(
        "forward target ready: RabbitMQ answers; exchange \"{}\" exists",
        rabbit.exchange
    );
    server.wait_for_log(&ready);
    // A send after the check, so its connection's close has been logged, if it is.
    send_events(&parse_config(&text), &server.address, 1).await;
    until_delivered(&db, "rabbit", 1, Duration::from_secs(30)).await;
    let log = server.log();
    assert!(!log.lines().any(|line| line.contains("ERROR")), "{log}");
}

#[actix_web::test]
async fn each_bus_targets_readiness_or_trouble_is_logged_at_startup_before_any_event() {
    let stream = Stream::create(NATS).await;
    let part = Stream::capturing(NATS, |prefix| {
        vec![format!("{prefix}.stripe.charge_refunded")]
    })
    .await;
    let split = Stream::create(NATS).await;
    let token = Stream::capturing(NATS, |prefix| vec![format!("{prefix}.u-only")]).await;
    let rabbit = Rabbit::create(true).await;
    let uncaptured = unique_name();
    let missing = format!("{}_missing", rabbit.exchange);
    // A port nothing listens on: held while the silent server picks its own, which could
    // otherwise be this very port, just let go (it was, once).
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let down = held.local_addr().expect("its address").port();
    let silent = silent_then_forwarding(Duration::from_secs(3600), "127.0.0.1:4222");
    drop(held);
    let db = TestDb::create();
    let subject = |prefix: &str, rest: &str| format!("{prefix}.{rest}");
    let targets = [
        nats_target(
            "bus",
            NATS,
            &subject(&stream.prefix, "{source}.{event_type}"),
        ),
        nats_target("copy", NATS, &subject(&stream.prefix, "copy.{event_type}")),
        nats_target(
            "part",
            NATS,
            &subject(&part.prefix, "{source}.{event_type}"),
        ),
        // One stream, but never one event: no warning.
        nats_target("x", NATS, &subject(&split.prefix, "x.{event_type}")) + "events = [\"x.*\"]\n",
        nats_target("y", NATS, &subject(&split.prefix, "y.{event_type}")) + "events = [\"y.*\"]\n",
        nats_target("token", NATS, &subject(&token.prefix, "t-{event_type}")),
        nats_target(
            "nostream",
            NATS,
            &subject(&uncaptured, "{source}.{event_type}"),
        ),
        nats_target(
            "down",
            &format!("nats://127.0.0.1:{down}"),
            "a.{event_type}",
        ),
        nats_target(
            "silent",
            &format!("nats://127.0.0.1:{silent}"),
            "a.{event_type}",
        ),
        amqp_target("rabbit", &rabbit.exchange, 2),
        amqp_target("noexchange", &missing, 2),
    ]
    .concat();
    let server = Process::serve(&config_text(&db.url, &targets));
    let ready = |name: &str, subjects: &str| {
        format!(
            "forward target ready: JetStream answers; stream {name} captures subjects like {subjects} "
        )
    };
    for line in [
        ready(&stream.name, &subject(&stream.prefix, "stripe.*")),
        ready(&stream.name, &subject(&stream.prefix, "copy.*")),
        format!(
            "targets bus, copy of source stripe publish into one stream, {}",
            stream.name
        ),
        format!(
            "forward target ready: JetStream answers; stream {} captures some subjects like {}.stripe.*, not all",
            part.name, part.prefix
        ),
        ready(&split.name, &subject(&split.prefix, "x.*")),
        ready(&split.name, &subject(&split.prefix, "y.*")),
        format!(
            "forward target not ready: no stream captures subjects like {}.t-* (",
            token.prefix
        ),
        format!("forward target not ready: no stream captures subjects like {uncaptured}.stripe.*"),
        "forward target not ready: cannot connect to the NATS server: IO error: Connection refused"
            .to_owned(),
        "forward target not ready: the NATS server does not answer within 666ms. Its deliveries"
            .to_owned(),
        format!(
            "forward target ready: RabbitMQ answers; exchange {:?} exists",
            rabbit.exchange
        ),
        format!("forward target not ready: exchange {missing:?} is not there to publish to"),
    ] {
        server.wait_for_log(&line);
    }
    let log = server.log();
    for name in [
        "bus",
        "copy",
        "part",
        "x",
        "y",
        "token",
        "nostream",
        "down",
        "silent",
        "rabbit",
        "noexchange",
    ] {
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("forward target") && l.contains(&format!("target={name} ")))
                .count(),
            1,
            "one line names target {name}:\n{log}"
        );
    }
    assert!(!log.contains("targets x, y"), "{log}");
    assert!(!log.contains(".. Its"), "one period: {log}");
    assert_eq!(
        db.count("deliveries"),
        0,
        "the checks queue and send nothing"
    );
}

/// A port that holds every connection made in its first `silent_for` without a word, and
/// joins every later one to `to`: a server that hangs, then answers.
fn silent_then_forwarding(silent_for: Duration, to: &'static str) -> u16 {
    use std::io::copy;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let opened = Instant::now();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for client in listener.incoming().flatten() {
            if opened.elapsed() < silent_for {
                held.push(client);
                continue;
            }
            let Ok(server) = TcpStream::connect(to) else {
                continue;
            };
            let (mut client_in, mut server_out) = (
                client.try_clone().expect("a clone"),
                server.try_clone().expect("a clone"),
            );
            let (mut server_in, mut client_out) = (server, client);
            std::thread::spawn(move || copy(&mut client_in, &mut server_out));
            std::thread::spawn(move || copy(&mut server_in, &mut client_out));
        }
    });
    port
}

#[actix_web::test]
async fn a_connect_with_no_answer_is_said_as_the_networks_not_as_a_silent_broker() {
    // With the broker's address black-holed (the connect's packets dropped), every check and
    // attempt said `RabbitMQ took the connection but did not answer`, sending an operator to
    // a frozen broker rather than the network (a black-box run). A listener whose queue of
    // connections is full drops the SYNs that come after: a connect that is never answered.
    let listener =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    listener
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .expect("an address")
                .into(),
        )
        .expect("bind");
    listener.listen(0).expect("listen");
    let address = listener
        .local_addr()
        .expect("its address")
        .as_socket()
        .expect("an IP address");
    let _filling = std::net::TcpStream::connect(address).expect("the one queued connection");
    let db = TestDb::create();
    let target = amqp_target_at(
        "rabbit",
        &format!("amqp://guest:guest@{address}/%2f"),
        "unused",
        30,
    );
    let (_server, said) = serve_not_ready(&db, &target);
    assert!(
        said.contains("no answer to the connect") && !said.contains("took the connection"),
        "{said}"
    );
}

/// A serve of `target` on `db`, once it has said the target is not ready: the process, and
/// that line.
fn serve_not_ready(db: &TestDb, target: &str) -> (Process, String) {
    let server = Process::serve(&config_text(&db.url, target));
    server.wait_for_log("forward target not ready");
    let line = server
        .log()
        .lines()
        .find(|l| l.contains("forward target not ready"))
        .expect("the line")
        .to_owned();
    (server, line)
}

#[actix_web::test]
async fn a_broker_silent_at_startup_gets_the_events_once_it_answers() {
    // The startup check waited on a broker that took the connection and said nothing, with
    // the target's connection locked: every later attempt timed out behind it, until a
    // restart.
    let rabbit = Rabbit::create(true).await;
    let port = silent_then_forwarding(Duration::from_secs(4), "127.0.0.1:5672");
    let db = TestDb::create();
    let target = format!(
        "\n[[sources.stripe.forward]]\nname = \"rabbit\"\n\
         url = \"amqp://guest:guest@127.0.0.1:{port}/%2f\"\nexchange = \"{}\"\n\
         routing_key = \"{{source}}.{{event_type}}\"\ntimeout = \"2s\"\nmax_attempts = 30\n",
        rabbit.exchange
    );
    let config = config_text(&db.url, &target);
    let server = Process::serve(&config);
    server.wait_for_log(
        "forward target not ready: RabbitMQ took the connection but did not answer within 1s",
    );
    send_events(&parse_config(&config), &server.address, 1).await;
    until_delivered(&db, "rabbit", 1, Duration::from_secs(30)).await;
    rabbit.until_ready(1, Duration::from_secs(10)).await;
}

#[actix_web::test]
async fn a_broker_that_takes_connections_and_says_nothing_costs_no_thread_or_socket_per_attempt() {
    // A connect given up on (its attempt timed out) left lapin's socket and I/O thread behind,
    // waiting on the broker for ever: one of each per attempt while a broker was frozen.
    silent_broker_costs_nothing_per_attempt("amqp").await;
}

#[actix_web::test]
async fn a_tls_broker_that_takes_connections_and_says_nothing_costs_no_thread_or_socket_per_attempt(
) {
    // Over TLS the probe made only the TCP connection, and lapin's handshake leaked as before.
    silent_broker_costs_nothing_per_attempt("amqps").await;
}

/// A RabbitMQ target `rabbit` at `url` (exchange `x`), each attempt within `timeout`, tried up
/// to 100 times.
fn rabbit_at(url: &str, timeout: &str) -> String {
    format!(
        "\n[[sources.stripe.forward]]\nname = \"rabbit\"\nurl = \"{url}\"\nexchange = \"x\"\n\
         routing_key = \"{{source}}\"\ntimeout = \"{timeout}\"\nmax_attempts = 100\n"
    )
}

/// A target at `scheme://` a port that takes connections and never answers: once every
/// delivery has had an attempt, three more attempts each cost no thread and no descriptor.
async fn silent_broker_costs_nothing_per_attempt(scheme: &str) {
    let port = silent_then_forwarding(Duration::from_secs(3600), "127.0.0.1:5672");
    let db = TestDb::create();
    let target = rabbit_at(
        &format!("{scheme}://guest:guest@127.0.0.1:{port}/%2f"),
        "1s",
    );
    let config = config_text(&db.url, &target);
    let server = Process::serve(&config);
    server.wait_for_log("forward target not ready");
    let pid = server.child.id();
    let count = |what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .expect("the process's own folder")
            .count()
    };
    send_events(&parse_config(&config), &server.address, 10).await;
    let until_attempts = |n: i64| {
        let db = &db;
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while db.count(&format!("deliveries WHERE attempts >= {n}")) < 10 {
                assert!(Instant::now() < deadline, "the attempts never came");
                actix_web::rt::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Counted once every delivery has had an attempt (the pool's connections are open).
    until_attempts(1).await;
    let (threads, sockets) = (count("task"), count("fd"));
    until_attempts(4).await;
    assert!(
        count("task") <= threads + 2,
        "{threads} threads, now {}",
        count("task")
    );
    assert!(
        count("fd") <= sockets + 2,
        "{sockets} descriptors, now {}",
        count("fd")
    );
    assert_eq!(db.count("deliveries WHERE state = 'delivered'"), 0);
}

#[actix_web::test]
async fn over_tls_the_probe_lets_lapin_connect_once_the_broker_answers() {
    // A TLS server that answers AMQP's protocol header (its first byte) inside the session:
    // the probe passes, and lapin's own connect goes on to check the certificate, which a
    // self-signed one fails. That failure, not the probe's "did not answer", is what is told.
    use openssl::ssl::{SslAcceptor, SslMethod};
    let key = TestKey::new();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).expect("TLS");
    acceptor
        .set_private_key(
            &openssl::pkey::PKey::private_key_from_pem(key.key_pem.as_bytes()).expect("a key"),
        )
        .expect("the key");
    acceptor
        .set_certificate(
            &openssl::x509::X509::from_pem(key.cert_pem.as_bytes()).expect("a certificate"),
        )
        .expect("the certificate");
    let acceptor = acceptor.build();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let probed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::spawn({
        let probed = probed.clone();
        move || {
            use std::io::{Read, Write};
            let mut held = Vec::new();
            for client in listener.incoming().flatten() {
                let Ok(mut session) = acceptor.accept(client) else {
                    continue;
                };
                let mut header = [0u8; 8];
                if session.read_exact(&mut header).is_ok() && &header == b"AMQP\x00\x00\x09\x01" {
                    probed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = session.write_all(&[1]);
                }
                held.push(session);
            }
        }
    });
    let db = TestDb::create();
    let target = rabbit_at(&format!("amqps://guest:guest@127.0.0.1:{port}/%2f"), "2s");
    let (server, line) = serve_not_ready(&db, &target);
    assert!(
        probed.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "{}",
        server.log()
    );
    assert!(!line.contains("did not answer"), "{line}");
    assert!(line.contains("certificate"), "{line}");
}

#[actix_web::test]
async fn a_broker_that_answers_the_header_and_then_nothing_fails_the_connect_in_time() {
    // The probe passed, and lapin's handshake waited until the attempt's own timeout dropped
    // it: never counted as a failed connect, so the next attempt connected again at once (a
    // black-box run: 90 handshakes a minute). It now fails within the timeout, and says why.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut held = Vec::new();
        for mut client in listener.incoming().flatten() {
            let mut header = [0u8; 8];
            if client.read_exact(&mut header).is_ok() {
                // The first byte of a Connection.Start frame, and then nothing.
                let _ = client.write_all(&[1]);
            }
            held.push(client);
        }
    });
    let db = TestDb::create();
    let target = rabbit_at(&format!("amqp://guest:guest@127.0.0.1:{port}/%2f"), "1s");
    let config = config_text(&db.url, &target);
    let server = Process::serve(&config);
    send_events(&parse_config(&config), &server.address, 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.count("deliveries WHERE last_error LIKE '%did not finish its handshake%'") == 0 {
        assert!(Instant::now() < deadline, "never told: {}", server.log());
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix_web::test]
async fn a_handshake_given_up_on_closes_its_connection() {
    // lapin's I/O thread owns the socket of its handshake, which has no time limit: a connect
    // given up on left the thread and the socket behind, open until the broker let go (a
    // black-box run: one of each per attempt while the broker stalled). Each is now shut down
    // when the connect fails: the broker sees every connection but the one under way close.
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    let (accepted, closed) = (
        std::sync::Arc::new(AtomicUsize::new(0)),
        std::sync::Arc::new(AtomicUsize::new(0)),
    );
    std::thread::spawn({
        let (accepted, closed) = (accepted.clone(), closed.clone());
        move || {
            for mut client in listener.incoming().flatten() {
                accepted.fetch_add(1, Ordering::SeqCst);
                let closed = closed.clone();
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut header = [0u8; 8];
                    if client.read_exact(&mut header).is_ok() {
                        // The first byte of a Connection.Start frame, and then nothing.
                        let _ = client.write_all(&[1]);
                    }
                    // Whatever else comes, until the client closes its end.
                    let mut rest = [0u8; 512];
                    while matches!(client.read(&mut rest), Ok(1..)) {}
                    closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        }
    });
    let db = TestDb::create();
    let target = rabbit_at(&format!("amqp://guest:guest@127.0.0.1:{port}/%2f"), "1s");
    let config = config_text(&db.url, &target);
    let server = Process::serve(&config);
    send_events(&parse_config(&config), &server.address, 1).await;
    // Each attempt is a probe's connection and lapin's: three handshakes given up on.
    let deadline = Instant::now() + Duration::from_secs(60);
    while accepted.load(Ordering::SeqCst) < 6 {
        assert!(
            Instant::now() < deadline,
            "three connects never came: {}",
            server.log()
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    let open = || accepted.load(Ordering::SeqCst) - closed.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open() > 1 {
        assert!(
            Instant::now() < deadline,
            "{} of {} connections still open",
            open(),
            accepted.load(Ordering::SeqCst)
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        db.count("deliveries WHERE last_error LIKE '%did not finish its handshake%'") == 1,
        "{}",
        server.log()
    );
}

/// How long the events sent after a bus connection was forgotten may take to arrive: the
/// 10 s of silence after which it is opened again (a target's `timeout`, 2 s here, but never
/// under 10 s), and the attempts' backoff meanwhile. The client libraries' own keepalives gave
/// up after 140-180 s.
const FORGOTTEN_DELIVERED_WITHIN: Duration = Duration::from_secs(60);

/// Sends one event through `proxy` to the target `target` of `app` and waits for it; then the
/// network forgets the connection (a NAT or a firewall dropped its state: neither end is told,
/// nothing comes back), and five more are sent: each arrives on a connection opened again
/// once the broker has been silent too long, not minutes later.
async fn forgotten_then_delivered(app: &TestApp, proxy: &Proxy, target: &str) {
    send_events(&app.config, &app.address, 1).await;
    until_delivered(&app.db, target, 1, Duration::from_secs(30)).await;
    proxy.forget_open();
    let forgotten = Instant::now();
    send_events(&app.config, &app.address, 5).await;
    until_delivered(&app.db, target, 6, FORGOTTEN_DELIVERED_WITHIN).await;
    eprintln!(
        "{target}: delivered {:?} after the connection was forgotten",
        forgotten.elapsed()
    );
}

#[actix_web::test]
async fn a_nats_connection_the_network_forgot_is_opened_again_within_seconds() {
    let proxy = Proxy::start("127.0.0.1:4222".to_owned());
    let stream = Stream::create(NATS).await;
    let subject = format!("{}.{{source}}.{{event_type}}", stream.prefix);
    let url = format!("nats://127.0.0.1:{}", proxy.port);
    let app = TestApp::spawn_with(&nats_target("bus", &url, &subject), Handlers::default()).await;
    forgotten_then_delivered(&app, &proxy, "bus").await;
    stream.until_holds(6, Duration::from_secs(10)).await;
}

#[actix_web::test]
async fn a_rabbitmq_connection_the_network_forgot_is_opened_again_within_seconds() {
    let proxy = Proxy::start("127.0.0.1:5672".to_owned());
    let rabbit = Rabbit::create(true).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
    let app = TestApp::spawn_with(
        &amqp_target_at("rabbit", &url, &rabbit.exchange, 30),
        Handlers::default(),
    )
    .await;
    forgotten_then_delivered(&app, &proxy, "rabbit").await;
    rabbit.until_ready(6, Duration::from_secs(10)).await;
}

/// An app forwarding to RabbitMQ through a proxy of the test's own (target `rabbit`, a 2 s
/// `timeout`), one event delivered through it: the proxy, the broker's exchange and queue, and
/// the app.
async fn rabbit_through_a_proxy() -> (Proxy, Rabbit, TestApp) {
    let proxy = Proxy::start("127.0.0.1:5672".to_owned());
    let rabbit = Rabbit::create(true).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
    let app = TestApp::spawn_with(
        &amqp_target_at("rabbit", &url, &rabbit.exchange, 30),
        Handlers::default(),
    )
    .await;
    send_events(&app.config, &app.address, 1).await;
    until_delivered(&app.db, "rabbit", 1, Duration::from_secs(30)).await;
    (proxy, rabbit, app)
}

#[actix_web::test]
async fn a_rabbitmq_connection_gives_up_on_unacknowledged_data_with_the_attempt() {
    // A publish written into a path gone silent (a black hole) stayed in the kernel's send
    // queue after its attempt gave up, and could reach the broker once the path came back,
    // after the attempts that followed it, as an HTTP target's requests did (a black-box
    // run). The socket hookbox makes for lapin has TCP_USER_TIMEOUT at the target's timeout.
    let (proxy, _rabbit, _app) = rabbit_through_a_proxy().await;
    let timeouts = user_timeouts_of_connections_to(proxy.port);
    assert_eq!(
        timeouts.len(),
        1,
        "the target's one connection: {timeouts:?}"
    );
    for (fd, timeout) in timeouts {
        assert_eq!(timeout, Some(Duration::from_secs(2)), "descriptor {fd}");
    }
}

#[actix_web::test]
async fn a_rabbitmq_link_cut_is_told_by_hookbox_not_by_the_clients_error_lines() {
    // The RabbitMQ client logged six ERROR lines naming no target at each cut of its link
    // (bb103): a routine broker restart paged whoever alerts on ERROR.
    let proxy = Proxy::start("127.0.0.1:5672".to_owned());
    let rabbit = Rabbit::create(true).await;
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
    let db = TestDb::create();
    let text = config_text(
        &db.url,
        &amqp_target_at("rabbit", &url, &rabbit.exchange, 30),
    );
    let config = parse_config(&text);
    // RUST_LOG empty: the default filter.
    let process = Process::serve_with_env(&text, &[("RUST_LOG", "")]);
    let events = make_events(2);
    let post = |(id, _, body): &(String, String, String)| {
        delivery_for(&config, "stripe", body, id, unix_now())
    };
    assert_eq!(send(&process.address, &post(&events[0])).await.status, 200);
    rabbit.until_ready(1, Duration::from_secs(10)).await;
    proxy.cut();
    assert_eq!(send(&process.address, &post(&events[1])).await.status, 200);
    process.wait_for_log("forward attempt failed");
    let log = process.log();
    assert!(
        log.lines()
            .any(|l| l.contains("forward attempt failed") && l.contains("target=rabbit")),
        "{log}"
    );
    assert!(
        !log.contains(" ERROR "),
        "no ERROR line for a link cut:\n{log}"
    );
}

#[actix_web::test]
async fn an_attempt_that_runs_out_of_time_says_which_step_it_was_at() {
    // A bus attempt that ran out of time said only `no answer within 2s`: not whether the
    // connection, the publish or the acknowledgement never came (bb110 LOW-2).
    // (NATS's own acknowledgement wait ends within the timeout, and says so.)
    let (proxy, _rabbit, app) = rabbit_through_a_proxy().await;
    // The connection stays open, and what is sent on it is held: the publish goes out, its
    // confirm never comes back.
    proxy.stall();
    let events = send_events(&app.config, &app.address, 1).await;
    let path = format!("/admin/events/stripe/{}/deliveries", events[0].0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        let shown = app.get(&path, Some(ADMIN_TOKEN)).await.json()["deliveries"].clone();
        if let Some(error) = shown[0]["last_error"].as_str() {
            break error.to_owned();
        }
        assert!(Instant::now() < deadline, "never tried: {shown}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    };
    proxy.restore();
    assert!(
        error.contains("no answer within 2s (the attempt was waiting for the broker's confirm)"),
        "{error}"
    );
}
