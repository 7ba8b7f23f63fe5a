//! A source's secrets turned into MAC keys, once, at startup.

use std::fmt;

use super::ProviderError;
use crate::secret::Secret;

/// The MAC keys of one source, one per configured secret (several while a secret is being
/// rotated). Never empty. `Debug` shows how many there are, never a key.
#[derive(Clone)]
pub struct Keys(Vec<Vec<u8>>);

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keys({})", self.0.len())
    }
}

impl Keys {
    /// Each secret's text, as is, is its key.
    ///
    /// # Errors
    /// As [`Keys::derived`].
    pub fn as_text(scheme: &str, secrets: &[Secret]) -> Result<Keys, ProviderError> {
        Keys::derived(scheme, secrets, |text| Ok(text.as_bytes().to_vec()))
    }

    /// Each secret's key, as `derive` makes it from the secret's text.
    ///
    /// # Errors
    /// Under the `secrets` key: an empty list, an empty secret (an empty key would let anyone
    /// who guesses the misconfiguration sign), or what `derive` refuses; the reason never holds
    /// the secret.
    pub fn derived(
        scheme: &str,
        secrets: &[Secret],
        derive: impl Fn(&str) -> Result<Vec<u8>, String>,
    ) -> Result<Keys, ProviderError> {
        if secrets.is_empty() {
            return Err(ProviderError::at(
                "secrets",
                format!(
                    "{} needs at least one secret (secrets = [\"...\"] or secrets_env = \
                     \"VAR\")",
                    super::a_source(scheme)
                ),
            ));
        }
        // "secret #2" among several; "the secret" when there is one.
        let named = |index: usize| match secrets.len() {
            1 => "the secret".to_owned(),
            _ => format!("secret #{}", index + 1),
        };
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| {
                let value = secret.expose();
                if value.is_empty() {
                    return Err(format!("{} is empty", named(index)));
                }
                derive(value).map_err(|reason| format!("{}: {reason}", named(index)))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| ProviderError::at("secrets", reason))?;
        Ok(Keys(keys))
    }

    /// Every key, for checking: any may match.
    pub fn all(&self) -> &[Vec<u8>] {
        &self.0
    }

    /// The first key, for signing: the one a rotation makes current.
    pub fn first(&self) -> &[u8] {
        &self.0[0]
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a source has at least one key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;
    use crate::secret::Secret;

    #[test]
    fn a_secret_refused_is_named_by_its_place_among_several_and_as_the_secret_alone() {
        let refuse = |_: &str| Err("not base64".to_owned());
        let one = Keys::derived("standard", &[Secret::new("x")], refuse).unwrap_err();
        assert_eq!(one.problem, "the secret: not base64");
        let two = [Secret::new("x"), Secret::new("")];
        let second = Keys::derived("standard", &two, |_| Ok(Vec::new())).unwrap_err();
        assert_eq!(second.problem, "secret #2 is empty");
    }
}
