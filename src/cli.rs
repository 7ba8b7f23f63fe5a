//! The command line: `hookbox serve`, `migrate`, `purge`, and the tools `export`, `replay` and
//! `send`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};

use crate::capture::{self, ExportFilter, InputKind};
use crate::config::{parse_time_or_ago, Config, ProcessEnv};
use crate::handlers::Handlers;
use crate::ids::SourceName;
use crate::providers::Signing;
use crate::replay::{Mode, Options as ReplayOptions, Rate, Signer, Target};
use crate::retention::{self, Plan};
use crate::secret::Secret;
use crate::send::{SendError, SendOptions};
use crate::startup::Application;

/// hookbox: a webhook receiver that processes every event exactly once.
///
/// It verifies each delivery's signature (Stripe, PayPal, Adyen, Square, Braintree, Paddle,
/// Checkout.com, Razorpay, GoCardless, Mollie, Lemon Squeezy, Twilio, GitHub, Shopify, Slack,
/// GitLab, Bitbucket, Linear, Zoom, Twitch, Meta, Discord, SendGrid, AWS SNS, Standard
/// Webhooks or a generic HMAC), claims the event id with a unique insert in its store (an SQLite file, or
/// PostgreSQL for several instances), processes the event and stores the response in one
/// transaction, and answers every redelivery with the stored response.
#[derive(Parser, Debug)]
#[command(
    name = "hookbox",
    version = crate::VERSION,
    about,
    long_about,
    after_help = "Start with `hookbox serve --config hookbox.toml` (examples/hookbox.toml is a\n\
                  first config; without --config: $HOOKBOX_CONFIG, then ./hookbox.toml), and\n\
                  `hookbox send` to post it a signed test event. `hookbox COMMAND --help`\n\
                  explains each command; README.md and docs/ explain the rest."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the receiver: apply pending migrations, then serve POST /webhooks/{source}.
    ///
    /// Listens on [server].listen (or HOOKBOX_LISTEN) and stops gracefully on SIGTERM or
    /// Ctrl-C, letting in-flight deliveries finish. Events are kept where [database].url (or
    /// DATABASE_URL) says: postgres://..., sqlite://PATH or sqlite::memory:; with neither set,
    /// in the SQLite file hookbox.db in the working directory. A source with
    /// [sources.NAME.forward] (or [[sources.NAME.forward]], one table per target) has each
    /// stored event sent on to its targets from here too: signed HTTP POSTs, NATS JetStream or
    /// RabbitMQ, retried until delivered or dead (docs/forwarding.md, docs/bus-targets.md).
    ///
    /// The admin API and the console (/admin, /console) are on when [admin].token_env names a
    /// set variable holding the token. Logs go to stderr; RUST_LOG sets the level (info by
    /// default; RUST_LOG=debug for more). Exit 0 after a graceful stop, 1 when it cannot start
    /// (port taken, database unreachable), 2 on a bad config, before anything listens.
    Serve(ConfigArg),
    /// Apply pending database migrations and exit.
    ///
    /// Instances take turns (an advisory lock on PostgreSQL, the write lock on SQLite), so
    /// running this while servers start is safe. Needs only [database].url or DATABASE_URL.
    /// Exit 0 when the schema is up to date, 1 when the database fails, 2 on a bad config.
    Migrate(ConfigArg),
    /// Run one retention purge pass now; print what it removed per source and in total.
    ///
    /// Without --older-than, each source keeps its own window (sources.NAME.retention, else
    /// [retention].window or its provider's redelivery horizon, whichever is longer), exactly
    /// as the scheduled purge inside `serve` does. On PostgreSQL it waits for nothing: if
    /// another hookbox is purging at this moment, it says so and exits 1. On SQLite, where
    /// passes share the work, a batch waits up to 60 s for the file's write lock. Ctrl-C
    /// stops it after the batch in progress, prints what it removed so far, and exits 130.
    /// Exit 0 after a pass, 1 when the database fails, 2 on bad usage or a bad config.
    Purge(PurgeArgs),
    /// Write stored deliveries as a capture: NDJSON, one delivery a line, oldest first.
    ///
    /// Each line holds the source, event id and type, the received time, the kept headers
    /// (lowercase; the scheme's own and content-type, never authorization or cookies) and the
    /// raw body byte for byte ("body", or "body_base64" when it is not UTF-8). It reads one
    /// snapshot in batches, so it runs in constant memory however much is stored, and says
    /// on stderr how many it wrote. With --out, the capture is written whole or not at all
    /// (a new file is readable by its owner only).
    ///
    /// Exit 0 when written, 1 when the store is not there or fails, 2 on bad usage or a bad
    /// config, 130 on Ctrl-C or SIGTERM (nothing left at --out; to stdout or a FIFO, it
    /// stops between two lines and says how many went out).
    ///
    /// Example: hookbox export --source stripe --since 24h --out stripe.ndjson
    Export(ExportArgs),
    /// Re-send captured deliveries, re-signed with a fresh timestamp like a provider's retry.
    ///
    /// Takes NDJSON captures (from `hookbox export`; `-` for stdin), plain .json files holding
    /// one body each (with --source), or directories of them. Each delivery is posted to
    /// {to}/webhooks/{source} and signed with the first secret of its source in the config (or
    /// --scheme and --secret; or --secret alone, each line signed by the scheme its captured
    /// signature headers show), under its captured event id and type; --as-is sends the
    /// captured headers unchanged instead. A receiver that processed an event before answers with its
    /// stored response, so replaying twice is safe.
    ///
    /// Prints a summary (sent, processed, replayed, rejected by error code, failed, latency
    /// p50/p99, and each delivery that did not get a 2xx). Exit 0 when every delivery got a
    /// 2xx, 1 when any was rejected or failed (or a line could not be read), 2 on bad usage.
    /// Ctrl-C (or SIGTERM) stops sending, waits up to 5 s for the deliveries in flight, prints
    /// the summary and writes the report so far (marked "interrupted"), and exits 130.
    ///
    /// Example: hookbox replay stripe.ndjson --to http://127.0.0.1:8080 --report replay.json
    Replay(ReplayArgs),
    /// Sign one body the way the source's provider would and send it (like `stripe trigger`).
    ///
    /// Prints the status, whether the receiver had processed the event before (a replay), and
    /// the answer's body. Exit 0 on a 2xx, 1 otherwise, 2 on bad usage.
    ///
    /// Example: hookbox send --to http://127.0.0.1:8080 --source stripe event.json
    Send(SendArgs),
}

#[derive(Args, Debug)]
struct PurgeArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Remove events of every source received longer ago than this (e.g. 30d), instead of
    /// each source's window
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_older_than)]
    older_than: Option<Duration>,
    /// Count what would be removed, and remove nothing
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct ConfigArg {
    /// The config file [default: $HOOKBOX_CONFIG, then ./hookbox.toml]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ExportArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this source's deliveries
    #[arg(long, value_name = "NAME", value_parser = source_name)]
    source: Option<SourceName>,
    /// Only those received at or after this time: RFC 3339, a UTC date or date and time
    /// (2026-12-02, 2026-12-02 09:00), or a duration ago (24h, 30m)
    #[arg(long, value_name = "TIME", value_parser = time_or_ago)]
    since: Option<DateTime<Utc>>,
    /// Only those received before this time, in the same forms as --since
    #[arg(long, value_name = "TIME", value_parser = time_or_ago)]
    until: Option<DateTime<Utc>>,
    /// Write here instead of stdout (the file appears only once the export is complete)
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// Where the signing secret comes from.
#[derive(Args, Debug)]
struct KeyArgs {
    /// The config file whose sources' schemes and first secrets sign [default:
    /// $HOOKBOX_CONFIG, then ./hookbox.toml]
    #[arg(long, value_name = "FILE", conflicts_with_all = ["scheme", "secret"])]
    config: Option<PathBuf>,
    /// Sign with this scheme instead of a config source's, with --secret (or --key for
    /// discord, sendgrid and standard's v1a, --key and --cert-url for sns): stripe, standard,
    /// github, shopify, slack, discord, ... (hmac, hmac-sha256, paypal, square, braintree and
    /// twilio sign with keys of their source: give --config)
    #[arg(long, value_name = "SCHEME")]
    scheme: Option<String>,
    /// The secret to sign with, with --scheme. For replay, --secret alone signs each capture
    /// line with the scheme its kept headers show (stripe-signature: stripe, webhook-signature:
    /// standard, x-hub-signature-256 with x-github-delivery: github, ...); a line they do not
    /// tell, and a .json body file, need --scheme
    #[arg(long, value_name = "SECRET")]
    secret: Option<String>,
    /// The PEM private key to sign with, for a scheme that signs with one (paypal and sns:
    /// RSA; sendgrid: P-256, PKCS#8 or SEC1; discord and standard's v1a: Ed25519, PKCS#8)
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Where the receiver fetches the certificate of --key (paypal's PAYPAL-CERT-URL, sns's
    /// SigningCertURL)
    #[arg(long, value_name = "URL")]
    cert_url: Option<String>,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// NDJSON captures, .json body files (with --source), or directories of them; `-` for
    /// a capture on stdin
    #[arg(value_name = "CAPTURE", required = true)]
    captures: Vec<PathBuf>,
    /// The receiver's base URL (http://127.0.0.1:8080); deliveries go to
    /// /webhooks/{source} under it, before any query it has. A URL with a path is used as it
    /// is.
    #[arg(long, value_name = "URL")]
    to: String,
    #[command(flatten)]
    keys: KeyArgs,
    /// The source of .json body files; with captures, replay only this source's lines
    #[arg(long, value_name = "NAME", value_parser = source_name)]
    source: Option<SourceName>,
    /// Send the captured headers unchanged instead of re-signing (old signatures past the
    /// receiver's tolerance are refused, as they should be); authorization,
    /// proxy-authorization, cookie, set-cookie, host and framing headers are never sent
    #[arg(long, conflicts_with_all = ["scheme", "secret", "key", "cert_url"])]
    as_is: bool,
    /// How many deliveries may be in flight at once (1 to 1024)
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Start deliveries at this steady rate at most: 50/s, 600/m or 60/h (from 1/h to
    /// 1000000/s; a bare number is per second)
    #[arg(long, value_name = "N/s")]
    rate: Option<Rate>,
    /// Print each delivery as it would be sent (URL, headers, body size); send nothing
    #[arg(long)]
    dry_run: bool,
    /// Write the counts, latencies and every delivery that did not get a 2xx here, as JSON
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

#[derive(Args, Debug)]
// The shared --secret help speaks of replay's capture lines; send signs one body.
#[command(mut_arg("secret", |arg| arg.help(
    "The secret to sign with, with --scheme (instead of --config's source)"
)))]
struct SendArgs {
    /// The receiver's base URL (http://127.0.0.1:8080); the body goes to /webhooks/{source}
    /// under it, before any query it has. A URL with a path is used as it is.
    #[arg(long, value_name = "URL")]
    to: String,
    /// The source to send as: its scheme and first secret sign the body
    #[arg(long, value_name = "NAME", value_parser = source_name)]
    source: SourceName,
    #[command(flatten)]
    keys: KeyArgs,
    /// The event id, for schemes whose id travels in a header (standard, github, shopify,
    /// razorpay, gitlab, bitbucket, linear, twitch, twilio, and hmac or hmac-sha256 with a
    /// header id) [default: a new evt_... each time]. Send the same id twice to see the replay.
    #[arg(long, value_name = "ID")]
    event_id: Option<String>,
    /// The event type, for schemes whose type travels in a header (github, shopify, gitlab,
    /// bitbucket, linear, lemonsqueezy, and hmac or hmac-sha256 with a header type); the
    /// others read it from the body, and refuse a type other than the body's
    #[arg(long, value_name = "TYPE")]
    event_type: Option<String>,
    /// The body to send, byte for byte ("-" reads stdin)
    #[arg(value_name = "BODY_FILE")]
    body_file: PathBuf,
}

fn source_name(text: &str) -> Result<SourceName, String> {
    SourceName::try_from(text)
}

fn time_or_ago(text: &str) -> Result<DateTime<Utc>, String> {
    parse_time_or_ago(text, Utc::now())
}

/// Bad usage or a bad config: exit 2.
const USAGE: u8 = 2;

/// Stopped by Ctrl-C (SIGINT) after saying what was done: 128 + 2, as a shell reports it.
const INTERRUPTED: u8 = 130;

/// Runs the command line and returns the exit code: 0 success, 1 runtime failure, 2 bad usage
/// or bad config.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::telemetry::init();
    let outcome = match cli.command {
        Command::Serve(arg) => load(arg.config.as_deref())
            .and_then(|config| {
                config
                    .check_listen()
                    .map_err(|e| usage(format_args!("config error: {e}")))?;
                Ok(config)
            })
            .and_then(|config| finish(serve(config))),
        Command::Migrate(arg) => Config::load_for_migrate(arg.config.as_deref(), &ProcessEnv)
            .map_err(|e| usage(format_args!("config error: {e}")))
            .and_then(|c| finish(migrate(&c))),
        Command::Export(args) => export(args),
        Command::Replay(args) => replay(args),
        Command::Send(args) => send(args),
        Command::Purge(args) => load_for_purge(&args).and_then(|c| match purge(&c, &args) {
            Ok(Pass::Interrupted) => Ok(ExitCode::from(INTERRUPTED)),
            other => finish(other.map(drop)),
        }),
    };
    outcome.unwrap_or_else(|code| code)
}

/// An exit code that ends the command early, its message already printed.
type Exit = ExitCode;

fn usage(message: impl std::fmt::Display) -> Exit {
    errln!("hookbox: {message}");
    ExitCode::from(USAGE)
}

fn load(path: Option<&Path>) -> Result<Config, Exit> {
    Config::load(path, &ProcessEnv).map_err(|e| usage(format_args!("config error: {e}")))
}

/// Connects to the store for a command that only reads or removes what is there (`export`,
/// `purge`): an SQLite file that is not there is not made (an empty one, left behind in
/// whatever directory the command ran in, would hide the mistake), and the error says where it
/// looked and where the URL came from.
fn connect_existing(config: &Config, nothing: &str) -> anyhow::Result<crate::db::AnyConnection> {
    if let crate::db::Store::SqliteFile(path) = &config.database.store {
        if !Path::new(path).exists() {
            let here = std::env::current_dir()
                .map(|dir| format!(" (in {})", dir.display()))
                .unwrap_or_default();
            let whence = match config.database.url_from {
                crate::store::UrlFrom::Default => "the default, as neither a config file's \
                     [database].url nor DATABASE_URL names one"
                    .to_owned(),
                from => format!("as {} says", from.describe()),
            };
            anyhow::bail!(
                "no SQLite store at {path}{here}, {whence}; {nothing}. Point --config or \
                 DATABASE_URL at the store serve uses"
            );
        }
    }
    // A database that is not there is never this command's to make: the store is elsewhere.
    crate::db::connect(&config.database).map_err(|e| {
        let text = format!("{e:#}");
        if text.contains(crate::db::NO_DATABASE) {
            anyhow::anyhow!(
                "{}",
                text.replace(
                    crate::db::NO_DATABASE,
                    &format!(
                        "{nothing}: point --config or DATABASE_URL at the database serve uses"
                    )
                )
            )
        } else {
            e
        }
    })
}

/// The config for `purge`, which uses no secret: a source's secret variable left unset (a cron
/// job's environment) is let pass with `--older-than`, one window for every source. Without it
/// each source's own window is needed, so `[sources]` must be read, secrets and all.
fn load_for_purge(args: &PurgeArgs) -> Result<Config, Exit> {
    let (config, unread) = Config::load_without_secrets(args.config.config.as_deref(), &ProcessEnv)
        .map_err(|e| usage(format_args!("config error: {e}")))?;
    match unread {
        Some(e) if args.older_than.is_none() => Err(usage(format_args!(
            "config error: {e}; purge reads [sources] for each source's retention window: set \
             the variable, or give one window for every source with --older-than"
        ))),
        _ => Ok(config),
    }
}

/// `error` with what to do when it says the store has no hookbox tables (a database never
/// migrated, or not the one `serve` uses): the database's words alone name a table.
fn no_schema_hint(error: anyhow::Error) -> anyhow::Error {
    if is_missing_schema(&error) {
        error.context(
            "this database has no hookbox tables: is it the one serve uses (--config, \
             DATABASE_URL)? hookbox migrate makes them in a new one",
        )
    } else {
        error
    }
}

/// Whether `error` says the database has no hookbox tables.
fn is_missing_schema(error: &anyhow::Error) -> bool {
    let text = format!("{error:#}");
    text.contains("relation \"events\" does not exist") || text.contains("no such table")
}

fn finish(result: anyhow::Result<()>) -> Result<ExitCode, Exit> {
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            // A URL libpq cannot read is bad config, whichever command found it.
            let config = e.downcast_ref::<crate::db::UnreadableUrl>().is_some();
            if config {
                errln!("hookbox: config error: {e:#}");
            } else {
                errln!("hookbox: error: {e:#}");
            }
            Ok(ExitCode::from(if config { USAGE } else { 1 }))
        }
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(config, Handlers::default())?;
        let stopped = app.run_until_stopped().await;
        // Stopped: what had to end has ended (requests, forward attempts, the replay counts,
        // SQLite's checkpoint). A query still waiting on a database that stopped answering (a
        // purge batch, a `/readyz` check, an admin read, each on a blocking thread) would hold
        // the runtime's end for ever, since it waits for every such thread: a black-box run's
        // serve logged `hookbox stopped` and was still there 70 s later. Its transaction rolls
        // back when the process's connection goes.
        match stopped {
            Ok(()) => end_now(0),
            Err(e) => {
                errln!("hookbox: error: {e:#}");
                end_now(1)
            }
        }
    })
}

/// Ends the process at once with `code`, past the runtime's end (see [`serve`]). Not
/// `std::process::exit`: its exit handlers ran while the runtime's threads were still at work
/// (this thread's thread-locals torn down under it, the TLS library's cleanup), and a serve
/// stopped within a second of its start sometimes panicked after `hookbox stopped` or died
/// of SIGSEGV (found by a black-box run).
fn end_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes no pointer and ends the process without running exit handlers or
    // destructors, which is what is wanted here: nothing left needs them.
    unsafe { libc::_exit(code) }
}

fn migrate(config: &Config) -> anyhow::Result<()> {
    // A relative SQLite path is the working directory's: run from another directory, migrate
    // would make a new, empty store there, which is said (a deploy step's log names it).
    let new_file = match &config.database.store {
        crate::db::Store::SqliteFile(path) if !std::path::Path::new(path).exists() => {
            Some(crate::db::sqlite::absolute(path))
        }
        _ => None,
    };
    let migrated = crate::db::migrate_store(&config.database, |_| Ok(()))?;
    if let Some(file) = new_file {
        outln!("created a new, empty SQLite store: {file}");
    }
    let applied = migrated.applied;
    if !migrated.unknown.is_empty() {
        errln!(
            "warning: {} holds {} migration(s) this hookbox does not know ({}): a newer hookbox \
             migrated it. Beside it during a rolling deploy, or after a rollback, this one serves \
             with what docs/tools.md (Rolling back) lists it cannot take part in; never undo the \
             migrations",
            config.database.display_url(),
            migrated.unknown.len(),
            migrated.unknown.join(", ")
        );
    }
    if applied.is_empty() && migrated.unknown.is_empty() {
        outln!(
            "database schema is up to date ({})",
            config.database.display_url()
        );
    } else if applied.is_empty() {
        outln!(
            "nothing to apply to {}: every migration this hookbox knows is applied",
            config.database.display_url()
        );
    } else {
        outln!(
            "applied {} migration(s) to {}: {}",
            applied.len(),
            config.database.display_url(),
            applied.join(", ")
        );
    }
    Ok(())
}

/// How a `purge` pass ended.
enum Pass {
    Done,
    /// Ctrl-C stopped it between batches; what it removed until then is printed.
    Interrupted,
}

/// Whether `error` is a write's (the disk full, a device that takes nothing), not the
/// database's: an I/O error of this process's own.
fn is_write_failure(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some())
}

/// What to do after an export to `place` stopped with `error`.
fn run_export_again(error: &anyhow::Error, place: &str) -> String {
    if is_write_failure(error) {
        format!("run it again once {place} can be written")
    } else {
        "run it again once the database answers".to_owned()
    }
}

/// Whether `error` comes from writing to a pipe whose reader has gone.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// At Ctrl-C (SIGINT) or SIGTERM, runs `cleanup` and exits 130 if it says so (`true`; `false`:
/// the work is done, and the command ends as it would have): for a command that leaves
/// something behind if it is killed where it stands (`export --out`'s partial file).
fn exit_on_interrupt(cleanup: impl FnOnce() -> bool + Send + 'static) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot watch for Ctrl-C")?;
    let (mut interrupts, mut terminations) = {
        let _entered = runtime.enter();
        (
            signal(SignalKind::interrupt()).context("cannot watch for Ctrl-C")?,
            signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?,
        )
    };
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = interrupts.recv() => {}
                _ = terminations.recv() => {}
            }
        });
        if cleanup() {
            std::process::exit(i32::from(INTERRUPTED));
        }
    });
    Ok(())
}

/// A purge pass's summary on stdout: a line a source, `{verb} N from SOURCE`, then `{verb} N
/// in total` and `ending`. Every configured source has its line, those with nothing to remove
/// too (a script reads one per source); a source no longer configured has one when it had
/// events to remove.
fn say_removed(
    report: &retention::Report,
    sources: &[crate::config::SourceConfig],
    verb: &str,
    ending: &str,
) {
    let mut removed = report.removed.clone();
    for source in sources {
        removed.entry(source.name.as_str().to_owned()).or_insert(0);
    }
    for (source, n) in &removed {
        outln!("{verb} {n} from {source}");
    }
    outln!("{verb} {} in total{ending}", report.total());
}

/// How long a purge stopped by a signal waits for the batch in progress before it quits
/// without it.
const BATCH_AFTER_A_STOP: Duration = Duration::from_secs(10);

/// Sets `stop` at the first Ctrl-C (SIGINT) or SIGTERM, so a purge ends after the batch it is
/// in and says what it removed; a second one, or [`BATCH_AFTER_A_STOP`] without the batch
/// ending (after `given_up`, which says what was removed), exits at once (the batch in
/// progress rolls back). Both are caught from the moment this returns.
fn stop_on_ctrl_c(
    stop: Arc<AtomicBool>,
    given_up: impl FnOnce() + Send + 'static,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot watch for Ctrl-C")?;
    let (mut interrupts, mut terminations) = {
        let _entered = runtime.enter();
        (
            signal(SignalKind::interrupt()).context("cannot watch for Ctrl-C")?,
            signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?,
        )
    };
    std::thread::spawn(move || {
        runtime.block_on(async {
            let which = tokio::select! {
                _ = interrupts.recv() => "Ctrl-C",
                _ = terminations.recv() => "SIGTERM",
            };
            stop.store(true, Ordering::Relaxed);
            errln!(
                "\nhookbox: interrupted ({which}): stopping after the batch in progress \
                 (Ctrl-C or SIGTERM again to quit at once)"
            );
            // A batch that never ends (the database stopped answering) must not hold the
            // stop: a black-box run's purge waited for ever on one SIGTERM.
            tokio::select! {
                _ = interrupts.recv() => {}
                _ = terminations.recv() => {}
                () = tokio::time::sleep(BATCH_AFTER_A_STOP) => {
                    errln!(
                        "hookbox: the batch in progress did not end within {} s of the signal \
                         (a lock held elsewhere, or a database that stopped answering): \
                         quitting; it rolls back, and a later purge removes what it would have",
                        BATCH_AFTER_A_STOP.as_secs()
                    );
                    given_up();
                }
            }
            std::process::exit(i32::from(INTERRUPTED));
        });
    });
    Ok(())
}

/// Progress said from a thread of its own, so that a command waiting on the database says so
/// rather than going quiet: every `every`, `say(count, waited)` with the count the command
/// last reported ([`Ticker::advanced`]) and how long ago it did. Stops (and waits for its last
/// line) when dropped.
struct Ticker {
    count: Arc<AtomicU64>,
    last: Arc<std::sync::Mutex<Instant>>,
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn start(every: Duration, say: impl Fn(u64, Duration) + Send + 'static) -> Ticker {
        let count = Arc::new(AtomicU64::new(0));
        let last = Arc::new(std::sync::Mutex::new(Instant::now()));
        let (done, ended) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn({
            let (count, last) = (Arc::clone(&count), Arc::clone(&last));
            move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    ended.recv_timeout(every)
                {
                    let waited = last
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .elapsed();
                    say(count.load(Ordering::Relaxed), waited);
                }
            }
        });
        Ticker {
            count,
            last,
            done: Some(done),
            thread: Some(thread),
        }
    }

    /// The command got as far as `count`, now.
    fn advanced(&self, count: u64) {
        self.count.store(count, Ordering::Relaxed);
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How long a purge batch on SQLite waits for the write lock another process holds.
const PURGE_LOCK_WAIT: Duration = Duration::from_secs(60);

fn purge(config: &Config, args: &PurgeArgs) -> anyhow::Result<Pass> {
    let plan = match args.older_than {
        Some(window) => Plan::older_than(window),
        None => Plan::from_config(config),
    };
    let mut conn = connect_existing(config, "nothing to purge")?;
    // On SQLite a batch waits for the one write lock while serve writes: longer than a
    // delivery would (the progress line says when a batch waits), rather than failing the pass.
    if let crate::db::AnyConnection::Sqlite(sqlite) = &mut conn {
        use diesel::connection::SimpleConnection;
        sqlite
            .batch_execute(&format!(
                "PRAGMA busy_timeout = {}",
                PURGE_LOCK_WAIT.as_millis()
            ))
            .context("cannot set up the SQLite connection")?;
    }
    let started = Instant::now();
    let (report, verb) = if args.dry_run {
        let report = retention::dry_run(&mut conn, &plan)
            .map_err(|e| no_schema_hint(anyhow::Error::new(e)))?;
        (report, "would remove")
    } else {
        // Progress every 2 s from a thread of its own, so a batch that waits (for rows another
        // session holds locked) says so rather than going quiet.
        let holder = match &conn {
            crate::db::AnyConnection::Sqlite(_) => {
                "the SQLite file's write lock is held by another process (serve writing, or a \
                 tool)"
            }
            crate::db::AnyConnection::Postgres(_) => {
                "rows it removes may be locked by another session, or the database has stopped \
                 answering"
            }
        };
        let ticker = Ticker::start(Duration::from_secs(2), move |so_far, waited| {
            if waited >= Duration::from_secs(2) {
                errln!(
                    "purging: {so_far} removed so far; the batch under way has taken {} s \
                     ({holder})",
                    waited.as_secs()
                );
            } else {
                errln!("purging: {so_far} removed so far");
            }
        });
        // What the batches committed so far removed, said should a later one fail, or the
        // stop give the batch in progress up (from the signal's thread).
        let committed = Arc::new(std::sync::Mutex::new(retention::Report::default()));
        let so_far = |committed: &std::sync::Mutex<retention::Report>| {
            committed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        let mut progress = |report: &retention::Report| {
            committed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone_from(report);
            ticker.advanced(report.total());
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (given_up, sources) = (Arc::clone(&committed), config.sources.clone());
        stop_on_ctrl_c(Arc::clone(&stop), move || {
            say_removed(
                &so_far(&given_up),
                &sources,
                "removed",
                "; interrupted (Ctrl-C or SIGTERM) and the batch in progress given up, \
                 whatever is left goes in the next pass",
            );
        })?;
        let pass = retention::purge_logged(&mut conn, &plan, &stop, &mut progress);
        drop(ticker);
        if pass.is_err() {
            for (source, n) in &so_far(&committed).removed {
                outln!("removed {n} from {source} before the failure");
            }
        }
        let pass = pass.map_err(|e| {
            // On SQLite only: PostgreSQL's purge waits on rows without a timeout.
            if crate::db::sqlite::is_busy(&e) {
                return anyhow::anyhow!(
                    "{e}: {holder} and did not let go within {} s; what was removed before \
                     stays removed; run purge again once it is free",
                    PURGE_LOCK_WAIT.as_secs()
                );
            }
            if crate::db::Failure::of(&e) == crate::db::Failure::Unreachable {
                // hookbox's sentence first: libpq's text for a lost connection runs over
                // three lines, and what to do came after them (a black-box run).
                return anyhow::anyhow!(
                    "the connection to the database {} was lost part way (a restart, a \
                     failover, a network that dropped it); what was removed before stays \
                     removed; run purge again once the database answers (the database's \
                     client said: {})",
                    config.database.display_url(),
                    e.to_string()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            if crate::db::Failure::of(&e) == crate::db::Failure::Full {
                // Deleting rows needs room for the log of the deletes: purge cannot free a
                // full disk (a black-box run: only the database's words were said).
                return anyhow::anyhow!(
                    "{e}: the disk of the store {} is full, and deleting rows needs room to \
                     log the deletes, so purge cannot free it; what was removed before stays \
                     removed; free space on that disk by other means first, then run purge \
                     again",
                    config.database.display_url()
                );
            }
            if crate::db::Failure::of(&e) == crate::db::Failure::Permission {
                return anyhow::anyhow!(
                    "{e}: the store {} does not take this user's deletes (a read-only file or \
                     directory, or a role without DELETE on one of hookbox's tables, the one \
                     named: events, deliveries, or transmissions, added by a migration since \
                     the grants were run); what was removed before stays removed; run purge as \
                     the user serve runs as, or run the GRANT of docs/stores.md, Roles, again",
                    config.database.display_url()
                );
            }
            no_schema_hint(anyhow::Error::new(e))
        })?;
        let Some(report) = pass else {
            anyhow::bail!(
                "another hookbox is purging right now; nothing was removed (try again in a moment)"
            );
        };
        (report, "removed")
    };
    let ending = if args.dry_run {
        "; dry run, nothing was deleted"
    } else if report.interrupted {
        "; interrupted (Ctrl-C or SIGTERM), whatever is left goes in the next pass"
    } else {
        ""
    };
    say_removed(
        &report,
        &config.sources,
        verb,
        &format!(" ({} ms){ending}", started.elapsed().as_millis()),
    );
    // A running serve remembers recent answers for its sources' own windows, and hears
    // nothing of this pass: said here, where the operator is looking.
    let shorter = args.older_than.is_some_and(|older_than| {
        config
            .sources
            .iter()
            .any(|source| retention::source_window(source, config.retention.window) > older_than)
    });
    if shorter && !args.dry_run && report.total() > 0 {
        errln!(
            "hookbox: note: --older-than is shorter than a source's retention window, and a \
             serve running now may still answer an event this pass removed as a replay (from \
             its memory of recent answers) without processing it; restart serve if those \
             events must be processed anew"
        );
    }
    if report.pending_forwards > 0 {
        let (deliveries, were, go) = match (args.dry_run, report.pending_forwards == 1) {
            (true, true) => ("forward delivery", "is", "would go with its event"),
            (true, false) => ("forward deliveries", "are", "would go with them"),
            (false, true) => ("forward delivery", "was", "went with its event"),
            (false, false) => ("forward deliveries", "were", "went with them"),
        };
        outln!(
            "{} {deliveries} of those events {were} still pending and {go}, not sent (but for \
             any a dispatcher had already taken)",
            report.pending_forwards
        );
    }
    Ok(if report.interrupted {
        Pass::Interrupted
    } else {
        Pass::Done
    })
}

fn export(args: ExportArgs) -> Result<ExitCode, Exit> {
    // export uses no secret: a source's secret variable left unset is let pass.
    let (config, unread) = Config::load_without_secrets(args.config.config.as_deref(), &ProcessEnv)
        .map_err(|e| usage(format_args!("config error: {e}")))?;
    if let Some(path) = &args.out {
        capture::check_writable(path).map_err(|e| {
            usage(format_args!(
                "--out: cannot write {}: {e}; nothing was exported",
                path.display()
            ))
        })?;
    }
    // Straight through (stdout, a FIFO): the lines already out stay out, each one whole.
    let streamed = |place: &str| match capture::stop_streaming() {
        capture::Streamed::Lines(lines) => errln!(
            "\nhookbox: export interrupted: {lines} whole line(s) went to {place}, a partial \
             capture (the export's end is missing)"
        ),
        capture::Streamed::AtLeast(lines) => errln!(
            "\nhookbox: export interrupted: at least {lines} whole line(s) went to {place}, a \
             partial capture whose last line may be cut short (its reader stopped reading)"
        ),
        capture::Streamed::Nothing => {
            errln!("\nhookbox: export interrupted: nothing was written to {place}");
        }
    };
    if args.out.is_none() {
        exit_on_interrupt(move || {
            streamed("stdout");
            true
        })
        .map_err(|e| usage(format_args!("{e:#}")))?;
    }
    if let Some(path) = &args.out {
        let shown = path.display().to_string();
        exit_on_interrupt(move || match capture::abandon_partial() {
            capture::Abandoned::Removed => {
                errln!(
                    "\nhookbox: export interrupted: nothing was written to {shown} (a file there \
                     is as it was)"
                );
                true
            }
            // Written whole already: the export ends as it would have.
            capture::Abandoned::Finished => false,
            capture::Abandoned::NotStarted => {
                streamed(&shown);
                true
            }
        })
        .map_err(|e| usage(format_args!("{e:#}")))?;
    }
    // An empty window is a mistake (`--since 1h --until 2h` swapped), not a query.
    if let (Some(since), Some(until)) = (args.since, args.until) {
        if since >= until {
            return Err(usage(format_args!(
                "--since ({}) is not before --until ({}): the window holds nothing (swapped? \
                 a duration counts back from now, so --since 2h --until 1h is the hour before \
                 the last); nothing was exported",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )));
        }
    }
    let filter = ExportFilter {
        source: args.source.map(|s| s.as_str().to_owned()),
        since: args.since,
        until: args.until,
    };
    finish((|| {
        let mut conn = connect_existing(&config, "nothing to export")?;
        // A long export says how far it is, every few seconds, on stderr, and how long the
        // database has kept it waiting, should it stop answering (a stalled connection holds
        // the read for as long as the network lets it, with nothing else to say so).
        let every = crate::replay::progress::PLAIN_EVERY;
        let stopping = match args.out {
            Some(_) => "Ctrl-C stops it and leaves --out as it was",
            None => "Ctrl-C stops it",
        };
        // A wait while lines go out is the reader's, not the database's (a black-box run: a
        // reader that did not read was said to be the database not answering).
        let writing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = match &args.out {
            Some(path) => path.display().to_string(),
            None => "stdout".to_owned(),
        };
        let ticker = Ticker::start(every, {
            let writing = Arc::clone(&writing);
            move |written, waited| {
                if waited < every {
                    errln!("export: {written} event(s) so far");
                } else if writing.load(Ordering::Relaxed) {
                    errln!(
                        "export: {written} event(s) so far; waiting {} s for the reader of \
                         {reader} to take more ({stopping})",
                        waited.as_secs()
                    );
                } else {
                    errln!(
                        "export: {written} event(s) so far; waiting {} s for the database to \
                         answer ({stopping})",
                        waited.as_secs()
                    );
                }
            }
        });
        let mut begun = false;
        // The wait is counted from the last line written (or the start).
        let mut progress = |step: capture::Step| match step {
            capture::Step::Reading => writing.store(false, Ordering::Relaxed),
            capture::Step::Wrote(written) => {
                begun = true;
                writing.store(true, Ordering::Relaxed);
                ticker.advanced(written);
            }
        };
        let count = match &args.out {
            None => {
                let mut out = capture::WholeLines::new(std::io::stdout().lock());
                match capture::export(&mut conn, &filter, &mut out, &mut progress) {
                    // The reader stopped early (`| head`): not a failure, as with replay.
                    Err(e) if is_broken_pipe(&e) => return Ok(()),
                    written => written.map_err(no_schema_hint).map_err(|e| {
                        // Failed part way (the database went away, or stdout could not take
                        // more): say what stdout holds.
                        match capture::streamed_lines() {
                            0 if is_missing_schema(&e) => e,
                            0 => {
                                let again = run_export_again(&e, "stdout");
                                e.context(format!("nothing was exported; {again}"))
                            }
                            lines => {
                                let again = run_export_again(&e, "stdout");
                                e.context(format!(
                                    "the export stopped after {lines} whole line(s) went to \
                                     stdout, a partial capture (its end is missing); {again}"
                                ))
                            }
                        }
                    })?,
                }
            }
            Some(path) => capture::write_whole(path, |out| {
                capture::export(&mut conn, &filter, out, &mut progress)
            })
            .map_err(no_schema_hint)
            .map_err(|e| match (capture::streamed_lines(), begun) {
                // A FIFO whose reader went away: nothing the database did.
                (lines, _) if is_broken_pipe(&e) => e.context(format!(
                    "the reader of {} closed it after {lines} whole line(s), a partial capture \
                     (its end is missing); export again to a reader that reads to the end",
                    path.display()
                )),
                // Written straight through (a FIFO): what went out stays out.
                (lines @ 1.., _) => {
                    let again = run_export_again(&e, &path.display().to_string());
                    e.context(format!(
                        "the export stopped after {lines} whole line(s) went to {}, a partial \
                         capture (its end is missing); {again}",
                        path.display()
                    ))
                }
                // A write that failed (a full disk, a device that takes nothing) is told as one.
                (0, _) if is_write_failure(&e) => e.context(format!(
                    "cannot write {}: nothing was exported to it (a file there is as it was); \
                     run it again once it can be written",
                    path.display()
                )),
                (0, true) => e.context(format!(
                    "the export stopped part way: nothing was written to {} (a file there is \
                     as it was); run it again once the database answers",
                    path.display()
                )),
                // Before its first event: the database failed it (a missing schema says
                // what to check instead).
                (0, false) if is_missing_schema(&e) => e,
                (0, false) => e.context(format!(
                    "nothing was exported to {} (a file there is as it was); run it again \
                     once the database answers",
                    path.display()
                )),
            })?,
        };
        drop(ticker);
        let place = args
            .out
            .as_ref()
            .map_or("stdout".to_owned(), |p| p.display().to_string());
        errln!("hookbox: exported {count} event(s) to {place}");
        // Events of a source since removed from the config are still exported; a name that is
        // neither configured nor stored is most likely a typo.
        if let (Some(source), None) = (filter.source.as_deref(), &unread) {
            let configured: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
            if count == 0 && !configured.contains(&source) {
                errln!(
                    "hookbox: no source named {source:?} is configured (configured: {}), and none \
                     of its events is stored; check --source",
                    if configured.is_empty() {
                        "none".to_owned()
                    } else {
                        configured.join(", ")
                    }
                );
            }
        }
        Ok(())
    })())
}

/// The signer `--config` or `--scheme`/`--secret` describe, with `--key` and `--cert-url`.
/// `--secret` alone is refused unless `detect` (replay, whose capture lines' headers tell each
/// line's scheme).
fn signer(keys: KeyArgs, detect: bool, to: &Target) -> Result<Signer, Exit> {
    let key_pem = match &keys.key {
        None => None,
        Some(path) => Some(Secret::new(std::fs::read_to_string(path).map_err(|e| {
            usage(format_args!("--key: cannot read {}: {e}", path.display()))
        })?)),
    };
    let signing = Signing {
        key_pem,
        cert_url: keys.cert_url,
        to_query: to.query().map(str::to_owned),
    };
    match (keys.scheme, keys.secret) {
        (Some(_), None) if signing.key_pem.is_none() => Err(usage(
            "--scheme needs --secret, or --key for a scheme that signs with a private key",
        )),
        (Some(scheme), secret) => {
            Signer::from_flags(&scheme, secret.map(Secret::new), &signing).map_err(usage)
        }
        (None, Some(secret)) if detect => Ok(Signer::detecting(Secret::new(secret), &signing)),
        (None, Some(_)) => Err(usage(
            "--secret needs --scheme NAME: the scheme to sign the body with",
        )),
        (None, _) => {
            let (config, unset) = Config::load_for_signing(keys.config.as_deref(), &ProcessEnv)
                .map_err(|e| usage(format_args!("config error: {e}")))?;
            // replay: every line would be refused source_not_configured, one by one.
            if detect && config.sources.is_empty() && unset.is_empty() {
                return Err(usage(
                    "no source to sign with: the config read has no sources at all (without \
                     --config it is $HOOKBOX_CONFIG, then ./hookbox.toml, which may not be \
                     there): give --config FILE, or --secret, or --as-is; nothing was sent",
                ));
            }
            Signer::from_config(&config, unset, &signing).map_err(usage)
        }
    }
}

/// `--to`, read here rather than by clap, whose error would repeat the URL as given, a
/// password and all.
fn target(to: &str) -> Result<Target, Exit> {
    to.parse::<Target>()
        .map_err(|e| usage(format_args!("--to: {e}")))
}

fn replay(args: ReplayArgs) -> Result<ExitCode, Exit> {
    let to = target(&args.to)?;
    let files = capture::input_files(&args.captures).map_err(usage)?;
    let body_file = files
        .iter()
        .find(|f| f.kind == InputKind::Body)
        .map(|f| f.path.display().to_string());
    let body_files = body_file.is_some();
    if let (Some(file), None) = (&body_file, &args.source) {
        return Err(usage(format_args!(
            "{file}: a .json body file names no source: give --source NAME (captures carry their own)"
        )));
    }
    if let (Some(file), true) = (&body_file, args.as_is) {
        return Err(usage(format_args!(
            "{file}: --as-is sends captured headers, and a .json body file has none: leave --as-is out to sign it"
        )));
    }
    if body_files && args.keys.secret.is_some() && args.keys.scheme.is_none() {
        return Err(usage(
            "a .json body file has no headers to tell its scheme by: add --scheme NAME to \
             --secret (or give --config FILE)",
        ));
    }
    let mode = if args.as_is {
        Mode::AsIs
    } else {
        Mode::Resign(signer(args.keys, true, &to)?)
    };
    let options = ReplayOptions {
        to,
        mode,
        source: args.source,
        concurrency: usize::from(args.concurrency),
        rate: args.rate,
        dry_run: args.dry_run,
        report: args.report,
    };
    let to_skip = crate::replay::check(&files, &options).map_err(usage)?;
    match crate::replay::run(files, &options, to_skip) {
        Ok(tally) if tally.interrupted => Ok(ExitCode::from(INTERRUPTED)),
        Ok(tally) if tally.all_ok() => Ok(ExitCode::SUCCESS),
        Ok(_) => Ok(ExitCode::from(1)),
        Err(e) => finish(Err(e)),
    }
}

fn send(args: SendArgs) -> Result<ExitCode, Exit> {
    let to = target(&args.to)?;
    let body = if args.body_file.as_os_str() == "-" {
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut body)
            .map_err(|e| usage(format_args!("cannot read the body from stdin: {e}")))?;
        body
    } else {
        std::fs::read(&args.body_file).map_err(|e| {
            usage(format_args!(
                "cannot read {}: {e}",
                args.body_file.display()
            ))
        })?
    };
    let signer = signer(args.keys, false, &to)?;
    let options = SendOptions {
        to,
        source: args.source,
        signer,
        event_id: args.event_id,
        event_type: args.event_type,
        body,
    };
    match crate::send::run(&options, &mut std::io::stdout().lock()) {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::from(1)),
        Err(SendError::Usage(message)) => Err(usage(message)),
        Err(e @ SendError::Network(_)) => finish(Err(e.into())),
    }
}
