//! The one place an error becomes an HTTP answer: each variant's status and error code, as the
//! contract's table gives them. Bodies are `{"error": code, "message": sentence}` and never
//! carry a signature, a secret or a header value.

use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use crate::db::Failure;
use crate::ids::EventIdError;

/// Every way a request can be refused or fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 404 `unknown_source`.
    #[error("no source of that name is configured")]
    UnknownSource,
    /// 408 `request_timeout`: the body did not arrive within `[server].request_timeout`.
    #[error("the request body did not arrive in time")]
    RequestTimeout,
    /// 413 `payload_too_large`.
    #[error("the body is larger than the {0} bytes this server accepts")]
    PayloadTooLarge(usize),
    /// 401 `invalid_signature`.
    #[error(
        "the signature is missing or does not match, or a header it signs (its timestamp) cannot be read"
    )]
    InvalidSignature,
    /// 401 `stale_timestamp`.
    #[error("the signed timestamp is outside the allowed tolerance")]
    StaleTimestamp,
    /// 400 `malformed_payload`.
    #[error("the body could not be read as the JSON this scheme needs")]
    MalformedPayload,
    /// 400 `malformed_payload`: the request is not what the provider sends (a handshake's
    /// parameters, a body that is no event of the provider's); the sentence says which.
    #[error("{0}")]
    Malformed(&'static str),
    /// 400 `malformed_payload`: the body itself could not be read (a broken chunked encoding,
    /// or a chunked body whose connection ended), whatever the scheme.
    #[error("the body could not be read: its chunked encoding is broken or it was cut short")]
    UnreadableBody,
    /// 400 `malformed_payload`: the connection ended before the whole body its `Content-Length`
    /// announced arrived (the client hung up, or closed its side after part of it). Counted as
    /// `incomplete`, not as a refusal: no provider's request was refused, a connection was lost.
    #[error("the body could not be read: the connection ended before all of it arrived")]
    CutShort,
    /// 400 `missing_event_id`.
    #[error(
        "the delivery carries no event id where this scheme reads it (a string, or a \
         whole number that fits in 64 bits)"
    )]
    MissingEventId,
    /// 400 `invalid_event_id`.
    #[error("{0}")]
    InvalidEventId(EventIdError),
    /// 422 `event_id_reused`.
    #[error("this event id was already stored with a different payload")]
    EventIdReused,
    /// 409 `in_progress`, with `Retry-After`.
    #[error("another delivery of this event is still being processed; retry later")]
    InProgress(Duration),
    /// 500 `processing_failed`.
    #[error("processing the event failed; nothing was stored, so a retry processes it again")]
    ProcessingFailed,
    /// 409 `in_progress`, with `Retry-After`: on SQLite, the write lock stayed with another
    /// writer (perhaps another delivery of this event, perhaps another event) past the wait.
    #[error("the store is busy with another write (SQLite has one writer at a time); nothing was stored, retry later")]
    StoreBusy(Duration),
    /// 503 `unavailable`, with `Retry-After`.
    #[error("the database is unreachable; nothing was stored, retry later")]
    Unavailable,
    /// 503 `unavailable`, with `Retry-After`: the claim waited past the in-flight wait for a
    /// table another session holds locked, not for a duplicate.
    #[error("hookbox's tables are locked by another database session (a migration, a LOCK TABLE); nothing was stored, retry later")]
    TablesLocked,
    /// 503 `unavailable`, with `Retry-After`: the database took the claim but did not answer
    /// within the request timeout. Its transaction may still commit, so the sentence does not
    /// say that nothing was stored.
    #[error("the database did not answer within the request timeout; the event may still be stored when it does, and a retry gets the stored answer, so retry later")]
    Unanswered,
    /// 503 `unavailable`, with `Retry-After`: the SQLite file serve opened was deleted or
    /// replaced under it, so what it stores now is gone when it stops.
    #[error("the store's file was deleted or replaced while the server runs; nothing is kept until it is restarted on the file to keep, so retry later")]
    StoreGone,
    /// 503 `unavailable`, with `Retry-After`: an admin or console read got no answer from the
    /// database within the request timeout.
    #[error("the database did not answer within the request timeout; retry later")]
    SlowRead,
    /// 503 `unavailable`, with `Retry-After`: an admin or console request's database work got
    /// no answer within the request timeout. A change it asked for may still be made.
    #[error("the database did not answer within the request timeout; retry later (a change asked for may still be made once it answers)")]
    NoAnswer,
    /// 503 `unavailable`, with `Retry-After`: something the check needs from the provider (a
    /// certificate) or a request to it (SNS's subscription confirmation) failed; the sentence
    /// says which. Not the database's fault, so not its sentence.
    #[error("{0}")]
    NotFetched(&'static str),
    /// 503 `unavailable`, with `Retry-After`: the database answered, but failed the statement.
    #[error("{}; nothing was stored, retry later{}", database_cause(*.0), retry_when(*.0))]
    Database(Failure),
    /// 503 `unavailable`, with `Retry-After`: an admin or console request's database work
    /// failed, or the database was unreachable. Its sentence says nothing of storing (it read,
    /// or asked for a change, not for an event to be stored).
    #[error("{}; retry later{}", database_cause(*.0), retry_when(*.0))]
    AdminDatabase(Failure),
    /// 503 `unavailable`, with `Retry-After`: an admin or console request waited past the
    /// lock wait for another writer (SQLite's write lock held by another process, a table
    /// another PostgreSQL session locked).
    #[error("the store is busy with another write (another process or session holds its lock); nothing was changed, retry later")]
    Busy,
    /// 503 `unavailable`, with `Retry-After`, from `/readyz`: why this instance is not ready,
    /// in a probe's words (it stores nothing, so its sentence says nothing of storing).
    #[error("not ready: {0}")]
    NotReady(&'static str),
    /// 401 `unauthorized` (admin API).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 403 `forbidden`: a handshake refused (Meta's verification request); the sentence says
    /// why.
    #[error("{0}")]
    Forbidden(&'static str),
    /// 404 `not_found`.
    #[error("nothing is here")]
    NotFound,
    /// 404 `not_found`: a path under `/webhooks/` that names no source's route (a trailing
    /// slash, a path below it); the sentence says where deliveries go.
    #[error("nothing is here: deliveries go to POST /webhooks/{{source}}, with nothing after the source's name (not even a /)")]
    NotAWebhookPath,
    /// 404 `not_found` from the admin API: the sentence names what is not stored.
    #[error("{0}")]
    NotStored(String),
    /// 404 `not_found`: a redeliver names a target the source's config does not have (a
    /// delivery queued to it would wait for a target no instance sends to). The sentence says
    /// which targets there are.
    #[error("{0}")]
    UnknownTarget(String),
    /// 405 `method_not_allowed`, with `Allow`: the path exists, but not for this method. The
    /// value is the `Allow` header's (`"POST"`, `"GET, HEAD"`).
    #[error("this path takes {0} only")]
    MethodNotAllowed(&'static str),
    /// 400 `invalid_query` (admin API).
    #[error("{0}")]
    InvalidQuery(String),
    /// 409 `not_dead` (admin API): only a dead-lettered delivery can be re-queued.
    #[error("the delivery is {0}, not dead; only a dead delivery can be re-queued")]
    NotDead(String),
    /// A refusal with the status its provider asks for (GoCardless's `498` for a wrong
    /// signature), and the error code and message of the refusal.
    #[error("{error}")]
    ProviderStatus {
        /// The refusal.
        error: Box<ApiError>,
        /// The provider's status for it.
        status: StatusCode,
    },
}

/// What a failure the database answered with was, never its own message (which may quote a
/// value of the delivery); each variant that carries one says what follows from it.
fn database_cause(failure: Failure) -> &'static str {
    match failure {
        Failure::Unreachable => "the database is unreachable",
        Failure::Permission => "the database refused hookbox a permission it needs",
        Failure::Refused => "the database refused a value of this request",
        Failure::Full => "the database's disk is full",
        Failure::Io => {
            "the database could not write its file (an I/O error: a file-size limit or a failing disk)"
        }
        Failure::Damaged => "the database's file is damaged (SQLite reads it as malformed)",
        Failure::Other => "the database failed the request or is not set up (migrations pending)",
    }
}

/// When a retry may work, where the cause says more than "later".
fn retry_when(failure: Failure) -> &'static str {
    match failure {
        Failure::Full => ", once space is freed on its disk",
        Failure::Damaged => ", once it is mended (docs/stores.md, Backups)",
        _ => "",
    }
}

/// The error code an answer carries, kept in the response's extensions so what observes the
/// answers (the console's per-minute counts) can tell refusals apart without parsing the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// How long a provider is asked to wait after a 503.
const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 5;

impl ApiError {
    /// Whether a delivery's 503 is the store's failure (unreachable, failing its statements,
    /// locked, not answering in time, its file gone), not a provider's (a certificate).
    pub fn is_the_stores(&self) -> bool {
        matches!(
            self,
            ApiError::Unavailable
                | ApiError::TablesLocked
                | ApiError::Unanswered
                | ApiError::StoreGone
                | ApiError::Database(_)
        )
    }

    /// The contract's error code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::UnknownSource => "unknown_source",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::InvalidSignature => "invalid_signature",
            ApiError::StaleTimestamp => "stale_timestamp",
            ApiError::MalformedPayload
            | ApiError::Malformed(_)
            | ApiError::UnreadableBody
            | ApiError::CutShort => "malformed_payload",
            ApiError::MissingEventId | ApiError::InvalidEventId(EventIdError::Missing) => {
                "missing_event_id"
            }
            ApiError::InvalidEventId(_) => "invalid_event_id",
            ApiError::EventIdReused => "event_id_reused",
            ApiError::InProgress(_) | ApiError::StoreBusy(_) => "in_progress",
            ApiError::ProcessingFailed => "processing_failed",
            ApiError::Unavailable
            | ApiError::TablesLocked
            | ApiError::Unanswered
            | ApiError::StoreGone
            | ApiError::SlowRead
            | ApiError::NoAnswer
            | ApiError::NotFetched(_)
            | ApiError::Database(_)
            | ApiError::AdminDatabase(_)
            | ApiError::Busy
            | ApiError::NotReady(_) => "unavailable",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound
            | ApiError::NotAWebhookPath
            | ApiError::NotStored(_)
            | ApiError::UnknownTarget(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::InvalidQuery(_) => "invalid_query",
            ApiError::NotDead(_) => "not_dead",
            ApiError::ProviderStatus { error, .. } => error.code(),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            // Rounded up: a retry sooner than the wait would meet the same wait (1500ms said 1).
            ApiError::InProgress(wait) | ApiError::StoreBusy(wait) => {
                Some((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1))
            }
            ApiError::Unavailable
            | ApiError::TablesLocked
            | ApiError::Unanswered
            | ApiError::StoreGone
            | ApiError::SlowRead
            | ApiError::NoAnswer
            | ApiError::NotFetched(_)
            | ApiError::Database(_)
            | ApiError::AdminDatabase(_)
            | ApiError::Busy
            | ApiError::NotReady(_) => Some(UNAVAILABLE_RETRY_AFTER_SECS),
            ApiError::ProviderStatus { error, .. } => error.retry_after(),
            _ => None,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::UnknownSource
            | ApiError::NotFound
            | ApiError::NotAWebhookPath
            | ApiError::NotStored(_)
            | ApiError::UnknownTarget(_) => StatusCode::NOT_FOUND,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::InvalidSignature | ApiError::StaleTimestamp | ApiError::Unauthorized => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::MalformedPayload
            | ApiError::Malformed(_)
            | ApiError::UnreadableBody
            | ApiError::CutShort
            | ApiError::MissingEventId
            | ApiError::InvalidEventId(_)
            | ApiError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::EventIdReused => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::InProgress(_) | ApiError::StoreBusy(_) | ApiError::NotDead(_) => {
                StatusCode::CONFLICT
            }
            ApiError::ProcessingFailed => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable
            | ApiError::TablesLocked
            | ApiError::Unanswered
            | ApiError::StoreGone
            | ApiError::SlowRead
            | ApiError::NoAnswer
            | ApiError::NotFetched(_)
            | ApiError::Database(_)
            | ApiError::AdminDatabase(_)
            | ApiError::Busy
            | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::ProviderStatus { status, .. } => *status,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if let Some(seconds) = self.retry_after() {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        if matches!(self, ApiError::Unauthorized) {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if let ApiError::MethodNotAllowed(allow) = self {
            response.insert_header((header::ALLOW, *allow));
        }
        response.extensions_mut().insert(ErrorCode(self.code()));
        response.json(serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_409_asks_for_at_least_the_whole_wait_rounded_up() {
        let after = |wait: Duration| ApiError::InProgress(wait).retry_after();
        assert_eq!(after(Duration::from_millis(1500)), Some(2));
        assert_eq!(after(Duration::from_secs(3)), Some(3));
        assert_eq!(after(Duration::from_millis(200)), Some(1));
        assert_eq!(
            ApiError::StoreBusy(Duration::from_millis(2001)).retry_after(),
            Some(3)
        );
    }
}
