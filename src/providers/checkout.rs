//! Checkout.com: `Cko-Signature`, the hex HMAC-SHA256 of the body keyed by the webhook's
//! signature key, used as text. No timestamp is signed.

use std::sync::Arc;
use std::time::Duration;

use super::family::{text_keys_only, HeaderMac, TagText};
use super::mac::json_text;
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Checkout.com source: its signature keys, as text.
#[derive(Debug)]
pub struct Checkout {
    keys: Keys,
}

/// Builds a Checkout.com source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Checkout {
        keys: text_keys_only(settings)?,
    }))
}

/// One hex signature of the body.
const SIGNATURE: HeaderMac = HeaderMac {
    header: "Cko-Signature",
    prefix: "",
    text: TagText::Hex,
};

impl Provider for Checkout {
    fn scheme(&self) -> &'static str {
        "checkout"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        SIGNATURE.verify(&self.keys, headers, &[body])
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/id"),
            event_type: json_text(json, "/type"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![SIGNATURE.header.to_ascii_lowercase()]
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        vec![SIGNATURE.sign(&self.keys, &[body])]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(30 * 3600),
            "Checkout.com resends a failed webhook up to eight times over about 30 hours",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_captured"}"#;

    #[test]
    fn sign_verifies_and_a_wrong_key_or_body_does_not() {
        let checkout = verifier("checkout", &["key-1"]);
        let signed = checkout.sign(BODY, 0, "evt_1", None);
        assert_eq!(checkout.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(
            verifier("checkout", &["other", "key-1"]).verify(&signed, BODY, 0),
            Ok(())
        );
        assert_eq!(
            verifier("checkout", &["other"]).verify(&signed, BODY, 0),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            checkout.verify(&signed, b"{}", 0),
            Err(SignatureError::Invalid)
        );
        for bad in ["", "zz", "sha256=00"] {
            let sent = headers(&[("Cko-Signature", bad)]);
            assert_eq!(
                checkout.verify(&sent, BODY, 0),
                Err(SignatureError::Invalid)
            );
        }
    }

    #[test]
    fn identify_reads_id_and_type_from_the_body() {
        let checkout = verifier("checkout", &["key-1"]);
        let json = serde_json::from_slice(BODY).expect("JSON");
        let identity = checkout.identify(&headers(&[]), Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("evt_1"));
        assert_eq!(identity.event_type.as_deref(), Some("payment_captured"));
    }
}
