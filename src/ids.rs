//! Newtypes for the names and ids that come from outside, validated once where they enter.

use std::fmt;

/// Text a client chose (a request's path, the name in `/webhooks/{name}`, an event id or type),
/// as a log line or the console shows it: at most `max` characters (then `…`), and a character
/// that could start a line of its own, restyle a terminal or read as another (a newline, an
/// escape, a bidi override) written as an escape (`\n`, `\u{1b}`), as [`write_escaped`] writes
/// it. Anything else is written as it is, so a configured source's name, an ordinary path or a
/// word in any script reads unchanged.
pub struct ClientText<'a> {
    text: &'a str,
    max: usize,
}

impl<'a> ClientText<'a> {
    /// `text`, shown as a log line may show it.
    pub fn new(text: &'a str, max: usize) -> Self {
        ClientText { text, max }
    }
}

impl std::fmt::Display for ClientText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let plain = |b: u8| (b.is_ascii_graphic() && b != b'\\') || b == b' ';
        if self.text.len() <= self.max && self.text.bytes().all(plain) {
            return f.write_str(self.text);
        }
        // Quotes as they are: they end neither a log line nor a console cell.
        match self.text.char_indices().nth(self.max) {
            Some((cut, _)) => {
                write_escaped(f, &self.text[..cut], &['"', '\''])?;
                f.write_char('…')
            }
            None => write_escaped(f, self.text, &['"', '\'']),
        }
    }
}

/// Writes `text`, which a client chose, so that it cannot read as other text: a control or
/// format character (a newline, an escape, a bidi override, a zero width) and a
/// [`looks_blank`] character as its escape (`\n`, `\u{202e}`), a backslash doubled (so the
/// text `\u{202e}` does not read as the escape of a bidi override), and the characters in
/// `kept` as they are. A combining mark (an accent, a vowel sign, a Hebrew point) is written as it is where it sits on a character written as itself,
/// other than a space, a quote, a backslash or a line break. With nothing to sit on (at the
/// start, or after one of those or an escape) it would join whatever is written before the
/// text, or read as nothing, so it is escaped.
pub fn write_escaped(out: &mut impl fmt::Write, text: &str, kept: &[char]) -> fmt::Result {
    let mut after_base = false;
    for c in text.chars() {
        if kept.contains(&c) {
            out.write_char(c)?;
            after_base = false;
            continue;
        }
        let as_is = !looks_blank(c)
            && if after_base {
                printable_on_a_base(c)
            } else {
                // `char::escape_debug` escapes every combining mark too.
                c.escape_debug().len() == 1
            };
        if as_is {
            out.write_char(c)?;
        } else if looks_blank(c) {
            write!(out, "\\u{{{:x}}}", u32::from(c))?;
        } else {
            write!(out, "{}", c.escape_debug())?;
        }
        after_base = as_is && c != ' ';
    }
    Ok(())
}

/// Whether `c` is printable where it follows a letter: `str::escape_debug` escapes a
/// combining mark only at the start of the text, and a control or format character anywhere.
fn printable_on_a_base(c: char) -> bool {
    let mut text = [b'a'; 5];
    let len = 1 + c.encode_utf8(&mut text[1..]).len();
    std::str::from_utf8(&text[..len])
        .expect("an ASCII letter and a whole character are UTF-8")
        .escape_debug()
        .count()
        == 2
}

/// A character that shows as nothing or as a space though it is neither a control nor a
/// format character (which `char::escape_debug` escapes already): the Hangul fillers, the
/// Braille blank, the Mongolian vowel separator, the combining grapheme joiner, the Khmer
/// inherent vowels, the variation selectors (after a letter that has no variant, `a` and `a`
/// with one look alike), and every space but the ASCII one. An id or type holding one reads as
/// another without it; shown as an escape, it does not.
fn looks_blank(c: char) -> bool {
    matches!(
        c,
        '\u{115f}'
            | '\u{1160}'
            | '\u{3164}'
            | '\u{ffa0}'
            | '\u{2800}'
            | '\u{180e}'
            | '\u{034f}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180d}'
            | '\u{180f}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{e0100}'..='\u{e01ef}'
    ) || (c.is_whitespace() && c != ' ' && !c.is_control())
}

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

    /// The id as a log line shows it ([`ClientText`]): a provider's id is the client's choice,
    /// and where it travels unsigned (a header of some schemes) anyone holding one delivery may
    /// resend it under another.
    pub fn logged(&self) -> ClientText<'_> {
        ClientText::new(&self.0, usize::MAX)
    }
}

/// Why a provider's event id cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EventIdError {
    /// The delivery carries no id, or an empty one.
    #[error(
        "the delivery carries no event id where this scheme reads it (a string, or a \
         whole number that fits in 64 bits)"
    )]
    Missing,
    /// Longer than [`MAX_EVENT_ID_BYTES`].
    #[error("the event id is longer than 255 bytes")]
    TooLong,
    /// Contains a control character (a newline, a NUL, ...).
    #[error("the event id contains a control character")]
    ControlCharacter,
    /// Begins or ends with whitespace: forwarded, the id travels in headers
    /// (`Idempotency-Key`, `webhook-id`), whose values HTTP trims, so a receiver would see
    /// another id and its signature check would fail.
    #[error("the event id begins or ends with whitespace, which HTTP headers cannot carry")]
    OuterWhitespace,
    /// Holds U+FFFD, which is what bytes that are not UTF-8 (a header in Latin-1, say) become
    /// when read as text: the id the sender meant cannot be known, and two different ones would
    /// read the same.
    #[error("the event id is not UTF-8 text")]
    NotText,
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
        } else if id.contains(char::REPLACEMENT_CHARACTER) {
            Err(EventIdError::NotText)
        } else if id.starts_with(char::is_whitespace) || id.ends_with(char::is_whitespace) {
            Err(EventIdError::OuterWhitespace)
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

/// A provider's event type, in a form every store can hold.
///
/// The type is only shown and filtered on, never a key, so rather than refuse a delivery for it
/// (and have the provider retry for ever), a control character is kept JSON-style: U+0000
/// becomes the six characters `\u0000`. PostgreSQL `text` cannot hold U+0000 at all, and the
/// others would garble a log line or a console cell. A type longer than
/// [`MAX_EVENT_TYPE_BYTES`] is cut there (on a character boundary): forwarded, it travels in the
/// `X-Hookbox-Event-Type` header, and a receiver refuses a header of many kilobytes (431), which
/// would make the delivery dead. The body keeps the type whole.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventType(String);

impl EventType {
    /// The type as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The longest event type kept, in bytes (as for an event id).
pub const MAX_EVENT_TYPE_BYTES: usize = 255;

impl From<String> for EventType {
    fn from(text: String) -> Self {
        let mut text = escape_controls(text);
        if text.len() > MAX_EVENT_TYPE_BYTES {
            let mut end = MAX_EVENT_TYPE_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        EventType(text)
    }
}

impl From<&str> for EventType {
    fn from(text: &str) -> Self {
        EventType::from(text.to_owned())
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `text` with each control character written as JSON writes one: `\u` and four hex digits.
fn escape_controls(text: String) -> String {
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 10);
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether a store can hold `text` as it is: PostgreSQL `text` cannot hold U+0000, so a value
/// with one can never have been stored, and a lookup by it finds nothing.
pub fn storable(text: &str) -> bool {
    !text.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_text_cannot_start_a_line_restyle_a_terminal_or_run_long() {
        let shown = |text: &str, max: usize| ClientText::new(text, max).to_string();
        assert_eq!(shown("/webhooks/stripe", 64), "/webhooks/stripe");
        assert_eq!(shown("café \"quoted\"", 64), "café \"quoted\"");
        assert_eq!(
            shown("x\n2026-12-05T00:00:00Z ERROR forged\u{1b}[31m", 64),
            "x\\n2026-12-05T00:00:00Z ERROR forged\\u{1b}[31m"
        );
        assert_eq!(shown("evt_ab_\u{202e}4321", 64), "evt_ab_\\u{202e}4321");
        assert_eq!(shown("a\u{200b}b\u{2028}c", 64), "a\\u{200b}b\\u{2028}c");
        // The text of an escape is not the escape: its backslash is doubled.
        assert_eq!(shown("evt_ab_\\u{202e}4321", 64), "evt_ab_\\\\u{202e}4321");
        // Blank-looking letters and spaces other than ASCII's are escaped too.
        assert_eq!(
            shown("charge.refunded\u{2800}", 64),
            "charge.refunded\\u{2800}"
        );
        assert_eq!(
            shown("a\u{3164}b\u{a0}c\u{3000}d", 64),
            "a\\u{3164}b\\u{a0}c\\u{3000}d"
        );
        assert_eq!(
            shown(&"y".repeat(70_000), 64),
            format!("{}…", "y".repeat(64))
        );
    }

    #[test]
    fn client_text_shows_a_combining_mark_on_the_letter_it_follows() {
        let shown = |text: &str| ClientText::new(text, 64).to_string();
        assert_eq!(shown("भुगतान.सफल"), "भुगतान.सफल");
        assert_eq!(shown("Thanh toa\u{301}n"), "Thanh toa\u{301}n");
        assert_eq!(
            shown("ש\u{5b8}\u{5c1}לו\u{5b9}ם"),
            "ש\u{5b8}\u{5c1}לו\u{5b9}ם"
        );
        // A variation selector shows nothing after most letters: escaped wherever it is.
        assert_eq!(shown("❤\u{fe0f}"), "❤\\u{fe0f}");
        assert_eq!(shown("a\u{fe0f}"), "a\\u{fe0f}");
        // With nothing shown to sit on, a mark is its escape: at the start, after a space,
        // a quote or an escape.
        assert_eq!(shown("\u{301}e"), "\\u{301}e");
        assert_eq!(shown("a \u{301}b"), "a \\u{301}b");
        assert_eq!(shown("\"\u{301}"), "\"\\u{301}");
        assert_eq!(shown("a\u{202e}\u{301}b"), "a\\u{202e}\\u{301}b");
        assert_eq!(shown("a\u{2800}\u{301}"), "a\\u{2800}\\u{301}");
        // A mark that looks blank, and a format character that extends, stay escaped.
        assert_eq!(shown("a\u{34f}b\u{200c}c"), "a\\u{34f}b\\u{200c}c");
        assert_eq!(shown("e\u{301}\u{202e}x"), "e\u{301}\\u{202e}x");
    }

    #[test]
    fn event_types_keep_control_characters_json_style() {
        assert_eq!(
            EventType::from("charge.succeeded").as_str(),
            "charge.succeeded"
        );
        assert_eq!(EventType::from("a\u{0}b").as_str(), "a\\u0000b");
        assert_eq!(EventType::from("a\nb\u{7f}").as_str(), "a\\u000ab\\u007f");
        assert_eq!(EventType::from("ünïcode").as_str(), "ünïcode");
        assert!(storable(EventType::from("\u{0}").as_str()));
        assert!(!storable("a\u{0}b"));
    }

    #[test]
    fn event_types_are_cut_at_255_bytes_on_a_character_boundary() {
        assert_eq!(EventType::from("t".repeat(255)).as_str().len(), 255);
        assert_eq!(
            EventType::from("t".repeat(70_000)).as_str(),
            "t".repeat(255)
        );
        // 127 two-byte characters and one more: the 256th byte would split the last.
        let cut = EventType::from(format!("{}é", "é".repeat(127)));
        assert_eq!(cut.as_str(), "é".repeat(127));
        // What is cut is the escaped text, whose length a store holds.
        assert_eq!(EventType::from("\u{1}".repeat(100)).as_str().len(), 255);
    }

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
            EventId::try_from("caf\u{fffd}".to_owned()),
            Err(EventIdError::NotText)
        );
        assert!(EventId::try_from("caf\u{e9}".to_owned()).is_ok());
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
