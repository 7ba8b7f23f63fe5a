//! PayPal: `PAYPAL-TRANSMISSION-SIG` is a base64 SHA256withRSA signature over
//! `{PAYPAL-TRANSMISSION-ID}|{PAYPAL-TRANSMISSION-TIME}|{webhook_id}|{CRC32 of the body}` (the
//! CRC32 in unsigned decimal), checked with the public key of the certificate at
//! `PAYPAL-CERT-URL`. The URL must start with one of the source's `cert_urls` prefixes, or it is
//! refused without being fetched; the certificate is fetched once per URL and cached (see
//! [`certs`](super::certs)), and a fetch that fails makes the delivery 503, so PayPal retries.
//! PayPal has no shared secret: the source's key material is its `webhook_id` and the
//! certificate.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use openssl::hash::MessageDigest;

use super::certs::{Allowlist, RsaSignature, RsaSigningKey};
use super::mac::{json_text, required_header, Clock};
use super::{
    receive_verified, Headers, Identity, Inbound, Provider, ProviderError, Received, Refusal,
    Settings, SignatureError,
};

const TRANSMISSION_ID: &str = "PAYPAL-TRANSMISSION-ID";
const TRANSMISSION_TIME: &str = "PAYPAL-TRANSMISSION-TIME";
const TRANSMISSION_SIG: &str = "PAYPAL-TRANSMISSION-SIG";
const CERT_URL: &str = "PAYPAL-CERT-URL";
const AUTH_ALGO: &str = "PAYPAL-AUTH-ALGO";

/// The longest transmission id taken (PayPal's are UUIDs, 36 characters).
const MAX_TRANSMISSION_ID: usize = 128;

/// The only algorithm taken: PayPal signs with it, and a weaker one named in a header an
/// attacker controls must not be honoured.
const ALGORITHM: &str = "SHA256withRSA";

/// Where PayPal's certificates live, live and sandbox, when a source names no `cert_urls`.
pub const DEFAULT_CERT_URLS: [&str; 2] =
    ["https://api.paypal.com/", "https://api.sandbox.paypal.com/"];

/// A PayPal source: its webhook id, the certificate URLs it trusts, its tolerance, and (built
/// for `send` and `replay`) the key it signs with.
pub struct PayPal {
    webhook_id: String,
    allowlist: Allowlist,
    tolerance: Duration,
    signer: Option<RsaSigningKey>,
}

impl fmt::Debug for PayPal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PayPal")
            .field("webhook_id", &self.webhook_id)
            .field("cert_urls", &self.allowlist)
            .field("tolerance", &self.tolerance)
            .field("signs", &self.signer.is_some())
            .finish()
    }
}

/// Builds a PayPal source from `webhook_id` and `cert_urls`; it takes no secrets.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only_keyless(&["webhook_id", "cert_urls"])?;
    let webhook_id = settings.text("webhook_id")?.ok_or_else(|| {
        ProviderError::at(
            "webhook_id",
            "a paypal source needs webhook_id = \"...\", the webhook's id as PayPal's dashboard \
             shows it (PayPal signs it into every delivery)",
        )
    })?;
    settings.no_secrets(
        "PayPal signs with the certificate at PAYPAL-CERT-URL, so no public_keys either; set \
         webhook_id to the webhook's id from PayPal's dashboard",
        "PayPal signs with an RSA key: give --key FILE (its PEM private key) and --cert-url URL \
         (its certificate's address) instead",
    )?;
    if webhook_id.is_empty() || webhook_id.contains('|') || webhook_id.trim() != webhook_id {
        return Err(ProviderError::at(
            "webhook_id",
            "the webhook id is empty or holds spaces or '|'",
        ));
    }
    let allowlist = Allowlist::from_settings(settings, &DEFAULT_CERT_URLS)?;
    let signer = settings
        .signing
        .map(|signing| RsaSigningKey::load(signing, "paypal", "in each delivery"))
        .transpose()?;
    Ok(Arc::new(PayPal {
        webhook_id: webhook_id.to_owned(),
        allowlist,
        tolerance: settings.tolerance,
        signer,
    }))
}

/// A delivery's signed parts, read and checked as far as can be without the certificate.
struct Transmission<'h> {
    id: &'h str,
    time: &'h str,
    timestamp: i64,
    signature: RsaSignature,
}

impl PayPal {
    /// Reads the headers: every one present, the algorithm PayPal's, the certificate URL
    /// allowed (it is refused here, before any fetch), the time RFC 3339.
    fn transmission<'h>(
        &self,
        headers: &'h dyn Headers,
    ) -> Result<Transmission<'h>, SignatureError> {
        let id = required_header(headers, TRANSMISSION_ID)?;
        // PayPal's are UUIDs; a longer one is no PayPal delivery, and is never bound.
        if id.is_empty() || id.len() > MAX_TRANSMISSION_ID {
            return Err(SignatureError::Invalid);
        }
        let time = required_header(headers, TRANSMISSION_TIME)?;
        let signature = required_header(headers, TRANSMISSION_SIG)?;
        let cert_url = required_header(headers, CERT_URL)?;
        if required_header(headers, AUTH_ALGO)? != ALGORITHM {
            return Err(SignatureError::Invalid);
        }
        let cert_url = self
            .allowlist
            .admit(cert_url)
            .ok_or(SignatureError::Untrusted(
                "PAYPAL-CERT-URL is under none of the source's cert_urls",
            ))?;
        let timestamp = chrono::DateTime::parse_from_rfc3339(time)
            .map_err(|_| SignatureError::Invalid)?
            .timestamp();
        let signature = RsaSignature::from_base64(signature, MessageDigest::sha256(), cert_url)?;
        Ok(Transmission {
            id,
            time,
            timestamp,
            signature,
        })
    }

    /// What PayPal signs: the transmission's id and time, the webhook id and the body's CRC32.
    fn signed_string(&self, id: &str, time: &str, body: &[u8]) -> String {
        format!("{id}|{time}|{}|{}", self.webhook_id, crc32fast::hash(body))
    }
}

impl Provider for PayPal {
    fn signing_refused(&self) -> Option<String> {
        self.signer.as_ref()?.not_admitted_by(&self.allowlist)
    }

    fn scheme(&self) -> &'static str {
        "paypal"
    }

    /// Checks against a certificate already fetched; one not fetched yet counts as a mismatch
    /// here. [`receive`](Provider::receive) is what fetches it.
    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let transmission = self.transmission(headers)?;
        let signed = self.signed_string(transmission.id, transmission.time, body);
        transmission
            .signature
            .verify_cached(signed.as_bytes(), now)?;
        Clock::new(now, self.tolerance).check(transmission.timestamp)
    }

    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        Box::pin(async move {
            let transmission = self.transmission(inbound.headers)?;
            let signed = self.signed_string(transmission.id, transmission.time, inbound.body);
            transmission
                .signature
                .verify(signed.as_bytes(), inbound.now)
                .await?;
            Clock::new(inbound.now, self.tolerance).check(transmission.timestamp)?;
            receive_verified(self, inbound)
        })
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, _headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/id"),
            event_type: json_text(json, "/event_type"),
        }
    }

    /// `PAYPAL-TRANSMISSION-ID` as the check read it (trimmed, so a space added to a genuine
    /// delivery's id, which still verifies, is the same id): PayPal signs it, and the body only
    /// by its CRC32.
    fn transmission_id<'h>(&self, headers: &'h dyn Headers) -> Option<&'h str> {
        required_header(headers, TRANSMISSION_ID).ok()
    }

    fn kept_headers(&self) -> Vec<String> {
        [
            TRANSMISSION_ID,
            TRANSMISSION_TIME,
            TRANSMISSION_SIG,
            CERT_URL,
            AUTH_ALGO,
        ]
        .iter()
        .map(|name| name.to_ascii_lowercase())
        .collect()
    }

    /// Signs as PayPal would, with `--key` and naming `--cert-url`, under a fresh transmission
    /// id. Built to receive (no key), it returns no headers: nothing it could send would pass.
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
        let id = transmission_id();
        let time = chrono::DateTime::from_timestamp(timestamp, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let signed = self.signed_string(&id, &time, body);
        let signature = signer.sign_base64(MessageDigest::sha256(), signed.as_bytes());
        vec![
            (TRANSMISSION_ID.to_owned(), id),
            (TRANSMISSION_TIME.to_owned(), time),
            (TRANSMISSION_SIG.to_owned(), signature),
            (CERT_URL.to_owned(), signer.cert_url.clone()),
            (AUTH_ALGO.to_owned(), ALGORITHM.to_owned()),
        ]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(3 * 24 * 3600),
            "PayPal retries a delivery up to 25 times over 3 days",
        ))
    }
}

/// A fresh transmission id, a random UUID as PayPal's are.
fn transmission_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system provides random bytes");
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openssl::pkey::{PKey, Private};

    use super::super::{certs, Provider, Scheme, SignatureError, Signing};
    use super::*;
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;
    const BODY: &[u8] = br#"{"id":"WH-1","event_type":"PAYMENT.CAPTURE.COMPLETED"}"#;

    fn key_and_cert(from: i64, until: i64) -> (PKey<Private>, String) {
        certs::test_key_and_cert("hookbox test", from, until)
    }

    fn scheme(extra: &str) -> Scheme {
        let table: toml::Table = format!("webhook_id = \"WH123\"\n{extra}")
            .parse()
            .expect("toml");
        super::super::Registry::builtin()
            .scheme("paypal", Some(table))
            .expect("paypal is built in")
    }

    fn signer(key: &PKey<Private>, cert_url: &str) -> Arc<dyn Provider> {
        let pem = String::from_utf8(key.private_key_to_pem_pkcs8().expect("pem")).expect("text");
        scheme("")
            .build_signer(
                &[],
                Duration::from_secs(300),
                &Signing {
                    key_pem: Some(Secret::new(pem)),
                    cert_url: Some(cert_url.to_owned()),
                    to_query: None,
                },
            )
            .expect("a signer")
    }

    fn receiver() -> Arc<dyn Provider> {
        scheme("")
            .build(&[], Duration::from_secs(300))
            .expect("a receiver")
    }

    fn set(mut signed: Vec<(String, String)>, name: &str, value: &str) -> Vec<(String, String)> {
        for (header, old) in &mut signed {
            if header.eq_ignore_ascii_case(name) {
                *old = value.to_owned();
            }
        }
        signed
    }

    #[test]
    fn a_signed_delivery_verifies_against_its_cached_certificate_and_nothing_else() {
        let url = "https://api.paypal.com/v1/notifications/certs/CERT-unit-1";
        let (key, pem) = key_and_cert(NOW - 3600, NOW + 3600);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let signed = signer(&key, url).sign(BODY, NOW, "unused", None);
        let paypal = receiver();
        assert_eq!(paypal.verify(&signed, BODY, NOW + 60), Ok(()));
        assert_eq!(
            paypal.verify(&signed, b"{\"id\":\"WH-2\"}", NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            paypal.verify(&signed, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            paypal.verify(&signed, BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
        for (name, value) in [
            (AUTH_ALGO, "SHA1withRSA"),
            (TRANSMISSION_ID, "another"),
            // Before any certificate is looked at: never a PayPal id, never bound.
            (TRANSMISSION_ID, &"x".repeat(MAX_TRANSMISSION_ID + 1)),
            (TRANSMISSION_TIME, "2025-11-20 14:30:00"),
            (TRANSMISSION_SIG, "not base64!"),
            (TRANSMISSION_SIG, ""),
            (
                CERT_URL,
                "https://evil.example/v1/notifications/certs/CERT-unit-1",
            ),
        ] {
            let changed = set(signed.clone(), name, value);
            assert_eq!(
                paypal
                    .verify(&changed, BODY, NOW)
                    .map_err(SignatureError::as_answered),
                Err(SignatureError::Invalid),
                "{name}: {value}"
            );
        }
        for name in [
            TRANSMISSION_ID,
            TRANSMISSION_TIME,
            TRANSMISSION_SIG,
            CERT_URL,
            AUTH_ALGO,
        ] {
            let without: Vec<(String, String)> = signed
                .iter()
                .filter(|(header, _)| !header.eq_ignore_ascii_case(name))
                .cloned()
                .collect();
            assert_eq!(
                paypal.verify(&without, BODY, NOW),
                Err(SignatureError::Invalid),
                "{name}"
            );
        }
        // Another webhook id is another signed string.
        let other = super::super::Registry::builtin()
            .scheme(
                "paypal",
                Some("webhook_id = \"OTHER\"".parse().expect("toml")),
            )
            .expect("scheme")
            .build(&[], Duration::from_secs(300))
            .expect("receiver");
        assert_eq!(
            other.verify(&signed, BODY, NOW),
            Err(SignatureError::Invalid)
        );
        // A capture keeps what verifies.
        let kept = paypal.kept_headers();
        assert!(signed
            .iter()
            .all(|(name, _)| kept.contains(&name.to_ascii_lowercase())));
    }

    #[test]
    fn a_certificate_outside_its_validity_period_is_refused() {
        let url = "https://api.paypal.com/v1/notifications/certs/CERT-unit-expired";
        let (key, pem) = key_and_cert(NOW - 7200, NOW - 3600);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let signed = signer(&key, url).sign(BODY, NOW, "unused", None);
        assert_eq!(
            receiver().verify(&signed, BODY, NOW),
            Err(SignatureError::Untrusted(
                "the certificate is outside its validity period (expired, or not valid yet)"
            ))
        );
        let url = "https://api.paypal.com/v1/notifications/certs/CERT-unit-future";
        let (key, pem) = key_and_cert(NOW + 3600, NOW + 7200);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let signed = signer(&key, url).sign(BODY, NOW, "unused", None);
        assert_eq!(
            receiver().verify(&signed, BODY, NOW),
            Err(SignatureError::Untrusted(
                "the certificate is outside its validity period (expired, or not valid yet)"
            ))
        );
    }

    #[test]
    fn the_signed_string_is_pipe_joined_with_the_unsigned_crc32() {
        let paypal = PayPal {
            webhook_id: "4JH86294D6297924G".into(),
            allowlist: Allowlist::new(&DEFAULT_CERT_URLS).expect("defaults"),
            tolerance: Duration::from_secs(300),
            signer: None,
        };
        // crc32("The quick brown fox jumps over the lazy dog") = 0x414FA339; and one over
        // 2^31, which must not come out negative.
        assert_eq!(
            paypal.signed_string(
                "t1",
                "2025-11-20T14:30:00Z",
                b"The quick brown fox jumps over the lazy dog"
            ),
            "t1|2025-11-20T14:30:00Z|4JH86294D6297924G|1095738169"
        );
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            paypal.signed_string("t", "x", b"123456789"),
            "t|x|4JH86294D6297924G|3421780262"
        );
    }

    #[test]
    fn the_config_names_what_is_missing_or_wrong() {
        let build = |extra: &str, secrets: &[Secret]| {
            let table: toml::Table = extra.parse().expect("toml");
            super::super::Registry::builtin()
                .scheme("paypal", Some(table))
                .expect("scheme")
                .build(secrets, Duration::from_secs(300))
                .expect_err("refused")
        };
        assert_eq!(build("", &[]).key, "webhook_id");
        assert_eq!(build("webhook_id = \"\"", &[]).key, "webhook_id");
        let error = build("webhook_id = \"W\"", &[Secret::new("s")]);
        assert_eq!(error.key, "secrets");
        assert!(error.problem.contains("webhook_id"), "{error}");
        assert_eq!(
            build("webhook_id = \"W\"\ncert_urls = []", &[]).key,
            "cert_urls"
        );
        assert_eq!(
            build("webhook_id = \"W\"\ncert_urls = \"https://x/\"", &[]).key,
            "cert_urls"
        );
        assert_eq!(
            build("webhook_id = \"W\"\ncert_urls = [\"x\"]", &[]).key,
            "cert_urls"
        );
        assert_eq!(
            build("webhook_id = \"W\"\npublic_url = \"x\"", &[]).key,
            "public_url"
        );
    }

    #[test]
    fn a_signer_needs_a_key_and_a_cert_url() {
        let build = |signing: &Signing| {
            scheme("")
                .build_signer(&[], Duration::from_secs(300), signing)
                .expect_err("refused")
                .key
        };
        assert_eq!(build(&Signing::default()), "--key");
        let not_a_key = Signing {
            key_pem: Some(Secret::new(
                "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
            )),
            cert_url: Some("https://api.paypal.com/c".into()),
            to_query: None,
        };
        assert_eq!(build(&not_a_key), "--key");
        let (key, _) = key_and_cert(NOW, NOW + 1);
        let pem = String::from_utf8(key.private_key_to_pem_pkcs8().expect("pem")).expect("text");
        let no_url = Signing {
            key_pem: Some(Secret::new(pem)),
            cert_url: None,
            to_query: None,
        };
        assert_eq!(build(&no_url), "--cert-url");
        assert!(receiver().sign(BODY, NOW, "x", None).is_empty());
    }

    #[test]
    fn debug_never_shows_a_key() {
        let (key, _) = key_and_cert(NOW, NOW + 1);
        let shown = format!("{:?}", signer(&key, "https://api.paypal.com/c"));
        assert!(
            shown.starts_with("PayPal {") && shown.contains("signs: true"),
            "{shown}"
        );
        assert!(!shown.contains("PRIVATE"), "{shown}");
    }

    #[test]
    fn the_shared_paypal_vectors_hold() {
        let file: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/vectors/providers.json"))
                .expect("vectors are JSON");
        let vectors = file["vectors"].as_array().expect("a list");
        let mut seen = 0;
        for vector in vectors.iter().filter(|v| v["scheme"] == "paypal") {
            seen += 1;
            let case = vector["case"].as_str().expect("case");
            let text = |key: &str| vector[key].as_str().expect(key).to_owned();
            certs::seed(&text("cert_url"), text("cert_pem").as_bytes()).expect("seeded");
            let table: toml::Table = format!("webhook_id = {:?}", text("webhook_id"))
                .parse()
                .expect("toml");
            let paypal = super::super::Registry::builtin()
                .scheme("paypal", Some(table))
                .expect("scheme")
                .build(&[], Duration::from_secs(300))
                .expect("receiver");
            let sent: Vec<(String, String)> = vector["headers"]
                .as_object()
                .expect("headers")
                .iter()
                .map(|(name, value)| (name.clone(), value.as_str().expect("text").to_owned()))
                .collect();
            let outcome = paypal
                .verify(
                    &sent,
                    text("body").as_bytes(),
                    vector["now"].as_i64().expect("now"),
                )
                .map_err(SignatureError::as_answered);
            let expected = match (
                vector["valid"].as_bool(),
                vector["expect"]["error"].as_str(),
            ) {
                (Some(true), _) => Ok(()),
                (_, Some("stale_timestamp")) => Err(SignatureError::Stale),
                _ => Err(SignatureError::Invalid),
            };
            assert_eq!(outcome, expected, "{case}");
        }
        assert_eq!(seen, 10);
    }

    #[test]
    fn transmission_ids_are_uuids() {
        let id = transmission_id();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert_ne!(id, transmission_id());
    }
}
