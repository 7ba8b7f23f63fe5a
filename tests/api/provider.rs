//! What the fault tests share: a handler that counts its side effects, a provider that
//! redelivers each event until it gets a 2xx (signing every attempt afresh, as Stripe does), and
//! the invariants checked after every fault.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use hookbox::config::Config;
use hookbox::{AnyConnection, Event, Handler, Response};

use crate::helpers::*;

/// The side-effect table: one row per processing that committed, no uniqueness, so an event
/// processed twice shows as two rows instead of failing.
const SIDE_EFFECTS: &str = "CREATE TABLE IF NOT EXISTS side_effects (
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_row BIGINT REFERENCES events (id) ON DELETE CASCADE
)";

/// A handler that takes `delay` (holding the claim's transaction open, as a slow handler
/// does), then writes a side-effect row on the claim's connection.
pub struct Counting {
    pub delay: Duration,
    /// How many times `handle` was entered (committed or not).
    pub entered: Arc<AtomicUsize>,
}

impl Counting {
    pub fn new(delay: Duration) -> Counting {
        Counting {
            delay,
            entered: Arc::default(),
        }
    }
}

impl Handler for Counting {
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        diesel::sql_query(SIDE_EFFECTS).execute(conn)?;
        Ok(())
    }

    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        // After the pause, so a connection lost meanwhile fails the handler's own statement.
        diesel::sql_query("INSERT INTO side_effects VALUES ($1, $2, $3)")
            .bind::<Text, _>(event.source.as_str())
            .bind::<Text, _>(event.event_id.as_str())
            .bind::<BigInt, _>(event.row_id)
            .execute(conn)?;
        Ok(Response::processed(event))
    }
}

/// For a `hookbox serve` process, whose handler is the built-in one: the same side-effect row,
/// written by a trigger inside the claim's transaction.
pub fn count_side_effects_with_a_trigger(db_url: &str) {
    let mut conn = connect_url(db_url);
    diesel::sql_query(SIDE_EFFECTS)
        .execute(&mut conn)
        .expect("side-effect table");
    if store_is_sqlite() {
        diesel::sql_query(
            "CREATE TRIGGER side_effect AFTER INSERT ON events FOR EACH ROW \
             BEGIN INSERT INTO side_effects VALUES (NEW.source, NEW.event_id, NEW.id); END",
        )
        .execute(&mut conn)
        .expect("side-effect trigger");
        return;
    }
    diesel::sql_query(
        "CREATE FUNCTION side_effect() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO side_effects VALUES (NEW.source, NEW.event_id, NEW.id); RETURN NEW; END $$",
    )
    .execute(&mut conn)
    .expect("side-effect function");
    diesel::sql_query(
        "CREATE TRIGGER side_effect AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION side_effect()",
    )
    .execute(&mut conn)
    .expect("side-effect trigger");
}

/// One Stripe event the provider delivers.
#[derive(Clone, Debug)]
pub struct Webhook {
    pub id: String,
    pub body: String,
}

/// `n` distinct Stripe events.
pub fn webhooks(n: usize) -> Vec<Webhook> {
    (0..n)
        .map(|_| {
            let id = unique_id("evt");
            Webhook {
                body: stripe_event(&id, "payment_intent.succeeded", 1),
                id,
            }
        })
        .collect()
}

/// One attempt at a delivery, as the provider saw it.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The status, or `None` when the connection failed or no answer came in time.
    pub status: Option<u16>,
    pub error: String,
    /// The error body's sentence, if it had one.
    pub message: String,
    pub retry_after: bool,
    pub elapsed: Duration,
}

/// Everything the provider did for one event.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub webhook: Webhook,
    pub attempts: Vec<Attempt>,
    /// The first 2xx answer.
    pub acked: Option<Answer>,
}

/// A provider: redelivers each event until a 2xx, at most `attempts` times, each attempt
/// allowed `patience` before it counts as unanswered, with `pause` between attempts (a real
/// provider waits for `Retry-After` or longer; the tests keep it short).
pub struct Provider {
    pub config: Config,
    pub patience: Duration,
    pub pause: Duration,
    /// Events acknowledged so far, for a test waiting to strike mid-load.
    pub acked: AtomicUsize,
    /// 503 answers so far.
    pub unavailable: AtomicUsize,
}

impl Provider {
    pub fn new(config: &Config) -> Provider {
        Provider {
            config: config.clone(),
            patience: Duration::from_secs(30),
            pause: Duration::from_millis(100),
            acked: AtomicUsize::new(0),
            unavailable: AtomicUsize::new(0),
        }
    }

    /// Delivers `webhook` to `address` until a 2xx, `attempts` times at most, or until
    /// `deadline`.
    pub async fn deliver(
        &self,
        address: &str,
        webhook: &Webhook,
        attempts: usize,
        deadline: Instant,
    ) -> Delivered {
        let mut delivered = Delivered {
            webhook: webhook.clone(),
            attempts: Vec::new(),
            acked: None,
        };
        self.deliver_more(address, &mut delivered, attempts, deadline)
            .await;
        delivered
    }

    /// Goes on delivering an event that has no 2xx yet.
    pub async fn deliver_more(
        &self,
        address: &str,
        delivered: &mut Delivered,
        attempts: usize,
        deadline: Instant,
    ) {
        for attempt in 0..attempts {
            if delivered.acked.is_some() || (attempt > 0 && Instant::now() > deadline) {
                return;
            }
            if attempt > 0 {
                actix_web::rt::time::sleep(self.pause).await;
            }
            let webhook = &delivered.webhook;
            let delivery = delivery_for(
                &self.config,
                "stripe",
                &webhook.body,
                &webhook.id,
                unix_now(),
            );
            let sent = Instant::now();
            let answer = try_send(address, &delivery, self.patience).await;
            let elapsed = sent.elapsed();
            match answer {
                Ok(answer) => {
                    if answer.status == 503 {
                        self.unavailable.fetch_add(1, Ordering::SeqCst);
                    }
                    delivered.attempts.push(Attempt {
                        status: Some(answer.status),
                        error: serde_json::from_slice::<serde_json::Value>(&answer.body)
                            .ok()
                            .and_then(|json| json["error"].as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        message: serde_json::from_slice::<serde_json::Value>(&answer.body)
                            .ok()
                            .and_then(|json| json["message"].as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        retry_after: answer
                            .header("Retry-After")
                            .is_some_and(|v| v.parse::<u64>().is_ok()),
                        elapsed,
                    });
                    if (200..300).contains(&answer.status) {
                        self.acked.fetch_add(1, Ordering::SeqCst);
                        delivered.acked = Some(answer);
                    }
                }
                Err(error) => delivered.attempts.push(Attempt {
                    status: None,
                    error,
                    message: String::new(),
                    retry_after: false,
                    elapsed,
                }),
            }
        }
    }

    /// Waits until `n` events are acknowledged, at most `limit`.
    pub async fn until_acked(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.acked.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "only {} events were acknowledged within {limit:?}",
                self.acked.load(Ordering::SeqCst)
            );
            actix_web::rt::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Polls `condition` every 50 ms until it holds, failing with `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sessions of the database at `url` (other than the asking one) that are inside a transaction.
///
/// On SQLite, where only a writer can block a retry: 1 while another holds the write lock (for
/// longer than a second: the server's own short writes come and go), else 0.
pub fn open_transactions(url: &str) -> i64 {
    if store_is_sqlite() {
        use diesel::connection::SimpleConnection;
        let mut conn = connect_url(url);
        conn.batch_execute("PRAGMA busy_timeout = 1000")
            .expect("set the busy timeout");
        return match conn.batch_execute("BEGIN IMMEDIATE; ROLLBACK") {
            Ok(()) => 0,
            Err(_) => 1,
        };
    }
    count_at(
        url,
        "pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
         AND xact_start IS NOT NULL",
    )
}

/// The invariants after a fault: every event was acknowledged in the end; none was answered
/// 500; every acknowledged event answers a fresh redelivery as a replay of the same status and
/// bytes, at once; its side effect committed exactly once; and no transaction is left open
/// that could block a retry.
pub async fn assert_invariants(
    provider: &Provider,
    address: &str,
    db_url: &str,
    all: &[Delivered],
) {
    for delivered in all {
        let id = &delivered.webhook.id;
        let statuses: Vec<_> = delivered.attempts.iter().map(|a| a.status).collect();
        assert!(
            !statuses.contains(&Some(500)),
            "{id} was answered 500: {:?}",
            delivered.attempts
        );
        let acked = delivered
            .acked
            .as_ref()
            .unwrap_or_else(|| panic!("{id} never got a 2xx: {:?}", delivered.attempts));
        let again = provider
            .deliver(address, &delivered.webhook, 1, Instant::now())
            .await;
        let replay = again
            .acked
            .unwrap_or_else(|| panic!("{id}: the redelivery got {:?}", again.attempts));
        assert!(replay.replayed(), "{id}: the redelivery is a replay");
        assert_eq!(
            (replay.status, &replay.body),
            (acked.status, &acked.body),
            "{id}: the replay has the acknowledged status and bytes"
        );
    }
    #[derive(QueryableByName)]
    struct Effect {
        #[diesel(sql_type = Text)]
        event_id: String,
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = connect_url(db_url);
    let effects: Vec<Effect> =
        diesel::sql_query("SELECT event_id, count(*) AS n FROM side_effects GROUP BY event_id")
            .load(&mut conn)
            .expect("count the side effects");
    let twice: Vec<_> = effects
        .iter()
        .filter(|e| e.n != 1)
        .map(|e| format!("{} x{}", e.event_id, e.n))
        .collect();
    assert!(
        twice.is_empty(),
        "side effects committed more than once: {twice:?}"
    );
    assert_eq!(
        effects.len(),
        all.len(),
        "every event's side effect committed"
    );
    eventually(
        "no transaction is left open",
        Duration::from_secs(10),
        || open_transactions(db_url) == 0,
    )
    .await;
}
