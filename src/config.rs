//! The configuration: `hookbox.toml` as the contract gives it, with environment overrides.
//!
//! Parsing is strict: an unknown key, a bad duration, a source without secrets or an unknown
//! scheme is a [`ConfigError`] that names the key, and `main` turns it into exit code 2 before
//! anything listens.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::ids::SourceName;
use crate::routing::{self, Kind, Template};
use crate::secret::Secret;
pub use crate::store::DatabaseConfig;
use crate::store::{Store, UrlFrom};
use std::sync::Arc;

use crate::providers::{Provider, ProviderError, Registry, Scheme, Standard};

/// Where the config file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "hookbox.toml";

/// The whole configuration, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[server]`
    pub server: ServerConfig,
    /// `[database]`
    pub database: DatabaseConfig,
    /// `[retention]`
    pub retention: RetentionConfig,
    /// `[admin]`: the bearer token, when the variable `token_env` names is set and not empty.
    pub admin_token: Option<Secret>,
    /// `[admin].token_env`, when given: while it names a variable that is unset or empty, the
    /// admin API is off as without it, and `serve` says so (see [`Config::admin_token_warning`]).
    pub admin_token_env: Option<String>,
    /// Why the variable `token_env` names gives no token, when it does not.
    admin_token_off: Option<&'static str>,
    /// `[sources.NAME]`, in name order.
    pub sources: Vec<SourceConfig>,
    /// The config file read: `None` when none was named and `./hookbox.toml` does not exist
    /// (defaults and the environment only), which `serve` says at startup.
    pub file: Option<PathBuf>,
}

/// `[server]`
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The address to listen on (`HOOKBOX_LISTEN` overrides), `HOST:PORT`. Port 0 picks a
    /// free port.
    pub listen: String,
    /// Where `listen` came from, as an error names it: `server.listen`, or `HOOKBOX_LISTEN`.
    pub listen_key: &'static str,
    /// Larger bodies are answered 413.
    pub max_body_bytes: usize,
    /// How long a duplicate waits for the first delivery's transaction before a 409.
    pub in_flight_wait: Duration,
    /// How long a delivery may take once its headers are in: reading the body (408 past it)
    /// and the database work (503 past it). The headers themselves must arrive within 5 s, or
    /// this if it is shorter.
    pub request_timeout: Duration,
}

/// Where events are kept when no database is configured: an SQLite file in the working
/// directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://hookbox.db";

/// `[retention].window` when the config gives none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(72 * 3600);

/// `[retention]`
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// How long stored responses live.
    pub window: Duration,
    /// How often the purge runs.
    pub purge_interval: Duration,
}

/// `[sources.NAME]`: one provider posting to `POST /webhooks/NAME`.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The `NAME`.
    pub name: SourceName,
    /// Its provider's scheme, with the source's own keys for it: it builds the provider again
    /// from other secrets (a signer holds only the first).
    pub scheme: Scheme,
    /// Its provider, built with all its secrets and its tolerance: how its deliveries are
    /// checked, where their ids live, and the rest of what hookbox knows about the provider.
    pub provider: Arc<dyn Provider>,
    /// The secrets; any may match (rotation). Empty only for a scheme that takes none, whose
    /// key material is elsewhere (PayPal's certificates).
    pub secrets: Vec<Secret>,
    /// How far a signed timestamp may be from now, either way.
    pub tolerance: Duration,
    /// This source's own retention window, when it overrides `[retention].window`.
    pub retention: Option<Duration>,
    /// `dedupe = "body"`: a payload already stored under another event id (within the
    /// window) is answered as a replay of that event, not processed again.
    pub dedupe_body: bool,
    /// `[sources.NAME.forward]` (one target, named `default`) or `[[sources.NAME.forward]]`
    /// (several): where stored events are handed on. Empty: nowhere.
    pub forward: Vec<ForwardConfig>,
}

/// The name of the one target of the single-table form, `[sources.NAME.forward]`.
pub const DEFAULT_TARGET: &str = "default";

/// A forward target: a downstream the source's stored events (those its `events` patterns
/// match) are sent to. Its `Debug` shows the URL with its password as `***`.
#[derive(Clone)]
pub struct ForwardConfig {
    /// Unique within the source: 1-64 of `[A-Za-z0-9_-]`. `default` for the single-table form.
    pub name: String,
    /// Event-type patterns (`*` matches any run of characters); empty: every event.
    pub events: Vec<String>,
    /// At most this many attempts started in any window of `rate.per`, if set.
    pub rate: Option<Rate>,
    /// At most this many attempts in flight to this target, across this process.
    pub concurrency: u32,
    /// One event at a time, in received order, across all processes sharing the database.
    pub ordered: bool,
    /// Where the events go (`url`, or the variable `url_env` names); its scheme picks the
    /// [`Transport`]. It may hold a password: show it only through [`ForwardConfig::shown_url`].
    pub url: String,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Attempts before a delivery is dead-lettered.
    pub max_attempts: u32,
    /// How the events are handed over, with what that transport needs.
    pub transport: Transport,
}

/// How a target's events are handed over, as its `url`'s scheme says.
#[derive(Debug, Clone)]
pub enum Transport {
    /// `http://`, `https://`: a POST, signed the Standard Webhooks way.
    Http {
        /// The Standard Webhooks secret (`whsec_...`) hookbox signs what it sends with.
        secret: Secret,
    },
    /// `nats://`: a JetStream publish, acknowledged by the stream.
    Nats {
        /// The subject each event is published to.
        subject: Template,
    },
    /// `amqp://`, `amqps://`: a persistent, mandatory publish, confirmed by the broker.
    Amqp {
        /// The exchange each event is published to.
        exchange: Template,
        /// Its routing key.
        routing_key: Template,
    },
}

impl ForwardConfig {
    /// The URL as logs, errors and pages show it: its password (or NATS token) as `***`.
    pub fn shown_url(&self) -> String {
        crate::redact::target_url(&self.url)
    }
}

impl fmt::Debug for ForwardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForwardConfig")
            .field("name", &self.name)
            .field("events", &self.events)
            .field("rate", &self.rate)
            .field("concurrency", &self.concurrency)
            .field("ordered", &self.ordered)
            .field("url", &self.shown_url())
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .field("transport", &self.transport)
            .finish()
    }
}

impl ForwardConfig {
    /// Whether an event of this type goes to this target: every event when no patterns are
    /// given, else one whose type some pattern matches (an event without a type is matched as
    /// the empty string, so only by a pattern such as `*`).
    pub fn wants(&self, event_type: Option<&str>) -> bool {
        self.events.is_empty()
            || self
                .events
                .iter()
                .any(|pattern| routing::pattern_matches(pattern, event_type.unwrap_or("")))
    }

    /// Whether some event could be wanted by both this target and `other` (by their
    /// `events` patterns; no patterns want every event).
    pub fn may_share_events(&self, other: &ForwardConfig) -> bool {
        self.events.is_empty()
            || other.events.is_empty()
            || self
                .events
                .iter()
                .any(|a| other.events.iter().any(|b| routing::patterns_overlap(a, b)))
    }
}

/// `rate = "N/s"` or `"N/m"`: at most `count` attempts started in any window of `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Attempts per window, at least 1.
    pub count: u32,
    /// The window: one second or one minute.
    pub per: Duration,
}

impl std::fmt::Display for Rate {
    /// As written in the config: `N/s` or `N/m`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = if self.per >= Duration::from_secs(60) {
            "m"
        } else {
            "s"
        };
        write!(f, "{}/{unit}", self.count)
    }
}

impl std::str::FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let bad = || {
            format!(
                "{text:?} is not a rate; write it as \"N/s\" or \"N/m\" with N at least 1 \
                 (attempts started per second or per minute), e.g. \"50/s\""
            )
        };
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim().to_ascii_lowercase().as_str() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            _ => return Err(bad()),
        };
        if count == 0 {
            return Err(bad());
        }
        Ok(Rate { count, per })
    }
}

/// A configuration that cannot be used: one line naming the key and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    fn at(key: impl fmt::Display, problem: impl fmt::Display) -> Self {
        ConfigError(format!("{key}: {problem}"))
    }

    /// Whether the problem is with a value the environment gave (`DATABASE_URL`,
    /// `HOOKBOX_LISTEN`), which the config file's name must not be put in front of.
    fn is_about_the_environment(&self) -> bool {
        ["DATABASE_URL: ", "HOOKBOX_LISTEN: "]
            .iter()
            .any(|key| self.0.starts_with(key))
    }

    /// Whether the problem is a `*_env` key naming a variable that is not set: every such error
    /// says "the environment variable NAME is not set".
    fn names_an_unset_variable(&self) -> bool {
        self.0.contains("the environment variable ") && self.0.contains(" is not set")
    }
}

/// What the process environment contributes: the overrides and the variables secrets are read
/// from. Taken as a function so tests can load a config without touching the real environment.
pub trait Env {
    /// The variable's value, if it is set.
    fn var(&self, name: &str) -> Option<String>;
}

/// A variable that overrides the config file (`HOOKBOX_CONFIG`, `HOOKBOX_LISTEN`,
/// `DATABASE_URL`): set but empty (`DATABASE_URL=` in an env file) counts as not set.
fn override_var(env: &dyn Env, name: &str) -> Option<String> {
    env.var(name).filter(|value| !value.is_empty())
}

/// The real process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> Env for F {
    fn var(&self, name: &str) -> Option<String> {
        self(name)
    }
}

impl Config {
    /// When `[admin].token_env` names a variable that gives no token (unset, empty, or holding
    /// what no `Authorization` header can carry): the sentence `serve` logs as a WARN at its
    /// start. The contract keeps the admin API off (404) then, as without token_env; the
    /// warning makes sure it is not off silently. (The other commands never use the token.)
    pub fn admin_token_warning(&self) -> Option<String> {
        match (&self.admin_token_env, self.admin_token_off) {
            (Some(var), Some(why)) => Some(format!(
                "admin.token_env names the environment variable {}, {why}: the admin API and \
                 console are off (404) until it holds the admin token and hookbox is restarted",
                crate::redact::variable_name(var)
            )),
            _ => None,
        }
    }

    /// For `serve`, before anything else: the listen address must resolve (a host name is
    /// looked up here), so that a host that names nothing is a config error naming the key, not
    /// a failure after the migrations ran. A port already taken is found only when binding,
    /// and is a runtime failure.
    /// Like every other error in the file's values, it names the file the value came from.
    pub fn check_listen(&self) -> Result<(), ConfigError> {
        use std::net::ToSocketAddrs;
        let listen = &self.server.listen;
        let problem = match listen
            .to_socket_addrs()
            .map(|mut addresses| addresses.next())
        {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => format!("{listen:?} resolves to no address"),
            Err(e) => format!("{listen:?} does not resolve to an address to listen on: {e}"),
        };
        let error = ConfigError::at(self.server.listen_key, problem);
        match (&self.file, self.server.listen_key) {
            (Some(file), "server.listen") => {
                Err(ConfigError(format!("{}: {}", file.display(), error.0)))
            }
            _ => Err(error),
        }
    }

    /// Finds and loads the config file: `path`, else `$HOOKBOX_CONFIG`, else `./hookbox.toml`.
    /// A file that was asked for by name must exist; a missing default file means an empty
    /// configuration (defaults and environment only), which is enough for `migrate`.
    pub fn load(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        Config::load_parsed(path, env, |text| Config::parse(text, env)).map(Config::read_from)
    }

    /// The config `load_parsed` gave, with the file it came from.
    fn read_from((config, file): (Config, Option<PathBuf>)) -> Config {
        Config { file, ..config }
    }

    /// [`Config::load`] for `migrate`, which needs only the database. The whole file is checked
    /// as `serve` checks it (an unknown key or a wrong value is an error wherever it is), except
    /// that a secret's variable that is not set is let pass: a deploy step that migrates need
    /// not hold the sources' secrets. Every source is still checked for what does not need its
    /// secret (see [`RawSource::validate`]); then `[sources]` is left out of the config.
    pub fn load_for_migrate(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        Config::load_without_secrets(path, env).map(|(config, _)| config)
    }

    /// [`Config::load_for_migrate`], and whether `[sources]` was read (`false`: a secret's
    /// variable is not set, so the config's sources are empty; the error that would have been
    /// is returned with it). For `export` and `purge`, which use no secret: `export` then cannot
    /// say which sources are configured, and `purge` cannot know each source's window.
    pub fn load_without_secrets(
        path: Option<&Path>,
        env: &dyn Env,
    ) -> Result<(Config, Option<ConfigError>), ConfigError> {
        match Config::load(path, env) {
            Err(e) if e.names_an_unset_variable() => {
                Config::load_without_sources(path, env).map(|config| (config, Some(e)))
            }
            loaded => loaded.map(|config| (config, None)),
        }
    }

    /// [`Config::load`] for `send` and `replay`, which sign for the sources they are given: a
    /// source whose secret's variable is not set is left out, and returned with its error, so
    /// that sending to one source needs that source's secret only (the tools tell the error
    /// when a delivery of that source is to be signed). When some variable is unset, the
    /// sources are read without their forward targets, which signing never uses. Any other
    /// error is an error as for `serve`.
    pub fn load_for_signing(
        path: Option<&Path>,
        env: &dyn Env,
    ) -> Result<(Config, Vec<(String, ConfigError)>), ConfigError> {
        match Config::load(path, env) {
            Err(e) if e.names_an_unset_variable() => {}
            loaded => return loaded.map(|config| (config, Vec::new())),
        }
        let registry = Registry::builtin();
        Config::load_parsed(path, env, |text| {
            let table: toml::Table = text
                .parse()
                .map_err(|e: toml::de::Error| syntax_error(text, &e))?;
            let names: Vec<String> = match table.get("sources") {
                Some(toml::Value::Table(sources)) => sources.keys().cloned().collect(),
                _ => Vec::new(),
            };
            // Signing needs no forward target: a target's own `secret_env` or `url_env` left
            // unset here does not keep its source from signing.
            let without_forwarding = |table: &mut toml::Table| {
                if let Some(toml::Value::Table(sources)) = table.get_mut("sources") {
                    for (_, source) in sources.iter_mut() {
                        if let toml::Value::Table(source) = source {
                            source.remove("forward");
                        }
                    }
                }
            };
            let mut unset = Vec::new();
            for name in names {
                let alone = Config::parse_table(text, env, &registry, |table| {
                    without_forwarding(table);
                    retain_sources(table, |key| key == name);
                });
                match alone {
                    Err(e) if e.names_an_unset_variable() => unset.push((name, e)),
                    _ => {}
                }
            }
            let config = Config::parse_table(text, env, &registry, |table| {
                without_forwarding(table);
                retain_sources(table, |key| !unset.iter().any(|(name, _)| name == key));
            })?;
            Ok((config, unset))
        })
        .map(|((config, unset), file)| (Config::read_from((config, file)), unset))
    }

    /// [`Config::load`] without `[sources]`: the rest is read and checked as `serve` reads it.
    fn load_without_sources(path: Option<&Path>, env: &dyn Env) -> Result<Config, ConfigError> {
        Config::load_parsed(path, env, |text| {
            Config::parse_table(text, env, &Registry::builtin(), |table| {
                table.remove("sources");
            })
        })
        .map(Config::read_from)
    }

    /// Finds the config file as [`Config::load`] says, and reads it with `parse`; with what
    /// `parse` made, the file read (`None`: the default file does not exist).
    fn load_parsed<T>(
        path: Option<&Path>,
        env: &dyn Env,
        parse: impl Fn(&str) -> Result<T, ConfigError>,
    ) -> Result<(T, Option<PathBuf>), ConfigError> {
        let path_given = path;
        let named = path
            .map(|path| (path.to_path_buf(), "named by --config"))
            .or_else(|| {
                override_var(env, "HOOKBOX_CONFIG")
                    .map(|path| (PathBuf::from(path), "named by HOOKBOX_CONFIG"))
            });
        let (path, required, whence) = match named {
            Some((path, whence)) => (path, true, whence),
            None => (PathBuf::from(DEFAULT_CONFIG_FILE), false, "the default"),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => match parse(&text) {
                Ok(parsed) => Ok((parsed, Some(path))),
                Err(e) if e.is_about_the_environment() => Err(e),
                Err(e) => Err(ConfigError(format!("{}: {}", path.display(), e.0))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                parse("").map(|parsed| (parsed, None))
            }
            Err(e) => Err(ConfigError(format!(
                "{}: cannot read the config file ({whence}): {e} ({})",
                path.display(),
                match path_given {
                    Some(_) => "check the path given to --config",
                    None => "check HOOKBOX_CONFIG, or pass --config FILE",
                }
            ))),
        }
    }

    /// Parses and validates a config text, then applies the environment overrides. Sources may
    /// name the built-in schemes.
    pub fn parse(text: &str, env: &dyn Env) -> Result<Config, ConfigError> {
        Config::parse_with(text, env, &Registry::builtin())
    }

    /// [`Config::parse`], with sources naming the schemes of `registry`: the built-in ones and
    /// any provider registered beside them.
    pub fn parse_with(
        text: &str,
        env: &dyn Env,
        registry: &Registry,
    ) -> Result<Config, ConfigError> {
        Config::parse_table(text, env, registry, |_| {})
    }

    /// [`Config::parse_with`], with `edit` applied to the parsed TOML before it is read.
    fn parse_table(
        text: &str,
        env: &dyn Env,
        registry: &Registry,
        edit: impl FnOnce(&mut toml::Table),
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| syntax_error(text, &e))?;
        edit(&mut table);
        // No key takes a TOML date or time, and serde would read one as its text (an unquoted
        // `secrets = [1979-05-27T07:32:00Z]` would be the secret "1979-05-27T07:32:00Z").
        if let Some(key) = first_datetime(&table, "") {
            return Err(ConfigError::at(
                key,
                "invalid type: a TOML date or time; write text in quotes",
            ));
        }
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                // toml appends "in `table`" on a line of its own; the path already says where.
                let inner = e.inner().to_string();
                let problem = with_a_hint(
                    &key,
                    in_plain_words(&without_values(inner.lines().next().unwrap_or_default())),
                    registry,
                );
                if key == "." || key.is_empty() {
                    ConfigError(problem)
                } else {
                    ConfigError::at(key, problem)
                }
            })?;
        raw.validate(env, registry)
    }
}

/// Where `table` (at `path`, `""` for the whole config) holds a TOML date or time, if anywhere:
/// its key as a config error names it (`sources.x.secrets[0]`).
fn first_datetime(table: &toml::Table, path: &str) -> Option<String> {
    fn within(value: &toml::Value, path: String) -> Option<String> {
        match value {
            toml::Value::Datetime(_) => Some(path),
            toml::Value::Table(table) => first_datetime(table, &path),
            toml::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(n, item)| within(item, format!("{path}[{n}]"))),
            _ => None,
        }
    }
    table.iter().find_map(|(key, value)| {
        let path = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        within(value, path)
    })
}

/// The admin token a variable holds, or why it gives none. Whitespace around it is not part of
/// it (a secret mounted from a file ends with a newline, and an HTTP header's value is read
/// without it); what is left must be printable ASCII, which is all an `Authorization` header
/// carries.
fn admin_token(value: Option<String>) -> (Option<Secret>, Option<&'static str>) {
    let Some(value) = value else {
        return (None, Some("which is not set"));
    };
    let token = value.trim();
    if token.is_empty() {
        (None, Some("which is empty (or only whitespace)"))
    } else if !token.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        (
            None,
            Some(
                "whose token holds characters an HTTP Authorization header cannot carry (use \
                 printable ASCII)",
            ),
        )
    } else {
        (Some(Secret::new(token)), None)
    }
}

/// Keeps the `[sources]` entries whose name `keep` accepts.
fn retain_sources(table: &mut toml::Table, keep: impl Fn(&str) -> bool) {
    if let Some(toml::Value::Table(sources)) = table.get_mut("sources") {
        sources.retain(|name, _| keep(name));
    }
}

/// A TOML syntax error as one line: where (line, column, and the key when the line names one)
/// and what is wrong, never the text itself. The toml crate's own `Display` quotes the line,
/// which may hold a secret (`secrets = ["whsec_...` left unclosed); its bare message does not.
fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigError {
    let message = error.message().trim().replace('\n', " ");
    let Some(span) = error.span() else {
        return ConfigError(format!("not valid TOML: {message}"));
    };
    let before = &text[..floor_char_boundary(text, span.start)];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .unwrap_or_default()
        .chars()
        .count()
        + 1;
    let at = format!("line {line}, column {column}");
    match key_on_line(text, line).or_else(|| table_on_line(text, line)) {
        Some(key) => ConfigError(format!("{at}: {key}: not valid TOML: {message}")),
        None => ConfigError(format!("{at}: not valid TOML: {message}")),
    }
}

/// The table a `[table]` or `[[table]]` header on line `line` (from 1) opens, as `[table]`:
/// what a duplicate table's error names.
fn table_on_line(text: &str, line: usize) -> Option<String> {
    let header = text.lines().nth(line.checked_sub(1)?)?.trim();
    let name = header
        .strip_prefix("[[")
        .and_then(|rest| rest.split("]]").next())
        .or_else(|| {
            header
                .strip_prefix('[')
                .and_then(|rest| rest.split(']').next())
        })?
        .trim();
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-. ".contains(&b));
    plain.then(|| format!("[{name}]"))
}

/// The largest char boundary of `text` at or before `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The full key the line `line` (from 1) sets, as `table.key`, when it is a plain
/// `key = value` line under a plain `[table]` header (or none); `None` when it is anything else.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let bare = |key: &str| {
        let key = key.trim();
        (!key.is_empty()
            && key.split('.').all(|part| {
                let part = part.trim();
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            }))
        .then(|| key.split('.').map(str::trim).collect::<Vec<_>>().join("."))
    };
    let lines: Vec<&str> = text.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = bare(key)?;
    let header = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['));
    match header {
        None => Some(key),
        Some(header) => {
            let inner = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or_default();
            Some(format!("{}.{key}", bare(inner)?))
        }
    }
}

/// `problem` at `key`, with what to write instead where serde's own words do not say it: a
/// listen address given as a number, a source without its scheme.
fn with_a_hint(key: &str, problem: String, registry: &Registry) -> String {
    if key == "server.listen" && problem.starts_with("invalid type:") {
        format!("{problem} (write the address in quotes, like \"127.0.0.1:8080\")")
    } else if problem == "missing field `scheme`" {
        format!(
            "{problem}: every source names its scheme, one of {}",
            registry.names()
        )
    } else {
        problem
    }
}

/// A serde message with Rust's type names said as a config's reader would: `expected u32`
/// becomes `expected a whole number, at most 4294967295`. Not "from 0": the keys that take
/// one (`pool_size`, `max_body_bytes`, `concurrency`, `max_attempts`) refuse 0 apart, with
/// what the least is.
fn in_plain_words(message: &str) -> String {
    const TYPES: [(&str, &str); 6] = [
        ("expected u8", "expected a whole number, at most 255"),
        ("expected u16", "expected a whole number, at most 65535"),
        (
            "expected u32",
            "expected a whole number, at most 4294967295",
        ),
        ("expected u64", "expected a whole number"),
        ("expected usize", "expected a whole number"),
        ("expected i64", "expected a whole number"),
    ];
    let plain = TYPES
        .iter()
        .find_map(|(rust, plain)| {
            message
                .strip_suffix(rust)
                .map(|start| format!("{start}{plain}"))
        })
        .unwrap_or_else(|| message.to_owned());
    // `pool_size = "8"`: a number written as TOML text.
    if message.starts_with("invalid type: string") && plain.contains("expected a whole number") {
        format!("{plain} (write the number without quotes)")
    } else {
        plain
    }
}

/// A serde message without the string values it quotes: `invalid type: string "whsec_...",
/// expected a sequence` becomes `invalid type: string, expected a sequence`. The key is
/// named beside it, and under some keys the value is a secret or a URL with a password.
/// A value of another type given where the key takes text is left out too (`secrets =
/// [987654321]`, an unquoted numeric secret: `invalid type: integer, expected a string`).
fn without_values(message: &str) -> String {
    let message = without_string_values(message);
    if !message.starts_with("invalid type:") {
        return message;
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message.as_str();
    while let Some(at) = rest.find(" `") {
        out.push_str(&rest[..at]);
        // An unclosed quote: drop the rest rather than show part of a value.
        rest = rest[at + 2..]
            .find('`')
            .map_or("", |end| &rest[at + 2 + end + 1..]);
    }
    out.push_str(rest);
    out
}

/// [`without_values`] for strings alone.
fn without_string_values(message: &str) -> String {
    const QUOTED: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message.trim();
    while let Some(at) = rest.find(QUOTED) {
        out.push_str(&rest[..at + QUOTED.len() - 2]);
        let mut chars = rest[at + QUOTED.len()..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(at + QUOTED.len() + i + 1);
                    break;
                }
                _ => {}
            }
        }
        // An unclosed quote: drop the rest rather than show part of a value.
        rest = end.map_or("", |end| &rest[end..]);
    }
    out.push_str(rest);
    out
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    database: RawDatabase,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    sources: BTreeMap<String, RawSource>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawServer {
    listen: Option<String>,
    max_body_bytes: Option<usize>,
    #[serde(default, deserialize_with = "duration")]
    in_flight_wait: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    request_timeout: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawDatabase {
    url: Option<String>,
    pool_size: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawRetention {
    #[serde(default, deserialize_with = "duration")]
    window: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    purge_interval: Option<Duration>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawAdmin {
    token_env: Option<String>,
}

/// A source: the keys every source has, and the rest, which its provider reads and checks (an
/// unknown key is refused there).
#[derive(Deserialize)]
#[serde(expecting = "a table")]
struct RawSource {
    scheme: String,
    secrets: Option<Vec<String>>,
    secrets_env: Option<String>,
    #[serde(default, deserialize_with = "duration")]
    tolerance: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    retention: Option<Duration>,
    dedupe: Option<String>,
    forward: Option<RawForwards>,
    #[serde(flatten)]
    own: toml::Table,
}

/// `forward`: one table (the target `default`) or an array of tables (named targets).
enum RawForwards {
    One(Box<RawForward>),
    Many(Vec<RawForward>),
}

impl<'de> Deserialize<'de> for RawForwards {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = RawForwards;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table [sources.NAME.forward] or tables [[sources.NAME.forward]]")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawForwards, A::Error> {
                RawForward::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|raw| RawForwards::One(Box::new(raw)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<RawForwards, A::Error> {
                Vec::<RawForward>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(RawForwards::Many)
            }
        }
        d.deserialize_any(Visit)
    }
}

impl RawForwards {
    fn validate(self, source: &str, env: &dyn Env) -> Result<Vec<ForwardConfig>, ConfigError> {
        match self {
            RawForwards::One(raw) => {
                let at = format!("sources.{source}.forward");
                Ok(vec![raw.validate(&at, Some(DEFAULT_TARGET), env)?])
            }
            RawForwards::Many(raws) => {
                let mut targets: Vec<ForwardConfig> = Vec::with_capacity(raws.len());
                for (i, raw) in raws.into_iter().enumerate() {
                    let at = format!("sources.{source}.forward[{i}]");
                    let target = raw.validate(&at, None, env)?;
                    if targets.iter().any(|t| t.name == target.name) {
                        return Err(ConfigError::at(
                            format!("{at}.name"),
                            format!(
                                "a second target named {:?}; each target of a source needs a \
                                 name of its own",
                                target.name
                            ),
                        ));
                    }
                    targets.push(target);
                }
                Ok(targets)
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table")]
struct RawForward {
    name: Option<String>,
    url: Option<String>,
    url_env: Option<String>,
    subject: Option<String>,
    exchange: Option<String>,
    routing_key: Option<String>,
    events: Option<Vec<String>>,
    rate: Option<String>,
    concurrency: Option<u32>,
    ordered: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    timeout: Option<Duration>,
    max_attempts: Option<u32>,
    secret: Option<String>,
    secret_env: Option<String>,
}

impl RawForward {
    /// Validates the target at `at` (its key, e.g. `sources.s.forward[1]`); `default_name`
    /// names the single table's target, which need not name itself.
    fn validate(
        self,
        at: &str,
        default_name: Option<&str>,
        env: &dyn Env,
    ) -> Result<ForwardConfig, ConfigError> {
        let key = |field: &str| format!("{at}.{field}");
        let name = match (self.name, default_name) {
            // The contract names the single table's target `default`: another name there
            // would name a target other tools (and the contract's readers) call `default`.
            (Some(name), Some(default)) if name != default => {
                return Err(ConfigError::at(
                    key("name"),
                    format!(
                        "the one table [sources.NAME.forward] is the target named \"{default}\"; \
                         to name a target, write it as [[sources.NAME.forward]] (an array of tables)"
                    ),
                ))
            }
            (Some(name), _) => name,
            (None, Some(name)) => name.to_owned(),
            (None, None) => return Err(ConfigError::at(
                key("name"),
                "each target of [[sources.NAME.forward]] needs a name (1-64 of A-Z a-z 0-9 _ -)",
            )),
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ConfigError::at(
                key("name"),
                format!("{name:?} is not a target name: use 1-64 of A-Z a-z 0-9 _ -"),
            ));
        }
        if self.events.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConfigError::at(
                key("events"),
                "an empty list matches no event; leave `events` out for every event, or list at least one pattern",
            ));
        }
        let events = self.events.unwrap_or_default();
        if let Some(i) = events.iter().position(|p| p.trim().is_empty()) {
            return Err(ConfigError::at(
                format!("{}[{i}]", key("events")),
                "an empty pattern matches no event type; remove it, or write \"*\" for every event",
            ));
        }
        let rate = self
            .rate
            .map(|text| text.parse::<Rate>())
            .transpose()
            .map_err(|e| ConfigError::at(key("rate"), e))?;
        let concurrency = self.concurrency.unwrap_or(16);
        if concurrency == 0 {
            return Err(ConfigError::at(
                key("concurrency"),
                "must be at least 1 (attempts in flight to this target at once)",
            ));
        }
        // A URL from the environment is named by its key there, url_env, in what is wrong
        // with it: `url` is not in the file.
        let url_key = if self.url_env.is_some() {
            "url_env"
        } else {
            "url"
        };
        let url = match (self.url, self.url_env) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::at(
                    key("url_env"),
                    "give either url or url_env, not both",
                ))
            }
            (Some(url), None) => url,
            (None, Some(var)) => env.var(&var).filter(|v| !v.is_empty()).ok_or_else(|| {
                ConfigError::at(
                    key("url_env"),
                    format!(
                        "the environment variable {} is not set (or is empty)",
                        crate::redact::variable_name(&var)
                    ),
                )
            })?,
            (None, None) => {
                return Err(ConfigError::at(
                    key("url"),
                    "a forward target needs a url (http://, https://, nats://, amqp:// or \
                     amqps://), or url_env naming a variable that holds one",
                ))
            }
        };
        let url = url.trim().to_owned();
        let timeout = self.timeout.unwrap_or(Duration::from_secs(10));
        within(key("timeout"), timeout, HOUR)?;
        let max_attempts = self.max_attempts.unwrap_or(12);
        if max_attempts == 0 {
            return Err(ConfigError::at(key("max_attempts"), "must be at least 1"));
        }
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let bus = match scheme.as_deref() {
            Some("http" | "https") => None,
            Some("nats") => Some("NATS"),
            Some("amqp" | "amqps") => Some("AMQP"),
            _ => {
                return Err(ConfigError::at(
                    key(url_key),
                    format!(
                        "{:?} names no transport hookbox has: use http:// or https:// (a signed \
                         POST), nats:// (NATS JetStream) or amqp:// / amqps:// (RabbitMQ)",
                        crate::redact::target_url(&url)
                    ),
                ))
            }
        };
        // A key that belongs to another transport is named, not ignored.
        let misplaced = [
            ("secret", self.secret.is_some(), bus.is_some()),
            ("secret_env", self.secret_env.is_some(), bus.is_some()),
            ("subject", self.subject.is_some(), bus != Some("NATS")),
            ("exchange", self.exchange.is_some(), bus != Some("AMQP")),
            (
                "routing_key",
                self.routing_key.is_some(),
                bus != Some("AMQP"),
            ),
        ];
        if let Some((field, _, _)) = misplaced.iter().find(|(_, given, wrong)| *given && *wrong) {
            let problem = match (*field, bus) {
                ("secret" | "secret_env", Some(bus)) => format!(
                    "{} {bus} target takes no secret: hookbox signs only what it POSTs over HTTP; \
                     the bus's own credentials go in the URL (url_env keeps them out of the file)",
                    if bus == "AMQP" { "an" } else { "a" }
                ),
                ("subject", _) => "subject applies only to a nats:// target".to_owned(),
                _ => format!("{field} applies only to an amqp:// or amqps:// target"),
            };
            return Err(ConfigError::at(key(field), problem));
        }
        let transport = match bus {
            None => {
                // The rules `replay --to` and `send --to` follow: a host, a port from 1 to
                // 65535, and nothing an HTTP client drops unsent (`user:password@`, `#part`).
                url.parse::<crate::replay::Target>().map_err(|problem| {
                    ConfigError::at(key(url_key), crate::redact::message_about(&problem, &url))
                })?;
                Transport::Http {
                    secret: http_secret(self.secret, self.secret_env, &key, env)?,
                }
            }
            Some("NATS") => {
                let server = url.parse::<async_nats::ServerAddr>().map_err(|e| {
                    ConfigError::at(
                        key(url_key),
                        crate::redact::message_about(&e.to_string(), &url),
                    )
                })?;
                if server.host().is_empty() {
                    return Err(ConfigError::at(
                        key(url_key),
                        format!(
                            "{:?} names no host (e.g. nats://127.0.0.1:4222)",
                            crate::redact::target_url(&url)
                        ),
                    ));
                }
                // What the NATS client would ignore: a typo there would show only at the
                // first event (a path, a query), or fail every attempt (port 0).
                let address = server.clone().into_inner();
                let ignored = if server.port() == 0 {
                    Some(
                        "port 0: a NATS server listens on a port from 1 to 65535 (4222 by default)",
                    )
                } else if !matches!(address.path(), "" | "/")
                    || address.query().is_some()
                    || address.fragment().is_some()
                {
                    Some(
                        "a path, query or fragment, which NATS does not use: the URL is the \
                         server's alone (nats://HOST:PORT); the subject says where events go",
                    )
                } else {
                    None
                };
                if let Some(problem) = ignored {
                    return Err(ConfigError::at(
                        key(url_key),
                        format!("{:?} has {problem}", crate::redact::target_url(&url)),
                    ));
                }
                Transport::Nats {
                    subject: template(self.subject, "subject", Kind::NatsSubject, &key)?,
                }
            }
            Some(_) => {
                url.parse::<lapin::uri::AMQPUri>().map_err(|e| {
                    ConfigError::at(
                        key(url_key),
                        format!(
                            "{:?} is not an AMQP URL: {}",
                            crate::redact::target_url(&url),
                            crate::redact::message_about(&e, &url)
                        ),
                    )
                })?;
                Transport::Amqp {
                    exchange: template(self.exchange, "exchange", Kind::AmqpExchange, &key)?,
                    routing_key: template(
                        self.routing_key,
                        "routing_key",
                        Kind::AmqpRoutingKey,
                        &key,
                    )?,
                }
            }
        };
        Ok(ForwardConfig {
            name,
            events,
            rate,
            concurrency,
            ordered: self.ordered.unwrap_or(false),
            url,
            timeout,
            max_attempts,
            transport,
        })
    }
}

/// An HTTP target's Standard Webhooks secret, from `secret` or the variable `secret_env` names.
fn http_secret(
    secret: Option<String>,
    secret_env: Option<String>,
    key: &dyn Fn(&str) -> String,
    env: &dyn Env,
) -> Result<Secret, ConfigError> {
    // A bad value is named where it came from: the variable's, under `secret_env`.
    let from = if secret_env.is_some() {
        "secret_env"
    } else {
        "secret"
    };
    let secret = match (secret, secret_env) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::at(
                key("secret_env"),
                "give either secret or secret_env, not both",
            ))
        }
        (Some(secret), None) => secret,
        (None, Some(var)) => env.var(&var).filter(|v| !v.is_empty()).ok_or_else(|| {
            ConfigError::at(
                key("secret_env"),
                format!(
                    "the environment variable {} is not set (or is empty)",
                    crate::redact::variable_name(&var)
                ),
            )
        })?,
        (None, None) => {
            return Err(ConfigError::at(
                key("secret"),
                "a forward target needs a Standard Webhooks secret (secret = \"whsec_...\" or secret_env = \"VAR\") to sign what hookbox sends",
            ))
        }
    };
    let secret = Secret::new(secret.trim());
    Standard::new(std::slice::from_ref(&secret), Duration::ZERO).map_err(|e| {
        let problem = if from == "secret_env" {
            format!("the value of the variable it names: {}", e.problem)
        } else {
            e.problem
        };
        ConfigError::at(key(from), problem)
    })?;
    Ok(secret)
}

/// A bus target's `subject`, `exchange` or `routing_key`, which it needs.
fn template(
    text: Option<String>,
    field: &str,
    kind: Kind,
    key: &dyn Fn(&str) -> String,
) -> Result<Template, ConfigError> {
    let example = match kind {
        Kind::NatsSubject => "subject = \"webhooks.{source}.{event_type}\"",
        Kind::AmqpExchange => "exchange = \"webhooks\" (an exchange that exists)",
        Kind::AmqpRoutingKey => "routing_key = \"{source}.{event_type}\"",
    };
    let text = text.ok_or_else(|| {
        ConfigError::at(
            key(field),
            format!("this target needs {field}, e.g. {example}"),
        )
    })?;
    Template::parse(&text, kind).map_err(|e| ConfigError::at(key(field), e))
}

/// Reads a humantime duration (`90s`, `5m`, `72h`, `30d`). A bare number (`window = 3600`) is
/// refused with the text that would say it (`"3600s"`): a duration names its unit.
fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration in quotes, like \"90s\", \"5m\", \"72h\" or \"30d\"")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Duration, E> {
            Err(E::custom(unitless(n as f64, &n.to_string())))
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Duration, E> {
            Err(E::custom(unitless(n as f64, &n.to_string())))
        }

        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Duration, E> {
            Err(E::custom(unitless(n, &n.to_string())))
        }
    }
    /// What to write for `n` seconds given as a bare number: the same as text, where that is a
    /// duration (a whole number of seconds, or of milliseconds, more than none).
    fn unitless(n: f64, written: &str) -> String {
        let like = "\"90s\", \"5m\", \"72h\" or \"30d\"";
        let ms = (n * 1000.0).round();
        if !(1.0..1e15).contains(&ms) {
            format!("a duration needs its unit, in quotes, like {like}")
        } else if n.fract() == 0.0 {
            format!("a duration needs its unit, in quotes: write {written} seconds as \"{written}s\" (or like {like})")
        } else {
            format!("a duration needs its unit, in quotes: write {written} seconds as \"{ms}ms\" (or like {like})")
        }
    }
    d.deserialize_any(Text).map(Some)
}

/// Parses a humantime duration, with an error that says what a good one looks like.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "invalid duration {text:?} ({e}); write it like \"90s\", \"5m\", \"72h\" or \"30d\""
        )
    })
}

/// A duration as the logs and messages show it: days at most (`400days`, `3days 4h`, `90ms`),
/// never humantime's years and months of fractional days (`400d` was `1year 1month 4days
/// 13h 30m`), so an operator reads back what they wrote and [`parse_duration`] reads it too.
#[derive(Debug, Clone, Copy)]
pub struct Spelt(pub Duration);

impl std::fmt::Display for Spelt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        if secs == 0 && nanos == 0 {
            return f.write_str("0s");
        }
        let days = secs / 86_400;
        let parts = [
            (days, if days == 1 { "day" } else { "days" }),
            (secs / 3600 % 24, "h"),
            (secs / 60 % 60, "m"),
            (secs % 60, "s"),
            (u64::from(nanos / 1_000_000), "ms"),
            (u64::from(nanos / 1000 % 1000), "us"),
            (u64::from(nanos % 1000), "ns"),
        ];
        let mut first = true;
        for (value, unit) in parts.into_iter().filter(|(value, _)| *value > 0) {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{value}{unit}")?;
        }
        Ok(())
    }
}

/// Parses a point in time, the one reading shared by `export --since/--until`, the admin API's
/// `since=` and the console's filters: an RFC 3339 time (`2026-12-02T09:00:00Z`), a date and
/// time without a zone, taken as UTC (`2026-12-02 09:00`, `2026-12-02T09:00:00`), a date alone,
/// meaning its midnight UTC (`2026-12-02`), or a humantime duration meaning that long before
/// `now` (`1h`, `2d`). A time before 1970 reads as 1970: nothing is stored earlier.
///
/// # Errors
/// A one-line reason naming the accepted forms.
pub fn parse_time_or_ago(
    text: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<chrono::DateTime<chrono::Utc>, String> {
    let (given, text) = (text, text.trim());
    if let Some(time) = parse_time(text) {
        return Ok(no_earlier_than_1970(time));
    }
    let ago = humantime::parse_duration(text).map_err(|_| {
        // A `+` of an offset that came in a URL's query unescaped reads as a space.
        let plus = if text.contains(' ') && text.contains(':') {
            "; in a URL's query, write an offset's + as %2B (a + reads as a space)"
        } else {
            ""
        };
        format!(
            "{given:?} is not a time (RFC 3339 as in 2026-12-02T09:00:00Z, or 2026-12-02 09:00 \
             or 2026-12-02, taken as UTC) or a duration ago (90s, 5m, 72h, 30d){plus}"
        )
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| now.checked_sub_signed(ago))
        .map(no_earlier_than_1970)
        .ok_or_else(|| format!("{text:?} is too far in the past"))
}

/// A point in time written as [`parse_time_or_ago`] reads one, but not as a duration ago: RFC
/// 3339, or a date and time (or a date alone) without a zone, taken as UTC.
pub fn parse_time(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{NaiveDate, NaiveDateTime};
    let text = text.trim();
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(time.with_timezone(&chrono::Utc));
    }
    let naive = [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d %H:%M",
    ]
    .iter()
    .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
    .or_else(|| {
        NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .ok()
            .and_then(|day| day.and_hms_opt(0, 0, 0))
    });
    naive.map(|naive| naive.and_utc())
}

/// Checks the form of a listen address: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`, the port 0 to
/// 65535. Whether a host name resolves is [`Config::check_listen`]'s to say, for `serve`.
fn check_listen(listen: &str) -> Result<(), String> {
    let form =
        "write it as HOST:PORT, e.g. \"127.0.0.1:8080\", \"[::1]:8080\" or \"localhost:8080\"";
    if listen.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    if !listen.is_empty() && listen.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{listen:?} is a port alone: write it as HOST:PORT, e.g. \"127.0.0.1:{listen}\" \
             (or \"0.0.0.0:{listen}\" to listen on every interface)"
        ));
    }
    let Some((host, port)) = listen.rsplit_once(':') else {
        return Err(format!(
            "{listen:?} is not an address to listen on: it names no port; {form}"
        ));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!(
            "{listen:?} is not an address to listen on: {port:?} is not a port (0 to 65535); {form}"
        ));
    }
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    let host_ok = if let Some(inside) = host.strip_prefix('[') {
        inside
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        host.len() <= 253 && host.trim_end_matches('.').split('.').all(label_ok)
    };
    if host_ok {
        Ok(())
    } else {
        Err(format!(
            "{listen:?} is not an address to listen on: {host:?} is not an IP address or host \
             name; {form}"
        ))
    }
}

/// The earliest time a store can hold: PostgreSQL's timestamps begin at 4714-11-24 BC
/// (astronomical year -4713).
fn earliest_storable() -> chrono::DateTime<chrono::Utc> {
    chrono::NaiveDate::from_ymd_opt(-4713, 11, 24)
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .expect("4714-11-24 BC is a valid date")
        .and_utc()
}

/// An hour and a year: the longest a wait or a timeout (an hour: longer is never what is meant,
/// and PostgreSQL's `lock_timeout` stops at about 24 days) and the purge's interval may be.
/// Each with its text as a config would write it.
const HOUR: (Duration, &str) = (Duration::from_secs(3600), "1h");
const YEAR: (Duration, &str) = (Duration::from_secs(365 * 24 * 3600), "365d");

/// Checks that the duration under `key` is longer than 0s and at most `max`.
fn within(
    key: impl fmt::Display,
    value: Duration,
    (max, max_text): (Duration, &str),
) -> Result<(), ConfigError> {
    if value.is_zero() || value > max {
        return Err(ConfigError::at(
            key,
            format!(
                "must be longer than 0s and at most {max_text} (it is {})",
                Spelt(value)
            ),
        ));
    }
    Ok(())
}

/// Checks a configured retention window (`[retention].window`, a source's `retention`): longer
/// than 0s, and short enough that its cutoff, now minus the window, is a time a store can hold.
/// A window past that would fail every purge pass on PostgreSQL.
///
/// # Errors
/// A one-line reason, for the caller to put after the key or flag.
pub fn check_window(window: Duration) -> Result<(), String> {
    if window.is_zero() {
        return Err(
            "must be longer than 0s (a window of 0s would forget each event at the next purge, \
             and a redelivery would be processed again)"
                .to_owned(),
        );
    }
    check_cutoff(window)
}

/// Checks that now minus `window` is a time a store can hold (see [`check_window`]).
fn check_cutoff(window: Duration) -> Result<(), String> {
    let representable = chrono::Duration::from_std(window)
        .ok()
        .and_then(|window| chrono::Utc::now().checked_sub_signed(window))
        .is_some_and(|cutoff| cutoff >= earliest_storable());
    if representable {
        Ok(())
    } else {
        Err(format!(
            "{} is too far in the past: the cutoff (now minus the window) would fall before \
             4714 BC, the earliest time PostgreSQL stores",
            Spelt(window)
        ))
    }
}

/// Reads `hookbox purge --older-than`: a duration whose cutoff a store can hold, as for
/// [`check_window`]; but 0s is allowed here, a one-off pass that removes every event.
///
/// # Errors
/// A bad duration, or one too long.
pub fn parse_older_than(text: &str) -> Result<Duration, String> {
    let window = parse_duration(text)?;
    check_cutoff(window)?;
    Ok(window)
}

/// A bound on stored times: nothing is stored before 1970, so an earlier bound selects the same
/// rows as 1970 does, and a store need not hold it (PostgreSQL's timestamps start in 4713 BC;
/// chrono reads years far before that).
pub(crate) fn no_earlier_than_1970(
    time: chrono::DateTime<chrono::Utc>,
) -> chrono::DateTime<chrono::Utc> {
    time.max(chrono::DateTime::UNIX_EPOCH)
}

impl RawConfig {
    fn validate(self, env: &dyn Env, registry: &Registry) -> Result<Config, ConfigError> {
        let (listen, listen_key) = match override_var(env, "HOOKBOX_LISTEN") {
            Some(listen) => (listen, "HOOKBOX_LISTEN"),
            None => (
                self.server
                    .listen
                    .clone()
                    .unwrap_or_else(|| "127.0.0.1:8080".to_owned()),
                "server.listen",
            ),
        };
        check_listen(&listen).map_err(|e| ConfigError::at(listen_key, e))?;
        // The file's value under an override is checked too: it is what runs the day the
        // variable goes.
        if let (Some(file), "HOOKBOX_LISTEN") = (&self.server.listen, listen_key) {
            check_listen(file).map_err(|e| {
                ConfigError::at(
                    "server.listen",
                    format!("{e} (HOOKBOX_LISTEN overrides it now, but without it this is used)"),
                )
            })?;
        }
        let server = ServerConfig {
            listen,
            listen_key,
            max_body_bytes: self.server.max_body_bytes.unwrap_or(1024 * 1024),
            in_flight_wait: self
                .server
                .in_flight_wait
                .unwrap_or(Duration::from_secs(10)),
            request_timeout: self
                .server
                .request_timeout
                .unwrap_or(Duration::from_secs(30)),
        };
        if server.max_body_bytes == 0 {
            return Err(ConfigError::at(
                "server.max_body_bytes",
                "must be at least 1",
            ));
        }
        within("server.in_flight_wait", server.in_flight_wait, HOUR)?;
        within("server.request_timeout", server.request_timeout, HOUR)?;
        let from_env = override_var(env, "DATABASE_URL");
        let url_key = if from_env.is_some() {
            "DATABASE_URL"
        } else {
            "database.url"
        };
        let url_from = match (&from_env, &self.database.url) {
            (Some(_), file) => UrlFrom::Environment {
                over_file: file.is_some(),
            },
            (None, Some(_)) => UrlFrom::File,
            (None, None) => UrlFrom::Default,
        };
        let configured = from_env.or(self.database.url.clone());
        let url = configured
            .clone()
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
        let store = Store::parse(&url).map_err(|e| {
            // Quoted only when it is a URL, whose password can be masked: a libpq key=value
            // string (`host=h password=pw`) or anything else is not echoed at all.
            if url.contains("://") {
                ConfigError::at(
                    url_key,
                    format!("{:?} {e}", crate::redact::database_url(&url)),
                )
            } else {
                ConfigError::at(url_key, format!("the value {e}"))
            }
        })?;
        if let (UrlFrom::Environment { .. }, Some(file)) = (url_from, &self.database.url) {
            Store::parse(file).map_err(|e| {
                let shown = if file.contains("://") {
                    format!("{:?} ", crate::redact::database_url(file))
                } else {
                    String::new()
                };
                ConfigError::at(
                    "database.url",
                    format!(
                        "{shown}{e} (DATABASE_URL overrides it now, but without it this is used)"
                    ),
                )
            })?;
        }

        let database = DatabaseConfig {
            url_from,
            store,
            url,
            pool_size: self.database.pool_size.unwrap_or(16),
        };
        if database.pool_size == 0 {
            return Err(ConfigError::at("database.pool_size", "must be at least 1"));
        }
        let retention = RetentionConfig {
            window: self.retention.window.unwrap_or(DEFAULT_WINDOW),
            purge_interval: self
                .retention
                .purge_interval
                .unwrap_or(Duration::from_secs(600)),
        };
        within("retention.purge_interval", retention.purge_interval, YEAR)?;
        check_window(retention.window).map_err(|e| ConfigError::at("retention.window", e))?;
        let (admin_token, admin_token_off) = match &self.admin.token_env {
            Some(name) if name.trim().is_empty() => {
                return Err(ConfigError::at(
                    "admin.token_env",
                    "names no environment variable: give the name of the one that holds the \
                     admin token (e.g. \"HOOKBOX_ADMIN_TOKEN\"), or leave token_env out to keep \
                     the admin API and the console off",
                ))
            }
            Some(name) => admin_token(env.var(name)),
            None => (None, None),
        };
        // A variable that is not set is said after any other error of any source: `migrate`
        // lets it pass, and must not miss what is wrong in a source after it.
        let mut sources = Vec::with_capacity(self.sources.len());
        let mut unset = None;
        for (name, raw) in self.sources {
            match raw.validate(&name, env, registry) {
                Ok(source) => sources.push(source),
                Err(e) if e.names_an_unset_variable() => {
                    unset.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(unset) = unset {
            return Err(unset);
        }
        Ok(Config {
            server,
            database,
            retention,
            admin_token,
            admin_token_env: self.admin.token_env,
            admin_token_off,
            sources,
            file: None,
        })
    }
}

/// What a source whose `secrets_env` variable is not set is checked with (see
/// [`RawSource::validate`]): 64 zeros, which read as hex (Adyen's HMAC key), as base64 (a
/// Standard Webhooks secret without its prefix) and as text.
const PLACEHOLDER_SECRET: &str = "0000000000000000000000000000000000000000000000000000000000000000";

impl RawSource {
    fn validate(
        self,
        name: &str,
        env: &dyn Env,
        registry: &Registry,
    ) -> Result<SourceConfig, ConfigError> {
        let key = |field: &str| format!("sources.{name}.{field}");
        let source_name = SourceName::try_from(name)
            .map_err(|e| ConfigError::at(format!("sources.{name}"), e))?;
        if name == crate::metrics::UNKNOWN_SOURCE {
            return Err(ConfigError::at(
                format!("sources.{name}"),
                format!(
                    "the source name {name:?} is reserved: /metrics and the console count \
                     requests to unconfigured sources under it; choose another name"
                ),
            ));
        }
        let scheme = registry
            .scheme(&self.scheme, Some(self.own))
            .map_err(|e| ConfigError::at(key("scheme"), e))?;
        let given = self.secrets.is_some() || self.secrets_env.is_some();
        // A `secrets_env` naming a variable that is not set is said once the rest of the source
        // is checked as far as it can be without the secret: `migrate`, which lets such a
        // variable pass, still finds an unknown key or a wrong value there (a black-box run: a
        // deploy step's `migrate --config` passed, and `serve` then refused the file).
        let mut unset = None;
        let secrets = match (self.secrets, self.secrets_env) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::at(
                    key("secrets_env"),
                    "give either secrets or secrets_env, not both",
                ))
            }
            (Some(list), None) => list,
            (None, Some(var)) => match env.var(&var).filter(|v| !v.trim().is_empty()) {
                Some(value) => {
                    let listed: Vec<String> = value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect();
                    if listed.is_empty() {
                        return Err(ConfigError::at(
                            key("secrets_env"),
                            format!(
                                "the environment variable {} holds no secret, only commas and \
                                 spaces (several secrets are comma-separated)",
                                crate::redact::variable_name(&var)
                            ),
                        ));
                    }
                    listed
                }
                None => {
                    unset = Some(ConfigError::at(
                        key("secrets_env"),
                        format!(
                            "the environment variable {} is not set (or is empty)",
                            crate::redact::variable_name(&var)
                        ),
                    ));
                    vec![PLACEHOLDER_SECRET.to_owned()]
                }
            },
            // Whether the scheme needs secrets is its provider's to say: one whose key material
            // is something else (a certificate it fetches) takes none, and every other refuses
            // an empty list under `secrets` when it is built below.
            (None, None) => Vec::new(),
        };
        // Only whitespace is a paste gone wrong, as an empty one is (`secrets_env` trims its
        // values, so there it is none).
        if secrets.iter().any(|s| s.trim().is_empty()) || (given && secrets.is_empty()) {
            return Err(ConfigError::at(
                key("secrets"),
                "a source needs at least one secret, and no secret may be empty or only \
                 whitespace",
            ));
        }
        let secrets: Vec<Secret> = secrets.into_iter().map(Secret::new).collect();
        // "id", the default, as the `source live` line shows it, may be written too.
        let dedupe_body = match self.dedupe.as_deref() {
            None | Some("id") => false,
            Some("body") => true,
            Some(other) => {
                return Err(ConfigError::at(
                    key("dedupe"),
                    format!(
                        "{other:?} is not a dedupe mode; write \"body\" (a payload already \
                         stored under another event id is answered as a replay) or \"id\" (the \
                         default: the event id alone)"
                    ),
                ))
            }
        };
        if self.tolerance.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::at(
                key("tolerance"),
                "must be longer than 0s (how far a signed timestamp may be from now)",
            ));
        }
        if let Some(window) = self.retention {
            check_window(window).map_err(|e| ConfigError::at(key("retention"), e))?;
        }
        let tolerance = self
            .tolerance
            .unwrap_or(crate::providers::DEFAULT_TOLERANCE);
        // Building the provider is how a key of its own is found wrong, or a secret unusable
        // (a Standard Webhooks secret that is not base64), and that is a config error like any
        // other.
        let provider = match scheme.build_source(&secrets, self.tolerance) {
            Ok(provider) => provider,
            // Built with a stand-in for the secret that is not set: only a key the scheme does
            // not take is surely wrong whatever the secret.
            Err(ProviderError {
                key: field,
                problem,
            }) if unset.is_none() || problem.starts_with("unknown field") => {
                return Err(ConfigError::at(key(&field), problem))
            }
            Err(_) => return Err(unset.expect("checked in the arm above")),
        };
        if self.tolerance.is_some() && !provider.checks_timestamp() {
            let instead = if scheme.name() == "hmac" {
                "; set timestamp_header to check one"
            } else {
                ""
            };
            return Err(ConfigError::at(
                key("tolerance"),
                format!(
                    "{} checks no signed timestamp, so a tolerance would go unused; remove \
                     it{instead}",
                    crate::providers::a_source(scheme.name())
                ),
            ));
        }
        // A scheme whose id is a hash of a payload that verifies in more than one form
        // (Braintree's) dedupes by body always.
        if self.dedupe.as_deref() == Some("id") && provider.dedupes_body() {
            return Err(ConfigError::at(
                key("dedupe"),
                format!(
                    "a {} source dedupes by body always (its event id is a hash of a payload \
                     that verifies in more than one form); remove dedupe = \"id\"",
                    scheme.name()
                ),
            ));
        }
        let dedupe_body = dedupe_body || provider.dedupes_body();
        if let Some(unset) = unset {
            return Err(unset);
        }
        Ok(SourceConfig {
            name: source_name,
            scheme,
            provider,
            secrets,
            tolerance,
            retention: self.retention,
            dedupe_body,
            forward: match self.forward {
                Some(forward) => forward.validate(name, env)?,
                None => Vec::new(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_spelt_in_days_at_most_and_reads_back_as_written() {
        for (written, spelt) in [
            ("400d", "400days"),
            ("30d", "30days"),
            ("1d", "1day"),
            ("76h", "3days 4h"),
            ("10m", "10m"),
            ("90s", "1m 30s"),
            ("250ms", "250ms"),
            ("1500us", "1ms 500us"),
            ("0s", "0s"),
        ] {
            let duration = parse_duration(written).expect("a duration");
            assert_eq!(Spelt(duration).to_string(), spelt, "{written}");
            assert_eq!(parse_duration(spelt), Ok(duration), "{spelt} reads back");
        }
    }

    #[test]
    fn a_time_is_rfc3339_a_utc_date_and_time_a_date_or_a_duration_ago() {
        let now: chrono::DateTime<chrono::Utc> = "2026-12-03T12:00:00Z".parse().expect("a time");
        let at = |text: &str| {
            parse_time_or_ago(text, now)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .to_rfc3339()
        };
        assert_eq!(at("2026-12-02T09:00:00+01:00"), "2026-12-02T08:00:00+00:00");
        assert_eq!(at("2026-12-02T09:00:00Z"), "2026-12-02T09:00:00+00:00");
        assert_eq!(at("2026-12-02 09:30"), "2026-12-02T09:30:00+00:00");
        assert_eq!(at("2026-12-02T09:30"), "2026-12-02T09:30:00+00:00");
        assert_eq!(at("2026-12-02T09:30:00"), "2026-12-02T09:30:00+00:00");
        assert_eq!(at("2026-12-02 09:30:15.5"), "2026-12-02T09:30:15.500+00:00");
        assert_eq!(at(" 2026-12-02 "), "2026-12-02T00:00:00+00:00");
        assert_eq!(at("36h"), "2026-12-02T00:00:00+00:00");
        // Earlier than PostgreSQL's timestamps go: the same rows as 1970.
        for early in ["-5000-01-01", "10000y", "1969-12-31"] {
            assert_eq!(at(early), "1970-01-01T00:00:00+00:00", "{early}");
        }
        for bad in ["yesterday", "2026-13-02", "2026-12-02 25:00", ""] {
            let error = parse_time_or_ago(bad, now).expect_err(bad);
            assert!(error.contains("RFC 3339"), "{error}");
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn error(text: &str) -> String {
        Config::parse(text, &no_env)
            .expect_err("config should be refused")
            .0
    }

    /// A source whose `secrets_env` variable is not set is still checked for what does not
    /// depend on the secret, so `migrate` (which lets the unset variable pass) finds it.
    #[test]
    fn a_source_with_its_secret_unset_is_checked_for_the_rest_first() {
        let source = |scheme: &str, more: &str| {
            format!("[sources.gh]\nscheme = \"{scheme}\"\nsecrets_env = \"NOPE_UNSET\"\n{more}")
        };
        for (text, key) in [
            (
                source("github", "scheme2 = 1\n"),
                "sources.gh.scheme2: unknown field",
            ),
            (
                source("github", "dedupe = \"bogus\"\n"),
                "sources.gh.dedupe:",
            ),
            (
                source("adyen", "tolerance = \"5m\"\n"),
                "sources.gh.tolerance:",
            ),
            (
                source("stripe", "signature_header = \"x\"\n"),
                "sources.gh.signature_header:",
            ),
            (
                source("github", ""),
                "sources.gh.secrets_env: the environment variable NOPE_UNSET",
            ),
            (
                source("paypal", ""),
                "sources.gh.secrets_env: the environment variable NOPE_UNSET",
            ),
            // Another source after it is checked too.
            (
                source(
                    "github",
                    "[sources.zz]\nscheme = \"github\"\nsecrets = [\"s\"]\nbogus = 1\n",
                ),
                "sources.zz.bogus: unknown field",
            ),
        ] {
            let refused = Config::parse(&text, &no_env).expect_err("refused");
            assert!(refused.0.starts_with(key), "{key} <- {}", refused.0);
            // What `migrate` lets pass (`load_without_secrets`).
            assert_eq!(
                refused.names_an_unset_variable(),
                key.contains("NOPE_UNSET"),
                "{key}"
            );
        }
    }

    #[test]
    fn the_contract_example_parses() {
        let env = |name: &str| match name {
            "ACME_SECRET" => Some("s1,s2".to_owned()),
            "HOOKBOX_ADMIN_TOKEN" => Some("tok".to_owned()),
            _ => None,
        };
        let config = Config::parse(
            r#"
            [server]
            listen = "127.0.0.1:8080"
            max_body_bytes = 1048576
            in_flight_wait = "10s"
            [database]
            url = "postgres://postgres@127.0.0.1:5432/hookbox"
            pool_size = 16
            [retention]
            window = "72h"
            purge_interval = "10m"
            [admin]
            token_env = "HOOKBOX_ADMIN_TOKEN"
            [sources.stripe]
            scheme = "stripe"
            secrets = ["whsec_abc"]
            tolerance = "5m"
            retention = "30d"
            [sources.acme]
            scheme = "hmac-sha256"
            secrets_env = "ACME_SECRET"
            signature_header = "X-Acme-Signature"
            signature_prefix = "sha256="
            encoding = "hex"
            event_id = "header:X-Acme-Event-Id"
            event_type = "json:/type"
            "#,
            &env,
        )
        .expect("the contract's example is valid");
        assert_eq!(config.server.in_flight_wait, Duration::from_secs(10));
        assert_eq!(config.server.request_timeout, Duration::from_secs(30));
        assert_eq!(config.retention.window, Duration::from_secs(72 * 3600));
        assert!(config.admin_token.is_some());
        let names: Vec<_> = config.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["acme", "stripe"]);
        assert_eq!(config.sources[0].secrets.len(), 2);
        assert_eq!(
            config.sources[1].retention,
            Some(Duration::from_secs(30 * 86400))
        );
    }

    #[test]
    fn environment_overrides_listen_and_database_url() {
        let env = |name: &str| match name {
            "HOOKBOX_LISTEN" => Some("0.0.0.0:9000".to_owned()),
            "DATABASE_URL" => Some("postgres://other/db".to_owned()),
            _ => None,
        };
        let config = Config::parse(
            "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"postgres://x/y\"\n",
            &env,
        )
        .expect("valid");
        assert_eq!(config.server.listen, "0.0.0.0:9000");
        assert_eq!(config.database.url, "postgres://other/db");
    }

    #[test]
    fn a_config_file_that_cannot_be_read_says_what_named_it() {
        let missing = Path::new("/nonexistent/hookbox-test.toml");
        let named = Config::load(Some(missing), &no_env).expect_err("missing").0;
        assert!(
            named.contains("named by --config")
                && named.contains("check the path given to --config"),
            "{named}"
        );
        let env = |name: &str| {
            (name == "HOOKBOX_CONFIG").then(|| "/nonexistent/hookbox-test.toml".to_owned())
        };
        let from_env = Config::load(None, &env).expect_err("missing").0;
        assert!(
            from_env.contains("named by HOOKBOX_CONFIG")
                && from_env.contains("check HOOKBOX_CONFIG"),
            "{from_env}"
        );
    }

    #[test]
    fn an_override_variable_set_but_empty_counts_as_not_set() {
        let env = |name: &str| match name {
            "HOOKBOX_LISTEN" | "DATABASE_URL" | "HOOKBOX_CONFIG" => Some(String::new()),
            _ => None,
        };
        let config = Config::parse(
            "[server]\nlisten = \"127.0.0.1:1\"\n[database]\nurl = \"postgres://x/y\"\n",
            &env,
        )
        .expect("valid");
        assert_eq!(config.server.listen, "127.0.0.1:1");
        assert_eq!(config.database.url, "postgres://x/y");
        // No HOOKBOX_CONFIG: the default file, which need not exist, not a file named "".
        assert!(Config::load_parsed(None, &env, |_| Ok(())).is_ok());
    }

    #[test]
    fn a_loaded_config_names_its_file_or_that_there_was_none() {
        // The crate's directory, where tests run, has no ./hookbox.toml.
        assert!(!Path::new(DEFAULT_CONFIG_FILE).exists());
        assert_eq!(Config::load(None, &no_env).expect("defaults").file, None);
        let file = std::env::temp_dir().join(format!("hookbox-file-{}.toml", std::process::id()));
        std::fs::write(&file, "[retention]\nwindow = \"1h\"\n").expect("write");
        let loaded = Config::load(Some(&file), &no_env).expect("valid");
        std::fs::remove_file(&file).expect("remove");
        assert_eq!(loaded.file.as_deref(), Some(file.as_path()));
    }

    #[test]
    fn a_bad_database_url_names_where_it_came_from_and_never_echoes_a_key_value_password() {
        let file = std::env::temp_dir().join(format!("hookbox-dsn-{}.toml", std::process::id()));
        std::fs::write(&file, "[database]\nurl = \"host=h password=FILEPW1\"\n").expect("write");
        let from_file = Config::load(Some(&file), &no_env).expect_err("not a URL").0;
        let dsn =
            |name: &str| (name == "DATABASE_URL").then(|| "host=h password=ENVPW1".to_owned());
        let from_env = Config::load(Some(&file), &dsn).expect_err("not a URL").0;
        let mysql = |name: &str| (name == "DATABASE_URL").then(|| "mysql://u:MYPW1@h/d".to_owned());
        let masked = Config::load(Some(&file), &mysql)
            .expect_err("not hookbox's")
            .0;
        std::fs::remove_file(&file).expect("remove");
        assert!(
            from_file.starts_with(&format!("{}: database.url: ", file.display()))
                && from_file.contains("key=value"),
            "{from_file}"
        );
        assert!(
            from_env.starts_with("DATABASE_URL: ") && from_env.contains("key=value"),
            "the environment's value, not the file's: {from_env}"
        );
        assert!(masked.contains("mysql://u:***@h/d"), "{masked}");
        for message in [&from_file, &from_env, &masked] {
            assert!(!message.contains("PW1"), "{message}");
        }
    }

    #[test]
    fn a_bad_file_database_url_under_database_url_is_still_refused() {
        let env = |name: &str| (name == "DATABASE_URL").then(|| "postgres://h/db".to_owned());
        let message = Config::parse("[database]\nurl = \"mysql://u:FILEPW2@h/d\"\n", &env)
            .expect_err("the file's value is no store")
            .0;
        assert!(
            message.starts_with("database.url: ")
                && message.contains("DATABASE_URL overrides it now")
                && message.contains("mysql://u:***@h/d")
                && !message.contains("FILEPW2"),
            "{message}"
        );
        let fine = Config::parse("[database]\nurl = \"sqlite://x.db\"\n", &env).expect("valid");
        assert_eq!(fine.database.url, "postgres://h/db");
    }

    #[test]
    fn unknown_keys_are_named() {
        let message = error("[server]\nlisten = \"x\"\nlistne = \"y\"\n");
        assert!(
            message.starts_with("server.listne: unknown field `listne`"),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
        let message =
            error("[sources.s]\nscheme = \"github\"\nsecrets = [\"x\"]\ntolerence = \"5m\"\n");
        assert!(
            message.contains("sources.s") && message.contains("tolerence"),
            "{message}"
        );
        let message = error("[serer]\n");
        assert!(message.contains("unknown field `serer`"), "{message}");
    }

    #[test]
    fn the_request_timeout_is_a_positive_duration() {
        let config = Config::parse("[server]\nrequest_timeout = \"2s\"\n", &no_env).expect("valid");
        assert_eq!(config.server.request_timeout, Duration::from_secs(2));
        let message = error("[server]\nrequest_timeout = \"0s\"\n");
        assert!(
            message.starts_with("server.request_timeout: must be longer"),
            "{message}"
        );
    }

    #[test]
    fn waits_timeouts_and_the_purge_interval_have_a_ceiling() {
        // Past it, an attempt's lease overflowed the clock (every claim of the source failed)
        // and PostgreSQL refused the lock timeout (every claim was 503).
        let forward = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
                       [sources.s.forward]\nurl = \"http://127.0.0.1:9/\"\n\
                       secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";
        for (text, key, max) in [
            (
                "[server]\nin_flight_wait = \"300000y\"\n".to_owned(),
                "server.in_flight_wait",
                "1h",
            ),
            (
                "[server]\nrequest_timeout = \"2h\"\n".to_owned(),
                "server.request_timeout",
                "1h",
            ),
            (
                "[retention]\npurge_interval = \"2y\"\n".to_owned(),
                "retention.purge_interval",
                "365d",
            ),
            (
                format!("{forward}timeout = \"300000y\"\n"),
                "sources.s.forward.timeout",
                "1h",
            ),
            (
                format!("{forward}timeout = \"0s\"\n"),
                "sources.s.forward.timeout",
                "1h",
            ),
        ] {
            let message = error(&text);
            assert!(
                message.starts_with(&format!("{key}: must be longer than 0s and at most {max}")),
                "{text}: {message}"
            );
        }
        let config =
            Config::parse(&format!("{forward}timeout = \"1h\"\n"), &no_env).expect("valid");
        assert_eq!(
            config.sources[0].forward[0].timeout,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn bad_durations_are_named() {
        let message = error("[server]\nin_flight_wait = \"ten seconds\"\n");
        assert!(
            message.starts_with("server.in_flight_wait: invalid duration"),
            "{message}"
        );
        let message = error(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\ntolerance = \"5 parsecs\"\n",
        );
        assert!(
            message.starts_with("sources.s.tolerance: invalid duration"),
            "{message}"
        );
    }

    #[test]
    fn a_source_needs_secrets_and_a_known_scheme() {
        let message = error("[sources.s]\nscheme = \"stripe\"\n");
        assert!(message.starts_with("sources.s.secrets:"), "{message}");
        let message = error("[sources.s]\nscheme = \"stripe\"\nsecrets = []\n");
        assert!(message.starts_with("sources.s.secrets:"), "{message}");
        let message = error("[sources.s]\nscheme = \"papyal\"\nsecrets = [\"x\"]\n");
        assert!(
            message.starts_with("sources.s.scheme: unknown scheme \"papyal\""),
            "{message}"
        );
        let message = error("[sources.s]\nscheme = \"stripe\"\nsecrets_env = \"NOPE_UNSET\"\n");
        assert!(message.contains("NOPE_UNSET is not set"), "{message}");
    }

    #[test]
    fn a_scheme_without_secrets_takes_its_own_key_material_and_refuses_secrets() {
        let config = Config::parse(
            "[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"4JH86294D6297924G\"\n",
            &no_env,
        )
        .expect("a paypal source needs no secrets");
        assert!(config.sources[0].secrets.is_empty());
        let message = error("[sources.pp]\nscheme = \"paypal\"\n");
        assert!(message.starts_with("sources.pp.webhook_id:"), "{message}");
        let message =
            error("[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"W\"\nsecrets = [\"x\"]\n");
        assert!(message.starts_with("sources.pp.secrets:"), "{message}");
        assert!(message.contains("webhook_id"), "{message}");
        let message =
            error("[sources.pp]\nscheme = \"paypal\"\nwebhook_id = \"W\"\nsecrets = []\n");
        assert!(message.starts_with("sources.pp.secrets:"), "{message}");
    }

    #[test]
    fn generic_sources_need_a_header_and_an_id_location() {
        let message = error(
            "[sources.s]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nevent_id = \"json:/id\"\n",
        );
        assert!(
            message.starts_with("sources.s.signature_header:"),
            "{message}"
        );
        let message = error("[sources.s]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\n");
        assert!(message.starts_with("sources.s.event_id:"), "{message}");
        let message = error("[sources.s]\nscheme = \"hmac-sha256\"\nsecrets = [\"x\"]\nsignature_header = \"X-Sig\"\nevent_id = \"body:id\"\n");
        assert!(message.starts_with("sources.s.event_id:"), "{message}");
        let message = error(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\nsignature_header = \"X\"\n",
        );
        assert!(
            message.starts_with("sources.s.signature_header:"),
            "{message}"
        );
    }

    #[test]
    fn a_forward_target_is_validated() {
        let base = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.forward]\n";
        let ok = Config::parse(
            &format!("{base}url = \"http://127.0.0.1:9000/hooks\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"),
            &no_env,
        )
        .expect("valid");
        let forward = ok.sources[0].forward.first().expect("forward");
        assert_eq!(forward.name, "default");
        assert_eq!(
            (forward.timeout, forward.max_attempts),
            (Duration::from_secs(10), 12)
        );
        let message = error(&format!(
            "{base}url = \"ftp://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
        ));
        assert!(message.starts_with("sources.s.forward.url:"), "{message}");
        // What an HTTP client would not send as written is refused, its password unrepeated.
        for (url, says) in [
            ("http://u:pw@", "not a URL"),
            ("http://u:pw@host/hook", "user:password@"),
            ("http://host:0/hook", "port"),
            ("http://host:70000/hook", "port"),
            ("http://host/hook#part", "fragment"),
            ("http:///hook", "URL"),
        ] {
            let message = error(&format!(
                "{base}url = {url:?}\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"
            ));
            assert!(
                message.starts_with("sources.s.forward.url:") && message.contains(says),
                "{url}: {message}"
            );
            assert!(!message.contains("pw"), "{url}: {message}");
        }
        let message = error(&format!("{base}url = \"http://x\"\n"));
        assert!(
            message.starts_with("sources.s.forward.secret:"),
            "{message}"
        );
        let message = error(&format!(
            "{base}url = \"http://x\"\nsecret = \"whsec_!!\"\n"
        ));
        assert!(
            message.starts_with("sources.s.forward.secret:"),
            "{message}"
        );
        let message = error(&format!("{base}url = \"http://x\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nretries = 3\n"));
        assert!(
            message.starts_with("sources.s.forward.retries: unknown field"),
            "{message}"
        );
    }

    const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn targets(body: &str) -> Result<Vec<ForwardConfig>, String> {
        Config::parse(
            &format!("[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n{body}"),
            &no_env,
        )
        .map(|config| config.sources[0].forward.clone())
        .map_err(|e| e.0)
    }

    #[test]
    fn an_array_of_forward_tables_names_several_targets() {
        let targets = targets(&format!(
            "[[sources.s.forward]]\nname = \"billing\"\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\n\
             events = [\"payment_intent.*\", \"charge.refunded\"]\nrate = \"50/s\"\n\
             concurrency = 8\nordered = true\n\
             [[sources.s.forward]]\nname = \"audit-log_2\"\nurl = \"http://b\"\nsecret = \"{WHSEC}\"\nrate = \"30/m\"\n"
        ))
        .expect("valid");
        let names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["billing", "audit-log_2"]);
        let (billing, audit) = (&targets[0], &targets[1]);
        assert_eq!(
            billing.rate,
            Some(Rate {
                count: 50,
                per: Duration::from_secs(1)
            })
        );
        assert_eq!(
            audit.rate,
            Some(Rate {
                count: 30,
                per: Duration::from_secs(60)
            })
        );
        assert_eq!((billing.concurrency, billing.ordered), (8, true));
        assert_eq!((audit.concurrency, audit.ordered), (16, false));
        // The unit in either case, spaces around the parts allowed.
        for (text, count, per) in [(" 10/s", 10, 1), ("10/S", 10, 1), ("3 / M ", 3, 60)] {
            assert_eq!(
                text.parse::<Rate>(),
                Ok(Rate {
                    count,
                    per: Duration::from_secs(per)
                }),
                "{text:?}"
            );
        }
        // As the startup log shows them: as written.
        let shown = |t: &ForwardConfig| t.rate.map(|r| r.to_string());
        assert_eq!(
            (shown(billing), shown(audit)),
            (Some("50/s".into()), Some("30/m".into()))
        );
        assert!(billing.wants(Some("payment_intent.succeeded")));
        assert!(billing.wants(Some("charge.refunded")));
        assert!(!billing.wants(Some("charge.refunded.extra")));
        assert!(!billing.wants(None));
        assert!(audit.wants(Some("anything")) && audit.wants(None));
        let single = targets_single();
        assert_eq!(single.name, DEFAULT_TARGET);
        assert!(single.events.is_empty() && single.rate.is_none());
    }

    fn targets_single() -> ForwardConfig {
        targets(&format!(
            "[sources.s.forward]\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\n"
        ))
        .expect("valid")
        .remove(0)
    }

    #[test]
    fn a_target_config_error_names_the_key() {
        let target = |name: &str, extra: &str| {
            format!("[[sources.s.forward]]\nname = \"{name}\"\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\n{extra}")
        };
        for (body, key) in [
            (
                format!("{}{}", target("a", ""), target("a", "")),
                "sources.s.forward[1].name: a second target named \"a\"",
            ),
            (target("a", "events = [\"x\", \"\"]\n"), "sources.s.forward[0].events[1]:"),
            (target("a", "events = []\n"), "sources.s.forward[0].events: an empty list"),
            (
                format!("[[sources.s.forward]]\nname = \"a\"\nurl = \"amqp://127.0.0.1\"\nexchange = \"x\"\nrouting_key = \"k\"\nsecret = \"{WHSEC}\"\n"),
                "sources.s.forward[0].secret: an AMQP target takes no secret",
            ),
            (target("a", "rate = \"fast\"\n"), "sources.s.forward[0].rate:"),
            (target("a", "rate = \"0/s\"\n"), "sources.s.forward[0].rate:"),
            (target("a", "rate = \"5/h\"\n"), "sources.s.forward[0].rate:"),
            (target("a", "concurrency = 0\n"), "sources.s.forward[0].concurrency:"),
            (target("a b", ""), "sources.s.forward[0].name:"),
            (target(&"x".repeat(65), ""), "sources.s.forward[0].name:"),
            (target("a", "ordered = \"yes\"\n"), "sources.s.forward[0].ordered:"),
            (target("a", "retries = 1\n"), "sources.s.forward[0].retries: unknown field"),
            (
                format!("[[sources.s.forward]]\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\n"),
                "sources.s.forward[0].name:",
            ),
            (
                format!("[sources.s.forward]\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\nconcurrency = 0\n"),
                "sources.s.forward.concurrency:",
            ),
            (
                format!("[sources.s.forward]\nname = \"billing\"\nurl = \"http://a\"\nsecret = \"{WHSEC}\"\n"),
                "sources.s.forward.name: the one table",
            ),
        ] {
            let message = targets(&body).expect_err(&body);
            assert!(message.starts_with(key), "{key} <- {message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }

    #[test]
    fn a_url_scheme_picks_the_transport() {
        let targets = targets(
            "[[sources.s.forward]]\nname = \"bus\"\nurl = \"nats://127.0.0.1:4222\"\n\
             subject = \"webhooks.{source}.{event_type}\"\n\
             [[sources.s.forward]]\nname = \"rabbit\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n\
             exchange = \"webhooks\"\nrouting_key = \"{source}.{event_type}\"\n",
        )
        .expect("valid");
        let Transport::Nats { subject } = &targets[0].transport else {
            panic!("nats:// is NATS: {:?}", targets[0]);
        };
        assert_eq!(subject.to_string(), "webhooks.{source}.{event_type}");
        let Transport::Amqp {
            exchange,
            routing_key,
        } = &targets[1].transport
        else {
            panic!("amqp:// is AMQP: {:?}", targets[1]);
        };
        assert_eq!(
            (exchange.to_string(), routing_key.to_string()),
            ("webhooks".to_owned(), "{source}.{event_type}".to_owned())
        );
        let shown = format!("{:?}", targets[1]);
        assert!(
            shown.contains("amqp://guest:***@127.0.0.1:5672/%2f"),
            "{shown}"
        );
        assert!(!shown.contains("guest@"), "{shown}");
    }

    #[test]
    fn url_env_holds_the_whole_url() {
        let env = |name: &str| {
            (name == "RABBIT_URL").then(|| "amqps://hook:s3cr3t@mq.example:5671/prod".to_owned())
        };
        let config = Config::parse(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.forward]\n\
             url_env = \"RABBIT_URL\"\nexchange = \"\"\nrouting_key = \"q\"\n",
            &env,
        )
        .expect("valid");
        let target = &config.sources[0].forward[0];
        assert_eq!(target.url, "amqps://hook:s3cr3t@mq.example:5671/prod");
        assert_eq!(target.shown_url(), "amqps://hook:***@mq.example:5671/prod");
        let message = error(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.forward]\n\
             url_env = \"HOOKBOX_TEST_UNSET\"\nsubject = \"a\"\n",
        );
        assert!(
            message.starts_with("sources.s.forward.url_env:"),
            "{message}"
        );
        // What is wrong with the URL it holds is said of url_env too, the password masked.
        let env = |name: &str| (name == "BAD_URL").then(|| "amqp://u:pw123456@[::1".to_owned());
        let message = Config::parse(
            "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.forward]\n\
             url_env = \"BAD_URL\"\nexchange = \"\"\nrouting_key = \"q\"\n",
            &env,
        )
        .expect_err("a URL that cannot be read")
        .to_string();
        assert!(
            message.starts_with("sources.s.forward.url_env:") && !message.contains("pw123456"),
            "{message}"
        );
    }

    #[test]
    fn a_bus_target_config_error_names_the_key() {
        let nats = "url = \"nats://127.0.0.1:4222\"\n";
        let amqp = "url = \"amqp://guest:hunter2@127.0.0.1:5672/%2f\"\n";
        let cases = [
            (format!("{nats}subject = \"a.{{source}}\"\nsecret = \"{WHSEC}\"\n"), "secret"),
            (format!("{amqp}exchange = \"x\"\nrouting_key = \"k\"\nsecret_env = \"HOME\"\n"), "secret_env"),
            (format!("{nats}subject = \"a.{{evnt_type}}\"\n"), "subject"),
            (format!("{nats}subject = \"a..b\"\n"), "subject"),
            (nats.to_owned(), "subject"),
            (format!("{amqp}routing_key = \"k\"\n"), "exchange"),
            (format!("{amqp}exchange = \"x\"\nrouting_key = \"{{id}}\"\n"), "routing_key"),
            (format!("{amqp}exchange = \"x\"\nrouting_key = \"k\"\nsubject = \"a\"\n"), "subject"),
            (format!("{nats}subject = \"a\"\nexchange = \"x\"\n"), "exchange"),
            (format!("url = \"http://a\"\nsecret = \"{WHSEC}\"\nrouting_key = \"k\"\n"), "routing_key"),
            ("url = \"kafka://u:hunter2@broker:9092\"\n".to_owned(), "url"),
            ("url = \"nats://\"\nsubject = \"a\"\n".to_owned(), "url"),
            ("url = \"nats://127.0.0.1:0\"\nsubject = \"a\"\n".to_owned(), "url"),
            ("url = \"nats://127.0.0.1:4222/x\"\nsubject = \"a\"\n".to_owned(), "url"),
            ("url = \"nats://127.0.0.1:4222?x=1\"\nsubject = \"a\"\n".to_owned(), "url"),
            ("url = \"amqp://guest:hunter2@h:notaport/\"\nexchange = \"x\"\nrouting_key = \"k\"\n".to_owned(), "url"),
            (format!("{nats}url_env = \"HOME\"\nsubject = \"a\"\n"), "url_env"),
            ("subject = \"a\"\n".to_owned(), "url"),
        ];
        for (body, field) in cases {
            let message = targets(&format!("[sources.s.forward]\n{body}")).expect_err(&body);
            assert!(
                message.starts_with(&format!("sources.s.forward.{field}:")),
                "{body}: {message}"
            );
            assert!(!message.contains("hunter2"), "{message}");
        }
    }

    #[test]
    fn a_time_is_rfc3339_or_a_duration_ago() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .expect("valid time")
            .with_timezone(&chrono::Utc);
        let at = |text: &str| parse_time_or_ago(text, now).map(|t| t.to_rfc3339());
        assert_eq!(
            at("2026-12-02T09:00:00Z"),
            Ok("2026-12-02T09:00:00+00:00".into())
        );
        assert_eq!(
            at("2026-12-02T10:00:00+01:00"),
            Ok("2026-12-02T09:00:00+00:00".into())
        );
        assert_eq!(at("90m"), Ok("2026-12-02T08:30:00+00:00".into()));
        let error = at("yesterday").expect_err("neither form");
        assert!(
            error.contains("RFC 3339") && error.contains("duration"),
            "{error}"
        );
    }

    #[test]
    fn an_admin_token_env_naming_an_unset_variable_leaves_the_admin_api_off_and_says_so() {
        let text = "[admin]\ntoken_env = \"HOOKBOX_NOPE_UNSET\"\n";
        let config = Config::parse(text, &no_env).expect("valid");
        assert!(config.admin_token.is_none());
        let message = config.admin_token_warning().expect("a warning");
        assert!(
            message.starts_with("admin.token_env") && message.contains("HOOKBOX_NOPE_UNSET"),
            "{message}"
        );
        let empty = |name: &str| (name == "HOOKBOX_NOPE_UNSET").then(String::new);
        let config = Config::parse(text, &empty).expect("valid");
        assert!(config.admin_token.is_none(), "an empty token is no token");
        assert!(config.admin_token_warning().is_some());
        let set = |name: &str| (name == "HOOKBOX_NOPE_UNSET").then(|| "tok".to_owned());
        let config = Config::parse(text, &set).expect("valid");
        assert!(config.admin_token.is_some());
        assert_eq!(config.admin_token_warning(), None);
        // A secret mounted from a file ends with a newline, which is not part of the token.
        let from_a_file = |name: &str| (name == "HOOKBOX_NOPE_UNSET").then(|| " tok\n".to_owned());
        let config = Config::parse(text, &from_a_file).expect("valid");
        assert_eq!(config.admin_token.as_ref().map(Secret::expose), Some("tok"));
        assert_eq!(config.admin_token_warning(), None);
        for (value, why) in [("  \n", "only whitespace"), ("tökén", "printable ASCII")] {
            let odd = |name: &str| (name == "HOOKBOX_NOPE_UNSET").then(|| value.to_owned());
            let config = Config::parse(text, &odd).expect("valid");
            assert!(config.admin_token.is_none(), "{value:?}");
            let message = config.admin_token_warning().expect("a warning");
            assert!(message.contains(why), "{message}");
        }
        let config = Config::parse("", &no_env).expect("valid");
        assert_eq!(
            config.admin_token_warning(),
            None,
            "no token_env: off, quietly"
        );
    }

    #[test]
    fn signing_leaves_out_sources_whose_secret_is_unset_or_empty_and_needs_no_forward_secret() {
        let text = "[sources.a]\nscheme = \"github\"\nsecrets_env = \"HOOKBOX_EMPTY\"\n\
                    [sources.b]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
                    [sources.b.forward]\nurl = \"http://127.0.0.1:9/\"\n\
                    secret_env = \"HOOKBOX_NOPE_UNSET\"\n";
        let dir = std::env::temp_dir().join(format!("hookbox-signing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let file = dir.join("hookbox.toml");
        std::fs::write(&file, text).expect("the config");
        let empty = |name: &str| (name == "HOOKBOX_EMPTY").then(|| "  ".to_owned());
        let (config, unset) = Config::load_for_signing(Some(&file), &empty).expect("loaded");
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<&str> = config.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["b"], "b signs without its forward target's secret");
        assert_eq!(unset.len(), 1);
        assert_eq!(unset[0].0, "a");
        let message = unset[0].1.to_string();
        assert!(
            message.contains("HOOKBOX_EMPTY is not set (or is empty)"),
            "{message}"
        );
    }

    #[test]
    fn a_secrets_env_of_commas_alone_names_its_variable() {
        let text = "[sources.s]\nscheme = \"stripe\"\nsecrets_env = \"HOOKBOX_COMMAS\"\n";
        let commas = |name: &str| (name == "HOOKBOX_COMMAS").then(|| " , ,".to_owned());
        let message = Config::parse(text, &commas)
            .expect_err("refused")
            .to_string();
        assert!(
            message.starts_with("sources.s.secrets_env: ")
                && message.contains("HOOKBOX_COMMAS holds no secret"),
            "{message}"
        );
    }

    #[test]
    fn a_forward_secret_env_whose_value_is_no_secret_is_named_under_secret_env() {
        let text = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
                    [sources.s.forward]\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"HOOKBOX_BAD\"\n";
        let bad = |name: &str| (name == "HOOKBOX_BAD").then(|| "notbase64!!".to_owned());
        let message = Config::parse(text, &bad).expect_err("refused").to_string();
        assert!(
            message.starts_with("sources.s.forward.secret_env: the value of the variable it names"),
            "{message}"
        );
        assert!(!message.contains("notbase64"), "{message}");
    }

    #[test]
    fn a_forward_secret_env_naming_an_empty_variable_says_it_may_be_empty() {
        let text = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_x\"]\n\
                    [sources.s.forward]\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"HOOKBOX_EMPTY\"\n";
        let empty = |name: &str| (name == "HOOKBOX_EMPTY").then(String::new);
        let message = Config::parse(text, &empty)
            .expect_err("refused")
            .to_string();
        assert!(
            message.contains("HOOKBOX_EMPTY is not set (or is empty)"),
            "{message}"
        );
    }

    #[test]
    fn dedupe_takes_body_or_the_default_id_and_nothing_else() {
        let base = "[sources.s]\nscheme = \"github\"\nsecrets = [\"x\"]\n";
        let config = Config::parse(&format!("{base}dedupe = \"body\"\n"), &no_env).expect("valid");
        assert!(config.sources[0].dedupe_body);
        let config = Config::parse(base, &no_env).expect("valid");
        assert!(!config.sources[0].dedupe_body, "off unless asked for");
        // The default, as the startup line names it, may be written.
        let config = Config::parse(&format!("{base}dedupe = \"id\"\n"), &no_env).expect("valid");
        assert!(!config.sources[0].dedupe_body);
        let message = error(&format!("{base}dedupe = \"payload\"\n"));
        assert!(
            message.starts_with("sources.s.dedupe:") && message.contains("\"body\""),
            "{message}"
        );
        // Braintree's cannot be "id".
        let braintree =
            "[sources.b]\nscheme = \"braintree\"\npublic_key = \"pk\"\nsecrets = [\"sk\"]\ndedupe = \"id\"\n";
        let message = error(braintree);
        assert!(
            message.starts_with("sources.b.dedupe:") && message.contains("always"),
            "{message}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_kind_says_what_to_write_instead() {
        let forward = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n[sources.s.forward]\n\
                       url = \"http://127.0.0.1:9/\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n";
        for (text, says) in [
            (
                "[retention]\nwindow = 3600\n".to_owned(),
                "retention.window: a duration needs its unit, in quotes: write 3600 seconds as \"3600s\"",
            ),
            (
                "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\ntolerance = 300\n".to_owned(),
                "sources.s.tolerance: a duration needs its unit, in quotes: write 300 seconds as \"300s\"",
            ),
            (
                format!("{forward}timeout = 1.5\n"),
                "sources.s.forward.timeout: a duration needs its unit, in quotes: write 1.5 seconds as \"1500ms\"",
            ),
            (
                "[retention]\nwindow = -5\n".to_owned(),
                "retention.window: a duration needs its unit, in quotes, like \"90s\"",
            ),
            (
                "[retention]\nwindow = nan\n".to_owned(),
                "retention.window: a duration needs its unit, in quotes, like \"90s\"",
            ),
            (
                format!("{forward}timeout = 0.0001\n"),
                "sources.s.forward.timeout: a duration needs its unit, in quotes, like \"90s\"",
            ),
            (
                "[server]\nin_flight_wait = true\n".to_owned(),
                "server.in_flight_wait: invalid type: boolean, expected a duration in quotes, like \"90s\"",
            ),
            (
                "[server]\nlisten = 8080\n".to_owned(),
                "server.listen: invalid type: integer, expected a string (write the address in quotes, like \"127.0.0.1:8080\")",
            ),
            (
                "[sources.s]\nsecrets = [\"x\"]\n".to_owned(),
                "sources.s: missing field `scheme`: every source names its scheme, one of stripe, standard,",
            ),
            (
                "[admin]\ntoken_env = \" \"\n".to_owned(),
                "admin.token_env: names no environment variable",
            ),
        ] {
            let message = error(&text);
            assert!(message.starts_with(says), "{text:?}: {message}");
        }
        let config =
            Config::parse(&format!("{forward}timeout = \"1500ms\"\n"), &no_env).expect("valid");
        assert_eq!(
            config.sources[0].forward[0].timeout,
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn a_number_of_the_wrong_kind_is_said_in_plain_words() {
        for (text, says) in [
            (
                "[database]\npool_size = \"abc\"\n",
                "database.pool_size: invalid type: string, expected a whole number, at most 4294967295 (write the number without quotes)",
            ),
            (
                "[sources.gl]\nscheme = \"gitlab\"\nsecrets = [\"abc\", 987654321]\n",
                "sources.gl.secrets[1]: invalid type: integer, expected a string",
            ),
            (
                "[sources.gl]\nscheme = \"gitlab\"\nsecrets = 98765.4321\n",
                "sources.gl.secrets: invalid type: floating point, expected a sequence",
            ),
            (
                "[sources.gl]\nscheme = \"gitlab\"\nsecrets = [\"a\", 1979-05-27T07:32:00Z]\n",
                "sources.gl.secrets[1]: invalid type: a TOML date or time; write text in quotes",
            ),
            (
                "[server]\ntolerance = 07:32:00\n",
                "server.tolerance: invalid type: a TOML date or time; write text in quotes",
            ),
            (
                "[server]\nmax_body_bytes = -1\n",
                "server.max_body_bytes: invalid value: integer `-1`, expected a whole number",
            ),
        ] {
            assert_eq!(error(text), says);
        }
    }

    #[test]
    fn syntax_errors_give_the_line() {
        let message = error("[server]\nlisten = \n");
        assert!(
            message.starts_with("line 2, column 10: server.listen: not valid TOML"),
            "{message}"
        );
        let message = error("[server\n");
        assert!(message.starts_with("line 1, column "), "{message}");
    }

    #[test]
    fn a_listen_address_that_is_not_one_names_the_key() {
        for bad in [
            "nohost",
            "127.0.0.1:99999",
            "",
            "garbage",
            "host:",
            ":8080",
            "a b:8080",
            "::1:8080",
            "[::1]:x",
            "[nohost]:8080",
            "18300",
        ] {
            let message = error(&format!("[server]\nlisten = {bad:?}\n"));
            assert!(message.starts_with("server.listen: "), "{bad:?}: {message}");
            // HOOKBOX_LISTEN set but empty counts as not set.
            if bad.is_empty() {
                continue;
            }
            let env = |name: &str| (name == "HOOKBOX_LISTEN").then(|| bad.to_owned());
            let message = Config::parse("", &env).expect_err(bad).0;
            assert!(
                message.starts_with("HOOKBOX_LISTEN: "),
                "{bad:?}: {message}"
            );
        }
        let message = error("[server]\nlisten = \"18300\"\n");
        assert!(
            message.contains("a port alone") && message.contains("\"127.0.0.1:18300\""),
            "{message}"
        );
        for good in [
            "127.0.0.1:0",
            "0.0.0.0:8080",
            "[::1]:8080",
            "localhost:8080",
            "hookbox-1.internal:65535",
        ] {
            let config = Config::parse(&format!("[server]\nlisten = {good:?}\n"), &no_env)
                .unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!(
                (config.server.listen.as_str(), config.server.listen_key),
                (good, "server.listen")
            );
        }
        let env = |name: &str| (name == "HOOKBOX_LISTEN").then(|| "127.0.0.1:9".to_owned());
        let config = Config::parse("[server]\nlisten = \"127.0.0.1:1\"\n", &env).expect("env wins");
        assert_eq!(config.server.listen_key, "HOOKBOX_LISTEN");
        // The file's value is still checked: it runs the day the variable goes.
        let message = Config::parse("[server]\nlisten = \"nohost\"\n", &env)
            .expect_err("the file's value is no address")
            .0;
        assert!(
            message.starts_with("server.listen: ")
                && message.contains("HOOKBOX_LISTEN overrides it now"),
            "{message}"
        );
    }

    #[test]
    fn serve_needs_a_listen_host_that_resolves() {
        let config =
            Config::parse("[server]\nlisten = \"localhost:8080\"\n", &no_env).expect("valid");
        assert_eq!(config.check_listen(), Ok(()));
        let config = Config::parse("[server]\nlisten = \"nohost.invalid:8080\"\n", &no_env)
            .expect("well formed; resolved only for serve");
        let message = config.check_listen().expect_err("names nothing").0;
        assert!(message.starts_with("server.listen: "), "{message}");
        // Read from a file, the error names it, as the file's other errors do.
        let path = std::env::temp_dir().join(format!("hookbox-listen-{}.toml", std::process::id()));
        std::fs::write(&path, "[server]\nlisten = \"nohost.invalid:8080\"\n").expect("written");
        let config = Config::load(Some(&path), &no_env).expect("well formed");
        std::fs::remove_file(&path).expect("remove");
        let message = config.check_listen().expect_err("names nothing").0;
        assert!(
            message.starts_with(&format!("{}: server.listen: ", path.display())),
            "{message}"
        );
    }

    /// A minimal valid source of each built-in scheme, and whether it checks a timestamp.
    fn every_scheme_source() -> Vec<(&'static str, String, bool)> {
        let ed25519 = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
        let p256 = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE4V07IxSSLO+EMlbwaSOgJ/ROriePz6g979dwtDZv0lwRD9rW+h87tXckmiy8m9qS+PON5O95+yLSX5aprDpGYw==";
        let secrets = "secrets = [\"s\"]\n";
        let generic = "signature_header = \"X-Sig\"\nevent_id = \"header:X-Id\"\n";
        vec![
            ("stripe", secrets.to_owned(), true),
            ("standard", format!("secrets = [\"{WHSEC}\"]\n"), true),
            ("github", secrets.to_owned(), false),
            ("shopify", secrets.to_owned(), false),
            ("slack", secrets.to_owned(), true),
            ("hmac-sha256", format!("{secrets}{generic}"), false),
            (
                "braintree",
                format!("{secrets}public_key = \"pk\"\n"),
                false,
            ),
            (
                "twilio",
                format!("{secrets}public_url = \"https://a/b\"\n"),
                false,
            ),
            ("paddle", secrets.to_owned(), true),
            ("checkout", secrets.to_owned(), false),
            ("razorpay", secrets.to_owned(), false),
            ("mollie", secrets.to_owned(), false),
            ("lemonsqueezy", secrets.to_owned(), false),
            (
                "square",
                format!("{secrets}public_url = \"https://a/b\"\n"),
                false,
            ),
            ("paypal", "webhook_id = \"W\"\n".to_owned(), true),
            ("adyen", "secrets = [\"00ff\"]\n".to_owned(), false),
            ("gocardless", secrets.to_owned(), false),
            ("gitlab", secrets.to_owned(), false),
            ("bitbucket", secrets.to_owned(), false),
            ("linear", secrets.to_owned(), true),
            ("zoom", secrets.to_owned(), true),
            ("twitch", secrets.to_owned(), true),
            ("meta", format!("{secrets}verify_token = \"t\"\n"), false),
            ("sendgrid", format!("public_keys = [\"{p256}\"]\n"), true),
            ("hmac", format!("{secrets}{generic}"), false),
            ("sns", String::new(), true),
            ("discord", format!("public_keys = [\"{ed25519}\"]\n"), true),
        ]
    }

    #[test]
    fn tolerance_is_refused_where_the_scheme_checks_no_timestamp() {
        let cases = every_scheme_source();
        let listed: Vec<&str> = cases.iter().map(|(scheme, _, _)| *scheme).collect();
        assert_eq!(
            listed.join(", "),
            Registry::builtin().names(),
            "every scheme"
        );
        for (scheme, keys, checks) in cases {
            let text = format!("[sources.s]\nscheme = \"{scheme}\"\n{keys}");
            Config::parse(&text, &no_env).unwrap_or_else(|e| panic!("{scheme}: {e}"));
            let with = format!("{text}tolerance = \"1m\"\n");
            match Config::parse(&with, &no_env) {
                Ok(config) => {
                    assert!(checks, "{scheme} takes a tolerance it never uses");
                    assert!(config.sources[0].provider.checks_timestamp(), "{scheme}");
                }
                Err(e) => {
                    assert!(!checks, "{scheme}: {e}");
                    assert!(
                        e.0.starts_with("sources.s.tolerance: ") && e.0.contains(scheme),
                        "{e}"
                    );
                }
            }
        }
        // `hmac` checks one exactly when it is told where: then a tolerance is its own.
        let stamped = "[sources.s]\nscheme = \"hmac\"\nsecrets = [\"s\"]\n\
                       signature_header = \"X-Sig\"\nevent_id = \"header:X-Id\"\n\
                       signed_content = \"{timestamp}.{body}\"\ntimestamp_header = \"X-Time\"\n\
                       tolerance = \"1m\"\n";
        let config = Config::parse(stamped, &no_env).expect("valid");
        assert_eq!(config.sources[0].tolerance, Duration::from_secs(60));
        let message = error(&stamped.replace(
            "signed_content = \"{timestamp}.{body}\"\ntimestamp_header = \"X-Time\"\n",
            "",
        ));
        assert!(message.contains("timestamp_header"), "{message}");
    }

    #[test]
    fn a_zero_window_or_tolerance_is_refused() {
        let source = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n";
        for (text, key) in [
            (
                "[retention]\nwindow = \"0s\"\n".to_owned(),
                "retention.window: ",
            ),
            (
                format!("{source}retention = \"0s\"\n"),
                "sources.s.retention: ",
            ),
            (
                format!("{source}tolerance = \"0s\"\n"),
                "sources.s.tolerance: ",
            ),
        ] {
            let message = error(&text);
            assert!(
                message.starts_with(key) && message.contains("longer than 0s"),
                "{key} <- {message}"
            );
        }
    }

    #[test]
    fn a_window_whose_cutoff_no_store_holds_is_refused() {
        let source = "[sources.s]\nscheme = \"stripe\"\nsecrets = [\"x\"]\n";
        for long in ["10000y", "100000000y"] {
            for (text, key) in [
                (
                    format!("[retention]\nwindow = \"{long}\"\n"),
                    "retention.window: ",
                ),
                (
                    format!("{source}retention = \"{long}\"\n"),
                    "sources.s.retention: ",
                ),
            ] {
                let message = error(&text);
                assert!(
                    message.starts_with(key) && message.contains("too far in the past"),
                    "{key} <- {message}"
                );
            }
        }
        // Long, but a time PostgreSQL holds: a way to keep everything.
        let config = Config::parse(
            &format!("[retention]\nwindow = \"1000y\"\n{source}retention = \"1000y\"\n"),
            &no_env,
        )
        .expect("valid");
        assert!(config.sources[0].retention.is_some());
        assert!(parse_older_than("10000y")
            .expect_err("too long")
            .contains("too far in the past"));
        assert_eq!(parse_older_than("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_secret_given_with_the_wrong_type_is_not_echoed() {
        let source = "[sources.s]\nscheme = \"stripe\"\n";
        let target = format!("{source}secrets = [\"x\"]\n[sources.s.forward]\n");
        for (text, key) in [
            (
                format!("{source}secrets = \"whsec_TOPSECRET1\"\n"),
                "sources.s.secrets:",
            ),
            (
                format!(
                    "{target}url = \"http://a\"\nsecret = 5\nsecret_env = \"whsec_TOPSECRET1\"\n"
                ),
                "sources.s.forward.secret:",
            ),
            (
                format!("{source}secrets = [\"x\"]\nforward = \"amqp://guest:TOPSECRET1@mq/\"\n"),
                "sources.s.forward:",
            ),
            (
                "database = \"postgres://u:TOPSECRET1@h/db\"\n".to_owned(),
                "database: invalid type: string, expected a table",
            ),
            (
                "[database]\npool_size = \"postgres://u:TOPSECRET1@h/db\"\n".to_owned(),
                "database.pool_size:",
            ),
            (
                "[server]\nlisten = [\"x\", \"TOP\\\"SECRET1\"]\n".to_owned(),
                "server.listen:",
            ),
        ] {
            let message = error(&text);
            assert!(message.starts_with(key), "{key} <- {message}");
            assert!(message.contains("invalid type"), "{message}");
            assert!(!message.contains("TOPSECRET1"), "{message}");
        }
    }

    #[test]
    fn a_secret_under_an_env_key_is_not_echoed_as_a_variable_name() {
        let stripe = "[sources.s]\nscheme = \"stripe\"\n";
        let target = format!("{stripe}secrets = [\"x\"]\n[sources.s.forward]\n");
        for (text, key) in [
            (format!("{stripe}secrets_env = \"whsec_TOPSECRET1\"\n"), "sources.s.secrets_env:"),
            (
                format!("{target}url = \"http://a\"\nsecret_env = \"whsec_TOPSECRET1\"\n"),
                "sources.s.forward.secret_env:",
            ),
            (
                format!("{target}url_env = \"amqp://guest:TOPSECRET1@mq/\"\nexchange = \"x\"\n"),
                "sources.s.forward.url_env:",
            ),
            (
                "[sources.s]\nscheme = \"adyen\"\nsecrets = [\"00\"]\nbasic_auth_env = \"u:TOPSECRET1\"\n"
                    .to_owned(),
                "sources.s.basic_auth_env:",
            ),
            (
                "[sources.s]\nscheme = \"meta\"\nsecrets = [\"x\"]\nverify_token_env = \"TOPSECRET1-tok\"\n"
                    .to_owned(),
                "sources.s.verify_token_env:",
            ),
            (
                "[sources.s]\nscheme = \"discord\"\npublic_keys_env = \"TOPSECRET1 \"\n".to_owned(),
                "sources.s.public_keys_env:",
            ),
        ] {
            let message = error(&text);
            assert!(message.starts_with(key), "{key} <- {message}");
            assert!(message.contains("not set"), "{message}");
            assert!(!message.contains("TOPSECRET1"), "{message}");
        }
        let config = Config::parse("[admin]\ntoken_env = \"tok-TOPSECRET1\"\n", &no_env)
            .expect("valid for the other commands");
        let message = config.admin_token_warning().expect("unset");
        assert!(!message.contains("TOPSECRET1"), "{message}");
        // A name written like one is shown, to say which variable to set.
        let message = error(&format!("{stripe}secrets_env = \"HOOKBOX_TEST_UNSET_1\"\n"));
        assert!(
            message.contains("HOOKBOX_TEST_UNSET_1 is not set"),
            "{message}"
        );
    }

    #[test]
    fn a_syntax_error_says_where_without_quoting_the_line() {
        let source = "[sources.s]\nscheme = \"stripe\"\n";
        for (text, at) in [
            (
                format!("{source}secrets = [\"whsec_TOPSECRET1\n"),
                "line 3, column ",
            ),
            (
                format!("{source}secrets = [whsec_TOPSECRET1]\n"),
                "line 3, column 12: sources.s.secrets: not valid TOML",
            ),
            (
                format!("{source}secrets = [\"whsec_TOPSECRET1\" \"x\"]\n"),
                "line 3, column ",
            ),
            (
                format!("{source}secrets = 'whsec_TOPSECRET1\n"),
                "line 3, column ",
            ),
            (
                format!("{source}secrets = [\"whsec_TOPSECRET1\"] trailing\n"),
                "line 3, column ",
            ),
            (
                format!("{source}secrets = [\"a\"]\nsecrets = [\"whsec_TOPSECRET1\"]\n"),
                "line 4, column 1: sources.s.secrets: not valid TOML: duplicate key",
            ),
            (
                "[database]\nurl = \"postgres://u:TOPSECRET1@h/db\nx\n".to_owned(),
                "line ",
            ),
            // A table opened twice names the table.
            (
                "[server]\nlisten = \"127.0.0.1:1\"\n[server]\nmax_body_bytes = 1\n".to_owned(),
                "line 3, column 2: [server]: not valid TOML: duplicate key",
            ),
            (
                format!("{source}secrets = [\"TOPSECRET1\"]\n[sources.s]\n"),
                "line 4, column 10: [sources.s]: not valid TOML: duplicate key",
            ),
            (
                "[sources.s.forward]\nurl = \"amqp://guest:TOPSECRET1@mq/\\q\"\n".to_owned(),
                "line 2, column ",
            ),
        ] {
            let message = error(&text);
            assert!(message.starts_with(at), "{at} <- {message}");
            assert!(message.contains("not valid TOML"), "{message}");
            assert!(!message.contains("TOPSECRET1"), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }

    #[test]
    fn secrets_and_passwords_stay_out_of_debug() {
        let config = Config::parse(
            "[database]\nurl = \"postgres://u:hunter2@h/db\"\n[sources.s]\nscheme = \"stripe\"\nsecrets = [\"whsec_topsecret\"]\n",
            &no_env,
        )
        .expect("valid");
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("topsecret") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert_eq!(config.database.display_url(), "postgres://u:***@h/db");
    }
}
