//! `/healthz`, `/readyz` and `/metrics`.

use actix_web::{web, HttpResponse};
use diesel::RunQueryDsl;

use crate::db;
use crate::http::ApiError;
use crate::state::AppState;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// The longest `/readyz` waits for the database (less when `server.request_timeout` is): a
/// load balancer's or an orchestrator's probe gives up after a few seconds (Kubernetes after
/// one, an AWS load balancer after five), and one that waited out a 30 s request timeout
/// while the database was cut off learnt nothing but its own timeout (a black-box run).
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Why `/readyz` is not ready.
enum NotReady {
    Unreachable(String),
    Pending,
    Failed(db::Failure, String),
    /// PostgreSQL's lock timeout on a table another session holds (a migration, `LOCK TABLE`).
    Locked(String),
}

/// The database is reachable, every migration is applied and the store takes a write (an event
/// inserted and updated, rolled back: the privileges a claim needs), and no delivery failed
/// for a full disk lately (`LastDiskFull`); 503 otherwise, also when
/// the check has no answer within [`READY_WITHIN`] (a stalled database: the check's
/// thread goes on, and the next probe checks afresh). The 503's message says which, as the
/// WARN it logs does.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if let Some(file) = state.store_file.as_ref().filter(|file| !file.still_there()) {
        tracing::warn!(
            path = %file.path().display(),
            "not ready: the SQLite file was deleted or replaced while serve runs; what is \
             stored now goes to the file serve opened, which is gone when it stops (restart \
             serve on the file you mean to keep)"
        );
        return Err(ApiError::NotReady(
            "the SQLite file was deleted or replaced while serve runs (restart serve)",
        ));
    }
    if let Some(ago) = state.disk_full.lately() {
        tracing::warn!(
            "not ready: a delivery failed {} ago because the database's disk is full; free \
             space on the database's disk (ready again {} after the last such failure)",
            crate::config::Spelt(std::time::Duration::from_secs(ago.as_secs())),
            crate::config::Spelt(crate::state::LastDiskFull::REMEMBERED)
        );
        return Err(ApiError::NotReady(
            "the database's disk is full: a delivery failed for it within the last 30 s",
        ));
    }
    let within = state.request_timeout.min(READY_WITHIN);
    let checking = web::block(move || -> Result<(), NotReady> {
        // A cheap statement first, so a connection that died is noticed, dropped and replaced.
        db::with_connection_retried(&state.pool, |conn| {
            diesel::sql_query("SELECT 1").execute(conn)
        })
        .map_err(|e| NotReady::Unreachable(e.to_string()))?;
        let mut conn = state
            .pool
            .get()
            .map_err(|e| NotReady::Unreachable(e.to_string()))?;
        match db::is_migrated(&mut conn) {
            Ok(true) => {}
            Ok(false) => return Err(NotReady::Pending),
            // Its table locked by another session: a migration under way, most likely.
            Err(e)
                if e.downcast_ref::<diesel::result::Error>()
                    .is_some_and(db::is_lock_timeout) =>
            {
                return Err(NotReady::Locked(format!("{e:#}")))
            }
            // The connection lost as the database restarts is told as unreachable, not as a
            // store that does not take a write (a black-box run).
            Err(e) => {
                let failure = e
                    .downcast_ref::<diesel::result::Error>()
                    .map_or(db::Failure::Other, db::Failure::of);
                return Err(NotReady::Failed(failure, format!("{e:#}")));
            }
        }
        db::events::takes_writes(&mut conn).map_err(|e| {
            if db::is_lock_timeout(&e) && db::tables_locked(&mut conn) {
                NotReady::Locked(e.to_string())
            } else {
                NotReady::Failed(db::Failure::of(&e), e.to_string())
            }
        })
    });
    let Ok(checked) = tokio::time::timeout(within, checking).await else {
        tracing::warn!(
            "not ready: the database did not answer within {} (the readiness check's bound: \
             server.request_timeout, and at most 5 s)",
            crate::config::Spelt(within)
        );
        return Err(ApiError::NotReady(
            "the database did not answer the readiness check within its bound \
             (server.request_timeout, at most 5 s)",
        ));
    };
    let checked = checked.map_err(|_| ApiError::NotReady("the check could not run"))?;
    let (why, error) = match checked {
        Ok(()) => return Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ready"}))),
        Err(NotReady::Pending) => (
            "migrations are pending (run hookbox migrate, or restart serve, which applies them)",
            None,
        ),
        Err(NotReady::Unreachable(e) | NotReady::Failed(db::Failure::Unreachable, e)) => {
            ("the database is unreachable", Some(e))
        }
        Err(NotReady::Locked(e)) => (
            "hookbox's tables are locked by another database session (a migration, a LOCK \
             TABLE); it is ready again when that session lets go",
            Some(e),
        ),
        Err(NotReady::Failed(failure, e)) => (
            match failure {
                db::Failure::Permission => "the database refuses hookbox permission to write",
                db::Failure::Full => "the database's disk is full",
                db::Failure::Io => "the database could not write its file (an I/O error)",
                db::Failure::Damaged => {
                    "the database's file is damaged (SQLite reads it as malformed)"
                }
                db::Failure::Refused => "the database refused the check's write",
                db::Failure::Unreachable | db::Failure::Other => {
                    "the store does not take a write (the log has the database's error)"
                }
            },
            Some(e),
        ),
    };
    match error {
        Some(e) => tracing::warn!(error = %e, "not ready: {why}"),
        None => tracing::warn!("not ready: {why}"),
    }
    Err(ApiError::NotReady(why))
}

/// Prometheus text.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}
