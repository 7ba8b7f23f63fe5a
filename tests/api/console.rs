//! The operator console over plain HTTP: who gets in, what it refuses, and what it counts.

use std::time::Duration;

use diesel::prelude::*;
use hookbox::Handlers;

use crate::admin::spawn_without_admin_token;
use crate::downstream::{always, Downstream};
use crate::forward::{deliveries, first_delivery_in, forward_extra, poll_until};
use crate::helpers::*;

/// The console's Content-Security-Policy, exactly.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                   form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// `GET {path}` with the session cookie, if any.
pub async fn get_page(app: &TestApp, path: &str, cookie: Option<&str>) -> Answer {
    let mut request = client().get(format!("{}{path}", app.address));
    if let Some(cookie) = cookie {
        request = request.insert_header(("Cookie", cookie));
    }
    read(request.send().await.expect("the server answers")).await
}

/// `HEAD {path}` with the session cookie, if any.
async fn head_page(app: &TestApp, path: &str, cookie: Option<&str>) -> Answer {
    let mut request = client().head(format!("{}{path}", app.address));
    if let Some(cookie) = cookie {
        request = request.insert_header(("Cookie", cookie));
    }
    read(request.send().await.expect("the server answers")).await
}

/// `POST {path}` with a form body and the session cookie, if any.
pub async fn post_form(
    app: &TestApp,
    path: &str,
    cookie: Option<&str>,
    fields: &[(&str, &str)],
) -> Answer {
    let mut request = client()
        .post(format!("{}{path}", app.address))
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"));
    if let Some(cookie) = cookie {
        request = request.insert_header(("Cookie", cookie));
    }
    let body = fields
        .iter()
        .map(|(name, value)| format!("{name}={}", form_encode(value)))
        .collect::<Vec<_>>()
        .join("&");
    read(request.send_body(body).await.expect("the server answers")).await
}

/// Percent-encodes everything but unreserved characters, for a form body or a query value.
pub fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Logs in with the admin token: the `name=value` to send back as `Cookie`.
pub async fn log_in(app: &TestApp) -> String {
    let answer = post_form(app, "/console/login", None, &[("token", ADMIN_TOKEN)]).await;
    assert_eq!(answer.status, 303, "{}", answer.text());
    let set_cookie = answer.header("Set-Cookie").expect("a session cookie");
    set_cookie
        .split(';')
        .next()
        .expect("name=value first")
        .to_owned()
}

/// The console's page of `source`'s event `id`.
pub async fn event_page(app: &TestApp, cookie: &str, source: &str, id: &str) -> Answer {
    let path = format!("/console/event?source={source}&id={}", form_encode(id));
    get_page(app, &path, Some(cookie)).await
}

/// The value of the first hidden `csrf` field on a page.
fn csrf_of(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[start..start + page[start..].find('"').expect("the value ends")].to_owned()
}

fn dead_deliveries(app: &TestApp) -> i64 {
    app.db.count("deliveries WHERE state = 'dead'")
}

#[actix_web::test]
async fn the_console_is_404_while_no_admin_token_is_configured() {
    let app = spawn_without_admin_token().await;
    for path in [
        "/console",
        "/console/login",
        "/console/events",
        "/console/event?source=stripe&id=x",
        "/console/nosuch",
        "/console/event?source=stripe&id=x&count=-1",
    ] {
        let answer = get_page(&app, path, None).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (404, "not_found"),
            "{path}"
        );
    }
    let login = post_form(&app, "/console/login", None, &[("token", ADMIN_TOKEN)]).await;
    assert_eq!(login.status, 404);
    assert!(login.header("Set-Cookie").is_none());
    let odd = post_form(&app, "/console/deliveries/abc/requeue", None, &[]).await;
    assert_eq!((odd.status, odd.error().as_str()), (404, "not_found"));
}

#[actix_web::test]
async fn an_address_the_console_never_makes_gets_a_console_page_with_its_headers() {
    let app = TestApp::spawn().await;
    let cookie = log_in(&app).await;
    let csrf = csrf_of(&get_page(&app, "/console", Some(&cookie)).await.text());
    for (answer, status, says) in [
        (
            get_page(&app, "/console/nosuch", Some(&cookie)).await,
            404,
            "no page",
        ),
        (
            get_page(
                &app,
                "/console/event?source=stripe&id=x&count=-1",
                Some(&cookie),
            )
            .await,
            400,
            "not one the console makes",
        ),
        (
            post_form(
                &app,
                "/console/deliveries/abc/requeue",
                Some(&cookie),
                &[("csrf", &csrf)],
            )
            .await,
            400,
            "not one the console makes",
        ),
        // A filter the form never sends is refused, not ignored: the list would look filtered.
        (
            get_page(&app, "/console/events?soruce=stripe", Some(&cookie)).await,
            400,
            "unknown field `soruce`",
        ),
        (
            get_page(&app, "/console/events?source=a&source=b", Some(&cookie)).await,
            400,
            "(duplicate field `source`)",
        ),
        (
            get_page(&app, "/console?source=stripe", Some(&cookie)).await,
            400,
            "unknown field `source`",
        ),
        // The dead filter's box sends 1; `dead=0` was read as ticked.
        (
            get_page(&app, "/console/events?dead=0", Some(&cookie)).await,
            400,
            "the filter takes 1 (ticked) or nothing",
        ),
    ] {
        assert_eq!(answer.status, status, "{}", answer.text());
        assert_eq!(answer.header("Content-Security-Policy"), Some(CSP));
        assert!(
            answer
                .header("content-type")
                .is_some_and(|t| t.starts_with("text/html")),
            "{:?}",
            answer.header("content-type")
        );
        assert!(answer.text().contains(says), "{}", answer.text());
    }
    // The page that refuses dead=0 shows its box unticked: filtering from it again must not
    // ask for the opposite.
    let refused = get_page(&app, "/console/events?dead=0", Some(&cookie))
        .await
        .text();
    let at = refused
        .find("id=\"filter-dead\"")
        .expect("the dead filter's box");
    let start = refused[..at].rfind("<input").expect("its tag");
    let end = at + refused[at..].find('>').expect("its tag's end");
    let dead_box = &refused[start..=end];
    assert!(!dead_box.contains("checked"), "{dead_box}");
    // Before logging in, a page that is not there is the login form's business.
    let answer = get_page(&app, "/console/nosuch", None).await;
    assert_eq!(answer.status, 303);
}

#[actix_web::test]
async fn without_a_session_every_page_redirects_to_the_login_form() {
    let app = TestApp::spawn().await;
    let forged = "hookbox_console=not-a-session";
    for cookie in [None, Some(forged)] {
        // The login leads back to the page asked for (the overview needs no `next`).
        for (path, login) in [
            ("/console", "/console/login"),
            ("/console/", "/console/login"),
            ("/console/events", "/console/login?next=%2Fconsole%2Fevents"),
            (
                "/console/event?source=stripe&id=x",
                "/console/login?next=%2Fconsole%2Fevent%3Fsource%3Dstripe%26id%3Dx",
            ),
        ] {
            let answer = get_page(&app, path, cookie).await;
            assert_eq!(
                (answer.status, answer.header("Location")),
                (303, Some(login)),
                "{path} {cookie:?}"
            );
        }
        let requeue = post_form(
            &app,
            "/console/deliveries/1/requeue",
            cookie,
            &[("csrf", "x")],
        )
        .await;
        assert_eq!(
            (requeue.status, requeue.header("Location")),
            (303, Some("/console/login"))
        );
    }
    let form = get_page(&app, "/console/login", None).await;
    assert_eq!(form.status, 200);
    assert!(form.text().contains("name=\"token\""));
    assert_eq!(form.header("Content-Security-Policy"), Some(CSP));
}

#[actix_web::test]
async fn a_head_request_gets_the_answer_of_a_get_and_the_login_form_leads_nowhere() {
    // A link checker or a monitor asks with HEAD and follows redirects (`curl -IL`).
    let app = TestApp::spawn().await;
    let form = head_page(&app, "/console/login", None).await;
    assert_eq!(form.status, 200);
    assert!(form.body.is_empty());
    assert_eq!(form.header("Content-Security-Policy"), Some(CSP));
    for (path, login) in [
        ("/console", "/console/login"),
        ("/console/events", "/console/login?next=%2Fconsole%2Fevents"),
    ] {
        let answer = head_page(&app, path, None).await;
        assert_eq!(
            (answer.status, answer.header("Location")),
            (303, Some(login)),
            "{path}"
        );
        let there = head_page(&app, login, None).await;
        assert_eq!(there.status, 200, "{login}");
    }
    let cookie = log_in(&app).await;
    let overview = head_page(&app, "/console", Some(&cookie)).await;
    assert_eq!(overview.status, 200);
    assert!(overview.body.is_empty());
}

#[actix_web::test]
async fn a_link_to_a_page_leads_there_through_the_login() {
    // An operator paged at night follows a link to an event's page: after the login, that
    // page, not the overview, and still after a mistyped token first.
    let app = TestApp::spawn().await;
    let page = "/console/event?source=stripe&id=evt_linked";
    let sent_away = get_page(&app, page, None).await;
    let login = sent_away
        .header("Location")
        .expect("to the login")
        .to_owned();
    let form = get_page(&app, &login, None).await;
    assert_eq!(form.status, 200);
    let hidden = format!("name=\"next\" value=\"{}\"", page.replace('&', "&amp;"));
    assert!(form.text().contains(&hidden), "{}", form.text());

    let mistyped = post_form(
        &app,
        "/console/login",
        None,
        &[("token", "nope"), ("next", page)],
    )
    .await;
    assert_eq!(mistyped.status, 401);
    assert!(mistyped.text().contains(&hidden), "{}", mistyped.text());

    let logged_in = post_form(
        &app,
        "/console/login",
        None,
        &[("token", ADMIN_TOKEN), ("next", page)],
    )
    .await;
    assert_eq!(
        (logged_in.status, logged_in.header("Location")),
        (303, Some(page))
    );
    // Logged in already, the form's link goes straight on.
    let cookie = log_in(&app).await;
    let again = get_page(&app, &login, Some(&cookie)).await;
    assert_eq!((again.status, again.header("Location")), (303, Some(page)));

    // Never anywhere but a console page, whatever the link says.
    for elsewhere in ["//evil.example/", "https://evil.example/", "/admin/events"] {
        let answer = post_form(
            &app,
            "/console/login",
            None,
            &[("token", ADMIN_TOKEN), ("next", elsewhere)],
        )
        .await;
        assert_eq!(
            (answer.status, answer.header("Location")),
            (303, Some("/console")),
            "{elsewhere}"
        );
    }
}

#[actix_web::test]
async fn a_wrong_token_is_refused_with_the_form_again_and_no_cookie() {
    let app = TestApp::spawn().await;
    let near_miss = &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1];
    for token in ["nope", near_miss, ""] {
        let answer = post_form(&app, "/console/login", None, &[("token", token)]).await;
        assert_eq!(answer.status, 401, "{token:?}");
        assert!(answer.header("Set-Cookie").is_none(), "{token:?}");
        let page = answer.text();
        assert!(page.contains("name=\"token\""), "the form again: {page}");
        assert!(page.contains("That token was not accepted."));
        assert!(!page.contains(ADMIN_TOKEN) && (token.is_empty() || !page.contains(token)));
    }
    let no_field = post_form(&app, "/console/login", None, &[]).await;
    assert_eq!(no_field.status, 401);
}

#[actix_web::test]
async fn a_login_with_a_field_the_form_has_not_or_one_given_twice_is_refused() {
    // `token=T&token=wrong` logged in, as only the first token was read (bb89).
    let app = TestApp::spawn().await;
    let forms: [&[(&str, &str)]; 5] = [
        &[("token", ADMIN_TOKEN), ("token", "wrong")],
        &[("token", "wrong"), ("token", ADMIN_TOKEN)],
        &[("token", ADMIN_TOKEN), ("x", "1")],
        &[("token", ADMIN_TOKEN), ("csrf", "zz")],
        &[
            ("token", ADMIN_TOKEN),
            ("next", "/console/events"),
            ("next", "/console/event?source=stripe&id=x"),
        ],
    ];
    for fields in forms {
        let refused = post_form(&app, "/console/login", None, fields).await;
        assert_eq!(refused.status, 400, "{fields:?}: {}", refused.text());
        assert!(refused.header("Set-Cookie").is_none(), "{fields:?}");
        assert_eq!(refused.header("Content-Security-Policy"), Some(CSP));
        assert!(
            refused.text().contains("not one the console makes"),
            "{fields:?}: {}",
            refused.text()
        );
    }
}

#[actix_web::test]
async fn logging_in_sets_an_http_only_strict_cookie_that_is_not_the_token() {
    let app = TestApp::spawn().await;
    let answer = post_form(&app, "/console/login", None, &[("token", ADMIN_TOKEN)]).await;
    assert_eq!(
        (answer.status, answer.header("Location")),
        (303, Some("/console"))
    );
    let set_cookie = answer
        .header("Set-Cookie")
        .expect("a session cookie")
        .to_owned();
    let attributes: Vec<&str> = set_cookie.split(';').map(str::trim).collect();
    let (name, value) = attributes[0].split_once('=').expect("name=value");
    assert_eq!(name, "hookbox_console");
    assert!(value.len() >= 32, "a long random id: {value}");
    assert!(
        !set_cookie.contains(ADMIN_TOKEN),
        "the token is not the cookie"
    );
    for wanted in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(attributes.contains(&wanted), "{wanted} in {set_cookie}");
    }
    assert!(!attributes.contains(&"Secure"), "plain HTTP: {set_cookie}");
    // Behind a TLS proxy, in whatever case it writes the scheme: Secure.
    for proto in ["https", "HTTPS"] {
        let mut behind = client()
            .post(format!("{}/console/login", app.address))
            .insert_header(("X-Forwarded-Proto", proto))
            .send_form(&[("token", ADMIN_TOKEN)])
            .await
            .expect("the console answers");
        let cookie = behind
            .headers()
            .get("Set-Cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let _ = behind.body().await;
        assert!(
            cookie.split(';').map(str::trim).any(|a| a == "Secure"),
            "{proto}: {cookie}"
        );
    }
    let again = post_form(&app, "/console/login", None, &[("token", ADMIN_TOKEN)]).await;
    assert_ne!(
        again
            .header("Set-Cookie")
            .map(|c| c.split(';').next().unwrap_or("").to_owned()),
        Some(attributes[0].to_owned()),
        "each login gets a session of its own"
    );

    let cookie = attributes[0];
    let overview = get_page(&app, "/console", Some(cookie)).await;
    assert_eq!(overview.status, 200, "{}", overview.text());
    assert_eq!(overview.header("Content-Security-Policy"), Some(CSP));
    assert_eq!(overview.header("X-Frame-Options"), Some("DENY"));
    assert_eq!(overview.header("Cache-Control"), Some("no-store"));
    assert!(overview.text().contains("<h1>Overview</h1>"));
    assert_eq!(
        get_page(&app, "/console/login", Some(cookie))
            .await
            .header("Location"),
        Some("/console"),
        "logged in, the form sends you on"
    );

    let csrf = csrf_of(&overview.text());
    let refused = post_form(&app, "/console/logout", Some(cookie), &[]).await;
    assert_eq!(refused.status, 403, "logging out needs the CSRF token too");
    let logout = post_form(&app, "/console/logout", Some(cookie), &[("csrf", &csrf)]).await;
    assert_eq!(
        (logout.status, logout.header("Location")),
        (303, Some("/console/login"))
    );
    assert!(logout
        .header("Set-Cookie")
        .is_some_and(|c| c.starts_with("hookbox_console=;") && c.contains("Max-Age=0")));
    assert_eq!(
        get_page(&app, "/console", Some(cookie)).await.status,
        303,
        "the old cookie no longer works"
    );
}

/// A server forwarding stripe to a downstream that answers 410, and `n` events whose
/// deliveries that made dead: the downstream, the server and the events' ids.
/// While an attempt is under way, the admin API says so (`attempt_under_way`) and the console
/// shows "under way", not a next attempt seconds ahead (the lease's end, which read as a retry
/// planned while the downstream was being called; found by a black-box run).
#[actix_web::test]
async fn an_attempt_under_way_is_said_so_by_the_admin_api_and_the_console() {
    let downstream = Downstream::start(|_, _| (200, Duration::from_secs(2)));
    let app = TestApp::spawn_with(
        &forward_extra(&downstream.url, "10s", 3),
        Handlers::default(),
    )
    .await;
    let cookie = log_in(&app).await;
    let id = unique_id("evt");
    let answer = app
        .send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    poll_until(
        "the downstream is answering",
        Duration::from_secs(10),
        || downstream.answering() == 1,
    )
    .await;
    let listed = deliveries(&app, &id).await;
    assert_eq!(
        (&listed[0]["state"], &listed[0]["attempt_under_way"]),
        (&serde_json::json!("pending"), &serde_json::json!(true)),
        "{listed}"
    );
    let page = event_page(&app, &cookie, "stripe", &id).await.text();
    assert!(page.contains("under way"), "{page}");

    poll_until("delivered", Duration::from_secs(10), || {
        downstream.answering() == 0 && !downstream.received().is_empty()
    })
    .await;
    let listed = first_delivery_in(&app, &id, "delivered", Duration::from_secs(5)).await;
    assert_eq!(listed[0]["state"], "delivered", "{listed}");
    assert_eq!(listed[0]["attempt_under_way"], false, "{listed}");
    let page = event_page(&app, &cookie, "stripe", &id).await.text();
    assert!(!page.contains("under way"), "{page}");
}

async fn with_dead_deliveries(n: usize) -> (Downstream, TestApp, Vec<String>) {
    let downstream = Downstream::start(always(410));
    let app = TestApp::spawn_with(
        &forward_extra(&downstream.url, "5s", 3),
        Handlers::default(),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = unique_id("evt");
        let sent = app
            .send(&app.delivery("stripe", &stripe_event(&id, "charge.failed", 1), &id))
            .await;
        assert_eq!(sent.status, 200);
        ids.push(id);
    }
    poll_until(
        "the 410s dead-letter the deliveries",
        Duration::from_secs(10),
        || dead_deliveries(&app) == n as i64,
    )
    .await;
    (downstream, app, ids)
}

/// [`with_dead_deliveries`] of one event: the downstream, the server, the event's id and its
/// dead delivery's id.
async fn with_one_dead_delivery() -> (Downstream, TestApp, String, i64) {
    let (downstream, app, mut ids) = with_dead_deliveries(1).await;
    let id = ids.remove(0);
    let delivery_id = deliveries(&app, &id).await[0]["id"]
        .as_i64()
        .expect("a delivery id");
    (downstream, app, id, delivery_id)
}

#[actix_web::test]
async fn a_requeue_without_the_sessions_csrf_token_is_refused() {
    let (_downstream, app, id, delivery_id) = with_one_dead_delivery().await;

    let cookie = log_in(&app).await;
    let page = event_page(&app, &cookie, "stripe", &id).await;
    assert_eq!(page.status, 200);
    assert!(page
        .text()
        .contains(&format!("id=\"requeue-{delivery_id}\"")));
    let csrf = csrf_of(&page.text());
    let path = format!("/console/deliveries/{delivery_id}/requeue");
    let back = [("source", "stripe"), ("event_id", id.as_str())];

    let without = post_form(&app, &path, Some(&cookie), &back).await;
    assert_eq!(without.status, 403, "{}", without.text());
    let mut wrong = back.to_vec();
    wrong.push(("csrf", "not-the-token"));
    assert_eq!(
        post_form(&app, &path, Some(&cookie), &wrong).await.status,
        403
    );
    let other_session = log_in(&app).await;
    let mut borrowed = back.to_vec();
    borrowed.push(("csrf", &csrf));
    assert_eq!(
        post_form(&app, &path, Some(&other_session), &borrowed)
            .await
            .status,
        403,
        "a CSRF token belongs to its own session"
    );
    assert_eq!(dead_deliveries(&app), 1, "nothing was re-queued");

    let accepted = post_form(&app, &path, Some(&cookie), &borrowed).await;
    assert_eq!(accepted.status, 303);
    let location = accepted
        .header("Location")
        .expect("back to the event")
        .to_owned();
    assert!(
        location.starts_with("/console/event?source=stripe&id="),
        "{location}"
    );
    assert!(location.contains("notice=requeued"), "{location}");
    assert_eq!(dead_deliveries(&app), 0, "re-queued");
    let shown = get_page(&app, &location, Some(&cookie)).await.text();
    assert!(
        shown.contains(&format!("Delivery {delivery_id} is re-queued")),
        "{shown}"
    );
}

#[actix_web::test]
async fn a_re_queue_the_database_refuses_says_why_not_that_it_did_not_answer() {
    // On a full disk or a store that refused writes, the console said "The database did not
    // answer", sending an operator to look for an outage, where the admin API named the cause
    // (a black-box run). A trigger makes the store refuse the re-queue's UPDATE as a
    // read-only store does.
    let (_downstream, app, id, delivery_id) = with_one_dead_delivery().await;
    let id = id.as_str();
    let refuse = if store_is_sqlite() {
        "CREATE TRIGGER hb_refuse BEFORE UPDATE ON deliveries BEGIN \
         SELECT RAISE(ABORT, 'attempt to write a readonly database'); END;"
    } else {
        "CREATE FUNCTION hb_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         RAISE EXCEPTION 'permission denied for table deliveries'; END $$; \
         CREATE TRIGGER hb_refuse BEFORE UPDATE ON deliveries FOR EACH ROW \
         EXECUTE FUNCTION hb_refuse();"
    };
    use diesel::connection::SimpleConnection;
    app.db.connect().batch_execute(refuse).expect("the trigger");
    let cookie = log_in(&app).await;
    let csrf = csrf_of(&event_page(&app, &cookie, "stripe", id).await.text());
    let one = post_form(
        &app,
        &format!("/console/deliveries/{delivery_id}/requeue"),
        Some(&cookie),
        &[("csrf", &csrf), ("source", "stripe"), ("event_id", id)],
    )
    .await;
    assert_eq!(one.status, 303, "{}", one.text());
    let location = one
        .header("Location")
        .expect("back to the event")
        .to_owned();
    let shown = get_page(&app, &location, Some(&cookie)).await.text();
    assert!(shown.contains("The database refused the write"), "{shown}");
    assert!(!shown.contains("did not answer"), "{shown}");
    let all = post_form(
        &app,
        "/console/deliveries/requeue",
        Some(&cookie),
        &[("csrf", &csrf), ("source", "stripe")],
    )
    .await;
    assert_eq!(all.status, 503, "{}", all.text());
    assert!(
        all.text().contains("The database refused") && all.text().contains("permission"),
        "{}",
        all.text()
    );
    assert_eq!(dead_deliveries(&app), 1, "nothing was re-queued");
}

#[actix_web::test]
async fn a_form_posted_with_a_query_is_refused_and_changes_nothing() {
    // The forms ignored a query: `?source=` naming one source re-queued every source's dead
    // deliveries, and `?target=` redelivered to every target (bb61).
    let (_downstream, app, id, delivery_id) = with_one_dead_delivery().await;
    let id = id.as_str();
    let cookie = log_in(&app).await;
    let csrf = csrf_of(&event_page(&app, &cookie, "stripe", id).await.text());
    let requeue_one = format!("/console/deliveries/{delivery_id}/requeue?source=other");
    let posts: [(&str, Vec<(&str, &str)>); 4] = [
        (
            "/console/deliveries/requeue?source=nosuchsource",
            vec![("csrf", &csrf), ("source", "")],
        ),
        (
            &requeue_one,
            vec![("csrf", &csrf), ("source", "stripe"), ("event_id", id)],
        ),
        (
            "/console/events/redeliver?target=default",
            vec![
                ("csrf", &csrf),
                ("source", "stripe"),
                ("event_id", id),
                ("target", ""),
            ],
        ),
        ("/console/logout?next=/", vec![("csrf", &csrf)]),
    ];
    for (path, fields) in &posts {
        let refused = post_form(&app, path, Some(&cookie), fields).await;
        assert_eq!(refused.status, 400, "{path}: {}", refused.text());
        assert!(
            refused.text().contains("not one the console makes"),
            "{path}: {}",
            refused.text()
        );
    }
    assert_eq!(dead_deliveries(&app), 1, "nothing was re-queued");
    assert_eq!(
        event_page(&app, &cookie, "stripe", id).await.status,
        200,
        "still logged in"
    );
}

#[actix_web::test]
async fn a_redeliver_form_with_an_empty_target_is_refused_and_changes_nothing() {
    // The console's forms leave `target` out to redeliver to every target; a hand-made form
    // with `target=` empty was taken as "every target", which the admin API refuses (a
    // black-box run).
    let (_downstream, app, ids) = with_dead_deliveries(1).await;
    let id = ids[0].as_str();
    let cookie = log_in(&app).await;
    let csrf = csrf_of(&event_page(&app, &cookie, "stripe", id).await.text());
    for target in ["", " "] {
        let refused = post_form(
            &app,
            "/console/events/redeliver",
            Some(&cookie),
            &[
                ("csrf", &csrf),
                ("source", "stripe"),
                ("event_id", id),
                ("target", target),
            ],
        )
        .await;
        assert_eq!(refused.status, 400, "{target:?}: {}", refused.text());
        assert!(refused.text().contains("is empty"), "{}", refused.text());
    }
    assert_eq!(dead_deliveries(&app), 1, "nothing was redelivered");
}

#[actix_web::test]
async fn the_dead_filter_re_queues_every_dead_delivery_with_one_button() {
    // After a downstream is mended, its dead deliveries go again from the list, not one event
    // page at a time.
    let (downstream, app, _) = with_dead_deliveries(3).await;
    let cookie = log_in(&app).await;
    let list = get_page(&app, "/console/events?source=stripe&dead=on", Some(&cookie)).await;
    assert_eq!(list.status, 200, "{}", list.text());
    assert!(
        list.text().contains("id=\"requeue-all\""),
        "{}",
        list.text()
    );
    // Not offered where it would do nothing (no dead filter).
    let plain = get_page(&app, "/console/events?source=stripe", Some(&cookie)).await;
    assert!(!plain.text().contains("id=\"requeue-all\""));
    let csrf = csrf_of(&list.text());

    let forged = post_form(
        &app,
        "/console/deliveries/requeue",
        Some(&cookie),
        &[("source", "stripe"), ("csrf", "not-the-token")],
    )
    .await;
    assert_eq!(forged.status, 403);
    assert_eq!(dead_deliveries(&app), 3, "nothing was re-queued");
    // A field the form has not (a misspelt `soruce`, a `target`) is refused, not ignored:
    // ignored, it would widen the requeue.
    for extra in [("soruce", "github"), ("target", "nosuch")] {
        let widened = post_form(
            &app,
            "/console/deliveries/requeue",
            Some(&cookie),
            &[extra, ("csrf", &csrf)],
        )
        .await;
        assert_eq!(widened.status, 400, "{extra:?}: {}", widened.text());
        assert!(widened.text().contains(extra.0), "{}", widened.text());
        assert_eq!(dead_deliveries(&app), 3, "nothing was re-queued");
    }
    // A field given twice is refused too: the first (empty: every source) would be read.
    let twice = post_form(
        &app,
        "/console/deliveries/requeue",
        Some(&cookie),
        &[("source", ""), ("source", "github"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(twice.status, 400, "{}", twice.text());
    assert!(twice.text().contains("given twice"), "{}", twice.text());
    assert_eq!(dead_deliveries(&app), 3, "nothing was re-queued");

    // The downstream is mended; then the button.
    downstream.behave(always(200));
    let done = post_form(
        &app,
        "/console/deliveries/requeue",
        Some(&cookie),
        &[("source", "stripe"), ("csrf", &csrf)],
    )
    .await;
    // Post, redirect, get: a refresh of the page it lands on shows the count again and
    // posts nothing.
    assert_eq!(done.status, 303, "{}", done.text());
    assert_eq!(dead_deliveries(&app), 0, "re-queued");
    let location = done.header("Location").expect("to the list").to_owned();
    assert!(
        location.starts_with("/console/events?source=stripe&dead=1&requeued=3&seal="),
        "{location}"
    );
    for _ in 0..2 {
        let shown = get_page(&app, &location, Some(&cookie)).await;
        assert_eq!(shown.status, 200, "{}", shown.text());
        assert!(
            shown
                .text()
                .contains("3 dead deliveries of source stripe are pending again"),
            "{}",
            shown.text()
        );
    }
    // A count made elsewhere (or the seal of another count) shows nothing.
    let forged = location.replace("requeued=3", "requeued=30");
    let shown = get_page(&app, &forged, Some(&cookie)).await;
    assert_eq!(shown.status, 200, "{}", shown.text());
    assert!(!shown.text().contains("pending again"), "{}", shown.text());
    poll_until("each is delivered again", Duration::from_secs(10), || {
        downstream
            .received()
            .iter()
            .filter(|r| r.status == 200)
            .count()
            == 3
    })
    .await;
}

/// The sums of one source's per-minute bars in the overview's SVG, by outcome.
fn charted(overview: &str, source: &str) -> [u64; 4] {
    let start = overview
        .find(&format!("<svg class=\"chart\" data-source=\"{source}\""))
        .unwrap_or_else(|| panic!("a chart for {source} in {overview}"));
    let svg = &overview[start..start + overview[start..].find("</svg>").expect("the chart ends")];
    let mut sums = [0u64; 4];
    for (i, outcome) in ["processed", "replayed", "rejected", "failed"]
        .iter()
        .enumerate()
    {
        let marker = format!("data-{outcome}=\"");
        sums[i] = svg
            .match_indices(&marker)
            .map(|(at, _)| {
                let rest = &svg[at + marker.len()..];
                rest[..rest.find('"').expect("the value ends")]
                    .parse::<u64>()
                    .expect("a count")
            })
            .sum();
    }
    sums
}

#[actix_web::test]
async fn the_overview_chart_counts_the_deliveries_the_test_made() {
    let app = TestApp::spawn().await;
    for _ in 0..3 {
        let id = unique_id("gh");
        let delivery = app.delivery("github", "{\"zen\":\"hi\"}", &id);
        assert_eq!(app.send(&delivery).await.status, 200);
        assert!(app.send(&delivery).await.replayed());
    }
    let id = unique_id("gh");
    let delivery = app.delivery("github", "{\"zen\":\"again\"}", &id);
    assert_eq!(app.send(&delivery).await.status, 200);
    let forged = delivery
        .clone()
        .with_header("X-Hub-Signature-256", "sha256=00");
    assert_eq!(app.send(&forged).await.status, 401);
    assert_eq!(app.send(&forged).await.status, 401);
    let lost = Delivery {
        source: "nowhere".to_owned(),
        ..delivery.clone()
    };
    assert_eq!(app.send(&lost).await.status, 404);

    let cookie = log_in(&app).await;
    let overview = get_page(&app, "/console", Some(&cookie)).await.text();
    // 4 new events, 3 of them sent twice; 2 forged signatures.
    assert_eq!(charted(&overview, "github"), [4, 3, 2, 0], "{overview}");
    // Summed over the window: the two may fall in different minutes.
    assert!(
        overview.contains("<code>invalid_signature</code> 2"),
        "{overview}"
    );
    assert!(overview.contains("data-outcome=\"processed\" data-total=\"4\""));
    assert_eq!(charted(&overview, "_unknown"), [0, 0, 1, 0]);
    assert!(overview.contains("<code>unknown_source</code> 1"));
    assert!(
        !overview.contains("data-source=\"stripe\""),
        "a quiet source has no chart"
    );
    assert!(overview.contains("<section class=\"card\" id=\"purge\">"));
    assert!(overview.contains("<span id=\"outbox-pending\">0</span> pending"));
}

#[actix_web::test]
async fn the_event_list_filters_and_pages_newest_first() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..52 {
        let id = unique_id("acme");
        let kind = if i % 2 == 0 {
            "even.thing"
        } else {
            "odd.thing"
        };
        let body = format!("{{\"type\":\"{kind}\",\"n\":{i}}}");
        let delivery = app
            .delivery("acme", &body, &id)
            .with_header("X-Acme-Event-Id", &id);
        assert_eq!(app.send(&delivery).await.status, 200, "{i}");
        ids.push(id);
    }
    let gh = unique_id("gh");
    assert_eq!(
        app.send(&app.delivery("github", "{}", &gh)).await.status,
        200
    );
    let cookie = log_in(&app).await;
    let rows = |page: &str| -> Vec<String> {
        page.match_indices("class=\"event-link\" href=\"")
            .map(|(at, _)| {
                let rest = &page[at..];
                let text = &rest[rest.find('>').expect("link text") + 1..];
                text[..text.find('<').expect("link ends")].to_owned()
            })
            .collect()
    };

    let first = get_page(&app, "/console/events?source=acme", Some(&cookie)).await;
    assert_eq!(first.status, 200);
    let first = first.text();
    let newest: Vec<String> = ids.iter().rev().take(50).cloned().collect();
    assert_eq!(rows(&first), newest, "newest first, 50 a page");
    let older_at = first.find("id=\"older\"").expect("a link to older events");
    let href_at = first[..older_at].rfind("href=\"").expect("its href") + 6;
    let href =
        first[href_at..href_at + first[href_at..].find('"').expect("ends")].replace("&amp;", "&");
    let second = get_page(&app, &href, Some(&cookie)).await.text();
    assert_eq!(rows(&second), [ids[1].clone(), ids[0].clone()]);
    assert!(!second.contains("id=\"older\""), "the last page");

    let by_id = get_page(
        &app,
        &format!("/console/events?id={}", ids[7]),
        Some(&cookie),
    )
    .await
    .text();
    assert_eq!(rows(&by_id), [ids[7].clone()]);
    let by_type = get_page(
        &app,
        "/console/events?source=acme&type=odd.thing",
        Some(&cookie),
    )
    .await
    .text();
    assert_eq!(rows(&by_type).len(), 26);
    let everything = get_page(&app, "/console/events?since=1h", Some(&cookie))
        .await
        .text();
    assert_eq!(
        rows(&everything).first(),
        Some(&gh),
        "every source, newest first"
    );
    let future = get_page(
        &app,
        "/console/events?since=2999-01-01T00:00:00Z",
        Some(&cookie),
    )
    .await
    .text();
    assert!(future.contains("No stored event matches."));
    let until_past = get_page(&app, "/console/events?until=2000-01-01", Some(&cookie))
        .await
        .text();
    assert!(rows(&until_past).is_empty());
    let bad = get_page(&app, "/console/events?since=yesterday-ish", Some(&cookie)).await;
    assert_eq!(bad.status, 400);
    assert!(bad
        .text()
        .contains("since: &quot;yesterday-ish&quot; is not a time"));
}

#[actix_web::test]
async fn replays_are_added_to_the_events_row_in_batches() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let delivery = app.delivery("stripe", &stripe_event(&id, "charge.succeeded", 1), &id);
    assert_eq!(app.send(&delivery).await.status, 200);
    for _ in 0..3 {
        assert!(app.send(&delivery).await.replayed());
    }
    let other = unique_id("evt");
    let untouched = app.delivery(
        "stripe",
        &stripe_event(&other, "charge.succeeded", 1),
        &other,
    );
    assert_eq!(app.send(&untouched).await.status, 200);

    poll_until(
        "the three replays are flushed",
        Duration::from_secs(10),
        || {
            app.db
                .count(&format!("events WHERE event_id = '{id}' AND replays = 3"))
                == 1
        },
    )
    .await;
    assert_eq!(
        app.db.count(&format!(
            "events WHERE event_id = '{other}' AND replays = 0"
        )),
        1,
        "an event never replayed counts none"
    );
    let cookie = log_in(&app).await;
    let page = event_page(&app, &cookie, "stripe", &id).await;
    assert!(
        page.text().contains("<dd id=\"replays\">3</dd>"),
        "{}",
        page.text()
    );
}

/// Markup that would run, break out of an element or an attribute, or pass an entity through
/// unescaped if any of it reached a page as HTML.
const HOSTILE: &str = "</td></h1><script>alert(1)</script>\"><img src=x onerror=alert(1)>&amp;";

/// `text` as HTML shows it: `&`, `<`, `>` and `"` as entities.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Stores an event (and a dead delivery of it) with `hostile` in every field the console shows:
/// what intake never lets in (a source outside the config's charset, any header name) as much
/// as what it does (ids, types, header values, bodies). Returns the event's source and id.
fn store_hostile_event(app: &TestApp, source: &str, hostile: &str) -> String {
    let id = format!("{}{hostile}", unique_id("evt"));
    let mut conn = app.db.connect();
    hookbox::on_backend!(&mut conn, c => {
        let row: i64 = diesel::insert_into(events::table)
            .values((
                events::source.eq(&source),
                events::event_id.eq(&id),
                events::event_type.eq(format!("type{hostile}")),
                events::fingerprint.eq(&[0u8][..]),
                events::received_at.eq(chrono::Utc::now()),
                events::payload.eq(format!("body{hostile}").into_bytes()),
                events::headers.eq(serde_json::json!({
                    format!("name{hostile}"): format!("value{hostile}"),
                })),
                events::response_status.eq(200i16),
                events::response_content_type.eq(format!("text/plain; x=\"{hostile}\"")),
                events::response_body.eq(format!("answer{hostile}").into_bytes()),
            ))
            .returning(events::id)
            .get_result(c)
            .expect("store the event");
        diesel::insert_into(deliveries::table)
            .values((
                deliveries::event_row.eq(row),
                deliveries::source.eq(&source),
                deliveries::received_at.eq(chrono::Utc::now()),
                deliveries::queued_at.eq(chrono::Utc::now()),
                deliveries::state.eq("dead"),
                deliveries::attempts.eq(3),
                deliveries::next_attempt_at.eq(chrono::Utc::now()),
                deliveries::last_status.eq(Some(500i16)),
                deliveries::last_error.eq(format!("error{hostile}")),
                deliveries::created_at.eq(chrono::Utc::now()),
            ))
            .execute(c)
            .expect("store its delivery")
    });
    id
}

/// No element, attribute or entity of `hostile` came through as markup.
fn assert_inert(page: &str, what: &str) {
    for markup in ["<script", "<img", "</td></h1>"] {
        assert!(!page.contains(markup), "{markup} in {what}:\n{page}");
    }
}

#[actix_web::test]
async fn an_event_page_hides_signatures_and_stays_small_for_a_body_nested_thousands_deep() {
    let app = TestApp::spawn().await;
    let cookie = log_in(&app).await;
    // GitHub signs no timestamp: the body and its signature would post the event again.
    let id = unique_id("dlv");
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let delivery = app.delivery("github", &deep, &id);
    let signature = delivery
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("x-hub-signature-256"))
        .map(|(_, value)| value.clone())
        .expect("a signature header");
    assert_eq!(app.send(&delivery).await.status, 200);

    let page = event_page(&app, &cookie, "github", &id).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let text = page.text();
    assert!(
        !text.contains(&signature),
        "the whole signature is on the page"
    );
    assert!(text.contains(&signature[..8]), "its start is: {text}");
    assert!(text.contains("signature hidden"), "and says so");
    assert!(
        text.len() < 3 * deep.len() + 128 * 1024,
        "{} bytes for a body of {}",
        text.len(),
        deep.len()
    );
    assert!(text.contains("nested too deep to re-indent"), "says why");

    // The admin API (and so export and replay) keep it whole.
    let stored = app
        .get(&format!("/admin/events/github/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert!(stored.text().contains(&signature), "{}", stored.text());
}

#[actix_web::test]
async fn a_hostile_value_in_every_shown_field_comes_out_escaped() {
    // `stripe` forwards to `default`, the target of the delivery stored with each event.
    let app = TestApp::spawn_with(
        &forward_extra("http://127.0.0.1:9/hooks", "1s", 3),
        Handlers::default(),
    )
    .await;
    let source = format!("src{HOSTILE}");
    let id = store_hostile_event(&app, &source, HOSTILE);
    let cookie = log_in(&app).await;
    let shown = escaped(HOSTILE);

    let page = event_page(&app, &cookie, &form_encode(&source), &id).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let page = page.text();
    assert_inert(&page, "the event page");
    for expected in [
        format!("<h1 id=\"event-id\">{}</h1>", escaped(&id)),
        format!("<title>{} · hookbox</title>", escaped(&id)),
        format!("<dd>src{shown}</dd>"),
        format!("<dd id=\"event-type\">type{shown}</dd>"),
        format!("<th><code>name{shown}</code></th><td><code>value{shown}</code></td>"),
        format!("<pre id=\"payload\">body{shown}</pre>"),
        format!("<code>text/plain; x=&quot;{shown}&quot;</code>"),
        format!("<pre id=\"response\">answer{shown}</pre>"),
        format!("<td>error{shown}</td>"),
        format!("Other events from src{shown}</a>"),
        // No source of that name is configured, so no target either: no form.
        "target not configured".to_owned(),
    ] {
        assert!(page.contains(&expected), "{expected} in:\n{page}");
    }
    // The forms a configured target's delivery gets carry the id escaped.
    let forwarded = store_hostile_event(&app, "stripe", HOSTILE);
    let page = event_page(&app, &cookie, "stripe", &forwarded).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let page = page.text();
    assert_inert(&page, "a configured source's event page");
    for expected in [
        "id=\"requeue-".to_owned(),
        format!("name=\"event_id\" value=\"{}\"", escaped(&forwarded)),
    ] {
        assert!(page.contains(&expected), "{expected} in:\n{page}");
    }

    let path = format!(
        "/console/events?source={}&type={}&id={}",
        form_encode(&source),
        form_encode(&format!("type{HOSTILE}")),
        form_encode(&id)
    );
    let list = get_page(&app, &path, Some(&cookie)).await;
    assert_eq!(list.status, 200, "{}", list.text());
    let list = list.text();
    assert_inert(&list, "the event list");
    for expected in [
        format!("<option selected>src{shown}</option>"),
        format!("value=\"type{shown}\""),
        format!("value=\"{}\"", escaped(&id)),
        format!("<td>src{shown}</td>"),
        format!("\">{}</a>", escaped(&id)),
        format!("<td>type{shown}</td>"),
    ] {
        assert!(list.contains(&expected), "{expected} in:\n{list}");
    }

    let refused = get_page(
        &app,
        &format!("/console/events?since={}", form_encode(HOSTILE)),
        Some(&cookie),
    )
    .await;
    assert_eq!(refused.status, 400);
    assert_inert(&refused.text(), "a refused filter");
    assert!(refused
        .text()
        .contains(&format!("value=\"{shown}\" placeholder")));

    let missing = event_page(&app, &cookie, &form_encode(&source), "absent").await;
    assert_eq!(missing.status, 404);
    assert_inert(&missing.text(), "the missing event's page");
    assert!(
        missing.text().contains("src&lt;/td&gt;"),
        "{}",
        missing.text()
    );
}

#[actix_web::test]
async fn the_event_page_shows_deliveries_per_target_and_redelivers_the_event() {
    use crate::targets::{send_event, settled, target};
    let (a, b) = (
        Downstream::start(always(200)),
        Downstream::start(always(200)),
    );
    let app = TestApp::spawn_with(
        &format!("{}{}", target("a", &a.url, None), target("b", &b.url, None)),
        Handlers::default(),
    )
    .await;
    let id = send_event(&app, "charge.refunded").await;
    let key = format!("stripe:{id}");
    settled(&app, &[&id], "delivered").await;

    let cookie = log_in(&app).await;
    let page = event_page(&app, &cookie, "stripe", &id).await.text();
    for shown in [
        "<td class=\"target\">a</td>",
        "<td class=\"target\">b</td>",
        "id=\"redeliver-to-a\"",
        "id=\"redeliver-to-b\"",
        "id=\"redeliver-all\"",
    ] {
        assert!(page.contains(shown), "{shown} in {page}");
    }
    let csrf = csrf_of(&page);
    let path = "/console/events/redeliver";
    let back = [("source", "stripe"), ("event_id", id.as_str())];
    let refused = post_form(&app, path, Some(&cookie), &back).await;
    assert_eq!(refused.status, 403, "no CSRF token");
    assert_eq!(a.for_key(&key).len(), 1, "nothing was re-queued");

    let mut every = back.to_vec();
    every.push(("csrf", &csrf));
    let accepted = post_form(&app, path, Some(&cookie), &every).await;
    assert_eq!(accepted.status, 303);
    let location = accepted.header("Location").expect("back").to_owned();
    assert!(
        location.contains("notice=redelivered") && location.contains("count=2"),
        "{location}"
    );
    settled(&app, &[&id], "delivered").await;
    assert_eq!((a.for_key(&key).len(), b.for_key(&key).len()), (2, 2));
    let shown = get_page(&app, &location, Some(&cookie)).await.text();
    assert!(shown.contains("2 deliveries are re-queued"), "{shown}");
    // The outcome is sealed by the session: a link made elsewhere, or this one changed, shows
    // none.
    for forged in [
        location.replace("count=2", "count=99999"),
        location
            .split("&seal=")
            .next()
            .expect("an address")
            .to_owned(),
    ] {
        let shown = get_page(&app, &forged, Some(&cookie)).await;
        assert_eq!(shown.status, 200, "{forged}");
        assert!(
            !shown.text().contains("re-queued"),
            "{forged}: {}",
            shown.text()
        );
    }

    let mut one = every.clone();
    one.push(("target", "a"));
    let accepted = post_form(&app, path, Some(&cookie), &one).await;
    let location = accepted.header("Location").expect("back").to_owned();
    assert!(location.contains("count=1"), "{location}");
    settled(&app, &[&id], "delivered").await;
    assert_eq!((a.for_key(&key).len(), b.for_key(&key).len()), (3, 2));
    assert!(a
        .for_key(&key)
        .iter()
        .all(|r| r.header("idempotency-key") == key));
}

/// An event no target's patterns match was said to come from a source that "does not
/// forward"; a delivery to a target removed from the config showed buttons that could only be
/// refused (a black-box run).
#[actix_web::test]
async fn the_event_page_says_why_nothing_was_queued_and_offers_nothing_for_a_removed_target() {
    use crate::targets::{send_event, target};
    let sink = Downstream::start(always(200));
    let app = TestApp::spawn_with(
        &target("a", &sink.url, Some("[\"charge.*\"]")),
        Handlers::default(),
    )
    .await;
    let cookie = log_in(&app).await;
    let unmatched = send_event(&app, "invoice.paid").await;
    let page = event_page(&app, &cookie, "stripe", &unmatched).await.text();
    assert!(
        page.contains("no target of this source takes events of this type")
            && !page.contains("does not forward"),
        "{page}"
    );

    // Stored before the source forwarded (no delivery), of a type its target takes.
    let before = unique_id("evt_before");
    insert_events(
        &app.db.url,
        &[RawEvent {
            source: "stripe".to_owned(),
            event_id: before.clone(),
            received_at: chrono::Utc::now(),
            payload: b"{}".to_vec(),
        }],
    );
    diesel::sql_query(format!(
        "UPDATE events SET event_type = 'charge.captured' WHERE event_id = '{before}'"
    ))
    .execute(&mut app.db.connect())
    .expect("its type");
    let page = event_page(&app, &cookie, "stripe", &before).await.text();
    assert!(
        page.contains("stored before this source forwarded events of its type")
            && !page.contains("no target of this source takes"),
        "{page}"
    );

    let id = send_event(&app, "charge.refunded").await;
    crate::targets::settled(&app, &[&id], "delivered").await;
    crate::targets::dead_to_a_removed_target(&app, &id);
    let page = event_page(&app, &cookie, "stripe", &id).await.text();
    assert!(
        page.contains("<td class=\"target\">gone</td>")
            && page.contains("target not configured")
            && page.contains("id=\"redeliver-to-a\"")
            && !page.contains("id=\"redeliver-to-gone\"")
            && !page.contains("class=\"requeue\""),
        "{page}"
    );
}

#[actix_web::test]
async fn an_id_with_a_bidi_override_is_shown_with_it_escaped_not_reversed() {
    // GitHub's delivery id is not signed: a captured delivery re-posted under
    // `evt_ab_\u{202e}4321` would read as `evt_ab_1234` were the override rendered.
    let app = TestApp::spawn().await;
    let id = "evt_ab_\u{202e}4321";
    let body = "{\"zen\":\"bi\u{200b}di\"}";
    send_github_as(&app, id, body).await;

    let cookie = log_in(&app).await;
    let list = get_page(&app, "/console/events", Some(&cookie))
        .await
        .text();
    assert!(list.contains(r"evt_ab_\u{202e}4321"), "{list}");
    assert!(!list.contains('\u{202e}'), "the override reached the page");
    let page = get_page(
        &app,
        &format!(
            "/console/event?source=github&id={}",
            form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
        ),
        Some(&cookie),
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.text());
    // The tab's title too.
    assert!(
        page.text()
            .contains(r"<title>evt_ab_\u{202e}4321 · hookbox</title>"),
        "{}",
        page.text()
    );
    // Its heading shows the escape (the redeliver form keeps the id itself, to post it back).
    assert!(
        page.text()
            .contains(r#"id="event-id">evt_ab_\u{202e}4321<"#),
        "{}",
        page.text()
    );
    // So do the kept headers (the delivery id is one) and the payload.
    assert!(
        page.text().contains(r"<code>evt_ab_\u{202e}4321</code>"),
        "{}",
        page.text()
    );
    assert!(page.text().contains(r"bi\u{200b}di"), "{}", page.text());
    assert!(!page.text().contains('\u{200b}'), "{}", page.text());
}

#[actix_web::test]
async fn a_form_past_the_body_limit_is_refused_with_the_consoles_headers() {
    // The HTTP library's own 413 for a body past its limit: no console code builds it, and it
    // still carries every console header.
    let app = TestApp::spawn().await;
    let huge = "x".repeat(3 * 1024 * 1024);
    let answer = post_form(&app, "/console/login", None, &[("token", &huge)]).await;
    assert_eq!(answer.status, 413, "{}", answer.text());
    assert_eq!(answer.header("Content-Security-Policy"), Some(CSP));
    assert_eq!(answer.header("Cache-Control"), Some("no-store"));
    assert_eq!(answer.header("X-Frame-Options"), Some("DENY"));
}

/// A redeliver the database does not answer within the request timeout (its rows held by
/// another session here) may still be made once it does: the page says so, and to check before
/// trying again, not that nothing was re-queued (a black-box run: the banner said nothing was,
/// both targets then got the event, and a second click would have sent it twice).
#[actix_web::test]
async fn a_redeliver_left_unanswered_in_time_says_it_may_still_be_made() {
    if skip_on_sqlite(
        "a_redeliver_left_unanswered_in_time_says_it_may_still_be_made",
        "an SQLite write waits for the write lock, not for rows",
    ) {
        return;
    }
    let downstream = Downstream::start(always(410));
    let db = TestDb::create();
    let text = with_server_keys(
        &config_text(&db.url, &forward_extra(&downstream.url, "5s", 3)),
        "request_timeout = \"2s\"",
    );
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    let id = unique_id("evt");
    let sent = app
        .send(&app.delivery("stripe", &stripe_event(&id, "charge.failed", 1), &id))
        .await;
    assert_eq!(sent.status, 200);
    poll_until("the 410 dead-letters it", Duration::from_secs(10), || {
        dead_deliveries(&app) == 1
    })
    .await;
    let cookie = log_in(&app).await;
    let csrf = csrf_of(&event_page(&app, &cookie, "stripe", &id).await.text());

    // Another session holds the event's delivery row for longer than the request timeout.
    let (held, holding) = std::sync::mpsc::channel();
    let url = app.db.url.clone();
    let holder = std::thread::spawn(move || {
        let mut conn = diesel::PgConnection::establish(&url).expect("connect");
        conn.transaction(|conn| {
            diesel::sql_query("SELECT id FROM deliveries FOR UPDATE").execute(conn)?;
            held.send(()).expect("the test waits");
            std::thread::sleep(Duration::from_secs(4));
            Ok::<_, diesel::result::Error>(())
        })
        .expect("the holder's transaction");
    });
    holding.recv().expect("the row is held");
    let accepted = post_form(
        &app,
        "/console/events/redeliver",
        Some(&cookie),
        &[("source", "stripe"), ("event_id", &id), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(accepted.status, 303, "{}", accepted.text());
    let location = accepted.header("Location").expect("back").to_owned();
    let shown = get_page(&app, &location, Some(&cookie)).await.text();
    assert!(
        shown.contains("the re-queue may still be made")
            && !shown.contains("nothing was re-queued"),
        "{shown}"
    );
    actix_web::rt::task::spawn_blocking(move || holder.join().expect("the holder"))
        .await
        .expect("joined");
}
