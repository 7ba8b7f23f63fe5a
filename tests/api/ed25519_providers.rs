//! The Ed25519 schemes through the real server: Standard Webhooks `v1a` and Discord. Per scheme,
//! a delivery signed now by the code `send` and `replay` sign with (`--key`) is processed and a
//! redelivery is a byte-identical replay; either of two public keys may sign (rotation); a
//! tampered body, a key that is not configured and a stale timestamp are refused with nothing
//! stored. A `standard` source with both secrets and public keys takes either kind of
//! signature. Discord's PING is answered `{"type":1}` exactly, stored never, counted as a
//! handshake, and refused when its signature is wrong. `send` and `replay` sign with `--key`.
//!
//! Every key comes from a fixed seed, so the tests are the same on every run; a signature made
//! with a key no source trusts is made here, by hand, as a forger would.

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::{Signer as _, SigningKey};
use hookbox::providers::Signing;
use hookbox::replay::{signing, Signer};
use hookbox::secret::Secret;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

use crate::helpers::*;

/// The key of a fixed seed.
fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// A key's public half as a `standard` source lists it.
fn whpk(seed: u8) -> String {
    format!(
        "whpk_{}",
        BASE64.encode(key(seed).verifying_key().as_bytes())
    )
}

/// A key's public half as a `discord` source lists it.
fn discord_hex(seed: u8) -> String {
    hex::encode(key(seed).verifying_key().as_bytes())
}

/// A key as `--key FILE` holds it: PEM PKCS#8.
fn pem(seed: u8) -> String {
    key(seed)
        .to_pkcs8_pem(LineEnding::LF)
        .expect("a PEM key")
        .to_string()
}

/// Seeds of the keys the sources trust (two each: a rotation) and of one no source trusts.
const V1A_CURRENT: u8 = 11;
const V1A_NEXT: u8 = 12;
const BOTH_KEY: u8 = 13;
const DISCORD_CURRENT: u8 = 21;
const DISCORD_NEXT: u8 = 22;
const UNTRUSTED: u8 = 99;

const BOTH_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn sources() -> String {
    format!(
        r#"
[sources.signed_v1a]
scheme = "standard"
public_keys = ["{}", "{}"]

[sources.both]
scheme = "standard"
secrets = ["{BOTH_SECRET}"]
public_keys = ["{}"]

[sources.discord]
scheme = "discord"
public_keys = ["{}", "{}"]
"#,
        whpk(V1A_CURRENT),
        whpk(V1A_NEXT),
        whpk(BOTH_KEY),
        discord_hex(DISCORD_CURRENT),
        discord_hex(DISCORD_NEXT),
    )
}

async fn spawn() -> TestApp {
    TestApp::spawn_with(&sources(), Default::default()).await
}

/// `body` signed at `at` for `source` by the signing code of `send` and `replay`, with the key
/// of `seed` as `--key` (`None`: no `--key`).
fn signed(
    app: &TestApp,
    source: &str,
    seed: Option<u8>,
    body: &str,
    event_id: &str,
    at: i64,
) -> Delivery {
    let signing = Signing {
        key_pem: seed.map(|seed| Secret::new(pem(seed))),
        cert_url: None,
        to_query: None,
    };
    let signer =
        Signer::from_config(&app.config, Vec::new(), &signing).expect("the test config signs");
    let verifier = signer
        .for_source(source)
        .unwrap_or_else(|e| panic!("{source} signs: {e}"));
    // The id given travels in `webhook-id`; Discord's is read from the body.
    let identity = signing::identity(verifier, body.as_bytes(), Some(event_id), None);
    let signed = signing::signed(
        verifier,
        body.as_bytes(),
        at,
        &identity,
        &signing::ContentType::Default,
    );
    Delivery {
        source: source.to_owned(),
        headers: signed.headers,
        body: signed.body,
    }
}

/// A Standard Webhooks delivery whose `webhook-signature` is `v1a` by the key of `seed`, signed
/// here by hand.
fn v1a_by_hand(source: &str, seed: u8, body: &str, id: &str, at: i64) -> Delivery {
    let signed = format!("{id}.{at}.{body}");
    let signature = BASE64.encode(key(seed).sign(signed.as_bytes()).to_bytes());
    Delivery {
        source: source.to_owned(),
        headers: vec![
            ("webhook-id".to_owned(), id.to_owned()),
            ("webhook-timestamp".to_owned(), at.to_string()),
            ("webhook-signature".to_owned(), format!("v1a,{signature}")),
            ("Content-Type".to_owned(), "application/json".to_owned()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

/// A Discord request signed by hand with the key of `seed`.
fn discord_by_hand(seed: u8, body: &str, at: i64) -> Delivery {
    let signature = key(seed).sign(format!("{at}{body}").as_bytes()).to_bytes();
    Delivery {
        source: "discord".to_owned(),
        headers: vec![
            ("X-Signature-Ed25519".to_owned(), hex::encode(signature)),
            ("X-Signature-Timestamp".to_owned(), at.to_string()),
            ("Content-Type".to_owned(), "application/json".to_owned()),
        ],
        body: body.as_bytes().to_vec(),
    }
}

fn invoice(kind: &str) -> String {
    format!(r#"{{"type":"{kind}","data":{{"id":"in_1QeR7sLkN2","amount_due":4500}}}}"#)
}

/// A Discord APPLICATION_COMMAND interaction with a fresh id (a snowflake's digits).
fn command() -> (String, String) {
    let id = format!("1440{}", unique_id("").replace('_', ""));
    let body = format!(
        r#"{{"application_id":"1310405836487426058","data":{{"id":"1310410227263373412","name":"deploy","options":[{{"name":"env","type":3,"value":"staging"}}],"type":1}},"id":"{id}","token":"aW50ZXJhY3Rpb24","type":2,"version":1}}"#
    );
    (id, body)
}

const PING: &str = r#"{"application_id":"1310405836487426058","id":"1440716101849665587","token":"aW50ZXJhY3Rpb24","type":1,"version":1}"#;

fn stored(app: &TestApp, source: &str) -> i64 {
    app.db.count(&format!("events WHERE source = '{source}'"))
}

/// Processed under `id` and `kind`, then the same delivery again is a byte-identical replay.
async fn processed_then_replayed(app: &TestApp, delivery: &Delivery, id: &str, kind: &str) {
    let first = app.send(delivery).await;
    assert_eq!(first.status, 200, "{}: {}", delivery.source, first.text());
    assert!(!first.replayed());
    assert_eq!(first.json()["event_id"], id, "{}", first.text());
    assert_eq!(first.json()["event_type"], kind, "{}", first.text());
    let again = app.send(delivery).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed(), "{}", delivery.source);
    assert_eq!(again.body, first.body);
}

/// Refused with 401 and `code`.
async fn refused(app: &TestApp, delivery: &Delivery, code: &str, why: &str) {
    let answer = app.send(delivery).await;
    assert_eq!(answer.status, 401, "{why}: {}", answer.text());
    assert_eq!(answer.code().as_deref(), Some(code), "{why}");
}

fn metric(metrics: &str, source: &str, outcome: &str) -> String {
    let prefix = format!("hookbox_webhooks_total{{source=\"{source}\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or("0".to_owned(), str::to_owned)
}

#[actix_web::test]
async fn standard_v1a_is_processed_replayed_rotated_and_refused_when_tampered_unkeyed_or_stale() {
    let app = spawn().await;
    let now = unix_now();

    let id = unique_id("msg");
    let body = invoice("invoice.paid");
    let delivery = signed(&app, "signed_v1a", Some(V1A_CURRENT), &body, &id, now);
    assert!(
        delivery.header("webhook-signature").starts_with("v1a,"),
        "{delivery:?}"
    );
    processed_then_replayed(&app, &delivery, &id, "invoice.paid").await;

    // Rotation: the other configured key signs too.
    let next = unique_id("msg");
    let rotated = signed(&app, "signed_v1a", Some(V1A_NEXT), &body, &next, now);
    processed_then_replayed(&app, &rotated, &next, "invoice.paid").await;
    assert_eq!(stored(&app, "signed_v1a"), 2);

    let other = unique_id("msg");
    let fresh = signed(&app, "signed_v1a", Some(V1A_CURRENT), &body, &other, now);
    let mut tampered = fresh.clone();
    tampered.body = body.replace("4500", "4501").into_bytes();
    refused(&app, &tampered, "invalid_signature", "tampered body").await;
    let renamed = fresh.clone().with_header("webhook-id", &unique_id("msg"));
    refused(&app, &renamed, "invalid_signature", "another webhook-id").await;
    let forged = v1a_by_hand("signed_v1a", UNTRUSTED, &body, &other, now);
    refused(&app, &forged, "invalid_signature", "a key not configured").await;
    // A good Ed25519 signature labelled v1 is not checked against the public keys.
    let relabelled = fresh.clone().with_header(
        "webhook-signature",
        &fresh.header("webhook-signature").replacen("v1a,", "v1,", 1),
    );
    refused(&app, &relabelled, "invalid_signature", "v1a labelled v1").await;
    for skew in [-600, 600] {
        let stale = signed(
            &app,
            "signed_v1a",
            Some(V1A_CURRENT),
            &body,
            &other,
            now + skew,
        );
        refused(&app, &stale, "stale_timestamp", &format!("skewed {skew}s")).await;
    }
    assert_eq!(stored(&app, "signed_v1a"), 2, "nothing refused is stored");
    // The delivery refused above, genuine and on time, is still taken: nothing was claimed.
    processed_then_replayed(&app, &fresh, &other, "invoice.paid").await;
}

#[actix_web::test]
async fn a_standard_source_with_secrets_and_public_keys_takes_either_and_refuses_an_unconfigured_v1a(
) {
    let app = spawn().await;
    let now = unix_now();
    let body = invoice("invoice.finalized");

    // No --key: the source's secret signs v1 alone.
    let by_secret = unique_id("msg");
    let v1 = signed(&app, "both", None, &body, &by_secret, now);
    assert!(
        v1.header("webhook-signature").starts_with("v1,")
            && !v1.header("webhook-signature").contains("v1a,"),
        "{v1:?}"
    );
    processed_then_replayed(&app, &v1, &by_secret, "invoice.finalized").await;

    // The public key alone: a v1a and nothing else.
    let by_key = unique_id("msg");
    let v1a = v1a_by_hand("both", BOTH_KEY, &body, &by_key, now);
    processed_then_replayed(&app, &v1a, &by_key, "invoice.finalized").await;

    // With --key, send signs both ways in one header, as a sender mid-migration would.
    let by_both = unique_id("msg");
    let both = signed(&app, "both", Some(BOTH_KEY), &body, &by_both, now);
    let entries: Vec<&str> = both.header("webhook-signature").split(' ').collect();
    assert!(
        entries.len() == 2 && entries[0].starts_with("v1,") && entries[1].starts_with("v1a,"),
        "{entries:?}"
    );
    processed_then_replayed(&app, &both, &by_both, "invoice.finalized").await;

    // A v1a by a key that is not configured is refused, alone or beside a v1 by another secret.
    let unkeyed = unique_id("msg");
    let forged = v1a_by_hand("both", UNTRUSTED, &body, &unkeyed, now);
    refused(&app, &forged, "invalid_signature", "an unconfigured v1a").await;
    let wrong_v1 = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";
    let beside = forged.clone().with_header(
        "webhook-signature",
        &format!("{wrong_v1} {}", forged.header("webhook-signature")),
    );
    refused(&app, &beside, "invalid_signature", "beside a wrong v1").await;
    assert_eq!(stored(&app, "both"), 3);
}

#[actix_web::test]
async fn discord_interactions_are_processed_replayed_rotated_and_refused_when_tampered_unkeyed_or_stale(
) {
    let app = spawn().await;
    let now = unix_now();

    let (id, body) = command();
    let delivery = signed(&app, "discord", Some(DISCORD_CURRENT), &body, "", now);
    processed_then_replayed(&app, &delivery, &id, "2").await;
    let stored_event = app
        .get(&format!("/admin/events/discord/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(
        stored_event.json()["event_type"],
        "2",
        "{}",
        stored_event.text()
    );
    assert_eq!(stored_event.json()["payload"], body.as_str());

    let (next, rotated_body) = command();
    let rotated = signed(&app, "discord", Some(DISCORD_NEXT), &rotated_body, "", now);
    processed_then_replayed(&app, &rotated, &next, "2").await;
    assert_eq!(stored(&app, "discord"), 2);

    let (other, other_body) = command();
    let fresh = signed(&app, "discord", Some(DISCORD_CURRENT), &other_body, "", now);
    let mut tampered = fresh.clone();
    tampered.body = other_body.replace("staging", "production").into_bytes();
    refused(&app, &tampered, "invalid_signature", "tampered body").await;
    let restamped = fresh
        .clone()
        .with_header("X-Signature-Timestamp", &(now + 1).to_string());
    refused(&app, &restamped, "invalid_signature", "timestamp changed").await;
    let forged = discord_by_hand(UNTRUSTED, &other_body, now);
    refused(&app, &forged, "invalid_signature", "a key not configured").await;
    for skew in [-600, 600] {
        let stale = signed(
            &app,
            "discord",
            Some(DISCORD_CURRENT),
            &other_body,
            "",
            now + skew,
        );
        refused(&app, &stale, "stale_timestamp", &format!("skewed {skew}s")).await;
    }
    assert_eq!(stored(&app, "discord"), 2, "nothing refused is stored");
    processed_then_replayed(&app, &fresh, &other, "2").await;
}

#[actix_web::test]
async fn a_discord_ping_is_answered_exactly_never_stored_refused_unsigned_and_counted_as_a_handshake(
) {
    let app = spawn().await;
    let now = unix_now();
    for seed in [DISCORD_CURRENT, DISCORD_NEXT] {
        let ping = signed(&app, "discord", Some(seed), PING, "", now);
        let answer = app.send(&ping).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.body, br#"{"type":1}"#, "{}", answer.text());
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert!(!answer.replayed());
    }
    let forged = discord_by_hand(UNTRUSTED, PING, now);
    refused(&app, &forged, "invalid_signature", "a PING by another key").await;
    let unsigned = forged.clone().without_header("X-Signature-Ed25519");
    refused(&app, &unsigned, "invalid_signature", "an unsigned PING").await;
    let stale = discord_by_hand(DISCORD_CURRENT, PING, now - 600);
    refused(&app, &stale, "stale_timestamp", "an old PING").await;
    assert_eq!(stored(&app, "discord"), 0);

    let metrics = app.get("/metrics", None).await.text();
    assert_eq!(metric(&metrics, "discord", "handshake"), "2", "{metrics}");
    assert_eq!(metric(&metrics, "discord", "processed"), "0");
    assert_eq!(metric(&metrics, "discord", "rejected"), "3");
}

/// `hookbox ARGS` with `env`, on a blocking thread (the server runs on this test's runtime).
async fn hookbox(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    actix_web::rt::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_hookbox(&args, &env)
    })
    .await
    .expect("the hookbox command's thread")
}

#[actix_web::test]
async fn send_and_replay_sign_with_an_ed25519_key_file_and_name_a_missing_or_untrusted_key() {
    let app = spawn().await;
    // The command line's config reads the discord keys from the environment.
    let from_env = sources().replace(
        &format!(
            "public_keys = [\"{}\", \"{}\"]",
            discord_hex(DISCORD_CURRENT),
            discord_hex(DISCORD_NEXT)
        ),
        "public_keys_env = \"TEST_DISCORD_PUBLIC_KEYS\"",
    );
    assert_ne!(from_env, sources());
    let public_env = format!(
        "{}, {}",
        discord_hex(DISCORD_CURRENT),
        discord_hex(DISCORD_NEXT)
    );
    let env = [("TEST_DISCORD_PUBLIC_KEYS", public_env.as_str())];
    let config = TempFile::new(&config_text(&app.db.url, &from_env));
    let discord_key = TempFile::new(&pem(DISCORD_NEXT));
    let v1a_key = TempFile::new(&pem(V1A_CURRENT));
    let untrusted = TempFile::new(&pem(UNTRUSTED));
    let (id, body) = command();
    let body_file = TempFile::with_extension(body.as_bytes(), "json");
    let invoice_file = TempFile::with_extension(invoice("invoice.paid").as_bytes(), "json");
    let (config_path, body_path) = (config.path(), body_file.path());
    let base = [
        "send",
        "--to",
        app.address.as_str(),
        "--config",
        config_path.as_str(),
    ];
    let send = |source: &'static str, key: Option<&TempFile>, body: &str| {
        let mut args: Vec<String> = base.iter().map(|a| (*a).to_owned()).collect();
        args.extend(["--source".to_owned(), source.to_owned()]);
        if let Some(key) = key {
            args.extend(["--key".to_owned(), key.path()]);
        }
        args.push(body.to_owned());
        args
    };
    let run = |args: Vec<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        hookbox(&refs, &env).await
    };

    let (code, stdout, stderr) = run(send("discord", Some(&discord_key), &body_path)).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&id) && stdout.contains("processed"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(send("discord", Some(&discord_key), &body_path)).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("replayed"), "{stdout}");

    let (code, stdout, stderr) =
        run(send("signed_v1a", Some(&v1a_key), &invoice_file.path())).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("processed"), "{stdout}");
    assert_eq!(stored(&app, "discord"), 1);
    assert_eq!(stored(&app, "signed_v1a"), 1);

    // Without --key, or with a key no public key of the source matches: exit 2, before
    // anything is sent, naming --key (and the key's public half, to add it if meant).
    let (code, _, stderr) = run(send("discord", None, &body_path)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--key"), "{stderr}");
    let (code, _, stderr) = run(send("signed_v1a", None, &invoice_file.path())).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--key"), "{stderr}");
    let (code, _, stderr) = run(send("discord", Some(&untrusted), &body_path)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--key") && stderr.contains(&discord_hex(UNTRUSTED)),
        "{stderr}"
    );
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    let (code, _, stderr) = run(send("signed_v1a", Some(&untrusted), &body_path)).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&whpk(UNTRUSTED)), "{stderr}");

    // Named alone: --scheme discord with --key, no config and no secret.
    let (other, other_body) = command();
    let other_file = TempFile::with_extension(other_body.as_bytes(), "json");
    let (code, stdout, stderr) = hookbox(
        &[
            "send",
            "--to",
            app.address.as_str(),
            "--source",
            "discord",
            "--scheme",
            "discord",
            "--key",
            discord_key.path().as_str(),
            other_file.path().as_str(),
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&other) && stdout.contains("processed"),
        "{stdout}"
    );
    assert_eq!(stored(&app, "discord"), 2);

    // Exported from this server (one source's events, or all) and replayed into a second,
    // re-signed with the keys.
    let export = |out: String, source: Option<&str>| {
        let mut args: Vec<String> = ["export", "--config", config_path.as_str(), "--out"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        args.push(out);
        if let Some(source) = source {
            args.extend(["--source".to_owned(), source.to_owned()]);
        }
        run(args)
    };
    let second = spawn().await;
    let replay = |capture: String, key: Option<&TempFile>| {
        let mut args: Vec<String> = ["replay", "--to", second.address.as_str(), "--config"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        args.extend([config_path.clone(), capture]);
        if let Some(key) = key {
            args.extend(["--key".to_owned(), key.path()]);
        }
        run(args)
    };
    let capture = TempFile::new("");
    let (code, _, stderr) = export(capture.path(), Some("discord")).await;
    assert_eq!(code, 0, "{stderr}");

    // A capture of every source replayed without --key: its discord and v1a lines cannot be
    // signed, so the command stops with exit 2 naming --key before anything is sent, the line
    // of `both` (which its secret signs) included.
    let (code, stdout, stderr) = run(send("both", None, &invoice_file.path())).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let everything = TempFile::new("");
    let (code, _, stderr) = export(everything.path(), None).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = replay(everything.path(), None).await;
    assert_eq!(code, 2, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("cannot_sign: ")
            && stderr.contains("--key")
            && stderr.contains("nothing was sent"),
        "{stderr}"
    );
    assert_eq!(second.db.count("events"), 0, "nothing was sent");

    let (code, stdout, stderr) = replay(capture.path(), Some(&discord_key)).await;
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(stored(&second, "discord"), 2);
    let event = second
        .get(&format!("/admin/events/discord/{id}"), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(event.status, 200, "{}", event.text());
    assert_eq!(event.json()["event_type"], "2");
    assert_eq!(event.json()["payload"], body.as_str(), "{}", event.text());
}
