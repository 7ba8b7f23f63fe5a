//! Just enough W3C WebDriver to drive headless Chromium through the console: chromedriver on a
//! free port, started by the test and killed after it, spoken to over HTTP with awc.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::helpers::child_port;

/// How the W3C protocol names an element reference in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

const INSTALL: &str = "apt-get update && apt-get install -y chromium chromium-driver";

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// Where the browser tests leave their screenshots (a CI artifact).
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

/// A chromedriver process, killed when dropped, after it has closed its browsers.
pub struct Chromedriver {
    child: Child,
    port: u16,
    url: String,
    sessions: Vec<String>,
    profiles: Vec<PathBuf>,
}

impl Chromedriver {
    /// Starts chromedriver and waits until it is ready. Fails, saying how to install it, when
    /// it is not installed: a browser test that cannot run must not pass.
    pub async fn start() -> Chromedriver {
        let binary = on_path("chromedriver").unwrap_or_else(|| {
            panic!("chromedriver is not installed; the console's browser tests need it and Chromium: run `{INSTALL}` (.ci/run does)")
        });
        let port = child_port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut driver = Chromedriver {
            child,
            port,
            url: format!("http://127.0.0.1:{port}"),
            sessions: Vec::new(),
            profiles: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = driver.child.try_wait().expect("poll chromedriver") {
                panic!("chromedriver exited at once ({status})");
            }
            let ready = client()
                .get(format!("{}/status", driver.url))
                .send()
                .await
                .ok();
            if let Some(mut answer) = ready {
                let status: Value = answer.json().await.unwrap_or(Value::Null);
                if status["value"]["ready"] == true {
                    return driver;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready"
            );
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new headless Chromium with a profile of its own.
    pub async fn browser(&mut self) -> Browser {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let profile = std::env::temp_dir().join(format!(
            "hookbox-chromium-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        self.profiles.push(profile.clone());
        let mut options = json!({
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ]
        });
        if let Some(chromium) = on_path("chromium") {
            options["binary"] = json!(chromium.display().to_string());
        }
        let capabilities = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": options,
                    // No implicit wait: `find` polls, and `count` answers at once.
                    "timeouts": {"implicit": 0, "pageLoad": 20000},
                    "unhandledPromptBehavior": "ignore",
                }
            }
        });
        let created = command(
            client().post(format!("{}/session", self.url)),
            Some(capabilities),
        )
        .await
        .unwrap_or_else(|e| panic!("chromedriver could not start Chromium: {e}"));
        let id = created["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        self.sessions.push(id.clone());
        Browser {
            session: format!("{}/session/{id}", self.url),
        }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // Killing chromedriver alone would orphan its browsers, so each session is ended
        // first, also when a test failed half-way. Drop cannot await, hence plain blocking HTTP.
        for session in &self.sessions {
            end_session(self.port, session);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for profile in &self.profiles {
            let _ = std::fs::remove_dir_all(profile);
        }
    }
}

/// `DELETE /session/{id}`, blocking, for `Drop`. Ending a session that already ended is
/// harmless, so the answer is not read beyond its arrival.
fn end_session(port: u16, session: &str) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!(
        "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_ok() {
        let _ = stream.read(&mut [0u8; 1024]);
    }
}

fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(Duration::from_secs(60))
        .finish()
}

/// Sends one WebDriver command: its `value`, or the W3C error as `error: message`.
async fn command(request: awc::ClientRequest, body: Option<Value>) -> Result<Value, String> {
    let sent = match body {
        Some(body) => request.send_json(&body).await,
        None => request.send().await,
    };
    let mut answer = sent.map_err(|e| format!("no answer from chromedriver: {e}"))?;
    let status = answer.status();
    let reply: Value = answer
        .json()
        .limit(64 * 1024 * 1024)
        .await
        .map_err(|e| format!("chromedriver's answer is not JSON: {e}"))?;
    if status.is_success() {
        Ok(reply["value"].clone())
    } else {
        Err(format!(
            "{}: {}",
            reply["value"]["error"].as_str().unwrap_or("error"),
            reply["value"]["message"].as_str().unwrap_or("")
        ))
    }
}

/// An element on the current page.
pub struct Element(String);

/// One browser session.
pub struct Browser {
    session: String,
}

impl Browser {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.session);
        let request = match method {
            "GET" => client().get(url),
            "DELETE" => client().delete(url),
            _ => client().post(url),
        };
        command(request, body).await
    }

    async fn must(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    /// Navigates to `url` and waits for it to load.
    pub async fn go(&self, url: &str) {
        self.must("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// The current page's URL.
    pub async fn url(&self) -> String {
        self.must("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// The first element matching `css`, polled for up to 5 seconds.
    pub async fn find(&self, css: &str) -> Element {
        let deadline = Instant::now() + Duration::from_secs(5);
        let query = json!({"using": "css selector", "value": css});
        loop {
            match self.call("POST", "/element", Some(query.clone())).await {
                Ok(found) => {
                    let id = found[ELEMENT_KEY].as_str().expect("an element id");
                    return Element(id.to_owned());
                }
                Err(e) if Instant::now() >= deadline => {
                    panic!("no element {css} on {} ({e})", self.url().await)
                }
                Err(_) => actix_web::rt::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// How many elements match `css` now.
    pub async fn count(&self, css: &str) -> usize {
        self.must(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )
        .await
        .as_array()
        .map_or(0, Vec::len)
    }

    /// Clicks `element` (a link or a submit button waits for the next page).
    pub async fn click(&self, element: &Element) {
        self.must(
            "POST",
            &format!("/element/{}/click", element.0),
            Some(json!({})),
        )
        .await;
    }

    /// Types `text` into `element`.
    pub async fn type_into(&self, element: &Element, text: &str) {
        self.must(
            "POST",
            &format!("/element/{}/value", element.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// The element's rendered text.
    pub async fn text(&self, element: &Element) -> String {
        self.must("GET", &format!("/element/{}/text", element.0), None)
            .await
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// The text of the first element matching `css`.
    pub async fn text_of(&self, css: &str) -> String {
        let element = self.find(css).await;
        self.text(&element).await
    }

    /// The text of an open `alert`, `confirm` or `prompt`, if one is open.
    pub async fn alert_text(&self) -> Option<String> {
        match self.call("GET", "/alert/text", None).await {
            Ok(text) => Some(text.as_str().unwrap_or("").to_owned()),
            Err(e) if e.starts_with("no such alert") => None,
            Err(e) => panic!("WebDriver get alert text: {e}"),
        }
    }

    /// Saves a PNG of the whole page as `target/console-screenshots/{name}.png`: the window is
    /// made as tall as the page first.
    pub async fn screenshot(&self, name: &str) {
        let height = self
            .must(
                "POST",
                "/execute/sync",
                Some(json!({
                    "script": "return document.documentElement.scrollHeight",
                    "args": []
                })),
            )
            .await
            .as_u64()
            .unwrap_or(1000)
            .clamp(600, 6000);
        self.must(
            "POST",
            "/window/rect",
            Some(json!({"width": 1280, "height": height + 140})),
        )
        .await;
        let png = self.must("GET", "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 PNG"))
            .expect("the screenshot is base64");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("create the screenshot directory");
        std::fs::write(dir.join(format!("{name}.png")), bytes).expect("write the screenshot");
    }

    /// Ends the session, closing the browser.
    pub async fn close(self) {
        let _ = self.call("DELETE", "", None).await;
    }
}
