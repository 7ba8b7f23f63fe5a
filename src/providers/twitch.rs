//! Twitch EventSub: `Twitch-Eventsub-Message-Signature: sha256=<hex>`, an HMAC-SHA256 of
//! `{Message-Id}{Message-Timestamp}{body}` keyed by the subscription's secret. The timestamp is
//! RFC 3339 (with nanoseconds) and must be within tolerance, ten minutes unless the source sets
//! its own (Twitch's rule for a replayed message). The id is `Twitch-Eventsub-Message-Id`, the
//! type the body's `subscription.type`. A signed `webhook_callback_verification` is answered
//! with its `challenge` as `text/plain`, never stored.

use std::sync::Arc;
use std::time::Duration;

use super::family::text_keys_only;
use super::mac::{
    any_matches, header_id, header_text, hex_tags, json_text, matched, required_header,
};
use super::mac::{tag_of, Clock};
use super::{
    Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Refusal, Settings,
    SignatureError,
};

/// A Twitch source: its EventSub secrets, used as text, and its tolerance.
#[derive(Debug)]
pub struct Twitch {
    keys: Keys,
    tolerance: Duration,
}

/// Twitch's own window: a message older than ten minutes is to be refused as a replay.
const WINDOW: Duration = Duration::from_secs(600);

/// Builds a Twitch source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Twitch {
        keys: text_keys_only(settings)?,
        tolerance: if settings.tolerance_set {
            settings.tolerance
        } else {
            WINDOW
        },
    }))
}

const ID: &str = "Twitch-Eventsub-Message-Id";
const TIMESTAMP: &str = "Twitch-Eventsub-Message-Timestamp";
const SIGNATURE: &str = "Twitch-Eventsub-Message-Signature";
const KIND: &str = "Twitch-Eventsub-Message-Type";
const VERIFICATION: &str = "webhook_callback_verification";

/// The message type a body is sent as: a body that carries a `challenge` is a verification
/// (as hookbox reads one, see `handshake`), anything else a notification.
fn kind_of(body: &[u8]) -> &'static str {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if json.is_some_and(|json| json.get("challenge").is_some()) {
        VERIFICATION
    } else {
        "notification"
    }
}

/// What a capture keeps.
const KEPT_HEADERS: &[&str] = &[
    "twitch-eventsub-message-id",
    "twitch-eventsub-message-timestamp",
    "twitch-eventsub-message-signature",
    "twitch-eventsub-message-type",
];

impl Provider for Twitch {
    fn scheme(&self) -> &'static str {
        "twitch"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let id = required_header(headers, ID)?;
        let raw = required_header(headers, TIMESTAMP)?;
        let signature = required_header(headers, SIGNATURE)?;
        let encoded = signature
            .strip_prefix("sha256=")
            .ok_or(SignatureError::Invalid)?;
        let signed: [&[u8]; 3] = [id.as_bytes(), raw.as_bytes(), body];
        matched(any_matches(self.keys.all(), &signed, &hex_tags([encoded])))?;
        let timestamp = chrono::DateTime::parse_from_rfc3339(raw)
            .map_err(|_| SignatureError::Invalid)?
            .timestamp();
        Clock {
            now,
            tolerance: self.tolerance,
        }
        .check(timestamp)
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_id(headers, ID),
            event_type: json_text(json, "/subscription/type"),
        }
    }

    /// The id travels in a header, so `send --event-id` applies.
    fn id_in_body(&self) -> bool {
        false
    }

    fn kept_headers(&self) -> Vec<String> {
        KEPT_HEADERS.iter().map(|name| (*name).to_owned()).collect()
    }

    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let stamp = chrono::DateTime::from_timestamp(timestamp, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
        let tag = tag_of(
            self.keys.first(),
            &[event_id.as_bytes(), stamp.as_bytes(), body],
        );
        vec![
            (ID.to_owned(), event_id.to_owned()),
            (TIMESTAMP.to_owned(), stamp),
            (SIGNATURE.to_owned(), format!("sha256={}", hex::encode(tag))),
            (KIND.to_owned(), kind_of(body).to_owned()),
        ]
    }

    /// A verified `webhook_callback_verification`: its `challenge`, as it is.
    fn handshake(
        &self,
        inbound: &Inbound<'_>,
        json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        let verification =
            header_text(inbound.headers, KIND).is_some_and(|kind| kind.trim() == VERIFICATION);
        if !verification {
            // The message type is not signed: a genuine verification's signed body sent again
            // as a `notification` (or with no type) must not be stored as an event. Twitch's
            // notifications and revocations carry no `challenge`.
            return json.and_then(|j| j.get("challenge")).map(|_| {
                Err(Refusal::Malformed(
                    "a message that carries a challenge is a webhook_callback_verification, and \
                     its Twitch-Eventsub-Message-Type says otherwise",
                ))
            });
        }
        let Some(challenge) = json
            .and_then(|j| j.get("challenge"))
            .and_then(|c| c.as_str())
        else {
            return Some(Err(Refusal::Malformed(
                "a webhook_callback_verification message carries its challenge as a string, and \
                 this one does not",
            )));
        };
        Some(Ok(Answer {
            status: 200,
            content_type: "text/plain",
            body: challenge.as_bytes().to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{headers, post, verifier};
    use super::super::{Refusal, Scheme, SignatureError};
    use super::{KIND, VERIFICATION};
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;
    const BODY: &[u8] = br#"{"subscription":{"type":"stream.online"},"event":{}}"#;

    #[test]
    fn sign_verifies_with_rotation_and_the_id_is_signed() {
        let twitch = verifier("twitch", &["old-secret", "new-secret"]);
        let signed = verifier("twitch", &["new-secret"]).sign(BODY, NOW, "msg-1", None);
        assert_eq!(twitch.verify(&signed, BODY, NOW), Ok(()));
        let identity = twitch.identify(&signed, serde_json::from_slice(BODY).ok().as_ref());
        assert_eq!(identity.event_id.as_deref(), Some("msg-1"));
        assert_eq!(identity.event_type.as_deref(), Some("stream.online"));
        let mut other_id = signed.clone();
        other_id[0].1 = "msg-2".into();
        assert_eq!(
            twitch.verify(&other_id, BODY, NOW),
            Err(SignatureError::Invalid)
        );
        let unprefixed = headers(&[
            ("Twitch-Eventsub-Message-Id", "msg-1"),
            ("Twitch-Eventsub-Message-Timestamp", &signed[1].1),
            ("Twitch-Eventsub-Message-Signature", &signed[2].1[7..]),
        ]);
        assert_eq!(
            twitch.verify(&unprefixed, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn ten_minutes_unless_the_source_sets_its_own_tolerance() {
        let build = |tolerance: Option<Duration>| {
            Scheme::builtin("twitch")
                .expect("built in")
                .build_source(&[Secret::new("s")], tolerance)
                .expect("builds")
        };
        let signed = build(None).sign(BODY, NOW, "m", None);
        assert_eq!(build(None).verify(&signed, BODY, NOW + 600), Ok(()));
        assert_eq!(
            build(None).verify(&signed, BODY, NOW - 601),
            Err(SignatureError::Stale)
        );
        let set = build(Some(Duration::from_secs(300)));
        assert_eq!(
            set.verify(&signed, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn a_verification_is_answered_with_its_challenge() {
        let twitch = verifier("twitch", &["s"]);
        let body = br#"{"challenge":"pogchamp","subscription":{"type":"stream.online"}}"#;
        let mut signed = twitch.sign(body, NOW, "m", None);
        assert_eq!(
            signed[3],
            (KIND.to_owned(), VERIFICATION.to_owned()),
            "signed as a verification, as Twitch sends one"
        );
        let inbound = post(&signed, body, NOW);
        let json = serde_json::from_slice(body).ok();
        let answer = twitch
            .handshake(&inbound, json.as_ref())
            .expect("a handshake")
            .expect("answered");
        assert_eq!(answer.body, b"pogchamp");
        assert_eq!(answer.content_type, "text/plain");

        // A verification without a challenge to answer: refused, never taken for an event.
        for body in [
            &br#"{"subscription":{"type":"stream.online"}}"#[..],
            br#"{"challenge":12345,"subscription":{"type":"stream.online"}}"#,
            b"not json",
        ] {
            let inbound = post(&signed, body, NOW);
            let json = serde_json::from_slice(body).ok();
            assert!(
                matches!(
                    twitch.handshake(&inbound, json.as_ref()),
                    Some(Err(Refusal::Malformed(_)))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // Its signed body under another (unsigned) message type, or none: no event either.
        signed[3].1 = "notification".into();
        let inbound = post(&signed, body, NOW);
        assert!(matches!(
            twitch.handshake(&inbound, json.as_ref()),
            Some(Err(Refusal::Malformed(_)))
        ));
        signed.remove(3);
        let inbound = post(&signed, body, NOW);
        assert!(matches!(
            twitch.handshake(&inbound, json.as_ref()),
            Some(Err(Refusal::Malformed(_)))
        ));
        // A notification or a revocation is no handshake.
        for body in [
            BODY,
            br#"{"subscription":{"type":"stream.online","status":"x"}}"#,
        ] {
            let json = serde_json::from_slice(body).ok();
            assert!(twitch
                .handshake(&post(&signed, body, NOW), json.as_ref())
                .is_none());
        }
    }
}
