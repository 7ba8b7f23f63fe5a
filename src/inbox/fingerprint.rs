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
            // Serialized straight into the hasher, member by member, as `{"k":v,...}` would
            // be: nothing is copied. serde_json's map keeps its keys sorted.
            let mut hasher = HashWriter(Sha256::new());
            hasher.0.update(b"{");
            let mut first = true;
            for (key, value) in map.iter().filter(|(k, _)| !volatile.contains(&k.as_str())) {
                if !first {
                    hasher.0.update(b",");
                }
                first = false;
                serde_json::to_writer(&mut hasher, key).expect("hashing cannot fail");
                hasher.0.update(b":");
                serde_json::to_writer(&mut hasher, value).expect("hashing cannot fail");
            }
            hasher.0.update(b"}");
            hasher.0.finalize().into()
        }
        _ => Sha256::digest(body).into(),
    }
}

/// Lets serde_json write into a hash.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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
    fn the_stripe_fingerprint_is_the_hash_of_the_canonical_json_without_pending_webhooks() {
        let body = r#"{"type":"a", "id":"evt_1","pending_webhooks":3,"data":{"b":1,"a":[1,"x"]}}"#;
        let canonical = r#"{"data":{"a":[1,"x"],"b":1},"id":"evt_1","type":"a"}"#;
        let expected: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
        assert_eq!(of(&Scheme::Stripe, body), expected);
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
