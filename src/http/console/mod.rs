//! The operator console under `/console`: server-rendered pages behind the admin token, off
//! (404) while no token is configured.
//!
//! Logging in posts the token in a form; a session cookie ([`session`]) carries the browser from
//! then on. Every page is a maud template, which escapes each value it shows, and is served with
//! a Content-Security-Policy that runs no script at all. The one action, re-queueing a dead
//! delivery, and logging out are POSTs that carry the session's CSRF token.

mod chart;
mod event;
mod events;
mod html;
mod overview;
mod session;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use maud::html;

pub use session::{Session, Sessions};

use super::auth::{Admin, Login};
use super::ApiError;
use crate::state::AppState;
use html::{guarded, page, redirect, respond};

/// Mounts the console's routes under `/console`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/console")
            .wrap(html::guards())
            // Every console answer is a console page, with its headers: a path or query the
            // console never makes too, and a path under it that names no page.
            .app_data(
                web::PathConfig::default()
                    .error_handler(|e, request| not_made(e.to_string(), request)),
            )
            .app_data(
                web::QueryConfig::default()
                    .error_handler(|e, request| not_made(crate::http::query_problem(&e), request)),
            )
            .default_service(web::to(no_page))
            .route("", shown().to(overview::show))
            .route("/", shown().to(overview::show))
            .route("/login", shown().to(login_form))
            .route("/login", web::post().to(login))
            .route("/logout", web::post().to(logout))
            .route("/events", shown().to(events::list))
            .route("/event", shown().to(event::show))
            .route("/deliveries/requeue", web::post().to(events::requeue_dead))
            .route("/deliveries/{id}/requeue", web::post().to(event::requeue))
            .route("/events/redeliver", web::post().to(event::redeliver)),
    );
}

/// The route of a page: a GET, and a HEAD answered the same way (actix sends no body for it).
/// A HEAD left to the pages' fallback, which needs a session, would send a caller with none
/// from the login form to the login form, for ever (a link checker's `curl -IL`).
fn shown() -> actix_web::Route {
    use actix_web::guard;
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// The query of a page or form that takes none (the overview, every POST): one is an address
/// the console never makes (400), not a page that looks filtered and is not, nor a form whose
/// action an unknown field widens (a POST ignored its query, and re-queued every source's dead
/// deliveries under `?source=` naming one).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// Why a console request is not served; each has its own answer.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// No admin token is configured: 404, as if there were no console.
    #[error("the console is off")]
    Off,
    /// No live session: 303 to the login form, which leads back to the console address
    /// asked for, if any.
    #[error("not logged in")]
    LoggedOut(Option<String>),
    /// A login with a token that is not the admin token: 401 and the form again (still leading
    /// to the address it was to lead to).
    #[error("the token was not accepted")]
    WrongToken(Option<String>),
    /// A POST without the session's CSRF token: 403.
    #[error("the form's CSRF token is missing or wrong")]
    Forged,
    /// 503.
    #[error("the database did not answer")]
    Unavailable,
    /// A form with a field the console's form has not: 400, naming it.
    #[error("{0}")]
    NotMade(String),
    /// 503: another writer held the lock past the wait (SQLite's write lock held by another
    /// process, a table another PostgreSQL session locked).
    #[error("the store is busy with another write")]
    Busy,
    /// 503: the database took the request but did not answer within the request timeout; what
    /// was asked may still be done.
    #[error("the database did not answer in time")]
    NoAnswer,
    /// 503: the database answered, and refused the write (a full disk, a permission, a damaged
    /// file): the admin API's sentence, which names the cause.
    #[error("{0}")]
    Refusing(String),
}

impl From<ApiError> for Refused {
    fn from(error: ApiError) -> Refused {
        // `with_db` fails with `unavailable` and its kinds.
        match error {
            ApiError::Busy => Refused::Busy,
            ApiError::NoAnswer => Refused::NoAnswer,
            // Said as the admin API says it: "did not answer" sent an operator to look for a
            // database outage where its disk was full (a black-box run).
            ApiError::AdminDatabase(failure) if failure.refused_a_write() => {
                Refused::Refusing(error.to_string())
            }
            // A read that got no answer: nothing asked may still be done, so no more to say
            // than for a database that is away.
            _ => Refused::Unavailable,
        }
    }
}

impl ResponseError for Refused {
    fn status_code(&self) -> StatusCode {
        match self {
            Refused::Off => StatusCode::NOT_FOUND,
            Refused::LoggedOut(_) => StatusCode::SEE_OTHER,
            Refused::WrongToken(_) => StatusCode::UNAUTHORIZED,
            Refused::Forged => StatusCode::FORBIDDEN,
            Refused::NotMade(_) => StatusCode::BAD_REQUEST,
            Refused::Unavailable | Refused::Busy | Refused::NoAnswer | Refused::Refusing(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            Refused::Off => ApiError::NotFound.error_response(),
            Refused::LoggedOut(None) => redirect("/console/login"),
            Refused::LoggedOut(Some(back)) => redirect(&format!(
                "/console/login?next={}",
                form_urlencoded::byte_serialize(back.as_bytes()).collect::<String>()
            )),
            Refused::WrongToken(next) => login_page(
                self.status_code(),
                Some("That token was not accepted."),
                next.as_deref(),
            ),
            Refused::Forged => message(
                self.status_code(),
                "Refused",
                "This form did not come from this console session. Go back, reload the page \
                 and try again.",
            ),
            Refused::Unavailable => message(
                self.status_code(),
                "Database unreachable",
                "The database did not answer; reload the page in a moment.",
            ),
            Refused::Refusing(why) => message(
                self.status_code(),
                "The database refused",
                &format!("Nothing was changed: {why}."),
            ),
            Refused::NotMade(problem) => message(
                self.status_code(),
                "Not a form the console makes",
                &format!(
                    "This form is not one the console makes ({problem}); nothing was done. Go \
                     back and use the page's own buttons."
                ),
            ),
            Refused::NoAnswer => message(
                self.status_code(),
                "Database slow to answer",
                "The database did not answer in time; what was asked (a re-queue) may still be \
                 done once it does. Reload the page in a moment and check before trying again.",
            ),
            Refused::Busy => message(
                self.status_code(),
                "Store busy",
                "The store is busy with another write (another process or session holds its \
                 lock); nothing was changed. Try again in a moment.",
            ),
        }
    }
}

/// A console address with a path or query the console never makes (`/console/deliveries/abc/
/// requeue`, `count=-1`): 400 as a console page, or 404 as any route while the console is off.
fn not_made(problem: String, request: &actix_web::HttpRequest) -> actix_web::Error {
    let off = request
        .app_data::<web::Data<crate::state::AppState>>()
        .is_none_or(|state| state.admin_token.is_none());
    let response = if off {
        ApiError::NotFound.error_response()
    } else {
        message(
            StatusCode::BAD_REQUEST,
            "Not a console address",
            &format!(
                "This address is not one the console makes ({problem}). Go back and use the \
                 page's own links and buttons."
            ),
        )
    };
    actix_web::error::InternalError::from_response(problem, response).into()
}

/// A path under `/console` that names no page: 404 as a console page once logged in (as any
/// route while the console is off; the login form before).
async fn no_page(_: Admin<Session>) -> HttpResponse {
    message(
        StatusCode::NOT_FOUND,
        "No such page",
        "The console has no page at this address.",
    )
}

/// A console form's body, read within `[server].request_timeout` as a delivery's is: a client
/// that announces a body and never sends it gets 408, rather than holding the connection for
/// as long as it likes (found by a black-box run, on the login form, which needs no session).
pub struct FormBody(pub web::Bytes);

impl actix_web::FromRequest for FormBody {
    type Error = actix_web::Error;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, actix_web::Error>>;

    fn from_request(request: &HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        let within = crate::http::body_timeout(request);
        let body = web::Bytes::from_request(request, payload);
        Box::pin(async move {
            match tokio::time::timeout(within, body).await {
                Ok(body) => body.map(FormBody),
                Err(_) => Err(actix_web::error::InternalError::from_response(
                    "the form's body did not arrive in time",
                    message(
                        StatusCode::REQUEST_TIMEOUT,
                        "Too slow",
                        "The form did not arrive in time. Go back and send it again.",
                    ),
                )
                .into()),
            }
        })
    }
}

/// A field of a form-encoded body; empty when missing.
fn field(body: &[u8], name: &str) -> String {
    form_urlencoded::parse(body)
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Whether a POST carries the session's CSRF token.
fn check_csrf(session: &Session, body: &[u8]) -> Result<(), Refused> {
    if session.accepts(&field(body, "csrf")) {
        return Ok(());
    }
    tracing::warn!("console form refused: missing or wrong CSRF token");
    Err(Refused::Forged)
}

/// Whether a POST's form carries only the fields its form has (`takes`: `csrf` too, on every
/// form but the login), each once: a field it does not take (a misspelt `soruce`, a `target`
/// on the bulk form) would be ignored, and a second value of one (`source=&source=gh`,
/// `token=T&token=wrong`) would be, as [`field`] reads the first; either would widen what the
/// form does, so it is refused, as the console's other addresses are.
pub(crate) fn check_fields(body: &[u8], takes: &[&str]) -> Result<(), Refused> {
    let shown = |name: &str| crate::ids::ClientText::new(name, 64).to_string();
    let mut seen = std::collections::HashSet::new();
    for (name, _) in form_urlencoded::parse(body) {
        if !takes.contains(&name.as_ref()) {
            return Err(Refused::NotMade(format!(
                "this form has no field {:?}",
                shown(&name)
            )));
        }
        if !seen.insert(name.clone()) {
            return Err(Refused::NotMade(format!(
                "the field {:?} is given twice; this form sends each once",
                shown(&name)
            )));
        }
    }
    Ok(())
}

/// A page with one sentence on it and a way back to the overview.
fn message(status: StatusCode, title: &str, text: &str) -> HttpResponse {
    let main = html! {
        h1 { (title) }
        p class="error" id="message" { (text) }
        p { a href="/console" { "Overview" } }
    };
    respond(status, page(title, None, main))
}

/// The console address `address` (a path and query, as a browser asked for it) names, to be
/// led back to after logging in: the events list or an event's page, with their query; none
/// for the overview itself or anything else (a form's action, a path that is no page, an
/// address off the console), so a link can lead a login nowhere but to a page a GET shows.
pub(crate) fn back_to(address: &str) -> Option<&str> {
    /// Longer is no address the console makes (and would make the login's own URL long).
    const LONGEST: usize = 2048;
    /// The pages a link can lead to: those a GET shows (the overview needs no `next`).
    const PAGES: [&str; 2] = ["/console/events", "/console/event"];
    let (path, query) = address.split_once('?').unwrap_or((address, ""));
    let plain_query = query.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    (PAGES.contains(&path) && plain_query && address.len() <= LONGEST).then_some(address)
}

fn login_page(status: StatusCode, error: Option<&str>, next: Option<&str>) -> HttpResponse {
    let main = html! {
        h1 { "hookbox console" }
        @if let Some(error) = error {
            p class="error" id="login-error" { (error) }
        }
        form class="login" method="post" action="/console/login" {
            @if let Some(next) = next {
                input type="hidden" name="next" value=(next);
            }
            label {
                "Admin token"
                input type="password" name="token" id="token" autocomplete="current-password"
                    required autofocus;
            }
            button type="submit" id="login" { "Log in" }
        }
        p class="muted" {
            "The admin API's bearer token. It is sent once, in this form; a session cookie is \
             used from then on."
        }
    };
    respond(status, page("Log in", None, main))
}

/// `GET /console/login[?next=ADDRESS]`: the form, or on to the overview (or `next`) when
/// already logged in.
async fn login_form(
    request: HttpRequest,
    session: Result<Admin<Session>, Refused>,
) -> Result<HttpResponse, Refused> {
    let next = form_urlencoded::parse(request.query_string().as_bytes())
        .find(|(name, _)| name == "next")
        .map(|(_, value)| value.into_owned());
    let next = next.as_deref().and_then(back_to);
    match session {
        Ok(_) => Ok(redirect(next.unwrap_or("/console"))),
        Err(Refused::LoggedOut(_)) => Ok(login_page(StatusCode::OK, None, next)),
        Err(refused) => Err(refused),
    }
}

/// Whether the browser reached the console over HTTPS, so its cookie can be `Secure`.
fn over_https(request: &HttpRequest) -> bool {
    // A scheme is case-insensitive (RFC 3986): a proxy's `X-Forwarded-Proto: HTTPS` counts.
    request
        .connection_info()
        .scheme()
        .eq_ignore_ascii_case("https")
}

/// `POST /console/login` with `token=...` (and `next=ADDRESS`): a session cookie and the
/// overview (or `next`); a wrong token gets 401 and the form again ([`Admin<Login>`]).
async fn login(
    state: web::Data<AppState>,
    request: HttpRequest,
    Admin(login): Admin<Login>,
) -> HttpResponse {
    let id = state.sessions.start();
    tracing::info!("console login");
    guarded(HttpResponse::SeeOther())
        .insert_header((
            header::LOCATION,
            login.next.as_deref().unwrap_or("/console"),
        ))
        .cookie(session::cookie(id, over_https(&request)))
        .finish()
}

/// `POST /console/logout`: forgets the session and clears its cookie.
async fn logout(
    state: web::Data<AppState>,
    request: HttpRequest,
    FormBody(body): FormBody,
    Admin(session): Admin<Session>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, Refused> {
    check_csrf(&session, &body)?;
    check_fields(&body, &["csrf"])?;
    state.sessions.end(&request);
    Ok(guarded(HttpResponse::SeeOther())
        .insert_header((header::LOCATION, "/console/login"))
        .cookie(session::removal_cookie(over_https(&request)))
        .finish())
}

#[cfg(test)]
mod tests {
    use super::back_to;

    #[test]
    fn a_login_leads_back_only_to_a_console_page() {
        for page in [
            "/console/events",
            "/console/events?source=stripe&before=2026-12-05T10%3A00%3A00Z",
            "/console/event?source=stripe&id=evt_1",
        ] {
            assert_eq!(back_to(page), Some(page), "{page}");
        }
        for elsewhere in [
            "/console",
            "/console/",
            "/console?x=1",
            "/console/login",
            "/console/login?next=/console/events",
            "//evil.example/console/events",
            "https://evil.example/console/events",
            "/console//evil.example",
            "/console/../admin/events",
            "/console/%2e%2e/admin/events",
            "/consoleevil",
            "/admin/events",
            "/console/event?id=a\\b",
            "/console/event?id=a b",
            "/console/logout",
            "/console/nosuch",
            "/console/deliveries/2/requeue",
            "/console/events/redeliver",
            "/console/events/",
        ] {
            assert_eq!(back_to(elsewhere), None, "{elsewhere}");
        }
        assert_eq!(
            back_to(&format!("/console/event?id={}", "x".repeat(3000))),
            None
        );
    }
}
