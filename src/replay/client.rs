//! Posting a signed delivery: where it goes (`--to`), and how a delivery survives a network
//! failure or a receiver that says "in progress, come back later".

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use actix_web::web::Bytes;
use awc::http::header::{HeaderName, HeaderValue};
use awc::http::Uri;

use crate::retry;

/// How long one attempt may take. Longer than a receiver's in-flight wait (hookbox's default
/// is 10 s), so a duplicate that waits on the first delivery is answered, not cut off; and
/// longer than its `request_timeout` (30 s by default), so a delivery held up by a database
/// that stalled gets the 503 that says so: at 30 s the tool gave up milliseconds before it, and
/// reported no answer, pointing at the network (a black-box run).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(35);

/// Network failures are retried this often, waiting about 250 ms, 500 ms, 1 s between tries
/// (the upper half of each step, jittered).
pub const NETWORK_RETRIES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(1);

/// A 409 `in_progress` is retried this often, each time after its `Retry-After`.
pub const IN_PROGRESS_RETRIES: u32 = 5;
/// A `Retry-After` longer than this is waited only this long: a replay should not stall on
/// one delivery for minutes.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// The biggest answer body read; a receiver's answers are small, and nothing needs more.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Where `--to` points: a base URL, to which `/webhooks/{source}` is added (before any query
/// it has), or a URL with a path of its own, used as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    url: String,
    has_path: bool,
}

impl Target {
    /// The query every delivery is posted with, before any a signed delivery adds.
    pub fn query(&self) -> Option<&str> {
        self.url.split_once('?').map(|(_, query)| query)
    }

    /// Whether the URL has a path of its own, to which every delivery goes whatever its source.
    pub fn has_path(&self) -> bool {
        self.has_path
    }

    /// The URL a delivery for `source` is posted to: `http://host:8080?q=1` posts to
    /// `http://host:8080/webhooks/{source}?q=1`.
    pub fn url_for(&self, source: &str) -> String {
        if self.has_path {
            return self.url.clone();
        }
        let (base, query) = match self.url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (self.url.as_str(), ""),
        };
        let url = format!("{}/webhooks/{source}", base.trim_end_matches('/'));
        if query.is_empty() {
            url
        } else {
            format!("{url}?{query}")
        }
    }
}

impl FromStr for Target {
    type Err = String;

    /// Refuses what would not be sent as written: a fragment and a `user:password@` are
    /// dropped by any HTTP client, and a port outside 1-65535 names nothing. The error never
    /// repeats a password.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{:?} is not a URL: {e}", crate::redact::database_url(text)))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => {
                return Err(format!(
                    "{:?} needs to be an http:// or https:// URL, like http://127.0.0.1:8080",
                    crate::redact::database_url(text)
                ))
            }
        }
        let Some(authority) = uri.authority() else {
            return Err(format!("{text:?} names no host"));
        };
        if authority.as_str().contains('@') {
            return Err(format!(
                "{:?} carries a user or password (user:password@), which is never sent: leave it out (a webhook endpoint checks signatures; the one source that also checks a login, Adyen's basic_auth, gets it from the source in --config)",
                crate::redact::database_url(text)
            ));
        }
        if text.contains('#') {
            return Err(format!(
                "{text:?} has a #fragment, which is never sent: leave it out"
            ));
        }
        // `Uri` keeps a port it cannot read as a u16 in the authority, and forgets it.
        let host_port = authority.as_str();
        let port_text = match host_port.rfind(']') {
            Some(bracket) => host_port[bracket + 1..].strip_prefix(':'),
            None => host_port.rsplit_once(':').map(|(_, port)| port),
        };
        if let Some(port_text) = port_text {
            if !matches!(port_text.parse::<u16>(), Ok(1..)) {
                return Err(format!(
                    "{text:?} has port {port_text:?}: a port is a number from 1 to 65535"
                ));
            }
        }
        let path = uri.path();
        Ok(Target {
            url: text.to_owned(),
            has_path: !(path.is_empty() || path == "/"),
        })
    }
}

/// A header as HTTP carries it, or why it cannot be: a name that is not a token, or a value
/// holding CR, LF, NUL or another control character (a tab is fine; bytes past ASCII are
/// sent as they are).
///
/// # Errors
/// Which part is wrong, in one sentence.
pub fn header_pair(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header_name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("the header name {name:?} is not a valid HTTP header name"))?;
    let header_value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
        format!("the value of header {name:?} holds a CR, LF or other control character")
    })?;
    Ok((header_name, header_value))
}

/// Shown with a credential its query may carry (`?token=`, `?api_key=`) masked, as forward
/// targets' URLs are: summaries, messages and the report print it.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::redact::target_url(&self.url))
    }
}

/// One delivery, ready to post.
#[derive(Debug, Clone)]
pub struct Request {
    /// Where to.
    pub url: String,
    /// Every header to send.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Bytes,
}

/// The receiver's answer to a delivery.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Whether it said `Idempotent-Replayed: true`: the event had been processed before.
    pub replayed: bool,
    /// The answer's body.
    pub body: Bytes,
    /// How long the answered attempt took.
    pub latency: Duration,
    /// Where a redirect (3xx) points, its `Location`: the tools follow none.
    pub location: Option<String>,
}

impl Answer {
    /// The contract's error code in a JSON error body, if there is one.
    pub fn error_code(&self) -> Option<String> {
        self.json_field("error")
    }

    /// The one-sentence message of a JSON error body, where a redirect points, or the start
    /// of another body.
    pub fn message(&self) -> String {
        if let Some(location) = self
            .location
            .as_deref()
            .filter(|_| (300..400).contains(&self.status))
        {
            return format!(
                "redirected to {location} (not followed: a webhook URL that redirects is \
                 misconfigured; give --to the address that answers)"
            );
        }
        self.json_field("message").unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&self.body);
            text.chars().take(200).collect()
        })
    }

    pub fn json_field(&self, name: &str) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json.get(name)?.as_str().map(str::to_owned)
    }
}

/// The HTTP client the tools share: no redirects (a webhook endpoint that redirects is a
/// misconfiguration to report, not to follow), and a timeout per attempt.
pub fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(ATTEMPT_TIMEOUT)
        .disable_redirects()
        .finish()
}

/// Posts `request`, retrying a network failure (with backoff) and a 409 `in_progress` (after
/// its `Retry-After`). Retrying is safe: the receiver answers a repeated event with its stored
/// response. `on_busy` is told of each 409 retried: which retry it is, and the wait before it.
///
/// # Errors
/// The last network failure, once the retries are spent, or a header HTTP cannot carry, as
/// one line.
pub async fn deliver(
    client: &awc::Client,
    request: &Request,
    on_busy: &dyn Fn(u32, Duration),
) -> Result<Answer, String> {
    // A header HTTP cannot carry fails every try alike: no retry.
    for (name, value) in &request.headers {
        header_pair(name, value)?;
    }
    let mut network_failures = 0;
    let mut in_progress = 0;
    loop {
        match attempt(client, request).await {
            Ok((answer, retry_after)) => {
                let busy = answer.status == 409
                    && answer.error_code().as_deref() == Some("in_progress")
                    && in_progress < IN_PROGRESS_RETRIES;
                if !busy {
                    return Ok(answer);
                }
                in_progress += 1;
                let wait = retry_after
                    .unwrap_or(Duration::from_secs(1))
                    .min(MAX_RETRY_AFTER);
                on_busy(in_progress, wait);
                actix_web::rt::time::sleep(wait).await;
            }
            Err(error) if network_failures < NETWORK_RETRIES => {
                tracing::debug!(
                    %error,
                    url = %crate::redact::target_url(&request.url),
                    "network failure; retrying"
                );
                let wait = retry::backoff(FIRST_BACKOFF * 2, BACKOFF_CAP, network_failures + 1);
                actix_web::rt::time::sleep(wait).await;
                network_failures += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// What to check, after the client's own words for a request that got no answer.
fn next_step(error: &str) -> &'static str {
    if error.contains("Connection refused") {
        " (is the receiver running and listening there? check --to)"
    } else if error.contains("wrong version number") || error.contains("packet length too long") {
        " (the receiver does not speak TLS there: hookbox serve listens on plain HTTP, so --to \
         takes http://, unless a TLS proxy is in front)"
    } else if error.contains("failed to lookup") || error.contains("Name or service not known") {
        " (the host name did not resolve: check --to)"
    } else if error.contains("Timeout while waiting for response") {
        " (the receiver took the request but did not answer within 35 s: hookbox answers 503 \
         by its request_timeout, 30 s unless set longer, so check that setting, a proxy in \
         between, or the receiver's host)"
    } else {
        ""
    }
}

/// One try: the answer and its `Retry-After` (seconds or an HTTP date), or why there was none.
async fn attempt(
    client: &awc::Client,
    request: &Request,
) -> Result<(Answer, Option<Duration>), String> {
    let started = Instant::now();
    let mut post = client
        .post(request.url.as_str())
        .insert_header(("User-Agent", crate::USER_AGENT));
    for (name, value) in &request.headers {
        let pair = header_pair(name, value)?;
        post = post.insert_header(pair);
    }
    let mut response = post.send_body(request.body.clone()).await.map_err(|e| {
        format!(
            "no answer from {}: {e}{}",
            crate::redact::target_url(&request.url),
            next_step(&e.to_string())
        )
    })?;
    let body = response.body().limit(MAX_ANSWER_BYTES).await.map_err(|e| {
        format!(
            "the answer from {} broke off: {e}",
            crate::redact::target_url(&request.url)
        )
    })?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let retry_after = header("Retry-After").and_then(|v| retry::retry_after(v, SystemTime::now()));
    let answer = Answer {
        status: response.status().as_u16(),
        replayed: header("Idempotent-Replayed").is_some_and(|v| v.eq_ignore_ascii_case("true")),
        body,
        latency: started.elapsed(),
        location: header("Location").map(str::to_owned),
    };
    Ok((answer, retry_after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver at hookbox's defaults answers a delivery it cannot store in time with a 503
    /// at its request timeout: one try waits longer than that, to hear it.
    #[test]
    fn a_try_outlasts_the_default_request_timeout() {
        let defaults = crate::config::Config::parse("", &|_: &str| None).expect("defaults");
        assert!(ATTEMPT_TIMEOUT >= defaults.server.request_timeout + Duration::from_secs(5));
        assert!(next_step("Timeout while waiting for response").contains("request_timeout"));
    }

    #[test]
    fn a_base_url_gets_the_webhook_path_and_a_full_url_is_kept() {
        let base: Target = "http://127.0.0.1:8080".parse().expect("valid");
        assert_eq!(
            base.url_for("stripe"),
            "http://127.0.0.1:8080/webhooks/stripe"
        );
        let slash: Target = "http://127.0.0.1:8080/".parse().expect("valid");
        assert_eq!(
            slash.url_for("github"),
            "http://127.0.0.1:8080/webhooks/github"
        );
        let full: Target = "http://10.0.0.1:9000/hooks/in".parse().expect("valid");
        assert_eq!(full.url_for("stripe"), "http://10.0.0.1:9000/hooks/in");
    }

    #[test]
    fn a_base_url_with_a_query_gets_the_webhook_path_before_the_query() {
        for (to, url) in [
            (
                "http://127.0.0.1:8080?q=1",
                "http://127.0.0.1:8080/webhooks/stripe?q=1",
            ),
            (
                "http://127.0.0.1:8080/?q=1&r=2",
                "http://127.0.0.1:8080/webhooks/stripe?q=1&r=2",
            ),
            (
                "http://127.0.0.1:8080?",
                "http://127.0.0.1:8080/webhooks/stripe",
            ),
            (
                "http://127.0.0.1:8080/hooks/in?q=1",
                "http://127.0.0.1:8080/hooks/in?q=1",
            ),
        ] {
            let target: Target = to.parse().expect("valid");
            assert_eq!(target.url_for("stripe"), url, "{to}");
        }
    }

    #[test]
    fn only_http_urls_with_a_host_are_taken() {
        for bad in ["127.0.0.1:8080", "ftp://x", "/webhooks/x", ""] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn what_would_be_dropped_or_names_no_port_is_refused_without_repeating_a_password() {
        for bad in [
            "http://127.0.0.1:99999",
            "http://127.0.0.1:0",
            "http://127.0.0.1:x/",
            "http://[::1]:70000/hook",
            "http://127.0.0.1:8080/hook#part",
            "http://u:hunter2@127.0.0.1:8080",
            "http://u@127.0.0.1:8080",
        ] {
            let error = bad.parse::<Target>().expect_err(bad);
            assert!(!error.contains("hunter2"), "{error}");
        }
        for good in [
            "http://127.0.0.1:65535",
            "http://[::1]:8080/hook",
            "https://h?x=1",
        ] {
            assert!(good.parse::<Target>().is_ok(), "{good}");
        }
    }

    #[test]
    fn a_header_http_cannot_carry_is_named() {
        assert!(header_pair("x-note", "a\r\nb").is_err());
        assert!(header_pair("x-note", "nul\0").is_err());
        assert!(header_pair("bad name", "v").is_err());
        assert!(header_pair("x-note", "caf\u{e9}\tok").is_ok());
    }

    #[test]
    fn an_answer_tells_its_error_code_and_message() {
        let answer = Answer {
            status: 401,
            replayed: false,
            body: Bytes::from_static(br#"{"error":"stale_timestamp","message":"Too old."}"#),
            latency: Duration::ZERO,
            location: None,
        };
        assert_eq!(answer.error_code().as_deref(), Some("stale_timestamp"));
        assert_eq!(answer.message(), "Too old.");
        let plain = Answer {
            body: Bytes::from_static(b"Bad Gateway"),
            ..answer
        };
        assert_eq!(plain.error_code(), None);
        assert_eq!(plain.message(), "Bad Gateway");
        let moved = Answer {
            status: 307,
            body: Bytes::new(),
            location: Some("https://hooks.example/webhooks/stripe".to_owned()),
            ..plain
        };
        assert!(
            moved
                .message()
                .starts_with("redirected to https://hooks.example/webhooks/stripe (not followed"),
            "{}",
            moved.message()
        );
    }
}
