//! Linear: `Linear-Signature` is the hex HMAC-SHA256 of the raw body, keyed by the webhook's
//! signing secret. The time is in the body: `webhookTimestamp`, unix milliseconds, which must be
//! within one minute of now (Linear's own rule, as its SDK checks it; a source's `tolerance`
//! may narrow that window, never widen it). The id is `Linear-Delivery`, the type
//! `Linear-Event`. `webhookTimestamp` changes on every retry, so the fingerprint leaves it out.

use std::sync::Arc;
use std::time::Duration;

use super::family::{lowercase, text_keys_only, with_id_and_type, HeaderMac, TagText};
use super::mac::{header_id, header_text};
use super::{
    receive_verified, Headers, Identity, Inbound, Keys, Provider, ProviderError, Received, Refusal,
    Settings, SignatureError, Signed,
};

/// A Linear source: its signing secrets, used as text, and its window.
#[derive(Debug)]
pub struct Linear {
    keys: Keys,
    window: Duration,
    /// The source's `tolerance` is wider than Linear's minute, which it cannot widen.
    wide_tolerance: bool,
}

/// Linear's own window: a delivery more than a minute off is refused whatever `tolerance` says.
const WINDOW: Duration = Duration::from_secs(60);

/// Builds a Linear source; it takes no key of its own.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    Ok(Arc::new(Linear {
        keys: text_keys_only(settings)?,
        window: if settings.tolerance_set {
            settings.tolerance.min(WINDOW)
        } else {
            WINDOW
        },
        wide_tolerance: settings.tolerance_set && settings.tolerance > WINDOW,
    }))
}

/// One hex signature of the raw body.
const SIGNATURE: HeaderMac = HeaderMac {
    header: "Linear-Signature",
    prefix: "",
    text: TagText::Hex,
};
const DELIVERY: &str = "Linear-Delivery";
const EVENT: &str = "Linear-Event";
const TIMESTAMP_FIELD: &str = "webhookTimestamp";

impl Provider for Linear {
    fn scheme(&self) -> &'static str {
        "linear"
    }

    fn setup_warning(&self) -> Option<&'static str> {
        self.wide_tolerance.then_some(
            "tolerance is wider than Linear's own minute, which it can only narrow: a delivery \
             whose webhookTimestamp is more than 60 s off is refused (401 stale_timestamp) \
             whatever tolerance says; set it to 60s or less, or leave it out",
        )
    }

    /// The signature, then the body's time; a body that is not JSON, or whose time cannot be
    /// read, is `Invalid` here ([`Provider::receive`] tells those apart as 400s).
    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        SIGNATURE.verify(&self.keys, headers, &[body])?;
        match self.judge(body, now) {
            Ok(()) => Ok(()),
            Err(Refusal::Signature(e)) => Err(e),
            Err(_) => Err(SignatureError::Invalid),
        }
    }

    /// As [`Linear::verify`], except that a signed body that is not JSON is 400
    /// `malformed_payload`, as for every scheme that needs JSON, and so is one without a
    /// whole-number `webhookTimestamp` (with a sentence saying so): the signature matched, so
    /// neither is a wrong secret.
    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<Received, Refusal>> {
        let received = SIGNATURE
            .verify(&self.keys, inbound.headers, &[inbound.body])
            .map_err(Refusal::Signature)
            .and_then(|()| self.judge(inbound.body, inbound.now))
            .and_then(|()| receive_verified(self, inbound));
        Box::pin(std::future::ready(received))
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, headers: &dyn Headers, _json: Option<&serde_json::Value>) -> Identity {
        Identity {
            event_id: header_id(headers, DELIVERY),
            event_type: header_text(headers, EVENT),
        }
    }

    /// The id travels in a header, so `send --event-id` applies.
    fn id_in_body(&self) -> bool {
        false
    }

    fn kept_headers(&self) -> Vec<String> {
        lowercase(&[SIGNATURE.header, DELIVERY, EVENT])
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        with_id_and_type(
            SIGNATURE.sign(&self.keys, &[body]),
            (DELIVERY, event_id),
            (EVENT, event_type),
        )
    }

    /// The body's `webhookTimestamp` is set to `timestamp` (in milliseconds) first, every other
    /// byte kept, as Linear stamps each attempt; a JSON object without one gets one.
    fn sign_delivery(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Signed {
        let body = stamped(body, timestamp.saturating_mul(1000));
        Signed {
            headers: self.sign(&body, timestamp, event_id, event_type),
            body,
            query: None,
            content_type: None,
        }
    }

    fn volatile_fields(&self) -> &'static [&'static str] {
        &["/webhookTimestamp"]
    }
}

impl Linear {
    /// The body's time, once its signature matched: within the window, or `Stale`; a body that
    /// is not JSON, or has no whole-number `webhookTimestamp`, is malformed.
    fn judge(&self, body: &[u8], now: i64) -> Result<(), Refusal> {
        let json: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| Refusal::MalformedPayload)?;
        let millis = json
            .get(TIMESTAMP_FIELD)
            .and_then(serde_json::Value::as_i64)
            .ok_or(Refusal::Malformed(
                "the body has no webhookTimestamp (unix milliseconds, which Linear puts in every \
                 delivery it signs) as a whole number",
            ))?;
        // Judged in milliseconds, as Linear's SDK does: 60.5 s off is outside one minute.
        let skew = Duration::from_millis(now.saturating_mul(1000).abs_diff(millis));
        if skew > self.window {
            Err(Refusal::Signature(SignatureError::Stale))
        } else {
            Ok(())
        }
    }
}

/// `body` with the value of its top-level `webhookTimestamp` replaced by `millis`, every other
/// byte kept (a `webhookTimestamp` nested deeper, or inside a string, is the event's own), or,
/// for a JSON object without one, with `"webhookTimestamp":<millis>,` added first. Anything else
/// is returned as it is.
fn stamped(body: &[u8], millis: i64) -> Vec<u8> {
    let key = format!("\"{TIMESTAMP_FIELD}\"");
    let millis = millis.to_string();
    if let Some(value) = top_level_value(body, TIMESTAMP_FIELD) {
        return [&body[..value.start], millis.as_bytes(), &body[value.end..]].concat();
    }
    let open = body.iter().position(|b| !b.is_ascii_whitespace());
    match open {
        Some(open) if body[open] == b'{' => {
            let rest = &body[open + 1..];
            let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
            let comma: &[u8] = if empty { b"" } else { b"," };
            [
                &body[..=open],
                key.as_bytes(),
                b":",
                millis.as_bytes(),
                comma,
                rest,
            ]
            .concat()
        }
        _ => body.to_vec(),
    }
}

/// Where the value of the top-level member `name` of the JSON object `body` lies (the last such
/// member, as a JSON reader keeps it; a name written with escapes counts too), its bytes only;
/// `None` when `body` is not a JSON object or has no such member.
fn top_level_value(body: &[u8], name: &str) -> Option<std::ops::Range<usize>> {
    let members: std::collections::BTreeMap<
        std::borrow::Cow<'_, str>,
        &serde_json::value::RawValue,
    > = serde_json::from_slice(body).ok()?;
    let value = members.get(name)?.get();
    // The raw value is a slice of `body` itself.
    let start = (value.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    Some(start..start + value.len())
}

/// A body's `webhookTimestamp`, for tests.
#[cfg(test)]
fn timestamp_of(body: &[u8]) -> Option<String> {
    super::mac::json_text(
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .as_ref(),
        "/webhookTimestamp",
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::tests::{headers, verifier};
    use super::super::{Provider, Scheme, SignatureError};
    use super::{stamped, timestamp_of};
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;

    #[test]
    fn send_stamps_the_body_and_signs_what_it_sends() {
        let linear = verifier("linear", &["lin_wh_secret"]);
        let body = br#"{"action":"create","type":"Issue","webhookTimestamp":1700000000000}"#;
        let signed = linear.sign_delivery(body, NOW, "del-1", Some("Issue"));
        assert_eq!(timestamp_of(&signed.body).as_deref(), Some("1763649000000"));
        assert!(signed
            .body
            .starts_with(br#"{"action":"create","type":"Issue","#));
        assert_eq!(
            linear.verify(&signed.headers, &signed.body, NOW + 59),
            Ok(())
        );
        assert_eq!(
            linear.verify(&signed.headers, &signed.body, NOW + 61),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            linear.verify(&signed.headers, body, NOW),
            Err(SignatureError::Invalid)
        );
        let identity = linear.identify(&signed.headers, None);
        assert_eq!(identity.event_id.as_deref(), Some("del-1"));
        assert_eq!(identity.event_type.as_deref(), Some("Issue"));
        assert_eq!(linear.volatile_fields(), ["/webhookTimestamp"]);
    }

    #[test]
    fn only_the_top_level_timestamp_is_stamped() {
        let nested = br#"{"data":{"id":"i","webhookTimestamp":1},"webhookTimestamp":2,"x":3}"#;
        assert_eq!(
            stamped(nested, 9),
            br#"{"data":{"id":"i","webhookTimestamp":1},"webhookTimestamp":9,"x":3}"#.to_vec()
        );
        let in_text = br#"{"title":"\"webhookTimestamp\": 1","webhookTimestamp" : 2 }"#;
        assert_eq!(
            stamped(in_text, 9),
            br#"{"title":"\"webhookTimestamp\": 1","webhookTimestamp" : 9 }"#.to_vec()
        );
        let last = br#"{"webhookTimestamp":[1,{"a":"}"}],"b":{},"webhookTimestamp":"2"}"#;
        assert_eq!(
            stamped(last, 9),
            br#"{"webhookTimestamp":[1,{"a":"}"}],"b":{},"webhookTimestamp":9}"#.to_vec()
        );
        // A name written with escapes is the same member to a JSON reader.
        assert_eq!(
            stamped(br#"{"webhook\u0054imestamp":1}"#, 9),
            br#"{"webhook\u0054imestamp":9}"#.to_vec()
        );
        // Only nested: the top level gets one.
        assert_eq!(
            stamped(br#"{"data":{"webhookTimestamp":1}}"#, 9),
            br#"{"webhookTimestamp":9,"data":{"webhookTimestamp":1}}"#.to_vec()
        );
        let linear = verifier("linear", &["s"]);
        let signed = linear.sign_delivery(nested, NOW, "d", None);
        assert_eq!(linear.verify(&signed.headers, &signed.body, NOW), Ok(()));
    }

    #[test]
    fn a_body_without_a_timestamp_gets_one_and_is_otherwise_invalid() {
        assert_eq!(
            stamped(br#"{"a":1}"#, 5),
            br#"{"webhookTimestamp":5,"a":1}"#.to_vec()
        );
        assert_eq!(stamped(b"{ }", 5), br#"{"webhookTimestamp":5 }"#.to_vec());
        assert_eq!(stamped(b"[1]", 5), b"[1]".to_vec());
        let linear = verifier("linear", &["s"]);
        let unstamped = br#"{"a":1}"#;
        let sent = linear.sign(unstamped, NOW, "d", None);
        assert_eq!(
            linear.verify(&sent, unstamped, NOW),
            Err(SignatureError::Invalid)
        );
        let missing = headers(&[]);
        assert_eq!(
            linear.verify(&missing, unstamped, NOW),
            Err(SignatureError::Invalid)
        );
    }

    /// A Linear source with the secret `s` and `tolerance`, if set.
    fn build(tolerance: Option<Duration>) -> Arc<dyn Provider> {
        Scheme::builtin("linear")
            .expect("built in")
            .build_source(&[Secret::new("s")], tolerance)
            .expect("builds")
    }

    #[test]
    fn tolerance_narrows_the_minute_but_never_widens_it() {
        let body = br#"{"webhookTimestamp":1763649000000}"#;
        let sent = build(None).sign(body, NOW, "d", None);
        let wide = build(Some(Duration::from_secs(600)));
        assert_eq!(
            wide.verify(&sent, body, NOW + 90),
            Err(SignatureError::Stale)
        );
        let narrow = build(Some(Duration::from_secs(10)));
        assert_eq!(narrow.verify(&sent, body, NOW + 9), Ok(()));
        assert_eq!(
            narrow.verify(&sent, body, NOW + 11),
            Err(SignatureError::Stale)
        );
        assert_eq!(build(None).verify(&sent, body, NOW + 60), Ok(()));
    }

    #[test]
    fn a_tolerance_wider_than_the_minute_is_warned_of_at_startup() {
        let warning = build(Some(Duration::from_secs(300)))
            .setup_warning()
            .expect("warned");
        assert!(warning.contains("set it to 60s or less"), "{warning}");
        assert_eq!(build(Some(Duration::from_secs(60))).setup_warning(), None);
        assert_eq!(build(Some(Duration::from_secs(10))).setup_warning(), None);
        assert_eq!(build(None).setup_warning(), None);
    }
}
