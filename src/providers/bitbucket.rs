//! Bitbucket Cloud: `X-Hub-Signature: sha256=<hex>`, an HMAC-SHA256 of the raw body keyed by the
//! webhook's secret. The id is `X-Request-UUID`, the type `X-Event-Key` (`repo:push`). Bitbucket
//! signs no timestamp.

use std::sync::Arc;

use super::family::{lowercase, text_keys_only, with_id_and_type, HeaderMac, TagText};
use super::mac::header_text;
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Bitbucket source: its webhook secrets, used as text.
#[derive(Debug)]
pub struct Bitbucket {
    keys: Keys,
}

/// Builds a Bitbucket source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Bitbucket {
        keys: text_keys_only(settings)?,
    }))
}

/// One signature, hex after `sha256=`, of the body.
const SIGNATURE: HeaderMac = HeaderMac {
    header: "X-Hub-Signature",
    prefix: "sha256=",
    text: TagText::Hex,
};
const REQUEST: &str = "X-Request-UUID";
const EVENT: &str = "X-Event-Key";

impl Provider for Bitbucket {
    fn scheme(&self) -> &'static str {
        "bitbucket"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        SIGNATURE.verify(&self.keys, headers, &[body])
    }

    fn needs_json(&self) -> bool {
        false
    }

    fn identify(&self, headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_text(headers, REQUEST),
            event_type: header_text(headers, EVENT),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        lowercase(&[SIGNATURE.header, REQUEST, EVENT])
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        with_id_and_type(
            SIGNATURE.sign(&self.keys, &[body]),
            (REQUEST, event_id),
            (EVENT, event_type),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const BODY: &[u8] = br#"{"push":{"changes":[]}}"#;

    #[test]
    fn sign_verifies_with_either_secret_and_a_changed_body_does_not() {
        let signed = verifier("bitbucket", &["bbws_new"]).sign(BODY, 0, "req-1", Some("repo:push"));
        let two = verifier("bitbucket", &["bbws_old", "bbws_new"]);
        assert_eq!(two.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(two.verify(&signed, b"{}", 0), Err(SignatureError::Invalid));
        let identity = two.identify(&signed, None);
        assert_eq!(identity.event_id.as_deref(), Some("req-1"));
        assert_eq!(identity.event_type.as_deref(), Some("repo:push"));
    }

    #[test]
    fn only_sha256_with_its_prefix_is_taken() {
        let bitbucket = verifier("bitbucket", &["bbws_new"]);
        let signed = bitbucket.sign(BODY, 0, "req-1", None);
        let bare = signed[0].1.trim_start_matches("sha256=").to_owned();
        for value in [bare.as_str(), "sha1=00", "sha256=", ""] {
            let sent = headers(&[("X-Hub-Signature", value)]);
            assert_eq!(
                bitbucket.verify(&sent, BODY, 0),
                Err(SignatureError::Invalid),
                "{value:?}"
            );
        }
    }
}
