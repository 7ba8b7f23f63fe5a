//! The payload fingerprint: how a redelivery is told apart from a reused id.

use sha2::{Digest, Sha256};

use crate::signature::Scheme;

/// Top-level fields a provider changes between deliveries of one event, by scheme. Stripe
/// counts down `pending_webhooks` as other endpoints acknowledge the event, so a retry of the
/// same event carries a different number.
fn volatile_fields(scheme: &Scheme) -> &'static [&'static str] {
    match scheme {
        Scheme::Stripe => &["pending_webhooks"],
        _ => &[],
    }
}

/// SHA-256 of the payload. For a scheme with volatile fields and a JSON object body, the hash
/// is over the body re-serialized without them (keys sorted, no whitespace); otherwise over the
/// raw bytes, so any change at all counts as a different payload.
pub fn fingerprint(scheme: &Scheme, body: &[u8], json: Option<&serde_json::Value>) -> [u8; 32] {
    let volatile = volatile_fields(scheme);
    match json {
        Some(serde_json::Value::Object(map)) if !volatile.is_empty() => {
            let kept: serde_json::Map<String, serde_json::Value> = map
                .iter()
                .filter(|(key, _)| !volatile.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            let canonical = serde_json::to_vec(&kept).expect("a JSON value always serializes");
            Sha256::digest(canonical).into()
        }
        _ => Sha256::digest(body).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(scheme: &Scheme, body: &str) -> [u8; 32] {
        let json = serde_json::from_str(body).ok();
        fingerprint(scheme, body.as_bytes(), json.as_ref())
    }

    #[test]
    fn stripe_ignores_pending_webhooks_only() {
        let first = of(
            &Scheme::Stripe,
            r#"{"id":"evt_1","pending_webhooks":3,"type":"a"}"#,
        );
        let retry = of(
            &Scheme::Stripe,
            r#"{"id":"evt_1","pending_webhooks":1,"type":"a"}"#,
        );
        let other = of(
            &Scheme::Stripe,
            r#"{"id":"evt_1","pending_webhooks":1,"type":"b"}"#,
        );
        assert_eq!(first, retry);
        assert_ne!(first, other);
    }

    #[test]
    fn other_schemes_hash_the_raw_bytes() {
        let a = of(&Scheme::Github, r#"{"a":1,"pending_webhooks":1}"#);
        let b = of(&Scheme::Github, r#"{"a":1,"pending_webhooks":2}"#);
        let c = of(&Scheme::Github, r#"{"a": 1,"pending_webhooks":1}"#);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, of(&Scheme::Github, r#"{"a":1,"pending_webhooks":1}"#));
    }
}
