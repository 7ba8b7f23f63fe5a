//! Who may use the admin API and the console: the one place the admin token is checked.
//!
//! A handler runs only for a caller that holds the admin token when it takes an [`Admin`]
//! argument, whose type parameter says how the token is shown:
//! - [`Admin<Bearer>`]: `Authorization: Bearer <token>`, for the admin API (401 `unauthorized`
//!   otherwise);
//! - [`Admin<Session>`]: a live console session cookie, for the console's pages and forms (303
//!   to the login form otherwise);
//! - [`Admin<Login>`]: the token posted in the console's login form, which starts a session (401
//!   and the form again otherwise).
//!
//! While no admin token is configured every one of them answers 404, as if the routes did not
//! exist. Handlers take `Admin<_>` as their last argument, so a malformed path or query is
//! answered as it was before the token is looked at.

use std::future::{ready, Future, Ready};
use std::pin::Pin;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpRequest};

use super::console::{Refused, Session};
use super::ApiError;
use crate::secret::{same_secret, Secret};
use crate::state::AppState;
use crate::telemetry::OncePerMinute;

/// Proof that the request carries the admin token, shown the way `P` says. Holds what that way
/// yields: nothing for a bearer token, the session for a console cookie.
pub struct Admin<P>(pub P);

/// The admin API's way: `Authorization: Bearer <token>`.
pub struct Bearer;

/// The console's login form: the token in its `token` field, and where to go once logged in
/// (its `next` field: the console address the browser was sent away from, if it was one).
pub struct Login {
    /// A console address ([`super::console::back_to`]), or none for the overview.
    pub next: Option<String>,
}

/// Whether `given` is the admin token, in time that shows neither its length nor its first
/// wrong byte ([`same_secret`]).
fn is_admin_token(expected: &Secret, given: &str) -> bool {
    same_secret(given.as_bytes(), expected.expose().as_bytes())
}

fn state(request: &HttpRequest) -> &web::Data<AppState> {
    request
        .app_data::<web::Data<AppState>>()
        .expect("the application state is registered with every route")
}

/// The token of `Authorization: Bearer <token>`, or "" when there is none or the request has
/// more than one `Authorization` (a field of one value: a proxy in front may read the other).
/// The scheme's name is matched without regard to case, and spaces may follow it, as RFC 7235
/// has it.
fn bearer_token(request: &HttpRequest) -> &str {
    let mut values = request.headers().get_all(header::AUTHORIZATION);
    let first = values.next();
    if values.next().is_some() {
        return "";
    }
    first
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, token)| token.trim_start_matches(' '))
}

/// Paces the answers to wrong admin tokens (the API's bearer, the console's login), whoever
/// sends them: each waits for a turn [`WrongTokens::SPACING`] after the one before, so a guesser
/// gets ten tries a second at most however many connections it opens (a black-box review found
/// 300 wrong tokens answered in a second). The right token never waits. A turn is never more
/// than [`WrongTokens::MOST_WAIT`] away: a flood deeper than that is answered after that wait,
/// so it holds no request longer.
#[derive(Debug, Default)]
pub struct WrongTokens {
    /// The next turn free.
    next: std::sync::Mutex<Option<std::time::Instant>>,
}

impl WrongTokens {
    /// The least time between two answers to a wrong token.
    pub const SPACING: std::time::Duration = std::time::Duration::from_millis(100);
    /// The longest an answer waits for its turn.
    pub const MOST_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

    /// Waits for this wrong token's turn to be answered.
    async fn turn(&self) {
        let at = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            let at = next.map_or(now, |t| t.max(now)).min(now + Self::MOST_WAIT);
            *next = Some(at + Self::SPACING);
            at
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

/// When a wrong console login was last said in a WARN (at most once a minute, with how many
/// were not).
static LOGIN_REFUSED_SAID: OncePerMinute = OncePerMinute::new();

impl FromRequest for Admin<Bearer> {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(expected) = &state(request).admin_token else {
            return ready(Err(ApiError::NotFound));
        };
        // A wrong one is answered in its turn, by [`pace_wrong_tokens`].
        ready(if is_admin_token(expected, bearer_token(request)) {
            Ok(Admin(Bearer))
        } else {
            Err(ApiError::Unauthorized)
        })
    }
}

/// Around every admin API route: a 401 (a wrong token) is answered in its turn
/// ([`WrongTokens`]). After the route has answered, so the token is judged first, before
/// anything else of the request, as it was.
pub async fn pace_wrong_tokens(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = web::Data::clone(
        request
            .app_data::<web::Data<AppState>>()
            .expect("the application state is registered with every route"),
    );
    let answer = next.call(request).await?;
    if answer.status() == actix_web::http::StatusCode::UNAUTHORIZED {
        state.wrong_tokens.turn().await;
    }
    Ok(answer)
}

impl FromRequest for Admin<Session> {
    type Error = Refused;
    type Future = Ready<Result<Self, Refused>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = state(request);
        if state.admin_token.is_none() {
            return ready(Err(Refused::Off));
        }
        ready(state.sessions.find(request).map(Admin).ok_or_else(|| {
            // A page asked for (a link from an alert, a bookmark) is where the login leads.
            let asked = request.uri().path_and_query().map(|a| a.as_str());
            let page = matches!(*request.method(), Method::GET | Method::HEAD);
            let back = page
                .then_some(asked)
                .flatten()
                .and_then(super::console::back_to)
                .map(str::to_owned);
            Refused::LoggedOut(back)
        }))
    }
}

impl FromRequest for Admin<Login> {
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self, actix_web::Error>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let state = web::Data::clone(state(request));
        let expected = state.admin_token.clone();
        let body = super::console::FormBody::from_request(request, payload);
        Box::pin(async move {
            let Some(expected) = expected else {
                return Err(Refused::Off.into());
            };
            let super::console::FormBody(body) = body.await?;
            // A field the form has not, or one given twice (only the first would count), is
            // refused before the token is compared, as on every console form.
            super::console::check_fields(&body, &["token", "next"])?;
            let field = |wanted: &str| {
                form_urlencoded::parse(&body)
                    .find(|(name, _)| name == wanted)
                    .map(|(_, value)| value.into_owned())
            };
            let given = field("token").unwrap_or_default();
            let next = field("next")
                .as_deref()
                .and_then(super::console::back_to)
                .map(str::to_owned);
            // As the configured token, whitespace around it is not part of it (a paste).
            if is_admin_token(&expected, given.trim()) {
                Ok(Admin(Login { next }))
            } else {
                state.wrong_tokens.turn().await;
                if let Some(not_shown_since_last) = LOGIN_REFUSED_SAID.due() {
                    tracing::warn!(
                        not_shown_since_last,
                        "console login refused: wrong token (at most one such line a minute; \
                         wrong tokens are answered ten a second at most)"
                    );
                }
                Err(Refused::WrongToken(next).into())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn the_bearer_scheme_is_read_without_regard_to_case_or_extra_spaces() {
        let token = |value: &str| {
            let request = TestRequest::default()
                .insert_header((header::AUTHORIZATION, value))
                .to_http_request();
            bearer_token(&request).to_owned()
        };
        assert_eq!(token("Bearer abc"), "abc");
        assert_eq!(token("bEaReR   abc"), "abc");
        assert_eq!(token("Basic abc"), "");
        assert_eq!(token("Bearerabc"), "");
        assert_eq!(bearer_token(&TestRequest::default().to_http_request()), "");
    }

    #[test]
    fn only_the_exact_token_is_the_admin_token() {
        let expected = Secret::new("s3cret-token");
        assert!(is_admin_token(&expected, "s3cret-token"));
        assert!(!is_admin_token(&expected, "s3cret-toke"));
        assert!(!is_admin_token(&expected, "s3cret-token "));
        assert!(!is_admin_token(&expected, ""));
    }
}
