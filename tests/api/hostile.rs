//! Hostile requests, sent as raw bytes: each gets its expected status and error code, and none
//! gets a 5xx. Answers the HTTP layer gives before a route is reached (a malformed request,
//! headers too big) carry no contract JSON; the table says so with `None`.

use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use hookbox::Handlers;

use crate::helpers::*;
use crate::raw;

/// One row: what is sent, and the status and error code it must get.
struct Case {
    name: &'static str,
    request: Vec<u8>,
    status: u16,
    error: Option<&'static str>,
}

/// The headers of a genuine delivery, as raw bytes.
fn signed(app: &TestApp, source: &str, body: &[u8], id: &str) -> Vec<(String, Vec<u8>)> {
    delivery_of_bytes(&app.config, source, body, id, unix_now())
        .headers
        .into_iter()
        .map(|(n, v)| (n, v.into_bytes()))
        .collect()
}

fn post(source: &str, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    let pairs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    raw::request("POST", &format!("/webhooks/{source}"), &pairs, body)
}

/// `headers` with `name` set to `value` (replacing it) or added again (`repeat`).
fn with(
    headers: &[(String, Vec<u8>)],
    name: &str,
    value: &[u8],
    repeat: bool,
) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = headers
        .iter()
        .filter(|(n, _)| repeat || !n.eq_ignore_ascii_case(name))
        .cloned()
        .collect();
    out.push((name.to_owned(), value.to_vec()));
    out
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A chunked request: the head, then `body` in chunks of `chunk` bytes.
fn chunked(source: &str, headers: &[(String, Vec<u8>)], body: &[u8], chunk: usize) -> Vec<u8> {
    let mut head = with(headers, "Transfer-Encoding", b"chunked", false);
    head.retain(|(n, _)| !n.eq_ignore_ascii_case("content-length"));
    let mut out = post(source, &head, b"");
    for part in body.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

fn stripe_mac(timestamp: &str, body: &[u8]) -> String {
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(b"whsec_test_secret").expect("any key");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn cases(app: &TestApp) -> Vec<Case> {
    let case = |name, request, status, error| Case {
        name,
        request,
        status,
        error,
    };
    let github_body = br#"{"action":"opened"}"#;
    let github = |id: &str| signed(app, "github", github_body, id);
    let stripe_body = |id: &str| stripe_event(id, "payment_intent.succeeded", 1).into_bytes();
    let stripe = |body: &[u8]| signed(app, "stripe", body, "");
    let not_utf8 = b"\xff\xfe\x00{\"id\":\"\xc3\x28\"}".to_vec();
    let sql_id = "evt_'; DROP TABLE events; --";
    let sql_body = stripe_body(sql_id);
    let deep_stripe = format!(
        r#"{{"id":"{}","type":"a","deep":{}}}"#,
        unique_id("evt"),
        nested(5000)
    );
    let shallow_stripe = format!(
        r#"{{"id":"{}","type":"a","deep":{}}}"#,
        unique_id("evt"),
        nested(100)
    );
    let huge_t = "9".repeat(30);
    let huge_t_body = stripe_body(&unique_id("evt"));
    let admin = |query: &str| {
        raw::request(
            "GET",
            &format!("/admin/events?{query}"),
            &[("Authorization", format!("Bearer {ADMIN_TOKEN}").as_bytes())],
            b"",
        )
    };
    let big_body = vec![b'x'; 80 * 1024];
    let fits = stripe_body(&unique_id("evt"));

    vec![
        // Headers too big, too many, repeated.
        case(
            "a 40 KiB header beside a genuine delivery",
            post(
                "github",
                &with(
                    &github(&unique_id("gh")),
                    "X-Padding",
                    &vec![b'a'; 40 * 1024],
                    false,
                ),
                github_body,
            ),
            200,
            None,
        ),
        case(
            "a 40 KiB signature header",
            post(
                "stripe",
                &with(
                    &stripe(&fits),
                    "Stripe-Signature",
                    &vec![b'v'; 40 * 1024],
                    false,
                ),
                &fits,
            ),
            401,
            Some("invalid_signature"),
        ),
        case(
            "headers of 160 KiB in all",
            post(
                "github",
                &(0..10)
                    .map(|i| (format!("X-Padding-{i}"), vec![b'a'; 16 * 1024]))
                    .collect::<Vec<_>>(),
                github_body,
            ),
            431,
            None,
        ),
        case(
            "three thousand headers",
            post(
                "github",
                &(0..3000)
                    .map(|i| (format!("X-H{i}"), b"v".to_vec()))
                    .collect::<Vec<_>>(),
                github_body,
            ),
            431,
            None,
        ),
        case(
            "the signature header twice, the bogus one first",
            post(
                "stripe",
                &with(
                    &with(&[], "Stripe-Signature", b"t=1,v1=00", false),
                    "Stripe-Signature",
                    &stripe(&fits)[0].1,
                    true,
                ),
                &fits,
            ),
            401,
            Some("invalid_signature"),
        ),
        case(
            "the signature header twice, the genuine one first",
            post(
                "stripe",
                &with(&stripe(&fits), "Stripe-Signature", b"t=1,v1=00", true),
                &fits,
            ),
            401,
            Some("invalid_signature"),
        ),
        case(
            "the event id header twice",
            post(
                "github",
                &with(
                    &github(&unique_id("gh")),
                    "X-GitHub-Delivery",
                    b"another-id",
                    true,
                ),
                github_body,
            ),
            400,
            Some("missing_event_id"),
        ),
        // Bytes that are not UTF-8.
        case(
            "a signed body that is not UTF-8, id in a header",
            post(
                "github",
                &signed(app, "github", &not_utf8, &unique_id("gh")),
                &not_utf8,
            ),
            200,
            None,
        ),
        case(
            "a signed body that is not UTF-8 where the scheme needs JSON",
            post("stripe", &stripe(&not_utf8), &not_utf8),
            400,
            Some("malformed_payload"),
        ),
        case(
            "a signature header that is not UTF-8",
            post(
                "stripe",
                &with(
                    &stripe(&fits),
                    "Stripe-Signature",
                    b"t=\xff\xfe,v1=\xc3\x28",
                    false,
                ),
                &fits,
            ),
            401,
            Some("invalid_signature"),
        ),
        case(
            "an event id header that is not UTF-8",
            post(
                "github",
                &with(&github("x"), "X-GitHub-Delivery", b"evt_\xff\xfe", false),
                github_body,
            ),
            400,
            Some("invalid_event_id"),
        ),
        case(
            "an event id header in Latin-1",
            post(
                "github",
                &with(&github("x"), "X-GitHub-Delivery", b"caf\xe9", false),
                github_body,
            ),
            400,
            Some("invalid_event_id"),
        ),
        case(
            "a header name that is not a token",
            post(
                "github",
                &with(&github(&unique_id("gh")), "X-B\u{e4}d Name", b"v", false),
                github_body,
            ),
            400,
            None,
        ),
        // Bodies past the limit, and framing that does not add up.
        case(
            "a chunked body past max_body_bytes",
            chunked("stripe", &stripe(&big_body), &big_body, 4096),
            413,
            Some("payload_too_large"),
        ),
        case(
            "a Content-Length past max_body_bytes, body never sent",
            post(
                "stripe",
                &with(&stripe(b""), "Content-Length", b"10000000", false),
                b"",
            ),
            413,
            Some("payload_too_large"),
        ),
        case(
            "a chunked body within the limit, signed",
            chunked("stripe", &stripe(&fits), &fits, 100),
            200,
            None,
        ),
        case(
            "a Content-Length that is not a number",
            post(
                "stripe",
                &with(&stripe(&fits), "Content-Length", b"12abc", false),
                &fits,
            ),
            400,
            None,
        ),
        case(
            "both Content-Length and Transfer-Encoding",
            {
                let mut request = chunked("stripe", &stripe(&fits), &fits, 100);
                let at = request
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .expect("a head");
                request.splice(at..at, b"\r\nContent-Length: 5".iter().copied());
                request
            },
            400,
            None,
        ),
        // Ids: control characters, overlong, SQL.
        case(
            "an id with a tab, in a header",
            post("github", &github("evt\t1"), github_body),
            400,
            Some("invalid_event_id"),
        ),
        case(
            "an id with a NUL, in the JSON body",
            {
                let body = br#"{"id":"evt\u0000x","type":"a"}"#;
                post("stripe", &stripe(body), body)
            },
            400,
            Some("invalid_event_id"),
        ),
        case(
            "an id with an escape character, in the JSON body",
            {
                let body = br#"{"id":"evt\u001b[31m","type":"a"}"#;
                post("stripe", &stripe(body), body)
            },
            400,
            Some("invalid_event_id"),
        ),
        case(
            "an id of 256 bytes",
            post("github", &github(&"e".repeat(256)), github_body),
            400,
            Some("invalid_event_id"),
        ),
        case(
            "an id of 30 000 bytes, in the JSON body",
            {
                let body = stripe_body(&"e".repeat(30_000));
                post("stripe", &stripe(&body), &body)
            },
            400,
            Some("invalid_event_id"),
        ),
        case(
            "SQL metacharacters in the id",
            post("stripe", &stripe(&sql_body), &sql_body),
            200,
            None,
        ),
        case(
            "SQL metacharacters in the source",
            post("stripe'%20OR%20'1'='1", &stripe(&fits), &fits),
            404,
            Some("unknown_source"),
        ),
        case(
            "SQL metacharacters in an admin query",
            admin("source=%27%20OR%20%271%27%3D%271&since=1h"),
            200,
            None,
        ),
        case(
            "SQL in an admin limit",
            admin("limit=1;DROP%20TABLE%20events"),
            400,
            Some("invalid_query"),
        ),
        // JSON that goes deep.
        case(
            "JSON nested 5000 deep where the scheme needs JSON",
            post(
                "stripe",
                &stripe(deep_stripe.as_bytes()),
                deep_stripe.as_bytes(),
            ),
            400,
            Some("malformed_payload"),
        ),
        case(
            "JSON nested 5000 deep where the id is in a header",
            {
                let body = nested(5000);
                post(
                    "github",
                    &signed(app, "github", body.as_bytes(), &unique_id("gh")),
                    body.as_bytes(),
                )
            },
            200,
            None,
        ),
        case(
            "JSON nested 100 deep in a Stripe event",
            post(
                "stripe",
                &stripe(shallow_stripe.as_bytes()),
                shallow_stripe.as_bytes(),
            ),
            200,
            None,
        ),
        // Timestamps.
        case(
            "a 30-digit timestamp with a valid MAC",
            post(
                "stripe",
                &with(
                    &[],
                    "Stripe-Signature",
                    format!("t={huge_t},v1={}", stripe_mac(&huge_t, &huge_t_body)).as_bytes(),
                    false,
                ),
                &huge_t_body,
            ),
            401,
            Some("stale_timestamp"),
        ),
        case(
            "a negative timestamp",
            post(
                "stripe",
                &with(
                    &[],
                    "Stripe-Signature",
                    format!("t=-5,v1={}", stripe_mac("-5", &fits)).as_bytes(),
                    false,
                ),
                &fits,
            ),
            401,
            Some("invalid_signature"),
        ),
        // Paths and methods.
        case(
            "a path of 8 KiB",
            post(&"s".repeat(8 * 1024), &stripe(&fits), &fits),
            404,
            Some("unknown_source"),
        ),
        case(
            "a source that is a percent-encoded NUL",
            post("%00", &stripe(&fits), &fits),
            404,
            Some("unknown_source"),
        ),
        case(
            "GET on the webhook route",
            raw::request("GET", "/webhooks/stripe", &[], b""),
            405,
            Some("method_not_allowed"),
        ),
        case(
            "no signature at all, empty body",
            post("stripe", &[], b""),
            401,
            Some("invalid_signature"),
        ),
    ]
}

#[actix_web::test]
async fn hostile_requests_get_their_expected_status_and_code_and_never_a_5xx() {
    let app = TestApp::spawn().await;
    let mut wrong = Vec::new();
    for case in cases(&app) {
        let address = app.address.clone();
        let request = case.request.clone();
        let answer = actix_web::rt::task::spawn_blocking(move || {
            raw::exchange(&address, &request, Duration::from_secs(15))
        })
        .await
        .expect("the request's thread");
        match answer {
            Ok(answer)
                if answer.status < 500
                    && (answer.status, answer.code().as_deref()) == (case.status, case.error) => {}
            Ok(answer) => wrong.push(format!(
                "{}: expected {} {:?}, got {} {:?}: {}",
                case.name,
                case.status,
                case.error,
                answer.status,
                answer.code(),
                String::from_utf8_lossy(&answer.body)
            )),
            Err(e) => wrong.push(format!("{}: {e}", case.name)),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The events table survived the SQL, and the odd id is stored as it came.
    let id = "evt_'; DROP TABLE events; --";
    let again = app
        .send(&app.delivery(
            "stripe",
            &stripe_event(id, "payment_intent.succeeded", 1),
            id,
        ))
        .await;
    assert!(again.replayed(), "{}", again.text());
}

/// Opens a connection, sends `head`, then dribbles `dribble` a byte at a time, and returns the
/// answer and how long it took.
fn dribbling(
    address: &str,
    head: &[u8],
    dribble: &[u8],
    every: Duration,
) -> (Result<Answer, String>, Duration) {
    use std::io::Write;
    let started = Instant::now();
    let mut stream = raw::connect(address, Duration::from_secs(20));
    let _ = stream.write_all(head);
    stream.set_nonblocking(false).expect("blocking");
    for byte in dribble {
        if stream.write_all(std::slice::from_ref(byte)).is_err() {
            break;
        }
        let _ = stream.flush();
        std::thread::sleep(every);
        // Stop as soon as the server has answered (and closed).
        let mut peek = [0u8; 1];
        stream.set_nonblocking(true).expect("nonblocking");
        let answered = stream.peek(&mut peek).is_ok();
        stream.set_nonblocking(false).expect("blocking");
        if answered {
            break;
        }
    }
    (raw::read_answer(&mut stream), started.elapsed())
}

#[actix_web::test]
async fn a_client_dribbling_bytes_is_timed_out_while_others_are_served() {
    let db = TestDb::create();
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"2s\"");
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    let body = stripe_event(&unique_id("evt"), "payment_intent.succeeded", 1).into_bytes();
    let headers = signed(&app, "stripe", &body, "");

    // One dribbles its headers, one its body, a byte every 200 ms.
    let head_only = post("stripe", &headers, &body);
    let split = head_only.len() - body.len() - 2;
    let (head_start, head_rest) = head_only.split_at(split / 2);
    let (head_start, head_rest) = (head_start.to_vec(), head_rest.to_vec());
    let body_head = head_only[..head_only.len() - body.len()].to_vec();
    let address = app.address.clone();
    let slow_head = actix_web::rt::task::spawn_blocking(move || {
        dribbling(
            &address,
            &head_start,
            &head_rest,
            Duration::from_millis(200),
        )
    });
    let address = app.address.clone();
    let slow_body = actix_web::rt::task::spawn_blocking(move || {
        dribbling(&address, &body_head, &body, Duration::from_millis(200))
    });

    // Meanwhile the server answers everyone else at once.
    for _ in 0..5 {
        let id = unique_id("evt");
        let sent = Instant::now();
        let answer = app
            .send(&app.delivery("stripe", &stripe_event(&id, "a", 1), &id))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(sent.elapsed() < Duration::from_secs(1), "served meanwhile");
        actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    }

    let (head_answer, head_took) = slow_head.await.expect("the dribbling thread");
    let head_answer = head_answer.expect("an answer to the slow head");
    assert_eq!(head_answer.status, 408, "the slow head is cut off");
    assert!(
        head_took < Duration::from_secs(5),
        "within the timeout: {head_took:?}"
    );

    let (body_answer, body_took) = slow_body.await.expect("the dribbling thread");
    let body_answer = body_answer.expect("an answer to the slow body");
    assert_eq!(
        (body_answer.status, body_answer.code().as_deref()),
        (408, Some("request_timeout")),
        "{}",
        String::from_utf8_lossy(&body_answer.body)
    );
    assert!(
        body_took < Duration::from_secs(5),
        "within the timeout: {body_took:?}"
    );
    assert_eq!(body_answer.header("Content-Type"), Some("application/json"));
    assert_eq!(
        app.db.count("events"),
        5,
        "nothing of the slow ones is stored"
    );
}

/// Sends `sent` (a request's start) on a connection of its own, reads the answer, then reads
/// on: `Ok(0)` when the server closed the connection after its answer (within 10 s).
async fn answered_then_closed(
    address: &str,
    sent: Vec<u8>,
) -> (Result<Answer, String>, Result<usize, std::io::ErrorKind>) {
    let address = address.to_owned();
    actix_web::rt::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = raw::connect(&address, Duration::from_secs(10));
        stream.write_all(&sent).expect("send the start");
        let answer = raw::read_answer(&mut stream);
        let mut more = [0u8; 64];
        let closed = stream.read(&mut more);
        (answer, closed.map_err(|e| e.kind()))
    })
    .await
    .expect("the client's thread")
}

#[actix_web::test]
async fn a_chunked_body_that_never_ends_is_408_and_its_connection_closed() {
    // actix drains an unread chunked body after the answer, for as long as the client keeps
    // the connection: one that never sends the last chunk held a socket for ever.
    let db = TestDb::create();
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"1s\"");
    let app = TestApp::spawn_on(db, parse_config(&text), Handlers::default()).await;
    let body = stripe_event(&unique_id("evt"), "payment_intent.succeeded", 1).into_bytes();
    let whole = chunked("stripe", &signed(&app, "stripe", &body, ""), &body, 16);
    // The head and the first chunk, and nothing more.
    let head_end = whole
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the head ends")
        + 4;
    let first_chunk = head_end + 4 + 16 + 2;
    let sent = whole[..first_chunk].to_vec();
    let (answer, closed) = answered_then_closed(&app.address, sent).await;
    let answer = answer.expect("an answer");
    assert_eq!(
        (answer.status, answer.code().as_deref()),
        (408, Some("request_timeout"))
    );
    assert_eq!(
        closed,
        Ok(0),
        "the server closes the connection after its 408"
    );
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn an_answer_before_a_chunked_body_that_never_ends_closes_its_connection() {
    // Answered before the body is read, and the body dropped with the handler: actix drained
    // it for as long as the client kept the connection, so a client that never sent the last
    // chunk held a socket (and a file descriptor) for ever, without a secret.
    let app = TestApp::spawn().await;
    for (method, path, status) in [
        ("POST", "/webhooks/nosuch", 404),
        ("PUT", "/webhooks/stripe", 405),
        ("GET", "/healthz", 200),
        ("POST", "/admin/deliveries/requeue", 401),
        // The first chunk alone is over max_body_bytes (64 KiB in the tests).
        ("POST", "/webhooks/stripe", 413),
    ] {
        let chunk = vec![b'x'; 70_000];
        let mut sent = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            chunk.len()
        )
        .into_bytes();
        sent.extend_from_slice(&chunk);
        sent.extend_from_slice(b"\r\n");
        let (answer, closed) = answered_then_closed(&app.address, sent).await;
        let answer = answer.expect("an answer");
        assert_eq!(answer.status, status, "{method} {path}");
        assert_eq!(
            closed,
            Ok(0),
            "{method} {path}: the server closes the connection after its answer"
        );
    }
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_broken_chunked_body_is_400_saying_the_body_could_not_be_read_not_that_it_is_not_json() {
    // GitHub's scheme needs no JSON: "could not be read as the JSON this scheme needs" would
    // send the operator looking at the payload, not the framing.
    let app = TestApp::spawn().await;
    let body = br#"{"zen":"hi"}"#;
    let mut request = chunked(
        "github",
        &signed(&app, "github", body, &unique_id("gh")),
        body,
        4,
    );
    // A chunk size that is not hex, where the next chunk's size line should be.
    let at = request
        .windows(5)
        .position(|w| w == b"0\r\n\r\n")
        .expect("the last chunk");
    request.splice(at..at, b"zz\r\nnope\r\n".iter().copied());
    let address = app.address.clone();
    let answer = actix_web::rt::task::spawn_blocking(move || {
        raw::exchange(&address, &request, Duration::from_secs(15))
    })
    .await
    .expect("the request's thread")
    .expect("an answer");
    assert_eq!(
        (answer.status, answer.code().as_deref()),
        (400, Some("malformed_payload")),
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(
        text.contains("could not be read") && !text.contains("JSON"),
        "{text}"
    );
    assert_eq!(app.db.count("events"), 0);
}

#[actix_web::test]
async fn a_form_or_admin_body_announced_and_never_sent_is_408_within_the_request_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The console's login form needs no session: a client that says a body comes and never
    // sends it held the connection for as long as it liked, as did the admin POST routes.
    let db = TestDb::create();
    let text = with_server_keys(&config_text(&db.url, ""), "request_timeout = \"1s\"");
    let app = TestApp::spawn_on(db, parse_config(&text), hookbox::Handlers::default()).await;
    let authority = app.address.trim_start_matches("http://").to_owned();
    for (path, extra) in [
        (
            "/console/login",
            "Content-Type: application/x-www-form-urlencoded\r\n".to_owned(),
        ),
        (
            "/admin/deliveries/requeue?source=stripe",
            format!("Authorization: Bearer {ADMIN_TOKEN}\r\n"),
        ),
    ] {
        let mut stream = tokio::net::TcpStream::connect(&authority)
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\n{extra}Content-Length: 10\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("the head");
        let started = std::time::Instant::now();
        let mut answer = vec![0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(15), stream.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer in 15 s"))
            .expect("read the answer");
        let answer = String::from_utf8_lossy(&answer[..read]).into_owned();
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{path}: {:?}",
            started.elapsed()
        );
    }
}

/// actix reads the body of a request with `Upgrade: websocket` as the WebSocket's stream, up to
/// the connection's end, whatever its `Content-Length`: such a delivery waited out
/// `request_timeout` and was answered 408, unstored (a black-box run). hookbox upgrades nothing
/// and reads the body the request says it has: stored and answered at once, refused at once.
#[actix_web::test]
async fn a_delivery_that_asks_to_upgrade_to_a_websocket_is_read_by_its_content_length() {
    let app = TestApp::spawn().await;
    let id = unique_id("evt");
    let body = stripe_event(&id, "charge.succeeded", 1);
    let headers = with(
        &signed(&app, "stripe", body.as_bytes(), &id),
        "Upgrade",
        b"websocket",
        false,
    );
    let unsigned = with(&[], "Upgrade", b"WebSocket", false);
    // Any of several Upgrade lines, as actix reads them.
    let second = with(
        &with(
            &signed(&app, "stripe", body.as_bytes(), &id),
            "Upgrade",
            b"h2c",
            false,
        ),
        "Upgrade",
        b"websocket",
        true,
    );
    for (request, status) in [
        (post("stripe", &headers, body.as_bytes()), 200),
        (post("stripe", &second, body.as_bytes()), 200),
        (post("stripe", &unsigned, b"{}"), 401),
        (chunked("stripe", &headers, body.as_bytes(), 100), 200),
    ] {
        let address = app.address.clone();
        let answer = actix_web::rt::task::spawn_blocking(move || {
            raw::exchange(&address, &request, Duration::from_secs(10))
        })
        .await
        .expect("the exchange ran")
        .expect("answered within 10 s");
        assert_eq!(answer.status, status, "{}", answer.text());
    }
    assert_eq!(app.db.count(&format!("events WHERE event_id = '{id}'")), 1);
}
