//! A load generator for hookbox's benchmarks: signed Stripe deliveries over N keep-alive
//! connections, each connection one request at a time, for a fixed time or while another
//! process runs. Prints one JSON line: requests, errors, throughput and latency percentiles.
//!
//! ```text
//! cargo run --release --example loadgen -- --to http://127.0.0.1:8080 --secret whsec_... \
//!     --connections 32 --seconds 10 [--mode fresh|replay|mixed] [--rate N] [--while-pid PID]
//! ```
//!
//! `fresh`: every request is a new event (a distinct id, ~1.5 KB, signed with a fresh
//! timestamp). `replay`: every request is one of 256 events stored first. `mixed`: of every ten
//! requests, six fresh, three replays and one with a bad signature (which must get 401).
//! `--rate N`: at most N requests a second in all, spread evenly over the connections (a
//! steady load, for the soak); without it each connection sends as fast as it is answered.
//!
//! It speaks HTTP/1.1 over plain sockets on one thread, so that as little as possible of the
//! machine goes to the client: the server under test shares the cores with it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookbox::providers::{Provider, Scheme};
use hookbox::secret::Secret;

type Verifier = std::sync::Arc<dyn Provider>;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    host: String,
    path_prefix: String,
    source: String,
    secret: String,
    connections: usize,
    seconds: u64,
    mode: String,
    rate: Option<f64>,
    while_pid: Option<u32>,
}

fn parse_args() -> Args {
    let mut to = "http://127.0.0.1:8080".to_owned();
    let mut args = Args {
        host: String::new(),
        path_prefix: String::new(),
        source: "stripe".to_owned(),
        secret: String::new(),
        connections: 32,
        seconds: 10,
        mode: "fresh".to_owned(),
        rate: None,
        while_pid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--to" => to = value,
            "--source" => args.source = value,
            "--secret" => args.secret = value,
            "--connections" => args.connections = value.parse().expect("--connections N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds N"),
            "--mode" => args.mode = value,
            "--rate" => args.rate = Some(value.parse().expect("--rate N (requests a second)")),
            "--while-pid" => args.while_pid = Some(value.parse().expect("--while-pid PID")),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(!args.secret.is_empty(), "--secret is required");
    assert!(
        matches!(args.mode.as_str(), "fresh" | "replay" | "mixed"),
        "--mode is fresh, replay or mixed"
    );
    let rest = to.strip_prefix("http://").expect("--to is an http:// URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    args.host = host.to_owned();
    args.path_prefix = path.trim_end_matches('/').to_owned();
    args
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A Stripe event of about 1.5 KB.
fn body(id: &str) -> String {
    let padding = "x".repeat(900);
    format!(
        r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":1733130000,"data":{{"object":{{"id":"pi_{id}","object":"payment_intent","amount":2000,"currency":"usd","customer":"cus_bench","description":"{padding}","metadata":{{"order_id":"101"}},"status":"succeeded"}}}},"livemode":false,"pending_webhooks":1,"request":{{"id":null,"idempotency_key":null}},"type":"payment_intent.succeeded"}}"#
    )
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) != Some("Z"))
        .unwrap_or(false)
}

/// Builds one request: a signed delivery, or one whose signature is wrong.
fn request(args: &Args, verifier: &Verifier, id: &str, forged: bool) -> Vec<u8> {
    let body = body(id);
    let path = if args.path_prefix.is_empty() {
        format!("/webhooks/{}", args.source)
    } else {
        format!("/{}/webhooks/{}", args.path_prefix, args.source)
    };
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        args.host,
        body.len()
    );
    for (name, value) in verifier.sign(body.as_bytes(), unix_now(), id, None) {
        let value = if forged {
            format!("t={},v1={}", unix_now(), "0".repeat(64))
        } else {
            value
        };
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

/// Sends one request on the connection and reads the whole answer; returns its status.
async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    buffer: &mut Vec<u8>,
) -> std::io::Result<u16> {
    stream.write_all(request).await?;
    buffer.clear();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..n]);
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head =
            std::str::from_utf8(&buffer[..end]).map_err(|_| std::io::ErrorKind::InvalidData)?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        while buffer.len() < end + 4 + length {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        return Ok(status);
    }
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    errors: u64,
}

fn main() {
    let args = Rc::new(parse_args());
    let verifier = Rc::new(
        Scheme::builtin("stripe")
            .expect("built in")
            .build(
                &[Secret::new(args.secret.clone())],
                Duration::from_secs(300),
            )
            .expect("a usable secret"),
    );
    let run = format!("{}_{}", std::process::id(), unix_now());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let replay_ids: Rc<Vec<String>> =
            Rc::new((0..256).map(|i| format!("evt_bench_replay_{run}_{i}")).collect());
        if args.mode != "fresh" {
            let mut stream = TcpStream::connect(&args.host).await.expect("connect to the server");
            let mut buffer = Vec::new();
            for id in replay_ids.iter() {
                let status = exchange(&mut stream, &request(&args, &verifier, id, false), &mut buffer)
                    .await
                    .expect("seed a replay event");
                assert!(status == 200, "seeding the replay events got {status}");
            }
        }
        let tally = Rc::new(RefCell::new(Tally::default()));
        let started = Instant::now();
        let deadline = started + Duration::from_secs(args.seconds);
        let while_pid = args.while_pid;
        let keep_going = move || match while_pid {
            Some(pid) => alive(pid) || started.elapsed() < Duration::from_millis(200),
            None => Instant::now() < deadline,
        };
        let workers: Vec<_> = (0..args.connections)
            .map(|worker| {
                let (tally, verifier, args, replay_ids, run) =
                    (tally.clone(), verifier.clone(), args.clone(), replay_ids.clone(), run.clone());
                tokio::task::spawn_local(async move {
                    let mut stream = None;
                    let mut buffer = Vec::with_capacity(4096);
                    let mut n = 0usize;
                    // Each connection's share of --rate: one request every `every` at most.
                    let every = args
                        .rate
                        .map(|rate| Duration::from_secs_f64(args.connections as f64 / rate));
                    let mut next = tokio::time::Instant::now();
                    while keep_going() {
                        if let Some(every) = every {
                            tokio::time::sleep_until(next).await;
                            // A stall is not made up with a burst.
                            next = (next + every).max(tokio::time::Instant::now());
                        }
                        let slot = (worker * 7 + n) % 10;
                        let (id, forged) = match args.mode.as_str() {
                            "replay" => (replay_ids[(worker * 7 + n) % replay_ids.len()].clone(), false),
                            "mixed" if slot < 3 => (replay_ids[(worker * 7 + n) % replay_ids.len()].clone(), false),
                            "mixed" if slot == 3 => (format!("evt_bench_forged_{run}_{worker}_{n}"), true),
                            _ => (format!("evt_bench_{run}_{worker}_{n}"), false),
                        };
                        n += 1;
                        let bytes = request(&args, &verifier, &id, forged);
                        let sent = Instant::now();
                        if stream.is_none() {
                            stream = TcpStream::connect(&args.host).await.ok();
                        }
                        let answer = match stream.as_mut() {
                            Some(s) => exchange(s, &bytes, &mut buffer).await,
                            None => Err(std::io::ErrorKind::NotConnected.into()),
                        };
                        let mut tally = tally.borrow_mut();
                        match answer {
                            Ok(status) if (forged && status == 401) || (!forged && status == 200) => {
                                tally.latencies_us.push(sent.elapsed().as_micros() as u64)
                            }
                            Ok(_) => tally.errors += 1,
                            Err(_) => {
                                tally.errors += 1;
                                stream = None;
                            }
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            let _ = worker.await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let mut tally = tally.borrow_mut();
        tally.latencies_us.sort_unstable();
        let pick = |q: f64| {
            let l = &tally.latencies_us;
            if l.is_empty() {
                0.0
            } else {
                l[((l.len() - 1) as f64 * q) as usize] as f64 / 1000.0
            }
        };
        let ok = tally.latencies_us.len();
        println!(
            "{{\"mode\":\"{}\",\"connections\":{},\"seconds\":{elapsed:.2},\"requests\":{ok},\"errors\":{},\"rps\":{:.0},\"p50_ms\":{:.2},\"p99_ms\":{:.2}}}",
            args.mode,
            args.connections,
            tally.errors,
            ok as f64 / elapsed,
            pick(0.5),
            pick(0.99)
        );
    });
}
