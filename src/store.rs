//! Where the events are kept: `database.url` read as a [`Store`], and the `[database]` settings
//! that go with it. Low in the tree: `config` reads them, `db` opens them, and neither imports
//! the other.

/// Where the events are kept, as `database.url` says. Its `Debug` shows a PostgreSQL URL
/// redacted.
#[derive(Clone, PartialEq, Eq)]
pub enum Store {
    /// A PostgreSQL server: the URL as given.
    Postgres(String),
    /// An SQLite file at this path.
    SqliteFile(String),
    /// An SQLite database in memory, gone when the process ends.
    SqliteMemory,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Postgres(url) => f
                .debug_tuple("Postgres")
                .field(&crate::redact::database_url(url))
                .finish(),
            Store::SqliteFile(path) => f.debug_tuple("SqliteFile").field(path).finish(),
            Store::SqliteMemory => f.write_str("SqliteMemory"),
        }
    }
}

impl Store {
    /// Reads a `database.url`: `postgres://` or `postgresql://`, `sqlite://PATH` (relative to
    /// the working directory; `sqlite:///abs/path` for an absolute one) or `sqlite::memory:`.
    pub fn parse(url: &str) -> Result<Store, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Store::Postgres(url.to_owned()));
        }
        if url == "sqlite::memory:" || url == "sqlite://:memory:" {
            return Ok(Store::SqliteMemory);
        }
        if let Some(path) = url.strip_prefix("sqlite://") {
            // sqlx's URLs carry `?mode=rwc` (open read-write, create if missing), which is what
            // hookbox does anyway; any other parameter would be taken as part of the file name.
            let path = match path.split_once('?') {
                Some((path, "mode=rwc")) => path,
                Some(_) => {
                    // Shown as the URL is (a `?password=` a SQLCipher user may write, masked).
                    let shown = crate::redact::database_url(url);
                    let query = shown.split_once('?').map_or("", |(_, query)| query);
                    return Err(format!(
                        "takes no parameters after the path but mode=rwc (hookbox opens the file \
                         read-write and creates it if missing), not ?{query}; write \
                         sqlite://PATH"
                    ));
                }
                None => path,
            };
            if path.is_empty() {
                return Err("needs a file path, as in sqlite://hookbox.db".to_owned());
            }
            // No shell reads the config: `~` would be a directory named `~`.
            if path == "~" || path.starts_with("~/") {
                return Err(format!(
                    "starts with ~, which is not expanded here (no shell reads the config): \
                     write the whole path, sqlite:///home/NAME/{}",
                    path.trim_start_matches('~').trim_start_matches('/')
                ));
            }
            return Ok(Store::SqliteFile(path.to_owned()));
        }
        if url.starts_with("sqlite:") {
            return Err(
                "is not an SQLite URL hookbox reads: write sqlite://PATH (sqlite:///PATH for an \
                 absolute one) or sqlite::memory:"
                    .to_owned(),
            );
        }
        if !url.contains("://") && url.contains('=') {
            return Err(
                "is a libpq key=value string (host=... dbname=...); hookbox takes a URL \
                 instead: postgres://USER:PASSWORD@HOST:5432/DBNAME"
                    .to_owned(),
            );
        }
        Err("is not a postgres:// URL, a sqlite://PATH or sqlite::memory:".to_owned())
    }

    /// How many threads write batched claims (the inbox's `Batcher`) with a pool of
    /// `pool_size` on a machine of `cores`. On PostgreSQL a writer per four connections, and no
    /// more than one per two cores: a second writer keeps batches flowing while the first
    /// waits for its commit, but each writer that runs at once makes every batch smaller, and a
    /// batch's statement costs hookbox and PostgreSQL much the same CPU whether it carries two
    /// claims or twenty. Where the cores are what runs out, fewer and larger batches claim
    /// more: on two cores one writer took 7-13 % more deliveries a second than two and 30-40 %
    /// more than four, with 15-40 % less CPU per event (BENCHMARKS.md, "One claim writer per
    /// two cores"). SQLite has one writer at a time, so one.
    pub fn claim_writers(&self, pool_size: u32, cores: usize) -> usize {
        match self {
            Store::Postgres(_) => (pool_size as usize / 4).min(cores / 2).clamp(1, 8),
            Store::SqliteFile(_) | Store::SqliteMemory => 1,
        }
    }
}

/// `[database]`
#[derive(Clone)]
pub struct DatabaseConfig {
    /// Where events are kept (`DATABASE_URL` overrides): a libpq `postgres://` URL, or
    /// `sqlite://PATH` / `sqlite::memory:` for the embedded store. It may hold a password, so
    /// it is shown only through [`DatabaseConfig::display_url`].
    pub url: String,
    /// The store `url` names, read once when the config is loaded.
    pub store: Store,
    /// Where the URL came from.
    pub url_from: UrlFrom,
    /// The most connections this process opens.
    pub pool_size: u32,
}

/// Where [`DatabaseConfig::url`] came from, for the startup log and errors about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UrlFrom {
    /// Neither the config file nor the environment names one.
    Default,
    /// `[database].url`.
    File,
    /// `DATABASE_URL`; `over_file` when the config file names one too, which it overrides.
    Environment { over_file: bool },
}

impl UrlFrom {
    /// Where it came from, in words: `DATABASE_URL (over [database].url)`, ...
    pub fn describe(self) -> &'static str {
        match self {
            UrlFrom::Default => "the default",
            UrlFrom::File => "[database].url",
            UrlFrom::Environment { over_file: false } => "DATABASE_URL",
            UrlFrom::Environment { over_file: true } => {
                "DATABASE_URL, which overrides the config file's [database].url"
            }
        }
    }
}

impl DatabaseConfig {
    /// Whether the URL came from the config or the environment, rather than the default.
    pub fn configured(&self) -> bool {
        self.url_from != UrlFrom::Default
    }

    /// How many threads write batched claims on this machine (see [`Store::claim_writers`]).
    pub fn claim_writers(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.store.claim_writers(self.pool_size, cores)
    }

    /// The URL with any password replaced, for logs and error messages.
    pub fn display_url(&self) -> String {
        crate::redact::database_url(&self.url)
    }
}

impl std::fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("url", &self.display_url())
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[test]
    fn claim_writers_follow_the_pool_and_the_cores() {
        let pg = Store::Postgres("postgres://h/db".to_owned());
        // (pool_size, cores, writers)
        for (pool, cores, writers) in [
            (16, 2, 1),
            (16, 1, 1),
            (2, 8, 1),
            (8, 8, 2),
            (16, 8, 4),
            (16, 6, 3),
            (64, 64, 8),
        ] {
            assert_eq!(
                pg.claim_writers(pool, cores),
                writers,
                "pool_size {pool} on {cores} cores"
            );
        }
        for sqlite in [Store::SqliteMemory, Store::SqliteFile("h.db".to_owned())] {
            assert_eq!(sqlite.claim_writers(16, 8), 1);
        }
    }

    #[test]
    fn a_sqlite_urls_parameters_are_refused_with_a_password_masked() {
        let refused = Store::parse("sqlite://x.db?password=DBPASSqq71&cipher=x")
            .expect_err("no parameter but mode=rwc");
        assert!(
            !refused.contains("DBPASSqq71") && refused.contains("?password=***&cipher=x"),
            "{refused}"
        );
    }

    #[test]
    fn database_urls_name_their_store() {
        let cases = [
            (
                "postgres://u@h:5432/db",
                Store::Postgres("postgres://u@h:5432/db".to_owned()),
            ),
            (
                "postgresql://h/db",
                Store::Postgres("postgresql://h/db".to_owned()),
            ),
            (
                "sqlite://hookbox.db",
                Store::SqliteFile("hookbox.db".to_owned()),
            ),
            (
                "sqlite:///var/lib/hookbox/events.db",
                Store::SqliteFile("/var/lib/hookbox/events.db".to_owned()),
            ),
            ("sqlite::memory:", Store::SqliteMemory),
            (
                "sqlite://data/hookbox.db?mode=rwc",
                Store::SqliteFile("data/hookbox.db".to_owned()),
            ),
        ];
        for (url, store) in cases {
            assert_eq!(Store::parse(url), Ok(store), "{url}");
        }
        for bad in [
            "sqlite://",
            "mysql://h/db",
            "hookbox.db",
            "",
            "sqlite://?mode=rwc",
        ] {
            assert!(Store::parse(bad).is_err(), "{bad:?}");
        }
        for sqlite in [
            "sqlite:x.db?mode=rwc",
            "sqlite::memory:?mode=rwc",
            "sqlite:x.db",
        ] {
            let message = Store::parse(sqlite).expect_err("not a URL hookbox reads");
            assert!(
                message.contains("sqlite://PATH") && !message.contains("key=value"),
                "{sqlite}: {message}"
            );
        }
        let home = Store::parse("sqlite://~/x.db").expect_err("no shell expands ~");
        assert!(
            home.contains("not expanded") && home.contains("sqlite:///home/NAME/x.db"),
            "{home}"
        );
        let query = Store::parse("sqlite://x.db?mode=ro").expect_err("not a file name");
        assert!(
            query.contains("?mode=ro") && query.contains("sqlite://PATH"),
            "{query}"
        );
        let keywords = Store::parse("host=h password=pw dbname=x").expect_err("not a URL");
        assert!(
            keywords.contains("key=value") && keywords.contains("postgres://"),
            "{keywords}"
        );
    }
}
