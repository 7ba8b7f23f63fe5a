//! Newtypes for the names and ids that come from outside, validated once where they enter.

use std::fmt;

/// The longest event id hookbox stores, in bytes (the contract's limit).
pub const MAX_EVENT_ID_BYTES: usize = 255;

/// The name of a configured source: the `{source}` in `POST /webhooks/{source}`.
///
/// ASCII letters, digits, `-` and `_`, so it is safe in a URL path, a metrics label and a log.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceName(String);

impl SourceName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for SourceName {
    type Error = String;

    fn try_from(name: &str) -> Result<Self, Self::Error> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if valid {
            Ok(SourceName(name.to_owned()))
        } else {
            Err(format!(
                "source name {name:?} must be 1 to 64 ASCII letters, digits, '-' or '_'"
            ))
        }
    }
}

impl fmt::Display for SourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A provider's event id: the key, with the source, that makes a delivery a replay.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventId(String);

impl EventId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a provider's event id cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventIdError {
    /// The delivery carries no id, or an empty one.
    #[error("the delivery carries no event id")]
    Missing,
    /// Longer than [`MAX_EVENT_ID_BYTES`].
    #[error("the event id is longer than 255 bytes")]
    TooLong,
    /// Contains a control character (a newline, a NUL, ...).
    #[error("the event id contains a control character")]
    ControlCharacter,
}

impl TryFrom<String> for EventId {
    type Error = EventIdError;

    fn try_from(id: String) -> Result<Self, Self::Error> {
        if id.is_empty() {
            Err(EventIdError::Missing)
        } else if id.len() > MAX_EVENT_ID_BYTES {
            Err(EventIdError::TooLong)
        } else if id.chars().any(char::is_control) {
            Err(EventIdError::ControlCharacter)
        } else {
            Ok(EventId(id))
        }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_accepts_printable_ids_up_to_255_bytes() {
        assert!(EventId::try_from("evt_1MqqbKLt4dXK03v5".to_owned()).is_ok());
        assert!(EventId::try_from("x".repeat(255)).is_ok());
        assert!(EventId::try_from("ünïcode id".to_owned()).is_ok());
    }

    #[test]
    fn event_id_rejects_empty_long_and_control_characters() {
        assert_eq!(EventId::try_from(String::new()), Err(EventIdError::Missing));
        assert_eq!(
            EventId::try_from("x".repeat(256)),
            Err(EventIdError::TooLong)
        );
        assert_eq!(
            EventId::try_from("evt\n1".to_owned()),
            Err(EventIdError::ControlCharacter)
        );
        assert_eq!(
            EventId::try_from("evt\u{0}1".to_owned()),
            Err(EventIdError::ControlCharacter)
        );
    }

    #[test]
    fn source_names_are_url_safe() {
        assert!(SourceName::try_from("stripe-live_2").is_ok());
        assert!(SourceName::try_from("").is_err());
        assert!(SourceName::try_from("a/b").is_err());
        assert!(SourceName::try_from("a b").is_err());
    }
}
