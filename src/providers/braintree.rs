//! Braintree: an `application/x-www-form-urlencoded` body of `bt_signature` and `bt_payload`.
//! `bt_payload` is the notification's XML in base64; `bt_signature` is `&`-joined
//! `PUBLIC_KEY|HEX` pairs, HEX an HMAC-SHA1 keyed by SHA-1 of the private key over `bt_payload`
//! (or `bt_payload` + `"\n"`, which Braintree's SDKs also accept). The pair for the source's
//! `public_key` must match. Braintree sends no event id: it is `sha256:` + the hex SHA-256 of
//! `bt_payload`, and the type is the notification's `<kind>`. When a destination URL is set,
//! Braintree checks it with `GET ?bt_challenge=C`, answered `PUBLIC_KEY|HEX(HMAC-SHA1(C))` and
//! never stored.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::future::LocalBoxFuture;
use hmac::Hmac;
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::mac::{any_matches_with, tag_with};
use super::{
    receive_now, Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Received,
    Refusal, Settings, SignatureError, Signed,
};

type HmacSha1 = Hmac<Sha1>;

/// A Braintree source: its API key's public key, and its private keys (several while one is
/// being rotated), each kept as SHA-1 of the key, the HMAC key Braintree signs with.
#[derive(Debug)]
pub struct Braintree {
    public_key: String,
    keys: Keys,
}

/// The source's own keys.
const OWN_KEYS: &[&str] = &["public_key"];

/// Builds a Braintree source: `secrets` are the private keys, `public_key` is required.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(OWN_KEYS)?;
    let public_key = settings.text("public_key")?.ok_or_else(|| {
        ProviderError::at(
            "public_key",
            "a braintree source needs the public key of the API key Braintree signs with",
        )
    })?;
    // It is matched against text taken apart at `&` and `|`, and written back the same way.
    if public_key.is_empty() || !public_key.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ProviderError::at(
            "public_key",
            "a Braintree public key is letters and digits, as the Control Panel shows it",
        ));
    }
    Ok(Arc::new(Braintree {
        public_key: public_key.to_owned(),
        keys: Keys::derived(settings.scheme, settings.secrets, |private_key| {
            Ok(Sha1::digest(private_key.as_bytes()).to_vec())
        })?,
    }))
}

impl Provider for Braintree {
    fn scheme(&self) -> &'static str {
        "braintree"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, _headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        let signature = only_field(body, SIGNATURE).ok_or(SignatureError::Invalid)?;
        let payload = only_field(body, PAYLOAD).ok_or(SignatureError::Invalid)?;
        // Braintree's SDKs refuse a payload with anything but base64 and line breaks.
        if payload.is_empty()
            || !payload
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=\n".contains(&b))
        {
            return Err(SignatureError::Invalid);
        }
        let tag = our_tag(&signature, &self.public_key).ok_or(SignatureError::Invalid)?;
        let tags = [tag];
        let matches = any_matches_with::<HmacSha1>(self.keys.all(), &[payload.as_bytes()], &tags)
            || any_matches_with::<HmacSha1>(self.keys.all(), &[payload.as_bytes(), b"\n"], &tags);
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }

    fn needs_json(&self) -> bool {
        false
    }

    /// Both live in the body; see [`identify_body`](Provider::identify_body).
    fn identify(&self, _headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity::default()
    }

    fn identify_body(
        &self,
        _headers: &dyn Headers,
        body: &[u8],
        _json: Option<&serde_json::Value>,
    ) -> Identity {
        let Some(payload) = only_field(body, PAYLOAD) else {
            return Identity::default();
        };
        let base64: Vec<u8> = payload.bytes().filter(|b| *b != b'\n').collect();
        let xml = STANDARD.decode(base64).ok();
        Identity {
            event_id: Some(format!(
                "sha256:{}",
                hex::encode(Sha256::digest(payload.as_bytes()))
            )),
            event_type: xml
                .as_deref()
                .and_then(|xml| std::str::from_utf8(xml).ok())
                .and_then(kind_of),
        }
    }

    fn id_in_body(&self) -> bool {
        true
    }

    /// A `bt_payload` verifies with and without its last line break (the signature covers
    /// `bt_payload` or `bt_payload` + `"\n"`), and the two forms hash to two ids: the key is
    /// the payload as signed, ending in one line break, so the other form of a stored
    /// notification is its replay (with [`dedupes_body`](Provider::dedupes_body)).
    fn signed_payload_key(&self, inbound: &Inbound<'_>) -> Option<[u8; 32]> {
        let payload = only_field(inbound.body, PAYLOAD)?;
        let mut hasher = Sha256::new();
        hasher.update(b"braintree payload:");
        hasher.update(payload.as_bytes());
        if !payload.ends_with('\n') {
            hasher.update(b"\n");
        }
        Some(hasher.finalize().into())
    }

    /// The id is a hash of `bt_payload` as sent, which verifies in two forms: see
    /// [`signed_payload_key`](Provider::signed_payload_key).
    fn dedupes_body(&self) -> bool {
        true
    }

    /// None: the signature travels in the body, and a capture keeps the body whole.
    fn kept_headers(&self) -> Vec<String> {
        Vec::new()
    }

    /// Braintree sends no signature header: [`sign_delivery`](Provider::sign_delivery) signs
    /// inside the body.
    fn sign(
        &self,
        _body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        Vec::new()
    }

    /// A form body (a capture's, with `bt_payload`) gets a fresh `bt_signature` for this
    /// source's public key, every other byte kept; any other body is taken as the
    /// notification's XML and sent as Braintree would, base64 in `bt_payload`.
    fn sign_delivery(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Signed {
        let body = match only_field(body, PAYLOAD) {
            Some(payload) => {
                let signature = self.signature_of(payload.as_bytes());
                with_signature(body, &signature)
            }
            None => {
                let payload = STANDARD.encode(body);
                let signature = self.signature_of(payload.as_bytes());
                format!(
                    "{SIGNATURE}={}&{PAYLOAD}={}",
                    encoded(&signature),
                    encoded(&payload)
                )
                .into_bytes()
            }
        };
        Signed {
            body,
            query: None,
            headers: Vec::new(),
            content_type: Some(FORM),
        }
    }

    fn answers_get(&self) -> bool {
        true
    }

    /// `bt_signature` holds a pair per API key of the merchant, so adding or rotating a key
    /// changes it between deliveries of one notification.
    fn volatile_fields(&self) -> &'static [&'static str] {
        &["/bt_signature"]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(24 * 3600),
            "Braintree resends a notification every hour for up to 24 hours",
        ))
    }

    /// A `GET` is the destination URL's check; anything else a notification.
    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        let received = if inbound.method.eq_ignore_ascii_case("GET") {
            self.challenge(inbound.query)
        } else {
            receive_now(self, inbound).and_then(only_notifications)
        };
        Box::pin(std::future::ready(received))
    }
}

impl Braintree {
    /// `PUBLIC_KEY|HEX` of `content` under the first private key.
    fn signature_of(&self, content: &[u8]) -> String {
        let tag = tag_with::<HmacSha1>(self.keys.first(), &[content]);
        format!("{}|{}", self.public_key, hex::encode(tag))
    }

    /// The answer to `?bt_challenge=C`: C as Braintree's SDKs take it (20 to 32 lowercase hex
    /// digits, once), signed with the first private key. Anything else is malformed.
    fn challenge(&self, query: &str) -> Result<Received, Refusal> {
        let malformed = Refusal::Malformed(
            "bt_challenge is not one challenge of 20 to 32 lowercase hex digits, as Braintree sends",
        );
        let challenge = only_field(query.as_bytes(), CHALLENGE).ok_or(malformed)?;
        let well_formed = (20..=32).contains(&challenge.len())
            && challenge
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(malformed);
        }
        Ok(Received::Handshake(Answer {
            status: 200,
            content_type: "text/plain",
            body: self.signature_of(challenge.as_bytes()).into_bytes(),
        }))
    }
}

/// A verified delivery is stored only when its payload is a notification: base64 of XML whose
/// root is `<notification>` with a `<kind>`, which is all Braintree sends and all its SDKs
/// parse. The challenge answer is the very tag a `bt_payload` of the challenge's text would
/// carry (one key, one HMAC), and anyone may ask for it; such a payload (hex digits) is base64
/// of bytes that are no XML, so it is refused here and the answer signs nothing stored.
fn only_notifications(received: Received) -> Result<Received, Refusal> {
    match received {
        // The type is the notification's kind, so an event without one is no notification.
        Received::Event(incoming) if incoming.event_type.is_none() => Err(Refusal::Malformed(
            "bt_payload is not a Braintree notification (base64 of XML with a <notification> \
             root and its <kind>)",
        )),
        other => Ok(other),
    }
}

const SIGNATURE: &str = "bt_signature";
const PAYLOAD: &str = "bt_payload";
const CHALLENGE: &str = "bt_challenge";
const FORM: &str = "application/x-www-form-urlencoded";

/// The decoded value of form field `name` when the form has it exactly once: a field given
/// twice could be read either way by whatever sits in front, so it counts as absent.
fn only_field<'f>(form: &'f [u8], name: &str) -> Option<Cow<'f, str>> {
    let mut values = form_urlencoded::parse(form)
        .filter(|(field, _)| field == name)
        .map(|(_, value)| value);
    let value = values.next()?;
    values.next().is_none().then_some(value)
}

/// The tag of the first `PUBLIC_KEY|HEX` pair for `public_key`, as Braintree's SDKs pick it.
fn our_tag(signature: &str, public_key: &str) -> Option<Vec<u8>> {
    let hex_tag = signature
        .split('&')
        .filter_map(|pair| pair.split_once('|'))
        .find(|(key, _)| *key == public_key)
        .map(|(_, tag)| tag)?;
    // Lowercase hex only, as the SDKs compare it.
    if hex_tag.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    hex::decode(hex_tag).ok()
}

/// A form value, encoded as a browser (and Braintree) would.
fn encoded(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// `form` with its `bt_signature` field replaced by `signature` (or one put first when it has
/// none); every other field is kept byte for byte, so `bt_payload`, and with it the event id,
/// stays what it was.
fn with_signature(form: &[u8], signature: &str) -> Vec<u8> {
    let field = format!("{SIGNATURE}={}", encoded(signature)).into_bytes();
    let mut fields: Vec<&[u8]> = Vec::new();
    let mut placed = false;
    for part in form.split(|b| *b == b'&') {
        let name = form_urlencoded::parse(part).next().map(|(name, _)| name);
        if name.as_deref() == Some(SIGNATURE) {
            if !placed {
                fields.push(&field);
                placed = true;
            }
        } else {
            fields.push(part);
        }
    }
    if !placed {
        fields.insert(0, &field);
    }
    fields.join(&b'&')
}

/// The text of the `<kind>` element that is a child of the XML's root `<notification>`, as
/// Braintree puts a notification's kind; a `<kind>` deeper down (a dispute's own kind) is not
/// it, and XML with another root is no notification. A minimal
/// reader, enough for Braintree's payloads: no DTD (so no entity can expand), comments and
/// processing instructions skipped, the five predefined entities and character references
/// decoded. `None` when the XML is not what it expects.
fn kind_of(xml: &str) -> Option<String> {
    let mut depth = 0usize;
    let mut rest = xml;
    loop {
        let open = rest.find('<')?;
        rest = &rest[open..];
        if let Some(after) = rest.strip_prefix("<?") {
            rest = &after[after.find("?>")? + 2..];
        } else if let Some(after) = rest.strip_prefix("<!--") {
            rest = &after[after.find("-->")? + 3..];
        } else if rest.starts_with("<!") {
            // A DTD or CDATA: not in Braintree's payloads, and a DTD may declare entities.
            return None;
        } else if let Some(after) = rest.strip_prefix("</") {
            depth = depth.checked_sub(1)?;
            if depth == 0 {
                return None;
            }
            rest = &after[after.find('>')? + 1..];
        } else {
            let end = tag_end(rest)?;
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            if tag.ends_with('/') {
                continue;
            }
            depth += 1;
            let name = tag.split(|c: char| c.is_ascii_whitespace()).next()?;
            if depth == 1 && name != "notification" {
                return None;
            }
            if depth == 2 && name == "kind" {
                let text = &rest[..rest.find('<')?];
                // An empty kind (`<kind></kind>`) names no kind, as `<kind/>` does not.
                return rest[text.len()..]
                    .starts_with("</kind>")
                    .then(|| unescape(text))
                    .flatten()
                    .filter(|kind| !kind.trim().is_empty());
            }
        }
    }
}

/// Where a start tag that begins `text` ends (its `>`), skipping quoted attribute values.
fn tag_end(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    for (index, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '>') => return Some(index),
            (None, _) => {}
        }
    }
    None
}

/// XML text with its references decoded; `None` for a reference it does not know.
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp + 1..];
        let semi = rest.find(';')?;
        let reference = &rest[..semi];
        rest = &rest[semi + 1..];
        let decoded = match reference {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = reference.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()?
                } else {
                    reference.strip_prefix('#')?.parse().ok()?
                };
                char::from_u32(code)?
            }
        };
        out.push(decoded);
    }
    out.push_str(rest);
    Some(out.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::super::{Provider, Received, Refusal, Registry, SignatureError};
    use super::*;
    use crate::secret::Secret;

    const PRIVATE: &str = "3c9a7e1f0b5d8246a1e7c0d9f2b4a6e8";
    const PUBLIC: &str = "6ntq5k2x9rwbz8mc";

    fn braintree(secrets: &[&str]) -> Arc<dyn Provider> {
        let mut table = toml::Table::new();
        table.insert("public_key".into(), toml::Value::String(PUBLIC.into()));
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Registry::builtin()
            .scheme("braintree", Some(table))
            .expect("built in")
            .build(&secrets, Duration::from_secs(300))
            .expect("valid")
    }

    const XML: &str = "<?xml version=\"1.0\"?>\n<!-- sample -->\n<notification>\n  \
        <timestamp type=\"datetime\">2025-11-20T14:29:52Z</timestamp>\n  \
        <subject><dispute><kind>chargeback</kind><id a='>'>d_1</id><empty/></dispute></subject>\n  \
        <kind>dispute_opened</kind>\n</notification>\n";

    #[test]
    fn the_kind_is_the_root_element_s_own_not_a_nested_one() {
        assert_eq!(kind_of(XML).as_deref(), Some("dispute_opened"));
        assert_eq!(
            kind_of("<notification><kind> a&amp;b&#x21; </kind></notification>").as_deref(),
            Some("a&b!")
        );
        for bad in [
            "",
            "<notification><kind>open",
            "<notification></notification><kind>x</kind>",
            "<notification><kind>a<b/></kind></notification>",
            "<!DOCTYPE n [<!ENTITY e \"x\">]><notification><kind>&e;</kind></notification>",
            "<notification><kind>&e;</kind></notification>",
            "<notification><other>x</other></notification>",
            "<notification><kind></kind></notification>",
            "<notification><kind> </kind></notification>",
            "<n><kind>x</kind></n>",
            "<kind>top</kind>",
            "</notification><kind>x</kind>",
        ] {
            assert_eq!(kind_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn send_signs_an_xml_notification_as_braintree_would_and_it_verifies() {
        let provider = braintree(&[PRIVATE]);
        let signed = provider.sign_delivery(XML.as_bytes(), 0, "ignored", None);
        assert_eq!(signed.content_type, Some(FORM));
        assert!(signed.headers.is_empty() && signed.query.is_none());
        assert_eq!(provider.verify(&headers(&[]), &signed.body, 0), Ok(()));
        let identity = provider.identify_body(&headers(&[]), &signed.body, None);
        assert_eq!(identity.event_type.as_deref(), Some("dispute_opened"));
        let payload = only_field(&signed.body, PAYLOAD).expect("a payload");
        assert_eq!(
            identity.event_id,
            Some(format!(
                "sha256:{}",
                hex::encode(Sha256::digest(payload.as_bytes()))
            ))
        );
        // Re-signing a form keeps every other byte, so the id stays; under another key the
        // signature changes, which the fingerprint leaves out.
        let other = braintree(&["another private key"]);
        let resigned = other.sign_delivery(&signed.body, 0, "ignored", None);
        assert_ne!(resigned.body, signed.body);
        assert_eq!(
            other.identify_body(&headers(&[]), &resigned.body, None),
            identity
        );
        assert_eq!(
            crate::inbox::fingerprint(provider.volatile_fields(), &signed.body, None),
            crate::inbox::fingerprint(provider.volatile_fields(), &resigned.body, None)
        );
        assert_eq!(
            provider.verify(&headers(&[]), &resigned.body, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_form_without_our_pair_or_with_a_field_twice_is_invalid() {
        let provider = braintree(&[PRIVATE]);
        let signed = provider.sign_delivery(XML.as_bytes(), 0, "", None).body;
        let text = String::from_utf8(signed.clone()).expect("ASCII");
        let cases = [
            text.replace(PUBLIC, "someoneelse0000"),
            format!("{text}&bt_payload=PG4%2B"),
            format!("{text}&bt_signature=x%7Cy"),
            text.replace("bt_signature", "bt_sig"),
            text.replace("%2B", "+"),
            String::new(),
        ];
        for body in cases {
            assert_eq!(
                provider.verify(&headers(&[]), body.as_bytes(), 0),
                Err(SignatureError::Invalid),
                "{body}"
            );
        }
        // The hex in upper case is not how Braintree writes it.
        let pair = only_field(&signed, SIGNATURE).expect("signed");
        let upper = text.replace(
            &encoded(&pair),
            &encoded(&format!(
                "{PUBLIC}|{}",
                pair[PUBLIC.len() + 1..].to_uppercase()
            )),
        );
        assert_eq!(
            provider.verify(&headers(&[]), upper.as_bytes(), 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn the_challenge_is_answered_with_the_first_key_and_a_bad_one_is_malformed() {
        let provider = braintree(&[PRIVATE, "older"]);
        let no_headers = headers(&[]);
        let get = |query: &'static str| Inbound {
            method: "GET",
            query,
            headers: &no_headers,
            body: b"",
            now: 0,
        };
        let answer = provider
            .receive(&get("bt_challenge=20f9f8ed05f77439fe955c977e4c8a53"))
            .now_or_never()
            .expect("ready");
        assert_eq!(
            answer,
            Ok(Received::Handshake(Answer {
                status: 200,
                content_type: "text/plain",
                body: b"6ntq5k2x9rwbz8mc|9c2db88fb6d919552271f8027c6c8e2235036c19".to_vec(),
            }))
        );
        for query in [
            "",
            "bt_challenge=",
            "bt_challenge=20F9F8ED05F77439FE955C977E4C8A53",
            "bt_challenge=20f9f8ed05f77439fe9",
            "bt_challenge=20f9f8ed05f77439fe955c977e4c8a531",
            "bt_challenge=20f9f8ed05f77439fe955c977e4c8a53&bt_challenge=20f9f8ed05f77439fe955c977e4c8a53",
        ] {
            let refused = provider.receive(&get(query)).now_or_never().expect("ready");
            assert!(
                matches!(refused, Err(Refusal::Malformed(_))),
                "{query:?}"
            );
        }
        let shortest = get("bt_challenge=20f9f8ed05f77439fe95");
        assert!(matches!(
            provider.receive(&shortest).now_or_never(),
            Some(Ok(Received::Handshake(_)))
        ));
        assert!(provider.answers_get() && provider.id_in_body() && !provider.needs_json());
    }

    #[test]
    fn public_key_is_required_and_plain() {
        let registry = Registry::builtin();
        let secrets = [Secret::new(PRIVATE)];
        let error = registry
            .scheme("braintree", Some(toml::Table::new()))
            .expect("built in")
            .build(&secrets, Duration::ZERO)
            .unwrap_err();
        assert_eq!(error.key, "public_key");
        let mut table = toml::Table::new();
        table.insert("public_key".into(), toml::Value::String("a|b".into()));
        let error = registry
            .scheme("braintree", Some(table))
            .expect("built in")
            .build(&secrets, Duration::ZERO)
            .unwrap_err();
        assert_eq!(error.key, "public_key");
        let shown = format!("{:?}", braintree(&[PRIVATE]));
        assert!(!shown.contains(PRIVATE), "{shown}");
    }

    use futures_util::FutureExt;
}
