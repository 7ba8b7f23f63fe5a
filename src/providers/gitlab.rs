//! GitLab: no signature, but a secret token. `X-Gitlab-Token` must equal one of the source's
//! secrets, compared in constant time (over SHA-256 digests, so neither a prefix nor the
//! length leaks). The id is `Idempotency-Key` (GitLab 17.4+, the same on every retry of one
//! event), else `X-Gitlab-Event-UUID`; the type is `X-Gitlab-Event`.

use std::sync::Arc;

use super::family::text_keys_only;
use super::mac::{header_id, header_text, required_header};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};
use crate::secret::same_secret;

/// A GitLab source: its secret tokens, as text. GitLab signs nothing and sends no timestamp.
#[derive(Debug)]
pub struct Gitlab {
    keys: Keys,
}

/// Builds a GitLab source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Gitlab {
        keys: text_keys_only(settings)?,
    }))
}

const TOKEN: &str = "X-Gitlab-Token";
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
const EVENT_UUID: &str = "X-Gitlab-Event-UUID";
const EVENT: &str = "X-Gitlab-Event";

/// What a capture keeps: the id and type headers. Never the token, which is the secret itself;
/// `replay` sends the source's own token again.
const KEPT_HEADERS: &[&str] = &["idempotency-key", "x-gitlab-event-uuid", "x-gitlab-event"];

impl Provider for Gitlab {
    fn scheme(&self) -> &'static str {
        "gitlab"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, _body: &[u8], _now: i64) -> Result<(), SignatureError> {
        let token = required_header(headers, TOKEN)?;
        // Every secret is compared, so the time taken does not say which one matched.
        let matches = self.keys.all().iter().fold(false, |found, secret| {
            found | same_secret(token.as_bytes(), secret)
        });
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }

    fn needs_json(&self) -> bool {
        false
    }

    fn identify(&self, headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_id(headers, IDEMPOTENCY_KEY)
                .filter(|id| !id.is_empty())
                .or_else(|| header_id(headers, EVENT_UUID)),
            event_type: header_text(headers, EVENT),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        KEPT_HEADERS.iter().map(|name| (*name).to_owned()).collect()
    }

    fn sign(
        &self,
        _body: &[u8],
        _timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let token = String::from_utf8_lossy(self.keys.first()).into_owned();
        let mut headers = vec![
            (TOKEN.to_owned(), token),
            (IDEMPOTENCY_KEY.to_owned(), event_id.to_owned()),
            (EVENT_UUID.to_owned(), event_id.to_owned()),
        ];
        if let Some(kind) = event_type {
            headers.push((EVENT.to_owned(), kind.to_owned()));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, verifier};
    use super::super::SignatureError;

    const TOKEN: &str = "glwht-secret-token";

    #[test]
    fn the_token_must_equal_a_secret_exactly() {
        let gitlab = verifier("gitlab", &["older", TOKEN]);
        let signed = verifier("gitlab", &[TOKEN]).sign(b"{}", 0, "id-1", Some("Push Hook"));
        assert_eq!(gitlab.verify(&signed, b"anything", 0), Ok(()));
        for wrong in [
            "",
            "glwht-secret-toke",
            "glwht-secret-tokenx",
            "GLWHT-SECRET-TOKEN",
        ] {
            let sent = headers(&[("X-Gitlab-Token", wrong)]);
            assert_eq!(
                gitlab.verify(&sent, b"{}", 0),
                Err(SignatureError::Invalid),
                "{wrong:?}"
            );
        }
        assert_eq!(
            gitlab.verify(&headers(&[]), b"{}", 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn the_id_is_the_idempotency_key_else_the_event_uuid_and_the_token_is_never_kept() {
        let gitlab = verifier("gitlab", &[TOKEN]);
        let both = headers(&[
            ("Idempotency-Key", "key-1"),
            ("X-Gitlab-Event-UUID", "uuid-1"),
            ("X-Gitlab-Event", "Push Hook"),
        ]);
        let identity = gitlab.identify(&both, None);
        assert_eq!(identity.event_id.as_deref(), Some("key-1"));
        assert_eq!(identity.event_type.as_deref(), Some("Push Hook"));
        let uuid_only = headers(&[("X-Gitlab-Event-UUID", "uuid-1")]);
        assert_eq!(
            gitlab.identify(&uuid_only, None).event_id.as_deref(),
            Some("uuid-1")
        );
        assert!(!gitlab.kept_headers().contains(&"x-gitlab-token".to_owned()));
    }
}
