//! `dedupe = "body"`: a payload already stored under one event id, sent again under another,
//! is answered as a replay of the first event and not processed.

use futures_util::future::join_all;
use hookbox::Handlers;

use crate::concurrency::ledger;
use crate::helpers::*;

/// The test config with `dedupe = "body"` on the github source (its id and type travel in
/// unsigned headers) and on nothing else.
fn dedupe_github() -> String {
    "[sources.github]\nscheme = \"github\"\ndedupe = \"body\"\n".to_owned()
}

async fn spawn(handlers: Handlers) -> TestApp {
    let db = TestDb::create();
    let text = config_text(&db.url, "")
        .replace("[sources.github]\nscheme = \"github\"\n", &dedupe_github());
    TestApp::spawn_on(db, parse_config(&text), handlers).await
}

#[actix_web::test]
async fn a_payload_resent_under_a_new_id_is_a_replay_of_the_first_event() {
    let app = spawn(Handlers::default()).await;
    let first_id = unique_id("gh");
    let body = format!(r#"{{"action":"opened","number":7,"nonce":"{first_id}"}}"#);
    let first = app.send(&app.delivery("github", &body, &first_id)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());

    // A captured delivery sent again with a new id header, and once more as another type: the
    // signature covers the body only, so both verify.
    let new_id = app.delivery("github", &body, &unique_id("gh"));
    let new_type = app
        .delivery("github", &body, &unique_id("gh"))
        .with_header("X-GitHub-Event", "deployment");
    for resent in [new_id, new_type] {
        let again = app.send(&resent).await;
        assert_eq!(
            (again.status, &again.body),
            (first.status, &first.body),
            "the first event's answer, byte for byte"
        );
        assert!(again.replayed());
        assert_eq!(again.json()["event_id"], first_id.as_str());
    }
    assert_eq!(app.db.count("events WHERE source = 'github'"), 1);

    // The first event's own redelivery is a replay as always; another payload is new.
    let redelivery = app.send(&app.delivery("github", &body, &first_id)).await;
    assert!(redelivery.replayed());
    let other_id = unique_id("gh");
    let other = app
        .send(&app.delivery("github", &format!("{body} "), &other_id))
        .await;
    assert_eq!(other.status, 200);
    assert!(!other.replayed());
    assert_eq!(app.db.count("events WHERE source = 'github'"), 2);

    // Without dedupe (shopify here), the same payload under a new id is a new event.
    let shopify_body = format!(r#"{{"id":1,"nonce":"{first_id}"}}"#);
    for _ in 0..2 {
        let id = unique_id("shop");
        let answer = app.send(&app.delivery("shopify", &shopify_body, &id)).await;
        assert_eq!(answer.status, 200);
        assert!(!answer.replayed());
    }
    assert_eq!(app.db.count("events WHERE source = 'shopify'"), 2);
}

#[actix_web::test]
async fn ten_ids_with_one_payload_at_once_book_once_and_get_identical_answers() {
    let app = spawn(Handlers::default().with("github", ledger::Ledger)).await;
    let nonce = unique_id("order");
    // A Stripe-shaped payment, as the ledger books it, resent under ten ids at once.
    let body = stripe_event(&nonce, "payment_intent.succeeded", 1);
    let deliveries: Vec<Delivery> = (0..10)
        .map(|_| {
            app.delivery("github", &body, &unique_id("gh"))
                .with_header("X-GitHub-Event", "payment_intent.succeeded")
        })
        .collect();
    let answers = join_all(deliveries.iter().map(|d| app.send(d))).await;

    let processed = answers.iter().filter(|a| !a.replayed()).count();
    assert_eq!(processed, 1, "exactly one delivery processes the payload");
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            (answer.status, &answer.body),
            (answers[0].status, &answers[0].body)
        );
    }
    assert_eq!(answers[0].json()["booked"]["order_id"], "101");
    assert_eq!(app.db.count("ledger_entries"), 1, "booked once");
    assert_eq!(app.db.count("events WHERE source = 'github'"), 1);
}
