//! Captures: stored deliveries as NDJSON, one delivery a line, and `hookbox export`, which
//! writes them.
//!
//! A line is `{"source", "event_id", "event_type", "received_at", "headers", "body"}`, with
//! `body_base64` instead of `body` when the raw body is not UTF-8. Header names are lowercase,
//! and only the scheme's headers and `content-type` are there: never `authorization` or
//! cookies. `replay` reads the same lines back ([`Entries`]), and plain `.json` files holding
//! one body each.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::db::events::{self, Exported, Span};
use crate::db::{self, AnyConnection};
use crate::redact::CREDENTIAL_HEADERS;

/// How many stored events `export` reads per query. Each batch is held in memory at once, so
/// this bounds the export's memory whatever the table's size.
const EXPORT_BATCH: i64 = 500;

/// One captured delivery: what a line of a capture holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureLine {
    /// The source it arrived at: its config source, and the `{source}` it is replayed to.
    pub source: String,
    /// The provider's event id.
    pub event_id: String,
    /// The provider's event type, where the scheme carries one.
    pub event_type: Option<String>,
    /// When hookbox received it; absent in hand-written captures.
    pub received_at: Option<DateTime<Utc>>,
    /// The kept headers, lowercase name → value.
    pub headers: BTreeMap<String, String>,
    /// The raw body, byte for byte.
    pub body: Vec<u8>,
}

/// A time as a capture writes it: RFC 3339 in UTC, always to the microsecond
/// (`2026-12-02T09:00:00.123400Z`), so that lines sort by time as text too (chrono's own form
/// drops trailing zeros, and `.347Z` sorted after `.874570Z`). Both stores keep microseconds;
/// a time read from a hand-written capture with nanoseconds keeps them.
fn in_microseconds<S: serde::Serializer>(
    at: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use chrono::Timelike;
    match at {
        Some(at) => {
            let digits = if at.nanosecond() % 1000 == 0 {
                chrono::SecondsFormat::Micros
            } else {
                chrono::SecondsFormat::Nanos
            };
            serializer.serialize_str(&at.to_rfc3339_opts(digits, true))
        }
        None => serializer.serialize_none(),
    }
}

/// A capture line as it is written: the body as text, or as base64 when it is not UTF-8.
#[derive(Serialize)]
struct LineOut<'a> {
    source: &'a str,
    event_id: &'a str,
    event_type: Option<&'a str>,
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "in_microseconds"
    )]
    received_at: Option<DateTime<Utc>>,
    headers: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// A capture line as it is read. Unknown fields are allowed, so a capture written by a later
/// version (or annotated by hand) still replays.
#[derive(Deserialize)]
struct LineIn {
    source: String,
    event_id: String,
    #[serde(default)]
    event_type: Option<String>,
    /// Read as any JSON, so that a time in another form is read or named (see
    /// [`received_at`]), not taken for a line cut short.
    #[serde(default)]
    received_at: Option<serde_json::Value>,
    /// `null` is read as none, as a missing field is (a capture written by another tool).
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_base64: Option<String>,
}

/// Why an input could not be read, with the source and event id of a capture line where they
/// could be (for the report's `file:line source event_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// One line saying what is wrong.
    pub message: String,
    /// The line's `source`, where it was read.
    pub source: Option<String>,
    /// The line's `event_id`, where it was read.
    pub event_id: Option<String>,
}

impl Unreadable {
    fn new(message: impl Into<String>) -> Unreadable {
        Unreadable {
            message: message.into(),
            source: None,
            event_id: None,
        }
    }
}

/// `line` without the UTF-8 byte-order mark a Windows editor puts before a file's first line.
fn without_bom(line: &[u8]) -> &[u8] {
    line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line)
}

/// What is wrong with a line that is no capture line: cut short, another kind of JSON value
/// than an object (`value`, the line read as any JSON), or not JSON.
fn not_a_line(value: Option<&serde_json::Value>, e: &serde_json::Error) -> String {
    if e.is_eof() {
        return format!(
            "the line ends before its JSON does (a capture cut short, or a line broken in two?): {e}"
        );
    }
    let kind = match value {
        Some(serde_json::Value::Array(_)) => Some("an array"),
        Some(serde_json::Value::String(_)) => Some("a string"),
        Some(serde_json::Value::Number(_)) => Some("a number"),
        Some(serde_json::Value::Bool(_)) => Some("true or false"),
        Some(serde_json::Value::Null) => Some("null"),
        Some(serde_json::Value::Object(_)) | None => None,
    };
    match kind {
        Some(kind) => {
            format!("not a capture line: one JSON object per line, and this line is {kind}")
        }
        None => format!("not a capture line (one JSON object per line): {e}"),
    }
}

/// A capture line's `received_at`: RFC 3339 as `export` writes it, or a form `export --since`
/// reads (`2026-12-02 09:00:00`, `2026-12-02T09:00`, `2026-12-02`, taken as UTC), as a hand-made
/// capture may have it; `null` or none is none. Anything else is refused naming the field:
/// replay does not use it, so the line can go without it.
fn received_at(value: Option<&serde_json::Value>) -> Result<Option<DateTime<Utc>>, String> {
    let refused = |shown: String| {
        format!(
            "received_at {shown} is not a time: write it as RFC 3339 (2026-12-02T09:00:00Z) or \
             leave it out (replay does not use it)"
        )
    };
    match value {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => crate::config::parse_time(text)
            .map(Some)
            .ok_or_else(|| refused(format!("{text:?}"))),
        Some(other) => Err(refused(other.to_string())),
    }
}

impl CaptureLine {
    /// Reads one line of a capture. A UTF-8 byte-order mark before it (a file saved by a
    /// Windows editor) is no part of it.
    ///
    /// # Errors
    /// A one-line reason: not JSON, a missing or empty `source` or `event_id`, neither or both
    /// of `body` and `body_base64`, or `body_base64` that is not base64.
    pub fn parse(line: &[u8]) -> Result<CaptureLine, Unreadable> {
        let line = without_bom(line);
        let raw: LineIn = serde_json::from_slice(line).map_err(|e| {
            // A line that is a JSON object with a field of the wrong type still says whose it is.
            let named = serde_json::from_slice::<serde_json::Value>(line).ok();
            let text = |field: &str| {
                named
                    .as_ref()
                    .and_then(|value| value.get(field))
                    .and_then(serde_json::Value::as_str)
                    .filter(|text| !text.is_empty())
                    .map(str::to_owned)
            };
            // UTF-16 (PowerShell's `>` writes it, and Windows editors offer it) has a zero byte
            // beside each ASCII letter, which no UTF-8 JSON line holds.
            let message = if line.contains(&0) {
                "not a capture line: the file is UTF-16, not UTF-8 (PowerShell's `>` writes \
                 UTF-16); convert it first, e.g. `iconv -f UTF-16 -t UTF-8 FILE > FILE.ndjson`"
                    .to_owned()
            } else {
                not_a_line(named.as_ref(), &e)
            };
            Unreadable {
                message,
                source: text("source"),
                event_id: text("event_id"),
            }
        })?;
        if raw.source.is_empty() || raw.event_id.is_empty() {
            return Err(Unreadable::new(
                "a capture line needs a non-empty source and event_id",
            ));
        }
        let named = |message: String| Unreadable {
            message,
            source: Some(raw.source.clone()),
            event_id: Some(raw.event_id.clone()),
        };
        let received_at = received_at(raw.received_at.as_ref()).map_err(named)?;
        let body = match (raw.body, raw.body_base64) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(encoded)) => BASE64
                .decode(encoded.trim())
                .map_err(|e| named(format!("body_base64 is not base64: {e}")))?,
            (None, None) => return Err(named("a capture line needs body or body_base64".into())),
            (Some(_), Some(_)) => {
                return Err(named(
                    "a capture line has body or body_base64, not both".into(),
                ))
            }
        };
        Ok(CaptureLine {
            source: raw.source,
            event_id: raw.event_id,
            event_type: raw.event_type,
            received_at,
            // Header names are case-insensitive; a hand-written capture may capitalise them.
            headers: raw
                .headers
                .unwrap_or_default()
                .into_iter()
                .map(|(name, value)| (name.to_ascii_lowercase(), value))
                .collect(),
            body,
        })
    }

    /// Writes the line and its newline.
    ///
    /// # Errors
    /// What writing to `out` fails with.
    pub fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        let text = std::str::from_utf8(&self.body).ok();
        let line = LineOut {
            source: &self.source,
            event_id: &self.event_id,
            event_type: self.event_type.as_deref(),
            received_at: self.received_at,
            headers: &self.headers,
            body: text,
            body_base64: text.is_none().then(|| BASE64.encode(&self.body)),
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")
    }
}

/// Which stored events `export` writes.
#[derive(Debug, Clone, Default)]
pub struct ExportFilter {
    /// Only this source's.
    pub source: Option<String>,
    /// Only those received at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only those received before this time.
    pub until: Option<DateTime<Utc>>,
}

/// Writes the stored events that `filter` selects to `out` as a capture, oldest first, and
/// returns how many it wrote.
///
/// It reads in batches of [`EXPORT_BATCH`], each starting after the last (received time, row
/// id) written, so memory stays bounded however many events are stored. All batches read one
/// snapshot (a read-only repeatable-read transaction), so the capture is consistent even while
/// deliveries arrive. `progress` is told where it is: reading a batch, or writing its lines
/// (after each, with the count written so far), so that a wait says whom it is for.
///
/// # Errors
/// A database error, or a failure to write to `out`.
pub fn export(
    conn: &mut AnyConnection,
    filter: &ExportFilter,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(Step),
) -> anyhow::Result<u64> {
    db::read_snapshot(conn, |conn| {
        let mut written = 0;
        let mut after: Option<i64> = None;
        loop {
            progress(Step::Reading);
            let batch = export_batch(conn, filter, after)?;
            let full = batch.len() as i64 == EXPORT_BATCH;
            after = batch.last().map(|(id, ..)| *id);
            for row in batch {
                capture_line(row).write_to(out)?;
                written += 1;
                progress(Step::Wrote(written));
            }
            if !full {
                break;
            }
        }
        out.flush()?;
        Ok(written)
    })
}

/// Where an [`export`] is, with how many lines it has written.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// Reading the next batch from the database.
    Reading,
    /// A line written; the next one is next.
    Wrote(u64),
}

/// The next batch in (received time, row id) order, after the row `after`.
fn export_batch(
    conn: &mut AnyConnection,
    filter: &ExportFilter,
    after: Option<i64>,
) -> anyhow::Result<Vec<Exported>> {
    let span = Span {
        source: filter.source.as_deref(),
        since: filter.since,
        until: filter.until,
    };
    Ok(events::export_page(conn, span, after, EXPORT_BATCH)?)
}

/// A stored event as a capture line: only string-valued headers, never a credential.
fn capture_line(row: Exported) -> CaptureLine {
    let (_, source, event_id, event_type, received_at, headers, payload) = row;
    let headers = match headers {
        serde_json::Value::Object(headers) => headers
            .into_iter()
            .filter_map(|(name, value)| {
                let name = name.to_ascii_lowercase();
                match value {
                    serde_json::Value::String(value)
                        if !CREDENTIAL_HEADERS.contains(&name.as_str()) =>
                    {
                        Some((name, value))
                    }
                    _ => None,
                }
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    CaptureLine {
        source,
        event_id,
        event_type,
        received_at: Some(received_at),
        headers,
        body: payload,
    }
}

/// Writes what `write` produces to the file at `path` (`export --out`), so that a capture found
/// there is never a truncated one, and returns what `write` returned.
///
/// A regular file (or none yet) is written to a new partial file beside it and renamed over it
/// once complete. The partial file has a random name and is created exclusively (`O_EXCL`,
/// which follows no symlink), so nothing planted in the directory can redirect the write.
/// Anything else (a FIFO, a terminal, `/dev/stdout`) is written straight through: renaming a
/// file over it would replace it instead of writing to it.
///
/// # Errors
/// A failure to create, write or rename the file, or `write`'s own error; the partial file is
/// removed.
pub fn write_whole<T>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    use anyhow::Context;
    let resolved = where_to_write(path);
    let path = resolved.as_deref().unwrap_or(path);
    if resolved.is_none() || std::fs::metadata(path).is_ok_and(|meta| !meta.is_file()) {
        // Appending: a stream reached through /proc/self/fd/1 may be a file the shell opened
        // with >>, whose start must not be written over.
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let mut out = WholeLines::new(file);
        let value = write(&mut out)?;
        out.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
        return Ok(value);
    }
    let (partial, file) = create_partial(path)?;
    *lock_in_progress() = Some(partial.clone());
    let mut out = io::BufWriter::new(file);
    let written = write(&mut out).and_then(|value| {
        let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        // A capture holds payloads: one that replaces a file keeps that file's mode (a 0600
        // capture stays 0600), rather than taking the default a new file gets.
        if let Ok(old) = std::fs::metadata(path) {
            let _ = std::fs::set_permissions(&partial, old.permissions());
        }
        // Renamed under the lock an interruption takes (see `abandon_partial`): the file is
        // either renamed whole or never, and an interruption can tell which.
        let mut in_progress = lock_in_progress();
        anyhow::ensure!(in_progress.is_some(), "interrupted");
        std::fs::rename(&partial, path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        *in_progress = None;
        FINISHED.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(value)
    });
    *lock_in_progress() = None;
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// A capture written straight through (to stdout, a FIFO): whole lines only, each batch of them
/// written under a gate that an interruption takes ([`stop_streaming`]), so an export stopped
/// by Ctrl-C or SIGTERM ends between two lines and can say how many went out.
pub struct WholeLines<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

/// How many bytes [`WholeLines`] gathers before it writes the whole lines among them.
const STREAM_CHUNK: usize = 64 * 1024;

/// Whole lines written straight through so far, and whether a [`WholeLines`] wrote at all.
static STREAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STREAMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set by [`stop_streaming`]: no write starts after it.
static STOPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Held while lines are written; [`stop_streaming`] takes it to wait for a write under way.
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl<W: Write> WholeLines<W> {
    /// Lines to `inner`.
    pub fn new(inner: W) -> WholeLines<W> {
        WholeLines {
            inner,
            pending: Vec::with_capacity(STREAM_CHUNK),
        }
    }

    /// Writes the whole lines gathered so far; what follows the last line break waits.
    fn write_lines(&mut self) -> io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return Ok(());
        };
        let _writing = WRITING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if STOPPED.load(SeqCst) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
        }
        STREAMING.store(true, SeqCst);
        self.inner.write_all(&self.pending[..=end])?;
        self.inner.flush()?;
        let lines = self.pending[..=end].iter().filter(|b| **b == b'\n').count();
        STREAMED.fetch_add(lines as u64, SeqCst);
        self.pending.drain(..=end);
        Ok(())
    }
}

impl<W: Write> Write for WholeLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.pending.len() >= STREAM_CHUNK {
            self.write_lines()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_lines()
    }
}

/// How many whole lines [`WholeLines`] have written so far.
pub fn streamed_lines() -> u64 {
    STREAMED.load(std::sync::atomic::Ordering::SeqCst)
}

/// What [`stop_streaming`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streamed {
    /// No line was written straight through.
    Nothing,
    /// This many whole lines went out, and no more will.
    Lines(u64),
    /// A write was still under way after two seconds (a reader that stopped reading): at
    /// least this many whole lines went out, and the last one may be cut short.
    AtLeast(u64),
}

/// Stops every [`WholeLines`] for good, between two lines, and says how many whole lines went
/// out. It waits up to two seconds for a write under way to end.
pub fn stop_streaming() -> Streamed {
    use std::sync::atomic::Ordering::SeqCst;
    STOPPED.store(true, SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let finished = loop {
        match WRITING.try_lock() {
            Ok(_) | Err(std::sync::TryLockError::Poisoned(_)) => break true,
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::sync::TryLockError::WouldBlock) => break false,
        }
    };
    let lines = STREAMED.load(SeqCst);
    match (STREAMING.load(SeqCst), finished) {
        (false, _) => Streamed::Nothing,
        (true, true) => Streamed::Lines(lines),
        (true, false) => Streamed::AtLeast(lines),
    }
}

/// Where [`write_whole`] writes a capture whole for `path`: `path` itself, or for a symbolic
/// link the file it leads to (renaming over the link would replace the link), made there if
/// it is not there yet; `None` to write straight through: a path under `/dev` or `/proc`
/// (`/dev/stdout`, `/proc/self/fd/1`), which names an open stream whatever it resolves to, or
/// a link that leads nowhere a file can be made.
pub(crate) fn where_to_write(path: &Path) -> Option<PathBuf> {
    if path.starts_with("/dev") || path.starts_with("/proc") {
        return None;
    }
    let is_link = |path: &Path| {
        std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
    };
    if !is_link(path) {
        return Some(path.to_path_buf());
    }
    let target = std::fs::canonicalize(path).ok().or_else(|| {
        // A link to a file not made yet: followed link by link (as the kernel does, at most
        // 40) to the name at the end, in its directory.
        let mut led = path.to_path_buf();
        for _ in 0..40 {
            if !is_link(&led) {
                // A bare name's parent is "": the working directory.
                let parent = led.parent().filter(|p| !p.as_os_str().is_empty());
                let directory = std::fs::canonicalize(parent.unwrap_or(Path::new("."))).ok()?;
                return Some(directory.join(led.file_name()?));
            }
            let next = std::fs::read_link(&led).ok()?;
            led = led.parent()?.join(next);
        }
        None
    })?;
    (!target.starts_with("/dev") && !target.starts_with("/proc")).then_some(target)
}

/// The partial file [`write_whole`] is writing, while it is.
static IN_PROGRESS: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Whether [`write_whole`] has renamed its file into place.
static FINISHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn lock_in_progress() -> std::sync::MutexGuard<'static, Option<PathBuf>> {
    IN_PROGRESS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`abandon_partial`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// The partial file was being written, and is removed: nothing was written.
    Removed,
    /// The file was already renamed into place, whole.
    Finished,
    /// No partial file was made yet.
    NotStarted,
}

/// Removes the partial file [`write_whole`] is writing, if it is writing one: for an export
/// interrupted (Ctrl-C, SIGTERM) before it finished, which then exits.
pub fn abandon_partial() -> Abandoned {
    let mut in_progress = lock_in_progress();
    match in_progress.take() {
        Some(partial) => {
            let _ = std::fs::remove_file(partial);
            Abandoned::Removed
        }
        None if FINISHED.load(std::sync::atomic::Ordering::SeqCst) => Abandoned::Finished,
        None => Abandoned::NotStarted,
    }
}

/// Whether [`write_whole`] can write `path`, found by making (and removing) the partial file it
/// would write: checked before a long export begins, so a path it cannot write is refused at
/// once, named as given. What is there and is not a regular file (a FIFO, `/dev/stdout`) is
/// left to [`write_whole`]: opening a FIFO to check it would wait for its reader.
///
/// # Errors
/// The system's reason (no such directory, permission denied, ...).
pub fn check_writable(path: &Path) -> Result<(), String> {
    let Some(path) = where_to_write(path) else {
        return Ok(());
    };
    let path = path.as_path();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err("it is a directory (give the path of a file to write)".to_owned())
        }
        // A FIFO, a device, a terminal: written straight through.
        Ok(meta) if !meta.is_file() => return Ok(()),
        _ => {}
    }
    let (partial, file) = create_partial(path).map_err(|e| e.root_cause().to_string())?;
    drop(file);
    let _ = std::fs::remove_file(&partial);
    Ok(())
}

/// A new file `NAME.<16 random hex digits>.partial` beside `path`, made by this call alone.
fn create_partial(path: &Path) -> anyhow::Result<(PathBuf, File)> {
    use anyhow::Context;
    let name = path
        .file_name()
        .with_context(|| format!("{} names no file", path.display()))?;
    // 64 random bits: a name already taken is someone else's file, and taking several in a
    // row means something is wrong.
    for _ in 0..8 {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
        let mut partial_name = name.to_os_string();
        partial_name.push(format!(".{}.partial", hex::encode(random)));
        let partial = path.with_file_name(partial_name);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        // A capture holds payloads and whole signatures: readable by its owner only, as
        // replay's own copies are (a file it replaces keeps that file's mode, below).
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        match options.open(&partial) {
            Ok(file) => return Ok((partial, file)),
            // Someone else's file (or link) by that name: draw another.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot create {}", partial.display()))
            }
        }
    }
    anyhow::bail!(
        "cannot create a partial file beside {}: every name tried was taken",
        path.display()
    )
}

/// What a file given to `replay` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// NDJSON capture lines.
    Capture,
    /// One raw body (a `.json` file).
    Body,
}

/// A file `replay` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// Where it is, as given (what messages name).
    pub path: PathBuf,
    /// What it holds.
    pub kind: InputKind,
    /// For a pipe, the copy of it that is read instead.
    spool: Option<std::sync::Arc<Spool>>,
}

impl InputFile {
    /// A regular file at `path`.
    pub fn new(path: PathBuf, kind: InputKind) -> InputFile {
        InputFile {
            path,
            kind,
            spool: None,
        }
    }

    /// Whether `path` names this very file (through a symlink or another spelling too): what
    /// `replay --report` must not overwrite.
    pub fn is_the_file(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        if self.spool.is_some() {
            return false;
        }
        match (std::fs::metadata(path), std::fs::metadata(&self.path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// A `.json` file is one body, unless it holds capture lines (an export saved as
    /// `stripe.json`): its first line that is not blank is one, so it is replayed as the
    /// capture it is, and said so. Read as one body, its events would not be sent, and with
    /// `--source` the whole capture would be stored as one event.
    fn read_as_what_it_holds(mut self) -> InputFile {
        if self.kind == InputKind::Body && holds_capture_lines(self.read_from()) {
            errln!(
                "replay: {} holds capture lines, so it is replayed as a capture, one delivery a \
                 line (a .json file is otherwise one body)",
                self.path.display()
            );
            self.kind = InputKind::Capture;
        }
        self
    }

    /// Where its bytes are read from: the file, or the copy of a pipe.
    fn read_from(&self) -> &Path {
        self.spool
            .as_ref()
            .map_or(&self.path, |spool| &spool.read_at)
    }
}

/// A pipe given to `replay` (`-` for stdin, `<(hookbox export ...)`, a named FIFO), copied once
/// into a file of its own in the temporary directory: `replay` reads its inputs more than once
/// (to check them, to count them, to send them), and a pipe gives its bytes only once (read
/// again, it gave nothing, and the replay sent nothing and said it was done).
///
/// On Linux the file is unlinked as soon as it is made and read through this process's handle
/// to it (`/proc/self/fd/N` opens it afresh): the kernel frees it when the process ends,
/// however it ends, so a Ctrl-C while the pipe is still being read leaves no copy of the
/// capture behind. Elsewhere it is removed when the last [`InputFile`] of it goes.
#[derive(Debug)]
struct Spool {
    /// Kept open: on Linux, the only way to the file.
    _file: File,
    /// Where the file is opened again to be read.
    read_at: PathBuf,
    /// The file's name, while it has one.
    named: Option<PathBuf>,
}

impl PartialEq for Spool {
    fn eq(&self, other: &Self) -> bool {
        self.read_at == other.read_at
    }
}

impl Eq for Spool {}

impl Drop for Spool {
    fn drop(&mut self) {
        if let Some(named) = &self.named {
            let _ = std::fs::remove_file(named);
        }
    }
}

/// Copies the pipe at `path` (`-`: stdin) into a spool file, readable by this user alone.
fn spool(path: &Path) -> Result<Spool, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let failed = |e: io::Error| format!("cannot read {}: {e}", path.display());
    let name = std::env::temp_dir().join(format!(
        "hookbox-replay-{}-{}.spool",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut copy = options.open(&name).map_err(|e| {
        format!(
            "cannot copy {} into {} to read it: {e}",
            path.display(),
            name.display()
        )
    })?;
    #[cfg(target_os = "linux")]
    let (read_at, named) = {
        use std::os::fd::AsRawFd;
        let _ = std::fs::remove_file(&name);
        (
            PathBuf::from(format!("/proc/self/fd/{}", copy.as_raw_fd())),
            None,
        )
    };
    #[cfg(not(target_os = "linux"))]
    let (read_at, named) = (name.clone(), Some(name));
    if path.as_os_str() == "-" {
        io::copy(&mut io::stdin().lock(), &mut copy).map_err(failed)?;
    } else {
        io::copy(&mut File::open(path).map_err(failed)?, &mut copy).map_err(failed)?;
    }
    Ok(Spool {
        _file: copy,
        read_at,
        named,
    })
}

/// The files behind `replay`'s arguments: a `.json` file is one body, any other file a capture,
/// and a directory stands for its `.json`, `.ndjson` and `.jsonl` files in name order.
///
/// # Errors
/// A path that cannot be read, or a directory with none of those files in it.
pub fn input_files(paths: &[PathBuf]) -> Result<Vec<InputFile>, String> {
    let mut files = Vec::new();
    for path in paths {
        let kind = if has_extension(path, &["json"]) {
            InputKind::Body
        } else {
            InputKind::Capture
        };
        let stdin = path.as_os_str() == "-";
        let metadata = match stdin {
            true => None,
            false => Some(
                std::fs::metadata(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            ),
        };
        if metadata
            .as_ref()
            .is_none_or(|m| !m.is_dir() && !m.is_file())
        {
            let file = InputFile {
                path: path.clone(),
                kind,
                spool: Some(std::sync::Arc::new(spool(path)?)),
            };
            files.push(file.read_as_what_it_holds());
            continue;
        }
        if metadata.as_ref().is_some_and(std::fs::Metadata::is_file) {
            files.push(InputFile::new(path.clone(), kind).read_as_what_it_holds());
            continue;
        }
        let mut inside: Vec<InputFile> = std::fs::read_dir(path)
            .map_err(|e| format!("cannot read the directory {}: {e}", path.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.is_file())
            .filter_map(|path| {
                let kind = if has_extension(&path, &["json"]) {
                    InputKind::Body
                } else if has_extension(&path, &["ndjson", "jsonl"]) {
                    InputKind::Capture
                } else {
                    return None;
                };
                Some(InputFile::new(path, kind).read_as_what_it_holds())
            })
            .collect();
        if inside.is_empty() {
            return Err(format!(
                "the directory {} holds no .json, .ndjson or .jsonl files",
                path.display()
            ));
        }
        inside.sort_by(|a, b| a.path.cmp(&b.path));
        files.extend(inside);
    }
    Ok(files)
}

/// Whether the first line of the file at `path` that is not blank is a capture line: a JSON
/// object naming a `source` and an `event_id` as strings, and a `body` or `body_base64`,
/// whatever else it holds (a field that cannot be read fails that line, as in any capture).
fn holds_capture_lines(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if without_bom(&line).trim_ascii().is_empty() => continue,
            Ok(_) => {
                let Ok(serde_json::Value::Object(fields)) =
                    serde_json::from_slice::<serde_json::Value>(without_bom(line.trim_ascii()))
                else {
                    return false;
                };
                let text = |name: &str| fields.get(name).is_some_and(serde_json::Value::is_string);
                return text("source")
                    && text("event_id")
                    && (fields.contains_key("body") || fields.contains_key("body_base64"));
            }
        }
    }
}

fn has_extension(path: &Path, extensions: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| extensions.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// What one line of a capture, or one body file, came to.
#[derive(Debug)]
pub enum Item {
    /// A capture line that parsed.
    Line(CaptureLine),
    /// The bytes of a body file.
    Body(Vec<u8>),
}

/// One thing read from the inputs, with where it came from.
#[derive(Debug)]
pub struct Entry {
    /// The file.
    pub file: PathBuf,
    /// The line number (from 1) in a capture; `None` for a body file.
    pub line: Option<u64>,
    /// What it holds, or why it could not be read.
    pub item: Result<Item, Unreadable>,
}

/// Reads the inputs one entry at a time, so a capture of any size replays in constant memory.
/// Blank lines are skipped. A line that cannot be read is an entry with its error, and reading
/// goes on with the next line; a file that fails mid-way ends with an error entry.
pub struct Entries {
    files: std::vec::IntoIter<InputFile>,
    current: Option<(PathBuf, BufReader<File>, u64)>,
}

/// Whether the file `reader` reads from starts as a gzip stream does (a capture compressed for
/// keeping: `export | gzip`), without taking anything from it.
fn compressed(reader: &mut BufReader<File>) -> bool {
    io::BufRead::fill_buf(reader).is_ok_and(|start| start.starts_with(&[0x1f, 0x8b]))
}

impl Entries {
    /// Entries of `files`, in order.
    pub fn new(files: Vec<InputFile>) -> Entries {
        Entries {
            files: files.into_iter(),
            current: None,
        }
    }

    /// How many entries the files hold (lines that are not blank, and one per body file),
    /// for a progress bar. Reads every capture once.
    pub fn count(files: &[InputFile]) -> u64 {
        files
            .iter()
            .map(|file| match file.kind {
                InputKind::Body => 1,
                InputKind::Capture => File::open(file.read_from()).map_or(1, |f| {
                    let mut reader = BufReader::new(f);
                    if compressed(&mut reader) {
                        return 1;
                    }
                    reader
                        .split(b'\n')
                        .map_while(Result::ok)
                        .filter(|line| !without_bom(line).trim_ascii().is_empty())
                        .count() as u64
                }),
            })
            .sum()
    }

    fn next_line(&mut self) -> Option<Entry> {
        let (path, reader, number) = self.current.as_mut()?;
        let mut line = Vec::new();
        loop {
            line.clear();
            *number += 1;
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => {
                    self.current = None;
                    return None;
                }
                Ok(_) if without_bom(&line).trim_ascii().is_empty() => continue,
                Ok(_) => {
                    return Some(Entry {
                        file: path.clone(),
                        line: Some(*number),
                        item: CaptureLine::parse(line.trim_ascii()).map(Item::Line),
                    })
                }
                Err(e) => {
                    let entry = Entry {
                        file: path.clone(),
                        line: Some(*number),
                        item: Err(Unreadable::new(format!("cannot read the file: {e}"))),
                    };
                    self.current = None;
                    return Some(entry);
                }
            }
        }
    }
}

impl Iterator for Entries {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        loop {
            if let Some(entry) = self.next_line() {
                return Some(entry);
            }
            let file = self.files.next()?;
            match (file.kind, File::open(file.read_from())) {
                (InputKind::Body, Ok(mut f)) => {
                    let mut body = Vec::new();
                    let item = io::Read::read_to_end(&mut f, &mut body)
                        .map(|_| Item::Body(body))
                        .map_err(|e| Unreadable::new(format!("cannot read the file: {e}")));
                    return Some(Entry {
                        file: file.path,
                        line: None,
                        item,
                    });
                }
                (InputKind::Capture, Ok(f)) => {
                    let mut reader = BufReader::new(f);
                    if compressed(&mut reader) {
                        // One entry for the file, not one per "line" of compressed bytes.
                        let message = format!(
                            "the file is gzip-compressed: decompress it first, or pipe it in \
                             (zcat {} | hookbox replay - ...)",
                            file.path.display()
                        );
                        return Some(Entry {
                            file: file.path,
                            line: None,
                            item: Err(Unreadable::new(message)),
                        });
                    }
                    self.current = Some((file.path, reader, 0));
                }
                (_, Err(e)) => {
                    return Some(Entry {
                        file: file.path,
                        line: None,
                        item: Err(Unreadable::new(format!("cannot open the file: {e}"))),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(body: &[u8]) -> CaptureLine {
        CaptureLine {
            source: "stripe".into(),
            event_id: "evt_1".into(),
            event_type: Some("charge.succeeded".into()),
            received_at: Some(
                DateTime::parse_from_rfc3339("2026-12-02T09:00:00Z")
                    .expect("valid time")
                    .with_timezone(&Utc),
            ),
            headers: BTreeMap::from([
                ("content-type".into(), "application/json".into()),
                ("stripe-signature".into(), "t=1,v1=ab".into()),
            ]),
            body: body.to_vec(),
        }
    }

    fn written(line: &CaptureLine) -> String {
        let mut out = Vec::new();
        line.write_to(&mut out).expect("writes to a Vec");
        String::from_utf8(out).expect("a capture line is UTF-8")
    }

    #[test]
    fn a_line_is_the_contract_shape_and_reads_back() {
        let original = line(b"{\"id\": \"evt_1\"}\n");
        let text = written(&original);
        assert_eq!(
            text,
            "{\"source\":\"stripe\",\"event_id\":\"evt_1\",\"event_type\":\"charge.succeeded\",\
             \"received_at\":\"2026-12-02T09:00:00.000000Z\",\"headers\":{\"content-type\":\"application/json\",\
             \"stripe-signature\":\"t=1,v1=ab\"},\"body\":\"{\\\"id\\\": \\\"evt_1\\\"}\\n\"}\n"
        );
        assert_eq!(CaptureLine::parse(text.trim_end().as_bytes()), Ok(original));
    }

    #[test]
    fn a_body_that_is_not_utf8_travels_as_base64() {
        let original = line(&[0xff, 0x00, b'a']);
        let text = written(&original);
        assert!(text.contains("\"body_base64\":\"/wBh\""), "{text}");
        assert!(!text.contains("\"body\":"), "{text}");
        assert_eq!(CaptureLine::parse(text.as_bytes()), Ok(original));
    }

    #[test]
    fn a_hand_written_line_needs_only_source_event_id_and_a_body() {
        let parsed = CaptureLine::parse(
            br#"{"source":"github","event_id":"d-1","headers":{"X-GitHub-Event":"push"},"body":"{}","note":"by hand"}"#,
        )
        .expect("a minimal line");
        assert_eq!(parsed.event_type, None);
        assert_eq!(parsed.received_at, None);
        assert_eq!(parsed.headers["x-github-event"], "push");
    }

    #[test]
    fn null_headers_are_none_as_missing_ones_are() {
        let parsed = CaptureLine::parse(
            br#"{"source":"s","event_id":"e","event_type":null,"received_at":null,"headers":null,"body":"{}"}"#,
        )
        .expect("null fields are missing ones");
        assert!(parsed.headers.is_empty());
    }

    #[test]
    fn a_utf16_line_says_to_convert_the_file() {
        let text = r#"{"source":"s","event_id":"e","body":"{}"}"#;
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let error = CaptureLine::parse(&utf16).expect_err("UTF-16 is no capture line");
        assert!(
            error.message.contains("UTF-16") && error.message.contains("iconv"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_byte_order_mark_is_no_part_of_a_line_and_a_bad_line_keeps_the_names_it_has() {
        let parsed = CaptureLine::parse(
            b"\xEF\xBB\xBF{\"source\":\"s\",\"event_id\":\"e\",\"body\":\"{}\"}",
        )
        .expect("a line after a byte-order mark");
        assert_eq!(
            (parsed.source.as_str(), parsed.body.as_slice()),
            ("s", &b"{}"[..])
        );
        for line in [
            &br#"{"source":"s","event_id":"e"}"#[..],
            br#"{"source":"s","event_id":"e","body":5}"#,
            br#"{"source":"s","event_id":"e","headers":"x","body":""}"#,
        ] {
            let error = CaptureLine::parse(line).expect_err("not a line that can be sent");
            assert_eq!(
                (error.source.as_deref(), error.event_id.as_deref()),
                (Some("s"), Some("e")),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (text, expected) in [
            (&b"not json"[..], "not a capture line"),
            (br#"[{"source":"s"}]"#, "this line is an array"),
            (
                br#"{"source":"s","event_id":"e","bo"#,
                "ends before its JSON does",
            ),
            (br#"{"source":"s","event_id":"e"}"#, "body or body_base64"),
            (
                br#"{"source":"s","event_id":"e","body":"","body_base64":""}"#,
                "not both",
            ),
            (br#"{"source":"","event_id":"e","body":""}"#, "non-empty"),
            (
                br#"{"source":"s","event_id":"e","body_base64":"***"}"#,
                "not base64",
            ),
        ] {
            let error = CaptureLine::parse(text).expect_err("refused").message;
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn entries_number_lines_skip_blanks_and_go_on_after_a_bad_one() {
        let dir = std::env::temp_dir().join(format!("hookbox-capture-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let capture = dir.join("a.ndjson");
        let good = written(&line(b"{}"));
        // A first line of nothing but a byte-order mark is blank.
        std::fs::write(&capture, format!("\u{feff}\n{good}\n{{oops\n{good}")).expect("write");
        std::fs::write(dir.join("b.json"), b"{\"id\":1}").expect("write");
        std::fs::write(dir.join("notes.txt"), b"ignored").expect("write");

        let files = input_files(std::slice::from_ref(&dir)).expect("the directory has inputs");
        assert_eq!(
            files.iter().map(|f| f.kind).collect::<Vec<_>>(),
            [InputKind::Capture, InputKind::Body]
        );
        assert_eq!(Entries::count(&files), 4);
        let entries: Vec<Entry> = Entries::new(files).collect();
        let lines: Vec<_> = entries.iter().map(|e| (e.line, e.item.is_ok())).collect();
        assert_eq!(
            lines,
            [
                (Some(2), true),
                (Some(4), false),
                (Some(5), true),
                (None, true)
            ]
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_gzip_compressed_capture_is_one_entry_that_says_so() {
        let dir = std::env::temp_dir().join(format!("hookbox-gzip-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let capture = dir.join("a.ndjson.gz");
        // The gzip header, and bytes that hold newlines as a compressed stream may.
        std::fs::write(&capture, b"\x1f\x8b\x08\x00\x00\x00\x00\x00\n\x03\nabc\n").expect("write");
        let files = vec![InputFile::new(capture, InputKind::Capture)];
        assert_eq!(Entries::count(&files), 1);
        let entries: Vec<Entry> = Entries::new(files).collect();
        assert_eq!(entries.len(), 1);
        let message = &entries[0].item.as_ref().expect_err("refused").message;
        assert!(
            message.contains("gzip-compressed") && message.contains("zcat"),
            "{message}"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_missing_input_or_an_empty_directory_is_refused() {
        assert!(input_files(&[PathBuf::from("/nonexistent/capture.ndjson")]).is_err());
        let dir =
            std::env::temp_dir().join(format!("hookbox-capture-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let error = input_files(std::slice::from_ref(&dir)).expect_err("empty");
        assert!(error.contains("no .json"), "{error}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
