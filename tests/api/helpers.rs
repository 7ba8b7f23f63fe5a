//! The test harness: a fresh database per test, the real server on a real port, and signed
//! deliveries sent over real connections.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use hookbox::config::Config;
use hookbox::db::Store;
use hookbox::forward::Outbox;
use hookbox::providers::Registry;
use hookbox::AnyConnection;
use hookbox::{Application, Handlers};

/// The admin token the test config enables the admin API with.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Whether the suite runs against the embedded SQLite store (`HOOKBOX_TEST_STORE=sqlite`)
/// rather than PostgreSQL (the default, `HOOKBOX_TEST_STORE=postgres`).
pub fn store_is_sqlite() -> bool {
    match std::env::var("HOOKBOX_TEST_STORE").as_deref() {
        Ok("sqlite") => true,
        Ok("postgres") | Err(_) => false,
        Ok(other) => panic!("HOOKBOX_TEST_STORE={other:?}: set it to postgres or sqlite"),
    }
}

/// For a test of something only PostgreSQL has (its server restarted, its TCP connection cut,
/// its catalog): true, with a line saying why, when the suite runs on SQLite.
pub fn skip_on_sqlite(test: &str, why: &str) -> bool {
    if store_is_sqlite() {
        eprintln!("{test}: skipped on SQLite: {why}");
    }
    store_is_sqlite()
}

/// A port on 127.0.0.1 to hand to a process the test starts (a PostgreSQL cluster,
/// chromedriver, a nats-server), or to name where nothing listens: free when this returns.
///
/// Not from `bind(":0")`: the kernel takes those from its ephemeral range (32768 and up here),
/// where any outgoing connection of the run may be given the same port between the moment the
/// test lets go of it and the moment its process binds it. These come from 20000-32767, below
/// that range, which only explicit binds use; each call in this process starts past the last.
pub fn child_port() -> u16 {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_768;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Apart from another test binary's run, and from the benchmark scripts' own ports.
    let start = std::process::id().wrapping_mul(7_919) % COUNT;
    for _ in 0..COUNT {
        let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % COUNT;
        let port = u16::try_from(port).expect("below 32768");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {FIRST}-{}", FIRST + COUNT - 1)
}

/// A connection to the test database at `url`, of either store.
pub fn connect_url(url: &str) -> AnyConnection {
    match Store::parse(url).expect("a test database URL") {
        Store::Postgres(url) => AnyConnection::Postgres(
            PgConnection::establish(&url).expect("connect to the test database"),
        ),
        Store::SqliteFile(path) => AnyConnection::Sqlite(
            hookbox::db::sqlite::connect(&path, Duration::from_secs(10))
                .expect("open the test database"),
        ),
        Store::SqliteMemory => panic!("an in-memory store cannot be reached from a test"),
    }
}

/// The PostgreSQL server the tests create their databases on: `DATABASE_URL` (any database on
/// it), or the local default.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// `host:port` of a postgres URL (for the outage proxy).
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    }
}

fn connect_server() -> PgConnection {
    let url = server_url();
    PgConnection::establish(&url).unwrap_or_else(|e| {
        panic!(
            "cannot reach PostgreSQL at {url} ({e}): start it, or point DATABASE_URL at one (see README.md, Test it)"
        )
    })
}

/// A database of its own for one test, dropped (with any connections left) when it goes: a
/// PostgreSQL database, or on SQLite a file in the temporary directory.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub sqlite_file: Option<std::path::PathBuf>,
}

impl TestDb {
    pub fn create() -> TestDb {
        TestDb::create_on(store_is_sqlite())
    }

    /// A database of its own on the store named, whatever `HOOKBOX_TEST_STORE` says: for a test
    /// that moves events from one store to the other.
    pub fn create_on(sqlite: bool) -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .subsec_nanos();
        let name = format!(
            "hookbox_test_{}_{}_{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        if sqlite {
            let dir = std::env::temp_dir().join("hookbox-tests");
            std::fs::create_dir_all(&dir).expect("a directory for the test databases");
            let file = dir.join(format!("{name}.db"));
            return TestDb {
                url: format!("sqlite://{}", file.display()),
                name,
                sqlite_file: Some(file),
            };
        }
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut connect_server())
            .expect("create the test database");
        TestDb {
            url: with_database(&server_url(), &name),
            name,
            sqlite_file: None,
        }
    }

    pub fn connect(&self) -> AnyConnection {
        connect_url(&self.url)
    }

    /// `SELECT count(*) FROM {sql}`.
    pub fn count(&self, sql: &str) -> i64 {
        count_at(&self.url, sql)
    }
}

/// `SELECT count(*) FROM {sql}` in the database at `url`, on a connection of its own.
pub fn count_at(url: &str, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = connect_url(url);
    diesel::sql_query(format!("SELECT count(*) AS n FROM {sql}"))
        .get_result::<Count>(&mut conn)
        .expect("count query")
        .n
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(file) = &self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let mut path = file.clone().into_os_string();
                path.push(suffix);
                let _ = std::fs::remove_file(path);
            }
            // The lock files of the dispatchers that ran on it (`<file>-hookbox-<id>.lock`).
            let locks = format!("{}-hookbox-", file.display());
            if let Some(Ok(entries)) = file.parent().map(std::fs::read_dir) {
                for entry in entries.flatten() {
                    if entry.path().display().to_string().starts_with(&locks) {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
            return;
        }
        let _ = diesel::sql_query(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut connect_server());
    }
}

/// The test configuration: one source of every scheme, the secrets of the published vectors.
pub fn config_text(database_url: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
in_flight_wait = "3s"
max_body_bytes = 65536

[database]
url = "{database_url}"
pool_size = 4

[admin]
token_env = "TEST_ADMIN_TOKEN"

[sources.stripe]
scheme = "stripe"
secrets = ["whsec_old_rotated_out", "whsec_test_secret"]

[sources.standard]
scheme = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]

[sources.github]
scheme = "github"
secrets = ["It's a Secret to Everybody"]

[sources.shopify]
scheme = "shopify"
secrets = ["hush"]

[sources.slack]
scheme = "slack"
secrets = ["8f742231b10e8888abcd99yyyzzz85a5"]

[sources.acme]
scheme = "hmac-sha256"
secrets = ["acme-secret"]
signature_header = "X-Acme-Signature"
signature_prefix = "sha256="
encoding = "hex"
event_id = "header:X-Acme-Event-Id"
event_type = "json:/type"

[sources.acmejson]
scheme = "hmac-sha256"
secrets = ["acme-json-secret"]
signature_header = "X-Acme-Signature"
encoding = "base64"
event_id = "json:/id"
{extra}
"#
    )
}

pub fn test_env(name: &str) -> Option<String> {
    (name == "TEST_ADMIN_TOKEN").then(|| ADMIN_TOKEN.to_owned())
}

pub fn parse_config(text: &str) -> Config {
    Config::parse(text, &test_env).expect("the test config is valid")
}

/// [`parse_config`], with the schemes of `registry`.
pub fn parse_config_with(text: &str, registry: &Registry) -> Config {
    Config::parse_with(text, &test_env, registry).expect("the test config is valid")
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// A server under test, in this process.
pub struct TestApp {
    pub address: String,
    pub config: Config,
    pub db: TestDb,
    /// The forward outbox, when a source forwards: see [`TestApp::forward_pass`].
    outbox: Option<Outbox>,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        TestApp::spawn_with("", Handlers::default()).await
    }

    /// A server with `extra` appended to the config and the given handlers.
    pub async fn spawn_with(extra: &str, handlers: Handlers) -> TestApp {
        let db = TestDb::create();
        let config = parse_config(&config_text(&db.url, extra));
        TestApp::spawn_on(db, config, handlers).await
    }

    /// A server whose config may name the schemes of `registry` (providers of a test's own).
    pub async fn spawn_with_providers(extra: &str, registry: &Registry) -> TestApp {
        let db = TestDb::create();
        let config = parse_config_with(&config_text(&db.url, extra), registry);
        TestApp::spawn_on(db, config, Handlers::default()).await
    }

    pub async fn spawn_on(db: TestDb, config: Config, handlers: Handlers) -> TestApp {
        let (address, outbox) = serve_with_outbox(config.clone(), handlers);
        TestApp {
            address,
            config,
            db,
            outbox,
        }
    }

    /// Runs one forward dispatcher pass beside the server's own: sends what is due now, waits
    /// for the attempts to be recorded, and returns how many were sent.
    pub async fn forward_pass(&self) -> usize {
        self.outbox
            .as_ref()
            .expect("a source of this server forwards")
            .pass()
            .await
    }

    /// A delivery for `source`, signed with the source's first secret at the current time.
    pub fn delivery(&self, source: &str, body: &str, event_id: &str) -> Delivery {
        delivery_for(&self.config, source, body, event_id, unix_now())
    }

    pub async fn send(&self, delivery: &Delivery) -> Answer {
        send(&self.address, delivery).await
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        get(&self.address, path, token).await
    }
}

/// Starts a server in this process and returns its address. It runs until the test ends; its
/// database is the caller's to keep.
pub fn serve_in_process(config: Config, handlers: Handlers) -> String {
    serve_with_outbox(config, handlers).0
}

/// [`serve_in_process`], with the server's forward outbox when a source forwards.
fn serve_with_outbox(config: Config, handlers: Handlers) -> (String, Option<Outbox>) {
    let app = Application::build(config, handlers).expect("the server builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let outbox = app.outbox();
    actix_web::rt::spawn(app.run_until_stopped());
    (address, outbox)
}

/// Signs `body` for `source` at `timestamp`.
/// The source of `config` named `name`.
pub fn source_named<'a>(config: &'a Config, name: &str) -> &'a hookbox::config::SourceConfig {
    config
        .sources
        .iter()
        .find(|s| s.name.as_str() == name)
        .unwrap_or_else(|| panic!("no source {name} in the test config"))
}

pub fn delivery_for(
    config: &Config,
    source: &str,
    body: &str,
    event_id: &str,
    timestamp: i64,
) -> Delivery {
    delivery_of_bytes(config, source, body.as_bytes(), event_id, timestamp)
}

/// Signs raw `body` bytes (which need not be UTF-8) for `source` at `timestamp`.
pub fn delivery_of_bytes(
    config: &Config,
    source: &str,
    body: &[u8],
    event_id: &str,
    timestamp: i64,
) -> Delivery {
    let source_config = source_named(config, source);
    // The last secret is the current one (the test stripe source has a rotated-out first).
    let current = &source_config.secrets[source_config.secrets.len() - 1..];
    let verifier = source_config
        .scheme
        .build(current, source_config.tolerance)
        .expect("test secrets are valid");
    let mut headers = verifier.sign(body, timestamp, event_id, Some("test.event"));
    headers.push(("Content-Type".to_owned(), "application/json".to_owned()));
    Delivery {
        source: source.to_owned(),
        headers,
        body: body.to_vec(),
    }
}

/// A request to `POST /webhooks/{source}`.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub source: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Delivery {
    /// Replaces (or adds) a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Delivery {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn without_header(mut self, name: &str) -> Delivery {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    pub fn header(&self, name: &str) -> &str {
        &self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("the delivery has no {name} header"))
            .1
    }
}

/// An HTTP answer, read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The contract's error code in the body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }

    /// The one sentence of an error body.
    pub fn message(&self) -> String {
        self.json()["message"].as_str().unwrap_or("").to_owned()
    }

    /// The contract's error code, or `None` when the body is not the contract's JSON (an
    /// answer from the HTTP layer itself).
    pub fn code(&self) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json["error"].as_str().map(str::to_owned)
    }

    pub fn replayed(&self) -> bool {
        self.header("Idempotent-Replayed") == Some("true")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The test thread's client. Its pool has no connection limit, so requests sent together go
/// out together, each on a connection of its own (HTTP/1.1 carries one request at a time); one
/// client per thread, because building its TLS connector costs milliseconds. It keeps an idle
/// connection for 2 s, well inside the server's 5 s keep-alive: a connection idle longer may be
/// closed by the server just as a request goes out on it, which awc reports as "connector has
/// been disconnected" (a client race, not an answer of the server's).
pub fn client() -> awc::Client {
    thread_local! {
        static CLIENT: awc::Client = awc::Client::builder()
            .connector(
                awc::Connector::new()
                    .limit(0)
                    .conn_keep_alive(Duration::from_secs(2)),
            )
            .timeout(Duration::from_secs(30))
            .disable_redirects()
            .finish();
    }
    CLIENT.with(Clone::clone)
}

pub async fn read(
    response: awc::ClientResponse<
        impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
            + Unpin,
    >,
) -> Answer {
    try_read(response).await.expect("read the response body")
}

async fn try_read(
    mut response: awc::ClientResponse<
        impl futures_util::Stream<Item = Result<actix_web::web::Bytes, awc::error::PayloadError>>
            + Unpin,
    >,
) -> Result<Answer, String> {
    let body = response
        .body()
        .limit(16 * 1024 * 1024)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Answer {
        status: response.status().as_u16(),
        headers: response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
        body: body.to_vec(),
    })
}

/// Posts a delivery to `POST {address}/webhooks/{source}`.
pub async fn send(address: &str, delivery: &Delivery) -> Answer {
    try_send(address, delivery, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the server answers: {e}"))
}

/// Posts a delivery like [`send`], but a connection error or no answer within `limit` is an
/// `Err` instead of a panic: for tests where the server may be killed or stalled.
pub async fn try_send(
    address: &str,
    delivery: &Delivery,
    limit: Duration,
) -> Result<Answer, String> {
    let mut request = client()
        .post(format!("{address}/webhooks/{}", delivery.source))
        .timeout(limit);
    // Appended, not inserted: a header listed twice is sent on two lines, as a provider that
    // repeats one (Mollie) sends it; `Delivery::with_header` replaces where a test means to.
    for (name, value) in &delivery.headers {
        request = request.append_header((name.as_str(), value.as_str()));
    }
    let response = request
        .send_body(delivery.body.clone())
        .await
        .map_err(|e| e.to_string())?;
    try_read(response).await
}

/// The config `text` with `keys` (TOML lines) added to its `[server]` table.
pub fn with_server_keys(text: &str, keys: &str) -> String {
    text.replacen("[server]\n", &format!("[server]\n{keys}\n"), 1)
}

/// `POST {address}{path}` to the admin API with the test token: the status, and the body as
/// JSON (null if it is not).
pub async fn admin_post(address: &str, path: &str) -> (u16, serde_json::Value) {
    let mut response = awc::Client::new()
        .post(format!("{address}{path}"))
        .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
        .send()
        .await
        .expect("the admin API answers");
    let body = response.body().await.expect("a body");
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (response.status().as_u16(), json)
}

/// `GET {address}{path}`, with a bearer token if given.
pub async fn get(address: &str, path: &str, token: Option<&str>) -> Answer {
    let mut request = client().get(format!("{address}{path}"));
    if let Some(token) = token {
        request = request.insert_header(("Authorization", format!("Bearer {token}")));
    }
    read(request.send().await.expect("the server answers")).await
}

/// A Stripe event body, as Stripe sends it.
pub fn stripe_event(id: &str, kind: &str, pending_webhooks: u32) -> String {
    format!(
        r#"{{
  "id": "{id}",
  "object": "event",
  "api_version": "2024-06-20",
  "created": 1733130000,
  "data": {{
    "object": {{
      "id": "pi_{id}",
      "object": "payment_intent",
      "amount": 2000,
      "currency": "usd",
      "metadata": {{"order_id": "101"}},
      "status": "succeeded"
    }}
  }},
  "livemode": false,
  "pending_webhooks": {pending_webhooks},
  "request": {{"id": null, "idempotency_key": null}},
  "type": "{kind}"
}}"#
    )
}

/// A `hookbox` process started from the built binary, killed when dropped.
pub struct Process {
    pub child: Child,
    pub address: String,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
    /// The thread reading its stderr into `stderr`: joined once it has exited, so the log
    /// holds every line it wrote.
    reader: Option<std::thread::JoinHandle<()>>,
    _config_file: TempFile,
}

/// A file removed when dropped.
pub struct TempFile(pub std::path::PathBuf);

impl TempFile {
    /// A config file.
    pub fn new(contents: &str) -> TempFile {
        TempFile::with_extension(contents.as_bytes(), "toml")
    }

    /// A file of any kind: `ndjson` for a capture, `json` for a body.
    pub fn with_extension(contents: &[u8], extension: &str) -> TempFile {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "hookbox-test-{}-{}.{extension}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).expect("write the temp file");
        TempFile(path)
    }

    /// The path as text, for a command line.
    pub fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    /// The file's contents now.
    pub fn read(&self) -> String {
        std::fs::read_to_string(&self.0).expect("read the temp file")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `hookbox ARGS` to completion: (exit code, stdout, stderr).
pub fn run_hookbox(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    run_hookbox_in(args, env, None)
}

/// [`run_hookbox`] in the working directory `dir`.
pub fn run_hookbox_in(
    args: &[&str],
    env: &[(&str, &str)],
    dir: Option<&std::path::Path>,
) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hookbox"));
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("HOOKBOX_CONFIG")
        .env_remove("HOOKBOX_LISTEN")
        .envs(env.iter().copied())
        .output()
        .expect("run hookbox");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A `hookbox` command left running, whose stderr the test reads a line at a time (to see it
/// say it waits for something, then let it go on).
pub struct Watched {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Its stdout, read to its end by a thread of its own.
    stdout: std::thread::JoinHandle<String>,
    /// While held, its stdout is not read (see [`Watched::start_unread`]).
    gate: Option<std::sync::mpsc::Sender<()>>,
}

impl Watched {
    /// Starts `hookbox ARGS` with `env` (and no DATABASE_URL or HOOKBOX_CONFIG of the test's).
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Watched {
        let mut watched = Watched::start_unread(args, env);
        watched.read_stdout();
        watched
    }

    /// [`Watched::start`], its stdout left unread, as a pipe whose reader stopped reading, until
    /// [`Watched::read_stdout`].
    pub fn start_unread(args: &[&str], env: &[(&str, &str)]) -> Watched {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_hookbox"))
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("HOOKBOX_CONFIG")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hookbox starts");
        let mut out = child.stdout.take().expect("stdout is piped");
        let (gate, opened) = std::sync::mpsc::channel::<()>();
        let stdout = std::thread::spawn(move || {
            // Until the gate is dropped.
            let _ = opened.recv();
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut text);
            text
        });
        let stderr = child.stderr.take().expect("stderr is piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = send.send(line);
            }
        });
        Watched {
            child,
            lines,
            stdout,
            gate: Some(gate),
        }
    }

    /// Reads its stdout from now on, to its end.
    pub fn read_stdout(&mut self) {
        self.gate.take();
    }

    /// Waits (up to 30 s) for a line of stderr holding `text`, and returns it.
    pub fn says(&self, text: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("hookbox never said {text:?}"));
            if line.contains(text) {
                return line;
            }
        }
    }

    /// Waits for it to end, and says whether it succeeded.
    pub fn succeeded(mut self) -> bool {
        self.child.wait().expect("hookbox ends").success()
    }

    /// Waits for it to end: its exit code, the stderr lines not yet read by
    /// [`says`](Watched::says), and its stdout.
    pub fn ended(mut self) -> (Option<i32>, String, String) {
        self.read_stdout();
        let code = self.child.wait().expect("hookbox ends").code();
        let rest: Vec<String> = self.lines.iter().collect();
        let stdout = self.stdout.join().expect("the stdout reader");
        (code, rest.join("\n"), stdout)
    }
}

/// [`run_hookbox`] from an async test: on a blocking thread, so the servers the test runs on
/// its own runtime keep answering while the command waits for them.
pub async fn run_hookbox_async(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    actix_web::rt::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_hookbox(&args, &[])
    })
    .await
    .expect("the hookbox command's thread")
}

/// `hookbox export --config {config} --out <a temp .ndjson file>`, which must succeed; the
/// capture it wrote.
pub async fn export_all(config: &str) -> TempFile {
    let exported = TempFile::with_extension(b"", "ndjson");
    let (code, _, stderr) =
        run_hookbox_async(&["export", "--config", config, "--out", &exported.path()]).await;
    assert_eq!(code, 0, "{stderr}");
    exported
}

impl Process {
    /// Starts `hookbox serve` with this config and waits until it says where it listens.
    pub fn serve(config: &str) -> Process {
        Process::serve_with_env(config, &[])
    }

    /// [`Process::serve`] with more environment variables (`RUST_LOG` among them, which is
    /// `info` otherwise).
    pub fn serve_with_env(config: &str, env: &[(&str, &str)]) -> Process {
        Process::serve_in(config, env, None)
    }

    /// [`Process::serve_with_env`] in the working directory `dir` (the tests' own otherwise).
    pub fn serve_in(config: &str, env: &[(&str, &str)], dir: Option<&std::path::Path>) -> Process {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hookbox"));
        if let Some(dir) = dir {
            command.current_dir(dir);
        }
        Process::serve_by(command, config, env)
    }

    /// [`Process::serve`] from a shell that first runs `setup` (`ulimit -f 100`, say).
    pub fn serve_after(setup: &str, config: &str) -> Process {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("{setup} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_hookbox"));
        Process::serve_by(command, config, &[])
    }

    /// [`Process::serve`] through `wrapper` (a program and its arguments that runs the one
    /// after them: `setpriv --reuid=nobody ...`, say).
    pub fn serve_through(wrapper: &[&str], config: &str) -> Process {
        let mut command = Command::new(wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_hookbox"));
        Process::serve_by(command, config, &[])
    }

    /// `command` (hookbox, or what execs it) given `serve --config <config>`, started and
    /// waited for until it says where it listens.
    fn serve_by(mut command: Command, config: &str, env: &[(&str, &str)]) -> Process {
        use std::io::BufRead;
        let config_file = TempFile::new(config);
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&config_file.0)
            .env("TEST_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .env_remove("DATABASE_URL")
            .env_remove("HOOKBOX_LISTEN")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hookbox serve");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (found, address) = std::sync::mpsc::channel();
        let reader = std::thread::spawn({
            let log = log.clone();
            move || {
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    {
                        let mut log = log.lock().expect("log lock");
                        log.push_str(&line);
                        log.push('\n');
                    }
                    if let Some(at) = line.find("listening on ") {
                        let _ = found.send(line[at + "listening on ".len()..].trim().to_owned());
                    }
                }
            }
        });
        let address = address
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                let _ = child.kill();
                panic!(
                    "hookbox serve did not start listening:\n{}",
                    log.lock().expect("log lock")
                )
            });
        Process {
            child,
            address,
            stderr: log,
            reader: Some(reader),
            _config_file: config_file,
        }
    }

    /// Waits for the process to exit, at most `limit`, and for its log's last line to be read.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the process") {
                if let Some(reader) = self.reader.take() {
                    reader.join().expect("the log's reader");
                }
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "hookbox did not exit within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().expect("log lock").clone()
    }

    /// Waits until its log says `text`, at most 10 s.
    pub fn wait_for_log(&self, text: &str) {
        self.wait_for_log_within(text, Duration::from_secs(10));
    }

    /// Waits until its log says `text`, at most `limit`.
    pub fn wait_for_log_within(&self, text: &str, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        while !self.log().contains(text) {
            assert!(
                std::time::Instant::now() < deadline,
                "the log never said {text:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends it SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends it the signal named (`TERM`, `HUP`, ...).
    pub fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The header that carries each test source's signature.
pub fn signature_header(source: &str) -> &'static str {
    match source {
        "stripe" => "Stripe-Signature",
        "standard" => "webhook-signature",
        "github" => "X-Hub-Signature-256",
        "shopify" => "X-Shopify-Hmac-Sha256",
        "slack" => "X-Slack-Signature",
        "acme" | "acmejson" => "X-Acme-Signature",
        other => panic!("no test source {other}"),
    }
}

/// Every test source, one per scheme (and both id locations of the generic scheme).
pub const SOURCES: [&str; 7] = [
    "stripe", "standard", "github", "shopify", "slack", "acme", "acmejson",
];

/// A realistic body for `source` whose event id is `id` where the id travels in the body.
pub fn sample_body(source: &str, id: &str) -> String {
    match source {
        "stripe" => stripe_event(id, "payment_intent.succeeded", 1),
        "standard" => {
            r#"{"type":"invoice.paid","data":{"invoice":"in_1","amount":4200}}"#.to_owned()
        }
        "github" => {
            r#"{"action":"opened","number":7,"repository":{"full_name":"acme/app"}}"#.to_owned()
        }
        "shopify" => r#"{"id":820982911946154508,"email":"jon@example.com","total_price":"19.00"}"#
            .to_owned(),
        "slack" => format!(
            r#"{{"token":"x","team_id":"T1","api_app_id":"A1","event":{{"type":"message","text":"hi"}},"type":"event_callback","event_id":"{id}","event_time":1733130000}}"#
        ),
        "acme" => r#"{"type":"thing.happened","n":1}"#.to_owned(),
        "acmejson" => format!(r#"{{"id":"{id}","type":"thing.done"}}"#),
        other => panic!("no test source {other}"),
    }
}

/// A unique event id for this process.
pub fn unique_id(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .subsec_nanos()
    )
}

/// A stored event written straight into the table, as if claimed at `received_at`.
pub struct RawEvent {
    pub source: String,
    pub event_id: String,
    pub received_at: chrono::DateTime<chrono::Utc>,
    pub payload: Vec<u8>,
}

/// Writes `rows` into the events table of the database at `url`, with a 200 `{}` answer, in
/// multi-row INSERTs (either store).
pub fn insert_events(url: &str, rows: &[RawEvent]) {
    let mut conn = connect_url(url);
    for chunk in rows.chunks(1000) {
        hookbox::on_backend!(&mut conn, c => {
            let values: Vec<_> = chunk
                .iter()
                .map(|row| {
                    (
                        events::source.eq(&row.source),
                        events::event_id.eq(&row.event_id),
                        events::fingerprint.eq(&[0u8][..]),
                        events::received_at.eq(row.received_at),
                        events::payload.eq(&row.payload),
                        events::headers.eq(serde_json::json!({})),
                        events::response_status.eq(200i16),
                        events::response_content_type.eq("application/json"),
                        events::response_body.eq(&b"{}"[..]),
                    )
                })
                .collect();
            diesel::insert_into(events::table).values(&values).execute(c)
        })
        .expect("insert the events");
    }
}

/// A directory of its own, removed with what is in it when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(unique_id("hookbox-dir"));
        std::fs::create_dir_all(&dir).expect("make the temp directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An RSA signing key and its self-signed certificate (PEM), valid for a day either side of now:
/// what a provider that names its certificate by URL (PayPal, SNS) signs with in the tests. Made
/// at test time, never checked in.
pub struct TestKey {
    pub key_pem: String,
    pub cert_pem: String,
}

impl TestKey {
    pub fn new() -> TestKey {
        let day = 24 * 3600;
        TestKey::valid(unix_now() - day, unix_now() + day)
    }

    /// A key whose certificate is valid from `from` until `until` (unix seconds).
    pub fn valid(from: i64, until: i64) -> TestKey {
        use openssl::asn1::Asn1Time;
        use openssl::bn::BigNum;
        use openssl::hash::MessageDigest;
        use openssl::pkey::PKey;
        use openssl::rsa::Rsa;
        use openssl::x509::{X509Name, X509};

        let key = PKey::from_rsa(Rsa::generate(2048).expect("an RSA key")).expect("a key");
        let mut name = X509Name::builder().expect("a name");
        name.append_entry_by_text("CN", "hookbox test signer")
            .expect("a CN");
        let name = name.build();
        let mut cert = X509::builder().expect("a certificate");
        cert.set_version(2).expect("v3");
        let serial = BigNum::from_u32(7).and_then(|n| n.to_asn1_integer());
        cert.set_serial_number(&serial.expect("a serial"))
            .expect("serial");
        cert.set_subject_name(&name).expect("subject");
        cert.set_issuer_name(&name).expect("issuer");
        cert.set_pubkey(&key).expect("public key");
        cert.set_not_before(&Asn1Time::from_unix(from).expect("a time"))
            .expect("not before");
        cert.set_not_after(&Asn1Time::from_unix(until).expect("a time"))
            .expect("not after");
        cert.sign(&key, MessageDigest::sha256())
            .expect("self-signed");
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).expect("PEM is text");
        TestKey {
            key_pem: text(key.private_key_to_pem_pkcs8().expect("PEM")),
            cert_pem: text(cert.build().to_pem().expect("PEM")),
        }
    }
}

/// Exports `source` from the server that `config_path` configures and replays the capture into
/// `second`, each event signed again with the private key at `key_path` and naming `cert_url`
/// (the certificate schemes: PayPal, SNS). Both commands must succeed.
pub async fn export_and_replay_signed(
    config_path: &str,
    source: &str,
    second: &TestApp,
    key_path: &str,
    cert_url: &str,
) {
    let capture = TempFile::new("");
    let capture_path = capture.path();
    let (code, _, stderr) = run_hookbox_async(&[
        "export",
        "--config",
        config_path,
        "--source",
        source,
        "--out",
        capture_path.as_str(),
    ])
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = run_hookbox_async(&[
        "replay",
        capture_path.as_str(),
        "--to",
        second.address.as_str(),
        "--config",
        config_path,
        "--key",
        key_path,
        "--cert-url",
        cert_url,
    ])
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}

/// `LOCK TABLE {table} IN {mode} MODE` (PostgreSQL), held by a session of the test's own until
/// dropped.
pub struct HeldTableLock(AnyConnection);

impl HeldTableLock {
    pub fn take(url: &str, table: &str, mode: &str) -> HeldTableLock {
        use diesel::connection::SimpleConnection;
        let mut conn = connect_url(url);
        conn.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN {mode} MODE"))
            .expect("lock the table");
        HeldTableLock(conn)
    }

    /// The holding session's process id on the server.
    pub fn pid(&mut self) -> i32 {
        #[derive(QueryableByName)]
        struct Pid {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result::<Pid>(&mut self.0)
            .expect("the session's pid")
            .pid
    }
}

impl Drop for HeldTableLock {
    fn drop(&mut self) {
        use diesel::connection::SimpleConnection;
        let _ = self.0.batch_execute("ROLLBACK");
    }
}

/// Runs `hookbox ARGS` with stdout a pipe whose reader is already gone, as `| head` leaves it.
pub fn run_into_a_closed_pipe(args: &[&str]) -> (i32, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hookbox"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("HOOKBOX_CONFIG")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run hookbox");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Posts `body` to the `github` source of `app`, signed, under the delivery id `id` sent as its
/// UTF-8 bytes (which a `&str` header value cannot carry beyond ASCII). Asserts it is 200.
pub async fn send_github_as(app: &TestApp, id: &str, body: &str) {
    let signed = delivery_for(&app.config, "github", body, "placeholder", unix_now());
    let mut request = client().post(format!("{}/webhooks/github", app.address));
    for (name, value) in &signed.headers {
        let value = if name.eq_ignore_ascii_case("X-GitHub-Delivery") {
            id
        } else {
            value.as_str()
        };
        let value = awc::http::header::HeaderValue::from_bytes(value.as_bytes()).expect("bytes");
        request = request.insert_header((name.as_str(), value));
    }
    let answer = read(request.send_body(body.to_owned()).await.expect("answered")).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// libfaketime's library, which `.ci/run` installs: a test preloads it (`LD_PRELOAD`) to move
/// one process's wall clock, with `FAKETIME_DONT_FAKE_MONOTONIC=1` leaving its monotonic clock.
pub fn libfaketime() -> &'static str {
    const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "libfaketime is not installed (apt-get install libfaketime; .ci/run does)"
    );
    FAKETIME
}

/// The descriptors of this process's established TCP connections to `port` on 127.0.0.1.
fn connections_to(port: u16) -> Vec<i32> {
    // /proc/net/tcp: `sl local rem st ... inode`; state 01 is ESTABLISHED.
    let inodes: Vec<String> = std::fs::read_to_string("/proc/self/net/tcp")
        .expect("the process's TCP table")
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote = fields.get(2)?.rsplit_once(':')?.1;
            let inode = (*fields.get(9)?).to_owned();
            (u16::from_str_radix(remote, 16).ok()? == port && *fields.get(3)? == "01")
                .then_some(inode)
        })
        .collect();
    std::fs::read_dir("/proc/self/fd")
        .expect("the process's descriptors")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let link = std::fs::read_link(entry.path()).ok()?;
            let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
            let fd: i32 = entry.file_name().to_str()?.parse().ok()?;
            inodes.iter().any(|i| i == inode).then_some(fd)
        })
        .collect()
}

/// The `TCP_USER_TIMEOUT` of each of this process's established TCP connections to `port` on
/// 127.0.0.1, by descriptor.
pub fn user_timeouts_of_connections_to(port: u16) -> Vec<(i32, Option<Duration>)> {
    connections_to(port)
        .into_iter()
        .map(|fd| {
            // SAFETY: the descriptor is open (read from /proc/self/fd just now) and only
            // borrowed here, for one getsockopt.
            let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let timeout = socket2::SockRef::from(&socket)
                .tcp_user_timeout()
                .expect("getsockopt");
            (fd, timeout)
        })
        .collect()
}

/// The program and arguments that run a program as the user nobody (`setpriv`), where this
/// process is root and has setpriv: file modes bind only a user other than root. `None`
/// elsewhere (a test then says it is skipped).
pub fn as_nobody() -> Option<[&'static str; 4]> {
    let is_root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    });
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    (is_root && setpriv).then_some([
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
    ])
}

/// Sets the mode of the file or directory at `path`.
pub fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
