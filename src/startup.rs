//! Building and running the server: migrations, the pool, the sources, the HTTP listener.

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::{web, App, HttpServer};
use anyhow::Context;

use crate::config::Config;
use crate::db::{self, DbPool};
use crate::forward::{self, Dispatcher, Outbox};
use crate::handlers::Handlers;
use crate::http;
use crate::purge;
use crate::replay_counts::Flusher;
use crate::retention::{self, Plan};
use crate::state::{self, AppState};

/// The most a client may take to send a request's headers (actix's own default).
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The least time the headers are given, whatever `request_timeout` says: actix's timer for
/// them is coarse, and below about half a second it cut off requests that came in time with a
/// bare 408 (found by a black-box run: 30 of 40 new connections at 150 ms).
const HEAD_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

/// How long a stop waits, from the signal, for requests in flight and forward attempts under
/// way to finish.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How often a stop that requests still hold says so.
const STOP_NOTE: Duration = Duration::from_secs(5);

/// A built server, bound to its port and ready to run.
pub struct Application {
    port: u16,
    server: Server,
    purge: purge::Schedule,
    flusher: Flusher,
    forward: forward::Wake,
    outbox: Option<Outbox>,
    dispatcher: Option<Dispatcher>,
    pool: DbPool,
    store: db::Store,
    stop: futures_util::future::BoxFuture<'static, &'static str>,
}

/// Resolves with the signal's name on the first SIGTERM or SIGINT. A SIGHUP (an operator
/// expecting a reload, a terminal closed) is logged and ignored: by default it would end the
/// process at once, with no graceful stop. The handlers are installed when this is called, not
/// when it is first polled.
fn shutdown_signal() -> std::io::Result<futures_util::future::BoxFuture<'static, &'static str>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    // A write past the file-size limit (`ulimit -f`, RLIMIT_FSIZE) sends SIGXFSZ, which ends
    // the process by default: serve died mid-load, and a supervisor restarted it into the same
    // limit (found by a black-box run). Caught, the write fails instead, and so does its
    // delivery, with a 503 that a retry after the limit is raised mends.
    let mut file_too_large = signal(SignalKind::from_raw(libc::SIGXFSZ))?;
    Ok(Box::pin(async move {
        let mut told = false;
        loop {
            tokio::select! {
                _ = terminate.recv() => return "SIGTERM",
                _ = interrupt.recv() => return "SIGINT",
                _ = hangup.recv() => tracing::warn!(
                    "SIGHUP ignored: hookbox does not reload its config; to apply a changed one, \
                     restart it (SIGTERM stops it gracefully)"
                ),
                _ = file_too_large.recv(), if !told => {
                    told = true;
                    tracing::error!(
                        "a write went past this process's file-size limit (ulimit -f, SIGXFSZ): \
                         deliveries that need the store to grow are answered 503 until the \
                         limit is raised (said once)"
                    );
                }
            }
        }
    }))
}

impl Application {
    /// Applies migrations (and each handler's setup), builds the pool and binds the listen
    /// address; with port 0, a free port is picked (tests do this).
    pub fn build(config: Config, handlers: Handlers) -> anyhow::Result<Application> {
        // Which build this is, for a rolling deploy of old and new side by side.
        // And which config file it read: with none, a newcomer's "every delivery is 404" is
        // a file in another directory.
        let file = config.file.as_ref().map_or_else(
            || "none (no --config, HOOKBOX_CONFIG unset, no ./hookbox.toml: defaults and the environment)".to_owned(),
            |file| file.display().to_string(),
        );
        tracing::info!(version = crate::VERSION, config = %file, "hookbox starting");
        config.check_listen()?;
        let sources = state::sources(&config, &handlers)?;
        // libpq reads a PostgreSQL URL only as it connects: one it cannot read is bad config,
        // said before anything listens (exit 2). So the connection the migrations use is
        // made first.
        let migrations_on = match config.database.store {
            db::Store::Postgres(_) => Some(db::connect(&config.database)?),
            _ => None,
        };
        // Bound before the schema is touched: an instance that cannot serve (its port is
        // taken) fails the start cleanly, and never migrates a shared schema.
        let listeners = listen(&config)?;
        // Whether the SQLite file was there before: a new one is said so in the log.
        let sqlite_existed = match &config.database.store {
            db::Store::SqliteFile(path) => std::path::Path::new(path).exists(),
            _ => true,
        };
        // Only the claims of handlers that answer from the event alone go in batches: where no
        // source has such, the writers' connections would sit idle, so none are kept.
        let batched = sources
            .values()
            .any(|source| !source.handler.uses_connection() && !source.dedupe_body);
        let pools = open_database(&config, &handlers, migrations_on, batched)?;
        let state = web::Data::new(AppState::new(&config, sources, pools));
        let (server, address) = serve_on(listeners, &config, state.clone())?;
        log_store(&config, &state.claims, sqlite_existed);
        log_sources(&config);

        let outbox = Outbox::new(
            state.pool.clone(),
            config.database.store.clone(),
            state.metrics.clone(),
            state.forward_targets(),
        );
        let dispatcher = outbox.clone().map(|outbox| {
            state.claims.hand_over_to(forward::Handover::new(
                outbox.clone(),
                state.forward.clone(),
            ));
            Dispatcher::start(outbox, state.forward.clone())
        });
        let flusher = Flusher::start(state.pool.clone(), state.replay_counts.clone());
        warn_about_sources(&config);
        let mut sources: Vec<_> = state.sources.iter().collect();
        sources.sort_by_key(|(name, _)| name.as_str());
        for (name, source) in sources {
            if let Some(warning) = source.provider.setup_warning() {
                tracing::warn!("source {name}: {warning}");
            }
        }
        let purge = purge::Schedule::start(
            state.pool.clone(),
            state.metrics.clone(),
            state.last_purge.clone(),
            Plan::from_config(&config),
            config.retention.purge_interval,
        );
        tracing::info!(
            default_window = %crate::config::Spelt(config.retention.window),
            every = %crate::config::Spelt(config.retention.purge_interval),
            "retention purge scheduled (each source's window is on its `source live` line; \
             default_window covers the others)"
        );
        if state.admin_token.is_some() {
            tracing::info!("admin API on at /admin (bearer token), console at /console");
        } else if let Some(warning) = config.admin_token_warning() {
            tracing::warn!("{warning}");
        } else {
            tracing::info!(
                "admin API and console off (set [admin].token_env to a variable holding a token)"
            );
        }

        let stop = shutdown_signal().context("cannot listen for SIGTERM")?;
        if config.server.listen_key == "HOOKBOX_LISTEN" {
            tracing::info!(
                "the listen address is HOOKBOX_LISTEN's (it overrides any [server].listen)"
            );
        }
        tracing::info!("hookbox listening on http://{address}");
        Ok(Application {
            port: address.port(),
            server,
            purge,
            flusher,
            forward: state.forward.clone(),
            outbox,
            dispatcher,
            pool: state.pool.clone(),
            store: config.database.store.clone(),
            stop,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The forward outbox, when a source forwards: [`Outbox::pass`] runs one dispatcher pass
    /// alongside the running dispatcher (tests drive it so).
    pub fn outbox(&self) -> Option<Outbox> {
        self.outbox.clone()
    }

    /// Serves until SIGTERM or SIGINT, then stops accepting and lets in-flight requests (and
    /// their transactions) finish, and forward attempts under way end and be recorded, within
    /// [`STOP_WAIT`] of the signal.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let handle = self.server.handle();
        let server = self.server;
        tokio::pin!(server);
        let stopping = tokio::select! {
            result = &mut server => {
                self.purge.stop();
                self.forward.stop();
                result.map(|()| tokio::time::Instant::now() + STOP_WAIT)
            }
            signal = self.stop => {
                let deadline = tokio::time::Instant::now() + STOP_WAIT;
                self.purge.stop();
                self.forward.stop();
                tracing::info!(signal, "shutting down: no new connections, letting in-flight deliveries finish");
                // The server future carries out the stop, so it is polled alongside it. A
                // request that holds it (a client still sending its body, a claim waiting for
                // a database that does not answer) is said, every
                // STOP_NOTE, rather than the stop going quiet for up to STOP_WAIT.
                let began = tokio::time::Instant::now();
                let drained = async { tokio::join!(handle.stop(true), &mut server).1 };
                tokio::pin!(drained);
                let result = loop {
                    tokio::select! {
                        result = &mut drained => break result,
                        () = tokio::time::sleep(STOP_NOTE) => tracing::info!(
                            "still letting requests in flight finish, {} s into the stop (up \
                             to {} s: a request still receiving its body, or waiting for the \
                             database, holds the stop that long)",
                            began.elapsed().as_secs(),
                            STOP_WAIT.as_secs()
                        ),
                    }
                };
                result.map(|()| deadline)
            }
        };
        // Even when the server failed: attempts under way end and are recorded first, so that
        // a stop does not send them twice.
        // Let go of at the very end when its attempts all ended; else the lock stays until
        // the process ends, as they are this instance's.
        let mut finished = None;
        if let Some(mut dispatcher) = self.dispatcher {
            let deadline = stopping.as_ref().map_or_else(
                |_| tokio::time::Instant::now() + STOP_WAIT,
                |deadline| *deadline,
            );
            if dispatcher.finish(deadline).await {
                finished = Some(dispatcher);
            } else {
                tracing::warn!(
                    "forward attempts still under way {} s after the stop began are abandoned: \
                     their rows go to whichever instance takes them back (this one, restarted), \
                     which sends them again with the same Idempotency-Key",
                    STOP_WAIT.as_secs()
                );
            }
        }
        stopping?;
        // After the server: replays answered while it drained are counted too.
        self.flusher.stop().await;
        // Last: after it, an SQLite file copied on its own holds every committed event.
        if matches!(self.store, db::Store::SqliteFile(_)) {
            let pool = self.pool;
            let _ = web::block(move || db::checkpoint_on_stop(&pool)).await;
        }
        if let Some(dispatcher) = finished {
            dispatcher.release().await;
        }
        self.purge.say_if_abandoned();
        tracing::info!("hookbox stopped");
        Ok(())
    }
}

/// Builds the pools (with connections of the claim writers' own where a source's claims are
/// `batched`) and applies hookbox's migrations, then each handler's `prepare`, under one lock,
/// on `migrations_on` when given (PostgreSQL's, made before the listen sockets).
fn open_database(
    config: &Config,
    handlers: &Handlers,
    migrations_on: Option<db::AnyConnection>,
    batched: bool,
) -> anyhow::Result<db::Pools> {
    let writers = if batched {
        config.database.claim_writers()
    } else {
        0
    };
    let pools = db::pools(&config.database, config.server.in_flight_wait, writers)?;
    let pool = &pools.main;
    let prepare =
        |conn: &mut db::AnyConnection| handlers.all().try_for_each(|handler| handler.prepare(conn));
    let migrated = match (&config.database.store, migrations_on) {
        (_, Some(mut conn)) => db::migrate(&mut conn, prepare)?,
        // The database lives in the pool's one connection.
        (db::Store::SqliteMemory, None) => db::migrate(&mut *pool.get()?, prepare)?,
        (_, None) => db::migrate_store(&config.database, prepare)?,
    };
    // Not refused: while a rolling deploy runs, instances of the version before keep serving
    // beside the newer one that migrated.
    if !migrated.unknown.is_empty() {
        tracing::warn!(
            unknown = ?migrated.unknown,
            "the database holds migrations this hookbox does not know: a newer hookbox migrated \
             it. Beside it during a rolling deploy, or after a rollback, this one serves with \
             what docs/tools.md (Rolling back) lists it cannot take part in; never undo the \
             migrations"
        );
    }
    let applied = migrated.applied;
    if !applied.is_empty() {
        tracing::info!(migrations = ?applied, "applied database migrations");
    } else if migrated.unknown.is_empty() {
        tracing::info!("database schema is up to date");
    }
    // What /readyz checks, once at the start: a store that cannot take a claim's writes (a
    // role without INSERT or UPDATE, a read-only file) would answer every delivery 503.
    if let Ok(mut conn) = pool.get() {
        // Received times on PostgreSQL's clock from the first claim on (a forwarding
        // instance's looks measure again every 2 s, and warn past a second).
        if matches!(config.database.store, db::Store::Postgres(_)) {
            if let Ok(Some(skew)) = db::instances::follow_database_clock(&mut conn) {
                db::instances::warn_of_skew(skew);
            }
        }
        if let Err(e) = db::events::takes_writes(&mut conn) {
            tracing::warn!(
                error = %e,
                "the database does not take hookbox's writes: every new delivery will be \
                 answered 503 (a stored event's redelivery still gets its stored answer) and \
                 /readyz says not ready until it does (check this role's grants, see \
                 docs/stores.md, Roles, or that the SQLite file is writable)"
            );
        }
    }
    Ok(pools)
}

/// The HTTP server over `state`, bound to `[server].listen`, and its address. It serves once
/// polled (see [`Application::run_until_stopped`]).
/// A provider catching up after an outage opens many connections at once: the default backlog
/// of 128 would drop their SYNs and stall them for seconds.
const BACKLOG: i32 = 1024;

/// Binds `server.listen`: every address its host resolves to, as actix would (one that cannot
/// be bound is skipped while another is), with address reuse and a [`BACKLOG`].
fn listen(config: &Config) -> anyhow::Result<Vec<std::net::TcpListener>> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    let context = || {
        format!(
            "cannot listen on {} (set [server].listen or HOOKBOX_LISTEN)",
            config.server.listen
        )
    };
    let bind = |address: SocketAddr| -> std::io::Result<std::net::TcpListener> {
        let socket = Socket::new(
            Domain::for_address(address),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.bind(&address.into())?;
        socket.listen(BACKLOG)?;
        Ok(socket.into())
    };
    let mut listeners = Vec::new();
    let mut last_error = None;
    for address in config
        .server
        .listen
        .to_socket_addrs()
        .with_context(context)?
    {
        match bind(address) {
            Ok(listener) => listeners.push(listener),
            Err(e) => last_error = Some(e),
        }
    }
    match (listeners.is_empty(), last_error) {
        (true, Some(e)) => Err(anyhow::Error::new(e).context(context())),
        (true, None) => Err(anyhow::anyhow!("it resolves to no address")).context(context()),
        (false, _) => Ok(listeners),
    }
}

/// The HTTP server on the `listeners` [`listen`] bound, and the first one's address.
fn serve_on(
    listeners: Vec<std::net::TcpListener>,
    config: &Config,
    state: web::Data<AppState>,
) -> anyhow::Result<(Server, SocketAddr)> {
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .configure(http::routes)
            .wrap(actix_web::middleware::from_fn(http::close_unread))
            .wrap(actix_web::middleware::from_fn(http::answer_with_id))
            .wrap(tracing_actix_web::TracingLogger::<http::RequestSpan>::new())
    })
    // A client dribbling its headers is cut off with a 408 (the body and the database work
    // then have request_timeout, see http/webhook.rs).
    .client_request_timeout(
        config
            .server
            .request_timeout
            .clamp(HEAD_TIMEOUT_FLOOR, HEAD_TIMEOUT),
    )
    .shutdown_timeout(STOP_WAIT.as_secs())
    // Signals are taken here rather than by actix, so they are in place before the
    // "listening" line: a SIGTERM right after it still shuts down gracefully.
    .disable_signals();
    for listener in listeners {
        server = server
            .listen(listener)
            .context("cannot serve on the bound address")?;
    }
    let address = *server
        .addrs()
        .first()
        .context("the listener has no address")?;
    Ok((server.run(), address))
}

/// Logs which store holds the events (and, on PostgreSQL, how many threads batch the claims:
/// `claim_writers`, from the pool and the cores; and how many of `pool_size`'s connections
/// they keep of their own, `claim_writers_own_connections`).
fn log_store(config: &Config, claims: &crate::inbox::Batcher, sqlite_existed: bool) {
    let database = config.database.display_url();
    // A relative SQLite path is the working directory's: the log names the file in full, and
    // says when it was made just now (a service started from another directory gets a new,
    // empty store, and every redelivery would be processed again).
    let file = |path: &str| {
        let full = db::sqlite::absolute(path);
        if sqlite_existed {
            full
        } else {
            format!("{full} (created now: a new, empty store)")
        }
    };
    match &config.database.store {
        db::Store::Postgres(_) => tracing::info!(
            database = %database,
            url_from = config.database.url_from.describe(),
            pool_size = config.database.pool_size,
            claim_writers = claims.writers(),
            claim_writers_own_connections = claims.own_connections(),
            "database ready: PostgreSQL"
        ),
        db::Store::SqliteMemory => tracing::info!(
            database = %database,
            "database ready: SQLite in memory, gone when hookbox stops (for trying things out)"
        ),
        db::Store::SqliteFile(path) if !config.database.configured() => tracing::info!(
            database = %database,
            "no database configured: keeping events in the SQLite file {} (set [database].url \
             or DATABASE_URL to choose; postgres:// for several instances)",
            file(path)
        ),
        db::Store::SqliteFile(path) => tracing::info!(
            database = %database,
            url_from = config.database.url_from.describe(),
            "database ready: SQLite file {}",
            file(path)
        ),
    }
}

/// Logs each live source and where it forwards.
fn log_sources(config: &Config) {
    for source in &config.sources {
        tracing::info!(
            source = %source.name,
            scheme = source.scheme.name(),
            secrets = source.secrets.len(),
            // Only for a source that checks signatures against public keys.
            public_keys = Some(source.provider.public_key_count()).filter(|n| *n > 0),
            retention = %crate::config::Spelt(retention::source_window(
                source,
                config.retention.window
            )),
            // What a replay is told by: the event id alone, or also the body (`dedupe`).
            dedupe = if source.dedupe_body { "body" } else { "id" },
            "source live at POST /webhooks/{}",
            source.name
        );
        for target in &source.forward {
            tracing::info!(
                source = %source.name,
                target = %target.name,
                url = %target.shown_url(),
                events = %if target.events.is_empty() {
                    "all".to_owned()
                } else {
                    target.events.join(",")
                },
                timeout = %crate::config::Spelt(target.timeout),
                max_attempts = target.max_attempts,
                concurrency = target.concurrency,
                // The rate is the target's, shared by every instance on the database.
                rate = %target.rate.map_or("none".to_owned(), |r| r.to_string()),
                ordered = target.ordered,
                "forwarding {} events",
                source.name
            );
        }
    }
}

/// Warns about no sources at all, about each source that keeps its events for less than its
/// provider may redeliver them, and about each that keeps them no longer than its tolerance.
fn warn_about_sources(config: &Config) {
    if config.sources.is_empty() {
        tracing::warn!("no sources are configured: every delivery will be answered 404 (add [sources.NAME] to the config)");
    }
    for source in &config.sources {
        if let Some(warning) = retention::horizon_warning(source, config.retention.window) {
            tracing::warn!("{warning}");
        }
        if let Some(warning) = retention::tolerance_warning(source, config.retention.window) {
            tracing::warn!("{warning}");
        }
        if let Some(warning) = retention::stretched_warning(source, config.retention.window) {
            tracing::warn!("{warning}");
        }
    }
}
