//! A fast local downstream for `bench/forward.sh`: answers every forwarded delivery `200` with
//! an empty body at once, over keep-alive connections, and counts what arrived.
//!
//! ```text
//! cargo run --release --example sink -- --listen 127.0.0.1:9000
//! curl -s http://127.0.0.1:9000/stats    # what arrived since the last reset, as one JSON line
//! curl -s http://127.0.0.1:9000/reset    # start counting afresh
//! ```
//!
//! A request whose path starts with `/hold` is never answered (its connection is held open
//! until hookbox gives up on it): a target there keeps hookbox's attempts in flight and its
//! dispatcher idle, so the claim's own cost shows.
//!
//! A delivery is any other request but `GET /stats` and `GET /reset`. It is counted once per
//! (`X-Hookbox-Event-Id`, `X-Hookbox-Target`): `distinct` counts those pairs, `received` every
//! request (the difference is what was sent twice). Where the event id ends in `_t<micros>`
//! (the load generator's `--stamp-ids`: the Unix time in microseconds when the delivery was
//! sent to hookbox), the first arrival of each pair adds a lag sample, from that send to this
//! arrival: an upper bound of hookbox's commit-to-delivered lag by the ingest request's own
//! latency. `/stats` gives the samples' p50, p99 and max, and `last_arrival` (Unix seconds) of
//! the last new pair, where a drain ends.
//!
//! One thread, plain sockets and HTTP/1.1 with `Content-Length` bodies (what hookbox sends), so
//! that little of the machine goes to the sink: the server under test shares the cores.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counts {
    received: u64,
    pairs: HashSet<(String, String)>,
    lags_us: Vec<u64>,
    last_arrival_us: u64,
}

impl Counts {
    fn stats(&mut self) -> String {
        self.lags_us.sort_unstable();
        let pick = |q: f64| {
            let l = &self.lags_us;
            if l.is_empty() {
                0.0
            } else {
                l[((l.len() - 1) as f64 * q) as usize] as f64 / 1000.0
            }
        };
        format!(
            "{{\"received\":{},\"distinct\":{},\"lag_samples\":{},\"lag_p50_ms\":{:.2},\"lag_p99_ms\":{:.2},\"lag_max_ms\":{:.2},\"last_arrival\":{:.6}}}",
            self.received,
            self.pairs.len(),
            self.lags_us.len(),
            pick(0.5),
            pick(0.99),
            pick(1.0),
            self.last_arrival_us as f64 / 1e6
        )
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The value of header `name` (lowercase) in the request head `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The send time stamped on an event id (`..._t<micros>`), if any.
fn stamp(event_id: &str) -> Option<u64> {
    event_id.rsplit_once("_t")?.1.parse().ok()
}

/// Serves one connection's requests, one at a time, until it closes.
async fn serve(mut stream: TcpStream, counts: Rc<RefCell<Counts>>) -> std::io::Result<()> {
    let mut buffer: Vec<u8> = Vec::with_capacity(8192);
    let mut chunk = [0u8; 16384];
    loop {
        let end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        let head = std::str::from_utf8(&buffer[..end])
            .map_err(|_| std::io::ErrorKind::InvalidData)?
            .to_owned();
        let length: usize = header(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        buffer.drain(..end + 4 + length);

        let request_line = head.lines().next().unwrap_or("");
        let answer = if request_line.starts_with("GET /stats ") {
            let body = counts.borrow_mut().stats();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        } else if request_line
            .split(' ')
            .nth(1)
            .is_some_and(|p| p.starts_with("/hold"))
        {
            std::future::pending::<()>().await;
            unreachable!("a held request is never answered")
        } else if request_line.starts_with("GET /reset ") {
            *counts.borrow_mut() = Counts::default();
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned()
        } else {
            let now = unix_micros();
            let event_id = header(&head, "x-hookbox-event-id").unwrap_or("").to_owned();
            let target = header(&head, "x-hookbox-target").unwrap_or("").to_owned();
            let mut counts = counts.borrow_mut();
            counts.received += 1;
            let sent = stamp(&event_id);
            if counts.pairs.insert((event_id, target)) {
                counts.last_arrival_us = now;
                if let Some(sent) = sent {
                    counts.lags_us.push(now.saturating_sub(sent));
                }
            }
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_owned()
        };
        stream.write_all(answer.as_bytes()).await?;
    }
}

fn main() {
    let mut listen = "127.0.0.1:9000".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--listen", Some(address)) => listen = address,
            (flag, _) => {
                let help = matches!(flag, "--help" | "-h");
                eprintln!(
                    "usage: sink [--listen ADDRESS]  (default 127.0.0.1:9000)\n\
                     A fast local HTTP sink for the benchmarks: answers every request 200 at \
                     once and counts them."
                );
                std::process::exit(if help { 0 } else { 2 });
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::bind(&listen)
            .await
            .unwrap_or_else(|e| panic!("bind {listen}: {e}"));
        let counts = Rc::new(RefCell::new(Counts::default()));
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::task::spawn_local(serve(stream, counts.clone()));
        }
    });
}
