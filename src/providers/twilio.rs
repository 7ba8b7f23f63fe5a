//! Twilio: `X-Twilio-Signature` = base64 HMAC-SHA1, keyed by the account's auth token, over the
//! URL Twilio requested followed by every form field of the body as `name` + `value`, sorted by
//! name (Twilio's RequestValidator rules). A JSON body (Event Streams) is signed through the
//! URL alone, whose query carries `bodySHA256=<hex SHA-256 of the body>`. The URL is the
//! source's `public_url` as registered with Twilio, never the request's `Host`: behind a proxy
//! hookbox cannot know what Twilio called, so it is told. Only the query is the request's own,
//! byte for byte, since Twilio adds to it.
//!
//! Twilio's newer SharedKey signing (`X-Twilio-Webhooks-Signature-Settings:
//! key=<id>,algorithm=HMAC_SHA256`) signs the same text with HMAC-SHA256 keyed by the
//! SharedKey's secret, which then goes in `secrets` beside (or instead of) the auth token. The
//! header names the algorithm, as the twilio SDK's `get_signature_algorithm` reads it: without
//! one, HMAC-SHA1; an algorithm it does not know never matches. `send` and `replay` sign with
//! HMAC-SHA1, as the contract has it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use futures_util::future::LocalBoxFuture;
use hmac::Hmac;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::mac::{any_matches_with, header_id, required_header, tag_with};
use super::{
    receive_verified, Headers, Identity, Inbound, Keys, Provider, ProviderError, Received, Refusal,
    Settings, SignatureError, Signed,
};

type HmacSha1 = Hmac<Sha1>;
type HmacSha256 = Hmac<Sha256>;

/// The MAC a delivery's signature was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    /// The auth token's, and what a delivery without a settings header is signed with.
    Sha1,
    /// A SharedKey's.
    Sha256,
}

impl Algorithm {
    /// What `X-Twilio-Webhooks-Signature-Settings` names (the twilio SDK's
    /// `get_signature_algorithm`: the first non-empty `algorithm=` among its comma-separated
    /// parts, in any case); `None` for an algorithm it does not know.
    fn of(headers: &dyn Headers) -> Option<Algorithm> {
        let settings = match headers.get(SIGNATURE_SETTINGS) {
            None => "",
            Some(value) => std::str::from_utf8(value).ok()?,
        };
        let named = settings.split(',').find_map(|part| {
            let (name, value) = part.split_once('=')?;
            (name.trim() == "algorithm" && !value.trim().is_empty()).then(|| value.trim())
        });
        match named {
            None => Some(Algorithm::Sha1),
            Some(name) if name.eq_ignore_ascii_case("HMAC_SHA1") => Some(Algorithm::Sha1),
            Some(name) if name.eq_ignore_ascii_case("HMAC_SHA256") => Some(Algorithm::Sha256),
            Some(_) => None,
        }
    }
}

/// A Twilio source: its auth tokens (several while one is being rotated) and the URL Twilio
/// signs.
#[derive(Debug)]
pub struct Twilio {
    keys: Keys,
    url: PublicUrl,
    /// Built to sign: the query the request already carries (`--to`'s), which the receiver
    /// checks in place of `public_url`'s.
    to_query: Option<String>,
}

/// The source's own keys.
const OWN_KEYS: &[&str] = &["public_url"];

/// Builds a Twilio source: `secrets` are auth tokens, `public_url` is required.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(OWN_KEYS)?;
    let text = settings.text("public_url")?.ok_or_else(|| {
        ProviderError::at(
            "public_url",
            "a twilio source needs the URL as configured in Twilio (Twilio signs it), e.g. \
             \"https://hooks.example.com/webhooks/twilio\"",
        )
    })?;
    Ok(Arc::new(Twilio {
        keys: Keys::as_text(settings.scheme, settings.secrets)?,
        url: PublicUrl::parse(text).map_err(|problem| ProviderError::at("public_url", problem))?,
        to_query: settings
            .signing
            .and_then(|signing| signing.to_query.clone())
            .filter(|query| !query.is_empty()),
    }))
}

impl Provider for Twilio {
    fn scheme(&self) -> &'static str {
        "twilio"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    /// Checks as if the request's query were the one of `public_url`; the server passes the
    /// request's own query through [`receive`](Provider::receive).
    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        self.check(headers, body, "")
    }

    fn needs_json(&self) -> bool {
        false
    }

    /// The id header; without the body, nothing else is known (see
    /// [`identify_body`](Provider::identify_body)).
    fn identify(&self, headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_id(headers, IDEMPOTENCY_TOKEN),
            event_type: None,
        }
    }

    fn identify_body(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        json: Option<&serde_json::Value>,
    ) -> Identity {
        // Two token lines are no id at all (refused as missing, as a repeated id header is
        // for every provider), not a delivery without one: the body hash would make each
        // such retry a new event.
        let event_id = match headers.all(IDEMPOTENCY_TOKEN).as_slice() {
            [_, _, ..] => None,
            _ => Some(
                header_id(headers, IDEMPOTENCY_TOKEN)
                    .filter(|token| !token.is_empty())
                    .unwrap_or_else(|| format!("sha256:{}", hex::encode(Sha256::digest(body)))),
            ),
        };
        let event_type = match json {
            Some(_) => None,
            None => STATUS_FIELDS.iter().find_map(|name| {
                form_urlencoded::parse(body)
                    .find(|(field, _)| field == name)
                    .map(|(_, value)| value.into_owned())
            }),
        };
        Identity {
            event_id,
            event_type,
        }
    }

    fn kept_headers(&self) -> Vec<String> {
        KEPT_HEADERS.iter().map(|name| (*name).to_owned()).collect()
    }

    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        self.sign_delivery(body, timestamp, event_id, event_type)
            .headers
    }

    /// A JSON body is sent with `bodySHA256` on the URL, as Event Streams sends it; any other
    /// body as a form, as Twilio's webhooks send it. The id travels in
    /// `I-Twilio-Idempotency-Token`.
    fn sign_delivery(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        _event_type: Option<&str>,
    ) -> Signed {
        let is_json = serde_json::from_slice::<serde_json::Value>(body).is_ok();
        // The receiver checks the request's query when it has one, else `public_url`'s; a
        // request sent where `--to` has a query of its own carries that one, not
        // `public_url`'s, with what is added here after it.
        let own = match &self.to_query {
            Some(_) => None,
            None => self.url.query.clone().filter(|query| !query.is_empty()),
        };
        let (added, content_type) = if is_json {
            let hash = format!("bodySHA256={}", hex::encode(Sha256::digest(body)));
            (Some(joined(own.as_deref(), &hash)), None)
        } else {
            (own, Some(FORM))
        };
        let sent = match (&self.to_query, &added) {
            (Some(given), Some(added)) => joined(Some(given), added),
            (Some(given), None) => given.clone(),
            (None, added) => added.clone().unwrap_or_default(),
        };
        let url = self.url.as_written(&sent);
        let fields = if is_json {
            Vec::new()
        } else {
            sorted_fields(body)
        };
        let tag = tag_with::<HmacSha1>(self.keys.first(), &signed_parts(url.as_bytes(), &fields));
        let mut headers = vec![(SIGNATURE.to_owned(), STANDARD.encode(tag))];
        if !event_id.is_empty() {
            headers.push((IDEMPOTENCY_TOKEN.to_owned(), event_id.to_owned()));
        }
        Signed {
            body: body.to_vec(),
            query: added,
            headers,
            content_type,
        }
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(4 * 3600),
            "Twilio's Event Streams retries a delivery for up to 4 hours (its other webhooks \
             retry within 15 seconds)",
        ))
    }

    /// What a form delivery's signature covers past the source's own URL: the query it was
    /// signed with, then the sorted fields, joined as the check joins them (without
    /// separators, so fields re-split across names verify alike and key alike). A JSON
    /// delivery's exact bytes are signed, so its fingerprint serves.
    fn signed_payload_key(&self, inbound: &Inbound<'_>) -> Option<[u8; 32]> {
        let query = self.signed_query(inbound.query);
        if body_hash_in(query).is_some() {
            return None;
        }
        let fields = sorted_fields(inbound.body);
        // Apart from any fingerprint (the SHA-256 of a body): a JSON body's is the key.
        let mut hasher = Sha256::new();
        hasher.update(b"twilio form:");
        for part in signed_parts(query.as_bytes(), &fields) {
            hasher.update(part);
        }
        Some(hasher.finalize().into())
    }

    /// The check needs the request's query, which Twilio signs.
    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        let received = self
            .check(inbound.headers, inbound.body, inbound.query)
            .map_err(Refusal::from)
            .and_then(|()| receive_verified(self, inbound));
        Box::pin(std::future::ready(received))
    }
}

impl Twilio {
    /// The query Twilio signed: the request's, or where it came with none, `public_url`'s.
    fn signed_query<'q>(&'q self, query: &'q str) -> &'q str {
        if query.is_empty() {
            self.url.query.as_deref().unwrap_or("")
        } else {
            query
        }
    }

    /// Twilio's RequestValidator: the URL (with the request's query, else `public_url`'s),
    /// with and without its port, then the sorted form fields, or for a `bodySHA256` query the
    /// URL alone and the body's hash.
    fn check(&self, headers: &dyn Headers, body: &[u8], query: &str) -> Result<(), SignatureError> {
        let signature = required_header(headers, SIGNATURE)?;
        let algorithm = Algorithm::of(headers).ok_or(SignatureError::Invalid)?;
        let tag = STANDARD
            .decode(signature)
            .map_err(|_| SignatureError::Invalid)?;
        let query = self.signed_query(query);
        let body_hash = body_hash_in(query);
        let fields = match &body_hash {
            Some(_) => Vec::new(),
            None => sorted_fields(body),
        };
        let body_ok = match &body_hash {
            None => true,
            Some(wanted) => {
                let actual = hex::encode(Sha256::digest(body));
                bool::from(actual.as_bytes().ct_eq(wanted.as_bytes()))
            }
        };
        let urls = self.url.variants(query);
        let tags = [tag];
        let signed = urls.iter().any(|url| {
            let parts = signed_parts(url.as_bytes(), &fields);
            match algorithm {
                Algorithm::Sha1 => any_matches_with::<HmacSha1>(self.keys.all(), &parts, &tags),
                Algorithm::Sha256 => any_matches_with::<HmacSha256>(self.keys.all(), &parts, &tags),
            }
        });
        if signed && body_ok {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }
}

const SIGNATURE: &str = "X-Twilio-Signature";
const SIGNATURE_SETTINGS: &str = "X-Twilio-Webhooks-Signature-Settings";
const IDEMPOTENCY_TOKEN: &str = "I-Twilio-Idempotency-Token";
const FORM: &str = "application/x-www-form-urlencoded";

/// What a capture keeps.
const KEPT_HEADERS: &[&str] = &[
    "x-twilio-signature",
    "i-twilio-idempotency-token",
    "x-twilio-webhooks-signature-settings",
];

/// The form fields that name what happened, in the order they are looked for.
const STATUS_FIELDS: &[&str] = &["MessageStatus", "CallStatus", "SmsStatus"];

/// The `bodySHA256` a query carries (a JSON delivery's), if any.
fn body_hash_in(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, value)| name == "bodySHA256" && !value.is_empty())
        .map(|(_, value)| value.into_owned())
}

/// `first&second`, or `second` alone.
fn joined(first: Option<&str>, second: &str) -> String {
    match first {
        Some(first) if !first.is_empty() => format!("{first}&{second}"),
        _ => second.to_owned(),
    }
}

/// A form's fields as Twilio signs them: by name, then each distinct value in order.
fn sorted_fields(body: &[u8]) -> Vec<(String, String)> {
    let mut fields: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, value) in form_urlencoded::parse(body) {
        fields
            .entry(name.into_owned())
            .or_default()
            .insert(value.into_owned());
    }
    fields
        .into_iter()
        .flat_map(|(name, values)| values.into_iter().map(move |value| (name.clone(), value)))
        .collect()
}

/// What Twilio signs: the URL, then each field's name and value.
fn signed_parts<'a>(url: &'a [u8], fields: &'a [(String, String)]) -> Vec<&'a [u8]> {
    let mut parts = Vec::with_capacity(1 + 2 * fields.len());
    parts.push(url);
    for (name, value) in fields {
        parts.push(name.as_bytes());
        parts.push(value.as_bytes());
    }
    parts
}

/// `public_url` taken apart: what comes before the query, in the two forms Twilio may sign
/// (without a port, and with one: the written or the scheme's default), and the query and
/// fragment as written.
#[derive(Debug)]
struct PublicUrl {
    written: String,
    without_port: String,
    with_port: String,
    query: Option<String>,
    fragment: Option<String>,
}

impl PublicUrl {
    fn parse(text: &str) -> Result<PublicUrl, String> {
        let (scheme, rest) = if let Some(rest) = text.strip_prefix("https://") {
            ("https", rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            ("http", rest)
        } else {
            return Err("must be an https:// (or http://) URL, as configured in Twilio".into());
        };
        if text.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err("must not hold spaces or control characters".into());
        }
        let (before_fragment, fragment) = match rest.split_once('#') {
            Some((before, fragment)) => (before, Some(fragment.to_owned())),
            None => (rest, None),
        };
        let (before_query, query) = match before_fragment.split_once('?') {
            Some((before, query)) => (before, Some(query.to_owned())),
            None => (before_fragment, None),
        };
        let path_at = before_query.find('/').unwrap_or(before_query.len());
        let (authority, path) = before_query.split_at(path_at);
        if authority.is_empty() || authority.contains('@') {
            return Err("must name a host (and no user:password@)".into());
        }
        let host_end = authority.rfind(']').map_or(0, |bracket| bracket + 1);
        let (host, port) = match authority[host_end..].rfind(':') {
            Some(colon) => {
                let colon = host_end + colon;
                let port = &authority[colon + 1..];
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("has a port that is not a number".into());
                }
                (&authority[..colon], Some(port))
            }
            None => (authority, None),
        };
        if host.is_empty() {
            return Err("must name a host".into());
        }
        let default_port = if scheme == "https" { "443" } else { "80" };
        Ok(PublicUrl {
            written: format!("{scheme}://{before_query}"),
            without_port: format!("{scheme}://{host}{path}"),
            with_port: format!("{scheme}://{host}:{}{path}", port.unwrap_or(default_port)),
            query,
            fragment,
        })
    }

    /// The URL with `query` in place of its own, each way Twilio may have signed it.
    fn variants(&self, query: &str) -> Vec<String> {
        let mut urls = vec![
            self.complete(&self.without_port, query),
            self.complete(&self.with_port, query),
        ];
        urls.dedup();
        urls
    }

    /// The URL as written in the config, with `query` in place of its own.
    fn as_written(&self, query: &str) -> String {
        self.complete(&self.written, query)
    }

    fn complete(&self, base: &str, query: &str) -> String {
        let mut url = base.to_owned();
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        if let Some(fragment) = &self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        url
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::super::{Provider, Registry};
    use super::*;
    use crate::secret::Secret;
    use futures_util::FutureExt;

    const TOKEN: &str = "12345";
    // Twilio's documented example (webhooks security page).
    const URL: &str = "https://mycompany.com/myapp.php?foo=1&bar=2";
    const FORM_BODY: &[u8] = b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030&To=%2B18005551212";
    const GOOD: &str = "0/KCTR6DLpKmkAf8muzZqo1nDgQ=";

    fn twilio(url: &str, secrets: &[&str]) -> Arc<dyn Provider> {
        let mut table = toml::Table::new();
        table.insert("public_url".into(), toml::Value::String(url.into()));
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Registry::builtin()
            .scheme("twilio", Some(table))
            .expect("built in")
            .build(&secrets, Duration::from_secs(300))
            .expect("valid")
    }

    fn receive(
        provider: &Arc<dyn Provider>,
        query: &str,
        signed: &[(String, String)],
        body: &[u8],
    ) -> Result<Received, Refusal> {
        let inbound = Inbound {
            method: "POST",
            query,
            headers: &signed.to_vec(),
            body,
            now: 0,
        };
        provider.receive(&inbound).now_or_never().expect("ready")
    }

    #[test]
    fn a_token_header_given_twice_is_no_id_and_none_falls_back_to_the_body_hash() {
        let provider = twilio(URL, &[TOKEN]);
        let with = |tokens: &[&str]| {
            let mut signed = headers(&[("X-Twilio-Signature", GOOD)]);
            for token in tokens {
                signed.push(("I-Twilio-Idempotency-Token".into(), (*token).into()));
            }
            receive(&provider, "", &signed, FORM_BODY).map(|received| match received {
                Received::Event(event) => event.event_id,
                _ => panic!("an event"),
            })
        };
        assert_eq!(with(&["tok-1"]), Ok("tok-1".to_owned()));
        assert_eq!(with(&["tok-1", "tok-2"]), Err(Refusal::MissingEventId));
        assert_eq!(with(&["tok-1", "tok-1"]), Err(Refusal::MissingEventId));
        let hashed = with(&[]).expect("an event");
        assert_eq!(
            hashed,
            format!("sha256:{}", hex::encode(Sha256::digest(FORM_BODY)))
        );
    }

    #[test]
    fn twilio_s_documented_example_verifies_through_the_request_query() {
        let provider = twilio("https://mycompany.com/myapp.php", &["wrong", TOKEN]);
        let signed = headers(&[("X-Twilio-Signature", GOOD)]);
        assert!(receive(&provider, "foo=1&bar=2", &signed, FORM_BODY).is_ok());
        // The query is the request's, byte for byte: reordered, it is another URL.
        assert_eq!(
            receive(&provider, "bar=2&foo=1", &signed, FORM_BODY),
            Err(Refusal::Signature(SignatureError::Invalid))
        );
        // With the query in public_url, verify alone has what it needs.
        let configured = twilio(URL, &[TOKEN]);
        assert_eq!(configured.verify(&signed, FORM_BODY, 0), Ok(()));
        // Fields in another order are the same fields.
        let reordered = b"To=%2B18005551212&Digits=1234&CallSid=CA1234567890ABCDE&Caller=%2B12349013030&From=%2B12349013030";
        assert_eq!(configured.verify(&signed, reordered, 0), Ok(()));
    }

    #[test]
    fn the_url_verifies_with_and_without_its_default_port_but_not_another_host() {
        let signed = headers(&[("X-Twilio-Signature", GOOD)]);
        for url in [
            "https://mycompany.com:443/myapp.php?foo=1&bar=2",
            "https://mycompany.com:8443/myapp.php?foo=1&bar=2",
        ] {
            assert_eq!(
                twilio(url, &[TOKEN]).verify(&signed, FORM_BODY, 0),
                Ok(()),
                "{url}"
            );
        }
        for url in [
            "http://mycompany.com/myapp.php?foo=1&bar=2",
            "https://mycompany.org/myapp.php?foo=1&bar=2",
            "https://mycompany.com/myapp.php?foo=1&bar=2#rc=2",
        ] {
            assert_eq!(
                twilio(url, &[TOKEN]).verify(&signed, FORM_BODY, 0),
                Err(SignatureError::Invalid),
                "{url}"
            );
        }
    }

    #[test]
    fn send_signs_forms_and_json_bodies_as_twilio_would() {
        let provider = twilio("https://hooks.example.com/webhooks/twilio", &[TOKEN]);
        let form = b"MessageSid=SM1&MessageStatus=delivered&SmsStatus=sent";
        let signed = provider.sign_delivery(form, 0, "tok-1", None);
        assert_eq!(signed.content_type, Some(FORM));
        assert_eq!(signed.query, None);
        assert!(receive(&provider, "", &signed.headers, form).is_ok());
        let identity = provider.identify_body(&signed.headers, form, None);
        assert_eq!(identity.event_id.as_deref(), Some("tok-1"));
        assert_eq!(identity.event_type.as_deref(), Some("delivered"));

        let json = br#"[{"type":"com.twilio.messaging.message.delivered"}]"#;
        let signed = provider.sign_delivery(json, 0, "", None);
        let query = signed.query.clone().expect("bodySHA256");
        let hash = hex::encode(Sha256::digest(json));
        assert_eq!(query, format!("bodySHA256={hash}"));
        assert_eq!(signed.content_type, None);
        assert!(receive(&provider, &query, &signed.headers, json).is_ok());
        // Without the query it is checked as a form, and fails.
        assert!(receive(&provider, "", &signed.headers, json).is_err());
        let parsed: serde_json::Value = serde_json::from_slice(json).expect("JSON");
        let identity = provider.identify_body(&headers(&[]), json, Some(&parsed));
        assert_eq!(identity.event_id, Some(format!("sha256:{hash}")));
        assert_eq!(identity.event_type, None);
    }

    #[test]
    fn send_to_a_url_with_a_query_signs_that_query_as_the_request_carries_it() {
        // `send --to 'http://host:8080?tenant=a'` posts to `/webhooks/twilio?tenant=a` (and
        // `&bodySHA256=...` for JSON): the receiver checks the request's query, so that is
        // the one to sign, whatever `public_url`'s is.
        for public_url in [
            "https://hooks.example.com/webhooks/twilio",
            "https://hooks.example.com/webhooks/twilio?own=1",
        ] {
            let mut table = toml::Table::new();
            table.insert("public_url".into(), toml::Value::String(public_url.into()));
            let signing = super::super::Signing {
                to_query: Some("tenant=a".to_owned()),
                ..Default::default()
            };
            let sender = Registry::builtin()
                .scheme("twilio", Some(table))
                .expect("built in")
                .build_signer(&[Secret::new(TOKEN)], Duration::ZERO, &signing)
                .expect("valid");
            let receiver = twilio(public_url, &[TOKEN]);

            let form = b"MessageSid=SM1&MessageStatus=delivered";
            let signed = sender.sign_delivery(form, 0, "tok-1", None);
            assert_eq!(signed.query, None, "{public_url}: --to's query alone");
            assert!(
                receive(&receiver, "tenant=a", &signed.headers, form).is_ok(),
                "{public_url}"
            );

            let json = br#"{"type":"com.twilio.messaging.message.delivered"}"#;
            let signed = sender.sign_delivery(json, 0, "", None);
            let added = signed.query.clone().expect("bodySHA256");
            assert!(added.starts_with("bodySHA256="), "{added}");
            let sent = format!("tenant=a&{added}");
            assert!(
                receive(&receiver, &sent, &signed.headers, json).is_ok(),
                "{public_url}: {sent}"
            );
        }
    }

    #[test]
    fn a_missing_undecodable_or_empty_signature_never_matches() {
        let provider = twilio(URL, &[TOKEN]);
        for signature in ["", "=", "not base64", &GOOD[..GOOD.len() - 4]] {
            let signed = headers(&[("X-Twilio-Signature", signature)]);
            assert_eq!(
                provider.verify(&signed, FORM_BODY, 0),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
        assert_eq!(
            provider.verify(&headers(&[]), FORM_BODY, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn public_url_is_required_and_must_be_a_url() {
        let registry = Registry::builtin();
        let secrets = [Secret::new(TOKEN)];
        let build = |table: toml::Table| {
            registry
                .scheme("twilio", Some(table))
                .expect("built in")
                .build(&secrets, Duration::ZERO)
        };
        assert_eq!(build(toml::Table::new()).unwrap_err().key, "public_url");
        for bad in [
            "hooks.example.com/x",
            "ftp://h/x",
            "https:///x",
            "https://u:p@h/x",
            "https://h:x/y",
            "https://h/a b",
        ] {
            let mut table = toml::Table::new();
            table.insert("public_url".into(), toml::Value::String(bad.into()));
            assert_eq!(build(table).unwrap_err().key, "public_url", "{bad}");
        }
    }
}
