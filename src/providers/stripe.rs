//! Stripe: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`, an HMAC-SHA256 of
//! `{t}.{body}` keyed by the whole secret string, `whsec_` and all.

use std::sync::Arc;
use std::time::Duration;

use super::family::{stamp_and_tags, text_keys_only, verify_stamped};
use super::mac::{hex_tags, json_text, required_header, tag_of, Clock};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Stripe source: its signing secrets, used whole (`whsec_` and all), and its tolerance.
#[derive(Debug)]
pub struct Stripe {
    keys: Keys,
    tolerance: Duration,
}

/// Builds a Stripe source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Stripe {
        keys: text_keys_only(settings)?,
        tolerance: settings.tolerance,
    }))
}

impl Provider for Stripe {
    fn scheme(&self) -> &'static str {
        "stripe"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        // Only `v1` entries count: `v0` is Stripe's test-mode scheme and other schemes may be
        // added, and none of them is something this secret signs.
        let header = required_header(headers, SIGNATURE)?;
        let (timestamp, candidates) = stamp_and_tags(header, ',', "t", "v1");
        let raw = timestamp.ok_or(SignatureError::Invalid)?;
        let signed: [&[u8]; 3] = [raw.as_bytes(), b".", body];
        verify_stamped(
            &self.keys,
            Clock::new(now, self.tolerance),
            raw,
            &signed,
            &hex_tags(candidates),
        )
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// A Stripe event names itself in the body: `id` and `type`.
    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/id"),
            event_type: json_text(json, "/type"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        // The id and type travel in the body.
        vec![SIGNATURE.to_ascii_lowercase()]
    }

    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let stamp = timestamp.to_string();
        let tag = tag_of(self.keys.first(), &[stamp.as_bytes(), b".", body]);
        vec![(
            SIGNATURE.to_owned(),
            format!("t={stamp},v1={}", hex::encode(tag)),
        )]
    }

    /// Stripe counts down `pending_webhooks` as other endpoints acknowledge the event, so a
    /// retry of the same event carries a different number.
    fn volatile_fields(&self) -> &'static [&'static str] {
        &["/pending_webhooks"]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(72 * 3600),
            "Stripe retries automatically for up to 3 days",
        ))
    }
}

const SIGNATURE: &str = "Stripe-Signature";

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::{Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;

    const SECRET: &str = "whsec_test_secret";
    const BODY: &[u8] = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";
    const NOW: i64 = 1_700_000_000;
    // From the shared vectors: stripe-python's generate_signature_header over BODY at NOW.
    const GOOD: &str = "4f1cd7feda9826e746b7d482c4badebb657398df1099e1046364f6196a230150";
    const WRONG: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    fn stripe(secrets: &[&str]) -> Verifier {
        verifier("stripe", secrets)
    }

    fn check(
        verifier: &Verifier,
        header: &str,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        verifier.verify(&headers(&[("Stripe-Signature", header)]), body, now)
    }

    #[test]
    fn a_valid_signature_passes() {
        let header = format!("t={NOW},v1={GOOD}");
        assert_eq!(check(&stripe(&[SECRET]), &header, BODY, NOW), Ok(()));
    }

    #[test]
    fn spaces_around_items_and_other_schemes_are_tolerated() {
        let header = format!("t = {NOW} , v0=abc, v1 = {GOOD} ,junk");
        assert_eq!(check(&stripe(&[SECRET]), &header, BODY, NOW), Ok(()));
    }

    #[test]
    fn the_secret_is_used_whole_not_decoded() {
        let header = format!("t={NOW},v1={GOOD}");
        assert_eq!(
            check(&stripe(&["test_secret"]), &header, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        let header = format!("t={NOW},v1={GOOD}");
        assert_eq!(
            check(&stripe(&["whsec_other"]), &header, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_is_invalid() {
        let header = format!("t={NOW},v1={GOOD}");
        let tampered = String::from_utf8_lossy(BODY).replace("evt_test", "evt_fake");
        assert_eq!(
            check(&stripe(&[SECRET]), &header, tampered.as_bytes(), NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_reserialized_body_is_invalid() {
        let json: serde_json::Value = serde_json::from_slice(BODY).expect("test body is JSON");
        let compact = serde_json::to_vec(&json).expect("serializes");
        assert_ne!(compact, BODY);
        let header = format!("t={NOW},v1={GOOD}");
        assert_eq!(
            check(&stripe(&[SECRET]), &header, &compact, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        let none: Vec<(String, String)> = Vec::new();
        assert_eq!(
            stripe(&[SECRET]).verify(&none, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn malformed_headers_are_invalid() {
        let verifier = stripe(&[SECRET]);
        for header in [
            String::new(),
            format!("v1={GOOD}"),
            format!("t={NOW}"),
            format!("t=,v1={GOOD}"),
            format!("t=-{NOW},v1={GOOD}"),
            format!("t={NOW}.0,v1={GOOD}"),
            format!("t={NOW};v1={GOOD}"),
            "garbage".to_owned(),
        ] {
            assert_eq!(
                check(&verifier, &header, BODY, NOW),
                Err(SignatureError::Invalid),
                "{header:?}"
            );
        }
    }

    #[test]
    fn an_empty_or_truncated_signature_never_matches() {
        let verifier = stripe(&[SECRET]);
        for tag in ["", &GOOD[..32], &GOOD[..63], &GOOD[1..], "zz"] {
            let header = format!("t={NOW},v1={tag}");
            assert_eq!(
                check(&verifier, &header, BODY, NOW),
                Err(SignatureError::Invalid),
                "{tag:?}"
            );
        }
    }

    #[test]
    fn v0_only_is_invalid() {
        let header = format!("t={NOW},v0={GOOD}");
        assert_eq!(
            check(&stripe(&[SECRET]), &header, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn the_second_of_several_signatures_may_be_the_right_one() {
        let header = format!("t={NOW},v1={WRONG},v1={GOOD}");
        assert_eq!(check(&stripe(&[SECRET]), &header, BODY, NOW), Ok(()));
    }

    #[test]
    fn the_second_of_two_secrets_may_be_the_right_one() {
        let header = format!("t={NOW},v1={GOOD}");
        assert_eq!(
            check(&stripe(&["whsec_old", SECRET]), &header, BODY, NOW),
            Ok(())
        );
    }

    #[test]
    fn only_the_first_timestamp_counts() {
        let header = format!("t={NOW},t=1,v1={GOOD}");
        assert_eq!(check(&stripe(&[SECRET]), &header, BODY, NOW), Ok(()));
        let header = format!("t=1,t={NOW},v1={GOOD}");
        assert_eq!(
            check(&stripe(&[SECRET]), &header, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_valid_signature_too_old_or_too_new_is_stale() {
        let header = format!("t={NOW},v1={GOOD}");
        let verifier = stripe(&[SECRET]);
        assert_eq!(check(&verifier, &header, BODY, NOW + 300), Ok(()));
        assert_eq!(check(&verifier, &header, BODY, NOW - 300), Ok(()));
        assert_eq!(
            check(&verifier, &header, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            check(&verifier, &header, BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn a_wrong_signature_with_a_stale_timestamp_is_invalid() {
        let header = format!("t={NOW},v1={WRONG}");
        assert_eq!(
            check(&stripe(&[SECRET]), &header, BODY, NOW + 10_000),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_huge_timestamp_neither_overflows_nor_passes() {
        let verifier = stripe(&[SECRET]);
        let stamp = "99999999999999999999999999";
        // Signed by hand: `sign` takes an i64, and this stamp does not fit one.
        let tag = super::super::mac::tag_of(SECRET.as_bytes(), &[stamp.as_bytes(), b".", BODY]);
        let header = format!("t={stamp},v1={}", hex::encode(tag));
        assert_eq!(
            check(&verifier, &header, BODY, NOW),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn sign_output_verifies() {
        let verifier = stripe(&[SECRET, "whsec_next"]);
        let signed = verifier.sign(BODY, NOW, "evt_test_webhook", Some("charge.succeeded"));
        assert_eq!(signed.len(), 1);
        assert_eq!(signed[0].0, "Stripe-Signature");
        assert_eq!(signed[0].1, format!("t={NOW},v1={GOOD}"));
        assert_eq!(verifier.verify(&signed, BODY, NOW), Ok(()));
    }

    #[test]
    fn identify_reads_id_and_type_from_the_body() {
        let verifier = stripe(&[SECRET]);
        let none: Vec<(String, String)> = Vec::new();
        let json = serde_json::json!({"id": "evt_1", "type": "charge.succeeded"});
        let identity = verifier.identify(&none, Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("evt_1"));
        assert_eq!(identity.event_type.as_deref(), Some("charge.succeeded"));
        let numeric = serde_json::json!({"id": 12345, "type": ["not", "text"]});
        let identity = verifier.identify(&none, Some(&numeric));
        assert_eq!(identity.event_id.as_deref(), Some("12345"));
        assert_eq!(identity.event_type, None);
        assert_eq!(verifier.identify(&none, None), Default::default());
        assert!(verifier.needs_json());
        assert_eq!(verifier.kept_headers(), ["stripe-signature"]);
    }
}
