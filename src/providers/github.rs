//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, an HMAC-SHA256 of the body. The older SHA-1
//! `X-Hub-Signature` is not accepted: GitHub sends both, and SHA-1 adds nothing but risk.

use std::sync::Arc;
use std::time::Duration;

use super::family::{HeaderMac, HeaderSigned, TagText};
use super::{Provider, ProviderError, Settings};

/// GitHub's rules. GitHub signs no timestamp.
const GITHUB: HeaderSigned = HeaderSigned {
    scheme: "github",
    // One signature, hex after `sha256=`, of the body.
    mac: HeaderMac {
        header: "X-Hub-Signature-256",
        prefix: "sha256=",
        text: TagText::Hex,
    },
    id: "X-GitHub-Delivery",
    kind: "X-GitHub-Event",
    horizon: Some((
        Duration::from_secs(72 * 3600),
        "GitHub lets deliveries be redelivered for 3 days",
    )),
};

/// Builds a GitHub source: its webhook secrets, used as text; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    GITHUB.build(settings)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::{Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;

    // GitHub's documented example.
    const SECRET: &str = "It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    const GOOD: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn github(secrets: &[&str]) -> Verifier {
        verifier("github", secrets)
    }

    fn check(verifier: &Verifier, signature: &str, body: &[u8]) -> Result<(), SignatureError> {
        verifier.verify(&headers(&[("X-Hub-Signature-256", signature)]), body, 0)
    }

    #[test]
    fn a_valid_signature_passes_in_either_hex_case() {
        assert_eq!(check(&github(&[SECRET]), GOOD, BODY), Ok(()));
        let upper = format!("sha256={}", GOOD["sha256=".len()..].to_uppercase());
        assert_eq!(check(&github(&[SECRET]), &upper, BODY), Ok(()));
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        assert_eq!(
            check(&github(&["It's a secret to everybody"]), GOOD, BODY),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_is_invalid() {
        assert_eq!(
            check(&github(&[SECRET]), GOOD, b"Hello, World?"),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_reserialized_body_is_invalid() {
        let verifier = github(&[SECRET]);
        let body = br#"{"action":"opened"}"#;
        let signed = verifier.sign(body, 0, "d-1", None);
        assert_eq!(
            verifier.verify(&signed, br#"{ "action": "opened" }"#, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        let none = headers(&[("X-Hub-Signature", "sha1=abc")]);
        assert_eq!(
            github(&[SECRET]).verify(&none, BODY, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn an_empty_truncated_or_unprefixed_signature_never_matches() {
        let verifier = github(&[SECRET]);
        for signature in [
            "",
            "sha256=",
            &GOOD[..GOOD.len() - 1],
            &GOOD[..GOOD.len() - 2],
            &GOOD["sha256=".len()..],
            "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "SHA256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
            "sha256=zz",
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
        assert_eq!(check(&github(&["old secret", SECRET]), GOOD, BODY), Ok(()));
    }

    #[test]
    fn several_signatures_in_one_header_are_not_a_github_format() {
        // GitHub sends exactly one; a list is malformed, not a chance to try more guesses.
        let list = format!("sha256={},{GOOD}", "0".repeat(64));
        assert_eq!(
            check(&github(&[SECRET]), &list, BODY),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn sign_output_verifies_and_carries_id_and_type() {
        let verifier = github(&[SECRET, "next"]);
        let signed = verifier.sign(BODY, 0, "72d3162e", Some("push"));
        assert_eq!(
            signed,
            headers(&[
                ("X-Hub-Signature-256", GOOD),
                ("X-GitHub-Delivery", "72d3162e"),
                ("X-GitHub-Event", "push"),
            ])
        );
        assert_eq!(verifier.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(verifier.sign(BODY, 0, "72d3162e", None).len(), 2);
    }

    #[test]
    fn identify_reads_the_delivery_and_event_headers() {
        let verifier = github(&[SECRET]);
        let delivery = headers(&[
            ("x-github-delivery", "72d3162e"),
            ("x-github-event", "push"),
        ]);
        let json = serde_json::json!({"id": "not this"});
        let identity = verifier.identify(&delivery, Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("72d3162e"));
        assert_eq!(identity.event_type.as_deref(), Some("push"));
        assert_eq!(
            verifier.identify(&headers(&[]), Some(&json)),
            Default::default()
        );
        assert!(!verifier.needs_json());
        assert_eq!(
            verifier.kept_headers(),
            ["x-hub-signature-256", "x-github-delivery", "x-github-event"]
        );
    }
}
