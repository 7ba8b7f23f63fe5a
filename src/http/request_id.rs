//! Every request runs in a span named `request` that carries its own request id (a UUID made by
//! tracing-actix-web), and the answer carries the same id in `X-Request-Id`, so an operator can
//! find the log lines of a delivery that a provider reports as failed.
//!
//! An incoming `X-Request-Id` is not taken: anyone may send one, and an id the client chose
//! could point an operator at another request's lines.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};

/// The response header that carries the request id.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The most of a request's path a log line shows, in characters: enough for any of hookbox's
/// own paths with an event id, and a 60 KB path cannot make each of its lines 60 KB.
const MAX_LOGGED_PATH: usize = 400;

/// Builds the `request` span: the request id, the method and the path, and nothing else, since
/// every log line of the request repeats its span's fields.
pub struct RequestSpan;

impl RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let id = request.extensions().get::<RequestId>().copied();
        // At ERROR level, so the span (and the id on each line) is there whatever level
        // `RUST_LOG` lets through; a span alone prints nothing.
        tracing::error_span!(
            "request",
            request_id = %id.map(|id| id.to_string()).unwrap_or_default(),
            method = %request.method(),
            path = %crate::ids::ClientText::new(request.path(), MAX_LOGGED_PATH),
        )
    }

    /// Nothing more is recorded or logged at the end: the code that handled a failure has
    /// logged it, once.
    fn on_request_end<B: MessageBody>(
        _span: Span,
        _outcome: &Result<ServiceResponse<B>, actix_web::Error>,
    ) {
    }
}

/// Puts the request id in the answer's `X-Request-Id` header.
pub async fn answer_with_id(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let id = request.extensions().get::<RequestId>().copied();
    let mut response = next.call(request).await?;
    if let Some(id) = id {
        let value =
            HeaderValue::from_str(&id.to_string()).expect("a UUID's text is a valid header value");
        response.headers_mut().insert(HEADER, value);
    }
    Ok(response)
}
