//! Slack: `X-Slack-Signature: v0=<hex>` with `X-Slack-Request-Timestamp`, an HMAC-SHA256 of
//! `v0:{timestamp}:{body}` keyed by the app's signing secret as text.

use std::sync::Arc;
use std::time::Duration;

use super::family::{lowercase, text_keys_only, v0, v0_content, verify_stamped, HeaderMac};
use super::mac::{json_text, required_header, Clock};
use super::SignatureError;
use super::{Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Refusal, Settings};

/// A Slack app's source: its signing secrets, used as text, and its tolerance.
#[derive(Debug)]
pub struct Slack {
    keys: Keys,
    tolerance: Duration,
}

/// Builds a Slack source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Slack {
        keys: text_keys_only(settings)?,
        tolerance: settings.tolerance,
    }))
}

impl Provider for Slack {
    fn scheme(&self) -> &'static str {
        "slack"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        // One `v0=` signature.
        let tags = SIGNATURE.tags(headers)?;
        let raw = required_header(headers, TIMESTAMP)?;
        verify_stamped(
            &self.keys,
            Clock::new(now, self.tolerance),
            raw,
            &v0_content(raw, body),
            &tags,
        )
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// An Events API callback names itself in `event_id` and carries the inner event's type in
    /// `event.type`; other requests (e.g. `url_verification`) have only a top-level `type`.
    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/event_id"),
            event_type: json_text(json, "/event/type").or_else(|| json_text(json, "/type")),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        // The id and type travel in the body.
        lowercase(&[SIGNATURE.header, TIMESTAMP])
    }

    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let stamp = timestamp.to_string();
        let signature = SIGNATURE.sign(&self.keys, &v0_content(&stamp, body));
        vec![signature, (TIMESTAMP.to_owned(), stamp)]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(6 * 60),
            "Slack retries a failed event three times: at once, then 1 and 5 minutes later",
        ))
    }

    /// The `url_verification` request Slack sends when an app's request URL is set: answered
    /// with its `challenge`, never stored.
    fn handshake(
        &self,
        _inbound: &Inbound<'_>,
        json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        let json = json?;
        if json.get("type")?.as_str()? != "url_verification" {
            return None;
        }
        let Some(challenge) = json.get("challenge").and_then(|c| c.as_str()) else {
            return Some(Err(Refusal::Malformed(
                "a url_verification request carries its challenge as a string, and this one does not",
            )));
        };
        Some(Ok(Answer {
            status: 200,
            content_type: "application/json",
            body: serde_json::json!({ "challenge": challenge })
                .to_string()
                .into_bytes(),
        }))
    }
}

const SIGNATURE: HeaderMac = v0("X-Slack-Signature");
const TIMESTAMP: &str = "X-Slack-Request-Timestamp";

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::{Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;

    // Slack's documented example.
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const NOW: i64 = 1_531_420_618;
    const GOOD: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    const WRONG: &str = "v0=0000000000000000000000000000000000000000000000000000000000000000";

    fn slack(secrets: &[&str]) -> Verifier {
        verifier("slack", secrets)
    }

    fn request(signature: &str) -> Vec<(String, String)> {
        let stamp = NOW.to_string();
        headers(&[
            ("X-Slack-Signature", signature),
            ("X-Slack-Request-Timestamp", &stamp),
        ])
    }

    #[test]
    fn the_redelivery_horizon_covers_the_retry_five_minutes_after_the_one_at_one_minute() {
        let (horizon, why) = slack(&[SECRET]).redelivery_horizon().expect("a horizon");
        assert_eq!(horizon, std::time::Duration::from_secs(360));
        assert!(why.contains("5 minutes"), "{why}");
    }

    #[test]
    fn a_valid_signature_passes() {
        assert_eq!(slack(&[SECRET]).verify(&request(GOOD), BODY, NOW), Ok(()));
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        assert_eq!(
            slack(&["8f742231b10e8888abcd99yyyzzz85a6"]).verify(&request(GOOD), BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_is_invalid() {
        let tampered = String::from_utf8_lossy(BODY).replace("roadrunner", "coyote");
        assert_eq!(
            slack(&[SECRET]).verify(&request(GOOD), tampered.as_bytes(), NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_reserialized_body_is_invalid() {
        let verifier = slack(&[SECRET]);
        let body = br#"{"event_id":"Ev1","event":{"type":"message"}}"#;
        let signed = verifier.sign(body, NOW, "Ev1", None);
        assert_eq!(
            verifier.verify(
                &signed,
                br#"{"event_id": "Ev1", "event": {"type": "message"}}"#,
                NOW
            ),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        let verifier = slack(&[SECRET]);
        for missing in 0..2 {
            let mut partial = request(GOOD);
            partial.remove(missing);
            assert_eq!(
                verifier.verify(&partial, BODY, NOW),
                Err(SignatureError::Invalid),
                "without header #{missing}"
            );
        }
    }

    #[test]
    fn an_empty_truncated_or_unversioned_signature_never_matches() {
        let verifier = slack(&[SECRET]);
        for signature in [
            "",
            "v0=",
            &GOOD[..GOOD.len() - 2],
            &GOOD[..GOOD.len() - 1],
            &GOOD["v0=".len()..],
            "v1=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503",
        ] {
            assert_eq!(
                verifier.verify(&request(signature), BODY, NOW),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
    }

    #[test]
    fn the_second_of_two_secrets_may_be_the_right_one() {
        assert_eq!(
            slack(&["old signing secret", SECRET]).verify(&request(GOOD), BODY, NOW),
            Ok(())
        );
    }

    #[test]
    fn several_signatures_in_one_header_are_not_a_slack_format() {
        let list = format!("{WRONG},{GOOD}");
        assert_eq!(
            slack(&[SECRET]).verify(&request(&list), BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_valid_signature_too_old_or_too_new_is_stale() {
        let verifier = slack(&[SECRET]);
        assert_eq!(verifier.verify(&request(GOOD), BODY, NOW - 300), Ok(()));
        assert_eq!(
            verifier.verify(&request(GOOD), BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verifier.verify(&request(GOOD), BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn a_wrong_signature_with_a_stale_timestamp_is_invalid() {
        assert_eq!(
            slack(&[SECRET]).verify(&request(WRONG), BODY, NOW + 10_000),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_malformed_timestamp_is_invalid() {
        let verifier = slack(&[SECRET]);
        let mut bad = request(GOOD);
        bad[1].1 = "soon".to_owned();
        assert_eq!(
            verifier.verify(&bad, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn sign_output_verifies() {
        let verifier = slack(&[SECRET]);
        let signed = verifier.sign(BODY, NOW, "unused", Some("unused"));
        assert_eq!(signed, request(GOOD));
        assert_eq!(verifier.verify(&signed, BODY, NOW), Ok(()));
    }

    #[test]
    fn identify_prefers_the_inner_event_type() {
        let verifier = slack(&[SECRET]);
        let none = headers(&[]);
        let callback = serde_json::json!({
            "type": "event_callback", "event_id": "Ev08MFMKH6", "event": {"type": "app_mention"}
        });
        let identity = verifier.identify(&none, Some(&callback));
        assert_eq!(identity.event_id.as_deref(), Some("Ev08MFMKH6"));
        assert_eq!(identity.event_type.as_deref(), Some("app_mention"));

        let verification = serde_json::json!({"type": "url_verification", "challenge": "x"});
        let identity = verifier.identify(&none, Some(&verification));
        assert_eq!(identity.event_id, None);
        assert_eq!(identity.event_type.as_deref(), Some("url_verification"));

        let numeric = serde_json::json!({"event_id": 7, "event": {"type": 3}, "type": "outer"});
        let identity = verifier.identify(&none, Some(&numeric));
        assert_eq!(identity.event_id.as_deref(), Some("7"));
        assert_eq!(identity.event_type.as_deref(), Some("3"));
        assert!(verifier.needs_json());
    }
}
