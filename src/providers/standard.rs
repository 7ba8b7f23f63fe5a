//! Standard Webhooks (and Svix, which uses the same scheme under `svix-*` names):
//! `webhook-signature: v1,<base64> [v1a,<base64> ...]` over `{id}.{timestamp}.{body}`, where a
//! `v1` is an HMAC-SHA256 keyed by the base64-decoded secret and a `v1a` an Ed25519 signature
//! checked with the source's `public_keys` (`whpk_` + base64 of the 32-byte key).

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::ed25519::{signature_of, PrivateKey, PublicKeys};
use super::mac::Clock;
use super::mac::{any_matches, header_id, json_text, parse_timestamp, required_header, tag_of};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};
use crate::secret::Secret;

/// A Standard Webhooks (or Svix) source: the HMAC keys its `whsec_` secrets decode to (`v1`),
/// the Ed25519 public keys it trusts (`v1a`), either or both, and its tolerance; built for
/// `send` and `replay`, the private key it signs `v1a` with. Forwarding signs what hookbox
/// sends with one of these too, made from a secret.
pub struct Standard {
    keys: Option<Keys>,
    public_keys: PublicKeys,
    tolerance: Duration,
    signer: Option<PrivateKey>,
}

impl fmt::Debug for Standard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Standard")
            .field("keys", &self.keys)
            .field("public_keys", &self.public_keys)
            .field("tolerance", &self.tolerance)
            .field("signs_v1a", &self.signer.is_some())
            .finish()
    }
}

impl Standard {
    /// A Standard Webhooks signer or verifier over `secrets` (`v1` only).
    ///
    /// # Errors
    /// An empty list, or a secret that is not base64 after `whsec_`.
    pub fn new(secrets: &[Secret], tolerance: Duration) -> Result<Standard, ProviderError> {
        Ok(Standard {
            keys: Some(Keys::derived("standard", secrets, derive_key)?),
            public_keys: PublicKeys::default(),
            tolerance,
            signer: None,
        })
    }
}

/// Builds a Standard Webhooks source from its `secrets` (`v1`), its `public_keys` or
/// `public_keys_env` (`v1a`), or both. Built for `send` and `replay`, a source with public keys
/// signs `v1a` with `--key` (and `v1` too when it has a secret); one with public keys only
/// cannot sign without it.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(&["public_keys", "public_keys_env"])?;
    let public_keys = match settings.public_keys()? {
        Some((key, texts)) => {
            PublicKeys::parse(key, &texts, decode_public_key, PUBLIC_KEY_SPELLING)?
        }
        None => PublicKeys::default(),
    };
    // From a config, `--key` matters only to a source that checks `v1a`; named alone
    // (`--scheme standard`), the key given is the one to sign with.
    let signer = match settings.signing {
        Some(signing) if settings.table.is_none() || !public_keys.is_empty() => {
            PrivateKey::given(signing, "a standard source's v1a")?
                .map(|key| key.checked_against(&public_keys, show_public_key))
                .transpose()?
        }
        _ => None,
    };
    let keys = if settings.secrets.is_empty() && (!public_keys.is_empty() || signer.is_some()) {
        None
    } else if settings.secrets.is_empty() {
        return Err(ProviderError::at(
            "secrets",
            "a standard source needs secrets (whsec_..., checked against v1 signatures) or \
             public_keys (whpk_..., checked against v1a signatures), or both",
        ));
    } else {
        Some(Keys::derived("standard", settings.secrets, derive_key)?)
    };
    if settings.signing.is_some() && keys.is_none() && signer.is_none() {
        return Err(ProviderError::at(
            "--key",
            "this standard source checks v1a signatures only (public_keys, no secrets): give \
             --key FILE, the PEM PKCS#8 Ed25519 private key of one of its public keys",
        ));
    }
    Ok(Arc::new(Standard {
        keys,
        public_keys,
        tolerance: settings.tolerance,
        signer,
    }))
}

impl Provider for Standard {
    fn scheme(&self) -> &'static str {
        "standard"
    }

    fn public_key_count(&self) -> usize {
        self.public_keys.len()
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let clock = Clock {
            now,
            tolerance: self.tolerance,
        };
        let keys = self.keys.as_ref().map_or(&[][..], Keys::all);
        verify(keys, &self.public_keys, headers, body, clock)
    }

    fn needs_json(&self) -> bool {
        false
    }

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        identify(headers, json)
    }

    fn kept_headers(&self) -> Vec<String> {
        KEPT_HEADERS.iter().map(|name| (*name).to_owned()).collect()
    }

    /// Signs `v1` with the first secret and `v1a` with `--key`, whichever the source has (both
    /// when it has both, in one header, as a sender mid-migration would). A source of public
    /// keys only, built to receive, has neither and sends an empty signature list.
    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        sign(
            self.keys.as_ref().map(Keys::first),
            self.signer.as_ref(),
            body,
            timestamp,
            event_id,
        )
    }

    /// A capture that came with `svix-*` names (Svix's own senders: Clerk, Resend) is re-signed
    /// under them: a handler written as their docs show reads `svix-id` and the rest, and
    /// refused every replayed event signed under `webhook-*` (a black-box run).
    fn respell(&self, captured: &dyn Headers, signed: &mut [(String, String)]) {
        if names_in_use(captured) != Some(SVIX) {
            return;
        }
        for (name, _) in signed.iter_mut() {
            if let Some(at) = WEBHOOK.iter().position(|w| name.eq_ignore_ascii_case(w)) {
                SVIX[at].clone_into(name);
            }
        }
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(76 * 3600),
            "the Standard Webhooks retry schedule runs about 76 hours",
        ))
    }
}

/// The two spellings of the scheme's headers: id, timestamp, signature.
const WEBHOOK: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];
const SVIX: [&str; 3] = ["svix-id", "svix-timestamp", "svix-signature"];

/// What a capture keeps: both spellings, since a capture may come from either.
const KEPT_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
];

/// Secrets and public keys are pasted by hand from a dashboard; accept them with or without `=`
/// padding, since padding carries no key bits.
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// How a public key is spelt, for messages.
const PUBLIC_KEY_SPELLING: &str = "whpk_ followed by the base64 of the 32-byte Ed25519 key";

/// The MAC key of a Standard Webhooks secret: the base64 after `whsec_`, or the whole string
/// when it has no prefix.
fn derive_key(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = SECRET_BASE64.decode(encoded).map_err(|_| {
        "a standard secret must be base64 after \"whsec_\" (make one with: echo \
             \"whsec_$(openssl rand -base64 32)\")"
            .to_owned()
    })?;
    if key.is_empty() {
        return Err("a standard secret must not be empty after \"whsec_\"".to_owned());
    }
    Ok(key)
}

/// The bytes of a `whpk_` public key (the prefix is required: it tells a public key from a
/// secret pasted into the wrong list).
fn decode_public_key(text: &str) -> Option<Vec<u8>> {
    SECRET_BASE64.decode(text.strip_prefix("whpk_")?).ok()
}

/// A public key as a config spells it.
fn show_public_key(bytes: &[u8; 32]) -> String {
    format!("whpk_{}", STANDARD.encode(bytes))
}

/// The header names in use: the `webhook-*` set when all three are there, else the `svix-*` set.
/// Names are never mixed across sets, as the reference libraries do not mix them. Both sets
/// whole with another id or timestamp in each is no one delivery (a proxy reading the other set
/// would see another event): none.
fn names_in_use(headers: &dyn Headers) -> Option<[&'static str; 3]> {
    let complete = |set: &[&str; 3]| set.iter().all(|name| headers.get(name).is_some());
    if complete(&WEBHOOK)
        && complete(&SVIX)
        && WEBHOOK[..2]
            .iter()
            .zip(&SVIX[..2])
            .any(|(webhook, svix)| headers.get(webhook) != headers.get(svix))
    {
        return None;
    }
    [WEBHOOK, SVIX].into_iter().find(complete)
}

/// How many `v1a` signatures of one delivery are checked; the rest are ignored.
const MAX_V1A_CHECKED: usize = 4;

/// Checks a Standard Webhooks delivery: any `v1` against any secret, any `v1a` against any
/// public key. A `v1` is never checked against a public key nor a `v1a` against a secret, and
/// entries of other versions are skipped.
fn verify(
    keys: &[Vec<u8>],
    public_keys: &PublicKeys,
    headers: &dyn Headers,
    body: &[u8],
    clock: Clock,
) -> Result<(), SignatureError> {
    let [id_name, timestamp_name, signature_name] =
        names_in_use(headers).ok_or(SignatureError::Invalid)?;
    let id = required_header(headers, id_name)?;
    let raw_timestamp = required_header(headers, timestamp_name)?;
    let signatures = required_header(headers, signature_name)?;
    let timestamp = parse_timestamp(raw_timestamp)?;
    let entries = || {
        signatures
            .split_ascii_whitespace()
            .filter_map(|entry| entry.split_once(','))
    };
    let decoded = |version: &'static str| {
        entries()
            .filter(move |(named, _)| *named == version)
            .filter_map(|(_, encoded)| STANDARD.decode(encoded).ok())
    };
    let tags: Vec<Vec<u8>> = decoded("v1").collect();
    let signed = [id.as_bytes(), b".", raw_timestamp.as_bytes(), b".", body];
    let matched = (!keys.is_empty() && any_matches(keys, &signed, &tags)) || {
        // Each is an Ed25519 check per public key (a third of a millisecond): only the first
        // few, as a sender signs with one key or, while rotating, two. 1,300 bogus ones fit in
        // a header and cost 90 ms of CPU per request.
        let ed25519: Vec<_> = decoded("v1a")
            .filter_map(|bytes| signature_of(&bytes))
            .take(MAX_V1A_CHECKED)
            .collect();
        !public_keys.is_empty()
            && !ed25519.is_empty()
            && public_keys.any_signed(&signed.concat(), &ed25519)
    };
    if !matched {
        return Err(SignatureError::Invalid);
    }
    clock.check(timestamp)
}

/// The id travels in a header, the type in the body.
fn identify(headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
    let event_id = match names_in_use(headers) {
        Some([id_name, ..]) => header_id(headers, id_name),
        None => header_id(headers, WEBHOOK[0]).or_else(|| header_id(headers, SVIX[0])),
    };
    Identity {
        event_id,
        event_type: json_text(json, "/type"),
    }
}

/// The headers a Standard Webhooks sender would send; the spec spells them in lowercase.
fn sign(
    key: Option<&[u8]>,
    signer: Option<&PrivateKey>,
    body: &[u8],
    timestamp: i64,
    event_id: &str,
) -> Vec<(String, String)> {
    let stamp = timestamp.to_string();
    let signed = [event_id.as_bytes(), b".", stamp.as_bytes(), b".", body];
    let v1 = key.map(|key| format!("v1,{}", STANDARD.encode(tag_of(key, &signed))));
    let v1a =
        signer.map(|signer| format!("v1a,{}", STANDARD.encode(signer.sign(&signed.concat()))));
    let signatures: Vec<String> = v1.into_iter().chain(v1a).collect();
    vec![
        (WEBHOOK[0].to_owned(), event_id.to_owned()),
        (WEBHOOK[1].to_owned(), stamp),
        (WEBHOOK[2].to_owned(), signatures.join(" ")),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{headers, verifier};
    use super::super::{Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;
    use crate::secret::Secret;

    // From the standard-webhooks Rust library's tests (also in the shared vectors).
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const NOW: i64 = 1_649_367_553;
    const GOOD: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";
    const WRONG: &str = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

    fn standard(secrets: &[&str]) -> Verifier {
        verifier("standard", secrets)
    }

    fn delivery(signature: &str) -> Vec<(String, String)> {
        let stamp = NOW.to_string();
        headers(&[
            ("webhook-id", ID),
            ("webhook-timestamp", &stamp),
            ("webhook-signature", signature),
        ])
    }

    #[test]
    fn a_valid_signature_passes() {
        assert_eq!(
            standard(&[SECRET]).verify(&delivery(GOOD), BODY, NOW),
            Ok(())
        );
    }

    #[test]
    fn a_secret_without_prefix_or_padding_is_decoded_whole() {
        let bare = SECRET.trim_start_matches("whsec_");
        assert_eq!(standard(&[bare]).verify(&delivery(GOOD), BODY, NOW), Ok(()));
        // 16 bytes: base64 with two padding characters, accepted with or without them.
        let padded = "whsec_AAECAwQFBgcICQoLDA0ODw==";
        let unpadded = "whsec_AAECAwQFBgcICQoLDA0ODw";
        let signed = standard(&[padded]).sign(BODY, NOW, ID, None);
        assert_eq!(standard(&[unpadded]).verify(&signed, BODY, NOW), Ok(()));
    }

    fn refusal(secret: &str) -> String {
        super::Standard::new(&[Secret::new(secret)], Duration::from_secs(300))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_secret_that_is_not_base64_is_refused_without_echoing_it() {
        for bad in ["whsec_not base64!", "whsec_%%%%", "plain-text-secret"] {
            let error = refusal(bad);
            assert!(error.contains("standard secret"), "{error}");
            assert!(!error.contains(bad.trim_start_matches("whsec_")), "{error}");
        }
    }

    #[test]
    fn a_secret_that_decodes_to_nothing_is_refused() {
        assert!(refusal("whsec_").contains("empty"));
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        let other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        assert_eq!(
            standard(&[other]).verify(&delivery(GOOD), BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_body_or_id_is_invalid() {
        let verifier = standard(&[SECRET]);
        let tampered = br#"{"email":"test@example.com","username":"test_usex"}"#;
        assert_eq!(
            verifier.verify(&delivery(GOOD), tampered, NOW),
            Err(SignatureError::Invalid)
        );
        let mut other_id = delivery(GOOD);
        other_id[0].1 = "msg_other".to_owned();
        assert_eq!(
            verifier.verify(&other_id, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_reserialized_body_is_invalid() {
        let spaced = br#"{"email": "test@example.com", "username": "test_user"}"#;
        assert_eq!(
            standard(&[SECRET]).verify(&delivery(GOOD), spaced, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        let verifier = standard(&[SECRET]);
        for missing in 0..3 {
            let mut partial = delivery(GOOD);
            partial.remove(missing);
            assert_eq!(
                verifier.verify(&partial, BODY, NOW),
                Err(SignatureError::Invalid),
                "without header #{missing}"
            );
        }
    }

    #[test]
    fn an_empty_or_truncated_signature_never_matches() {
        let verifier = standard(&[SECRET]);
        for signature in [
            "",
            "v1,",
            "v1",
            ",",
            &GOOD[..GOOD.len() - 4],
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw",
            "v1,!!!!",
        ] {
            assert_eq!(
                verifier.verify(&delivery(signature), BODY, NOW),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
    }

    #[test]
    fn other_versions_are_skipped() {
        let verifier = standard(&[SECRET]);
        let other_version = GOOD.replacen("v1,", "v1a,", 1);
        assert_eq!(
            verifier.verify(&delivery(&other_version), BODY, NOW),
            Err(SignatureError::Invalid)
        );
        let mixed = format!("{other_version} {GOOD}");
        assert_eq!(verifier.verify(&delivery(&mixed), BODY, NOW), Ok(()));
    }

    #[test]
    fn the_second_of_several_signatures_may_be_the_right_one() {
        let list = format!("{WRONG} {GOOD}");
        assert_eq!(
            standard(&[SECRET]).verify(&delivery(&list), BODY, NOW),
            Ok(())
        );
    }

    #[test]
    fn the_second_of_two_secrets_may_be_the_right_one() {
        let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        assert_eq!(
            standard(&[old, SECRET]).verify(&delivery(GOOD), BODY, NOW),
            Ok(())
        );
    }

    #[test]
    fn svix_headers_are_accepted() {
        let stamp = NOW.to_string();
        let svix = headers(&[
            ("Svix-Id", ID),
            ("Svix-Timestamp", &stamp),
            ("Svix-Signature", GOOD),
        ]);
        let verifier = standard(&[SECRET]);
        assert_eq!(verifier.verify(&svix, BODY, NOW), Ok(()));
        assert_eq!(verifier.identify(&svix, None).event_id.as_deref(), Some(ID));
    }

    #[test]
    fn an_incomplete_webhook_set_falls_back_to_a_complete_svix_set() {
        let stamp = NOW.to_string();
        let mixed = headers(&[
            ("webhook-id", "msg_decoy"),
            ("svix-id", ID),
            ("svix-timestamp", &stamp),
            ("svix-signature", GOOD),
        ]);
        let verifier = standard(&[SECRET]);
        assert_eq!(verifier.verify(&mixed, BODY, NOW), Ok(()));
        assert_eq!(
            verifier.identify(&mixed, None).event_id.as_deref(),
            Some(ID)
        );
    }

    #[test]
    fn both_sets_whole_must_name_one_delivery() {
        let stamp = NOW.to_string();
        let both = |svix_id: &str| {
            headers(&[
                ("webhook-id", ID),
                ("webhook-timestamp", &stamp),
                ("webhook-signature", GOOD),
                ("svix-id", svix_id),
                ("svix-timestamp", &stamp),
                ("svix-signature", "v1,bm90IHRoZSBzaWduYXR1cmU="),
            ])
        };
        let verifier = standard(&[SECRET]);
        assert_eq!(verifier.verify(&both(ID), BODY, NOW), Ok(()));
        assert_eq!(
            verifier.verify(&both("msg_other"), BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_valid_signature_too_old_or_too_new_is_stale() {
        let verifier = standard(&[SECRET]);
        assert_eq!(verifier.verify(&delivery(GOOD), BODY, NOW + 300), Ok(()));
        assert_eq!(
            verifier.verify(&delivery(GOOD), BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verifier.verify(&delivery(GOOD), BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn a_wrong_signature_with_a_stale_timestamp_is_invalid() {
        assert_eq!(
            standard(&[SECRET]).verify(&delivery(WRONG), BODY, NOW - 10_000),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_malformed_timestamp_is_invalid() {
        let verifier = standard(&[SECRET]);
        for stamp in ["", "abc", "-1649367553", "1649367553.5"] {
            let mut bad = delivery(GOOD);
            bad[1].1 = stamp.to_owned();
            assert_eq!(
                verifier.verify(&bad, BODY, NOW),
                Err(SignatureError::Invalid),
                "{stamp:?}"
            );
        }
    }

    #[test]
    fn sign_output_verifies() {
        let verifier = standard(&[SECRET]);
        let signed = verifier.sign(BODY, NOW, ID, Some("user.created"));
        assert_eq!(signed, delivery(GOOD));
        assert_eq!(verifier.verify(&signed, BODY, NOW), Ok(()));
    }

    #[test]
    fn identify_reads_the_id_header_and_the_body_type() {
        let verifier = standard(&[SECRET]);
        let json = serde_json::json!({"type": "user.created", "id": "ignored"});
        let identity = verifier.identify(&delivery(GOOD), Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some(ID));
        assert_eq!(identity.event_type.as_deref(), Some("user.created"));
        let none: Vec<(String, String)> = Vec::new();
        assert_eq!(verifier.identify(&none, None), Default::default());
        assert!(!verifier.needs_json());
        assert_eq!(verifier.kept_headers().len(), 6);
    }

    /// A `standard` source with this table and these secrets, built to receive or (with
    /// `signing`) to sign.
    fn built(
        table: &str,
        secrets: &[&str],
        signing: Option<&super::super::Signing>,
    ) -> Result<Verifier, super::super::ProviderError> {
        let table: toml::Table = table.parse().expect("TOML");
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        let scheme = super::super::Registry::builtin()
            .scheme("standard", Some(table))
            .expect("built in");
        match signing {
            None => scheme.build(&secrets, Duration::from_secs(300)),
            Some(signing) => scheme.build_signer(&secrets, Duration::ZERO, signing),
        }
    }

    const PUBLIC: &str = "public_keys = [\"whpk_TUVFkEPtWnJ5AoVLqXF/lczVXQ5FSnCS5gUMBeXEJus=\"]";

    #[test]
    fn a_source_needs_secrets_or_public_keys_and_a_public_key_needs_its_prefix() {
        let error = built("", &[], None).unwrap_err();
        assert_eq!(error.key, "secrets");
        assert!(
            error.problem.contains("secrets") && error.problem.contains("public_keys"),
            "{error}"
        );
        assert!(built(PUBLIC, &[], None).is_ok());
        assert!(built(PUBLIC, &[SECRET], None).is_ok());
        // A secret pasted into the public keys: refused, and not echoed.
        let error = built(
            "public_keys = [\"whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD\"]",
            &[],
            None,
        )
        .unwrap_err();
        assert_eq!(error.key, "public_keys");
        assert!(
            error.problem.contains("whpk_") && !error.problem.contains("C2FVs"),
            "{error}"
        );
        let error = built("public_keys = []", &[SECRET], None).unwrap_err();
        assert_eq!(error.key, "public_keys");
    }

    #[test]
    fn send_needs_a_key_only_where_no_secret_can_sign() {
        let without = super::super::Signing::default();
        let error = built(PUBLIC, &[], Some(&without)).unwrap_err();
        assert_eq!(error.key, "--key");
        let both = built(PUBLIC, &[SECRET], Some(&without)).expect("the secret signs");
        let signed = both.sign(BODY, NOW, ID, None);
        assert_eq!(signed, delivery(GOOD), "v1 alone, as before");
        // A source of secrets only ignores a --key meant for another source (here not even a
        // PEM key).
        let other = super::super::Signing {
            key_pem: Some(Secret::new("-----BEGIN RSA PRIVATE KEY-----")),
            cert_url: None,
            to_query: None,
        };
        assert!(built("", &[SECRET], Some(&other)).is_ok());
        let error = built(PUBLIC, &[SECRET], Some(&other)).unwrap_err();
        assert_eq!(error.key, "--key");
    }

    #[test]
    fn a_v1a_is_checked_against_public_keys_and_never_against_a_secret() {
        let key = super::PrivateKey::from_seed(&[9; 32]);
        let public = format!(
            "public_keys = [\"{}\"]",
            super::show_public_key(key.public().as_bytes())
        );
        let stamp = NOW.to_string();
        let content = format!("{ID}.{stamp}.{}", String::from_utf8_lossy(BODY));
        let v1a = format!(
            "v1a,{}",
            base64::Engine::encode(&super::STANDARD, key.sign(content.as_bytes()))
        );
        let sent = delivery(&v1a);
        assert_eq!(
            built(&public, &[], None)
                .expect("builds")
                .verify(&sent, BODY, NOW),
            Ok(())
        );
        assert_eq!(
            built(&public, &[SECRET], None)
                .expect("builds")
                .verify(&sent, BODY, NOW),
            Ok(())
        );
        assert_eq!(
            standard(&[SECRET]).verify(&sent, BODY, NOW),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            built(PUBLIC, &[], None)
                .expect("builds")
                .verify(&sent, BODY, NOW),
            Err(SignatureError::Invalid),
            "another key's v1a"
        );
        assert_eq!(
            built(&public, &[], None)
                .expect("builds")
                .verify(&sent, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn only_the_first_few_v1a_signatures_are_checked() {
        // Each costs an Ed25519 check: a header full of bogus ones must not cost a request
        // a hundred of them.
        let key = super::PrivateKey::from_seed(&[9; 32]);
        let public = format!(
            "public_keys = [\"{}\"]",
            super::show_public_key(key.public().as_bytes())
        );
        let content = format!("{ID}.{NOW}.{}", String::from_utf8_lossy(BODY));
        let good = format!(
            "v1a,{}",
            base64::Engine::encode(&super::STANDARD, key.sign(content.as_bytes()))
        );
        let bogus = format!(
            "v1a,{}",
            base64::Engine::encode(&super::STANDARD, [7u8; 64])
        );
        let provider = built(&public, &[], None).expect("builds");
        let after = |n: usize| {
            let mut entries = vec![bogus.as_str(); n];
            entries.push(&good);
            entries.join(" ")
        };
        let within = after(super::MAX_V1A_CHECKED - 1);
        assert_eq!(provider.verify(&delivery(&within), BODY, NOW), Ok(()));
        let beyond = after(super::MAX_V1A_CHECKED);
        assert_eq!(
            provider.verify(&delivery(&beyond), BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }
}
