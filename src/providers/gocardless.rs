//! GoCardless: `Webhook-Signature`, the hex HMAC-SHA256 of the body keyed by the webhook
//! endpoint's secret, used as text. No timestamp is signed. A delivery is a batch,
//! `{"events": [..], "meta": {..}}`: each event is an event of its own, id its `id`, type
//! `{resource_type}.{action}`, payload the event object. A wrong signature is answered `498`, as
//! GoCardless asks ("498 Token Invalid").

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::family::{batch_of_events, item_text, text_keys_only};
use super::mac::{any_matches, hex_tags, matched, required_header, tag_of};
use super::{
    Headers, Identity, Inbound, Keys, Provider, ProviderError, Received, Refusal, Settings,
    SignatureError,
};

/// A GoCardless source: its webhook endpoint secrets, as text.
#[derive(Debug)]
pub struct GoCardless {
    keys: Keys,
}

/// Builds a GoCardless source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(GoCardless {
        keys: text_keys_only(settings)?,
    }))
}

const SIGNATURE: &str = "Webhook-Signature";

/// GoCardless's status for a webhook with an invalid signature.
const TOKEN_INVALID: u16 = 498;

/// The body as GoCardless sends it, each event kept as its raw bytes.
#[derive(Deserialize)]
struct Delivery<'a> {
    #[serde(borrow)]
    events: Vec<&'a RawValue>,
}

/// An event's id and type: `id`, and `{resource_type}.{action}`.
fn identity(event: &Value) -> Identity {
    Identity {
        event_id: item_text(event, "/id"),
        event_type: item_text(event, "/resource_type")
            .zip(item_text(event, "/action"))
            .map(|(resource, action)| format!("{resource}.{action}")),
    }
}

impl GoCardless {
    fn receive_events(&self, inbound: &Inbound<'_>) -> Result<Received, Refusal> {
        self.verify(inbound.headers, inbound.body, inbound.now)?;
        let delivery: Delivery<'_> =
            serde_json::from_slice(inbound.body).map_err(|_| Refusal::MalformedPayload)?;
        batch_of_events(delivery.events, identity)
    }
}

impl Provider for GoCardless {
    fn scheme(&self) -> &'static str {
        "gocardless"
    }

    /// It signs no timestamp: a `tolerance` would go unused.
    fn checks_timestamp(&self) -> bool {
        false
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        let tag = required_header(headers, SIGNATURE)?;
        matched(any_matches(self.keys.all(), &[body], &hex_tags([tag])))
    }

    fn needs_json(&self) -> bool {
        true
    }

    /// The first event's id and type (of a whole delivery, or of an event alone).
    fn identify(&self, _headers: &dyn Headers, json: Option<&Value>) -> Identity {
        let event = match json.and_then(|json| json.get("events")) {
            Some(events) => events.get(0),
            None => json,
        };
        event.map(identity).unwrap_or_default()
    }

    /// None: the signature is over the whole delivery, not any one event of it, so it means
    /// nothing kept with an event.
    fn kept_headers(&self) -> Vec<String> {
        Vec::new()
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let tag = tag_of(self.keys.first(), &[body]);
        vec![(SIGNATURE.to_owned(), hex::encode(tag))]
    }

    /// An event alone becomes a delivery of one, its bytes kept as they are.
    fn as_delivery<'b>(&self, payload: &'b [u8]) -> Cow<'b, [u8]> {
        match serde_json::from_slice::<Value>(payload) {
            Ok(Value::Object(fields)) if !fields.contains_key("events") => {
                let mut wrapped = br#"{"events":["#.to_vec();
                wrapped.extend_from_slice(payload);
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
        Box::pin(std::future::ready(self.receive_events(inbound)))
    }

    fn refusal_status(&self, refusal: Refusal) -> Option<u16> {
        matches!(refusal, Refusal::Signature(_)).then_some(TOKEN_INVALID)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers, receive, verifier};
    use super::super::{Received, Refusal, SignatureError};
    use super::*;

    const EVENT: &str =
        r#"{"id":"EV1","resource_type":"payments","action":"confirmed","links":{"payment":"PM1"}}"#;

    #[test]
    fn an_event_alone_is_wrapped_signed_and_received_byte_for_byte() {
        let provider = verifier("gocardless", &["secret-1"]);
        let body = provider.as_delivery(EVENT.as_bytes()).into_owned();
        assert_eq!(body, format!(r#"{{"events":[{EVENT}]}}"#).into_bytes());
        assert_eq!(provider.as_delivery(&body), Cow::Borrowed(&body[..]));
        let signed = provider.sign(&body, 0, "", None);
        let Ok(Received::Batch(items)) = receive(provider.as_ref(), &signed, &body) else {
            panic!("a batch")
        };
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].event_id, "EV1");
        assert_eq!(items[0].event_type.as_deref(), Some("payments.confirmed"));
        assert_eq!(items[0].payload, EVENT.as_bytes());
        assert_eq!(
            provider.identify(&headers(&[]), serde_json::from_slice(&body).ok().as_ref()),
            Identity {
                event_id: Some("EV1".into()),
                event_type: Some("payments.confirmed".into())
            }
        );
    }

    #[test]
    fn a_wrong_signature_is_its_own_498() {
        let provider = verifier("gocardless", &["secret-1"]);
        let body = provider.as_delivery(EVENT.as_bytes()).into_owned();
        let signed = verifier("gocardless", &["other"]).sign(&body, 0, "", None);
        let refusal = receive(provider.as_ref(), &signed, &body).unwrap_err();
        assert_eq!(refusal, Refusal::Signature(SignatureError::Invalid));
        assert_eq!(provider.refusal_status(refusal), Some(498));
        assert_eq!(provider.refusal_status(Refusal::MalformedPayload), None);
        // Rotation: any configured secret.
        let both = verifier("gocardless", &["other", "secret-1"]);
        let signed = provider.sign(&body, 0, "", None);
        assert!(receive(both.as_ref(), &signed, &body).is_ok());
    }

    #[test]
    fn a_whole_number_id_is_its_decimal_text_as_for_one_event_of_any_scheme() {
        let provider = verifier("gocardless", &["secret-1"]);
        let body = br#"{"events":[{"id":123,"resource_type":"payments","action":"confirmed"}]}"#;
        let signed = provider.sign(body, 0, "", None);
        let Ok(Received::Batch(items)) = receive(provider.as_ref(), &signed, body) else {
            panic!("a batch")
        };
        assert_eq!(items[0].event_id, "123");
    }

    #[test]
    fn an_event_without_an_id_or_an_empty_list_is_missing_its_id() {
        let provider = verifier("gocardless", &["secret-1"]);
        for body in [&br#"{"events":[]}"#[..], br#"{"events":[{"action":"x"}]}"#] {
            let signed = provider.sign(body, 0, "", None);
            assert_eq!(
                receive(provider.as_ref(), &signed, body),
                Err(Refusal::MissingEventId)
            );
        }
        let body = br#"{"events":{}}"#;
        let signed = provider.sign(body, 0, "", None);
        assert_eq!(
            receive(provider.as_ref(), &signed, body),
            Err(Refusal::MalformedPayload)
        );
    }
}
