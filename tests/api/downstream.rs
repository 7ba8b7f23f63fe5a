//! A downstream application for the forward tests: a real HTTP server that records every
//! request, answers as the test says, and counts deliveries of one key that overlap in time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

/// One request the downstream received.
#[derive(Clone, Debug)]
pub struct Received {
    pub at: Instant,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// What to answer: a status, after a delay.
pub type Behaviour = dyn Fn(&str, usize) -> (u16, Duration) + Send + Sync;

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    in_flight: Mutex<HashMap<String, usize>>,
    overlaps: AtomicUsize,
    /// Requests being answered now, whatever their key, and the most there ever were.
    answering: AtomicUsize,
    most_answering: AtomicUsize,
    /// A `Retry-After` value sent with every 429 and 5xx answer, if set.
    retry_after: Mutex<Option<String>>,
}

pub struct Downstream {
    pub url: String,
    shared: Arc<Shared>,
    behaviour: Arc<Mutex<Arc<Behaviour>>>,
}

async fn receive(
    request: HttpRequest,
    body: web::Bytes,
    shared: web::Data<Arc<Shared>>,
    behaviour: web::Data<Arc<Mutex<Arc<Behaviour>>>>,
) -> HttpResponse {
    let headers: HashMap<String, String> = request
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let now_answering = shared.answering.fetch_add(1, Ordering::SeqCst) + 1;
    shared
        .most_answering
        .fetch_max(now_answering, Ordering::SeqCst);
    let key = headers.get("idempotency-key").cloned().unwrap_or_default();
    let seen_for_key = shared
        .received
        .lock()
        .expect("lock")
        .iter()
        .filter(|r| r.header("idempotency-key") == key)
        .count();
    {
        let mut in_flight = shared.in_flight.lock().expect("lock");
        let n = in_flight.entry(key.clone()).or_default();
        if *n > 0 {
            shared.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        *n += 1;
    }
    let behave = behaviour.lock().expect("lock").clone();
    let (status, delay) = behave(&key, seen_for_key);
    let at = Instant::now();
    if !delay.is_zero() {
        actix_web::rt::time::sleep(delay).await;
    }
    *shared
        .in_flight
        .lock()
        .expect("lock")
        .entry(key)
        .or_default() -= 1;
    shared.received.lock().expect("lock").push(Received {
        at,
        headers,
        body: body.to_vec(),
        status,
    });
    shared.answering.fetch_sub(1, Ordering::SeqCst);
    let mut answer =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).expect("status"));
    if status == 429 || status >= 500 {
        if let Some(value) = shared.retry_after.lock().expect("lock").clone() {
            answer.insert_header(("Retry-After", value));
        }
    }
    answer.finish()
}

impl Downstream {
    /// Starts answering with `behaviour(key, earlier requests with that key)`.
    pub fn start(
        behaviour: impl Fn(&str, usize) -> (u16, Duration) + Send + Sync + 'static,
    ) -> Downstream {
        let shared = Arc::new(Shared::default());
        let behaviour: Arc<Mutex<Arc<Behaviour>>> = Arc::new(Mutex::new(Arc::new(behaviour)));
        let server = HttpServer::new({
            let (shared, behaviour) = (shared.clone(), behaviour.clone());
            move || {
                App::new()
                    .app_data(web::Data::new(shared.clone()))
                    .app_data(web::Data::new(behaviour.clone()))
                    .default_service(web::to(receive))
            }
        })
        .workers(2)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind the downstream");
        let port = server.addrs()[0].port();
        actix_web::rt::spawn(server.run());
        Downstream {
            url: format!("http://127.0.0.1:{port}/hooks"),
            shared,
            behaviour,
        }
    }

    /// Changes how it answers from now on.
    pub fn behave(
        &self,
        behaviour: impl Fn(&str, usize) -> (u16, Duration) + Send + Sync + 'static,
    ) {
        *self.behaviour.lock().expect("lock") = Arc::new(behaviour);
    }

    /// Sends `Retry-After: value` with every 429 and 5xx answer from now on.
    pub fn retry_after(&self, value: &str) {
        *self.shared.retry_after.lock().expect("lock") = Some(value.to_owned());
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().expect("lock").clone()
    }

    pub fn for_key(&self, key: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.header("idempotency-key") == key)
            .collect()
    }

    /// Whether an attempt numbered 1 of `key` was answered 200: what the first attempt after a
    /// re-queue (which starts the count afresh) looks like once it gets through.
    pub fn first_attempt_succeeded(&self, key: &str) -> bool {
        self.for_key(key)
            .iter()
            .any(|r| r.status == 200 && r.header("x-hookbox-attempt") == "1")
    }

    /// The requests (of any key) it is answering now.
    pub fn answering(&self) -> usize {
        self.shared.answering.load(Ordering::SeqCst)
    }

    /// The most requests (of any key) it was ever answering at once.
    pub fn most_in_flight(&self) -> usize {
        self.shared.most_answering.load(Ordering::SeqCst)
    }

    /// Requests of one key that arrived while another of the same key was still being answered.
    pub fn overlaps(&self) -> usize {
        self.shared.overlaps.load(Ordering::SeqCst)
    }
}

pub fn always(status: u16) -> impl Fn(&str, usize) -> (u16, Duration) + Send + Sync {
    move |_, _| (status, Duration::ZERO)
}
