//! A secret that never shows itself: redacted in `Debug`, no `Display`, no `Serialize`.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Whether `given` is `secret` (a token, a password), in time that depends on neither: compared
/// as SHA-256 digests with `subtle`, so neither the first wrong byte nor the lengths show.
pub fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    bool::from(Sha256::digest(given).ct_eq(&Sha256::digest(secret)))
}

/// A signing secret or token. Its value is reached only through [`Secret::expose`], so a secret
/// cannot slip into a log line, an error message or a `{:?}` by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret's value, for keying a MAC or comparing a token. Never log what this returns.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn same_secret_is_equality_of_the_bytes() {
        assert!(super::same_secret(b"user:pw", b"user:pw"));
        assert!(!super::same_secret(b"user:pW", b"user:pw"));
        assert!(!super::same_secret(b"user:p", b"user:pw"));
        assert!(!super::same_secret(b"", b"user:pw"));
    }

    use super::Secret;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("whsec_do_not_print");
        let shown = format!("{secret:?} {:?}", vec![secret.clone()]);
        assert!(!shown.contains("do_not_print"), "{shown}");
        assert!(shown.contains("redacted"));
    }
}
