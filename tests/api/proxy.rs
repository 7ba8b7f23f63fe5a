//! A TCP proxy between hookbox and PostgreSQL that the test can cut and restore: while cut,
//! every open connection is closed and new ones are closed as soon as they arrive, which is
//! what hookbox sees when the database goes away.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        thread::spawn({
            let (cut, open) = (cut.clone(), open.clone());
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
                    pipe(&client, &server);
                    pipe(&server, &client);
                }
            }
        });
        Proxy { port, cut, open }
    }

    /// The database goes away: open connections are closed, new ones refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for stream in self.open.lock().expect("proxy lock").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// The database is back.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
