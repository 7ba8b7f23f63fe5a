//! What the HMAC providers share: reading headers, timestamps and body values, the MAC itself
//! with its constant-time comparison, and the clock a signed timestamp is judged by.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{Headers, SignatureError};

type HmacSha256 = Hmac<Sha256>;

/// The verification time and how far a signed timestamp may stray from it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub now: i64,
    pub tolerance: Duration,
}

impl Clock {
    /// The clock at `now`, allowing `tolerance`.
    pub const fn new(now: i64, tolerance: Duration) -> Clock {
        Clock { now, tolerance }
    }

    /// Judges a timestamp whose signature already matched: a replayed old delivery and one
    /// stamped in the future are refused alike.
    pub fn check(self, timestamp: i64) -> Result<(), SignatureError> {
        // abs_diff cannot overflow, whatever the two values are.
        let skew = Duration::from_secs(self.now.abs_diff(timestamp));
        if skew > self.tolerance {
            Err(SignatureError::Stale)
        } else {
            Ok(())
        }
    }
}

/// Reads a unix-seconds timestamp: ASCII digits only, so `+5`, `-5`, ` 5` and `5.0` are refused
/// as malformed. A run of digits too long for `i64` is a timestamp far in the future, not a
/// malformed one, so it saturates and is later judged stale.
pub fn parse_timestamp(raw: &str) -> Result<i64, SignatureError> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Invalid);
    }
    Ok(raw.parse::<i64>().unwrap_or(i64::MAX))
}

/// A header the check needs, as text. Absent and non-UTF-8 are the same to a verifier: there is
/// no signature it could check.
///
/// Trimmed as HTTP trims a field value (spaces and tabs), and no further: a sender's library
/// signs the value as its HTTP stack reads it. Unicode whitespace at an end (U+00A0, U+3000)
/// is part of the value; trimmed here, a `webhook-id` of `\u{a0}msg_1` was checked over another
/// text than was signed and refused as a bad signature, where the id is what is wrong (400
/// `invalid_event_id`, a black-box run).
pub fn required_header<'h>(
    headers: &'h dyn Headers,
    name: &str,
) -> Result<&'h str, SignatureError> {
    let raw = headers.get(name).ok_or(SignatureError::Invalid)?;
    let text = std::str::from_utf8(raw).map_err(|_| SignatureError::Invalid)?;
    Ok(text.trim_matches([' ', '\t']))
}

/// A header value for an [`Identity`](super::Identity): absent when missing or not UTF-8.
pub fn header_text(headers: &dyn Headers, name: &str) -> Option<String> {
    let raw = headers.get(name)?;
    std::str::from_utf8(raw).ok().map(str::to_owned)
}

/// A header that carries an event id, for an [`Identity`](super::Identity): absent when missing.
/// A value that is not UTF-8 is read with its bad bytes replaced by U+FFFD, which no event id
/// may hold, so the delivery is refused as carrying an invalid id, not as carrying none.
pub fn header_id(headers: &dyn Headers, name: &str) -> Option<String> {
    let raw = headers.get(name)?;
    Some(String::from_utf8_lossy(raw).into_owned())
}

/// A value found in the body for an [`Identity`](super::Identity). Integers are rendered because
/// some providers send numeric ids; floats, objects and the like cannot be an id.
pub fn json_text(json: Option<&serde_json::Value>, pointer: &str) -> Option<String> {
    match json?.pointer(pointer)? {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Number(number) if number.is_i64() || number.is_u64() => {
            Some(number.to_string())
        }
        _ => None,
    }
}

/// RFC 9110 `tchar`: what a header name may be made of. Checked at configuration time so that a
/// typo like `header: X-Id` fails the start instead of never matching.
pub fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// An HMAC (`M`, e.g. `Hmac<Sha256>`) keyed by `key` over the concatenation of `parts`, so
/// signed content such as `{t}.{body}` never has to be copied into one buffer.
fn mac_over<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> M {
    let mut mac = <M as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether any candidate tag is the HMAC-SHA256 of `parts` under any key (see
/// [`any_matches_with`]).
pub fn any_matches(keys: &[Vec<u8>], parts: &[&[u8]], candidates: &[Vec<u8>]) -> bool {
    any_matches_with::<HmacSha256>(keys, parts, candidates)
}

/// Whether any candidate tag is the MAC `M` of `parts` under any key. Each comparison is
/// constant-time through `verify_slice`, which also refuses a tag of the wrong length, so an
/// empty or truncated signature (or one made with another hash) never matches.
pub fn any_matches_with<M: Mac + KeyInit + Clone>(
    keys: &[Vec<u8>],
    parts: &[&[u8]],
    candidates: &[Vec<u8>],
) -> bool {
    if candidates.is_empty() {
        return false;
    }
    keys.iter().any(|key| {
        let mac = mac_over::<M>(key, parts);
        candidates
            .iter()
            .any(|tag| mac.clone().verify_slice(tag).is_ok())
    })
}

/// The hex tags among `encoded` (either case); one that is not hex is left out, so it can only
/// fail to match.
pub fn hex_tags<'a>(encoded: impl IntoIterator<Item = &'a str>) -> Vec<Vec<u8>> {
    encoded
        .into_iter()
        .filter_map(|tag| hex::decode(tag.trim()).ok())
        .collect()
}

/// `Ok` when any candidate matched, the coarse [`SignatureError::Invalid`] otherwise.
pub fn matched(found: bool) -> Result<(), SignatureError> {
    if found {
        Ok(())
    } else {
        Err(SignatureError::Invalid)
    }
}

/// The HMAC-SHA256 of `parts` under `key`, for signing.
pub fn tag_of(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    tag_with::<HmacSha256>(key, parts)
}

/// The MAC `M` of `parts` under `key`, for signing.
pub fn tag_with<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    mac_over::<M>(key, parts).finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_ascii_digits_and_huge_ones_saturate() {
        assert_eq!(parse_timestamp("1700000000"), Ok(1_700_000_000));
        assert_eq!(parse_timestamp("99999999999999999999999"), Ok(i64::MAX));
        for bad in ["", "-5", "+5", "5.0", "1e9", "12a", "١٢"] {
            assert_eq!(
                parse_timestamp(bad),
                Err(SignatureError::Invalid),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tolerance_applies_to_the_past_and_the_future_without_overflow() {
        let clock = Clock {
            now: 1_000,
            tolerance: Duration::from_secs(300),
        };
        assert_eq!(clock.check(700), Ok(()));
        assert_eq!(clock.check(1_300), Ok(()));
        assert_eq!(clock.check(699), Err(SignatureError::Stale));
        assert_eq!(clock.check(1_301), Err(SignatureError::Stale));
        assert_eq!(clock.check(i64::MAX), Err(SignatureError::Stale));
        let extreme = Clock {
            now: i64::MIN,
            tolerance: Duration::from_secs(300),
        };
        assert_eq!(extreme.check(i64::MAX), Err(SignatureError::Stale));
    }

    #[test]
    fn json_values_are_strings_or_integers_only() {
        let json = serde_json::json!({
            "s": "evt_1", "i": 42, "n": -7, "u": u64::MAX, "f": 1.5, "o": {}, "null": null
        });
        assert_eq!(json_text(Some(&json), "/s").as_deref(), Some("evt_1"));
        assert_eq!(json_text(Some(&json), "/i").as_deref(), Some("42"));
        assert_eq!(json_text(Some(&json), "/n").as_deref(), Some("-7"));
        assert_eq!(
            json_text(Some(&json), "/u").as_deref(),
            Some("18446744073709551615")
        );
        for absent in ["/f", "/o", "/null", "/missing"] {
            assert_eq!(json_text(Some(&json), absent), None, "{absent}");
        }
        assert_eq!(json_text(None, "/s"), None);
    }

    #[test]
    fn non_utf8_headers_are_absent_as_a_type_unreadable_as_an_id_and_invalid_for_checks() {
        struct Raw;
        impl Headers for Raw {
            fn get(&self, _name: &str) -> Option<&[u8]> {
                Some(b"\xff\xfe")
            }
        }
        assert_eq!(header_text(&Raw, "x"), None);
        assert_eq!(header_id(&Raw, "x").as_deref(), Some("\u{fffd}\u{fffd}"));
        assert_eq!(required_header(&Raw, "x"), Err(SignatureError::Invalid));
    }
}
