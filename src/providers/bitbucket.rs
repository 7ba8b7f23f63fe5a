//! Bitbucket Cloud: `X-Hub-Signature: sha256=<hex>`, an HMAC-SHA256 of the raw body keyed by the
//! webhook's secret. The id is `X-Request-UUID`, the type `X-Event-Key` (`repo:push`). Bitbucket
//! signs no timestamp.

use std::sync::Arc;

use super::family::{HeaderMac, HeaderSigned, TagText};
use super::{Provider, ProviderError, Settings};

/// Bitbucket's rules. Bitbucket says nothing of how long it retries.
const BITBUCKET: HeaderSigned = HeaderSigned {
    scheme: "bitbucket",
    // One signature, hex after `sha256=`, of the body.
    mac: HeaderMac {
        header: "X-Hub-Signature",
        prefix: "sha256=",
        text: TagText::Hex,
    },
    id: "X-Request-UUID",
    kind: "X-Event-Key",
    horizon: None,
};

/// Builds a Bitbucket source: its webhook secrets, used as text; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    BITBUCKET.build(settings)
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
