//! A load generator for hookbox's benchmarks: signed deliveries over N keep-alive connections,
//! each connection one request at a time, for a fixed time, a fixed number of requests, or while
//! another process runs. Prints one JSON line: requests, errors, throughput and latency
//! percentiles.
//!
//! ```text
//! cargo run --release --example loadgen -- --to http://127.0.0.1:8080 --secret whsec_... \
//!     --connections 32 --seconds 10 [--mode fresh|replay|mixed] [--rate N] [--while-pid PID]
//! cargo run --release --example loadgen -- --to http://127.0.0.1:8080 --config hookbox.toml \
//!     --source square --connections 32 --prebuilt 20000 [--serve-cert 127.0.0.1:PORT] \
//!     [--key FILE]
//! ```
//!
//! `--source NAME` without `--config` sends Stripe deliveries to `/webhooks/NAME` (a source of
//! scheme `stripe` with the secret `--secret`).
//!
//! Without `--config` it sends Stripe deliveries signed with `--secret`. With `--config FILE`
//! it signs as `--source`'s provider does, with that source's first secret, through the same
//! library code as `hookbox send` (`hookbox::replay::signing`): headers, a query on the URL, or
//! a rewritten body (Braintree's form) as the provider sends them. Bodies are about 1.5 KB:
//! Stripe, PayPal and Square events, a Braintree notification, or a Stripe-shaped event for any
//! other scheme; for Adyen, a batch of ten items (about 3 KB), each an event of its own; for
//! SendGrid, a batch of one event (about 1.5 KB), so its row weighs the ECDSA check against
//! Stripe's HMAC one delivery for one; for GoCardless, a batch of one event too, the same claim
//! path as SendGrid's with an HMAC, so the two rows set the ECDSA check apart from the batch.
//!
//! `--serve-cert ADDR` (PayPal): makes an RSA key and a self-signed certificate for this run,
//! serves the certificate on `http://ADDR/certs/bench-<run>.pem`, and signs with that key and
//! URL; the source's `cert_urls` must allow `http://ADDR/certs/`.
//!
//! `--key FILE`: the PEM private key a scheme that signs with one takes (`sendgrid`: P-256;
//! `standard` with `public_keys`: Ed25519, signed as `v1a`), as `hookbox send --key` does; the
//! source's `public_keys` must hold its public half.
//!
//! `fresh`: every request is a new event (a distinct id, signed with a fresh timestamp).
//! `replay`: every request is one of 256 events stored first. `mixed`: of every ten requests,
//! six fresh, three replays and one with a bad signature (which must get 401).
//! `--rate N`: at most N requests a second in all, spread evenly over the connections (a
//! steady load, for the soak); without it each connection sends as fast as it is answered.
//! `--stamp-ids` (fresh only): each event id ends in `_t<micros>`, the Unix time in
//! microseconds when the request was built, just before it is sent; `bench/sink.rs` reads it
//! back from a forwarded delivery's `X-Hookbox-Event-Id` to measure the forward lag.
//! `--prebuilt N` (fresh only): builds and signs N fresh requests before the clock starts and
//! sends each once, so that a signature costly to make (PayPal's RSA) is not paid for on the
//! cores the server shares; the run ends when all N are answered.
//!
//! It speaks HTTP/1.1 over plain sockets on one thread, so that as little as possible of the
//! machine goes to the client: the server under test shares the cores with it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::collections::VecDeque;
use std::path::Path;

use hookbox::config::{Config, ProcessEnv};
use hookbox::providers::{Scheme, Signing};
use hookbox::replay::signing::{self, Verifier};
use hookbox::replay::Signer;
use hookbox::secret::Secret;
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::rsa::Rsa;
use openssl::x509::{X509Name, X509};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
    config: Option<String>,
    serve_cert: Option<String>,
    prebuilt: Option<usize>,
    stamp_ids: bool,
    key: Option<String>,
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
        config: None,
        serve_cert: None,
        prebuilt: None,
        stamp_ids: false,
        key: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            eprintln!(
                "usage: loadgen --secret S | --config FILE [--to URL] [--source NAME] \
                 [--connections N] [--seconds N] [--mode MODE] [--rate N] [--while-pid PID] \
                 [--serve-cert ADDR] [--prebuilt N] [--key PEM] [--stamp-ids]\n\
                 The benchmarks' load generator: bench/*.sh show its uses."
            );
            std::process::exit(0);
        }
        if flag == "--stamp-ids" {
            args.stamp_ids = true;
            continue;
        }
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
            "--config" => args.config = Some(value),
            "--serve-cert" => args.serve_cert = Some(value),
            "--prebuilt" => args.prebuilt = Some(value.parse().expect("--prebuilt N")),
            "--key" => args.key = Some(value),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        !args.secret.is_empty() || args.config.is_some(),
        "--secret (Stripe) or --config is required"
    );
    assert!(
        args.prebuilt.is_none() || args.mode == "fresh",
        "--prebuilt is for --mode fresh"
    );
    assert!(
        !args.stamp_ids || (args.mode == "fresh" && args.prebuilt.is_none()),
        "--stamp-ids is for --mode fresh, without --prebuilt"
    );
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

/// An event of about 1.5 KB as `scheme`'s provider sends it, with the id `id` (Braintree's id
/// is derived from the notification, which names `id`).
fn body(scheme: &str, id: &str) -> String {
    let padding = "x".repeat(900);
    match scheme {
        "paypal" => format!(
            r#"{{"id":"{id}","event_version":"1.0","create_time":"2026-12-02T10:00:00.000Z","resource_type":"capture","event_type":"PAYMENT.CAPTURE.COMPLETED","summary":"Payment completed for $ 20.0 USD","resource":{{"id":"cap_{id}","amount":{{"currency_code":"USD","value":"20.00"}},"final_capture":true,"note_to_payer":"{padding}","status":"COMPLETED"}}}}"#
        ),
        "square" => format!(
            r#"{{"merchant_id":"ML_BENCH","type":"payment.updated","event_id":"{id}","created_at":"2026-12-02T10:00:00Z","data":{{"type":"payment","id":"pay_{id}","object":{{"payment":{{"id":"pay_{id}","amount_money":{{"amount":2000,"currency":"USD"}},"note":"{padding}","status":"COMPLETED"}}}}}}}}"#
        ),
        // A batch of ten authorisations, each item an event of its own (`{id}_{k}`), which the
        // signing code signs one by one inside the body.
        "adyen" => {
            let items: Vec<String> = (0..10)
                .map(|k| {
                    format!(
                        r#"{{"NotificationRequestItem":{{"additionalData":{{"authCode":"058494","cardSummary":"0010"}},"amount":{{"currency":"EUR","value":{}}},"eventCode":"AUTHORISATION","eventDate":"2026-12-02T10:00:00+01:00","merchantAccountCode":"HookboxBenchECOM","merchantReference":"order-{id}-{k}","paymentMethod":"visa","pspReference":"{id}_{k}","success":"true"}}}}"#,
                        1000 + k
                    )
                })
                .collect();
            format!(
                r#"{{"live":"false","notificationItems":[{}]}}"#,
                items.join(",")
            )
        }
        // One event, as SendGrid posts it: a JSON array ending in CRLF.
        "sendgrid" => format!(
            "[{{\"email\":\"ada@example.com\",\"timestamp\":1764669600,\"smtp-id\":\"<{id}@geopod-ismtpd-3>\",\"event\":\"delivered\",\"category\":[\"receipts\"],\"sg_event_id\":\"{id}\",\"sg_message_id\":\"{id}.recvd-7b5d8c6f4-x2kqp-1-6921E6DE-3.0\",\"response\":\"250 2.0.0 OK {padding}\",\"tls\":1,\"ip\":\"149.72.154.232\"}}]\r\n"
        ),
        // One event, as GoCardless posts it.
        "gocardless" => format!(
            r#"{{"events":[{{"id":"{id}","created_at":"2026-12-02T10:00:00.000Z","resource_type":"payments","action":"confirmed","links":{{"payment":"PM_{id}"}},"details":{{"origin":"gocardless","cause":"payment_confirmed","description":"{padding}"}}}}],"meta":{{"webhook_id":"WB_{id}"}}}}"#
        ),
        // Base64 and the form encoding make the ~1.1 KB notification about 1.5 KB on the wire.
        "braintree" => format!(
            "<notification>\n  <timestamp type=\"datetime\">2026-12-02T10:00:00Z</timestamp>\n  \
             <kind>subscription_charged_successfully</kind>\n  <subject><subscription><id>{id}</id>\
             <status>Active</status><description>{}</description></subscription></subject>\n\
             </notification>\n",
            &padding[..700]
        ),
        _ => format!(
            r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":1733130000,"data":{{"object":{{"id":"pi_{id}","object":"payment_intent","amount":2000,"currency":"usd","customer":"cus_bench","description":"{padding}","metadata":{{"order_id":"101"}},"status":"succeeded"}}}},"livemode":false,"pending_webhooks":1,"request":{{"id":null,"idempotency_key":null}},"type":"payment_intent.succeeded"}}"#
        ),
    }
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2) != Some("Z"))
        .unwrap_or(false)
}

/// Builds one request: a delivery signed now as the source's provider signs it, or one whose
/// signature headers are wrong.
fn request(args: &Args, verifier: &Verifier, id: &str, forged: bool) -> Vec<u8> {
    let body = body(verifier.scheme(), id);
    let identity = signing::identity(verifier, body.as_bytes(), Some(id), None);
    let signed = signing::signed(
        verifier,
        body.as_bytes(),
        unix_now(),
        &identity,
        &signing::ContentType::Default,
    );
    let path = if args.path_prefix.is_empty() {
        format!("/webhooks/{}", args.source)
    } else {
        format!("/{}/webhooks/{}", args.path_prefix, args.source)
    };
    let path = signing::with_query(&path, signed.query.as_deref());
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n",
        args.host,
        signed.body.len()
    );
    for (name, value) in signed.headers {
        let value = if forged && !name.eq_ignore_ascii_case("content-type") {
            format!("t={},v1={}", unix_now(), "0".repeat(64))
        } else {
            value
        };
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&signed.body);
    bytes
}

/// A fresh RSA key (PKCS#8 PEM) and its self-signed certificate (PEM), valid a day either side
/// of now: what PayPal signs with and serves, made for this run.
fn paypal_key() -> (String, String) {
    let key = PKey::from_rsa(Rsa::generate(2048).expect("an RSA key")).expect("a key");
    let mut name = X509Name::builder().expect("a name");
    name.append_entry_by_text("CN", "hookbox bench paypal")
        .expect("a CN");
    let name = name.build();
    let mut cert = X509::builder().expect("a certificate");
    cert.set_version(2).expect("v3");
    let serial = BigNum::from_u32(1).and_then(|n| n.to_asn1_integer());
    cert.set_serial_number(&serial.expect("a serial"))
        .expect("serial");
    cert.set_subject_name(&name).expect("subject");
    cert.set_issuer_name(&name).expect("issuer");
    cert.set_pubkey(&key).expect("public key");
    let day = 24 * 3600;
    cert.set_not_before(&Asn1Time::from_unix(unix_now() - day).expect("a time"))
        .expect("not before");
    cert.set_not_after(&Asn1Time::from_unix(unix_now() + day).expect("a time"))
        .expect("not after");
    cert.sign(&key, MessageDigest::sha256())
        .expect("self-signed");
    let text = |pem: Vec<u8>| String::from_utf8(pem).expect("PEM is text");
    (
        text(key.private_key_to_pem_pkcs8().expect("PEM")),
        text(cert.build().to_pem().expect("PEM")),
    )
}

/// Answers every request on `listener` with the certificate `pem`, one connection at a time.
async fn serve_cert(listener: TcpListener, pem: String) {
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-pem-file\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{pem}",
        pem.len()
    );
    while let Ok((mut stream, _)) = listener.accept().await {
        let mut head = Vec::new();
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

/// What signs the deliveries, and the certificate server to start (its listener and PEM), if
/// any.
fn signer(args: &Args, run: &str) -> (Verifier, Option<(std::net::TcpListener, String)>) {
    let mut signing = Signing::default();
    if let Some(path) = &args.key {
        let pem = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("--key {path}: {e}"));
        signing.key_pem = Some(Secret::new(pem));
    }
    let mut cert = None;
    if let Some(address) = &args.serve_cert {
        let (key_pem, cert_pem) = paypal_key();
        let listener = std::net::TcpListener::bind(address).expect("bind --serve-cert");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        signing.key_pem = Some(Secret::new(key_pem));
        signing.cert_url = Some(format!("http://{address}/certs/bench-{run}.pem"));
        cert = Some((listener, cert_pem));
    }
    let verifier = match &args.config {
        Some(path) => {
            let config = Config::load(Some(Path::new(path)), &ProcessEnv)
                .unwrap_or_else(|e| panic!("--config: {e}"));
            let signer = Signer::from_config(&config, Vec::new(), &signing).expect("a signer");
            signer
                .for_source(&args.source)
                .unwrap_or_else(|e| panic!("--source {}: {e}", args.source))
                .clone()
        }
        None => Scheme::builtin("stripe")
            .expect("built in")
            .build(
                &[Secret::new(args.secret.clone())],
                Duration::from_secs(300),
            )
            .expect("a usable secret"),
    };
    (verifier, cert)
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
    let run = format!("{}_{}", std::process::id(), unix_now());
    let (verifier, cert) = signer(&args, &run);
    let verifier = Rc::new(verifier);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        if let Some((listener, pem)) = cert {
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            tokio::task::spawn_local(serve_cert(listener, pem));
        }
        // --prebuilt: every request built and signed before the clock starts.
        let prebuilt: Rc<RefCell<VecDeque<Vec<u8>>>> = Rc::new(RefCell::new(
            (0..args.prebuilt.unwrap_or(0))
                .map(|n| request(&args, &verifier, &format!("evt_bench_{run}_pre_{n}"), false))
                .collect(),
        ));
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
        let counted = args.prebuilt.is_some();
        let keep_going = move || match while_pid {
            Some(pid) => alive(pid) || started.elapsed() < Duration::from_millis(200),
            None => counted || Instant::now() < deadline,
        };
        let workers: Vec<_> = (0..args.connections)
            .map(|worker| {
                let (tally, verifier, args, replay_ids, run, prebuilt) = (
                    tally.clone(),
                    verifier.clone(),
                    args.clone(),
                    replay_ids.clone(),
                    run.clone(),
                    prebuilt.clone(),
                );
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
                            _ if args.stamp_ids => (format!("evt_bench_{run}_{worker}_{n}_t{}", unix_micros()), false),
                            _ => (format!("evt_bench_{run}_{worker}_{n}"), false),
                        };
                        n += 1;
                        let bytes = if counted {
                            let next = prebuilt.borrow_mut().pop_front();
                            match next {
                                Some(bytes) => bytes,
                                None => break,
                            }
                        } else {
                            request(&args, &verifier, &id, forged)
                        };
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
