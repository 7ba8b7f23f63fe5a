//! A TCP proxy between hookbox and PostgreSQL that the test can cut, stall and restore.
//!
//! Cut: every open connection is closed and new ones are closed as soon as they arrive, which
//! is what hookbox sees when the database goes away. Stall: no byte (and no close) gets through
//! in either direction, but every socket stays open and new connections are accepted, which is
//! what a frozen database host or a black-holed network looks like from both ends. Delay: every
//! chunk of bytes is passed on that long after it arrived, each way (a database far away).
//! Forget: the connections open now go silent for good, unclosed, while new ones go through (a
//! NAT or a firewall that dropped its state for them: a half-open connection at both ends).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    /// Each way, in microseconds.
    delay: Arc<AtomicU64>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    /// How many connections were accepted; those numbered below `forgotten` are forgotten.
    accepted: Arc<AtomicU64>,
    forgotten: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let delay = Arc::new(AtomicU64::new(0));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (accepted, forgotten) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        thread::spawn({
            let (cut, stalled, delay, open, accepted, forgotten) = (
                cut.clone(),
                stalled.clone(),
                delay.clone(),
                open.clone(),
                accepted.clone(),
                forgotten.clone(),
            );
            move || {
                for client in listener.incoming().map_while(Result::ok) {
                    if cut.load(Ordering::SeqCst) {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        continue;
                    };
                    let mut tracked = open.lock().expect("proxy lock");
                    for stream in [&client, &server] {
                        if let Ok(clone) = stream.try_clone() {
                            tracked.push(clone);
                        }
                    }
                    drop(tracked);
                    let held = Held {
                        stalled: stalled.clone(),
                        forgotten: forgotten.clone(),
                        number: accepted.fetch_add(1, Ordering::SeqCst),
                    };
                    pipe(&client, &server, held.clone(), delay.clone());
                    pipe(&server, &client, held, delay.clone());
                }
            }
        });
        Proxy {
            port,
            cut,
            stalled,
            delay,
            open,
            accepted,
            forgotten,
        }
    }

    /// A proxy in front of the server of `db_url` (a postgres URL), and that URL through it.
    pub fn in_front_of(db_url: &str) -> (Proxy, String) {
        let upstream = crate::helpers::host_port(db_url);
        let proxy = Proxy::start(upstream.clone());
        let url = proxy.url_for(db_url, &upstream);
        (proxy, url)
    }

    /// `url` (a postgres URL naming `upstream`) rewritten to go through this proxy.
    pub fn url_for(&self, url: &str, upstream: &str) -> String {
        url.replacen(upstream, &format!("127.0.0.1:{}", self.port), 1)
    }

    /// The database goes away: open connections are closed, new ones refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for stream in self.open.lock().expect("proxy lock").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Nothing gets through any more, but nothing is closed either.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }

    /// From now on, every byte takes `each_way` longer to get through, in either direction.
    pub fn delay(&self, each_way: Duration) {
        let micros = u64::try_from(each_way.as_micros()).expect("a short delay");
        self.delay.store(micros, Ordering::SeqCst);
    }

    /// The connections open now are forgotten: nothing gets through them again, and nothing
    /// closes them; new connections go through as before.
    pub fn forget_open(&self) {
        self.forgotten
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// The database is back: new connections go through, and a stall ends (what was held back
    /// is delivered).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
    }
}

/// What holds one direction of a connection back: a stall (while it lasts), or the proxy
/// forgetting the connection (for good).
#[derive(Clone)]
struct Held {
    stalled: Arc<AtomicBool>,
    forgotten: Arc<AtomicU64>,
    /// The connection's number, in the order they were accepted.
    number: u64,
}

impl Held {
    /// Blocks while the proxy is stalled, and for ever once it forgot this connection.
    fn hold(&self) {
        while self.stalled.load(Ordering::SeqCst)
            || self.number < self.forgotten.load(Ordering::SeqCst)
        {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Passes what `from` sends on to `to`: a thread reads and notes when each chunk arrived, and
/// another writes it on once the delay has passed since then (so chunks keep their order and
/// their spacing) and nothing holds it.
fn pipe(from: &TcpStream, to: &TcpStream, held: Held, delay: Arc<AtomicU64>) {
    let (Ok(from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (chunks, arrived) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let reader = from.try_clone();
    thread::spawn(move || {
        let Ok(mut reader) = reader else {
            return;
        };
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let due = Instant::now() + Duration::from_micros(delay.load(Ordering::SeqCst));
                    if chunks.send((due, buffer[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        for (due, chunk) in arrived {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            held.hold();
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        // A close seen during a stall is held back too.
        held.hold();
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
