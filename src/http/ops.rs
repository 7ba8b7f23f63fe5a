//! `/healthz`, `/readyz` and `/metrics`.

use actix_web::{web, HttpResponse};
use diesel::RunQueryDsl;

use crate::db;
use crate::http::ApiError;
use crate::startup::AppState;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// The database is reachable and every migration is applied; 503 otherwise.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let migrated = web::block(move || -> anyhow::Result<bool> {
        // A cheap statement first, so a connection that died is noticed, dropped and replaced.
        db::with_connection_retried(&state.pool, |conn| {
            diesel::sql_query("SELECT 1").execute(conn)
        })?;
        db::is_migrated(&mut *state.pool.get()?)
    })
    .await
    .map_err(|_| ApiError::Unavailable)?;
    match migrated {
        Ok(true) => Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ready"}))),
        Ok(false) => {
            tracing::warn!("not ready: migrations are pending (run hookbox migrate)");
            Err(ApiError::Unavailable)
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "not ready: the database is unreachable");
            Err(ApiError::Unavailable)
        }
    }
}

/// Prometheus text.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
