//! A provider of the test's own, in this one file and registered in one line, makes a working
//! source: verified, identified, stored with its kept headers, its volatile field left out of
//! the fingerprint, its handshake answered and never stored, signed by the same code `send`
//! and `replay` use, and its own config key read and checked.
//!
//! The "ownco" scheme: `X-Ownco-Signature: hex(HMAC-SHA256(secret, "{id}.{body}"))`, the id in
//! a header the source names (`id_header`), the type in the body's `kind`, `sent_at` changed on
//! every attempt, and `{"ping": C}` answered `C` as text.

use std::sync::Arc;

use hookbox::providers::mac::{any_matches, header_text, json_text, required_header, tag_of};
use hookbox::providers::{
    Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Refusal, Registry, Settings,
    SignatureError,
};
use hookbox::Config;

use crate::helpers::*;

const SIGNATURE: &str = "X-Ownco-Signature";

#[derive(Debug)]
struct Ownco {
    keys: Keys,
    id_header: String,
}

/// Builds an ownco source: its secrets, and the header its id travels in.
fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(&["id_header"])?;
    let id_header = settings
        .text("id_header")?
        .ok_or_else(|| ProviderError::at("id_header", "an ownco source names its id header"))?;
    Ok(Arc::new(Ownco {
        keys: Keys::as_text(settings.scheme, settings.secrets)?,
        id_header: id_header.to_owned(),
    }))
}

impl Provider for Ownco {
    fn scheme(&self) -> &'static str {
        "ownco"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        let id = required_header(headers, &self.id_header)?;
        let tag = hex::decode(required_header(headers, SIGNATURE)?)
            .map_err(|_| SignatureError::Invalid)?;
        if any_matches(self.keys.all(), &[id.as_bytes(), b".", body], &[tag]) {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }

    fn needs_json(&self) -> bool {
        false
    }

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_text(headers, &self.id_header),
            event_type: json_text(json, "/kind"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![
            SIGNATURE.to_ascii_lowercase(),
            self.id_header.to_ascii_lowercase(),
        ]
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let tag = tag_of(self.keys.first(), &[event_id.as_bytes(), b".", body]);
        vec![
            (SIGNATURE.to_owned(), hex::encode(tag)),
            (self.id_header.clone(), event_id.to_owned()),
        ]
    }

    fn handshake(
        &self,
        _inbound: &Inbound<'_>,
        json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        let challenge = json?.get("ping")?.as_str()?;
        Some(Ok(Answer {
            status: 200,
            content_type: "text/plain",
            body: challenge.as_bytes().to_vec(),
        }))
    }

    fn volatile_fields(&self) -> &'static [&'static str] {
        &["/sent_at"]
    }
}

/// The one registration line.
fn registry() -> Registry {
    Registry::builtin().with("ownco", build)
}

const SOURCE: &str = r#"
[sources.ownco]
scheme = "ownco"
secrets = ["ownco-secret"]
id_header = "X-Ownco-Id"
"#;

fn body(kind: &str, sent_at: u32) -> String {
    format!(r#"{{"kind":"{kind}","sent_at":{sent_at},"amount":5}}"#)
}

#[actix_web::test]
async fn a_provider_of_ones_own_makes_a_working_source() {
    let app = TestApp::spawn_with_providers(SOURCE, &registry()).await;
    let id = unique_id("own");

    let first = app
        .send(&app.delivery("ownco", &body("order.paid", 1), &id))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["event_type"], "order.paid");
    let event = app
        .get(&format!("/admin/events/ownco/{id}"), Some(ADMIN_TOKEN))
        .await
        .json();
    let kept = event["headers"].as_object().expect("headers object");
    let mut names: Vec<&str> = kept.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["content-type", "x-ownco-id", "x-ownco-signature"]);

    // Its volatile field is left out of the fingerprint: a retry is a replay, not a reuse.
    let retry = app
        .send(&app.delivery("ownco", &body("order.paid", 2), &id))
        .await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.body, first.body);
    let other = app
        .send(&app.delivery("ownco", &body("order.refunded", 2), &id))
        .await;
    assert_eq!(other.status, 422, "{}", other.text());

    // Its signature is checked: another secret is refused and nothing is stored.
    let mut forged = app.delivery("ownco", &body("order.paid", 1), &unique_id("own"));
    forged.headers.retain(|(name, _)| name != SIGNATURE);
    forged
        .headers
        .push((SIGNATURE.to_owned(), hex::encode([0u8; 32])));
    let refused = app.send(&forged).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(refused.json()["error"], "invalid_signature");

    // Its handshake is answered as it expects and never stored.
    let events = app.db.count("events");
    let ping = app
        .send(&app.delivery("ownco", r#"{"ping":"c-42"}"#, "ping-1"))
        .await;
    assert_eq!(ping.status, 200, "{}", ping.text());
    assert_eq!(ping.header("content-type"), Some("text/plain"));
    assert_eq!(ping.text(), "c-42");
    assert_eq!(app.db.count("events"), events, "a handshake is not stored");
}

#[test]
fn its_own_key_is_read_and_checked_and_only_a_registry_that_has_it_knows_it() {
    let text = |extra: &str| format!("{SOURCE}{extra}");
    let config = Config::parse_with(&text(""), &test_env, &registry()).expect("valid");
    assert_eq!(config.sources[0].provider.scheme(), "ownco");

    let error = Config::parse_with(&text("id_heder = \"X\"\n"), &test_env, &registry())
        .expect_err("an unknown key");
    assert!(
        error
            .to_string()
            .starts_with("sources.ownco.id_heder: unknown field"),
        "{error}"
    );
    let missing = SOURCE.replace("id_header = \"X-Ownco-Id\"\n", "");
    let error = Config::parse_with(&missing, &test_env, &registry()).expect_err("no id header");
    assert!(
        error.to_string().starts_with("sources.ownco.id_header:"),
        "{error}"
    );
    let error = Config::parse(SOURCE, &test_env).expect_err("not built in");
    assert!(
        error
            .to_string()
            .starts_with("sources.ownco.scheme: unknown scheme \"ownco\""),
        "{error}"
    );
}
