//! Upgrading a store that holds data: a database migrated by an older hookbox, with stored
//! events and an outbox in every state, is migrated by this one when it starts, and nothing is
//! lost: pending rows are sent, delivered ones are not sent again, dead ones can be requeued,
//! and a provider's retry is still answered from the stored response.

use diesel::connection::SimpleConnection;
use diesel_migrations::{FileBasedMigrations, MigrationHarness};
use hookbox::db::AnyConnection;
use hookbox::Handlers;
use sha2::{Digest, Sha256};

use crate::downstream::{always, Downstream};
use crate::forward::poll_until;
use crate::helpers::*;

/// The first migration after the first release that forwarded (one target per source, the
/// outbox as `2026-12-02-000003_create_deliveries` made it).
const FIRST_FORWARDING_RELEASE_ENDS_BEFORE: &str = "20261205160000";

/// Applies the store's migrations older than `version`, as an older hookbox would have.
pub(crate) fn migrate_before(conn: &mut AnyConnection, version: &str) {
    fn run<C: MigrationHarness<B>, B: diesel::backend::Backend>(
        conn: &mut C,
        dir: &str,
        version: &str,
    ) {
        let path = format!("{}/migrations/{dir}", env!("CARGO_MANIFEST_DIR"));
        let source = FileBasedMigrations::from_path(&path).expect("the migrations directory");
        let pending = conn
            .pending_migrations(source)
            .expect("list the migrations");
        let mut applied = 0;
        for migration in pending {
            if migration.name().version().to_string().as_str() < version {
                conn.run_migration(&migration)
                    .expect("an old migration runs");
                applied += 1;
            }
        }
        assert!(applied > 0, "no migration before {version} in {path}");
    }
    match conn {
        AnyConnection::Postgres(pg) => run(pg, "postgres", version),
        AnyConnection::Sqlite(sqlite) => run(sqlite, "sqlite", version),
    }
}

/// A GitHub delivery's body (its fingerprint is the SHA-256 of these bytes).
fn body(id: &str) -> String {
    format!(r#"{{"action":"opened","delivery":"{id}"}}"#)
}

/// The stored answer of a processed event, as hookbox wrote it.
fn stored_answer(id: &str) -> String {
    format!(r#"{{"source":"github","event_id":"{id}","event_type":"push","status":"processed"}}"#)
}

/// SQL that stores the github event `id`, processed a minute ago, with an outbox row in
/// `state` (attempts made, last status, delivered or not), in the old schema.
fn old_rows(sqlite: bool, id: &str, state: &str, attempts: i32, last_status: i32) -> String {
    let body = body(id);
    let fingerprint = hex::encode(Sha256::digest(body.as_bytes()));
    let answer = stored_answer(id);
    let headers = r#"{"x-github-event":"push","content-type":"application/json"}"#;
    let delivered = state == "delivered";
    let (bytes, hash, headers, received, delivered_at, due) = if sqlite {
        (
            format!("CAST('{body}' AS BLOB)"),
            format!("x'{fingerprint}'"),
            format!("'{headers}'"),
            "strftime('%Y-%m-%d %H:%M:%f+00:00', 'now', '-1 minute')",
            if delivered {
                "strftime('%Y-%m-%d %H:%M:%f+00:00', 'now', '-50 seconds')"
            } else {
                "NULL"
            },
            "strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')",
        )
    } else {
        (
            format!("convert_to('{body}', 'UTF8')"),
            format!("decode('{fingerprint}', 'hex')"),
            format!("'{headers}'::jsonb"),
            "now() - interval '1 minute'",
            if delivered {
                "now() - interval '50 seconds'"
            } else {
                "NULL"
            },
            "now()",
        )
    };
    let answer_bytes = if sqlite {
        format!("CAST('{answer}' AS BLOB)")
    } else {
        format!("convert_to('{answer}', 'UTF8')")
    };
    let last_error = if delivered {
        "NULL".to_owned()
    } else {
        format!("'HTTP {last_status}'")
    };
    format!(
        "INSERT INTO events (source, event_id, event_type, fingerprint, received_at, payload, \
           headers, response_status, response_content_type, response_body) \
         VALUES ('github', '{id}', 'push', {hash}, {received}, {bytes}, {headers}, 200, \
           'application/json', {answer_bytes});
         INSERT INTO deliveries (event_row, state, attempts, next_attempt_at, last_status, \
           last_error, delivered_at) \
         SELECT id, '{state}', {attempts}, {due}, {last_status}, {last_error}, {delivered_at} \
         FROM events WHERE event_id = '{id}';"
    )
}

#[actix_web::test]
async fn an_outbox_written_by_the_first_forwarding_release_is_carried_over_by_the_upgrade() {
    let db = TestDb::create();
    let sqlite = store_is_sqlite();
    {
        let mut conn = db.connect();
        migrate_before(&mut conn, FIRST_FORWARDING_RELEASE_ENDS_BEFORE);
        let rows = [
            old_rows(sqlite, "up_pending", "pending", 1, 503),
            old_rows(sqlite, "up_delivered", "delivered", 1, 200),
            old_rows(sqlite, "up_dead", "dead", 3, 500),
        ];
        conn.batch_execute(&rows.concat())
            .expect("the old release's rows are stored");
    }
    let downstream = Downstream::start(always(200));
    let extra = format!(
        "\n[sources.github.forward]\nurl = \"{}\"\nmax_attempts = 3\nsecret = \"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\"\n",
        downstream.url
    );
    let config = parse_config(&config_text(&db.url, &extra));
    // Starting serve migrates the store to this release.
    let app = TestApp::spawn_on(db, config, Handlers::default()).await;

    // The row that was waiting for a retry is sent, as the next attempt of its series.
    poll_until(
        "the pending row is sent",
        std::time::Duration::from_secs(20),
        || !downstream.for_key("github:up_pending").is_empty(),
    )
    .await;
    let sent = &downstream.for_key("github:up_pending")[0];
    assert_eq!(sent.body, body("up_pending").as_bytes());
    assert_eq!(sent.header("X-Hookbox-Target"), "default");
    assert_eq!(sent.header("X-Hookbox-Event-Type"), "push");

    // The old rows are the single-table target's, `default`, in the state they were in.
    let listed = |id: &'static str| {
        let address = app.address.clone();
        async move {
            let answer = get(
                &address,
                &format!("/admin/events/github/{id}/deliveries"),
                Some(ADMIN_TOKEN),
            )
            .await;
            assert_eq!(answer.status, 200, "{id}: {}", answer.text());
            answer.json()["deliveries"].clone()
        }
    };
    let delivered = listed("up_delivered").await;
    assert_eq!(delivered.as_array().map(Vec::len), Some(1), "{delivered}");
    assert_eq!(
        (&delivered[0]["state"], &delivered[0]["target"]),
        (
            &serde_json::json!("delivered"),
            &serde_json::json!("default")
        ),
        "{delivered}"
    );
    let dead = listed("up_dead").await;
    assert_eq!(
        (
            &dead[0]["state"],
            &dead[0]["target"],
            &dead[0]["last_status"]
        ),
        (
            &serde_json::json!("dead"),
            &serde_json::json!("default"),
            &serde_json::json!(500)
        ),
        "{dead}"
    );

    // A dead row of the old release is requeued like any other, and sent.
    let (status, requeued) = admin_post(
        &app.address,
        "/admin/deliveries/requeue?source=github&target=default",
    )
    .await;
    assert_eq!(
        (status, &requeued),
        (202, &serde_json::json!({"requeued": 1}))
    );
    poll_until(
        "the requeued row is sent",
        std::time::Duration::from_secs(20),
        || !downstream.for_key("github:up_dead").is_empty(),
    )
    .await;

    // GitHub retrying the delivered event gets the stored answer, byte for byte.
    let retry = delivery_for(
        &app.config,
        "github",
        &body("up_delivered"),
        "up_delivered",
        unix_now(),
    );
    let answer = app.send(&retry).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(answer.text(), stored_answer("up_delivered"));

    // An event received after the upgrade is stored and forwarded beside them.
    let fresh = delivery_for(
        &app.config,
        "github",
        &body("up_fresh"),
        "up_fresh",
        unix_now(),
    );
    assert_eq!(app.send(&fresh).await.status, 200);
    poll_until(
        "the new event is sent",
        std::time::Duration::from_secs(20),
        || !downstream.for_key("github:up_fresh").is_empty(),
    )
    .await;
    // What the old release had delivered is never sent again.
    assert!(downstream.for_key("github:up_delivered").is_empty());
    assert_eq!(app.db.count("events"), 4);
}
