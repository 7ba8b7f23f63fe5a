//! Ed25519 for the schemes that sign with a private key and are checked with its public key
//! (Standard Webhooks `v1a`, Discord): the public keys a source trusts, turned into verifying
//! keys once at startup, and the private key `send` and `replay` sign with (`--key FILE`, PEM
//! PKCS#8, as `openssl genpkey -algorithm ed25519` writes it).
//!
//! Built on `ed25519-dalek` (RustCrypto's `sha2`, shared with the HMAC schemes). A signature is
//! checked with `verify_strict`, which also refuses small-order keys and `R` points, as
//! libsodium (PyNaCl, Discord's and Standard Webhooks' reference checks) does.

use std::fmt;

use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey, PUBLIC_KEY_LENGTH};

use super::{ProviderError, Signing};

/// The public keys one source trusts, in the order configured (several while a key is being
/// rotated: any may match). `Debug` shows how many there are.
#[derive(Clone, Default)]
pub struct PublicKeys(Vec<VerifyingKey>);

impl fmt::Debug for PublicKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKeys({})", self.0.len())
    }
}

impl PublicKeys {
    /// The keys in `texts` (as [`Settings::public_keys`](super::Settings::public_keys) reads
    /// them, from the config key `key`), each the 32 key bytes as `decode` reads them from the
    /// scheme's spelling (hex for Discord, `whpk_` + base64 for Standard Webhooks).
    ///
    /// # Errors
    /// Under `key`: a key `decode` refuses, one that is not 32 bytes, or one that is not a
    /// usable Ed25519 key (not a curve point, or of small order: anyone could sign for it).
    pub fn parse(
        key: &str,
        texts: &[String],
        decode: impl Fn(&str) -> Option<Vec<u8>>,
        spelling: &str,
    ) -> Result<PublicKeys, ProviderError> {
        texts
            .iter()
            .enumerate()
            .map(|(index, text)| {
                let problem = |what: &str| {
                    ProviderError::at(
                        key,
                        format!("public key #{}: {what}; expected {spelling}", index + 1),
                    )
                };
                let bytes = decode(text.trim()).ok_or_else(|| problem("cannot be decoded"))?;
                let bytes: [u8; PUBLIC_KEY_LENGTH] =
                    bytes.try_into().map_err(|bytes: Vec<u8>| {
                        problem(&format!(
                            "is {} byte{}, not 32",
                            bytes.len(),
                            if bytes.len() == 1 { "" } else { "s" }
                        ))
                    })?;
                let key = VerifyingKey::from_bytes(&bytes)
                    .map_err(|_| problem("is not an Ed25519 public key"))?;
                if key.is_weak() {
                    return Err(problem(
                        "is a weak (small-order) key that anyone can sign for",
                    ));
                }
                Ok(key)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(PublicKeys)
    }

    /// How many keys are configured.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `key` is one of these.
    pub fn contains(&self, key: &VerifyingKey) -> bool {
        self.0.contains(key)
    }

    /// Whether any of `signatures` is a valid signature of `message` by any of these keys.
    pub fn any_signed(&self, message: &[u8], signatures: &[Signature]) -> bool {
        self.0.iter().any(|key| {
            signatures
                .iter()
                .any(|signature| key.verify_strict(message, signature).is_ok())
        })
    }
}

/// A signature's 64 bytes, or `None` for anything else (empty, truncated, too long).
pub fn signature_of(bytes: &[u8]) -> Option<Signature> {
    Signature::from_slice(bytes).ok()
}

/// The private key `send` and `replay` sign with. `Debug` never shows it.
pub struct PrivateKey(SigningKey);

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

impl PrivateKey {
    /// The key of a 32-byte seed (tests make keys from fixed seeds).
    #[cfg(test)]
    pub fn from_seed(seed: &[u8; 32]) -> PrivateKey {
        PrivateKey(SigningKey::from_bytes(seed))
    }

    /// The key `--key FILE` names: PEM PKCS#8 (`-----BEGIN PRIVATE KEY-----`).
    ///
    /// # Errors
    /// Under `--key`: a file that is not a PEM PKCS#8 Ed25519 private key. `scheme` and
    /// `hint` say what it is for.
    pub fn from_pem(pem: &str, scheme: &str) -> Result<PrivateKey, ProviderError> {
        SigningKey::from_pkcs8_pem(pem.trim())
            .map(PrivateKey)
            .map_err(|_| {
                ProviderError::at(
                    "--key",
                    format!(
                        "not a PEM PKCS#8 Ed25519 private key (-----BEGIN PRIVATE KEY-----, as \
                         `openssl genpkey -algorithm ed25519` writes it), which {scheme} signs \
                         with"
                    ),
                )
            })
    }

    /// The `--key` of `signing`, when one was given.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`].
    pub fn given(signing: &Signing, scheme: &str) -> Result<Option<PrivateKey>, ProviderError> {
        signing
            .key_pem
            .as_ref()
            .map(|pem| PrivateKey::from_pem(pem.expose(), scheme))
            .transpose()
    }

    /// Its public key.
    pub fn public(&self) -> VerifyingKey {
        self.0.verifying_key()
    }

    /// The signature of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }

    /// Refuses a key whose public half is not among the source's `public_keys` (when it has
    /// any): the receiver would refuse every delivery it signs. `shown` spells the public key
    /// as the scheme's config does, so the message says what to add.
    ///
    /// # Errors
    /// Under `--key`, naming the key's public half.
    pub fn checked_against(
        self,
        trusted: &PublicKeys,
        shown: impl Fn(&[u8; 32]) -> String,
    ) -> Result<PrivateKey, ProviderError> {
        if trusted.is_empty() || trusted.contains(&self.public()) {
            return Ok(self);
        }
        Err(ProviderError::at(
            "--key",
            format!(
                "its public key {} is not among the source's public_keys, so the receiver would \
                 refuse everything it signs: sign with a key the source trusts, or add this one",
                shown(self.public().as_bytes())
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn hex_keys(texts: &[&str]) -> Result<PublicKeys, ProviderError> {
        let texts: Vec<String> = texts.iter().map(|t| (*t).to_owned()).collect();
        PublicKeys::parse("public_keys", &texts, |t| hex::decode(t).ok(), "hex")
    }

    #[test]
    fn a_key_signs_and_only_its_public_half_verifies() {
        let key = PrivateKey::from_seed(&[7; 32]);
        let other = PrivateKey::from_seed(&[8; 32]);
        let trusted = hex_keys(&[&hex::encode(key.public().as_bytes())]).expect("a key");
        let signature = signature_of(&key.sign(b"message")).expect("64 bytes");
        assert!(trusted.any_signed(b"message", &[signature]));
        assert!(!trusted.any_signed(b"messagf", &[signature]));
        let forged = signature_of(&other.sign(b"message")).expect("64 bytes");
        assert!(!trusted.any_signed(b"message", &[forged]));
        assert!(trusted.any_signed(b"message", &[forged, signature]));
        assert!(!trusted.any_signed(b"message", &[]));
    }

    #[test]
    fn bad_public_keys_are_refused_by_position() {
        let good = hex::encode(PrivateKey::from_seed(&[1; 32]).public().as_bytes());
        for (bad, says) in [
            ("zz", "cannot be decoded"),
            ("abcd", "2 bytes"),
            // The identity point: small order, so any signature "verifies".
            (
                "0100000000000000000000000000000000000000000000000000000000000000",
                "weak",
            ),
        ] {
            let error = hex_keys(&[&good, bad]).unwrap_err();
            assert_eq!(error.key, "public_keys");
            assert!(
                error.problem.contains("#2") && error.problem.contains(says),
                "{error}"
            );
        }
    }

    #[test]
    fn a_signature_is_exactly_64_bytes() {
        assert!(signature_of(&[0; 64]).is_some());
        for length in [0, 32, 63, 65] {
            assert!(signature_of(&vec![0; length]).is_none(), "{length}");
        }
    }

    #[test]
    fn a_pem_key_is_read_and_anything_else_is_refused_without_echoing_it() {
        use ed25519_dalek::pkcs8::EncodePrivateKey;
        let key = SigningKey::from_bytes(&[3; 32]);
        let pem = key
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .expect("PEM");
        let signing = Signing {
            key_pem: Some(Secret::new(pem.as_str())),
            cert_url: None,
            to_query: None,
        };
        let read = PrivateKey::given(&signing, "discord")
            .expect("a PEM key")
            .expect("given");
        assert_eq!(read.public(), key.verifying_key());
        assert!(PrivateKey::given(&Signing::default(), "discord")
            .expect("none is fine")
            .is_none());
        let error =
            PrivateKey::from_pem("-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n", "discord").unwrap_err();
        assert_eq!(error.key, "--key");
        assert!(error.problem.contains("Ed25519") && !error.problem.contains("c2VjcmV0"));
        assert_eq!(format!("{read:?}"), "PrivateKey(<redacted>)");
    }

    #[test]
    fn a_key_the_source_does_not_trust_is_refused_naming_its_public_half() {
        let key = PrivateKey::from_seed(&[5; 32]);
        let public = hex::encode(key.public().as_bytes());
        let other = hex_keys(&[&hex::encode(
            PrivateKey::from_seed(&[6; 32]).public().as_bytes(),
        )])
        .expect("a key");
        let error = PrivateKey::from_seed(&[5; 32])
            .checked_against(&other, |bytes| hex::encode(bytes))
            .unwrap_err();
        assert!(error.problem.contains(&public), "{error}");
        let trusted = hex_keys(&[&public]).expect("a key");
        assert!(key.checked_against(&trusted, |b| hex::encode(b)).is_ok());
        assert!(PrivateKey::from_seed(&[5; 32])
            .checked_against(&PublicKeys::default(), |b| hex::encode(b))
            .is_ok());
    }
}
