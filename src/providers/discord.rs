//! Discord interactions (an application's Interactions Endpoint URL): `X-Signature-Ed25519` is
//! the hex Ed25519 signature of `{X-Signature-Timestamp}{body}`, checked with the application's
//! public key (hex, as the Developer Portal shows it). The interaction's `id` is the event id
//! and its `type` (a number) the event type. A verified PING (`"type": 1`), which Discord sends
//! to check the endpoint, is answered `{"type":1}` and never stored.
//!
//! The timestamp (unix seconds) is signed; hookbox holds it to the source's `tolerance` (5
//! minutes unless set), as for every signed timestamp. Discord's docs name no window and its
//! `discord-interactions` libraries check none, but Discord sends each interaction once, at
//! once, and waits three seconds for the answer, so only a replayed request is ever that old.

use std::fmt;
use std::sync::Arc;

use super::ed25519::{signature_of, PrivateKey, PublicKeys};
use super::family::lowercase;
use super::mac::{json_text, parse_timestamp, required_header, Clock};
use super::{
    Answer, Headers, Identity, Inbound, Provider, ProviderError, Refusal, Settings, SignatureError,
};

const SIGNATURE: &str = "X-Signature-Ed25519";
const TIMESTAMP: &str = "X-Signature-Timestamp";

/// The interaction type of Discord's PING.
const PING: u64 = 1;

/// A Discord application's source: the public keys it trusts (several while one is rotated),
/// its tolerance, and (built for `send` and `replay`) the private key it signs with.
pub struct Discord {
    public_keys: PublicKeys,
    tolerance: std::time::Duration,
    signer: Option<PrivateKey>,
}

impl fmt::Debug for Discord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Discord")
            .field("public_keys", &self.public_keys)
            .field("tolerance", &self.tolerance)
            .field("signs", &self.signer.is_some())
            .finish()
    }
}

/// How a public key is spelt, for messages.
const PUBLIC_KEY_SPELLING: &str =
    "the application's public key as the Developer Portal shows it (64 hex digits)";

/// Builds a Discord source from `public_keys` (or `public_keys_env`); it takes no secrets.
/// Built for `send` and `replay`, it needs `--key`, whose public half must be one of them.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only_keyless(&["public_keys", "public_keys_env"])?;
    settings.no_secrets(
        "Discord signs with Ed25519; set public_keys = [\"...\"] to the application's public key \
         (hex) from the Developer Portal's General Information page",
        "Discord signs with Ed25519: give --key FILE, the PEM PKCS#8 private key, instead",
    )?;
    let public_keys = match settings.public_keys()? {
        Some((key, texts)) => PublicKeys::parse(
            key,
            &texts,
            |text| hex::decode(text).ok(),
            PUBLIC_KEY_SPELLING,
        )?,
        None => PublicKeys::default(),
    };
    let signer = match settings.signing {
        None => None,
        Some(signing) => Some(
            PrivateKey::given(signing, "discord")?
                .ok_or_else(|| {
                    ProviderError::at(
                        "--key",
                        "discord signs with an Ed25519 private key: give --key FILE (PEM PKCS#8, \
                         the private half of one of the source's public_keys)",
                    )
                })?
                .checked_against(&public_keys, |bytes| hex::encode(bytes))?,
        ),
    };
    if public_keys.is_empty() && signer.is_none() {
        return Err(ProviderError::at(
            "public_keys",
            format!("a discord source needs public_keys = [\"...\"]: {PUBLIC_KEY_SPELLING}"),
        ));
    }
    Ok(Arc::new(Discord {
        public_keys,
        tolerance: settings.tolerance,
        signer,
    }))
}

impl Provider for Discord {
    fn scheme(&self) -> &'static str {
        "discord"
    }

    fn public_key_count(&self) -> usize {
        self.public_keys.len()
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let signature = hex::decode(required_header(headers, SIGNATURE)?.trim())
            .ok()
            .and_then(|bytes| signature_of(&bytes))
            .ok_or(SignatureError::Invalid)?;
        let raw_timestamp = required_header(headers, TIMESTAMP)?;
        let signed = [raw_timestamp.as_bytes(), body].concat();
        if !self.public_keys.any_signed(&signed, &[signature]) {
            return Err(SignatureError::Invalid);
        }
        Clock::new(now, self.tolerance).check(parse_timestamp(raw_timestamp)?)
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// The interaction's `id`; its `type` is a number, stored as its decimal text.
    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/id"),
            event_type: json_text(json, "/type"),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        // The id and type travel in the body.
        lowercase(&[SIGNATURE, TIMESTAMP])
    }

    /// Signs as Discord would, with `--key`. Built to receive (no key), it returns no
    /// headers: nothing it could send would pass.
    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let Some(signer) = &self.signer else {
            return Vec::new();
        };
        let stamp = timestamp.to_string();
        let signature = signer.sign(&[stamp.as_bytes(), body].concat());
        vec![
            (SIGNATURE.to_owned(), hex::encode(signature)),
            (TIMESTAMP.to_owned(), stamp),
        ]
    }

    /// A verified PING is answered with a PONG, `{"type":1}`, which is what Discord checks
    /// before it saves the endpoint URL (and when it probes it later).
    fn handshake(
        &self,
        _inbound: &Inbound<'_>,
        json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        if json?.get("type")?.as_u64()? != PING {
            return None;
        }
        Some(Ok(Answer {
            status: 200,
            content_type: "application/json",
            body: br#"{"type":1}"#.to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{headers, receive};
    use super::super::{Received, Refusal, Registry, Scheme, Signing};
    use super::*;
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;

    fn key(seed: u8) -> PrivateKey {
        PrivateKey::from_seed(&[seed; 32])
    }

    fn public_hex(seed: u8) -> String {
        hex::encode(key(seed).public().as_bytes())
    }

    fn table(public: &[String]) -> toml::Table {
        let keys = public.iter().cloned().map(toml::Value::String).collect();
        toml::Table::from_iter([("public_keys".to_owned(), toml::Value::Array(keys))])
    }

    fn scheme(public: &[String]) -> Scheme {
        Registry::builtin()
            .scheme("discord", Some(table(public)))
            .expect("built in")
    }

    fn discord(public: &[String]) -> Result<Arc<dyn Provider>, ProviderError> {
        scheme(public).build(&[], Duration::from_secs(300))
    }

    fn signed(seed: u8, stamp: i64, body: &[u8]) -> Vec<(String, String)> {
        let stamp = stamp.to_string();
        let signature = key(seed).sign(&[stamp.as_bytes(), body].concat());
        headers(&[(SIGNATURE, &hex::encode(signature)), (TIMESTAMP, &stamp)])
    }

    const COMMAND: &[u8] = br#"{"id":"1440716324151857172","type":2,"data":{"name":"deploy"}}"#;
    const PING_BODY: &[u8] = br#"{"id":"1440716101849665587","type":1}"#;

    #[test]
    fn a_signed_interaction_is_an_event_of_its_id_and_numeric_type() {
        let provider = discord(&[public_hex(1)]).expect("builds");
        let received = receive_at(&*provider, &signed(1, NOW, COMMAND), COMMAND, NOW);
        let Ok(Received::Event(event)) = received else {
            panic!("{received:?}")
        };
        assert_eq!(event.event_id, "1440716324151857172");
        assert_eq!(event.event_type.as_deref(), Some("2"));
    }

    fn receive_at(
        provider: &dyn Provider,
        sent: &[(String, String)],
        body: &[u8],
        now: i64,
    ) -> Result<Received, Refusal> {
        let inbound = Inbound {
            method: "POST",
            query: "",
            headers: &sent.to_vec(),
            body,
            now,
        };
        futures_util::FutureExt::now_or_never(provider.receive(&inbound)).expect("ready")
    }

    #[test]
    fn a_ping_is_answered_with_a_pong_only_when_signed() {
        let provider = discord(&[public_hex(1)]).expect("builds");
        let answer = receive_at(&*provider, &signed(1, NOW, PING_BODY), PING_BODY, NOW);
        assert_eq!(
            answer,
            Ok(Received::Handshake(Answer {
                status: 200,
                content_type: "application/json",
                body: br#"{"type":1}"#.to_vec(),
            }))
        );
        assert_eq!(
            receive_at(&*provider, &signed(2, NOW, PING_BODY), PING_BODY, NOW),
            Err(Refusal::Signature(SignatureError::Invalid))
        );
        // The shared helper receives at time 0: a genuine PING from long ago is stale.
        assert_eq!(
            receive(&*provider, &signed(1, NOW, PING_BODY), PING_BODY),
            Err(Refusal::Signature(SignatureError::Stale))
        );
    }

    #[test]
    fn either_of_two_keys_may_sign_and_a_third_may_not() {
        let provider = discord(&[public_hex(1), public_hex(2)]).expect("builds");
        for seed in [1, 2] {
            assert_eq!(
                provider.verify(&signed(seed, NOW, COMMAND), COMMAND, NOW),
                Ok(())
            );
        }
        assert_eq!(
            provider.verify(&signed(3, NOW, COMMAND), COMMAND, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_or_timestamp_or_a_bad_signature_is_invalid() {
        let provider = discord(&[public_hex(1)]).expect("builds");
        let good = signed(1, NOW, COMMAND);
        assert_eq!(
            provider.verify(&good, br#"{"id":"1440716324151857172","type":3}"#, NOW),
            Err(SignatureError::Invalid)
        );
        let mut restamped = good.clone();
        restamped[1].1 = (NOW + 1).to_string();
        assert_eq!(
            provider.verify(&restamped, COMMAND, NOW),
            Err(SignatureError::Invalid)
        );
        for bad in ["", "zz", &good[0].1[..126], &format!("{}00", good[0].1)] {
            let mut sent = good.clone();
            sent[0].1 = bad.to_owned();
            assert_eq!(
                provider.verify(&sent, COMMAND, NOW),
                Err(SignatureError::Invalid),
                "{bad:?}"
            );
        }
        for missing in 0..2 {
            let mut sent = good.clone();
            sent.remove(missing);
            assert_eq!(
                provider.verify(&sent, COMMAND, NOW),
                Err(SignatureError::Invalid)
            );
        }
    }

    #[test]
    fn a_genuine_signature_outside_the_tolerance_is_stale() {
        let provider = discord(&[public_hex(1)]).expect("builds");
        for skew in [-301, 301] {
            let sent = signed(1, NOW + skew, COMMAND);
            assert_eq!(
                provider.verify(&sent, COMMAND, NOW),
                Err(SignatureError::Stale),
                "{skew}"
            );
        }
        assert_eq!(
            provider.verify(&signed(1, NOW - 300, COMMAND), COMMAND, NOW),
            Ok(())
        );
    }

    #[test]
    fn secrets_or_no_public_keys_are_config_errors_naming_public_keys() {
        let error = Scheme::builtin("discord")
            .expect("built in")
            .build(&[Secret::new("abc")], Duration::from_secs(300))
            .unwrap_err();
        assert_eq!(error.key, "secrets");
        assert!(error.problem.contains("public_keys"), "{error}");
        let error = discord(&[]).unwrap_err();
        assert_eq!(error.key, "public_keys");
        let error = discord(&["not hex".to_owned()]).unwrap_err();
        assert_eq!(error.key, "public_keys");
        assert!(error.problem.contains("#1"), "{error}");
    }

    #[test]
    fn send_signs_with_the_key_of_a_trusted_public_key_and_needs_one() {
        let scheme = scheme(&[public_hex(4)]);
        let pem = |seed: u8| {
            use ed25519_dalek::pkcs8::EncodePrivateKey;
            ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
                .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
                .expect("PEM")
                .to_string()
        };
        let signing = |seed: u8| Signing {
            key_pem: Some(Secret::new(pem(seed))),
            cert_url: None,
            to_query: None,
        };
        let signer = scheme
            .build_signer(&[], Duration::ZERO, &signing(4))
            .expect("a trusted key signs");
        let sent = signer.sign(COMMAND, NOW, "", None);
        let provider = discord(&[public_hex(4)]).expect("builds");
        assert_eq!(provider.verify(&sent, COMMAND, NOW), Ok(()));
        assert!(provider.sign(COMMAND, NOW, "", None).is_empty());

        let error = scheme
            .build_signer(&[], Duration::ZERO, &signing(5))
            .unwrap_err();
        assert_eq!(error.key, "--key");
        assert!(error.problem.contains(&public_hex(5)), "{error}");
        let error = scheme
            .build_signer(&[], Duration::ZERO, &Signing::default())
            .unwrap_err();
        assert_eq!(error.key, "--key");
    }
}
