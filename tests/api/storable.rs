//! Values a store cannot hold: PostgreSQL `text` cannot carry U+0000, which JSON can. A
//! delivery or a lookup that carries one is answered as what it is (stored, 400 or 404), never
//! with a 5xx, which would have the provider retry for ever something that can never work.

use serde_json::Value;

use crate::console::{form_encode, get_page, log_in};
use crate::helpers::*;

/// JSON's spelling of U+0000, as it travels in a body.
const NUL: &str = "\\u0000";

#[actix_web::test]
async fn a_nul_in_an_event_type_is_stored_escaped_and_replays() {
    let app = TestApp::spawn().await;
    let stripe_id = unique_id("evt_nul_type");
    let acme_id = unique_id("acme_nul_type");
    let cases = [
        (
            "stripe",
            stripe_id.clone(),
            stripe_event(&stripe_id, &format!("a{NUL}b"), 1),
        ),
        (
            "acme",
            acme_id.clone(),
            format!(r#"{{"type":"a{NUL}b","n":1}}"#),
        ),
    ];
    for (source, id, body) in &cases {
        let delivery = app.delivery(source, body, id);
        let first = app.send(&delivery).await;
        assert_eq!(first.status, 200, "{source}: {}", first.text());
        assert_eq!(first.json()["event_type"], "a\\u0000b", "{source}");
        let again = app.send(&delivery).await;
        assert_eq!(again.status, 200, "{source}: {}", again.text());
        assert!(
            again.replayed(),
            "{source}: the second delivery is a replay"
        );
        assert_eq!(again.body, first.body, "{source}");

        let stored = app
            .get(&format!("/admin/events/{source}/{id}"), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(stored.status, 200, "{source}: {}", stored.text());
        assert_eq!(stored.json()["event_type"], "a\\u0000b", "{source}");
        // The payload is kept byte for byte, NUL escape and all.
        assert_eq!(stored.json()["payload"].as_str(), Some(body.as_str()));
    }
}

#[actix_web::test]
async fn a_nul_in_an_event_id_is_refused_as_invalid_never_5xx() {
    let app = TestApp::spawn().await;
    let id = format!("evt_nul{NUL}x");
    let cases = [
        ("stripe", stripe_event(&id, "charge.succeeded", 1)),
        (
            "acmejson",
            format!(r#"{{"id":"{id}","type":"thing.done"}}"#),
        ),
    ];
    for (source, body) in &cases {
        let answer = app.send(&app.delivery(source, body, &id)).await;
        assert_eq!(answer.status, 400, "{source}: {}", answer.text());
        assert_eq!(answer.error(), "invalid_event_id", "{source}");
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn lookups_with_a_nul_are_not_found_or_empty_never_5xx() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt_there");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    for path in [
        "/admin/events/stripe/evt%00x".to_owned(),
        format!("/admin/events/str%00ipe/{id}"),
        "/admin/events/stripe/evt%00x/deliveries".to_owned(),
    ] {
        let answer = app.get(&path, Some(ADMIN_TOKEN)).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.text());
        assert_eq!(answer.error(), "not_found", "{path}");
    }
    let listed = app
        .get("/admin/events?source=str%00ipe", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(listed.json()["events"], Value::Array(vec![]));

    let cookie = log_in(&app).await;
    let nul = form_encode("\u{0}");
    let page = get_page(
        &app,
        &format!("/console/event?source=stripe&id=evt{nul}x"),
        Some(&cookie),
    )
    .await;
    assert_eq!(page.status, 404, "{}", page.text());
    for filter in ["source", "type", "id"] {
        let path = format!("/console/events?{filter}=a{nul}b");
        let page = get_page(&app, &path, Some(&cookie)).await;
        assert_eq!(page.status, 200, "{path}: {}", page.text());
        assert!(!page.text().contains(&id), "{path}: nothing matches");
    }
}

#[actix_web::test]
async fn an_event_with_a_nul_exported_from_sqlite_replays_into_postgres() {
    let db = TestDb::create_on(true);
    let config = parse_config(&config_text(&db.url, ""));
    let sqlite = TestApp::spawn_on(db, config, hookbox::Handlers::default()).await;
    let id = unique_id("evt_nul_export");
    let body = stripe_event(&id, &format!("a{NUL}b"), 1);
    let answer = sqlite.send(&sqlite.delivery("stripe", &body, &id)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    let sqlite_config = TempFile::new(&config_text(&sqlite.db.url, ""));
    let exported = export_all(&sqlite_config.path()).await;

    let pg_db = TestDb::create_on(false);
    let pg_config = parse_config(&config_text(&pg_db.url, ""));
    let postgres = TestApp::spawn_on(pg_db, pg_config, hookbox::Handlers::default()).await;
    let (code, stdout, stderr) = run_hookbox_async(&[
        "replay",
        &exported.path(),
        "--to",
        &postgres.address,
        "--config",
        &sqlite_config.path(),
    ])
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(postgres.db.count("events"), 1, "{stdout}\n{stderr}");
    let stored = postgres
        .get(&format!("/admin/events/stripe/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    assert_eq!(stored.json()["event_type"], "a\\u0000b");
    assert_eq!(stored.json()["payload"].as_str(), Some(body.as_str()));
}

/// Answers with a Content-Type no header (and no PostgreSQL `text`) can carry.
struct NulContentType;

impl hookbox::Handler for NulContentType {
    fn handle(
        &self,
        _conn: &mut hookbox::AnyConnection,
        _event: &hookbox::Event<'_>,
    ) -> anyhow::Result<hookbox::Response> {
        Ok(hookbox::Response {
            status: 200,
            content_type: "text/plain\u{0}".to_owned(),
            body: b"ok".to_vec(),
        })
    }

    fn uses_connection(&self) -> bool {
        false
    }
}

#[actix_web::test]
async fn a_handlers_content_type_with_a_nul_is_its_failure_not_the_databases() {
    let app = TestApp::spawn_with(
        "",
        hookbox::Handlers::default().with("stripe", NulContentType),
    )
    .await;
    let id = unique_id("evt_nul_ct");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id))
        .await;
    assert_eq!(
        (answer.status, answer.error().as_str()),
        (500, "processing_failed"),
        "{}",
        answer.text()
    );
    assert_eq!(app.db.count("events"), 0);
}
