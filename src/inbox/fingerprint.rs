//! The payload fingerprint: how a redelivery is told apart from a reused id.

use sha2::{Digest, Sha256};

/// SHA-256 of the payload. With `volatile` fields (JSON pointers to what a provider changes
/// between deliveries of one event, see
/// [`Provider::volatile_fields`](crate::providers::Provider::volatile_fields)) and a JSON object
/// body, the hash is over the body re-serialized without them (keys sorted, no whitespace), at
/// any depth (`/additionalData/hmacSignature`), followed by the text of any number the parse
/// rounded (see [`beyond_f64`]); with volatile fields and a body that is not JSON (a form), over the raw bytes less the `name=value` fields named by one-segment pointers
/// (`/bt_signature`), the others kept byte for byte and in order; otherwise over the raw bytes,
/// so any change at all counts as a different payload.
pub fn fingerprint(volatile: &[&str], body: &[u8], json: Option<&serde_json::Value>) -> [u8; 32] {
    let paths: Vec<Vec<String>> = volatile.iter().map(|pointer| segments(pointer)).collect();
    let paths: Vec<&[String]> = paths
        .iter()
        .map(Vec::as_slice)
        .filter(|path| !path.is_empty())
        .collect();
    match json {
        Some(value @ serde_json::Value::Object(_)) if !paths.is_empty() => {
            // Serialized straight into the hasher, member by member, as `{"k":v,...}` would
            // be: nothing is copied. serde_json's map keeps its keys sorted.
            let mut hasher = HashWriter(Sha256::new());
            write_without(&mut hasher, value, &paths);
            // What the parse rounded away, as sent (none in any provider's body so far, so
            // the hash of such a body is as it always was).
            for number in beyond_f64(body) {
                hasher.0.update(b"\0");
                hasher.0.update(number);
            }
            hasher.0.finalize().into()
        }
        None if !paths.is_empty() => {
            let mut hasher = Sha256::new();
            let kept = body.split(|b| *b == b'&').filter(|field| {
                let name = form_urlencoded::parse(field).next().map(|(name, _)| name);
                !name.is_some_and(|name| paths.iter().any(|path| path == &[name.as_ref()]))
            });
            for (index, field) in kept.enumerate() {
                if index > 0 {
                    hasher.update(b"&");
                }
                hasher.update(field);
            }
            hasher.finalize().into()
        }
        _ => Sha256::digest(body).into(),
    }
}

/// The numbers of a JSON text, in order, whose text holds more than the parsed value keeps (see
/// [`kept_whole`]): serde_json reads a number that is no 64-bit integer as the nearest `f64`,
/// so `12345678901234567890123` and `...124` parse alike. Two payloads that differ only
/// there were one payload to the re-serialized hash, and a reused id a replay (a black-box
/// run). `json` is a text that parsed.
fn beyond_f64(json: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < json.len() {
            match json[at] {
                b'"' => {
                    // Most of a body is strings: skipped to their end at memchr's pace (a
                    // byte-by-byte walk cost a stripe event about 1.5 us).
                    at += 1;
                    loop {
                        let rest = json.get(at..).unwrap_or_default();
                        match memchr::memchr2(b'"', b'\\', rest) {
                            Some(i) if rest[i] == b'\\' => at += i + 2,
                            Some(i) => {
                                at += i + 1;
                                break;
                            }
                            None => {
                                at = json.len();
                                break;
                            }
                        }
                    }
                }
                b'-' | b'0'..=b'9' => {
                    let start = at;
                    while at < json.len()
                        && matches!(json[at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        at += 1;
                    }
                    let number = &json[start..at];
                    if !kept_whole(number) {
                        return Some(number);
                    }
                }
                _ => at += 1,
            }
        }
        None
    })
}

/// Whether serde_json's value of a JSON number keeps all its text says (see [`beyond_f64`]):
/// an integer that fits an i64 or a u64, or a number whose nearest f64 is the number itself (its
/// shortest spelling has the same value: what any sender's float printer writes, whatever its
/// number of digits). Only such texts hashed alike before numbers were kept as sent, so the
/// fingerprints stored then still match.
fn kept_whole(number: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(number) else {
        return false;
    };
    if !text.contains(['.', 'e', 'E'])
        && (text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok())
    {
        return true;
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() => decimal(text) == decimal(&format!("{value:e}")),
        _ => false,
    }
}

/// A decimal's value, spelt one way: whether it is negative, its significant digits (no
/// leading or trailing zeros; none for zero) and the power of ten of the last of them. `None`
/// for text that is no decimal.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (
            &text[..at],
            text[at + 1..].trim_start_matches('+').parse::<i64>().ok()?,
        ),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0');
    let kept = significant.trim_end_matches('0');
    if kept.is_empty() {
        return Some((negative, String::new(), 0));
    }
    let dropped = (significant.len() - kept.len()) as i64;
    Some((
        negative,
        kept.to_owned(),
        exponent - fraction.len() as i64 + dropped,
    ))
}

/// A JSON pointer's reference tokens (RFC 6901: `~1` is `/`, `~0` is `~`); a pointer that does
/// not start with `/` names nothing.
fn segments(pointer: &str) -> Vec<String> {
    match pointer.strip_prefix('/') {
        Some(rest) => rest
            .split('/')
            .map(|token| token.replace("~1", "/").replace("~0", "~"))
            .collect(),
        None => Vec::new(),
    }
}

/// Writes `value` as compact JSON less the members `paths` (relative to `value`, none empty)
/// point at. A subtree no path enters is written by serde_json as it is.
fn write_without(hasher: &mut HashWriter, value: &serde_json::Value, paths: &[&[String]]) {
    let deeper = |name: &str| -> Vec<&[String]> {
        paths
            .iter()
            .filter(|path| path.len() > 1 && path[0] == name)
            .map(|path| &path[1..])
            .collect()
    };
    let dropped = |name: &str| paths.iter().any(|path| path.len() == 1 && path[0] == name);
    match value {
        serde_json::Value::Object(map) if !paths.is_empty() => {
            hasher.0.update(b"{");
            let mut first = true;
            for (key, member) in map.iter().filter(|(key, _)| !dropped(key)) {
                if !first {
                    hasher.0.update(b",");
                }
                first = false;
                serde_json::to_writer(&mut *hasher, key).expect("hashing cannot fail");
                hasher.0.update(b":");
                write_without(hasher, member, &deeper(key));
            }
            hasher.0.update(b"}");
        }
        serde_json::Value::Array(items) if !paths.is_empty() => {
            hasher.0.update(b"[");
            let mut first = true;
            for (index, item) in items.iter().enumerate() {
                let index = index.to_string();
                if dropped(&index) {
                    continue;
                }
                if !first {
                    hasher.0.update(b",");
                }
                first = false;
                write_without(hasher, item, &deeper(&index));
            }
            hasher.0.update(b"]");
        }
        _ => serde_json::to_writer(&mut *hasher, value).expect("hashing cannot fail"),
    }
}

/// Lets serde_json write into a hash.
struct HashWriter(Sha256);

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::time::Duration;

    use crate::providers::{Provider, Scheme};
    use crate::secret::Secret;

    fn provider(name: &str) -> Arc<dyn Provider> {
        Scheme::builtin(name)
            .expect("built in")
            .build(&[Secret::new("whsec_c2VjcmV0")], Duration::ZERO)
            .expect("valid")
    }

    fn of(scheme: &Arc<dyn Provider>, body: &str) -> [u8; 32] {
        let json = serde_json::from_str(body).ok();
        fingerprint(scheme.volatile_fields(), body.as_bytes(), json.as_ref())
    }

    #[test]
    fn stripe_ignores_pending_webhooks_only() {
        let first = of(
            &provider("stripe"),
            r#"{"id":"evt_1","pending_webhooks":3,"type":"a"}"#,
        );
        let retry = of(
            &provider("stripe"),
            r#"{"id":"evt_1","pending_webhooks":1,"type":"a"}"#,
        );
        let other = of(
            &provider("stripe"),
            r#"{"id":"evt_1","pending_webhooks":1,"type":"b"}"#,
        );
        assert_eq!(first, retry);
        assert_ne!(first, other);
    }

    #[test]
    fn the_stripe_fingerprint_is_the_hash_of_the_canonical_json_without_pending_webhooks() {
        let body = r#"{"type":"a", "id":"evt_1","pending_webhooks":3,"data":{"b":1,"a":[1,"x"]}}"#;
        let canonical = r#"{"data":{"a":[1,"x"],"b":1},"id":"evt_1","type":"a"}"#;
        let expected: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
        assert_eq!(of(&provider("stripe"), body), expected);
    }

    #[test]
    fn a_form_body_leaves_out_its_volatile_fields_and_keeps_the_rest_byte_for_byte() {
        let volatile = &["/bt_signature"];
        let first = fingerprint(volatile, b"bt_signature=a%7C1&bt_payload=PHg%2B", None);
        let resigned = fingerprint(
            volatile,
            b"bt_signature=a%7C2%26b%7C3&bt_payload=PHg%2B",
            None,
        );
        let other = fingerprint(volatile, b"bt_signature=a%7C1&bt_payload=PHk%2B", None);
        let encoded_name = fingerprint(volatile, b"bt%5Fsignature=z&bt_payload=PHg%2B", None);
        assert_eq!(first, resigned);
        assert_eq!(first, encoded_name);
        assert_ne!(first, other);
        let expected: [u8; 32] = Sha256::digest(b"bt_payload=PHg%2B").into();
        assert_eq!(first, expected);
        // Without a volatile field the raw bytes are hashed as they are.
        let raw = b"a=1&&b=%32";
        assert_eq!(
            fingerprint(volatile, raw, None),
            <[u8; 32]>::from(Sha256::digest(raw))
        );
    }

    #[test]
    fn numbers_an_f64_cannot_hold_are_told_apart_and_the_others_hash_as_before() {
        let stripe = provider("stripe");
        let body = |amount: &str| {
            format!(
                r#"{{"id":"evt_1","pending_webhooks":3,"amount":{amount},"note":"12345678901234567890123"}}"#
            )
        };
        for (one, other) in [
            ("12345678901234567890123", "12345678901234567890124"),
            ("-12345678901234567890123", "-12345678901234567890124"),
            ("0.1000000000000000055511151231257827", "0.1"),
            ("1.00000000000000001e300", "1e300"),
            ("1.6000001e-320", "1.6e-320"),
        ] {
            assert_ne!(
                of(&stripe, &body(one)),
                of(&stripe, &body(other)),
                "{one} vs {other}"
            );
        }
        // A volatile field still does not count, with such a number beside it.
        let big = body("12345678901234567890123");
        assert_eq!(
            of(&stripe, &big),
            of(
                &stripe,
                &big.replace("\"pending_webhooks\":3", "\"pending_webhooks\":1")
            )
        );
        // What an f64 or a 64-bit integer holds hashes as the canonical JSON alone, as before
        // (digits in strings are no numbers).
        for amount in [
            "18446744073709551615",
            "-9223372036854775808",
            "0.123456789012345",
            "1e300",
            "0.000",
            "-0",
            "2.50",
            // What a sender's float printer writes, at any number of digits (a black-box run:
            // events stored before numbers were kept as sent must keep their fingerprints).
            "0.3333333333333333",
            "0.30000000000000004",
            "1.2345678901234567",
            "123456.7890123456",
            "2.2250738585072014e-308",
            "1.7976931348623157e308",
            "5e-324",
            "1e-310",
            "100000000000000000000",
            "-1.5E+3",
        ] {
            let canonical = serde_json::to_string(&serde_json::json!({
                "amount": serde_json::from_str::<serde_json::Value>(amount).expect("a number"),
                "id": "evt_1",
                "note": "12345678901234567890123",
            }))
            .expect("serializes");
            let expected: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
            assert_eq!(of(&stripe, &body(amount)), expected, "{amount}");
        }
        assert_eq!(
            beyond_f64(
                br#"{"a":"x\"12345678901234567890123","b":[1,2.5,-3e-2,99999999999999999999]}"#
            )
            .collect::<Vec<_>>(),
            vec![&b"99999999999999999999"[..]]
        );
        // An escaped backslash ends no string early, and the string's end is found after it.
        assert_eq!(
            beyond_f64(br#"{"a":"x\\","b":12345678901234567890123}"#).collect::<Vec<_>>(),
            vec![&b"12345678901234567890123"[..]]
        );
        // A text cut short inside a string or its escape ends the scan (no panic).
        assert_eq!(beyond_f64(b"\"abc\\").count(), 0);
        assert_eq!(beyond_f64(b"\"abc").count(), 0);
    }

    #[test]
    fn other_schemes_hash_the_raw_bytes() {
        let a = of(&provider("github"), r#"{"a":1,"pending_webhooks":1}"#);
        let b = of(&provider("github"), r#"{"a":1,"pending_webhooks":2}"#);
        let c = of(&provider("github"), r#"{"a": 1,"pending_webhooks":1}"#);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            a,
            of(&provider("github"), r#"{"a":1,"pending_webhooks":1}"#)
        );
    }

    #[test]
    fn a_nested_pointer_leaves_out_that_member_only() {
        let volatile = &["/additionalData/hmacSignature"];
        let of = |body: &str| {
            let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
            fingerprint(volatile, body.as_bytes(), Some(&json))
        };
        let first =
            of(r#"{"pspReference":"A","additionalData":{"hmacSignature":"x","authCode":"1"}}"#);
        let rotated =
            of(r#"{"additionalData":{"authCode":"1","hmacSignature":"y"},"pspReference":"A"}"#);
        let other =
            of(r#"{"pspReference":"A","additionalData":{"hmacSignature":"x","authCode":"2"}}"#);
        let top =
            of(r#"{"pspReference":"A","hmacSignature":"x","additionalData":{"authCode":"1"}}"#);
        assert_eq!(first, rotated);
        assert_ne!(first, other);
        assert_ne!(first, top, "only the nested member is volatile");
        let canonical = r#"{"additionalData":{"authCode":"1"},"pspReference":"A"}"#;
        assert_eq!(
            first,
            <[u8; 32]>::from(Sha256::digest(canonical.as_bytes()))
        );
        // A pointer with an escaped `/` names a member whose name holds one.
        let json = serde_json::json!({"a/b": 1, "c": 2});
        let escaped = fingerprint(&["/a~1b"], b"", Some(&json));
        assert_eq!(escaped, <[u8; 32]>::from(Sha256::digest(br#"{"c":2}"#)));
    }
}
