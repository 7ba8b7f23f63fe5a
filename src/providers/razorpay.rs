//! Razorpay: `X-Razorpay-Signature`, the hex HMAC-SHA256 of the body keyed by the webhook
//! secret, used as text; the event id travels in `X-Razorpay-Event-Id`, the type in the body's
//! `event`. No timestamp is signed.

use std::sync::Arc;
use std::time::Duration;

use super::family::text_keys_only;
use super::mac::{any_matches, header_id, hex_tags, json_text, matched, required_header, tag_of};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Razorpay source: its webhook secrets, as text.
#[derive(Debug)]
pub struct Razorpay {
    keys: Keys,
}

/// Builds a Razorpay source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Razorpay {
        keys: text_keys_only(settings)?,
    }))
}

const SIGNATURE: &str = "X-Razorpay-Signature";
const EVENT_ID: &str = "X-Razorpay-Event-Id";

impl Provider for Razorpay {
    fn scheme(&self) -> &'static str {
        "razorpay"
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

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_id(headers, EVENT_ID),
            event_type: json_text(json, "/event"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![
            SIGNATURE.to_ascii_lowercase(),
            EVENT_ID.to_ascii_lowercase(),
        ]
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let tag = tag_of(self.keys.first(), &[body]);
        vec![
            (SIGNATURE.to_owned(), hex::encode(tag)),
            (EVENT_ID.to_owned(), event_id.to_owned()),
        ]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(24 * 3600),
            "Razorpay retries a failed webhook for 24 hours after the event was created",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const BODY: &[u8] = br#"{"entity":"event","event":"payment.captured"}"#;

    #[test]
    fn sign_carries_the_id_header_and_verifies() {
        let razorpay = verifier("razorpay", &["whsec"]);
        let signed = razorpay.sign(BODY, 0, "PdLw9Kj2Tb6YqM", None);
        assert_eq!(
            signed[1],
            ("X-Razorpay-Event-Id".into(), "PdLw9Kj2Tb6YqM".into())
        );
        assert_eq!(razorpay.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(
            razorpay.verify(&signed, b"{}", 0),
            Err(SignatureError::Invalid)
        );
        let empty = headers(&[("X-Razorpay-Signature", "")]);
        assert_eq!(
            razorpay.verify(&empty, BODY, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn identify_takes_the_id_from_the_header_and_the_type_from_the_body() {
        let razorpay = verifier("razorpay", &["whsec"]);
        let json = serde_json::from_slice(BODY).expect("JSON");
        let sent = headers(&[("x-razorpay-event-id", "PdLw")]);
        let identity = razorpay.identify(&sent, Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("PdLw"));
        assert_eq!(identity.event_type.as_deref(), Some("payment.captured"));
        assert_eq!(razorpay.identify(&headers(&[]), Some(&json)).event_id, None);
    }
}
