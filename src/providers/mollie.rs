//! Mollie next-gen webhooks: `X-Mollie-Signature: sha256=<hex>`, the HMAC-SHA256 of the body
//! keyed by the webhook's signing secret, used as text. While a secret is rotated Mollie signs
//! with each, one value per secret: in repeated header lines, or folded into one line,
//! comma-separated. Any value may match any configured secret (as mollie-api-php's
//! `SignatureValidator` checks it). No timestamp is signed.

use std::sync::Arc;
use std::time::Duration;

use super::family::{text_keys_only, HeaderMac, TagText};
use super::mac::{any_matches, hex_tags, json_text, matched};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Mollie source: its signing secrets, as text.
#[derive(Debug)]
pub struct Mollie {
    keys: Keys,
}

/// Builds a Mollie source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Mollie {
        keys: text_keys_only(settings)?,
    }))
}

/// Hex after `sha256=` of the body, as it is signed; read as a list (see [`candidates`]).
const SIGNATURE: HeaderMac = HeaderMac {
    header: "X-Mollie-Signature",
    prefix: "sha256=",
    text: TagText::Hex,
};

/// Every `sha256=` value of every `X-Mollie-Signature` line, in order. A line that is not UTF-8
/// and a value without the prefix carry nothing to check.
fn candidates(headers: &dyn Headers) -> Vec<&str> {
    headers
        .all(SIGNATURE.header)
        .into_iter()
        .filter_map(|line| std::str::from_utf8(line).ok())
        .flat_map(|line| line.split(','))
        .filter_map(|value| value.trim().strip_prefix(SIGNATURE.prefix))
        .collect()
}

impl Provider for Mollie {
    fn scheme(&self) -> &'static str {
        "mollie"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        matched(any_matches(
            self.keys.all(),
            &[body],
            &hex_tags(candidates(headers)),
        ))
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
            Duration::from_secs(26 * 3600),
            "Mollie calls a failing webhook up to 10 times, over about 26 hours",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const BODY: &[u8] = br#"{"resource":"event","id":"event_1","type":"payment-link.paid"}"#;

    fn signature(secret: &str) -> String {
        verifier("mollie", &[secret]).sign(BODY, 0, "", None)[0]
            .1
            .clone()
    }

    #[test]
    fn one_value_per_secret_in_lines_or_folded_any_may_match() {
        let mollie = verifier("mollie", &["current"]);
        let (old, new) = (signature("retired"), signature("current"));
        let lines = headers(&[("X-Mollie-Signature", &old), ("x-mollie-signature", &new)]);
        assert_eq!(mollie.verify(&lines, BODY, 0), Ok(()));
        let folded = headers(&[("X-Mollie-Signature", &format!("{old}, {new}"))]);
        assert_eq!(mollie.verify(&folded, BODY, 0), Ok(()));
        let only_old = headers(&[("X-Mollie-Signature", &old)]);
        assert_eq!(
            mollie.verify(&only_old, BODY, 0),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            verifier("mollie", &["retired", "current"]).verify(&only_old, BODY, 0),
            Ok(())
        );
    }

    #[test]
    fn a_value_without_its_prefix_or_a_tampered_body_is_invalid() {
        let mollie = verifier("mollie", &["current"]);
        let good = signature("current");
        let bare = headers(&[("X-Mollie-Signature", &good["sha256=".len()..])]);
        assert_eq!(mollie.verify(&bare, BODY, 0), Err(SignatureError::Invalid));
        let sent = headers(&[("X-Mollie-Signature", &good)]);
        assert_eq!(mollie.verify(&sent, b"{}", 0), Err(SignatureError::Invalid));
        assert_eq!(
            mollie.verify(&headers(&[]), BODY, 0),
            Err(SignatureError::Invalid)
        );
    }
}
