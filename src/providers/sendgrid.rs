//! SendGrid: the Signed Event Webhook. `X-Twilio-Email-Event-Webhook-Signature` is a base64
//! DER ECDSA P-256 / SHA-256 signature over `{X-Twilio-Email-Event-Webhook-Timestamp}{body}`,
//! the raw body as sent (its final CRLF included), checked with the verification key SendGrid
//! shows (`public_keys`: base64 DER SubjectPublicKeyInfo; several while a key is rotated). The
//! signed timestamp is judged within `tolerance`, as every signed timestamp is here (SendGrid's
//! own libraries check only the signature). A delivery is a batch, a JSON array of events: each
//! is an event of its own, id its `sg_event_id`, type its `event`, payload the event object.
//!
//! `send` and `replay` sign with a P-256 private key (`--key FILE`, PEM PKCS#8 or SEC1).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures_util::future::LocalBoxFuture;
use p256::ecdsa::signature::{MultipartSigner, MultipartVerifier};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use serde_json::value::RawValue;
use serde_json::Value;

use super::family::{batch_of_events, item_text};
use super::mac::{parse_timestamp, required_header, Clock};
use super::{
    Headers, Identity, Inbound, Provider, ProviderError, Received, Refusal, Settings,
    SignatureError, Signing,
};

const SIGNATURE: &str = "X-Twilio-Email-Event-Webhook-Signature";
const TIMESTAMP: &str = "X-Twilio-Email-Event-Webhook-Timestamp";

/// A SendGrid source: its verification keys, its tolerance, and (built for `send` and
/// `replay`) the private key it signs with.
pub struct SendGrid {
    keys: Vec<VerifyingKey>,
    tolerance: Duration,
    signer: Option<SigningKey>,
}

/// The key count and whether it signs, never a key.
impl fmt::Debug for SendGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendGrid")
            .field("public_keys", &self.keys.len())
            .field("tolerance", &self.tolerance)
            .field("signs", &self.signer.is_some())
            .finish()
    }
}

/// Builds a SendGrid source from `public_keys` (or `public_keys_env`); it takes no secrets.
/// Built to sign (`send`, `replay`), it needs `--key` and may do without public keys (the
/// scheme named alone, `--scheme sendgrid`).
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only_keyless(&["public_keys", "public_keys_env"])?;
    settings.no_secrets(
        "SendGrid signs with an ECDSA key pair; set public_keys = [\"MFkw...\"] to the \
         verification key SendGrid shows for the Signed Event Webhook",
        "SendGrid signs with an ECDSA key: give --key FILE (the PEM private key, PKCS#8 or SEC1) \
         instead",
    )?;
    let keys = match settings.public_keys()? {
        Some((key, texts)) => texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                public_key(text).map_err(|problem| {
                    ProviderError::at(key, format!("public key #{}: {problem}", index + 1))
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let signer = settings.signing.map(signing_key).transpose()?;
    if let Some(signer) = &signer {
        trusted(signer, &keys)?;
    }
    if keys.is_empty() && signer.is_none() {
        return Err(ProviderError::at(
            "public_keys",
            "a sendgrid source needs public_keys = [\"MFkw...\"] (or public_keys_env = \"VAR\"): \
             the verification key SendGrid shows under Settings > Mail Settings > Event \
             Webhook once Signed Event Webhook is on",
        ));
    }
    Ok(Arc::new(SendGrid {
        keys,
        tolerance: settings.tolerance,
        signer,
    }))
}

/// A verification key as SendGrid shows it: base64 of the DER SubjectPublicKeyInfo. The same
/// wrapped in PEM armour (`-----BEGIN PUBLIC KEY-----`) is taken too, since SendGrid's own
/// libraries wrap it so before loading it: its base64 on one line, as they leave it, or
/// wrapped at 64 columns, as `openssl` writes it.
fn public_key(text: &str) -> Result<VerifyingKey, String> {
    let text = text.trim();
    let base64 = match text.strip_prefix("-----BEGIN PUBLIC KEY-----") {
        Some(armoured) => armoured
            .strip_suffix("-----END PUBLIC KEY-----")
            .ok_or_else(|| {
                "not a PEM P-256 public key: it has no -----END PUBLIC KEY----- line".to_owned()
            })?,
        None if text.starts_with("-----BEGIN") => {
            return Err(
                "not a PEM P-256 public key: the block must be -----BEGIN PUBLIC KEY-----"
                    .to_owned(),
            )
        }
        None => text,
    };
    let compact: String = base64.split_whitespace().collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(compact)
        .map_err(|_| {
            "not base64: paste the verification key exactly as SendGrid shows it".to_owned()
        })?;
    VerifyingKey::from_public_key_der(&der).map_err(|_| {
        "not a DER P-256 public key (SubjectPublicKeyInfo), as SendGrid shows its verification \
         key"
        .to_owned()
    })
}

/// The P-256 key `send` and `replay` sign with: PEM PKCS#8 (`BEGIN PRIVATE KEY`) or SEC1
/// (`BEGIN EC PRIVATE KEY`), as `openssl ecparam -genkey -name prime256v1` writes it.
fn signing_key(signing: &Signing) -> Result<SigningKey, ProviderError> {
    let pem = signing.key_pem.as_ref().ok_or_else(|| {
        ProviderError::at(
            "--key",
            "sendgrid signs with an ECDSA P-256 private key: give --key FILE (PEM) whose public \
             key is among the receiving source's public_keys",
        )
    })?;
    let text = pem.expose();
    SigningKey::from_pkcs8_pem(text)
        .ok()
        .or_else(|| p256::SecretKey::from_sec1_pem(text).ok().map(Into::into))
        .ok_or_else(|| {
            ProviderError::at(
                "--key",
                "not a PEM P-256 private key (PKCS#8 `BEGIN PRIVATE KEY` or SEC1 `BEGIN EC \
                 PRIVATE KEY`)",
            )
        })
}

/// Refuses a `--key` whose public half is not among the source's public keys (when it has
/// any): the receiver would refuse every delivery it signs.
fn trusted(signer: &SigningKey, keys: &[VerifyingKey]) -> Result<(), ProviderError> {
    let public = signer.verifying_key();
    if keys.is_empty() || keys.contains(public) {
        return Ok(());
    }
    let shown = public
        .to_public_key_der()
        .map(|der| base64::engine::general_purpose::STANDARD.encode(der.as_bytes()))
        .unwrap_or_default();
    Err(ProviderError::at(
        "--key",
        format!(
            "its public key {shown} is not among the source's public_keys, so the receiver \
             would refuse everything it signs: sign with a key the source trusts, or add this one"
        ),
    ))
}

/// An event's id and type: `sg_event_id` and `event`.
fn identity(event: &Value) -> Identity {
    Identity {
        event_id: item_text(event, "/sg_event_id"),
        event_type: item_text(event, "/event"),
    }
}

impl SendGrid {
    /// Every event of a verified delivery, each kept as its raw bytes.
    fn receive_events(&self, inbound: &Inbound<'_>) -> Result<Received, Refusal> {
        self.verify(inbound.headers, inbound.body, inbound.now)?;
        let events: Vec<&RawValue> =
            serde_json::from_slice(inbound.body).map_err(|_| Refusal::MalformedPayload)?;
        batch_of_events(events, identity)
    }
}

impl Provider for SendGrid {
    fn scheme(&self) -> &'static str {
        "sendgrid"
    }

    fn public_key_count(&self) -> usize {
        self.keys.len()
    }

    /// The signature over the timestamp's text and the body, with any key; then the
    /// timestamp within tolerance.
    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let encoded = required_header(headers, SIGNATURE)?;
        let stamp = required_header(headers, TIMESTAMP)?;
        let timestamp = parse_timestamp(stamp)?;
        let der = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| SignatureError::Invalid)?;
        let signature = Signature::from_der(&der).map_err(|_| SignatureError::Invalid)?;
        let signed: [&[u8]; 2] = [stamp.as_bytes(), body];
        if !self
            .keys
            .iter()
            .any(|key| key.multipart_verify(&signed, &signature).is_ok())
        {
            return Err(SignatureError::Invalid);
        }
        Clock::new(now, self.tolerance).check(timestamp)
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// The first event's id and type (of a whole delivery, or of an event alone).
    fn identify(&self, _headers: &dyn Headers, json: Option<&Value>) -> Identity {
        let event = match json {
            Some(Value::Array(events)) => events.first(),
            other => other,
        };
        event.map(identity).unwrap_or_default()
    }

    /// None: the signature is over the whole delivery, not any one event of it, so it means
    /// nothing kept with an event.
    fn kept_headers(&self) -> Vec<String> {
        Vec::new()
    }

    /// Signs as SendGrid would, with `--key`. Built to receive (no key), it returns no
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
        let signature: Signature = signer.multipart_sign(&[stamp.as_bytes(), body]);
        let signature: DerSignature = signature.to_der();
        vec![
            (
                SIGNATURE.to_owned(),
                base64::engine::general_purpose::STANDARD.encode(signature.as_bytes()),
            ),
            (TIMESTAMP.to_owned(), stamp),
        ]
    }

    /// An event alone becomes a delivery of one, its bytes kept as they are, ending in CRLF as
    /// SendGrid's deliveries do.
    fn as_delivery<'b>(&self, payload: &'b [u8]) -> Cow<'b, [u8]> {
        match serde_json::from_slice::<Value>(payload) {
            Ok(Value::Object(_)) => {
                let mut wrapped = b"[".to_vec();
                wrapped.extend_from_slice(payload);
                wrapped.extend_from_slice(b"]\r\n");
                Cow::Owned(wrapped)
            }
            _ => Cow::Borrowed(payload),
        }
    }

    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        Box::pin(std::future::ready(self.receive_events(inbound)))
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(24 * 3600),
            "SendGrid retries a delivery at increasing intervals for up to 24 hours",
        ))
    }
}

#[cfg(test)]
mod tests {
    use p256::elliptic_curve::pkcs8::{EncodePrivateKey, LineEnding};

    use super::super::tests::headers;
    use super::super::{Registry, Scheme};
    use super::*;
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;
    const EVENT: &str = r#"{"email":"a@example.com","event":"delivered","sg_event_id":"ZGVs"}"#;

    /// A key from a fixed seed, so a test's signatures are the same on every run.
    fn key(seed: u8) -> SigningKey {
        SigningKey::from_slice(&[seed; 32]).expect("a seed below the order is a key")
    }

    /// The verification key of `key` as SendGrid shows it.
    fn shown(key: &SigningKey) -> String {
        let der = key
            .verifying_key()
            .to_public_key_der()
            .expect("a P-256 key encodes");
        base64::engine::general_purpose::STANDARD.encode(der.as_bytes())
    }

    fn scheme(table: &str) -> Scheme {
        Registry::builtin()
            .scheme("sendgrid", Some(table.parse().expect("toml")))
            .expect("sendgrid is built in")
    }

    fn receiver(keys: &[&SigningKey]) -> Arc<dyn Provider> {
        let list: Vec<String> = keys.iter().map(|k| format!("{:?}", shown(k))).collect();
        scheme(&format!("public_keys = [{}]", list.join(", ")))
            .build(&[], Duration::from_secs(300))
            .expect("a receiver")
    }

    fn signer(key: &SigningKey) -> Arc<dyn Provider> {
        let pem = key.to_pkcs8_pem(LineEnding::LF).expect("pem");
        Scheme::builtin("sendgrid")
            .expect("built in")
            .build_signer(
                &[],
                Duration::ZERO,
                &Signing {
                    key_pem: Some(Secret::new(pem.as_str())),
                    cert_url: None,
                    to_query: None,
                },
            )
            .expect("a signer")
    }

    fn with(mut signed: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
        for (header, old) in &mut signed {
            if header.eq_ignore_ascii_case(name) {
                value.clone_into(old);
            }
        }
        signed
    }

    #[test]
    fn a_signed_batch_verifies_and_yields_each_event() {
        let body = format!("[{EVENT},{{\"event\":\"open\",\"sg_event_id\":\"b3Bl\"}}]\r\n");
        let signed = signer(&key(1)).sign(body.as_bytes(), NOW, "", None);
        let provider = receiver(&[&key(1)]);
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW + 300), Ok(()));
        let received = receive_at(provider.as_ref(), &signed, body.as_bytes(), NOW);
        let Ok(Received::Batch(items)) = received else {
            panic!("a batch: {received:?}")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].event_id, "ZGVs");
        assert_eq!(items[0].event_type.as_deref(), Some("delivered"));
        assert_eq!(items[0].payload, EVENT.as_bytes());
        assert_eq!(items[1].event_id, "b3Bl");
        assert_eq!(items[1].event_type.as_deref(), Some("open"));
    }

    fn receive_at(
        provider: &dyn Provider,
        sent: &dyn Headers,
        body: &[u8],
        now: i64,
    ) -> Result<Received, Refusal> {
        let inbound = Inbound {
            method: "POST",
            query: "",
            headers: sent,
            body,
            now,
        };
        futures_util::FutureExt::now_or_never(provider.receive(&inbound)).expect("ready")
    }

    #[test]
    fn the_timestamp_body_and_key_are_all_signed() {
        let body = format!("[{EVENT}]\r\n");
        let signed = signer(&key(1)).sign(body.as_bytes(), NOW, "", None);
        let provider = receiver(&[&key(1)]);
        let invalid = Err(SignatureError::Invalid);
        assert_eq!(
            provider.verify(&signed, body.trim_end().as_bytes(), NOW),
            invalid
        );
        let later = (NOW + 1).to_string();
        assert_eq!(
            provider.verify(
                &with(signed.clone(), TIMESTAMP, &later),
                body.as_bytes(),
                NOW
            ),
            invalid
        );
        assert_eq!(
            receiver(&[&key(2)]).verify(&signed, body.as_bytes(), NOW),
            invalid
        );
        for bad in ["", "not base64!", "AAAA", "MAYCAQECAQE="] {
            assert_eq!(
                provider.verify(&with(signed.clone(), SIGNATURE, bad), body.as_bytes(), NOW),
                invalid,
                "{bad:?}"
            );
        }
        for bad in ["", "-5", "1.5", " "] {
            assert_eq!(
                provider.verify(&with(signed.clone(), TIMESTAMP, bad), body.as_bytes(), NOW),
                invalid,
                "{bad:?}"
            );
        }
        for name in [SIGNATURE, TIMESTAMP] {
            let without: Vec<(String, String)> = signed
                .iter()
                .filter(|(header, _)| !header.eq_ignore_ascii_case(name))
                .cloned()
                .collect();
            assert_eq!(provider.verify(&without, body.as_bytes(), NOW), invalid);
        }
    }

    #[test]
    fn a_signed_timestamp_outside_the_tolerance_is_stale_either_way() {
        let body = format!("[{EVENT}]\r\n");
        let signed = signer(&key(1)).sign(body.as_bytes(), NOW, "", None);
        let provider = receiver(&[&key(1)]);
        let stale = Err(SignatureError::Stale);
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW + 301), stale);
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW - 301), stale);
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW - 300), Ok(()));
    }

    #[test]
    fn either_of_two_public_keys_may_sign() {
        let body = format!("[{EVENT}]\r\n");
        let both = receiver(&[&key(1), &key(2)]);
        for seed in [1, 2] {
            let signed = signer(&key(seed)).sign(body.as_bytes(), NOW, "", None);
            assert_eq!(both.verify(&signed, body.as_bytes(), NOW), Ok(()), "{seed}");
        }
        let signed = signer(&key(3)).sign(body.as_bytes(), NOW, "", None);
        assert_eq!(
            both.verify(&signed, body.as_bytes(), NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn an_event_alone_is_wrapped_as_sendgrid_sends_it() {
        let provider = signer(&key(1));
        let body = provider.as_delivery(EVENT.as_bytes()).into_owned();
        assert_eq!(body, format!("[{EVENT}]\r\n").into_bytes());
        assert_eq!(provider.as_delivery(&body), Cow::Borrowed(&body[..]));
        let json: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            provider.identify(&headers(&[]), Some(&json)),
            Identity {
                event_id: Some("ZGVs".into()),
                event_type: Some("delivered".into())
            }
        );
    }

    #[test]
    fn an_event_without_an_id_an_empty_array_or_an_object_is_refused() {
        let provider = receiver(&[&key(1)]);
        let sign = signer(&key(1));
        for (body, refusal) in [
            (&b"[]"[..], Refusal::MissingEventId),
            (br#"[{"event":"open"}]"#, Refusal::MissingEventId),
            (
                br#"[{"event":"open","sg_event_id":""}]"#,
                Refusal::MissingEventId,
            ),
            (
                br#"{"event":"open","sg_event_id":"x"}"#,
                Refusal::MalformedPayload,
            ),
            (br#"["x"]"#, Refusal::MalformedPayload),
            (b"[", Refusal::MalformedPayload),
        ] {
            let signed = sign.sign(body, NOW, "", None);
            assert_eq!(
                receive_at(provider.as_ref(), &signed, body, NOW),
                Err(refusal),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_config_names_what_is_missing_or_wrong() {
        let refused = |table: &str, secrets: &[Secret]| {
            scheme(table)
                .build(secrets, Duration::from_secs(300))
                .expect_err("refused")
        };
        let good = shown(&key(1));
        assert_eq!(refused("", &[]).key, "public_keys");
        let error = refused(&format!("public_keys = [{good:?}]"), &[Secret::new("s")]);
        assert_eq!(error.key, "secrets");
        assert!(error.problem.contains("public_keys"), "{error}");
        for bad in ["[]", "[\"\"]", "[\"not base64!\"]", "[\"AAAA\"]", "\"x\""] {
            assert_eq!(
                refused(&format!("public_keys = {bad}"), &[]).key,
                "public_keys"
            );
        }
        let error = refused(&format!("public_keys = [{good:?}, \"AAAA\"]"), &[]);
        assert!(error.problem.starts_with("public key #2"), "{error}");
        assert_eq!(
            refused(
                "public_keys_env = \"HOOKBOX_TEST_UNSET_SENDGRID_KEYS\"",
                &[]
            )
            .key,
            "public_keys_env"
        );
        assert_eq!(
            refused(
                &format!("public_keys = [{good:?}]\npublic_keys_env = \"X\""),
                &[]
            )
            .key,
            "public_keys_env"
        );
        assert_eq!(
            refused(
                &format!("public_keys = [{good:?}]\nwebhook_id = \"x\""),
                &[]
            )
            .key,
            "webhook_id"
        );
        // An Ed25519 key in SPKI form is not SendGrid's.
        let ed25519 = "MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=";
        assert_eq!(
            refused(&format!("public_keys = [{ed25519:?}]"), &[]).key,
            "public_keys"
        );
    }

    #[test]
    fn a_key_in_pem_armour_is_taken_too() {
        let pem = key(1)
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .expect("pem");
        let provider = scheme(&format!("public_keys = [{pem:?}]"))
            .build(&[], Duration::from_secs(300))
            .expect("a receiver");
        let body = format!("[{EVENT}]\r\n");
        let signed = signer(&key(1)).sign(body.as_bytes(), NOW, "", None);
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW), Ok(()));
        // As SendGrid's own libraries build it (`convert_public_key_to_ecdsa`): the base64 on
        // one line, not wrapped at 64 columns.
        let der = key(1).verifying_key().to_public_key_der().expect("der");
        let one_line = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----",
            base64::engine::general_purpose::STANDARD.encode(der.as_bytes())
        );
        let provider = scheme(&format!("public_keys = [{one_line:?}]"))
            .build(&[], Duration::from_secs(300))
            .expect("a receiver");
        assert_eq!(provider.verify(&signed, body.as_bytes(), NOW), Ok(()));
        // Another block, or one cut short, is refused and says why.
        for bad in [
            pem.replace("PUBLIC KEY", "PRIVATE KEY"),
            pem.replace("-----END PUBLIC KEY-----", ""),
        ] {
            let error = scheme(&format!("public_keys = [{bad:?}]"))
                .build(&[], Duration::from_secs(300))
                .expect_err("refused");
            assert!(error.to_string().contains("PUBLIC KEY-----"), "{error}");
        }
    }

    #[test]
    fn a_signer_takes_pkcs8_or_sec1_and_nothing_else() {
        let build = |pem: Option<&str>| {
            Scheme::builtin("sendgrid").expect("built in").build_signer(
                &[],
                Duration::ZERO,
                &Signing {
                    key_pem: pem.map(Secret::new),
                    cert_url: None,
                    to_query: None,
                },
            )
        };
        assert_eq!(build(None).expect_err("no key").key, "--key");
        assert_eq!(
            build(Some(
                "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n"
            ))
            .expect_err("not a key")
            .key,
            "--key"
        );
        let sec1 = p256::SecretKey::from(key(1).as_nonzero_scalar())
            .to_sec1_pem(LineEnding::LF)
            .expect("sec1");
        let body = format!("[{EVENT}]\r\n");
        let signed =
            build(Some(&sec1))
                .expect("a SEC1 key signs")
                .sign(body.as_bytes(), NOW, "", None);
        assert_eq!(
            receiver(&[&key(1)]).verify(&signed, body.as_bytes(), NOW),
            Ok(())
        );
        assert!(receiver(&[&key(1)])
            .sign(body.as_bytes(), NOW, "", None)
            .is_empty());
    }

    #[test]
    fn a_key_the_source_does_not_list_is_refused_naming_its_public_half() {
        let pem = key(3).to_pkcs8_pem(LineEnding::LF).expect("pem");
        let signing = Signing {
            key_pem: Some(Secret::new(pem.as_str())),
            cert_url: None,
            to_query: None,
        };
        let listed = |keys: &[&SigningKey]| {
            let list: Vec<String> = keys.iter().map(|k| format!("{:?}", shown(k))).collect();
            scheme(&format!("public_keys = [{}]", list.join(", "))).build_signer(
                &[],
                Duration::ZERO,
                &signing,
            )
        };
        let error = listed(&[&key(1), &key(2)]).expect_err("not listed");
        assert_eq!(error.key, "--key");
        assert!(error.problem.contains(&shown(&key(3))), "{error}");
        assert!(!error.problem.contains("PRIVATE"), "{error}");
        assert!(listed(&[&key(1), &key(3)]).is_ok());
    }

    #[test]
    fn debug_never_shows_a_key() {
        let shown = format!("{:?}", signer(&key(1)));
        assert_eq!(
            shown,
            "SendGrid { public_keys: 0, tolerance: 0ns, signs: true }"
        );
    }
}
