//! The HTTP surface: routes, the webhook endpoint, operations endpoints, the admin API and the
//! operator console.

mod admin;
mod auth;
mod console;
pub mod error;
mod observe;
mod ops;
mod request_id;
mod unread;
mod webhook;

use actix_web::web;
use diesel::QueryResult;

use crate::db::{self, AnyConnection};
use crate::state::AppState;

pub use auth::WrongTokens;
pub use console::Sessions;
pub use error::ApiError;
pub use request_id::{answer_with_id, RequestSpan};
pub use unread::close_unread;
pub use webhook::{refused, refused_by};

/// [`with_db`] for work that only reads: past the request timeout it is
/// [`ApiError::SlowRead`], whose sentence speaks of no change that may still be made.
pub(crate) async fn read_db<T: Send + 'static>(
    state: &web::Data<AppState>,
    what: &'static str,
    work: impl FnMut(&mut AnyConnection) -> QueryResult<T> + Send + 'static,
) -> Result<T, ApiError> {
    with_db(state, what, work).await.map_err(|e| match e {
        ApiError::NoAnswer => ApiError::SlowRead,
        other => other,
    })
}

/// Runs `work` on a blocking thread with a pooled connection (again on a fresh one if that
/// one turns out dead, so `work` must be safe to repeat), within `[server].request_timeout`
/// as a delivery's database work: a database that stops answering (a frozen host, a
/// black-holed network) gets the admin API and the console a 503 in time instead of a request
/// left open for ever (found by a black-box run). A failure is logged once, as `what`
/// failing, and answered 503 `unavailable`.
pub(crate) async fn with_db<T: Send + 'static>(
    state: &web::Data<AppState>,
    what: &'static str,
    work: impl FnMut(&mut AnyConnection) -> QueryResult<T> + Send + 'static,
) -> Result<T, ApiError> {
    let within = state.request_timeout;
    let state = state.clone();
    let worked = tokio::time::timeout(
        within,
        web::block(move || db::with_connection_retried(&state.pool, work)),
    )
    .await
    .map_err(|_| {
        // The thread waits on; what it asked may still be done once the database answers.
        tracing::warn!(
            "{what} got no answer from the database within server.request_timeout ({})",
            crate::config::Spelt(within)
        );
        ApiError::NoAnswer
    })?;
    worked
        .map_err(|_| ApiError::AdminDatabase(db::Failure::Unreachable))?
        .map_err(|e| {
            tracing::warn!(error = %e, "{what} failed");
            match &e {
                db::DbError::Unavailable(_) => ApiError::AdminDatabase(db::Failure::Unreachable),
                // Another writer held the lock past the wait: SQLite's write lock (another
                // process writing), or a table another PostgreSQL session locked.
                db::DbError::Query(query) if db::is_lock_timeout(query) => ApiError::Busy,
                db::DbError::Query(query) => ApiError::AdminDatabase(db::Failure::of(query)),
            }
        })
}

/// How long a request's body may take to arrive (`[server].request_timeout`), for an
/// extractor that reads one; every request is served with the state, and the default is only
/// a fallback for a test that builds a bare request.
pub(crate) fn body_timeout(request: &actix_web::HttpRequest) -> std::time::Duration {
    request
        .app_data::<web::Data<AppState>>()
        .map_or(std::time::Duration::from_secs(30), |state| {
            state.request_timeout
        })
}

/// What is wrong with a query string, in the words of the parser underneath (`unknown field
/// `soruce``, `duplicate field `source``), without actix's own prefix for it.
pub(crate) fn query_problem(error: &actix_web::error::QueryPayloadError) -> String {
    let text = error.to_string();
    text.strip_prefix("Query deserialize error: ")
        .map_or_else(|| text.clone(), str::to_owned)
}

/// Mounts every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|e, _| {
        ApiError::InvalidQuery(format!(
            "the query string is not valid: {}",
            query_problem(&e)
        ))
        .into()
    }))
    .service(
        web::resource("/webhooks/{source}")
            .route(web::post().to(webhook::receive))
            // Only for a source whose provider sends a GET handshake.
            .route(
                web::get()
                    .guard(actix_web::guard::fn_guard(webhook::answers_get))
                    .to(webhook::receive),
            )
            .default_service(web::to(webhook::other_method)),
    )
    .service(readable("/healthz", ops::healthz, anyone("GET, HEAD")))
    .service(readable("/readyz", ops::readyz, anyone("GET, HEAD")))
    .service(readable("/metrics", ops::metrics, anyone("GET, HEAD")))
    .service(
        readable("/admin/events", admin::list_events, admins("GET, HEAD"))
            .wrap(admin_headers())
            .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .service(
        readable(
            "/admin/events/{source}/{event_id}",
            admin::get_event,
            admins("GET, HEAD"),
        )
        .wrap(admin_headers())
        .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .service(
        readable(
            "/admin/events/{source}/{event_id}/deliveries",
            admin::event_deliveries,
            admins("GET, HEAD"),
        )
        .wrap(admin_headers())
        .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .service(
        post_only(
            "/admin/events/{source}/{event_id}/redeliver",
            admin::redeliver_event,
            admins("POST"),
        )
        .wrap(admin_headers())
        .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .service(
        post_only(
            "/admin/deliveries/requeue",
            admin::requeue_dead,
            admins("POST"),
        )
        .wrap(admin_headers())
        .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .service(
        post_only(
            "/admin/deliveries/{id}/requeue",
            admin::requeue_delivery,
            admins("POST"),
        )
        .wrap(admin_headers())
        .wrap(actix_web::middleware::from_fn(auth::pace_wrong_tokens)),
    )
    .configure(console::routes)
    .default_service(web::to(not_found));
}

/// The headers of every admin API answer: they hold payloads, kept signatures and delivery
/// errors, so no cache keeps one, and no browser reads one as another type.
fn admin_headers() -> actix_web::middleware::DefaultHeaders {
    use actix_web::http::header::{CACHE_CONTROL, X_CONTENT_TYPE_OPTIONS};
    actix_web::middleware::DefaultHeaders::new()
        .add((CACHE_CONTROL, "no-store"))
        .add((X_CONTENT_TYPE_OPTIONS, "nosniff"))
}

/// `path` answered by `handler` for `GET` and `HEAD` (a load balancer's health check may use
/// either; the server sends a `HEAD` answer's headers without its body), and by `others` for
/// any other method.
fn readable<F, Args>(path: &str, handler: F, others: actix_web::Route) -> actix_web::Resource
where
    F: actix_web::Handler<Args> + Clone,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler.clone()))
        .route(web::head().to(handler))
        .default_service(others)
}

/// `path` answered by `handler` for `POST`, and by `others` for any other method.
fn post_only<F, Args>(path: &str, handler: F, others: actix_web::Route) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::post().to(handler))
        .default_service(others)
}

/// A method the path does not take, from anyone: 405 `method_not_allowed`, JSON, with `Allow`.
fn anyone(allow: &'static str) -> actix_web::Route {
    web::to(move || not_allowed(allow))
}

/// A method an admin route does not take: answered as the route's own methods are until the
/// token is shown (404 while no token is configured, 401 for a wrong one), then 405 as
/// [`anyone`].
fn admins(allow: &'static str) -> actix_web::Route {
    web::to(move |_: auth::Admin<auth::Bearer>| not_allowed(allow))
}

/// The answer to a method a path does not take: 405, naming the methods it does.
async fn not_allowed(allow: &'static str) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed(allow))
}

/// The answer to a path or method no route takes: 404 `not_found`.
async fn not_found(request: actix_web::HttpRequest) -> actix_web::HttpResponse {
    use actix_web::http::header::{HeaderValue, CACHE_CONTROL, X_CONTENT_TYPE_OPTIONS};
    use actix_web::ResponseError;
    let mut answer = if request.path().starts_with("/webhooks/") || request.path() == "/webhooks" {
        ApiError::NotAWebhookPath.error_response()
    } else {
        ApiError::NotFound.error_response()
    };
    // A path under /admin that is no route is answered as the admin API's answers are.
    if request.path() == "/admin" || request.path().starts_with("/admin/") {
        let headers = answer.headers_mut();
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    }
    answer
}
