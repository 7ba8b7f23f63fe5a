//! The admin API: off without a token, 401 on a wrong one, the stored events with the right one.

use hookbox::Handlers;

use crate::helpers::*;

/// A server with no `[admin]` table: the admin API and the console are off.
pub async fn spawn_without_admin_token() -> TestApp {
    let db = TestDb::create();
    let text = config_text(&db.url, "").replace("[admin]\ntoken_env = \"TEST_ADMIN_TOKEN\"\n", "");
    TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await
}

#[actix_web::test]
async fn the_admin_api_is_404_while_no_token_is_configured() {
    let app = spawn_without_admin_token().await;
    for token in [None, Some(ADMIN_TOKEN), Some("")] {
        let answer = app.get("/admin/events", token).await;
        assert_eq!(answer.status, 404, "{token:?}");
    }
}

#[actix_web::test]
async fn a_token_env_naming_an_unset_variable_leaves_the_admin_api_off_with_a_warning() {
    // The contract: "the admin API is off (404) unless this names a set variable".
    let db = TestDb::create();
    let text = config_text(&db.url, "").replace("TEST_ADMIN_TOKEN", "HOOKBOX_TEST_TOKEN_NOT_SET");
    let server = Process::serve(&text);
    for (path, token) in [
        ("/admin/events", None),
        ("/admin/events", Some(ADMIN_TOKEN)),
        ("/console", None),
    ] {
        let answer = get(&server.address, path, token).await;
        assert_eq!(answer.status, 404, "{path} {token:?}: {}", answer.text());
    }
    let log = server.log();
    let warning = log
        .lines()
        .find(|line| line.contains("WARN") && line.contains("admin.token_env"))
        .unwrap_or_else(|| panic!("a WARN naming admin.token_env:\n{log}"));
    assert!(
        warning.contains("HOOKBOX_TEST_TOKEN_NOT_SET") && warning.contains("off"),
        "{warning}"
    );
}

#[actix_web::test]
async fn a_wrong_or_missing_token_is_401_without_a_hint() {
    let app = TestApp::spawn().await;
    let near_miss = &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1];
    let longer = format!("{ADMIN_TOKEN}0");
    let shouted = ADMIN_TOKEN.to_uppercase();
    let mut bodies = Vec::new();
    for token in [
        None,
        Some("nope"),
        Some(near_miss),
        Some(""),
        Some(&longer),
        Some(&shouted),
    ] {
        let answer = app.get("/admin/events", token).await;
        assert_eq!(
            (answer.status, answer.error().as_str()),
            (401, "unauthorized"),
            "{token:?}"
        );
        assert!(!answer.text().contains(ADMIN_TOKEN));
        assert_eq!(answer.header("WWW-Authenticate"), Some("Bearer"));
        bodies.push(answer.body);
    }
    // However near the guess, the answer is the same: nothing tells a closer guess apart.
    assert!(
        bodies.windows(2).all(|pair| pair[0] == pair[1]),
        "{bodies:?}"
    );
    let id = unique_id("evt");
    let answer = app
        .get(&format!("/admin/events/stripe/{id}"), Some("nope"))
        .await;
    assert_eq!(answer.status, 401);
}

#[actix_web::test]
async fn wrong_tokens_are_answered_ten_a_second_at_most_and_the_right_one_at_once() {
    // A black-box review had 300 wrong tokens answered in a second: a guesser's pace.
    let app = TestApp::spawn().await;
    let started = std::time::Instant::now();
    let wrong = (0..10).map(|i| {
        let app = &app;
        async move {
            let answer = app.get("/admin/events", Some(&format!("guess-{i}"))).await;
            (answer.status, started.elapsed())
        }
    });
    let right = async {
        let answer = app.get("/admin/events", Some(ADMIN_TOKEN)).await;
        (answer.status, started.elapsed())
    };
    let (wrong, right) =
        futures_util::future::join(futures_util::future::join_all(wrong), right).await;
    assert!(wrong.iter().all(|(status, _)| *status == 401), "{wrong:?}");
    let last = wrong.iter().map(|(_, at)| *at).max().expect("ten");
    // Ten turns, each a tenth of a second after the one before: the first at once.
    assert!(last >= std::time::Duration::from_millis(900), "{wrong:?}");
    assert_eq!(right.0, 200);
    assert!(
        right.1 < last,
        "the right token waited for no wrong one: {right:?} {wrong:?}"
    );
}

#[actix_web::test]
async fn the_bearer_scheme_is_read_in_any_case_and_other_schemes_are_401() {
    let app = TestApp::spawn().await;
    let cases = [
        (format!("Bearer {ADMIN_TOKEN}"), 200),
        (format!("bearer {ADMIN_TOKEN}"), 200),
        (format!("BEARER  {ADMIN_TOKEN}"), 200),
        (format!("Basic {ADMIN_TOKEN}"), 401),
        (format!("Bearer{ADMIN_TOKEN}"), 401),
        (ADMIN_TOKEN.to_owned(), 401),
        (format!("Bearer x{ADMIN_TOKEN}"), 401),
    ];
    for (value, status) in cases {
        let answer = awc::Client::new()
            .get(format!("{}/admin/events", app.address))
            .insert_header(("Authorization", value.as_str()))
            .send()
            .await
            .expect("the server answers");
        assert_eq!(answer.status().as_u16(), status, "{value:?}");
    }
}

/// `Authorization` is a field that holds one value (RFC 9110 11.6.2): a request with two is
/// refused whichever of them holds the token, so no proxy in front that reads the other one
/// disagrees with hookbox about who the caller is.
#[actix_web::test]
async fn a_request_with_two_authorization_headers_is_401_whichever_holds_the_token() {
    let app = TestApp::spawn().await;
    let good = format!("Bearer {ADMIN_TOKEN}");
    for pair in [
        ["Bearer nope", good.as_str()],
        [good.as_str(), "Bearer nope"],
        [good.as_str(), good.as_str()],
    ] {
        let answer = awc::Client::new()
            .get(format!("{}/admin/events", app.address))
            .append_header(("Authorization", pair[0]))
            .append_header(("Authorization", pair[1]))
            .send()
            .await
            .expect("the server answers");
        assert_eq!(answer.status().as_u16(), 401, "{pair:?}");
    }
}

#[actix_web::test]
async fn the_admin_api_lists_events_newest_first_and_shows_one_whole() {
    let app = TestApp::spawn().await;
    let ids: Vec<String> = (0..3).map(|_| unique_id("evt")).collect();
    for id in &ids {
        let answer = app
            .send(&app.delivery("stripe", &stripe_event(id, "charge.succeeded", 1), id))
            .await;
        assert_eq!(answer.status, 200);
    }
    let gh = unique_id("gh");
    assert_eq!(
        app.send(&app.delivery("github", "{\"zen\":\"hi\"}", &gh))
            .await
            .status,
        200
    );

    let all = app
        .get("/admin/events?source=stripe", Some(ADMIN_TOKEN))
        .await
        .json();
    let listed: Vec<&str> = all["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["event_id"].as_str().expect("id"))
        .collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    assert_eq!(listed, newest_first);

    let limited = app
        .get("/admin/events?limit=1", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(limited["events"].as_array().expect("events").len(), 1);
    assert_eq!(limited["events"][0]["event_id"], gh.as_str());

    let since_future = app
        .get(
            "/admin/events?since=2999-01-01T00:00:00Z",
            Some(ADMIN_TOKEN),
        )
        .await
        .json();
    assert_eq!(since_future["events"].as_array().expect("events").len(), 0);
    let since_hour = app
        .get("/admin/events?since=1h", Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(since_hour["events"].as_array().expect("events").len(), 4);
    // Empty values, as the route is written (`?source=&since=&limit=`), are no filter.
    let unfiltered = app
        .get("/admin/events?source=&since=&limit=", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(unfiltered.status, 200, "{}", unfiltered.text());
    assert_eq!(
        unfiltered.json()["events"]
            .as_array()
            .expect("events")
            .len(),
        4
    );
    // A parameter the list does not take is refused, not ignored (the list would look
    // filtered and not be); the token is still checked first.
    let until = app
        .get(
            "/admin/events?until=2020-01-01T00:00:00Z",
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(
        (until.status, until.error().as_str()),
        (400, "invalid_query")
    );
    assert!(until.text().contains("until"), "{}", until.text());
    let anonymous = app.get("/admin/events?until=2020-01-01", None).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());
    for query in [
        "since=yesterday-ish",
        "before=yesterday",
        // Hand-made cursors of years no store holds (PostgreSQL would fail the query).
        "before=-210866803200000001.1",
        "before=253402300800000000.1",
        "limit=lots",
        "limit=0",
        "limit=1001",
        "soruce=github",
    ] {
        let bad = app
            .get(&format!("/admin/events?{query}"), Some(ADMIN_TOKEN))
            .await;
        assert_eq!(
            (bad.status, bad.error().as_str()),
            (400, "invalid_query"),
            "{query}"
        );
    }

    // The one event's reads take no parameter: one given would look applied and not be.
    for path in [
        format!("/admin/events/github/{gh}?target=nosuch"),
        format!("/admin/events/github/{gh}/deliveries?state=dead"),
    ] {
        let bad = app.get(&path, Some(ADMIN_TOKEN)).await;
        assert_eq!(
            (bad.status, bad.error().as_str()),
            (400, "invalid_query"),
            "{path}: {}",
            bad.text()
        );
        assert_eq!(
            app.get(&path, None).await.status,
            401,
            "{path}: the token first"
        );
    }

    let one = app
        .get(&format!("/admin/events/github/{gh}"), Some(ADMIN_TOKEN))
        .await
        .json();
    assert_eq!(one["payload"], "{\"zen\":\"hi\"}");
    assert_eq!(one["event_type"], "test.event");
    assert!(one["headers"]["x-hub-signature-256"]
        .as_str()
        .is_some_and(|s| s.starts_with("sha256=")));
    assert!(one["headers"]["x-github-delivery"] == gh.as_str());
    assert_eq!(one["status"], 200);
    assert!(one["received_at"].as_str().is_some());

    let missing = app
        .get("/admin/events/github/nope", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        (missing.status, missing.error().as_str()),
        (404, "not_found")
    );
    // It says what is not there, not just "nothing is here".
    let message = missing.message();
    assert!(
        message.contains("\"nope\"") && message.contains("\"github\""),
        "{message}"
    );
}

#[actix_web::test]
async fn the_admin_list_pages_past_its_limit_with_next_before() {
    // A list of more events than one page holds is read whole, page by page, each event
    // once, newest first: beyond the newest 1000 too.
    let app = TestApp::spawn().await;
    let ids: Vec<String> = (0..5).map(|_| unique_id("evt")).collect();
    for id in &ids {
        let delivery = app.delivery("stripe", &stripe_event(id, "charge.succeeded", 1), id);
        assert_eq!(app.send(&delivery).await.status, 200);
    }
    let mut listed = Vec::new();
    let mut query = "/admin/events?source=stripe&limit=2".to_owned();
    let mut pages = 0;
    loop {
        let page = app.get(&query, Some(ADMIN_TOKEN)).await;
        assert_eq!(page.status, 200, "{}", page.text());
        let page = page.json();
        pages += 1;
        for event in page["events"].as_array().expect("events") {
            listed.push(event["event_id"].as_str().expect("an id").to_owned());
        }
        match page["next_before"].as_str() {
            Some(next) => query = format!("/admin/events?source=stripe&limit=2&before={next}"),
            None => {
                assert!(page["next_before"].is_null(), "{page}");
                break;
            }
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);
    assert_eq!(pages, 3);
    // A page that is exactly the rest says it is the last.
    let whole = app
        .get("/admin/events?source=stripe&limit=5", Some(ADMIN_TOKEN))
        .await
        .json();
    assert!(whole["next_before"].is_null(), "{whole}");
}

/// `POST {path}` to the admin API with `token` and, when given, a body of `content_type`.
async fn post_with(
    app: &TestApp,
    path: &str,
    token: Option<&str>,
    body: Option<(&str, &str)>,
) -> Answer {
    let mut request = client().post(format!("{}{path}", app.address));
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    let sent = match body {
        Some((content_type, body)) => {
            request
                .insert_header(("Content-Type", content_type))
                .send_body(body.to_owned())
                .await
        }
        None => request.send().await,
    };
    read(sent.expect("the admin API answers")).await
}

#[actix_web::test]
async fn an_admin_post_with_a_body_does_nothing_and_admin_answers_are_never_cached() {
    let app = TestApp::spawn().await;
    // Filters sent in a body would be ignored, and a bulk requeue would widen to every dead
    // delivery: refused, whatever the route, once the token is shown.
    let bodies = [
        (
            "application/json",
            r#"{"source":"nosuch","target":"nosuch"}"#,
        ),
        ("application/x-www-form-urlencoded", "target=nosuch"),
    ];
    for path in [
        "/admin/deliveries/requeue",
        "/admin/deliveries/1/requeue",
        "/admin/events/github/nope/redeliver",
    ] {
        for body in bodies {
            let answer = post_with(&app, path, Some(ADMIN_TOKEN), Some(body)).await;
            assert_eq!(
                (answer.status, answer.error().as_str()),
                (400, "invalid_query"),
                "{path} {body:?}: {}",
                answer.text()
            );
            assert!(
                answer.message().contains("query string"),
                "{}",
                answer.text()
            );
            let anonymous = post_with(&app, path, None, Some(body)).await;
            assert_eq!(anonymous.status, 401, "{path}: the token first");
        }
    }
    let plain = post_with(
        &app,
        "/admin/deliveries/requeue?source=nosuch",
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(plain.status, 202, "{}", plain.text());
    assert_eq!(plain.json(), serde_json::json!({"requeued": 0}));

    // Sent chunked, a body is refused as well; an empty chunked body (no chunk at all) is
    // no body, and is served.
    for (chunks, status) in [(vec!["target=nosuch"], 400), (vec![], 202)] {
        let stream = futures_util::stream::iter(chunks.into_iter().map(|chunk| {
            Ok::<_, std::io::Error>(actix_web::web::Bytes::from_static(chunk.as_bytes()))
        }));
        let sent = client()
            .post(format!(
                "{}/admin/deliveries/requeue?source=nosuch",
                app.address
            ))
            .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
            .send_stream(stream)
            .await
            .expect("the admin API answers");
        let answer = read(sent).await;
        assert_eq!(answer.status, status, "{}", answer.text());
    }

    // Answers hold payloads and kept signatures: no cache keeps them, refusals included.
    for (path, token) in [
        ("/admin/events", Some(ADMIN_TOKEN)),
        ("/admin/events/github/nope", Some(ADMIN_TOKEN)),
        ("/admin/events", None),
        ("/admin/nosuch", Some(ADMIN_TOKEN)),
        ("/admin", None),
    ] {
        let answer = app.get(path, token).await;
        assert_eq!(answer.header("Cache-Control"), Some("no-store"), "{path}");
        assert_eq!(
            answer.header("X-Content-Type-Options"),
            Some("nosniff"),
            "{path}"
        );
    }
    assert_eq!(plain.header("Cache-Control"), Some("no-store"));
}

#[actix_web::test]
async fn an_admin_write_held_up_by_another_process_s_write_lock_says_the_store_is_busy() {
    use diesel::connection::SimpleConnection;
    if !store_is_sqlite() {
        return;
    }
    let app = TestApp::spawn().await;
    // Another process (a tool, another serve) holds the file's write lock past the wait.
    let mut holder = app.db.connect();
    holder
        .batch_execute("BEGIN IMMEDIATE")
        .expect("the write lock");
    let (status, body) = admin_post(&app.address, "/admin/deliveries/requeue").await;
    holder.batch_execute("ROLLBACK").expect("let go");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "unavailable");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("busy with another write") && !message.contains("unreachable"),
        "{message}"
    );
    let (status, body) = admin_post(&app.address, "/admin/deliveries/requeue").await;
    assert_eq!((status, &body), (202, &serde_json::json!({"requeued": 0})));
}
