//! A TCP proxy between hookbox and PostgreSQL that the test can cut, stall and restore.
//!
//! Cut: every open connection is closed and new ones are closed as soon as they arrive, which
//! is what hookbox sees when the database goes away. Stall: no byte (and no close) gets through
//! in either direction, but every socket stays open and new connections are accepted, which is
//! what a frozen database host or a black-holed network looks like from both ends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let stalled = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        thread::spawn({
            let (cut, stalled, open) = (cut.clone(), stalled.clone(), open.clone());
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
                    pipe(&client, &server, stalled.clone());
                    pipe(&server, &client, stalled.clone());
                }
            }
        });
        Proxy {
            port,
            cut,
            stalled,
            open,
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

    /// The database is back: new connections go through, and a stall ends (what was held back
    /// is delivered).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
    }
}

/// Blocks while the proxy is stalled.
fn hold(stalled: &AtomicBool) {
    while stalled.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(10));
    }
}

fn pipe(from: &TcpStream, to: &TcpStream, stalled: Arc<AtomicBool>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    hold(&stalled);
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        // A close seen during a stall is held back too.
        hold(&stalled);
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
