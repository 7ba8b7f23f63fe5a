//! A secret that never shows itself: redacted in `Debug`, no `Display`, no `Serialize`.

use std::fmt;

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
    use super::Secret;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("whsec_do_not_print");
        let shown = format!("{secret:?} {:?}", vec![secret.clone()]);
        assert!(!shown.contains("do_not_print"), "{shown}");
        assert!(shown.contains("redacted"));
    }
}
