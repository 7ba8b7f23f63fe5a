//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, an HMAC-SHA256 of the body keyed by the app's
//! client secret.

use std::sync::Arc;
use std::time::Duration;

use super::family::{HeaderMac, HeaderSigned, TagText};
use super::{Provider, ProviderError, Settings};

/// Shopify's rules. Shopify signs no timestamp.
const SHOPIFY: HeaderSigned = HeaderSigned {
    scheme: "shopify",
    // One base64 signature of the body.
    mac: HeaderMac {
        header: "X-Shopify-Hmac-Sha256",
        prefix: "",
        text: TagText::Base64,
    },
    id: "X-Shopify-Webhook-Id",
    kind: "X-Shopify-Topic",
    horizon: Some((
        Duration::from_secs(4 * 3600),
        "Shopify retries for about 4 hours",
    )),
};

/// Builds a Shopify source: its webhook secrets, used as text; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    SHOPIFY.build(settings)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::{Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;

    // From the shared vectors.
    const SECRET: &str = "hush";
    const BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    const GOOD: &str = "D0UMXmhjwBRi4y66TmhJrDlhQABD7zI2fm3p6/QLMo8=";

    fn shopify(secrets: &[&str]) -> Verifier {
        verifier("shopify", secrets)
    }

    fn check(verifier: &Verifier, signature: &str, body: &[u8]) -> Result<(), SignatureError> {
        verifier.verify(&headers(&[("X-Shopify-Hmac-SHA256", signature)]), body, 0)
    }

    #[test]
    fn a_valid_signature_passes() {
        assert_eq!(check(&shopify(&[SECRET]), GOOD, BODY), Ok(()));
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        assert_eq!(
            check(&shopify(&["Hush"]), GOOD, BODY),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_is_invalid() {
        let tampered = br#"{"id":820982911946154509,"email":"jon@example.com"}"#;
        assert_eq!(
            check(&shopify(&[SECRET]), GOOD, tampered),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_reserialized_body_is_invalid() {
        let spaced = br#"{"id": 820982911946154508, "email": "jon@example.com"}"#;
        assert_eq!(
            check(&shopify(&[SECRET]), GOOD, spaced),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        assert_eq!(
            shopify(&[SECRET]).verify(&headers(&[]), BODY, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn an_empty_truncated_or_undecodable_signature_never_matches() {
        let verifier = shopify(&[SECRET]);
        for signature in [
            "",
            "=",
            &GOOD[..GOOD.len() - 4],
            "D0UMXmhjwBRi4y66TmhJrDlhQABD7zI2fm3p6/QLMo8",
            "D0UMXmhjwBRi4y66TmhJrDlhQABD7zI2fm3p6_QLMo8=",
            "not base64 at all",
        ] {
            assert_eq!(
                check(&verifier, signature, BODY),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
    }

    #[test]
    fn the_second_of_two_secrets_may_be_the_right_one() {
        assert_eq!(check(&shopify(&["old", SECRET]), GOOD, BODY), Ok(()));
    }

    #[test]
    fn several_signatures_in_one_header_are_not_a_shopify_format() {
        let list = format!("{} {GOOD}", "A".repeat(43) + "=");
        assert_eq!(
            check(&shopify(&[SECRET]), &list, BODY),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn sign_output_verifies_and_carries_id_and_topic() {
        let verifier = shopify(&[SECRET]);
        let signed = verifier.sign(BODY, 0, "b54557e4", Some("orders/create"));
        assert_eq!(
            signed,
            headers(&[
                ("X-Shopify-Hmac-Sha256", GOOD),
                ("X-Shopify-Webhook-Id", "b54557e4"),
                ("X-Shopify-Topic", "orders/create"),
            ])
        );
        assert_eq!(verifier.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(verifier.sign(BODY, 0, "b54557e4", None).len(), 2);
    }

    #[test]
    fn identify_reads_the_webhook_id_and_topic_headers() {
        let verifier = shopify(&[SECRET]);
        let delivery = headers(&[
            ("x-shopify-webhook-id", "b54557e4"),
            ("x-shopify-topic", "orders/create"),
        ]);
        let json = serde_json::json!({"id": 820982911946154508_u64});
        let identity = verifier.identify(&delivery, Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("b54557e4"));
        assert_eq!(identity.event_type.as_deref(), Some("orders/create"));
        assert_eq!(
            verifier.identify(&headers(&[]), Some(&json)),
            Default::default()
        );
        assert!(!verifier.needs_json());
    }
}
