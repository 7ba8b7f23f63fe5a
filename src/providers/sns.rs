//! AWS SNS, HTTP/S subscriptions: the message is a JSON body that carries its own signature.
//! `Signature` (base64) is RSA over the string AWS builds from the message's fields for its
//! `Type`, each present one as `Name\nValue\n` in this order:
//! - `Notification`: `Message`, `MessageId`, `Subject` (only when there is one), `Timestamp`,
//!   `TopicArn`, `Type`;
//! - `SubscriptionConfirmation` and `UnsubscribeConfirmation`: `Message`, `MessageId`,
//!   `SubscribeURL`, `Timestamp`, `Token`, `TopicArn`, `Type`.
//!
//! `SignatureVersion` `1` is SHA1withRSA, `2` SHA256withRSA; no other is taken. The key is the
//! certificate's at `SigningCertURL`, which must be a `.pem` URL the source's `cert_urls` admit
//! (by default any region's `https://sns.<region>.amazonaws.com/` or `.com.cn/`), fetched once
//! per URL and cached (see [`certs`](super::certs)); a URL outside them is refused without a
//! request, and a fetch that fails is 503 so SNS retries. `Timestamp` is when the message was
//! published, and SNS sends the very same signed message on every retry, which its HTTP/S
//! delivery policy may spread over up to an hour: the default tolerance is that hour.
//!
//! A verified `SubscriptionConfirmation` is confirmed by one GET of its `SubscribeURL` (admitted
//! by the same `cert_urls`) and never stored; an `UnsubscribeConfirmation` is an event like a
//! `Notification`, and its `SubscribeURL` (which would subscribe again) is never fetched. A
//! source with `topic_arns` takes messages of those topics only, confirmations included, as AWS
//! advises: anyone can subscribe an endpoint to a topic of their own, and SNS signs that topic's
//! messages as genuinely as yours.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use openssl::hash::MessageDigest;
use serde_json::{Map, Value};

use super::certs::{Allowlist, CertUrl, RsaSignature, RsaSigningKey};
use super::family::repeats_a_key;
use super::mac::{json_text, Clock};
use super::{
    receive_verified, Answer, Confirmation, Headers, Identity, Inbound, Provider, ProviderError,
    Received, Refusal, Settings, SignatureError, Signed,
};

/// Where SNS's certificates and subscription URLs live, in every region, when a source names
/// no `cert_urls`.
pub const DEFAULT_CERT_URLS: [&str; 2] = [
    "https://sns.<region>.amazonaws.com/",
    "https://sns.<region>.amazonaws.com.cn/",
];

/// How far `Timestamp` may be from now when the source sets no `tolerance`: SNS re-sends a
/// message with its publish time for as long as its HTTP/S delivery policy retries, at most
/// 3,600 seconds (AWS's hard limit).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(3600);

const MESSAGE_TYPE: &str = "x-amz-sns-message-type";
const MESSAGE_ID: &str = "x-amz-sns-message-id";
const TOPIC_ARN: &str = "x-amz-sns-topic-arn";
const SUBSCRIPTION_ARN: &str = "x-amz-sns-subscription-arn";

/// What SNS posts its messages as, whatever the body holds (unless a delivery policy says
/// otherwise).
const CONTENT_TYPE: &str = "text/plain; charset=UTF-8";

/// The three kinds of message SNS sends an HTTP/S endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Notification,
    SubscriptionConfirmation,
    UnsubscribeConfirmation,
}

impl Kind {
    fn of(name: &str) -> Option<Kind> {
        match name {
            "Notification" => Some(Kind::Notification),
            "SubscriptionConfirmation" => Some(Kind::SubscriptionConfirmation),
            "UnsubscribeConfirmation" => Some(Kind::UnsubscribeConfirmation),
            _ => None,
        }
    }

    /// The fields signed, in the order AWS signs them; `Subject` only when the message has
    /// one, every other one required.
    fn signed_fields(self) -> &'static [&'static str] {
        match self {
            Kind::Notification => &[
                "Message",
                "MessageId",
                "Subject",
                "Timestamp",
                "TopicArn",
                "Type",
            ],
            Kind::SubscriptionConfirmation | Kind::UnsubscribeConfirmation => &[
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            ],
        }
    }
}

/// The digest a `SignatureVersion` names.
fn digest_of(version: &str) -> Option<MessageDigest> {
    match version {
        "1" => Some(MessageDigest::sha1()),
        "2" => Some(MessageDigest::sha256()),
        _ => None,
    }
}

/// The text of `name` in `message`: `None` when absent or `null` (as AWS's validators skip
/// it); any other value than a string is malformed.
fn field<'m>(message: &'m Map<String, Value>, name: &str) -> Result<Option<&'m str>, ()> {
    match message.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(()),
    }
}

/// The string SNS signs for a message of `kind`: each signed field present, as
/// `Name\nValue\n`. `None` when a field other than `Subject` is missing or not a string.
fn string_to_sign(kind: Kind, message: &Map<String, Value>) -> Option<String> {
    let mut signed = String::new();
    for name in kind.signed_fields() {
        match field(message, name).ok()? {
            Some(value) => {
                signed.push_str(name);
                signed.push('\n');
                signed.push_str(value);
                signed.push('\n');
            }
            None if *name == "Subject" => {}
            None => return None,
        }
    }
    Some(signed)
}

/// An SNS source: the URLs it trusts, the topics it takes (all, when `None`), its tolerance,
/// and (built for `send` and `replay`) the key it signs with.
pub struct Sns {
    allowlist: Allowlist,
    topics: Option<Vec<String>>,
    tolerance: Duration,
    signer: Option<RsaSigningKey>,
}

impl fmt::Debug for Sns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sns")
            .field("cert_urls", &self.allowlist)
            .field("topic_arns", &self.topics)
            .field("tolerance", &self.tolerance)
            .field("signs", &self.signer.is_some())
            .finish()
    }
}

/// Builds an SNS source from `cert_urls` and `topic_arns`; it takes no secrets.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only_keyless(&["cert_urls", "topic_arns"])?;
    settings.no_secrets(
        "SNS signs with the certificate at each message's SigningCertURL, so no public_keys \
         either; name the topics to take in topic_arns",
        "SNS signs with an RSA key: give --key FILE (its PEM private key) and --cert-url URL \
         (its certificate's address) instead",
    )?;
    let allowlist = Allowlist::from_settings(settings, &DEFAULT_CERT_URLS)?;
    let topics = settings.texts("topic_arns")?;
    if let Some(topics) = &topics {
        if topics.is_empty() {
            return Err(ProviderError::at(
                "topic_arns",
                "give at least one topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME), or leave \
                 topic_arns out to take every topic",
            ));
        }
        if let Some(bad) = topics.iter().find(|arn| !arn.starts_with("arn:aws")) {
            return Err(ProviderError::at(
                "topic_arns",
                format!("{bad:?} is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)"),
            ));
        }
    }
    let signer = settings
        .signing
        .map(|signing| RsaSigningKey::load(signing, "sns", "in each message (SigningCertURL)"))
        .transpose()?;
    Ok(Arc::new(Sns {
        allowlist,
        topics: topics.map(|topics| topics.into_iter().map(str::to_owned).collect()),
        tolerance: if settings.tolerance_set {
            settings.tolerance
        } else {
            DEFAULT_TOLERANCE
        },
        signer,
    }))
}

/// A message's signed parts, read and checked as far as can be without the certificate.
struct Envelope {
    kind: Kind,
    signed: String,
    signature: RsaSignature,
    timestamp: i64,
    /// A `SubscriptionConfirmation`'s `SubscribeURL`, admitted.
    subscribe_url: Option<CertUrl>,
}

impl Sns {
    /// Reads the message: a JSON object of a known `Type` with every signed field, a
    /// `SignatureVersion` of 1 or 2, a `.pem` certificate URL the allowlist admits, a topic
    /// the source takes, and for a `SubscriptionConfirmation` an admitted `SubscribeURL`. All of
    /// it is refused here, before any request is made.
    fn envelope(&self, body: &[u8]) -> Result<Envelope, SignatureError> {
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
            return Err(SignatureError::Invalid);
        };
        // The signed values are read from the body: each must be there once.
        if repeats_a_key(body) {
            return Err(SignatureError::Invalid);
        }
        let text = |name: &str| {
            field(&message, name)
                .ok()
                .flatten()
                .ok_or(SignatureError::Invalid)
        };
        let kind = Kind::of(text("Type")?).ok_or(SignatureError::Invalid)?;
        let digest = digest_of(text("SignatureVersion")?).ok_or(SignatureError::Invalid)?;
        let signed = string_to_sign(kind, &message).ok_or(SignatureError::Invalid)?;
        if let Some(topics) = &self.topics {
            let topic = text("TopicArn")?;
            if !topics.iter().any(|allowed| allowed == topic) {
                return Err(SignatureError::Invalid);
            }
        }
        let cert_url = self
            .allowlist
            .admit(text("SigningCertURL")?)
            .filter(|url| !url.as_str().contains('?') && url.as_str().ends_with(".pem"))
            .ok_or(SignatureError::Untrusted(
                "SigningCertURL is no .pem URL under the source's cert_urls",
            ))?;
        let subscribe_url = match kind {
            Kind::SubscriptionConfirmation => {
                Some(self.allowlist.admit(text("SubscribeURL")?).ok_or(
                    SignatureError::Untrusted(
                        "SubscribeURL is under none of the source's cert_urls",
                    ),
                )?)
            }
            Kind::Notification | Kind::UnsubscribeConfirmation => None,
        };
        let timestamp = chrono::DateTime::parse_from_rfc3339(text("Timestamp")?)
            .map_err(|_| SignatureError::Invalid)?
            .timestamp();
        let signature = RsaSignature::from_base64(text("Signature")?, digest, cert_url)?;
        Ok(Envelope {
            kind,
            signed,
            signature,
            timestamp,
            subscribe_url,
        })
    }
}

/// What hookbox answers a confirmed subscription with; SNS looks only at the status.
fn confirmed() -> Answer {
    Answer {
        status: 200,
        content_type: "application/json",
        body: br#"{"status":"subscription_confirmed"}"#.to_vec(),
    }
}

impl Provider for Sns {
    fn signing_refused(&self) -> Option<String> {
        self.signer.as_ref()?.not_admitted_by(&self.allowlist)
    }

    /// A body [`sign_delivery`](Provider::sign_delivery) would send without a `Signature`: not
    /// a JSON object, a `Type` SNS does not send, or a field its kind signs missing or not a
    /// string (`Timestamp` aside: signing sets it). A black-box run's `send` posted such a
    /// body unsigned and exited 0.
    fn unsignable(&self, body: &[u8]) -> Option<String> {
        self.signer.as_ref()?;
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
            return Some(
                "an SNS message is a JSON object (with Type, MessageId, TopicArn, Message, ...), \
                 and this body is not one"
                    .to_owned(),
            );
        };
        let Some(kind) = field(&message, "Type").ok().flatten().and_then(Kind::of) else {
            return Some(
                "the SNS message's Type is missing or not one SNS sends (Notification, \
                 SubscriptionConfirmation or UnsubscribeConfirmation)"
                    .to_owned(),
            );
        };
        let wrong: Vec<&str> = kind
            .signed_fields()
            .iter()
            .copied()
            .filter(|name| *name != "Timestamp")
            .filter(|name| match field(&message, name) {
                Ok(Some(_)) => false,
                Ok(None) => *name != "Subject",
                Err(()) => true,
            })
            .collect();
        (!wrong.is_empty()).then(|| {
            format!(
                "the SNS message lacks {} as a string: a {kind:?}'s signature covers {} (each a \
                 string; Subject only when there is one, and Timestamp, which signing sets)",
                wrong.join(", "),
                kind.signed_fields().join(", ")
            )
        })
    }

    fn scheme(&self) -> &'static str {
        "sns"
    }

    /// Checks against a certificate already fetched; one not fetched yet counts as a mismatch
    /// here. [`receive`](Provider::receive) is what fetches it.
    fn verify(&self, _headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let envelope = self.envelope(body)?;
        envelope
            .signature
            .verify_cached(envelope.signed.as_bytes(), now)?;
        Clock::new(now, self.tolerance).check(envelope.timestamp)
    }

    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        Box::pin(async move {
            let envelope = self.envelope(inbound.body)?;
            envelope
                .signature
                .verify(envelope.signed.as_bytes(), inbound.now)
                .await?;
            Clock::new(inbound.now, self.tolerance).check(envelope.timestamp)?;
            match (envelope.kind, envelope.subscribe_url) {
                (Kind::SubscriptionConfirmation, Some(url)) => {
                    Ok(Received::Confirm(Confirmation {
                        url,
                        answer: confirmed(),
                    }))
                }
                _ => receive_verified(self, inbound),
            }
        })
    }

    fn needs_json(&self) -> bool {
        true
    }

    fn identify(&self, _headers: &dyn Headers, json: Option<&Value>) -> Identity {
        Identity {
            event_id: json_text(json, "/MessageId"),
            event_type: json_text(json, "/Type"),
        }
    }

    /// SNS's own headers, for the record: the signature travels in the body.
    fn kept_headers(&self) -> Vec<String> {
        [MESSAGE_TYPE, MESSAGE_ID, TOPIC_ARN, SUBSCRIPTION_ARN]
            .iter()
            .map(|name| (*name).to_owned())
            .collect()
    }

    /// The headers SNS sends beside a message: its type, id and topic, as the body says.
    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        _event_id: &str,
        _event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
            return Vec::new();
        };
        [
            (MESSAGE_TYPE, "Type"),
            (MESSAGE_ID, "MessageId"),
            (TOPIC_ARN, "TopicArn"),
        ]
        .into_iter()
        .filter_map(|(header, name)| {
            let value = field(&message, name).ok().flatten()?;
            Some((header.to_owned(), value.to_owned()))
        })
        .collect()
    }

    /// Signs inside the body as SNS would, with `--key` and naming `--cert-url`: `Timestamp`
    /// becomes `timestamp`, `SigningCertURL` the certificate's URL, `SignatureVersion` stays `1`
    /// where the body says so and is `2` otherwise, and `Signature` is made over the fields
    /// of the message's `Type`. Built to receive (no key), or for a body that is not a JSON
    /// object, the body goes as it is: nothing it could send would pass.
    fn sign_delivery(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Signed {
        let as_is = || Signed {
            body: body.to_vec(),
            query: None,
            headers: self.sign(body, timestamp, event_id, event_type),
            content_type: Some(CONTENT_TYPE),
        };
        let Some(signer) = &self.signer else {
            return as_is();
        };
        let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(body) else {
            return as_is();
        };
        let time = chrono::DateTime::from_timestamp(timestamp, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let version = if field(&message, "SignatureVersion") == Ok(Some("1")) {
            "1"
        } else {
            "2"
        };
        message.insert("Timestamp".into(), Value::String(time));
        message.insert("SignatureVersion".into(), Value::String(version.into()));
        message.insert(
            "SigningCertURL".into(),
            Value::String(signer.cert_url.clone()),
        );
        let kind = field(&message, "Type").ok().flatten().and_then(Kind::of);
        let digest = digest_of(version).expect("1 and 2 name a digest");
        if let Some(signed) = kind.and_then(|kind| string_to_sign(kind, &message)) {
            let signature = signer.sign_base64(digest, signed.as_bytes());
            message.insert("Signature".into(), Value::String(signature));
        }
        let body = serde_json::to_vec(&message).expect("a JSON object serializes");
        Signed {
            headers: self.sign(&body, timestamp, event_id, event_type),
            body,
            query: None,
            content_type: Some(CONTENT_TYPE),
        }
    }

    /// AWS's advice is to refuse a message of an unexpected topic; without `topic_arns`, anyone
    /// with an AWS account can subscribe the URL to a topic of theirs, and it is confirmed.
    fn setup_warning(&self) -> Option<&'static str> {
        self.topics.is_none().then_some(
            "no topic_arns: this source confirms a subscription to any topic and stores its \
             messages, and anyone with an AWS account can make one; list your topics' ARNs in \
             topic_arns (see docs/providers/sns.md)",
        )
    }

    /// What is re-made when a message is signed again (by SNS with a new certificate, or by
    /// `replay` at a new time), so a re-signed message of one id is still its replay.
    fn volatile_fields(&self) -> &'static [&'static str] {
        &[
            "/Signature",
            "/SignatureVersion",
            "/SigningCertURL",
            "/Timestamp",
        ]
    }

    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        Some((
            DEFAULT_TOLERANCE,
            "SNS retries an HTTP/S delivery for at most an hour (its delivery policy's limit)",
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openssl::pkey::{PKey, Private};

    use super::super::{certs, Provider, Scheme, SignatureError, Signing};
    use super::*;
    use crate::secret::Secret;

    const NOW: i64 = 1_763_649_000;
    const TOPIC: &str = "arn:aws:sns:us-east-1:123456789012:orders";

    fn key_and_cert(from: i64, until: i64) -> (PKey<Private>, String) {
        certs::test_key_and_cert("sns.amazonaws.com", from, until)
    }

    fn scheme(table: &str) -> Scheme {
        super::super::Registry::builtin()
            .scheme("sns", Some(table.parse().expect("toml")))
            .expect("sns is built in")
    }

    fn signer(key: &PKey<Private>, cert_url: &str) -> Arc<dyn Provider> {
        let pem = String::from_utf8(key.private_key_to_pem_pkcs8().expect("pem")).expect("text");
        scheme("")
            .build_signer(
                &[],
                Duration::from_secs(300),
                &Signing {
                    key_pem: Some(Secret::new(pem)),
                    cert_url: Some(cert_url.to_owned()),
                    to_query: None,
                },
            )
            .expect("a signer")
    }

    fn receiver(table: &str) -> Arc<dyn Provider> {
        scheme(table)
            .build(&[], Duration::from_secs(300))
            .expect("a receiver")
    }

    fn notification(id: &str, subject: Option<&str>, version: &str) -> String {
        let mut message = serde_json::json!({
            "Type": "Notification",
            "MessageId": id,
            "TopicArn": TOPIC,
            "Message": "{\"order\": 1}\nline two",
            "SignatureVersion": version,
            "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe",
        });
        if let Some(subject) = subject {
            message["Subject"] = subject.into();
        }
        message.to_string()
    }

    fn with(body: &[u8], name: &str, value: Value) -> Vec<u8> {
        let mut message: Value = serde_json::from_slice(body).expect("json");
        message[name] = value;
        serde_json::to_vec(&message).expect("json")
    }

    #[test]
    fn the_string_to_sign_follows_the_type_and_skips_only_an_absent_subject() {
        let message = |json: Value| json.as_object().expect("object").clone();
        let notification = message(serde_json::json!({
            "Type": "Notification", "MessageId": "m", "TopicArn": "t", "Message": "hi\nthere",
            "Timestamp": "2025-11-20T14:29:58.412Z", "Subject": "s", "Token": "not signed",
            "SubscribeURL": "not signed either",
        }));
        assert_eq!(
            string_to_sign(Kind::Notification, &notification).as_deref(),
            Some(
                "Message\nhi\nthere\nMessageId\nm\nSubject\ns\nTimestamp\n\
                 2025-11-20T14:29:58.412Z\nTopicArn\nt\nType\nNotification\n"
            )
        );
        let mut no_subject = notification.clone();
        no_subject.insert("Subject".into(), Value::Null);
        assert!(!string_to_sign(Kind::Notification, &no_subject)
            .expect("signed")
            .contains("Subject"));
        let confirmation = message(serde_json::json!({
            "Type": "SubscriptionConfirmation", "MessageId": "m", "TopicArn": "t",
            "Message": "m", "Timestamp": "x", "Token": "tok", "SubscribeURL": "u",
            "Subject": "not signed",
        }));
        assert_eq!(
            string_to_sign(Kind::SubscriptionConfirmation, &confirmation).as_deref(),
            Some(
                "Message\nm\nMessageId\nm\nSubscribeURL\nu\nTimestamp\nx\nToken\ntok\n\
                 TopicArn\nt\nType\nSubscriptionConfirmation\n"
            )
        );
        let mut no_token = confirmation.clone();
        no_token.remove("Token");
        assert_eq!(
            string_to_sign(Kind::UnsubscribeConfirmation, &no_token),
            None
        );
        let mut number = notification.clone();
        number.insert("Message".into(), Value::from(7));
        assert_eq!(string_to_sign(Kind::Notification, &number), None);
    }

    #[test]
    fn a_signed_message_verifies_in_both_versions_and_nothing_else_does() {
        let url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-unit-1.pem";
        let (key, pem) = key_and_cert(NOW - 3600, NOW + 3600);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let sns = receiver("");
        for (version, subject) in [("1", Some("order.paid")), ("2", None), ("9", None)] {
            let body = notification("m-1", subject, version);
            let signed = signer(&key, url).sign_delivery(body.as_bytes(), NOW, "", None);
            let json: Value = serde_json::from_slice(&signed.body).expect("json");
            let expected = if version == "1" { "1" } else { "2" };
            assert_eq!(json["SignatureVersion"], expected);
            assert_eq!(json["SigningCertURL"], url);
            assert_eq!(json["Timestamp"], "2025-11-20T14:30:00.000Z");
            assert_eq!(signed.content_type, Some(CONTENT_TYPE));
            let headers = &signed.headers;
            assert_eq!(sns.verify(headers, &signed.body, NOW + 60), Ok(()));
            assert_eq!(
                sns.verify(headers, &signed.body, NOW + 301),
                Err(SignatureError::Stale)
            );
            // A field signed, changed after signing.
            for (name, value) in [
                ("Message", Value::from("{\"order\": 2}")),
                ("MessageId", Value::from("m-2")),
                (
                    "TopicArn",
                    Value::from("arn:aws:sns:us-east-1:123456789012:other"),
                ),
                ("Subject", Value::from("another")),
                ("Timestamp", Value::from("2025-11-20T14:30:01.000Z")),
                ("Type", Value::from("UnsubscribeConfirmation")),
                (
                    "SignatureVersion",
                    Value::from(if version == "1" { "2" } else { "1" }),
                ),
                ("SignatureVersion", Value::from("3")),
                ("SignatureVersion", Value::from(2)),
                ("Signature", Value::from("not base64!")),
                ("Signature", Value::from("")),
                ("Signature", Value::Null),
                (
                    "SigningCertURL",
                    Value::from("https://sns.us-east-1.amazonaws.com/other.pem"),
                ),
                (
                    "SigningCertURL",
                    Value::from("https://sns.us-east-1.amazonaws.com/x.pem?y"),
                ),
                (
                    "SigningCertURL",
                    Value::from("https://sns.us-east-1.amazonaws.com/x.crt"),
                ),
                ("Message", Value::Null),
            ] {
                let changed = with(&signed.body, name, value.clone());
                assert_eq!(
                    sns.verify(headers, &changed, NOW)
                        .map_err(SignatureError::as_answered),
                    Err(SignatureError::Invalid),
                    "{version}: {name} = {value}"
                );
            }
            // Fields AWS does not sign for a notification may change.
            let unsigned = with(&signed.body, "UnsubscribeURL", Value::from("x"));
            assert_eq!(sns.verify(headers, &unsigned, NOW), Ok(()));
            // A second Message in front of the signed one: the check would read the signed
            // one, a reader of the stored payload might take the other.
            let doubled = [&br#"{"Message":"unsigned","#[..], &signed.body[1..]].concat();
            assert_eq!(
                sns.verify(headers, &doubled, NOW),
                Err(SignatureError::Invalid),
                "{version}"
            );
        }
        for body in [&b"not json"[..], b"[]", b"{}", b"\"Notification\""] {
            assert_eq!(
                sns.verify(&Vec::new(), body, NOW),
                Err(SignatureError::Invalid)
            );
        }
    }

    #[test]
    fn a_certificate_outside_its_validity_period_or_not_rsa_is_refused() {
        let url = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-unit-old.pem";
        let (key, pem) = key_and_cert(NOW - 7200, NOW - 3600);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let body = notification("m-old", None, "2");
        let signed = signer(&key, url).sign_delivery(body.as_bytes(), NOW, "", None);
        assert_eq!(
            receiver("").verify(&signed.headers, &signed.body, NOW),
            Err(SignatureError::Untrusted(
                "the certificate is outside its validity period (expired, or not valid yet)"
            ))
        );
    }

    #[test]
    fn topic_arns_limits_the_topics_taken() {
        let url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-unit-2.pem";
        let (key, pem) = key_and_cert(NOW - 3600, NOW + 3600);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let body = notification("m-topic", None, "2");
        let signed = signer(&key, url).sign_delivery(body.as_bytes(), NOW, "", None);
        let ours = receiver(&format!("topic_arns = [{TOPIC:?}]"));
        assert_eq!(ours.verify(&signed.headers, &signed.body, NOW), Ok(()));
        let theirs = receiver("topic_arns = [\"arn:aws:sns:us-east-1:123456789012:else\"]");
        assert_eq!(
            theirs.verify(&signed.headers, &signed.body, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn an_hour_is_the_default_tolerance_and_a_source_may_set_its_own() {
        let url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-unit-3.pem";
        let (key, pem) = key_and_cert(NOW - 7200, NOW + 7200);
        certs::seed(url, pem.as_bytes()).expect("seeded");
        let body = notification("m-hour", None, "2");
        let signed = signer(&key, url).sign_delivery(body.as_bytes(), NOW, "", None);
        let build = |tolerance: Option<Duration>| {
            scheme("").build_source(&[], tolerance).expect("a receiver")
        };
        let default = build(None);
        assert_eq!(
            default.verify(&signed.headers, &signed.body, NOW + 3600),
            Ok(())
        );
        assert_eq!(
            default.verify(&signed.headers, &signed.body, NOW - 3600),
            Ok(())
        );
        assert_eq!(
            default.verify(&signed.headers, &signed.body, NOW + 3601),
            Err(SignatureError::Stale)
        );
        let narrow = build(Some(Duration::from_secs(60)));
        assert_eq!(
            narrow.verify(&signed.headers, &signed.body, NOW + 61),
            Err(SignatureError::Stale)
        );
    }

    #[test]
    fn the_config_names_what_is_wrong() {
        let build = |table: &str, secrets: &[Secret]| {
            scheme(table)
                .build(secrets, Duration::from_secs(300))
                .expect_err("refused")
        };
        let error = build("", &[Secret::new("s")]);
        assert_eq!(error.key, "secrets");
        assert!(error.problem.contains("SigningCertURL"), "{error}");
        assert_eq!(build("cert_urls = []", &[]).key, "cert_urls");
        assert_eq!(
            build("cert_urls = [\"sns.amazonaws.com\"]", &[]).key,
            "cert_urls"
        );
        assert_eq!(build("topic_arns = []", &[]).key, "topic_arns");
        assert_eq!(build("topic_arns = [\"orders\"]", &[]).key, "topic_arns");
        assert_eq!(build("webhook_id = \"x\"", &[]).key, "webhook_id");
    }

    #[test]
    fn a_signer_needs_a_key_and_a_cert_url_and_debug_shows_neither_key() {
        let build = |signing: &Signing| {
            scheme("")
                .build_signer(&[], Duration::from_secs(300), signing)
                .expect_err("refused")
                .key
        };
        assert_eq!(build(&Signing::default()), "--key");
        let (key, _) = key_and_cert(NOW, NOW + 1);
        let pem = String::from_utf8(key.private_key_to_pem_pkcs8().expect("pem")).expect("text");
        let no_url = Signing {
            key_pem: Some(Secret::new(pem)),
            cert_url: None,
            to_query: None,
        };
        assert_eq!(build(&no_url), "--cert-url");
        let shown = format!(
            "{:?}",
            signer(&key, "https://sns.us-east-1.amazonaws.com/c.pem")
        );
        assert!(
            shown.starts_with("Sns {") && shown.contains("signs: true"),
            "{shown}"
        );
        assert!(!shown.contains("PRIVATE"), "{shown}");
        // Built to receive, it cannot sign: the body goes unsigned.
        let body = notification("m", None, "2");
        let unsigned = receiver("").sign_delivery(body.as_bytes(), NOW, "", None);
        assert_eq!(unsigned.body, body.as_bytes());
    }

    #[test]
    fn a_re_signed_message_keeps_its_fingerprint() {
        let url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-unit-4.pem";
        let (key, _) = key_and_cert(NOW - 3600, NOW + 3600);
        let body = notification("m-fp", Some("s"), "1");
        let sns = signer(&key, url);
        let first = sns.sign_delivery(body.as_bytes(), NOW, "", None).body;
        let again = sns.sign_delivery(&first, NOW + 30, "", None).body;
        assert_ne!(first, again);
        let fingerprint = |bytes: &[u8]| {
            let json: Value = serde_json::from_slice(bytes).expect("json");
            crate::inbox::fingerprint(sns.volatile_fields(), bytes, Some(&json))
        };
        assert_eq!(fingerprint(&first), fingerprint(&again));
        let other = with(&first, "Message", Value::from("changed"));
        assert_ne!(fingerprint(&first), fingerprint(&other));
    }
}
