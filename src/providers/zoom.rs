//! Zoom: `x-zm-signature: v0=<hex>`, an HMAC-SHA256 of `v0:{x-zm-request-timestamp}:{body}`
//! keyed by the app's secret token; the timestamp (unix seconds) must be within tolerance. Zoom
//! sends no event id: it is `sha256:` + the hex SHA-256 of the body, and the type is the body's
//! `event`. Before it delivers, Zoom checks the endpoint with a signed
//! `endpoint.url_validation`, answered `{"plainToken": P, "encryptedToken": hex
//! HMAC-SHA256(secret, P)}` with the secret that verified it, and never stored.

use std::sync::Arc;
use std::time::Duration;

use super::family::{lowercase, text_keys_only, v0, v0_content, HeaderMac};
use super::mac::{any_matches, json_text, parse_timestamp, required_header, tag_of, Clock};
use super::{
    body_hash_id, Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Refusal,
    Settings, SignatureError,
};

/// A Zoom source: its secret tokens, used as text, and its tolerance.
#[derive(Debug)]
pub struct Zoom {
    keys: Keys,
    tolerance: Duration,
}

/// Builds a Zoom source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Zoom {
        keys: text_keys_only(settings)?,
        tolerance: settings.tolerance,
    }))
}

const SIGNATURE: HeaderMac = v0("x-zm-signature");
const TIMESTAMP: &str = "x-zm-request-timestamp";
const VALIDATION: &str = "endpoint.url_validation";

impl Zoom {
    /// The secret that signed this request, if one did (each compared in constant time), with
    /// the request's timestamp.
    fn signer(&self, headers: &dyn Headers, body: &[u8]) -> Result<(&[u8], i64), SignatureError> {
        let tags = SIGNATURE.tags(headers)?;
        let raw = required_header(headers, TIMESTAMP)?;
        let timestamp = parse_timestamp(raw)?;
        let signed = v0_content(raw, body);
        self.keys
            .all()
            .iter()
            .find(|key| any_matches(std::slice::from_ref(*key), &signed, &tags))
            .map(|key| (key.as_slice(), timestamp))
            .ok_or(SignatureError::Invalid)
    }
}

impl Provider for Zoom {
    fn scheme(&self) -> &'static str {
        "zoom"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let (_, timestamp) = self.signer(headers, body)?;
        Clock::new(now, self.tolerance).check(timestamp)
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// Both come from the body; see [`identify_body`](Provider::identify_body).
    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: None,
            event_type: json_text(json, "/event"),
        }
    }

    fn identify_body(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        json: Option<&serde_json::Value>,
    ) -> Identity {
        Identity {
            event_id: Some(body_hash_id(body)),
            ..self.identify(headers, json)
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        // The id and type come from the body.
        lowercase(&[SIGNATURE.header, TIMESTAMP])
    }

    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let stamp = timestamp.to_string();
        let signature = SIGNATURE.sign(&self.keys, &v0_content(&stamp, body));
        vec![(TIMESTAMP.to_owned(), stamp), signature]
    }

    /// A verified `endpoint.url_validation`: its `plainToken`, and that token's HMAC under the
    /// secret that signed the request (during a rotation Zoom signs with the one it has).
    fn handshake(
        &self,
        inbound: &Inbound<'_>,
        json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        let json = json?;
        if json.get("event")?.as_str()? != VALIDATION {
            return None;
        }
        let Some(plain) = json.pointer("/payload/plainToken").and_then(|p| p.as_str()) else {
            return Some(Err(Refusal::Malformed(
                "an endpoint.url_validation request carries payload.plainToken as a string, and \
                 this one does not",
            )));
        };
        // Verified already, so one of the secrets signed it.
        let (secret, _) = match self.signer(inbound.headers, inbound.body) {
            Ok(found) => found,
            Err(e) => return Some(Err(Refusal::Signature(e))),
        };
        let encrypted = hex::encode(tag_of(secret, &[plain.as_bytes()]));
        Some(Ok(Answer {
            status: 200,
            content_type: "application/json",
            body: serde_json::json!({ "plainToken": plain, "encryptedToken": encrypted })
                .to_string()
                .into_bytes(),
        }))
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(85 * 60),
            "Zoom retries a notification three times: 5 minutes after the first attempt, then \
             20 and 60 minutes after the retry before",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, post, verifier};
    use super::super::SignatureError;

    const NOW: i64 = 1_763_649_000;
    const BODY: &[u8] = br#"{"event":"meeting.started","payload":{"object":{"id":"1"}}}"#;

    #[test]
    fn sign_verifies_and_the_timestamp_is_signed_and_judged() {
        let zoom = verifier("zoom", &["old", "current"]);
        let signed = verifier("zoom", &["current"]).sign(BODY, NOW, "", None);
        assert_eq!(zoom.verify(&signed, BODY, NOW + 300), Ok(()));
        assert_eq!(
            zoom.verify(&signed, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            zoom.verify(&signed, BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
        let moved: Vec<(String, String)> = signed
            .iter()
            .map(|(name, value)| {
                let value = if name == "x-zm-request-timestamp" {
                    (NOW + 1).to_string()
                } else {
                    value.clone()
                };
                (name.clone(), value)
            })
            .collect();
        assert_eq!(zoom.verify(&moved, BODY, NOW), Err(SignatureError::Invalid));
        let bare = headers(&[("x-zm-signature", "v0="), ("x-zm-request-timestamp", "1")]);
        assert_eq!(zoom.verify(&bare, BODY, 1), Err(SignatureError::Invalid));
    }

    #[test]
    fn the_validation_is_answered_with_the_secret_that_signed_it() {
        let zoom = verifier("zoom", &["old", "current"]);
        let body = br#"{"payload":{"plainToken":"abc"},"event":"endpoint.url_validation"}"#;
        for secret in ["old", "current"] {
            let signed = verifier("zoom", &[secret]).sign(body, NOW, "", None);
            let json = serde_json::from_slice(body).expect("JSON");
            let inbound = post(&signed, body, NOW);
            let answer = zoom
                .handshake(&inbound, Some(&json))
                .expect("a handshake")
                .expect("answered");
            let answered: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
            let expected = hex::encode(super::tag_of(secret.as_bytes(), &[b"abc"]));
            assert_eq!(answered["plainToken"], "abc");
            assert_eq!(answered["encryptedToken"], expected.as_str());
        }
    }

    #[test]
    fn a_validation_without_a_plain_token_is_refused_not_taken_for_an_event() {
        let zoom = verifier("zoom", &["current"]);
        for body in [
            &br#"{"payload":{},"event":"endpoint.url_validation"}"#[..],
            br#"{"payload":{"plainToken":7},"event":"endpoint.url_validation"}"#,
        ] {
            let signed = zoom.sign(body, NOW, "", None);
            let json = serde_json::from_slice(body).expect("JSON");
            let inbound = post(&signed, body, NOW);
            assert!(
                matches!(
                    zoom.handshake(&inbound, Some(&json)),
                    Some(Err(super::super::Refusal::Malformed(_)))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
