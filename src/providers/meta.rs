//! Meta (WhatsApp, Messenger, Instagram): `X-Hub-Signature-256: sha256=<hex>`, an HMAC-SHA256
//! of the raw body (with its `\u` escapes, as sent) keyed by the app secret. Meta sends no
//! event id: it is `sha256:` + the hex SHA-256 of the body, and the type is the body's
//! `object`. When a callback URL is set, Meta checks it with
//! `GET ?hub.mode=subscribe&hub.verify_token=T&hub.challenge=C`: `200` with `C` as
//! `text/plain` when the mode is `subscribe` and T is the source's `verify_token` (compared in
//! constant time), `403` otherwise. Nothing of it is stored.

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;

use super::family::{HeaderMac, TagText};
use super::mac::json_text;
use super::{
    body_hash_id, receive_now, Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError,
    Received, Refusal, Settings, SignatureError,
};
use crate::secret::{same_secret, Secret};

/// A Meta source: its app secrets, used as text, and the verify token of its callback URL.
pub struct Meta {
    keys: Keys,
    verify_token: Secret,
}

/// The key count only: neither a secret nor the verify token.
impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("keys", &self.keys).finish()
    }
}

/// The source's own keys.
const OWN_KEYS: &[&str] = &["verify_token", "verify_token_env"];

/// Builds a Meta source: `secrets` are app secrets; `verify_token` (or `verify_token_env`, the
/// variable that holds it) is required.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(OWN_KEYS)?;
    let keys = Keys::as_text(settings.scheme, settings.secrets)?;
    let verify_token = match (
        settings.text("verify_token")?,
        settings.text("verify_token_env")?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ProviderError::at(
                "verify_token_env",
                "give verify_token or verify_token_env, not both",
            ))
        }
        (Some(token), None) => token.to_owned(),
        (None, Some(var)) => std::env::var(var)
            .ok()
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                ProviderError::at(
                    "verify_token_env",
                    format!(
                        "the environment variable {} is not set (or is empty)",
                        crate::redact::variable_name(var)
                    ),
                )
            })?,
        // Named alone (`send --scheme meta`): signing needs no verify token.
        (None, None) if settings.table.is_none() => String::new(),
        (None, None) => {
            return Err(ProviderError::at(
                "verify_token",
                "a meta source needs verify_token (or verify_token_env): the token typed into \
                 the app dashboard's Verify Token field with the callback URL",
            ))
        }
    };
    if settings.table.is_some() && verify_token.is_empty() {
        return Err(ProviderError::at(
            "verify_token",
            "the verify token is empty",
        ));
    }
    Ok(Arc::new(Meta {
        keys,
        verify_token: Secret::new(verify_token),
    }))
}

/// One signature, hex after `sha256=`, of the raw body.
const SIGNATURE: HeaderMac = HeaderMac {
    header: "X-Hub-Signature-256",
    prefix: "sha256=",
    text: TagText::Hex,
};

impl Meta {
    /// The answer to Meta's verification `GET`.
    fn verification(&self, query: &str) -> Result<Received, Refusal> {
        let mut mode = None;
        let mut token = None;
        let mut challenge = None;
        // A parameter given twice could be read either way by whatever sits in front (as a
        // Braintree field given twice), so the request is refused, before its token is looked at.
        let mut repeated = false;
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match name.as_ref() {
                "hub.mode" => &mut mode,
                "hub.verify_token" => &mut token,
                "hub.challenge" => &mut challenge,
                _ => continue,
            };
            repeated |= slot.is_some();
            slot.get_or_insert(value);
        }
        if repeated {
            return Err(Refusal::Forbidden(
                "a verification request names hub.mode, hub.verify_token or hub.challenge once each",
            ));
        }
        let expected = self.verify_token.expose();
        let token_matches = !expected.is_empty()
            && token.is_some_and(|token| same_secret(token.as_bytes(), expected.as_bytes()));
        // The request's shape is judged before the token, so what the answer says never
        // depends on the token unless all else is right.
        // An empty (or blank) challenge is none: there would be nothing to echo.
        match (mode.as_deref(), challenge.filter(|c| !c.trim().is_empty())) {
            (Some("subscribe"), Some(challenge)) if token_matches => {
                Ok(Received::Handshake(Answer {
                    status: 200,
                    content_type: "text/plain",
                    body: challenge.into_owned().into_bytes(),
                }))
            }
            (Some("subscribe"), Some(_)) => Err(Refusal::Forbidden(
                "the verification token does not match this source's verify_token",
            )),
            _ => Err(Refusal::Forbidden(
                "a verification request needs hub.mode=subscribe and a hub.challenge",
            )),
        }
    }
}

impl Provider for Meta {
    fn scheme(&self) -> &'static str {
        "meta"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        SIGNATURE.verify(&self.keys, headers, &[body])
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: None,
            event_type: json_text(json, "/object"),
        }
    }

    fn identify_body(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        json: Option<&serde_json::Value>,
    ) -> Identity {
        Identity {
            event_id: Some(body_hash_id(body)),
            ..self.identify(headers, json)
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        vec![SIGNATURE.header.to_ascii_lowercase()]
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        vec![SIGNATURE.sign(&self.keys, &[body])]
    }

    fn answers_get(&self) -> bool {
        true
    }

    /// A `GET` is the callback URL's verification; anything else a notification.
    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        let received = if inbound.method.eq_ignore_ascii_case("GET") {
            self.verification(inbound.query)
        } else {
            receive_now(self, inbound)
        };
        Box::pin(std::future::ready(received))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Received, Refusal, Registry};
    use super::Meta;
    use crate::secret::Secret;

    fn meta(extra: &str) -> Result<std::sync::Arc<dyn super::Provider>, super::ProviderError> {
        let table: toml::Table = extra.parse().expect("TOML");
        Registry::builtin()
            .scheme("meta", Some(table))
            .expect("built in")
            .build(&[Secret::new("app-secret")], Duration::from_secs(300))
    }

    fn answer(query: &str) -> Result<Received, Refusal> {
        let meta = Meta {
            keys: super::Keys::as_text("meta", &[Secret::new("app-secret")]).expect("keys"),
            verify_token: Secret::new("tok-1"),
        };
        meta.verification(query)
    }

    #[test]
    fn the_verification_get_echoes_the_challenge_only_for_subscribe_and_the_token() {
        match answer("hub.mode=subscribe&hub.challenge=12%2034&hub.verify_token=tok-1") {
            Ok(Received::Handshake(answer)) => {
                assert_eq!(answer.body, b"12 34");
                assert_eq!(answer.content_type, "text/plain");
            }
            other => panic!("{other:?}"),
        }
        let wrong_token = "the verification token does not match this source's verify_token";
        for query in [
            "hub.mode=subscribe&hub.challenge=1&hub.verify_token=tok-2",
            "hub.mode=subscribe&hub.challenge=1&hub.verify_token=tok-",
            "hub.mode=subscribe&hub.challenge=1",
        ] {
            assert_eq!(
                answer(query),
                Err(Refusal::Forbidden(wrong_token)),
                "{query}"
            );
        }
        // Whatever the token, when the request is not a subscription's verification: what the
        // answer says tells nothing of the token.
        let not_a_verification =
            "a verification request needs hub.mode=subscribe and a hub.challenge";
        for query in [
            "hub.mode=unsubscribe&hub.challenge=1&hub.verify_token=tok-1",
            "hub.mode=unsubscribe&hub.challenge=1&hub.verify_token=tok-2",
            "hub.challenge=1&hub.verify_token=tok-1",
            "hub.mode=subscribe&hub.challenge=&hub.verify_token=tok-1",
            "hub.mode=subscribe&hub.challenge=%20&hub.verify_token=tok-1",
            "hub.mode=subscribe&hub.verify_token=tok-1",
            "hub.mode=subscribe&hub.verify_token=tok-2",
            "",
        ] {
            assert_eq!(
                answer(query),
                Err(Refusal::Forbidden(not_a_verification)),
                "{query}"
            );
        }
        // A parameter given twice, in either order, the right token among them or not.
        let twice =
            "a verification request names hub.mode, hub.verify_token or hub.challenge once each";
        for query in [
            "hub.mode=subscribe&hub.verify_token=tok-1&hub.verify_token=bad&hub.challenge=C",
            "hub.mode=subscribe&hub.verify_token=bad&hub.verify_token=tok-1&hub.challenge=C",
            "hub.mode=subscribe&hub.verify_token=tok-1&hub.challenge=C&hub.challenge=D",
            "hub.mode=subscribe&hub.mode=subscribe&hub.verify_token=tok-1&hub.challenge=C",
        ] {
            assert_eq!(answer(query), Err(Refusal::Forbidden(twice)), "{query}");
        }
    }

    #[test]
    fn the_verify_token_is_required_and_never_shown() {
        let error = meta("").unwrap_err();
        assert_eq!(error.key, "verify_token");
        let error = meta("verify_token = \"a\"\nverify_token_env = \"B\"").unwrap_err();
        assert_eq!(error.key, "verify_token_env");
        let error = meta("verify_token_env = \"HOOKBOX_TEST_SURELY_UNSET_VAR\"").unwrap_err();
        assert_eq!(error.key, "verify_token_env");
        let built = meta("verify_token = \"very-private\"").expect("builds");
        assert!(!format!("{built:?}").contains("very-private"));
        let signed = built.sign(b"{\"object\":\"page\"}", 0, "", None);
        assert_eq!(built.verify(&signed, b"{\"object\":\"page\"}", 0), Ok(()));
    }
}
