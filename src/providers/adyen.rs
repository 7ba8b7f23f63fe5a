//! Adyen: standard notification webhooks, a batch. The body is
//! `{"live": .., "notificationItems": [{"NotificationRequestItem": {..}}, ..]}` and each item is
//! signed on its own: `additionalData.hmacSignature`, the base64 HMAC-SHA256 keyed by the
//! hex-decoded HMAC key over
//! `pspReference:originalReference:merchantAccountCode:merchantReference:amount.value:amount.currency:eventCode:success`,
//! the values joined as they are (a missing one is empty; no `\`/`:` escaping, which Adyen uses
//! only for HPP signing). Every item must verify. Optionally, Basic authentication too
//! (`basic_auth`). Each item is an event of its own: id `{pspReference}:{eventCode}`, type
//! `eventCode`, payload the `NotificationRequestItem` object. Adyen expects `[accepted]`.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::family::{batch, item_text, repeats_a_key};
use super::mac::{any_matches, matched, tag_of};
use super::{
    Answer, Headers, Identity, Inbound, Keys, Provider, ProviderError, Received, Refusal, Settings,
    SignatureError, Signed,
};

/// An Adyen source: its HMAC keys (hex-decoded) and the Basic credentials Adyen sends, if set.
pub struct Adyen {
    keys: Keys,
    basic_auth: Option<Vec<u8>>,
}

/// The key count and whether Basic authentication is on, never a key or the credentials.
impl fmt::Debug for Adyen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adyen")
            .field("keys", &self.keys)
            .field("basic_auth", &self.basic_auth.is_some())
            .finish()
    }
}

/// Builds an Adyen source: hex HMAC keys in `secrets`, and `basic_auth` or `basic_auth_env`
/// (`user:password`) when the endpoint has Basic authentication set up in the Customer Area.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(&["basic_auth", "basic_auth_env"])?;
    let given = match (
        settings.text("basic_auth")?,
        settings.text("basic_auth_env")?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ProviderError::at(
                "basic_auth_env",
                "give either basic_auth or basic_auth_env, not both",
            ))
        }
        (Some(value), None) => Some(("basic_auth", value.to_owned())),
        (None, Some(var)) => match std::env::var(var) {
            Ok(value) if value.trim().is_empty() => {
                return Err(ProviderError::at(
                    "basic_auth_env",
                    format!(
                        "the environment variable {} is set but empty: set it to \
                         `user:password`, as on the webhook in Adyen's Customer Area",
                        crate::redact::variable_name(var)
                    ),
                ))
            }
            Ok(value) => Some(("basic_auth_env", value)),
            Err(_) => {
                return Err(ProviderError::at(
                    "basic_auth_env",
                    format!(
                        "the environment variable {} is not set",
                        crate::redact::variable_name(var)
                    ),
                ))
            }
        },
        (None, None) => None,
    };
    let basic_auth = match given {
        Some((key, value)) => match value.split_once(':') {
            Some((user, _)) if !user.is_empty() => Some(value.into_bytes()),
            _ => {
                return Err(ProviderError::at(
                    key,
                    "expected `user:password`, the Basic authentication set on the webhook in \
                     Adyen's Customer Area",
                ))
            }
        },
        None => None,
    };
    let keys = Keys::derived(settings.scheme, settings.secrets, |text| {
        hex::decode(text).map_err(|_| {
            "is not hex: Adyen's HMAC key is the hex string the Customer Area shows".to_owned()
        })
    })?;
    Ok(Arc::new(Adyen { keys, basic_auth }))
}

const AUTHORIZATION: &str = "Authorization";

/// The body as Adyen sends it, each item kept as its raw bytes.
#[derive(Deserialize)]
struct Notification<'a> {
    #[serde(rename = "notificationItems", borrow)]
    items: Vec<Wrapped<'a>>,
}

#[derive(Deserialize)]
struct Wrapped<'a> {
    #[serde(rename = "NotificationRequestItem", borrow)]
    item: &'a RawValue,
}

/// A value of the signed string: text as is, a number or boolean as JSON writes it, anything
/// else (or nothing) empty.
fn field(item: &Value, pointer: &str) -> String {
    match item.pointer(pointer) {
        Some(Value::String(text)) => text.clone(),
        Some(value @ (Value::Number(_) | Value::Bool(_))) => value.to_string(),
        _ => String::new(),
    }
}

/// The string Adyen signs for one item.
fn signed_string(item: &Value) -> String {
    [
        "/pspReference",
        "/originalReference",
        "/merchantAccountCode",
        "/merchantReference",
        "/amount/value",
        "/amount/currency",
        "/eventCode",
        "/success",
    ]
    .iter()
    .map(|pointer| field(item, pointer))
    .collect::<Vec<_>>()
    .join(":")
}

const SIGNATURE: &str = "/additionalData/hmacSignature";

/// The items of a delivery, parsed, each with its raw bytes.
fn items(body: &[u8]) -> Option<Vec<(&str, Value)>> {
    let notification: Notification<'_> = serde_json::from_slice(body).ok()?;
    notification
        .items
        .into_iter()
        .map(|wrapped| {
            let raw = wrapped.item.get();
            match serde_json::from_str::<Value>(raw).ok()? {
                json @ Value::Object(_) => Some((raw, json)),
                _ => None,
            }
        })
        .collect()
}

/// The first item of a delivery, or `json` itself when it is an item alone.
fn first_item(json: &Value) -> Option<&Value> {
    match json.get("notificationItems") {
        Some(items) => items.pointer("/0/NotificationRequestItem"),
        None => Some(json),
    }
}

impl Adyen {
    /// Whether one item's `hmacSignature` matches under any key.
    fn item_verifies(&self, item: &Value) -> bool {
        let Some(Value::String(encoded)) = item.pointer(SIGNATURE) else {
            return false;
        };
        let tags: Vec<Vec<u8>> = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .into_iter()
            .collect();
        any_matches(self.keys.all(), &[signed_string(item).as_bytes()], &tags)
    }

    /// Whether `Authorization: Basic` carries the configured credentials (constant time), or
    /// none are configured. A request with two `Authorization` headers carries none: the field
    /// holds one value, and a proxy in front may read the other.
    fn authorized(&self, headers: &dyn Headers) -> bool {
        let Some(expected) = &self.basic_auth else {
            return true;
        };
        let [given] = headers.all(AUTHORIZATION)[..] else {
            return false;
        };
        let given = std::str::from_utf8(given)
            .ok()
            .and_then(|text| text.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
            .and_then(|(_, encoded)| {
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .ok()
            });
        // As digests: a comparison of the bytes themselves ends at once on a length that
        // differs, and showed the credentials' length.
        given.is_some_and(|given| crate::secret::same_secret(&given, expected))
    }

    /// Every item verified (and the Basic credentials, where set), or the coarse refusal. A body
    /// that is not a notification carries no signature to check.
    fn checked<'b>(
        &self,
        headers: &dyn Headers,
        body: &'b [u8],
    ) -> Result<Vec<(&'b str, Value)>, SignatureError> {
        let items = items(body).ok_or(SignatureError::Invalid)?;
        // An item's signed values are read from the body: each must be there once.
        if repeats_a_key(body) {
            return Err(SignatureError::Invalid);
        }
        let every = !items.is_empty() && items.iter().all(|(_, item)| self.item_verifies(item));
        matched(every)?;
        if !self.authorized(headers) {
            return Err(SignatureError::Credentials(
                "the HTTP Basic credentials (the Authorization header) are missing or do not \
                 match the source's basic_auth",
            ));
        }
        Ok(items)
    }

    fn identity(item: &Value) -> Identity {
        let (psp, code) = (
            item_text(item, "/pspReference"),
            item_text(item, "/eventCode"),
        );
        Identity {
            event_id: psp
                .zip(code.clone())
                .map(|(psp, code)| format!("{psp}:{code}")),
            event_type: code,
        }
    }

    fn receive_items(&self, inbound: &Inbound<'_>) -> Result<Received, Refusal> {
        let items = self.checked(inbound.headers, inbound.body)?;
        batch(items, Adyen::identity)
    }

    /// `item` with its `hmacSignature` made with the first key.
    fn sign_item(&self, item: &mut Value) {
        let tag = tag_of(self.keys.first(), &[signed_string(item).as_bytes()]);
        let encoded = base64::engine::general_purpose::STANDARD.encode(tag);
        let Value::Object(fields) = item else { return };
        let additional = fields
            .entry("additionalData")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(additional) = additional {
            additional.insert("hmacSignature".to_owned(), Value::String(encoded));
        }
    }
}

impl Provider for Adyen {
    fn scheme(&self) -> &'static str {
        "adyen"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        self.checked(headers, body).map(|_| ())
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// The first item's id and type (of a whole delivery, or of an item alone).
    fn identify(&self, _headers: &dyn Headers, json: Option<&Value>) -> Identity {
        json.and_then(first_item)
            .map(Adyen::identity)
            .unwrap_or_default()
    }

    /// None: the signatures travel in the body, and `Authorization` is never kept.
    fn kept_headers(&self) -> Vec<String> {
        Vec::new()
    }

    /// Only the Basic credentials, where set: the signatures go in the body (see
    /// [`sign_delivery`](Provider::sign_delivery)).
    fn sign(
        &self,
        _body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        self.basic_auth
            .iter()
            .map(|credentials| {
                let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
                (AUTHORIZATION.to_owned(), format!("Basic {encoded}"))
            })
            .collect()
    }

    /// Every item of the delivery signed in its `additionalData.hmacSignature`; a body that is
    /// not a notification is sent as it is.
    fn sign_delivery(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Signed {
        let headers = self.sign(body, timestamp, event_id, event_type);
        let mut json: Value = match serde_json::from_slice(body) {
            Ok(json) => json,
            Err(_) => {
                return Signed {
                    body: body.to_vec(),
                    query: None,
                    headers,
                    content_type: None,
                }
            }
        };
        if let Some(Value::Array(items)) = json.get_mut("notificationItems") {
            for wrapped in items {
                if let Some(item) = wrapped.get_mut("NotificationRequestItem") {
                    self.sign_item(item);
                }
            }
        }
        Signed {
            body: serde_json::to_vec(&json).expect("a JSON value serializes"),
            query: None,
            headers,
            content_type: None,
        }
    }

    /// An item alone becomes a notification of one: the item itself (as stored and exported),
    /// or an element of `notificationItems` as Adyen writes it (`{"NotificationRequestItem":
    /// {..}}`, wrapped once already). Adyen's `live` flag belongs to the notification, not the
    /// item, so it is not stored; a wrapped item says `"false"`.
    fn as_delivery<'b>(&self, payload: &'b [u8]) -> Cow<'b, [u8]> {
        match serde_json::from_slice::<Value>(payload) {
            Ok(Value::Object(fields)) if !fields.contains_key("notificationItems") => {
                let element = fields.len() == 1
                    && fields
                        .get("NotificationRequestItem")
                        .is_some_and(Value::is_object);
                let mut wrapped = br#"{"live":"false","notificationItems":["#.to_vec();
                if element {
                    wrapped.extend_from_slice(payload);
                } else {
                    wrapped.extend_from_slice(br#"{"NotificationRequestItem":"#);
                    wrapped.extend_from_slice(payload);
                    wrapped.push(b'}');
                }
                wrapped.extend_from_slice(b"]}");
                Cow::Owned(wrapped)
            }
            _ => Cow::Borrowed(payload),
        }
    }

    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<Received, Refusal>> {
        Box::pin(std::future::ready(self.receive_items(inbound)))
    }

    /// Each item's signature changes when the HMAC key is rotated; the rest of a retried item
    /// is the same.
    fn volatile_fields(&self) -> &'static [&'static str] {
        &[SIGNATURE]
    }

    fn answer(&self) -> Option<Answer> {
        Some(Answer {
            status: 200,
            content_type: "text/plain",
            body: b"[accepted]".to_vec(),
        })
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            Duration::from_secs(30 * 24 * 3600),
            "Adyen retries a webhook from its retry queue for up to 30 days",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, receive};
    use super::super::{Received, Refusal, Registry, SignatureError};
    use super::*;
    use crate::secret::Secret;

    const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    fn adyen(secrets: &[&str], own: &[(&str, &str)]) -> Result<Arc<dyn Provider>, ProviderError> {
        let table: toml::Table = own
            .iter()
            .map(|(k, v)| ((*k).to_owned(), toml::Value::String((*v).to_owned())))
            .collect();
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Registry::builtin()
            .scheme("adyen", Some(table))
            .expect("built in")
            .build(&secrets, Duration::from_secs(300))
    }

    fn item(psp: &str, code: &str) -> String {
        format!(
            r#"{{"pspReference":"{psp}","eventCode":"{code}","merchantAccountCode":"Acme","merchantReference":"o:1","amount":{{"value":1000,"currency":"EUR"}},"success":"true","additionalData":{{"authCode":"1"}}}}"#
        )
    }

    #[test]
    fn an_element_of_notification_items_is_wrapped_once() {
        let provider = adyen(&[KEY], &[]).expect("builds");
        let one = item("PSP2", "REFUND");
        let element = format!(r#"{{"NotificationRequestItem": {one}}}"#);
        let delivery = provider.as_delivery(element.as_bytes()).into_owned();
        let json = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).expect("JSON");
        assert_eq!(json(&delivery), json(&provider.as_delivery(one.as_bytes())));
        let signed = provider.sign_delivery(&delivery, 0, "", None);
        let Ok(Received::Batch(items)) = receive(provider.as_ref(), &signed.headers, &signed.body)
        else {
            panic!("a batch")
        };
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].event_id, "PSP2:REFUND");
    }

    #[test]
    fn a_wrapped_item_signs_and_verifies_and_yields_its_event() {
        let provider = adyen(&[KEY], &[]).expect("builds");
        let one = item("PSP1", "AUTHORISATION");
        let delivery = provider.as_delivery(one.as_bytes()).into_owned();
        assert!(delivery.starts_with(br#"{"live":"false","notificationItems""#));
        // A whole delivery is not wrapped again.
        assert_eq!(
            provider.as_delivery(&delivery),
            Cow::Borrowed(&delivery[..])
        );
        let signed = provider.sign_delivery(&delivery, 0, "", None);
        assert!(signed.headers.is_empty());
        let Ok(Received::Batch(items)) = receive(provider.as_ref(), &signed.headers, &signed.body)
        else {
            panic!("a batch")
        };
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].event_id, "PSP1:AUTHORISATION");
        assert_eq!(items[0].event_type.as_deref(), Some("AUTHORISATION"));
        assert_eq!(items[0].json["merchantReference"], "o:1");
        // The stored payload is the item's bytes as they stood in the body.
        let body = std::str::from_utf8(&signed.body).expect("UTF-8");
        assert!(body.contains(std::str::from_utf8(&items[0].payload).expect("UTF-8")));
        let json = serde_json::from_slice(&signed.body).expect("JSON");
        let identity = provider.identify(&headers(&[]), Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("PSP1:AUTHORISATION"));
    }

    #[test]
    fn every_item_must_verify_and_the_key_is_hex() {
        let provider = adyen(&[KEY], &[]).expect("builds");
        let body = format!(
            r#"{{"live":"false","notificationItems":[{{"NotificationRequestItem":{}}},{{"NotificationRequestItem":{}}}]}}"#,
            item("A", "CAPTURE"),
            item("B", "REFUND")
        );
        let signed = provider.sign_delivery(body.as_bytes(), 0, "", None);
        assert_eq!(provider.verify(&headers(&[]), &signed.body, 0), Ok(()));
        let tampered = String::from_utf8(signed.body.clone())
            .expect("UTF-8")
            .replace(r#""pspReference":"B""#, r#""pspReference":"C""#);
        assert_eq!(
            provider.verify(&headers(&[]), tampered.as_bytes(), 0),
            Err(SignatureError::Invalid)
        );
        // A second `success` in front of a signed item's own: the check would read the signed
        // one (serde keeps the last), a reader of the stored item might take the other.
        let doubled = String::from_utf8(signed.body.clone())
            .expect("UTF-8")
            .replace(
                r#""pspReference":"B""#,
                r#""success":"false","pspReference":"B""#,
            );
        assert_ne!(doubled.as_bytes(), &signed.body[..]);
        assert_eq!(
            provider.verify(&headers(&[]), doubled.as_bytes(), 0),
            Err(SignatureError::Invalid)
        );
        for bad in [&b"not json"[..], b"{}", br#"{"notificationItems":[]}"#] {
            assert_eq!(
                provider.verify(&headers(&[]), bad, 0),
                Err(SignatureError::Invalid)
            );
        }
        let error = adyen(&["not-hex"], &[]).unwrap_err();
        assert_eq!(error.key, "secrets");
        assert!(error.problem.contains("hex"), "{error}");
    }

    #[test]
    fn basic_auth_when_set_must_match_too() {
        let provider = adyen(&[KEY], &[("basic_auth", "adyen:s3cret")]).expect("builds");
        let body = provider
            .as_delivery(item("A", "CAPTURE").as_bytes())
            .into_owned();
        let signed = provider.sign_delivery(&body, 0, "", None);
        assert_eq!(provider.verify(&signed.headers, &signed.body, 0), Ok(()));
        // Answered as a signature that does not match; the log says which (see webhook).
        let credentials = |outcome| matches!(outcome, Err(SignatureError::Credentials(_)));
        assert!(credentials(provider.verify(&headers(&[]), &signed.body, 0)));
        let wrong = base64::engine::general_purpose::STANDARD.encode("adyen:other");
        let sent = headers(&[("Authorization", &format!("Basic {wrong}"))]);
        assert!(credentials(provider.verify(&sent, &signed.body, 0)));
        let mut twice = signed.headers.clone();
        twice.push(("Authorization".to_owned(), format!("Basic {wrong}")));
        assert!(
            credentials(provider.verify(&twice, &signed.body, 0)),
            "two Authorization headers, one of them right"
        );
        let forged = String::from_utf8(signed.body.to_vec())
            .expect("UTF-8")
            .replace("CAPTURE", "REFUND");
        assert_eq!(
            provider.verify(&signed.headers, forged.as_bytes(), 0),
            Err(SignatureError::Invalid),
            "the items are checked first"
        );
        assert!(!format!("{provider:?}").contains("s3cret"));
        let error = adyen(&[KEY], &[("basic_auth", "no-colon")]).unwrap_err();
        assert_eq!(error.key, "basic_auth");
        let error = adyen(&[KEY], &[("basic_auth_env", "HOOKBOX_TEST_UNSET_VAR")]).unwrap_err();
        assert_eq!(error.key, "basic_auth_env");
    }

    #[test]
    fn an_item_without_psp_reference_is_missing_its_id() {
        let provider = adyen(&[KEY], &[]).expect("builds");
        let body = provider
            .as_delivery(br#"{"eventCode":"REPORT_AVAILABLE","success":"true"}"#)
            .into_owned();
        let signed = provider.sign_delivery(&body, 0, "", None);
        assert_eq!(
            receive(provider.as_ref(), &signed.headers, &signed.body),
            Err(Refusal::MissingEventId)
        );
    }
}
