//! Paddle Billing: `Paddle-Signature: ts=<unix seconds>;h1=<hex>[;h1=<hex>...]`, an HMAC-SHA256
//! of `{ts}:{body}` keyed by the notification destination's secret key, used as text. Several
//! `h1` entries come while a secret is being rotated.

use std::sync::Arc;
use std::time::Duration;

use super::family::{stamp_and_tags, text_keys_only, verify_stamped};
use super::mac::{hex_tags, json_text, required_header, tag_of, Clock};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};

/// A Paddle source: its secret keys, as text, and its tolerance.
#[derive(Debug)]
pub struct Paddle {
    keys: Keys,
    tolerance: Duration,
}

/// Builds a Paddle source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Paddle {
        keys: text_keys_only(settings)?,
        tolerance: settings.tolerance,
    }))
}

const SIGNATURE: &str = "Paddle-Signature";

impl Provider for Paddle {
    fn scheme(&self) -> &'static str {
        "paddle"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let header = required_header(headers, SIGNATURE)?;
        let (timestamp, candidates) = stamp_and_tags(header, ';', "ts", "h1");
        let raw = timestamp.ok_or(SignatureError::Invalid)?;
        let signed: [&[u8]; 3] = [raw.as_bytes(), b":", body];
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

    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/event_id"),
            event_type: json_text(json, "/event_type"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
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
        let tag = tag_of(self.keys.first(), &[stamp.as_bytes(), b":", body]);
        vec![(
            SIGNATURE.to_owned(),
            format!("ts={stamp};h1={}", hex::encode(tag)),
        )]
    }

    /// Paddle sends one notification per destination and retries it as is; a replay (from the
    /// dashboard or `POST /notifications/{id}/replay`) is a new notification of the same event,
    /// with a new `notification_id`.
    fn volatile_fields(&self) -> &'static [&'static str] {
        &["/notification_id"]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(72 * 3600),
            "Paddle retries a failed notification up to 60 times over 3 days",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const SECRET: &str = "pdl_ntfset_test_secret";
    const BODY: &[u8] =
        br#"{"event_id":"evt_01","event_type":"transaction.completed","notification_id":"ntf_01"}"#;
    const NOW: i64 = 1_763_649_000;

    #[test]
    fn sign_verifies_and_a_rotated_h1_list_matches_any_secret() {
        let paddle = verifier("paddle", &[SECRET]);
        let signed = paddle.sign(BODY, NOW, "evt_01", None);
        assert!(signed[0].1.starts_with(&format!("ts={NOW};h1=")));
        assert_eq!(paddle.verify(&signed, BODY, NOW + 300), Ok(()));
        let rotated = format!("ts={NOW};h1={};{}", "ab".repeat(32), &signed[0].1[14..]);
        let rotated = headers(&[("Paddle-Signature", &rotated)]);
        assert_eq!(paddle.verify(&rotated, BODY, NOW), Ok(()));
        let two = verifier("paddle", &["old", SECRET]);
        assert_eq!(two.verify(&signed, BODY, NOW), Ok(()));
    }

    #[test]
    fn the_timestamp_is_signed_and_judged_both_ways() {
        let paddle = verifier("paddle", &[SECRET]);
        let signed = paddle.sign(BODY, NOW, "evt_01", None);
        assert_eq!(
            paddle.verify(&signed, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            paddle.verify(&signed, BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
        let moved = signed[0]
            .1
            .replace(&NOW.to_string(), &(NOW + 1).to_string());
        let moved = headers(&[("Paddle-Signature", &moved)]);
        assert_eq!(
            paddle.verify(&moved, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_or_empty_signature_is_invalid() {
        let paddle = verifier("paddle", &[SECRET]);
        for value in [
            "",
            "ts=1763649000",
            "ts=1763649000;h1=",
            "h1=00",
            "ts=;h1=00",
        ] {
            let sent = headers(&[("Paddle-Signature", value)]);
            assert_eq!(
                paddle.verify(&sent, BODY, NOW),
                Err(SignatureError::Invalid),
                "{value}"
            );
        }
    }

    #[test]
    fn identify_reads_event_id_and_type_from_the_body() {
        let paddle = verifier("paddle", &[SECRET]);
        let json = serde_json::from_slice(BODY).expect("JSON");
        let identity = paddle.identify(&headers(&[]), Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("evt_01"));
        assert_eq!(
            identity.event_type.as_deref(),
            Some("transaction.completed")
        );
        assert_eq!(paddle.volatile_fields(), ["/notification_id"]);
    }
}
