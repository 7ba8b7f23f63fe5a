//! The HTTP surface: routes, the webhook endpoint, operations endpoints, the admin API and the
//! operator console.

mod admin;
mod auth;
mod console;
pub mod error;
mod observe;
mod ops;
mod request_id;
mod webhook;

use actix_web::web;
use diesel::QueryResult;

use crate::db::{self, AnyConnection};
use crate::state::AppState;

pub use console::Sessions;
pub use error::ApiError;
pub use request_id::{answer_with_id, RequestSpan};
pub use webhook::{refused, refused_by};

/// Runs `work` on a blocking thread with a pooled connection (again on a fresh one if that
/// one turns out dead, so `work` must be safe to repeat). A failure is logged once, as `what`
/// failing, and answered 503 `unavailable`.
pub(crate) async fn with_db<T: Send + 'static>(
    state: &web::Data<AppState>,
    what: &'static str,
    work: impl FnMut(&mut AnyConnection) -> QueryResult<T> + Send + 'static,
) -> Result<T, ApiError> {
    let state = state.clone();
    web::block(move || db::with_connection_retried(&state.pool, work))
        .await
        .map_err(|_| ApiError::Unavailable)?
        .map_err(|e| {
            tracing::warn!(error = %e, "{what} failed");
            ApiError::Unavailable
        })
}

/// Mounts every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|e, _| {
        ApiError::InvalidQuery(format!("the query string is not valid: {e}")).into()
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
            // Any other method is answered as every unknown route is, as it was before the
            // GET handshake existed.
            .default_service(web::to(not_found)),
    )
    .service(only("/healthz", web::get().to(ops::healthz)))
    .service(only("/readyz", web::get().to(ops::readyz)))
    .service(only("/metrics", web::get().to(ops::metrics)))
    .service(only("/admin/events", web::get().to(admin::list_events)))
    .service(only(
        "/admin/events/{source}/{event_id}",
        web::get().to(admin::get_event),
    ))
    .service(only(
        "/admin/events/{source}/{event_id}/deliveries",
        web::get().to(admin::event_deliveries),
    ))
    .service(only(
        "/admin/events/{source}/{event_id}/redeliver",
        web::post().to(admin::redeliver_event),
    ))
    .service(only(
        "/admin/deliveries/requeue",
        web::post().to(admin::requeue_dead),
    ))
    .service(only(
        "/admin/deliveries/{id}/requeue",
        web::post().to(admin::requeue_delivery),
    ))
    .configure(console::routes)
    .default_service(web::to(not_found));
}

/// `path` answered by `route` alone: any other method there is answered as an unknown route is
/// (404 `not_found`, JSON), not with actix's bare 405.
fn only(path: &str, route: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(not_found))
}

/// The answer to a path or method no route takes: 404 `not_found`.
async fn not_found() -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}
