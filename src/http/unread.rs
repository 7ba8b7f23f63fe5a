//! A request body its handler did not read to the end is kept until the answer has gone out,
//! so that actix closes the connection after the answer.
//!
//! Dropped with the handler, an unread chunked body is drained on the connection instead (to
//! keep it alive for the next request), for as long as the client keeps sending or keeps the
//! connection open: a client that never sends the last chunk held a socket, and a file
//! descriptor, for ever, after any answer that comes before the body is read (404
//! `unknown_source`, 405, 413, the admin API's 401, `GET /healthz`; found by a black-box run,
//! 300 such connections left a server at 256 descriptors answering nothing). A body with a
//! `Content-Length` is closed either way.
//!
//! A request with `Upgrade: websocket` is read to its `Content-Length` (see
//! [`websocket_upgrade_length`]).

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::HttpMessage;
use futures_util::Stream;

/// How long an unread body is kept after its handler returned: past the answer's write, which
/// follows the handler at once.
const UNREAD_HELD: Duration = Duration::from_secs(1);

/// The request's body, and whether its reader saw its end (or an error, after which the
/// connection closes anyway).
struct Body {
    payload: Payload,
    ended: bool,
}

/// What the handler reads: the body, through the middleware's hold on it.
struct Held(Rc<RefCell<Body>>);

impl Stream for Held {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut body = self.0.borrow_mut();
        let polled = Pin::new(&mut body.payload).poll_next(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            body.ended = true;
        }
        polled
    }
}

/// Runs the request, and keeps its body a moment longer when the handler left it unread.
pub async fn close_unread(
    mut request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let mut payload = request.take_payload();
    if matches!(payload, Payload::None) {
        return next.call(request).await;
    }
    if let Some(length) = websocket_upgrade_length(&request) {
        payload = Payload::Stream {
            payload: Box::pin(first_bytes(payload, length)),
        };
    }
    let body = Rc::new(RefCell::new(Body {
        payload,
        ended: false,
    }));
    request.set_payload(Payload::Stream {
        payload: Box::pin(Held(body.clone())),
    });
    let answer = next.call(request).await;
    if !body.borrow().ended {
        actix_web::rt::spawn(async move {
            tokio::time::sleep(UNREAD_HELD).await;
            drop(body);
        });
    }
    answer
}

/// For a request with `Upgrade: websocket` (and no chunked body), the length its
/// `Content-Length` gives (none: 0). actix reads such a request's body as the WebSocket's
/// stream, to the connection's end, whatever its `Content-Length`, so a delivery that carried
/// the header waited out `request_timeout` and was answered 408 (found by a black-box run);
/// hookbox upgrades nothing, and reads the body the request says it has.
fn websocket_upgrade_length(request: &ServiceRequest) -> Option<u64> {
    use actix_web::http::header::{CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
    let headers = request.headers();
    // Any of them, as actix reads them.
    let websocket = headers
        .get_all(UPGRADE)
        .any(|value| value.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !websocket || headers.contains_key(TRANSFER_ENCODING) {
        return None;
    }
    Some(
        headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0),
    )
}

/// The first `length` bytes of `payload`, then its end.
fn first_bytes(
    payload: Payload,
    length: u64,
) -> impl Stream<Item = Result<Bytes, PayloadError>> + 'static {
    futures_util::stream::unfold((payload, length), |(mut payload, left)| async move {
        if left == 0 {
            return None;
        }
        match futures_util::StreamExt::next(&mut payload).await? {
            Ok(mut chunk) => {
                let taken = usize::try_from(left).map_or(chunk.len(), |left| chunk.len().min(left));
                chunk.truncate(taken);
                let left = left - u64::try_from(taken).unwrap_or(left);
                Some((Ok(chunk), (payload, left)))
            }
            Err(e) => Some((Err(e), (payload, 0))),
        }
    })
}
