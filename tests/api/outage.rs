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
    let proxy = Proxy::start(host_port(&db.url));
    let proxied_url = {
        let direct = host_port(&db.url);
        db.url
            .replacen(&direct, &format!("127.0.0.1:{}", proxy.port), 1)
    };
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
