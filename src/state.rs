//! What the request handlers share: the configured sources and [`AppState`].
//!
//! Low in the tree: `http/` reads it, `startup.rs` builds it, and the background tasks take
//! only the handles they use (the pool, the metrics, their targets, their slot), not all of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::activity::Activity;
use crate::config::Config;
use crate::db::{self, DbPool};
use crate::forward;
use crate::handlers::{Handler, Handlers};
use crate::http;
use crate::ids::SourceName;
use crate::inbox::{Batcher, ReplayCache};
use crate::metrics::Metrics;
use crate::providers::Provider;
use crate::purge::LastPurgeSlot;
use crate::replay_counts::ReplayCounts;
use crate::retention;
use crate::secret::Secret;

/// A configured source, ready to take deliveries.
pub struct Source {
    /// Its name.
    pub name: SourceName,
    /// Its provider, with its keys.
    pub provider: Arc<dyn Provider>,
    /// What processes its events.
    pub handler: Arc<dyn Handler>,
    /// The lowercase names of the headers kept with each event.
    pub kept_headers: Vec<String>,
    /// Where its events are forwarded: its targets, in config order; empty: nowhere.
    pub forward: Vec<Arc<forward::Target>>,
    /// How long its events are kept (see [`retention::source_window`]).
    pub retention: Duration,
    /// `dedupe = "body"`: a payload stored under another event id is a replay of that event.
    pub dedupe_body: bool,
    /// The names of the sources of its scheme, itself included, sorted: where an older
    /// release's binding of a PayPal transmission id is looked for (see
    /// [`crate::db::transmissions::bound_by_an_older_release`]).
    pub same_scheme: Vec<String>,
}

impl Source {
    /// What the provider was answered in place of a stored response of `status`: its own
    /// answer (Adyen's `[accepted]`) where it expects one and the stored status is a success,
    /// as a delivery and every redelivery are answered; `None` where the stored response is
    /// the answer. The admin API and the console show it beside the stored response.
    pub fn answered_instead(&self, status: Option<i16>) -> Option<crate::providers::Answer> {
        self.provider
            .answer()
            .filter(|_| status.is_some_and(|status| (200..300).contains(&status)))
    }
}

/// The configured sources by name, each with its handler from `handlers`. Refuses a handler
/// registered for a source that is not configured, and a forward target whose secret is not
/// usable.
pub fn sources(
    config: &Config,
    handlers: &Handlers,
) -> anyhow::Result<HashMap<String, Arc<Source>>> {
    for name in handlers.sources() {
        if !config.sources.iter().any(|s| s.name.as_str() == name) {
            anyhow::bail!("a handler is registered for source {name:?}, which is not configured");
        }
    }
    config
        .sources
        .iter()
        .map(|source| {
            let provider = source.provider.clone();
            let mut kept_headers = provider.kept_headers();
            kept_headers.retain(|name| !crate::redact::CREDENTIAL_HEADERS.contains(&name.as_str()));
            kept_headers.push("content-type".to_owned());
            let forward = source
                .forward
                .iter()
                .map(|config| {
                    forward::Target::new(config.clone())
                        .map(Arc::new)
                        .map_err(|e| {
                            anyhow::anyhow!(
                                "sources.{}.forward ({}).secret: {e}",
                                source.name,
                                config.name
                            )
                        })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((
                source.name.as_str().to_owned(),
                Arc::new(Source {
                    name: source.name.clone(),
                    handler: handlers.for_source(&source.name),
                    provider,
                    kept_headers,
                    forward,
                    retention: retention::source_window(source, config.retention.window),
                    dedupe_body: source.dedupe_body,
                    same_scheme: {
                        let mut alike: Vec<String> = config
                            .sources
                            .iter()
                            .filter(|other| other.provider.scheme() == source.provider.scheme())
                            .map(|other| other.name.as_str().to_owned())
                            .collect();
                        alike.sort();
                        alike
                    },
                }),
            ))
        })
        .collect()
}

/// What every request handler shares.
pub struct AppState {
    /// The connection pool.
    pub pool: DbPool,
    /// Configured sources by name.
    pub sources: HashMap<String, Arc<Source>>,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Per-minute answers by source, for the console.
    pub activity: Activity,
    /// Replays counted and not yet added to `events.replays` (the flusher's).
    pub replay_counts: Arc<ReplayCounts>,
    /// How the scheduled purge's last pass went (the purge task's).
    pub last_purge: Arc<LastPurgeSlot>,
    /// The console's logged-in sessions.
    pub sessions: http::Sessions,
    /// The pace of answers to wrong admin tokens.
    pub wrong_tokens: http::WrongTokens,
    /// `[server].max_body_bytes`.
    pub max_body_bytes: usize,
    /// `[server].in_flight_wait`.
    pub in_flight_wait: Duration,
    /// `[server].request_timeout`.
    pub request_timeout: Duration,
    /// The admin API's token; `None` turns the admin API off.
    pub admin_token: Option<Secret>,
    /// Wakes the forward dispatcher when a claim queued a delivery.
    pub forward: forward::Wake,
    /// Committed answers, so a replay needs no trip to the database.
    pub replays: ReplayCache,
    /// Gathers the claims of handlers that answer from the event alone into multi-row INSERTs.
    pub claims: Batcher,
    /// The SQLite file the store opened, for `/readyz` to notice it deleted or replaced.
    pub store_file: Option<crate::db::sqlite::OpenedFile>,
    /// When a delivery last failed for a full disk, for `/readyz`.
    pub disk_full: LastDiskFull,
    /// Deliveries the store failed since the last one it stored, to say when storing works
    /// again.
    pub store_failing: StoreFailing,
}

/// When a delivery last failed because the database's disk is full. `/readyz`'s own write is
/// rolled back before it needs room (SQLite takes a new page only at commit), so it cannot see
/// a full disk itself; it answers not ready for [`LastDiskFull::REMEMBERED`] after such a
/// failure instead.
#[derive(Debug, Default)]
pub struct LastDiskFull(std::sync::Mutex<Option<std::time::Instant>>);

impl LastDiskFull {
    /// How long after a delivery failed for a full disk `/readyz` says not ready: long enough
    /// for a probe every few seconds to see it, short enough that an instance whose disk was
    /// freed is taken back soon (the next delivery that fails for it starts the wait again).
    pub const REMEMBERED: Duration = Duration::from_secs(30);

    /// A delivery failed for a full disk now. Whether that begins a spell (none within
    /// [`Self::REMEMBERED`] before it), to be said once.
    pub fn noticed(&self) -> bool {
        let now = std::time::Instant::now();
        let last = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(now);
        last.is_none_or(|last| now - last >= Self::REMEMBERED)
    }

    /// How long ago a delivery last failed for a full disk, if within [`Self::REMEMBERED`].
    pub fn lately(&self) -> Option<Duration> {
        let last = (*self.0.lock().unwrap_or_else(|e| e.into_inner()))?;
        Some(last.elapsed()).filter(|ago| *ago < Self::REMEMBERED)
    }
}

/// Deliveries answered 503 because the store failed them (unreachable, full, refusing writes,
/// locked, too slow), since the last delivery it stored. Each failure has its own WARN; the
/// first delivery stored after them is said once with how many failed and for how long, so an
/// operator paged for the 503s reads when they stopped (no line said so, on either store).
#[derive(Debug, Default)]
pub struct StoreFailing {
    /// Whether a failure is counted, so a stored delivery outside a spell takes no lock.
    open: std::sync::atomic::AtomicBool,
    /// When the first failure of the spell was, and how many there have been.
    spell: std::sync::Mutex<Option<(std::time::Instant, u64)>>,
}

impl StoreFailing {
    /// The store failed a delivery now.
    pub fn failed(&self) {
        let mut spell = self.spell.lock().unwrap_or_else(|e| e.into_inner());
        spell
            .get_or_insert_with(|| (std::time::Instant::now(), 0))
            .1 += 1;
        self.open.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The store stored a delivery now: the spell it ends, if one was open (how long since its
    /// first failure, and how many failed).
    pub fn stored(&self) -> Option<(Duration, u64)> {
        if !self.open.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut spell = self.spell.lock().unwrap_or_else(|e| e.into_inner());
        self.open.store(false, std::sync::atomic::Ordering::Release);
        spell
            .take()
            .map(|(since, failed)| (since.elapsed(), failed))
    }
}

impl AppState {
    /// The state for `config`'s server, over `pools`, with its claim writers started.
    pub fn new(
        config: &Config,
        sources: HashMap<String, Arc<Source>>,
        pools: db::Pools,
    ) -> AppState {
        let writers = config.database.claim_writers();
        let forward = forward::Wake::default();
        AppState {
            claims: Batcher::start(&pools, writers, forward.clone()),
            pool: pools.main,
            metrics: Arc::new(
                Metrics::new(config.sources.iter().map(|s| &s.name)).with_targets(
                    config.sources.iter().flat_map(|s| {
                        s.forward
                            .iter()
                            .map(|t| (s.name.as_str().to_owned(), t.name.clone()))
                    }),
                ),
            ),
            activity: Activity::new(config.sources.iter().map(|s| &s.name)),
            replay_counts: Arc::default(),
            last_purge: Arc::default(),
            sessions: http::Sessions::default(),
            wrong_tokens: http::WrongTokens::default(),
            sources,
            max_body_bytes: config.server.max_body_bytes,
            in_flight_wait: config.server.in_flight_wait,
            request_timeout: config.server.request_timeout,
            admin_token: config.admin_token.clone(),
            forward,
            replays: ReplayCache::default(),
            store_file: match &config.database.store {
                crate::db::Store::SqliteFile(path) => {
                    crate::db::sqlite::OpenedFile::of(std::path::Path::new(path))
                }
                _ => None,
            },
            disk_full: LastDiskFull::default(),
            store_failing: StoreFailing::default(),
        }
    }

    /// The forward targets by (source name, target name).
    pub fn forward_targets(&self) -> HashMap<(String, String), Arc<forward::Target>> {
        self.sources
            .iter()
            .flat_map(|(name, source)| {
                source
                    .forward
                    .iter()
                    .map(|target| ((name.clone(), target.config.name.clone()), target.clone()))
            })
            .collect()
    }
}
