//! Lemon Squeezy: `X-Signature`, the hex HMAC-SHA256 of the body keyed by the webhook's signing
//! secret, used as text; the type in `X-Event-Name`. Lemon Squeezy sends no event id, so the id
//! is derived from the body (`sha256:<hex>`): a retry of the same bytes is a replay.

use std::sync::Arc;
use std::time::Duration;

use super::family::text_keys_only;
use super::mac::{any_matches, header_text, hex_tags, matched, required_header, tag_of};
use super::SignatureError;
use super::{body_hash_id, Headers, Identity, Keys, Provider, ProviderError, Settings};

/// A Lemon Squeezy source: its signing secrets, as text.
#[derive(Debug)]
pub struct LemonSqueezy {
    keys: Keys,
}

/// Builds a Lemon Squeezy source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(LemonSqueezy {
        keys: text_keys_only(settings)?,
    }))
}

const SIGNATURE: &str = "X-Signature";
const EVENT_NAME: &str = "X-Event-Name";

impl Provider for LemonSqueezy {
    fn scheme(&self) -> &'static str {
        "lemonsqueezy"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        let tag = required_header(headers, SIGNATURE)?;
        matched(any_matches(self.keys.all(), &[body], &hex_tags([tag])))
    }

    fn needs_json(&self) -> bool {
        false
    }

    /// Without the body there is no id: [`identify_body`](Provider::identify_body) derives it.
    fn identify(&self, headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: None,
            event_type: header_text(headers, EVENT_NAME),
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

    /// The id is the body's hash, whatever `send --event-id` says.
    fn id_in_body(&self) -> bool {
        true
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![
            SIGNATURE.to_ascii_lowercase(),
            EVENT_NAME.to_ascii_lowercase(),
        ]
    }

    /// `event_id` is not sent: the receiver derives it from the body.
    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let tag = tag_of(self.keys.first(), &[body]);
        let mut signed = vec![(SIGNATURE.to_owned(), hex::encode(tag))];
        if let Some(event_type) = event_type {
            signed.push((EVENT_NAME.to_owned(), event_type.to_owned()));
        }
        signed
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(5 + 25 + 125),
            "Lemon Squeezy retries a failed webhook three more times, about 5 s, 25 s and 125 s \
             apart (a resend from the dashboard may come any time later)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::{Inbound, Received, SignatureError};

    const BODY: &[u8] = br#"{"meta":{"event_name":"order_created"},"data":{"id":"1"}}"#;

    #[test]
    fn the_id_is_the_body_hash_and_the_type_the_event_name_header() {
        let lemon = verifier("lemonsqueezy", &["signing"]);
        let signed = lemon.sign(BODY, 0, "ignored", Some("order_created"));
        assert_eq!(lemon.verify(&signed, BODY, 0), Ok(()));
        let inbound = Inbound {
            method: "POST",
            query: "",
            headers: &signed,
            body: BODY,
            now: 0,
        };
        let Ok(Received::Event(event)) = super::super::receive_now(lemon.as_ref(), &inbound) else {
            panic!("a signed delivery is an event");
        };
        assert_eq!(event.event_id, super::super::body_hash_id(BODY));
        assert!(event.event_id.starts_with("sha256:") && event.event_id.len() == 7 + 64);
        assert_eq!(event.event_type.as_deref(), Some("order_created"));
    }

    #[test]
    fn a_wrong_key_or_body_is_invalid() {
        let signed = verifier("lemonsqueezy", &["signing"]).sign(BODY, 0, "", None);
        let other = verifier("lemonsqueezy", &["other"]);
        assert_eq!(other.verify(&signed, BODY, 0), Err(SignatureError::Invalid));
        let lemon = verifier("lemonsqueezy", &["other", "signing"]);
        assert_eq!(lemon.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(
            lemon.verify(&signed, b"{}", 0),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            lemon.verify(&headers(&[]), BODY, 0),
            Err(SignatureError::Invalid)
        );
    }
}
