//! Logging: human-readable lines on stderr, filtered by `RUST_LOG` (default `info`).
//!
//! actix-http logs at ERROR when it cannot read a request off a connection (`stream error:
//! ...`: a malformed head, a head too large, a connection cut mid-request). That is a client's
//! mistake, not hookbox's, and anyone can trigger it at will, so those lines are taken out of
//! the log and reported here instead: at most one WARN a minute (with how many were not shown
//! since the last), and each one at DEBUG. actix-http's other errors on a connection stay
//! ERROR.
//!
//! A handler's panic is caught by the claim ([`catch_panic`]) and answered 500; that answer's
//! log line says what panicked and where, so the panic hook prints nothing for it (it would be
//! a second report of the same failure). Any other panic is printed as usual.

use std::cell::{Cell, RefCell};
use std::io::IsTerminal;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// What is logged when `RUST_LOG` is not set.
const DEFAULT_FILTER: &str = "info,actix_server=warn,async_nats=warn,lapin=off";

/// Where actix-http logs what goes wrong on one HTTP/1 connection.
const CONNECTION_TARGETS: [&str; 2] = ["actix_http::h1::dispatcher", "actix_http::h1::decoder"];

/// The beginnings of the connection errors a client causes: an unreadable request (`stream
/// error`), a peer that stopped reading (`write zero`), a chunked body that never ends.
const CLIENT_MISTAKES: [&str; 3] = ["stream error", "write zero", "MAX_BUFFER_SIZE"];

/// Where the RabbitMQ client logs a message the broker returned (unroutable), at WARN, with the
/// message's body and headers.
const RETURNED_MESSAGES: &str = "lapin::returned_messages";

/// At most one WARN about clients' mistakes per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Installs the global subscriber (and the panic hook of [`catch_panic`]) once; later calls do
/// nothing.
pub fn init() {
    install_panic_hook();
    // Without RUST_LOG: hookbox's own lines at info, not actix-server's ("starting 2 workers",
    // "Actix runtime found", "starting service"), which repeat what hookbox says in its words,
    // nor the NATS client's ("event: client error: nats: IO error" every few seconds while a
    // server is down, naming no target: each attempt's WARN says it, with the target), nor the
    // RabbitMQ client's (six ERROR lines at every link cut, naming no target, which paged on a
    // routine broker restart: hookbox says each failure in its own words, with the target).
    // RUST_LOG set but empty (an env file's `RUST_LOG=`) is not set: an empty filter would turn
    // every line off, errors included. One that cannot be read, or names nothing (`,`), falls
    // back to the default too, and says so once installed.
    let given = std::env::var("RUST_LOG")
        .ok()
        .filter(|value| !value.trim().is_empty());
    let read = given.map(|value| {
        let filter = if value
            .split(',')
            .all(|directive| directive.trim().is_empty())
        {
            Err("it names no directive".to_owned())
        } else {
            EnvFilter::try_new(&value).map_err(|e| e.to_string())
        };
        (value, filter)
    });
    let (filter, unreadable) = match read {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some((_, Ok(filter))) => (filter, None),
        Some((value, Err(e))) => (EnvFilter::new(DEFAULT_FILTER), Some((value, e))),
    };
    let lines = tracing_subscriber::fmt::layer()
        .fmt_fields(one_line_fields())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .with_filter(filter_fn(|metadata| {
            !is_connection_error(metadata) && !may_carry_a_body(metadata)
        }));
    let (sender, receiver) = sync_channel(256);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(ConnectionErrors(sender))
        .try_init();
    if let (true, Some((value, e))) = (installed.is_ok(), &unreadable) {
        tracing::warn!(
            "RUST_LOG={value:?} cannot be read ({e}); logging at the default level, info \
             (write it like RUST_LOG=debug or RUST_LOG=hookbox=debug,info)"
        );
    }
    if installed.is_ok() {
        // The report is made from a thread of its own: an event logged while another is being
        // dispatched, on the same thread, would be dropped by tracing.
        let _ = std::thread::Builder::new()
            .name("hookbox-client-errors".to_owned())
            .spawn(move || report(&receiver));
    }
}

/// How a log line writes its fields: as tracing's own format does (`name=value`, the message
/// bare), but with a value's line breaks written as `\n` and `\r`, and those at its end
/// dropped. A database's error ends with a newline (libpq's): it cut the line there, and put
/// the fields after it (a failed purge pass's `removed=` and `by_source=`) on a line of their
/// own that a reader of the WARN line never saw.
fn one_line_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let text = format!("{value:?}");
        let text = text
            .trim_end_matches(['\n', '\r'])
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        match field.name() {
            "message" => write!(writer, "{text}"),
            name => write!(writer, "{name}={text}"),
        }
    })
    .delimited(" ")
}

thread_local! {
    /// Set while [`catch_panic`] runs on this thread.
    static CATCHING: Cell<bool> = const { Cell::new(false) };
    /// What the panic hook recorded of a panic that [`catch_panic`] catches.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keeps the panics [`catch_panic`] catches from being printed, recording their message and
/// place for it instead.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !CATCHING.with(Cell::get) {
                return print(info);
            }
            let message = info.payload_as_str().unwrap_or("a panic");
            let caught = match info.location() {
                Some(at) => format!("{message} (at {}:{})", at.file(), at.line()),
                None => message.to_owned(),
            };
            CAUGHT.with(|c| *c.borrow_mut() = Some(caught));
        }));
    });
}

/// Runs `work`, catching a panic: its message (and, once [`init`] has run, where it was
/// raised) comes back as the error, and nothing is printed for it, so that the caller, which
/// answers the failure, logs it once.
pub fn catch_panic<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    let outer = CATCHING.with(|c| c.replace(true));
    let result = std::panic::catch_unwind(AssertUnwindSafe(work));
    CATCHING.with(|c| c.set(outer));
    result.map_err(|payload| {
        CAUGHT
            .with(|c| c.borrow_mut().take())
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned())
    })
}

/// An ERROR of actix-http about one connection: kept out of the log lines, see [`report`].
fn is_connection_error(metadata: &Metadata<'_>) -> bool {
    *metadata.level() == Level::ERROR && CONNECTION_TARGETS.contains(&metadata.target())
}

/// Lines of a library that would print a webhook's body, whatever `RUST_LOG` says: logs never
/// hold bodies. The RabbitMQ client logs every returned (unroutable) message whole, and its
/// trace lines print frames; hookbox records an unroutable publish in the delivery's
/// `last_error` itself.
fn may_carry_a_body(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    target == RETURNED_MESSAGES
        || ((target.starts_with("lapin::") || target.starts_with("amq_protocol"))
            && *metadata.level() == Level::TRACE)
}

/// Says something at most once a minute (a line a client or a guesser could repeat without
/// end): [`OncePerMinute::due`] is, when it is to be said now, how many times it was not since.
pub struct OncePerMinute(std::sync::Mutex<(Option<Instant>, u64)>);

impl OncePerMinute {
    /// Not said yet: the first is due at once.
    pub const fn new() -> OncePerMinute {
        OncePerMinute(std::sync::Mutex::new((None, 0)))
    }

    /// `Some(not said since the last)` when it is to be said now; `None`, counted, when it was
    /// said within the minute.
    pub fn due(&self) -> Option<u64> {
        let mut said = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (last, unsaid) = &mut *said;
        if last.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            *unsaid += 1;
            return None;
        }
        *last = Some(Instant::now());
        Some(std::mem::take(unsaid))
    }
}

impl Default for OncePerMinute {
    fn default() -> Self {
        Self::new()
    }
}

/// Hands actix-http's connection errors to [`report`].
struct ConnectionErrors(SyncSender<String>);

impl<S: Subscriber> Layer<S> for ConnectionErrors {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if !is_connection_error(event.metadata()) {
            return;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        // A flood fills the channel; what does not fit is only uncounted, never waited for.
        let _ = self.0.try_send(message.0);
    }
}

/// An event's `message` field, as text.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0);
        }
    }
}

/// Logs actix-http's connection errors: a client's mistake at DEBUG, and at WARN at most once
/// per [`WARN_EVERY`] with the count of those not warned about; anything else at ERROR.
fn report(errors: &Receiver<String>) {
    let said = OncePerMinute::new();
    for error in errors {
        if !CLIENT_MISTAKES.iter().any(|m| error.starts_with(m)) {
            tracing::error!(error = %error, "HTTP connection error");
            continue;
        }
        tracing::debug!(error = %error, "a client sent a request that could not be read");
        let Some(unshown) = said.due() else {
            continue;
        };
        tracing::warn!(
            error = %error,
            not_shown_since_last = unshown,
            "a client sent a request that could not be read (malformed, too large or cut off); \
             it was answered 400/431 or closed. At most one such warning a minute; \
             RUST_LOG=debug shows each"
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn once_per_minute_is_due_at_once_then_not_again_within_the_minute() {
        let said = super::OncePerMinute::new();
        assert_eq!(said.due(), Some(0));
        assert_eq!(said.due(), None);
        assert_eq!(said.due(), None);
        assert_eq!(
            said.0.lock().expect("lock").1,
            2,
            "the ones not said are counted"
        );
    }

    #[test]
    fn a_value_that_ends_in_a_newline_keeps_its_line_whole() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("lock").extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(one_line_fields())
            .with_writer({
                let lines = lines.clone();
                move || lines.clone()
            })
            .with_ansi(false)
            .with_target(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(
                error = %"SSL error: unexpected eof while reading\n",
                removed = 70000,
                by_source = %"stripe=70000",
                detail = %"two\nlines",
                "purge pass failed"
            );
        });
        let text = String::from_utf8(lines.0.lock().expect("lock").clone()).expect("text");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains(
                "WARN purge pass failed error=SSL error: unexpected eof while reading \
                 removed=70000 by_source=stripe=70000 detail=two\\nlines"
            ),
            "{text}"
        );
    }

    use super::*;

    #[test]
    fn a_caught_panic_comes_back_with_its_message_and_place_and_is_not_printed() {
        install_panic_hook();
        let caught = catch_panic(|| -> u8 { panic!("boom {}", 7) }).expect_err("it panicked");
        // Only the hook's branch for a caught panic records the place; printing is the other.
        assert!(
            caught.starts_with("boom 7 (at src/telemetry.rs:"),
            "{caught}"
        );
        assert_eq!(catch_panic(|| 5), Ok(5));
        assert!(
            !CATCHING.with(Cell::get),
            "the thread is back to printing its panics"
        );
    }
}
