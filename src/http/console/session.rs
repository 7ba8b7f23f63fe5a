//! Console sessions. Logging in with the admin token starts one: a random id goes out in an
//! `HttpOnly`, `SameSite=Strict` cookie scoped to `/console`, and this process keeps, under the
//! id's SHA-256, the session's expiry and its CSRF token. The token itself is never a cookie.
//! Logging out forgets the session; a restart forgets them all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use actix_web::cookie::{time, Cookie, SameSite};
use actix_web::HttpRequest;
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "hookbox_console";

/// How long a session lasts from login, whatever happens meanwhile.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// Sessions kept at most; logging in past this ends the one closest to its expiry.
const MAX_SESSIONS: usize = 1000;

/// One logged-in browser.
#[derive(Clone)]
pub struct Session {
    csrf: String,
    expires: Instant,
}

impl Session {
    /// The token every form of this session carries in its hidden `csrf` field.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether a form's `csrf` field is this session's token (compared in constant time).
    pub fn accepts(&self, given: &str) -> bool {
        bool::from(given.as_bytes().ct_eq(self.csrf.as_bytes()))
    }

    /// A seal over `parts` that only this session can make (hex HMAC-SHA256 keyed by its CSRF
    /// token): put on the address a form's outcome is shown at, so that a link made elsewhere
    /// cannot show an outcome that did not happen.
    pub fn seal(&self, parts: &[&str]) -> String {
        use hmac::{KeyInit, Mac};
        let mut mac =
            hmac::Hmac::<Sha256>::new_from_slice(self.csrf.as_bytes()).expect("any key length");
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `given` is this session's [`seal`](Session::seal) over `parts` (compared in
    /// constant time).
    pub fn sealed(&self, parts: &[&str], given: &str) -> bool {
        bool::from(self.seal(parts).as_bytes().ct_eq(given.as_bytes()))
    }
}

/// The sessions this process has started.
#[derive(Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Session>>,
}

impl Sessions {
    /// Starts a session; returns the id for its cookie.
    pub fn start(&self) -> String {
        let id = random_token();
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(digest, _)| *digest);
            if let Some(digest) = oldest {
                sessions.remove(&digest);
            }
        }
        sessions.insert(
            digest(&id),
            Session {
                csrf: random_token(),
                expires: now + LIFETIME,
            },
        );
        id
    }

    /// The live session the request's cookie names, if any.
    pub fn find(&self, request: &HttpRequest) -> Option<Session> {
        let digest = digest(&cookie_value(request)?);
        let mut sessions = self.lock();
        match sessions.get(&digest) {
            Some(session) if session.expires > Instant::now() => Some(session.clone()),
            Some(_) => {
                sessions.remove(&digest);
                None
            }
            None => None,
        }
    }

    /// Forgets the session the request's cookie names.
    pub fn end(&self, request: &HttpRequest) {
        if let Some(id) = cookie_value(request) {
            self.lock().remove(&digest(&id));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.by_digest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// 256 random bits from the operating system, base64url.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system provides random bytes");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The value of the session cookie among the request's cookies.
fn cookie_value(request: &HttpRequest) -> Option<String> {
    request
        .cookie(COOKIE)
        .map(|cookie| cookie.value().to_owned())
        .filter(|value| !value.is_empty())
}

/// The session cookie with `value`, lasting `max_age`: `HttpOnly`, `SameSite=Strict`, scoped
/// to `/console`, and `Secure` when the console was reached over HTTPS (directly or as a proxy
/// says), so a plain-HTTP console still works.
fn build(value: String, max_age: time::Duration, secure: bool) -> Cookie<'static> {
    Cookie::build(COOKIE, value)
        .path("/console")
        .http_only(true)
        .same_site(SameSite::Strict)
        .max_age(max_age)
        .secure(secure)
        .finish()
}

/// The cookie that hands a browser its session `id`.
pub fn cookie(id: String, secure: bool) -> Cookie<'static> {
    let lifetime = i64::try_from(LIFETIME.as_secs()).expect("the lifetime is eight hours");
    build(id, time::Duration::seconds(lifetime), secure)
}

/// The cookie that removes the session cookie.
pub fn removal_cookie(secure: bool) -> Cookie<'static> {
    build(String::new(), time::Duration::ZERO, secure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header;
    use actix_web::test::TestRequest;

    fn with_cookie(value: &str) -> HttpRequest {
        TestRequest::default()
            .insert_header((header::COOKIE, value))
            .to_http_request()
    }

    #[test]
    fn a_started_session_is_found_by_its_cookie_and_gone_after_logout() {
        let sessions = Sessions::default();
        let id = sessions.start();
        assert_eq!(id.len(), 43, "256 bits, base64url");
        let request = with_cookie(&format!("theme=dark; {COOKIE}={id}; other=1"));
        let session = sessions.find(&request).expect("the session is live");
        assert!(session.accepts(session.csrf()));
        assert!(!session.accepts(""));
        assert!(!session.accepts(&session.csrf()[1..]));
        assert_ne!(session.csrf(), id, "the CSRF token is not the cookie");

        assert!(sessions
            .find(&with_cookie(&format!("{COOKIE}=x{id}")))
            .is_none());
        assert!(sessions
            .find(&TestRequest::default().to_http_request())
            .is_none());
        sessions.end(&request);
        assert!(sessions.find(&request).is_none());
    }

    #[test]
    fn an_expired_session_is_not_found() {
        let sessions = Sessions::default();
        let id = sessions.start();
        for session in sessions.lock().values_mut() {
            session.expires = Instant::now() - Duration::from_secs(1);
        }
        assert!(sessions
            .find(&with_cookie(&format!("{COOKIE}={id}")))
            .is_none());
        assert!(sessions.lock().is_empty(), "the expired session is dropped");
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_console() {
        let set = cookie("abc".to_owned(), false).to_string();
        let attributes: Vec<&str> = set.split("; ").collect();
        assert_eq!(attributes[0], "hookbox_console=abc");
        for wanted in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/console",
            "Max-Age=28800",
        ] {
            assert!(attributes.contains(&wanted), "{wanted} in {set}");
        }
        assert!(!attributes.contains(&"Secure"), "{set}");
        assert!(cookie("abc".to_owned(), true)
            .to_string()
            .split("; ")
            .any(|a| a == "Secure"));
        let removal = removal_cookie(false).to_string();
        assert!(removal.starts_with("hookbox_console=;"), "{removal}");
        assert!(removal.contains("Max-Age=0"), "{removal}");
    }

    #[test]
    fn a_cookie_header_that_does_not_parse_does_not_hide_the_session() {
        let sessions = Sessions::default();
        let id = sessions.start();
        let request = with_cookie(&format!("junk; ={COOKIE}; {COOKIE}={id}"));
        assert!(sessions.find(&request).is_some());
        assert!(sessions.find(&with_cookie(&format!("{COOKIE}="))).is_none());
    }
}
