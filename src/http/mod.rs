//! The HTTP surface: routes, the webhook endpoint, operations endpoints and the admin API.

mod admin;
pub mod error;
mod observe;
mod ops;
mod webhook;

use actix_web::web;

pub use error::ApiError;

/// Mounts every route.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(web::QueryConfig::default().error_handler(|e, _| {
        ApiError::InvalidQuery(format!("the query string is not valid: {e}")).into()
    }))
    .route("/webhooks/{source}", web::post().to(webhook::receive))
    .route("/healthz", web::get().to(ops::healthz))
    .route("/readyz", web::get().to(ops::readyz))
    .route("/metrics", web::get().to(ops::metrics))
    .route("/admin/events", web::get().to(admin::list_events))
    .route(
        "/admin/events/{source}/{event_id}",
        web::get().to(admin::get_event),
    )
    .route(
        "/admin/events/{source}/{event_id}/deliveries",
        web::get().to(admin::event_deliveries),
    )
    .route(
        "/admin/deliveries/{id}/requeue",
        web::post().to(admin::requeue_delivery),
    )
    .default_service(web::to(|| async {
        Err::<actix_web::HttpResponse, _>(ApiError::NotFound)
    }));
}
