//! `hookbox replay`: re-sends captured deliveries, the way a provider re-sends a retry.
//!
//! Each entry of the inputs (a capture line, or a `.json` body file) becomes a delivery to
//! `{to}/webhooks/{source}`. By default it is signed afresh with the source's first secret and
//! the current time, under its captured event id and type, so the receiver's tolerance sees a
//! new delivery of the same event; `--as-is` sends the captured headers unchanged (and an old
//! timestamp is refused, as it should be). Deliveries go out at most `--concurrency` at a time,
//! at most `--rate` a second, and each answer is counted ([`report::Tally`]).
//!
//! The inputs are read as they are sent, one entry at a time, so a capture of any size
//! replays in constant memory (bar the latencies and failure rows kept for the summary).

pub mod client;
pub mod pace;
pub mod progress;
pub mod report;
pub mod signing;

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::capture::{Entries, Entry, InputFile, InputKind, Item};
use crate::ids::SourceName;
use crate::providers::{unix_now, Identity};
use signing::{ContentType, Verifier};

pub use client::Target;
pub use pace::Rate;
pub use signing::Signer;

use client::Request;
use pace::Pacer;
use progress::Progress;
use report::{Origin, Tally};

/// Captured headers `--as-is` never sends, whatever a capture file holds (the contract's
/// rule): credentials, which a capture never has but a hand-edited or hostile one can; the
/// host, which is the target's own; and the framing and hop-by-hop headers, which the client
/// makes for the body it actually sends.
const NEVER_SENT: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// How each delivery's headers are made.
#[derive(Debug)]
pub enum Mode {
    /// The captured headers, unchanged.
    AsIs,
    /// Signed afresh by the signer.
    Resign(Signer),
}

/// What `hookbox replay` was asked to do.
#[derive(Debug)]
pub struct Options {
    /// Where to send.
    pub to: Target,
    /// As captured, or re-signed.
    pub mode: Mode,
    /// The source of body files; for captures, only its lines are replayed.
    pub source: Option<SourceName>,
    /// How many deliveries may be in flight at once (at least 1).
    pub concurrency: usize,
    /// How fast deliveries may start.
    pub rate: Option<Rate>,
    /// Print what would be sent instead of sending it.
    pub dry_run: bool,
    /// Where to write the JSON report.
    pub report: Option<PathBuf>,
}

/// The headers of a delivery about to be sent.
enum Headers<'a> {
    Captured(Vec<(String, String)>),
    Sign {
        verifier: &'a Verifier,
        identity: Identity,
        content_type: ContentType,
        /// The capture line's headers, whose names the signature's take where the scheme
        /// has two spellings (none for a body file).
        captured: Vec<(String, String)>,
    },
}

/// A delivery ready to go but for its signature, which is made at the moment it is sent, so
/// its timestamp is fresh however long the pacing made it wait.
struct Pending<'a> {
    origin: Origin,
    url: String,
    body: Bytes,
    headers: Headers<'a>,
}

impl Pending<'_> {
    fn request(&self, now: i64) -> Request {
        match &self.headers {
            Headers::Captured(headers) => Request {
                url: self.url.clone(),
                headers: headers.clone(),
                body: self.body.clone(),
            },
            Headers::Sign {
                verifier,
                identity,
                content_type,
                captured,
            } => {
                let mut signed = signing::signed(verifier, &self.body, now, identity, content_type);
                verifier.respell(captured, &mut signed.headers);
                Request {
                    url: signing::with_query(&self.url, signed.query.as_deref()),
                    headers: signed.headers,
                    body: Bytes::from(signed.body),
                }
            }
        }
    }
}

/// What an entry comes to before anything is sent.
enum Job<'a> {
    /// A capture line of a source other than `--source`.
    Skip,
    /// It cannot be sent: the tool's error code and why.
    Fail(Origin, &'static str, String),
    /// Ready to send.
    Send(Pending<'a>),
}

/// What sending a job came to.
enum Done {
    Skipped,
    /// Ready to go when Ctrl-C came, so never sent, and not counted.
    Unsent,
    Failed(Origin, &'static str, String),
    Answered(Origin, client::Answer),
    Unanswered(Origin, String),
}

/// Checks, before anything is sent, that every delivery's headers can go out as HTTP: a
/// captured header (or an event id or type that a scheme sends in one) holding a CR or LF is a
/// bad input to fix, not a network failure to retry. With `--secret` alone, so is a line whose
/// scheme its headers do not show. It reads the inputs once more, one entry
/// at a time.
///
/// Returns how many capture lines `--source` leaves out.
///
/// # Errors
/// The first delivery that cannot be sent, with its file and line.
pub fn check(files: &[InputFile], options: &Options) -> Result<u64, String> {
    // The report is written at the end: a path it cannot be written to is found now, before
    // anything is sent, not after the deliveries it was meant to record. Opened to append, so
    // a report already there stays until the new one replaces it.
    if let Some(path) = &options.report {
        // The report replaces what is at its path: one of the captures (a slip of tab
        // completion) would be lost, and "replay the same captures again" with it.
        if let Some(input) = files.iter().find(|file| file.is_the_file(path)) {
            return Err(format!(
                "--report {}: that is {}, one of the captures to replay, and the report would \
                 replace it; give the report another path; nothing was sent",
                path.display(),
                input.path.display()
            ));
        }
        // Tried where the report will be written: for a link, the file it leads to (removing
        // the link instead would leave an empty file where it led).
        let target = crate::capture::where_to_write(path).unwrap_or_else(|| path.clone());
        let there = target.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&target)
            .map_err(|e| {
                format!(
                    "--report: cannot write {}: {e}; nothing was sent",
                    path.display()
                )
            })?;
        // Made only to try: an empty report left by a replay that then stopped would read as
        // one that ran. The report is written when the replay ends.
        if !there {
            let _ = std::fs::remove_file(&target);
        }
    }
    // The sources the capture lines name: a `--source` none of them names is a typo, not a
    // replay with every line skipped.
    let mut sources = std::collections::BTreeSet::new();
    let mut skipped = 0;
    for entry in Entries::new(files.to_vec()) {
        if let Ok(Item::Line(line)) = &entry.item {
            if !sources.contains(&line.source) {
                sources.insert(line.source.clone());
            }
        }
        let body_file = matches!(entry.item, Ok(Item::Body(_)));
        match job(entry, options) {
            Job::Send(pending) => {
                for (name, value) in &pending.request(unix_now()).headers {
                    client::header_pair(name, value).map_err(|e| {
                        format!("{}: {e}; nothing was sent", pending.origin.place())
                    })?;
                }
            }
            // `--secret` without `--scheme` on a line whose scheme its headers do not show,
            // or whose scheme cannot use the secret, a source whose secret's variable is not
            // set here, or one that signs with a key the command line does not give: the
            // command line or the environment must change, for every line alike, so nothing
            // is sent.
            Job::Fail(
                origin,
                code @ ("unknown_scheme" | "unusable_secret" | "secret_not_set" | "cannot_sign"),
                message,
            ) => {
                return Err(format!(
                    "{}: {code}: {message}; nothing was sent",
                    origin.place()
                ));
            }
            // A body file's source is the command line's `--source`: one the config does not
            // have is a bad flag, as for `send`, not a delivery that failed.
            Job::Fail(_, "source_not_configured", message) if body_file => {
                return Err(format!("--source: {message}; nothing was sent"));
            }
            Job::Skip => skipped += 1,
            Job::Fail(..) => {}
        }
    }
    // The contract sends every line to a `--to` with a path; the lines of all but one source
    // then meet another source's check, and are refused. Said once, before they are.
    if options.to.has_path() && options.source.is_none() && sources.len() > 1 {
        let named: Vec<&str> = sources.iter().map(String::as_str).collect();
        errln!(
            "replay: warning: --to has a path, so every line is posted to it, and the captures \
             hold lines of {} sources ({}): those of the sources it is not for will be refused; \
             give the server's base URL (each line then goes to /webhooks/{{source}}), or \
             --source NAME",
            named.len(),
            named.join(", ")
        );
    }
    let only_captures = files.iter().all(|f| f.kind == InputKind::Capture);
    if let Some(only) = options.source.as_ref().filter(|_| only_captures) {
        if !sources.is_empty() && !sources.contains(only.as_str()) {
            let named: Vec<&str> = sources.iter().map(String::as_str).collect();
            return Err(format!(
                "--source {only}: no capture line is from that source (the captures hold {}); \
                 nothing was sent",
                named.join(", ")
            ));
        }
    }
    Ok(skipped)
}

/// Replays the entries of `files`, prints the summary to stdout (and progress to stderr),
/// writes the report, and returns the tally, whose [`Tally::all_ok`] is the exit status.
///
/// `to_skip` is what [`check`] found `--source` leaves out.
///
/// # Errors
/// The report cannot be written.
pub fn run(files: Vec<InputFile>, options: &Options, to_skip: u64) -> anyhow::Result<Tally> {
    let started = Instant::now();
    let mut tally = Tally::default();
    tally.to_skip = to_skip;
    if options.dry_run {
        dry_run(Entries::new(files), options, &mut tally);
    } else {
        // Counted up front (a read of every capture), so progress says "of how many".
        let total = Entries::count(&files);
        tally.total = Some(total);
        if total == 0 {
            // An export that failed into a pipe, or a window with no events: say so, since a
            // summary of zeros reads like a replay that ran.
            errln!("hookbox: the inputs hold no capture line and no body: nothing to replay");
        }
        let mut progress = Progress::new(total, std::io::stderr().is_terminal());
        actix_web::rt::System::new().block_on(send_all(
            Entries::new(files),
            options,
            &mut tally,
            &mut progress,
        ));
        progress.finish();
    }
    let duration = started.elapsed();
    // A reader that stopped early (`| head`) is no failure of the replay: the deliveries were
    // made and the exit status still says how they went.
    let _ = std::io::stdout()
        .lock()
        .write_all(tally.summary(duration).as_bytes());
    let stale = tally.rejected_with("stale_timestamp");
    if matches!(options.mode, Mode::AsIs) && stale > 0 {
        errln!(
            "hookbox: {stale} delivery(ies) refused stale_timestamp: --as-is sends the captured \
             signature and its time, which the receiver takes only within its tolerance. Leave \
             out --as-is to sign each afresh with a new timestamp (with --config or --secret)"
        );
    }
    let forged = tally.rejected_with("invalid_signature");
    if forged > 0 {
        // A re-run as it is cannot change these: say what would.
        let next = match options.mode {
            Mode::AsIs => {
                "--as-is sends each line's captured signature, which the receiver checks with \
                 its own secret, and an item of a batch (adyen, gocardless, sendgrid) cannot be \
                 sent as it was captured. Leave out --as-is to sign each afresh (with --config \
                 or --secret)"
            }
            // The warning before the sending said it: a line sent to another source's URL meets
            // that source's secret (a black-box run got only the hint below, about secrets).
            _ if options.to.has_path() && options.source.is_none() => {
                "--to has a path, so every line was posted to it whatever its source, and a line \
                 of another source meets that source's check; give the server's base URL (each \
                 line then goes to /webhooks/{source}) or --source NAME. Else the receiver checks \
                 with another secret than replay signed with: give the receiver's config or secret"
            }
            _ => {
                "the receiver checks with another secret than replay signed with (the source's \
                 first secret in --config, or --secret): give the receiver's config or secret"
            }
        };
        errln!("hookbox: {forged} delivery(ies) refused invalid_signature: {next}");
    }
    if let Some(path) = &options.report {
        tally.write_report(path, duration)?;
    }
    Ok(tally)
}

/// How long an interrupted replay waits for the deliveries in flight before it gives up on
/// them: long enough for a receiver's usual answer, short enough for someone pressing Ctrl-C.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Sends every job, paced and bounded, and counts the answers. Ctrl-C (SIGINT) stops it
/// starting deliveries; it then waits for those in flight (at most [`INTERRUPT_GRACE`], or
/// until a second Ctrl-C) and marks the tally interrupted, so the summary and the report
/// still say what was sent.
async fn send_all(entries: Entries, options: &Options, tally: &mut Tally, progress: &mut Progress) {
    let client = client::client();
    let mut pacer = options.rate.map(Pacer::new);
    // Shared by reference with the futures below, all on this one thread.
    let (stopped, sending) = (Cell::new(false), Cell::new(0_u64));
    let (stop, in_flight) = (&stopped, &sending);
    let results = futures_util::stream::iter(entries)
        .take_while(|_| std::future::ready(!stop.get()))
        .map(|entry| job(entry, options))
        .then(|job| {
            // The slot is taken when the job is pulled, that is when a place in flight is free,
            // so a slow receiver slows the schedule down instead of piling up a burst.
            let slot = match (&job, pacer.as_mut()) {
                (Job::Send(_), Some(pacer)) => Some(pacer.slot(Instant::now())),
                _ => None,
            };
            async move {
                if let Some(slot) = slot {
                    actix_web::rt::time::sleep_until(slot.into()).await;
                }
                job
            }
        })
        .map(|job| {
            let client = client.clone();
            async move {
                match job {
                    Job::Skip => Done::Skipped,
                    Job::Fail(origin, code, message) => Done::Failed(origin, code, message),
                    // Its pace slot came after Ctrl-C: it is not sent.
                    Job::Send(_) if stop.get() => Done::Unsent,
                    Job::Send(pending) => {
                        let request = pending.request(unix_now());
                        in_flight.set(in_flight.get() + 1);
                        let done = match client::deliver(&client, &request, &|_, _| {}).await {
                            Ok(answer) => Done::Answered(pending.origin, answer),
                            Err(message) => Done::Unanswered(pending.origin, message),
                        };
                        in_flight.set(in_flight.get() - 1);
                        done
                    }
                }
            }
        })
        .buffer_unordered(options.concurrency.max(1));
    let mut results = std::pin::pin!(results);
    let mut ticker = actix_web::rt::time::interval(progress::PLAIN_EVERY);
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    // A supervisor's stop (`timeout`, systemd) is SIGTERM: taken as a Ctrl-C, so the summary and
    // the report still say what was sent.
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut deadline: Option<tokio::time::Instant> = None;
    // The first delivery that got no answer is told at once, with why: the counts alone said
    // nothing of it until the summary, and each such delivery takes its retries' time.
    let mut told_unanswered = false;
    loop {
        let signalled = tokio::select! {
            done = results.next() => match done {
                Some(done) => {
                    if let Done::Unanswered(_, message) = &done {
                        if !std::mem::replace(&mut told_unanswered, true) {
                            progress.note(&format!(
                                "a delivery got no answer: {message}; each delivery is tried {} \
                                 times before it counts as unanswered, so a receiver that is \
                                 not there makes this run slow (Ctrl-C stops it, and says what \
                                 was sent)",
                                client::NETWORK_RETRIES + 1
                            ));
                        }
                    }
                    count(tally, done);
                    progress.update(tally);
                    false
                }
                None => break,
            },
            _ = ticker.tick() => {
                progress.update(tally);
                false
            }
            _ = &mut interrupt => {
                interrupt.set(tokio::signal::ctrl_c());
                true
            }
            Some(()) = recv_some(terminate.as_mut()) => true,
            () = sleep_until_some(deadline) => break,
        };
        if signalled {
            if stop.replace(true) {
                // A second Ctrl-C (or SIGTERM): wait no longer.
                break;
            }
            tally.interrupted = true;
            deadline = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
            match in_flight.get() {
                0 => errln!("\nhookbox: interrupted: sending no more"),
                n => errln!(
                    "\nhookbox: interrupted: sending no more; waiting up to {} s for the {n} \
                     {} in flight (Ctrl-C again to stop waiting)",
                    INTERRUPT_GRACE.as_secs(),
                    if n == 1 { "delivery" } else { "deliveries" }
                ),
            }
        }
    }
    tally.abandoned = in_flight.get();
}

/// The next signal of `signal`, or never when it could not be watched.
async fn recv_some(signal: Option<&mut tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`, or forever when there is none.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn count(tally: &mut Tally, done: Done) {
    match done {
        Done::Skipped => tally.skipped += 1,
        Done::Unsent => {}
        Done::Failed(origin, code, message) => tally.failure(origin, code, message),
        Done::Answered(origin, answer) => tally.answered(origin, &answer),
        Done::Unanswered(origin, message) => tally.unanswered(origin, message),
    }
}

/// Prints each delivery as it would be sent, to stdout; sends nothing. Stops printing, quietly,
/// once stdout is closed (`| head`).
fn dry_run(entries: Entries, options: &Options, tally: &mut Tally) {
    let mut out = std::io::stdout().lock();
    for entry in entries {
        match job(entry, options) {
            Job::Skip => tally.skipped += 1,
            Job::Fail(origin, code, message) => tally.failure(origin, code, message),
            Job::Send(pending) => {
                if print_delivery(&mut out, &pending).is_err() {
                    return;
                }
            }
        }
    }
    let _ = writeln!(out, "dry run: nothing was sent");
}

fn print_delivery(out: &mut dyn Write, pending: &Pending<'_>) -> std::io::Result<()> {
    let request = pending.request(unix_now());
    let o = &pending.origin;
    writeln!(
        out,
        "POST {}  ({}, {} {})",
        crate::redact::target_url(&request.url),
        o.place(),
        o.source.as_deref().unwrap_or("-"),
        o.event_id.as_deref().unwrap_or("-")
    )?;
    // A signed delivery may carry a secret as it is (GitLab's token, Adyen's Basic auth): only
    // what the scheme keeps with a stored event (a signature, an id) and `Content-Type` are
    // shown, the rest masked. Captured headers were kept, so they are shown.
    let shown = |name: &str| match &pending.headers {
        Headers::Captured(_) => true,
        Headers::Sign { verifier, .. } => {
            name.eq_ignore_ascii_case("content-type")
                || verifier
                    .kept_headers()
                    .iter()
                    .any(|kept| kept.eq_ignore_ascii_case(name))
        }
    };
    for (name, value) in &request.headers {
        if shown(name) {
            writeln!(out, "  {name}: {value}")?;
        } else {
            writeln!(out, "  {name}: *** (not shown: it may hold a secret)")?;
        }
    }
    writeln!(out, "  ({} bytes of body)", request.body.len())
}

/// Turns an entry into a job: where it goes and how it is signed.
fn job<'a>(entry: Entry, options: &'a Options) -> Job<'a> {
    let mut origin = Origin {
        file: entry.file.display().to_string(),
        line: entry.line,
        ..Origin::default()
    };
    let item = match entry.item {
        Ok(item) => item,
        Err(unreadable) => {
            origin.source = unreadable.source;
            origin.event_id = unreadable.event_id;
            return Job::Fail(origin, "invalid_capture", unreadable.message);
        }
    };
    match item {
        Item::Line(line) => {
            origin.source = Some(line.source.clone());
            origin.event_id = Some(line.event_id.clone());
            if options
                .source
                .as_ref()
                .is_some_and(|only| only.as_str() != line.source)
            {
                return Job::Skip;
            }
            // The name goes into the URL's path: only a valid source name may.
            if let Err(message) = SourceName::try_from(line.source.as_str()) {
                return Job::Fail(origin, "invalid_capture", message);
            }
            let headers = match &options.mode {
                Mode::AsIs => Headers::Captured(
                    line.headers
                        .into_iter()
                        .filter(|(name, _)| {
                            !NEVER_SENT
                                .iter()
                                .any(|never| name.eq_ignore_ascii_case(never))
                        })
                        .collect(),
                ),
                Mode::Resign(signer) => {
                    let captured: Vec<(String, String)> = line
                        .headers
                        .iter()
                        .map(|(name, value)| (name.clone(), value.clone()))
                        .collect();
                    match signer.for_capture(&line.source, &captured, &line.body, &line.event_id) {
                        Ok(verifier) => {
                            if let Some(why) = verifier.unsignable(&line.body) {
                                return Job::Fail(origin, "cannot_sign", why);
                            }
                            Headers::Sign {
                                verifier,
                                identity: Identity {
                                    event_id: Some(line.event_id),
                                    event_type: line.event_type,
                                },
                                content_type: ContentType::Captured(
                                    line.headers.get("content-type").cloned(),
                                ),
                                captured,
                            }
                        }
                        Err((code, message)) => return Job::Fail(origin, code, message),
                    }
                }
            };
            Job::Send(Pending {
                url: options.to.url_for(&line.source),
                origin,
                body: Bytes::from(line.body),
                headers,
            })
        }
        Item::Body(body) => {
            let (Some(source), Mode::Resign(signer)) = (&options.source, &options.mode) else {
                // The command line refuses body files without --source, or with --as-is.
                return Job::Fail(
                    origin,
                    "invalid_capture",
                    "a body file needs --source and a secret to be signed with".to_owned(),
                );
            };
            origin.source = Some(source.to_string());
            let verifier = match signer.for_entry(source.as_str()) {
                Ok(verifier) => verifier,
                Err((code, message)) => return Job::Fail(origin, code, message),
            };
            if let Some(why) = verifier.unsignable(&body) {
                return Job::Fail(origin, "cannot_sign", why);
            }
            // A body file carries no id header; one derived from its bytes makes a second
            // replay of the same file a redelivery of the same event, as it should be.
            let file_id = format!("file_{}", &hex::encode(Sha256::digest(&body))[..24]);
            let identity = signing::identity(verifier, &body, Some(&file_id), None);
            origin.event_id.clone_from(&identity.event_id);
            Job::Send(Pending {
                url: options.to.url_for(source.as_str()),
                origin,
                body: Bytes::from(body),
                headers: Headers::Sign {
                    verifier,
                    identity,
                    content_type: ContentType::Default,
                    captured: Vec::new(),
                },
            })
        }
    }
}
