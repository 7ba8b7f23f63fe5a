//! Shapes several providers share, so that each provider's file keeps only what is its own (its
//! headers, what it signs, where its id and type are, its answers and horizon).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::value::RawValue;
use serde_json::Value;

use super::mac::{any_matches, matched, parse_timestamp, required_header, tag_of, Clock};
use super::{
    Headers, Identity, Item, Keys, ProviderError, Received, Refusal, Settings, SignatureError,
};

/// The keys of a source that takes no key of its own: each secret's text is a MAC key.
///
/// # Errors
/// A key of the source's table that the provider does not take, or unusable secrets.
pub fn text_keys_only(settings: &Settings<'_>) -> Result<Keys, ProviderError> {
    settings.only(&[])?;
    Keys::as_text(settings.scheme, settings.secrets)
}

/// Checks a MAC over content that holds the signed timestamp `raw_timestamp`, then the timestamp
/// by `clock`: the MAC first, so nothing about the clock is learnt without a valid signature.
///
/// # Errors
/// [`SignatureError::Invalid`] for a malformed timestamp or no match, [`SignatureError::Stale`]
/// for a match outside the tolerance.
pub fn verify_stamped(
    keys: &Keys,
    clock: Clock,
    raw_timestamp: &str,
    parts: &[&[u8]],
    tags: &[Vec<u8>],
) -> Result<(), SignatureError> {
    let timestamp = parse_timestamp(raw_timestamp)?;
    matched(any_matches(keys.all(), parts, tags))?;
    clock.check(timestamp)
}

/// Slack's and Zoom's `v0` signature in `header`: `v0=<hex>`, of [`v0_content`].
pub const fn v0(header: &'static str) -> HeaderMac {
    HeaderMac {
        header,
        prefix: "v0=",
        text: TagText::Hex,
    }
}

/// What a `v0` signature signs: `v0:{timestamp}:{body}`.
pub fn v0_content<'a>(timestamp: &'a str, body: &'a [u8]) -> [&'a [u8]; 4] {
    [b"v0:", timestamp.as_bytes(), b":", body]
}

/// A header of `key=value` items split by `separator` (Stripe's `t=..,v1=..`, Paddle's
/// `ts=..;h1=..`): the first `stamp` value and every `tag` value, trimmed. An item without `=`
/// carries nothing the providers define and is skipped, as their own libraries do.
pub fn stamp_and_tags<'h>(
    header: &'h str,
    separator: char,
    stamp: &str,
    tag: &str,
) -> (Option<&'h str>, Vec<&'h str>) {
    let mut timestamp = None;
    let mut tags = Vec::new();
    for item in header.split(separator) {
        let Some((key, value)) = item.split_once('=') else {
            continue;
        };
        // Spaces and tabs only (HTTP's own optional whitespace), not every Unicode space: a
        // vertical tab in a key makes it another key, as the providers' SDKs read it.
        let ows: &[char] = &[' ', '\t'];
        let key = key.trim_matches(ows);
        if key == stamp && timestamp.is_none() {
            timestamp = Some(value.trim_matches(ows));
        } else if key == tag {
            tags.push(value.trim_matches(ows));
        }
    }
    (timestamp, tags)
}

/// `names` lowercased: what [`Provider::kept_headers`](super::Provider::kept_headers) returns.
pub fn lowercase(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_ascii_lowercase()).collect()
}

/// The signature header, then the id header, then the type header when there is a type: the
/// headers a provider that names its delivery and event in headers sends.
pub fn with_id_and_type(
    signature: (String, String),
    id: (&str, &str),
    kind: (&str, Option<&str>),
) -> Vec<(String, String)> {
    let mut headers = vec![signature, (id.0.to_owned(), id.1.to_owned())];
    if let (name, Some(value)) = kind {
        headers.push((name.to_owned(), value.to_owned()));
    }
    headers
}

/// How a tag is written in its header.
#[derive(Debug, Clone, Copy)]
pub enum TagText {
    /// Hex, either case when read, lowercase when written.
    Hex,
    /// Standard base64 with padding.
    Base64,
}

impl TagText {
    /// The tag `encoded` spells; `None` when it is not of this text, which can only fail to
    /// match.
    pub fn decode(self, encoded: &str) -> Option<Vec<u8>> {
        match self {
            TagText::Hex => hex::decode(encoded).ok(),
            TagText::Base64 => STANDARD.decode(encoded).ok(),
        }
    }

    /// `tag` in this text.
    pub fn encode(self, tag: &[u8]) -> String {
        match self {
            TagText::Hex => hex::encode(tag),
            TagText::Base64 => STANDARD.encode(tag),
        }
    }
}

/// One HMAC-SHA256 in one header, written as `prefix` then the tag: `X-Hub-Signature-256:
/// sha256=<hex>`, `X-Shopify-Hmac-Sha256: <base64>`. What is signed is the provider's (the body,
/// or a URL and the body); exactly one tag is read, so a list is malformed.
#[derive(Debug, Clone, Copy)]
pub struct HeaderMac {
    /// The header, in the provider's casing (what `sign` sends).
    pub header: &'static str,
    /// What comes before the tag (`sha256=`), or nothing.
    pub prefix: &'static str,
    /// How the tag is written.
    pub text: TagText,
}

impl HeaderMac {
    /// Checks the header's tag against the MAC of `parts` under any of `keys`.
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] when the header is missing, lacks the prefix, is not a tag of
    /// this text, or matches no key.
    pub fn verify(
        self,
        keys: &Keys,
        headers: &dyn Headers,
        parts: &[&[u8]],
    ) -> Result<(), SignatureError> {
        matched(any_matches(keys.all(), parts, &self.tags(headers)?))
    }

    /// The header's tag, decoded: none when it is not of this text, so it can only fail to
    /// match.
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] when the header is missing or lacks the prefix.
    pub fn tags(self, headers: &dyn Headers) -> Result<Vec<Vec<u8>>, SignatureError> {
        let value = required_header(headers, self.header)?;
        let encoded = value
            .strip_prefix(self.prefix)
            .ok_or(SignatureError::Invalid)?;
        Ok(self.text.decode(encoded).into_iter().collect())
    }

    /// The header as the provider sends it: the MAC of `parts` under the first key.
    pub fn sign(self, keys: &Keys, parts: &[&[u8]]) -> (String, String) {
        let tag = tag_of(keys.first(), parts);
        (
            self.header.to_owned(),
            format!("{}{}", self.prefix, self.text.encode(&tag)),
        )
    }
}

/// The text at `pointer` in a batch item, when it is a string that is not empty or a whole
/// number (its decimal text, as for a delivery of one event): where the batch providers (Adyen,
/// GoCardless, SendGrid) read an item's id and type.
pub fn item_text(item: &Value, pointer: &str) -> Option<String> {
    super::mac::json_text(Some(item), pointer).filter(|text| !text.is_empty())
}

/// One item of a verified batch: its id and type as `identity` reads them from `json`, its
/// payload `raw`, the bytes it stood as in the body.
fn batch_item(
    raw: &str,
    json: Value,
    identity: impl Fn(&Value) -> Identity,
) -> Result<Item, Refusal> {
    let Identity {
        event_id,
        event_type,
    } = identity(&json);
    Ok(Item {
        event_id: event_id.ok_or(Refusal::MissingEventId)?,
        event_type,
        payload: raw.as_bytes().to_vec(),
        json,
    })
}

/// A verified batch of items already read, each its raw bytes and its JSON object (Adyen's).
///
/// # Errors
/// [`Refusal::MissingEventId`] for the first item `identity` finds no id in.
pub fn batch<'b>(
    items: impl IntoIterator<Item = (&'b str, Value)>,
    identity: impl Fn(&Value) -> Identity,
) -> Result<Received, Refusal> {
    items
        .into_iter()
        .map(|(raw, json)| batch_item(raw, json, &identity))
        .collect::<Result<Vec<_>, _>>()
        .map(Received::Batch)
}

/// A verified batch from a list of events as they stood in the body (SendGrid's array,
/// GoCardless's `events`), each to be a JSON object, read in order.
///
/// # Errors
/// [`Refusal::MissingEventId`] for an empty list; for the first event that fails,
/// [`Refusal::MalformedPayload`] when it is not an object, [`Refusal::MissingEventId`] when
/// `identity` finds no id in it.
pub fn batch_of_events(
    events: Vec<&RawValue>,
    identity: impl Fn(&Value) -> Identity,
) -> Result<Received, Refusal> {
    if events.is_empty() {
        return Err(Refusal::MissingEventId);
    }
    events
        .into_iter()
        .map(|raw| {
            let json: Value =
                serde_json::from_str(raw.get()).map_err(|_| Refusal::MalformedPayload)?;
            if !json.is_object() {
                return Err(Refusal::MalformedPayload);
            }
            batch_item(raw.get(), json, &identity)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Received::Batch)
}

/// Whether some JSON object in `body` names a key twice. A provider that signs values inside the
/// body (Adyen's items, SNS's message) refuses such a body: its check reads one of the two
/// values (serde keeps the last), and the payload stored and forwarded holds both, so a reader
/// that takes the first would act on a value nobody signed. `false` for a body that is not
/// JSON at all (the caller refuses that on its own).
pub fn repeats_a_key(body: &[u8]) -> bool {
    use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

    const REPEATED: &str = "a key repeated";

    /// Any JSON value, read only to look at its objects' keys.
    struct Keys;

    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
            d.deserialize_any(Keys)
        }
    }

    impl<'de> Visitor<'de> for Keys {
        type Value = Keys;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key) {
                    return Err(A::Error::custom(REPEATED));
                }
                map.next_value::<Keys>()?;
            }
            Ok(Keys)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Keys, A::Error> {
            while seq.next_element::<Keys>()?.is_some() {}
            Ok(Keys)
        }

        fn visit_bool<E: Error>(self, _: bool) -> Result<Keys, E> {
            Ok(Keys)
        }
        fn visit_i64<E: Error>(self, _: i64) -> Result<Keys, E> {
            Ok(Keys)
        }
        fn visit_u64<E: Error>(self, _: u64) -> Result<Keys, E> {
            Ok(Keys)
        }
        fn visit_f64<E: Error>(self, _: f64) -> Result<Keys, E> {
            Ok(Keys)
        }
        fn visit_str<E: Error>(self, _: &str) -> Result<Keys, E> {
            Ok(Keys)
        }
        fn visit_unit<E: Error>(self) -> Result<Keys, E> {
            Ok(Keys)
        }
    }

    serde_json::from_slice::<Keys>(body).is_err_and(|e| e.to_string().starts_with(REPEATED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_repeated_in_any_object_is_found_and_nothing_else_is_taken_for_one() {
        for body in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"x":[{"b":true,"c":null,"b":"s"}]}"#,
            br#"{"a\u0062":1,"ab":2}"#,
        ] {
            assert!(repeats_a_key(body), "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"a":{"a":1},"b":[{"a":1},{"a":2}],"n":1.5e3}"#[..],
            b"not json",
            b"[1,2,3]",
        ] {
            assert!(!repeats_a_key(body), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn items_are_trimmed_of_spaces_and_tabs_only() {
        assert_eq!(
            stamp_and_tags("t=1, v1=ab ,\tv1=cd", ',', "t", "v1"),
            (Some("1"), vec!["ab", "cd"])
        );
        // Another kind of whitespace makes another key, as the providers' SDKs read it.
        assert_eq!(
            stamp_and_tags("t\u{b}=1,v1=ab,\u{a0}v1=cd", ',', "t", "v1"),
            (None, vec!["ab"])
        );
    }
    use crate::secret::Secret;

    const PREFIXED_HEX: HeaderMac = HeaderMac {
        header: "X-Sig",
        prefix: "sha256=",
        text: TagText::Hex,
    };

    fn keys(secrets: &[&str]) -> Keys {
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Keys::as_text("test", &secrets).unwrap()
    }

    #[test]
    fn a_signed_header_verifies_under_any_key_and_only_with_its_prefix_and_text() {
        let keys = keys(&["old", "new"]);
        let signed = PREFIXED_HEX.sign(&keys, &[b"a", b"b"]);
        assert!(signed.1.starts_with("sha256="));
        let headers = vec![signed.clone()];
        assert_eq!(PREFIXED_HEX.verify(&keys, &headers, &[b"ab"]), Ok(()));
        assert_eq!(
            PREFIXED_HEX.verify(&keys, &headers, &[b"ab?"]),
            Err(SignatureError::Invalid)
        );
        let unprefixed = vec![(signed.0.clone(), signed.1["sha256=".len()..].to_owned())];
        let spaced = vec![(signed.0.clone(), signed.1.replace('=', "= "))];
        for headers in [unprefixed, spaced, vec![]] {
            assert_eq!(
                PREFIXED_HEX.verify(&keys, &headers, &[b"ab"]),
                Err(SignatureError::Invalid)
            );
        }
        let base64 = HeaderMac {
            text: TagText::Base64,
            prefix: "",
            ..PREFIXED_HEX
        };
        let signed = base64.sign(&keys, &[b"ab"]);
        assert_eq!(base64.verify(&keys, &vec![signed], &[b"ab"]), Ok(()));
    }

    #[test]
    fn id_and_type_headers_follow_the_signature() {
        let signature = ("S".to_owned(), "s".to_owned());
        assert_eq!(
            with_id_and_type(signature.clone(), ("I", "i"), ("T", Some("t"))).len(),
            3
        );
        assert_eq!(
            with_id_and_type(signature, ("I", "i"), ("T", None)),
            vec![("S".into(), "s".into()), ("I".into(), "i".into())]
        );
        assert_eq!(lowercase(&["X-A", "b"]), ["x-a", "b"]);
    }

    #[test]
    fn the_first_stamp_and_every_tag_are_read_and_items_without_equals_skipped() {
        let (stamp, tags) = stamp_and_tags("t=1, v1=a ,junk,v0=b,t=2,v1=c", ',', "t", "v1");
        assert_eq!(stamp, Some("1"));
        assert_eq!(tags, ["a", "c"]);
        assert_eq!(stamp_and_tags("h1=a", ';', "ts", "h1"), (None, vec!["a"]));
    }
}

/// A provider that signs the body with one HMAC in one header and names the event's id and
/// type in two more headers (GitHub, Shopify, Bitbucket): its whole rule set is data, and its
/// file holds that data.
#[derive(Debug)]
pub struct HeaderSigned {
    /// The scheme's name, as configuration spells it.
    pub scheme: &'static str,
    /// The signature header.
    pub mac: HeaderMac,
    /// The header carrying the event id.
    pub id: &'static str,
    /// The header carrying the event type.
    pub kind: &'static str,
    /// How long the provider redelivers, in its own words, where it says.
    pub horizon: Option<(std::time::Duration, &'static str)>,
}

impl HeaderSigned {
    /// A source of this provider: its secrets, used as text; it takes no key of its own.
    ///
    /// # Errors
    /// A key of the source the provider does not take, or no usable secret.
    pub fn build(
        &'static self,
        settings: &Settings<'_>,
    ) -> Result<std::sync::Arc<dyn super::Provider>, ProviderError> {
        Ok(std::sync::Arc::new(HeaderSignedSource {
            rules: self,
            keys: text_keys_only(settings)?,
        }))
    }
}

/// One source of a [`HeaderSigned`] provider.
struct HeaderSignedSource {
    rules: &'static HeaderSigned,
    keys: Keys,
}

/// The scheme and key count, as every provider shows itself; never a key.
impl std::fmt::Debug for HeaderSignedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.rules.scheme)
            .field("keys", &self.keys)
            .finish()
    }
}

impl super::Provider for HeaderSignedSource {
    fn scheme(&self) -> &'static str {
        self.rules.scheme
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        self.rules.mac.verify(&self.keys, headers, &[body])
    }

    /// The id and type are in headers; the body need not be read.
    fn needs_json(&self) -> bool {
        false
    }

    fn identify(
        &self,
        headers: &dyn Headers,
        _json: Option<&serde_json::Value>,
    ) -> super::Identity {
        super::Identity {
            event_id: super::mac::header_id(headers, self.rules.id),
            event_type: super::mac::header_text(headers, self.rules.kind),
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        lowercase(&[self.rules.mac.header, self.rules.id, self.rules.kind])
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        with_id_and_type(
            self.rules.mac.sign(&self.keys, &[body]),
            (self.rules.id, event_id),
            (self.rules.kind, event_type),
        )
    }

    fn redelivery_horizon(&self) -> Option<(std::time::Duration, &'static str)> {
        self.rules.horizon
    }
}
