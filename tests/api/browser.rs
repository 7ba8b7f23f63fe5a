//! The console in a real browser: headless Chromium driven over WebDriver, against the real
//! server. Each page visited is saved as a screenshot under `target/console-screenshots/`.

use std::time::Duration;

use crate::console::form_encode;
use crate::downstream::always;
use crate::forward::{forwarding_to_a_silent_downstream, poll_until};
use crate::helpers::*;
use crate::webdriver::{Browser, Chromedriver};

async fn log_in(browser: &Browser, app: &TestApp) {
    browser.go(&format!("{}/console", app.address)).await;
    assert!(
        browser.url().await.ends_with("/console/login"),
        "without a session the console sends the browser to its login form"
    );
    let token = browser.find("#token").await;
    browser.type_into(&token, ADMIN_TOKEN).await;
    browser.click(&browser.find("#login").await).await;
    assert_eq!(browser.text_of("h1").await, "Overview");
}

/// No script ran: no dialog is open, and the page has no script or image element at all.
async fn assert_no_script_ran(browser: &Browser, page: &str) {
    assert_eq!(browser.alert_text().await, None, "a dialog fired on {page}");
    assert_eq!(
        browser.count("script").await,
        0,
        "a script element on {page}"
    );
    assert_eq!(browser.count("img").await, 0, "an image element on {page}");
}

#[actix_web::test]
async fn an_operator_logs_in_finds_an_event_sees_it_whole_and_requeues_its_dead_delivery() {
    let (downstream, app) = forwarding_to_a_silent_downstream().await;
    let id = unique_id("evt");
    let delivery = app.delivery(
        "stripe",
        &stripe_event(&id, "payment_intent.succeeded", 1),
        &id,
    );
    assert_eq!(app.send(&delivery).await.status, 200);
    assert!(app.send(&delivery).await.replayed());
    for _ in 0..3 {
        let other = unique_id("evt");
        let body = stripe_event(&other, "charge.succeeded", 1);
        assert_eq!(
            app.send(&app.delivery("stripe", &body, &other))
                .await
                .status,
            200
        );
    }

    let mut driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &app).await;
    assert_no_script_ran(&browser, "the overview").await;
    browser.screenshot("1-overview").await;

    browser
        .click(&browser.find("header a[href='/console/events']").await)
        .await;
    browser
        .type_into(&browser.find("#filter-id").await, &id)
        .await;
    browser.click(&browser.find("#filter-submit").await).await;
    assert_eq!(browser.count("a.event-link").await, 1, "found by its id");
    let link = browser.find("a.event-link").await;
    assert_eq!(browser.text(&link).await, id);
    browser.screenshot("2-events-found-by-id").await;

    poll_until(
        "the delivery is dead-lettered",
        Duration::from_secs(15),
        || {
            app.db.count(&format!(
                "deliveries d JOIN events e ON e.id = d.event_row \
                 WHERE e.event_id = '{id}' AND d.state = 'dead'"
            )) == 1
        },
    )
    .await;
    downstream.behave(always(200));
    browser.click(&link).await;
    assert_eq!(browser.text_of("#event-id").await, id);
    assert_eq!(browser.text_of("#stored-status").await, "200");
    let payload = browser.text_of("#payload").await;
    assert!(
        payload.contains("\"order_id\": \"101\""),
        "the body, re-indented: {payload}"
    );
    assert!(payload.contains(&format!("\"id\": \"{id}\"")), "{payload}");
    let response = browser.text_of("#response").await;
    assert!(
        response.contains("\"status\": \"processed\""),
        "the stored response: {response}"
    );
    assert!(
        response.contains(&format!("\"event_id\": \"{id}\"")),
        "{response}"
    );
    assert!(browser
        .text_of("#headers")
        .await
        .contains("stripe-signature"));
    let row = browser.text_of("#deliveries tbody tr").await;
    assert!(row.contains("dead"), "{row}");
    assert!(row.contains("no answer within"), "the last error: {row}");
    assert_no_script_ran(&browser, "the event page").await;
    browser.screenshot("3-event").await;

    browser.click(&browser.find("button.requeue").await).await;
    let notice = browser.text_of("#notice").await;
    assert!(notice.contains("is re-queued"), "{notice}");
    assert_eq!(
        browser.text_of("#event-id").await,
        id,
        "back on the event's page"
    );
    browser.screenshot("4-requeued").await;
    let key = format!("stripe:{id}");
    poll_until(
        "the re-queued delivery reaches the downstream",
        Duration::from_secs(10),
        || downstream.first_attempt_succeeded(&key),
    )
    .await;
    browser.close().await;
}

#[actix_web::test]
async fn hostile_payloads_and_headers_render_as_text_and_run_no_script() {
    let app = TestApp::spawn().await;
    let script = "<script>alert(1)</script>";
    let image = "\"><img src=x onerror=alert(1)>";
    let id = format!("{}{image}", unique_id("evt"));
    let body = serde_json::json!({
        "id": id,
        "object": "event",
        "type": script,
        "data": {"object": {"description": image, "note": script}},
    })
    .to_string();
    let content_type = format!("application/json; note=\"{script}\"");
    let json_delivery = app
        .delivery("stripe", &body, &id)
        .with_header("Content-Type", &content_type);
    assert_eq!(app.send(&json_delivery).await.status, 200);
    let raw = format!("{script}{image}");
    let gh = format!("{}{script}", unique_id("gh"));
    assert_eq!(
        app.send(&app.delivery("github", &raw, &gh)).await.status,
        200
    );

    let mut driver = Chromedriver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &app).await;

    browser.go(&format!("{}/console/events", app.address)).await;
    let listed = browser.text_of("#events").await;
    assert!(
        listed.contains(&id) && listed.contains(&gh),
        "ids as text: {listed}"
    );
    assert!(listed.contains(script), "the type as text: {listed}");
    assert_no_script_ran(&browser, "the event list").await;
    browser.screenshot("5-hostile-list").await;

    browser
        .go(&format!(
            "{}/console/event?source=stripe&id={}",
            app.address,
            form_encode(&id)
        ))
        .await;
    assert_eq!(browser.text_of("#event-id").await, id);
    assert_eq!(browser.text_of("#event-type").await, script);
    let payload = browser.text_of("#payload").await;
    assert!(
        payload.contains(&format!("\"note\": \"{script}\"")),
        "{payload}"
    );
    assert!(payload.contains(image), "{payload}");
    assert!(browser.text_of("#headers").await.contains(&content_type));
    assert_no_script_ran(&browser, "the JSON event").await;
    browser.screenshot("6-hostile-event").await;

    browser
        .go(&format!(
            "{}/console/event?source=github&id={}",
            app.address,
            form_encode(&gh)
        ))
        .await;
    assert_eq!(
        browser.text_of("#payload").await,
        raw,
        "a raw body, as it came"
    );
    assert_no_script_ran(&browser, "the raw event").await;
    browser.close().await;
}
