//! A load generator for hookbox's benchmarks: signed Stripe deliveries over N keep-alive
//! connections, each connection one request at a time, for a fixed time or while another
//! process runs. Prints one JSON line: requests, errors, throughput and latency percentiles.
//!
//! ```text
//! cargo run --release --example loadgen -- --to http://127.0.0.1:8080 --secret whsec_... \
//!     --connections 32 --seconds 10 [--mode fresh|replay] [--while-pid PID]
//! ```
//!
//! `fresh`: every request is a new event (a distinct id, ~1.5 KB, signed with a fresh
//! timestamp). `replay`: every request is one of a few hundred events stored first.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hookbox::secret::Secret;
use hookbox::signature::{Scheme, Verifier};

struct Args {
    to: String,
    source: String,
    secret: String,
    connections: usize,
    seconds: u64,
    mode: String,
    while_pid: Option<u32>,
}

fn parse_args() -> Args {
    let mut args = Args {
        to: "http://127.0.0.1:8080".to_owned(),
        source: "stripe".to_owned(),
        secret: String::new(),
        connections: 32,
        seconds: 10,
        mode: "fresh".to_owned(),
        while_pid: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--to" => args.to = value,
            "--source" => args.source = value,
            "--secret" => args.secret = value,
            "--connections" => args.connections = value.parse().expect("--connections N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds N"),
            "--mode" => args.mode = value,
            "--while-pid" => args.while_pid = Some(value.parse().expect("--while-pid PID")),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(!args.secret.is_empty(), "--secret is required");
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
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split_whitespace().nth(2) == Some("Z"))
            .unwrap_or(true)
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    errors: u64,
}

async fn post(client: &awc::Client, url: &str, verifier: &Verifier, id: &str) -> bool {
    let body = body(id);
    let mut request = client
        .post(url)
        .insert_header(("Content-Type", "application/json"));
    for (name, value) in verifier.sign(body.as_bytes(), unix_now(), id, None) {
        request = request.insert_header((name, value));
    }
    match request.send_body(body).await {
        Ok(mut response) => {
            let ok = response.status().is_success();
            let _ = response.body().await;
            ok
        }
        Err(_) => false,
    }
}

fn main() {
    let args = parse_args();
    let verifier = Verifier::new(
        Scheme::Stripe,
        &[Secret::new(args.secret.clone())],
        Duration::from_secs(300),
    )
    .expect("a usable secret");
    let url = format!("{}/webhooks/{}", args.to.trim_end_matches('/'), args.source);
    let run = format!("{}_{}", std::process::id(), unix_now());
    actix_web::rt::System::new().block_on(async move {
        let verifier = Rc::new(verifier);
        let replay_ids: Vec<String> = (0..256).map(|i| format!("evt_bench_replay_{run}_{i}")).collect();
        if args.mode == "replay" {
            let client = awc::Client::new();
            for id in &replay_ids {
                assert!(post(&client, &url, &verifier, id).await, "seeding the replay events failed");
            }
        }
        let tally = Rc::new(RefCell::new(Tally::default()));
        let started = Instant::now();
        let deadline = started + Duration::from_secs(args.seconds);
        let keep_going = move || match args.while_pid {
            Some(pid) => alive(pid) || started.elapsed() < Duration::from_millis(200),
            None => Instant::now() < deadline,
        };
        let workers: Vec<_> = (0..args.connections)
            .map(|worker| {
                let (tally, verifier, url, replay_ids, run, mode) = (
                    tally.clone(),
                    verifier.clone(),
                    url.clone(),
                    replay_ids.clone(),
                    run.clone(),
                    args.mode.clone(),
                );
                actix_web::rt::spawn(async move {
                    let client = awc::Client::builder().timeout(Duration::from_secs(30)).finish();
                    let mut n = 0usize;
                    while keep_going() {
                        let id = if mode == "replay" {
                            replay_ids[(worker * 7 + n) % replay_ids.len()].clone()
                        } else {
                            format!("evt_bench_{run}_{worker}_{n}")
                        };
                        n += 1;
                        let sent = Instant::now();
                        let ok = post(&client, &url, &verifier, &id).await;
                        let mut tally = tally.borrow_mut();
                        if ok {
                            tally.latencies_us.push(sent.elapsed().as_micros() as u64);
                        } else {
                            tally.errors += 1;
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
            if l.is_empty() { 0.0 } else { l[((l.len() - 1) as f64 * q) as usize] as f64 / 1000.0 }
        };
        let ok = tally.latencies_us.len();
        println!(
            "{{\"mode\":\"{}\",\"connections\":{},\"seconds\":{elapsed:.2},\"requests\":{ok},\"errors\":{},\"rps\":{:.0},\"p50_ms\":{:.2},\"p99_ms\":{:.2}}}",
            args.mode, args.connections, tally.errors, ok as f64 / elapsed, pick(0.5), pick(0.99)
        );
    });
}
