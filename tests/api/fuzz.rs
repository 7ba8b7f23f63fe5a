//! Property-based fuzzing of everything that reads untrusted bytes: signature headers of every
//! scheme (with their timestamps), event-id extraction and validation, the JSON-pointer
//! locators of the config, and the capture reader. The properties: nothing panics, and a
//! signature verifies exactly when the scheme's rules say it should.
//!
//! Each property runs `PROPTEST_CASES` cases, 1000 unless set (the request-sending ones a
//! quarter of that), which keeps the whole module to a few seconds in CI. A longer run:
//! `PROPTEST_CASES=100000 cargo test --test api fuzz` (20 000 take about two minutes).

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use hookbox::capture::{CaptureLine, Entries, InputFile, InputKind};
use hookbox::ids::{EventId, EventIdError, MAX_EVENT_ID_BYTES};
use hookbox::providers::generic::Hmac;
use hookbox::providers::{
    Encoding, GenericRule, Headers, IdSource, Locator, Provider, SignatureError,
};
use hookbox::secret::Secret;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as ProptestConfig;

use crate::helpers::*;
use crate::raw;

const TOLERANCE: Duration = Duration::from_secs(300);

/// `PROPTEST_CASES` cases (1000 by default), and no regression files in the tree: a failure
/// found here becomes a named test instead.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(1000),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Request headers as raw bytes, which need not be UTF-8.
#[derive(Debug, Clone)]
struct RawHeaders(Vec<(String, Vec<u8>)>);

impl Headers for RawHeaders {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// The providers fuzzed here: each built-in one, and `hmac-sha256` with a rule.
#[derive(Debug, Clone)]
enum Scheme {
    Stripe,
    Standard,
    Github,
    Shopify,
    Slack,
    HmacSha256(GenericRule),
}

type Verifier = std::sync::Arc<dyn Provider>;

/// One scheme of each kind, with where its signature is written.
#[derive(Debug, Clone)]
struct Kind {
    scheme: Scheme,
    /// The header carrying the MAC, and the text before the MAC in it.
    signature: (&'static str, &'static str),
    encoding: Encoding,
    /// The signed timestamp header, when it has one of its own.
    timestamp: Option<&'static str>,
    /// The id header, when the id is signed.
    signed_id: Option<&'static str>,
}

fn generic(encoding: Encoding, prefix: Option<&str>) -> Scheme {
    Scheme::HmacSha256(GenericRule::body_sha256(
        "X-Sig",
        prefix,
        encoding,
        IdSource::At(Locator::Header("X-Id".into())),
        Some(Locator::Json("/type".into())),
    ))
}

fn kinds() -> Vec<Kind> {
    let kind = |scheme, signature, encoding, timestamp, signed_id| Kind {
        scheme,
        signature,
        encoding,
        timestamp,
        signed_id,
    };
    vec![
        kind(
            Scheme::Stripe,
            ("Stripe-Signature", "v1="),
            Encoding::Hex,
            None,
            None,
        ),
        kind(
            Scheme::Standard,
            ("webhook-signature", "v1,"),
            Encoding::Base64,
            Some("webhook-timestamp"),
            Some("webhook-id"),
        ),
        kind(
            Scheme::Github,
            ("X-Hub-Signature-256", "sha256="),
            Encoding::Hex,
            None,
            None,
        ),
        kind(
            Scheme::Shopify,
            ("X-Shopify-Hmac-Sha256", ""),
            Encoding::Base64,
            None,
            None,
        ),
        kind(
            Scheme::Slack,
            ("X-Slack-Signature", "v0="),
            Encoding::Hex,
            Some("X-Slack-Request-Timestamp"),
            None,
        ),
        kind(
            generic(Encoding::Hex, Some("sha256=")),
            ("X-Sig", "sha256="),
            Encoding::Hex,
            None,
            None,
        ),
        kind(
            generic(Encoding::Base64, None),
            ("X-Sig", ""),
            Encoding::Base64,
            None,
            None,
        ),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    proptest::sample::select(kinds())
}

/// A usable secret for `scheme`: Standard Webhooks keys are base64 after `whsec_`.
fn secret_for(scheme: &Scheme, raw: &[u8]) -> Secret {
    match scheme {
        Scheme::Standard => Secret::new(format!("whsec_{}", BASE64.encode(raw))),
        _ => Secret::new(String::from_utf8_lossy(raw).into_owned()),
    }
}

fn verifier(scheme: &Scheme, raw_secret: &[u8]) -> Verifier {
    let secrets = [secret_for(scheme, raw_secret)];
    let name = match scheme {
        Scheme::Stripe => "stripe",
        Scheme::Standard => "standard",
        Scheme::Github => "github",
        Scheme::Shopify => "shopify",
        Scheme::Slack => "slack",
        Scheme::HmacSha256(rule) => {
            return std::sync::Arc::new(
                Hmac::new(rule.clone(), &secrets, TOLERANCE).expect("a non-empty secret is usable"),
            )
        }
    };
    hookbox::providers::Scheme::builtin(name)
        .expect("built in")
        .build(&secrets, TOLERANCE)
        .expect("a non-empty secret is usable")
}

fn timestamped(scheme: &Scheme) -> bool {
    matches!(scheme, Scheme::Stripe | Scheme::Standard | Scheme::Slack)
}

/// Every header name any scheme reads, in some casing, and a few it does not.
const NAMES: [&str; 16] = [
    "Stripe-Signature",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "X-Hub-Signature-256",
    "X-GitHub-Delivery",
    "X-GitHub-Event",
    "X-Shopify-Hmac-Sha256",
    "X-Shopify-Webhook-Id",
    "X-Slack-Signature",
    "X-Slack-Request-Timestamp",
    "X-Sig",
    "X-Id",
];

/// Header values: arbitrary bytes, and text shaped like the schemes' own.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..96),
        "(t|v0|v1|sha256)?[=,]?[0-9a-fA-F+/= ,.v1t]{0,90}".prop_map(String::into_bytes),
        "[0-9]{0,25}".prop_map(String::into_bytes),
    ]
}

fn raw_headers() -> impl Strategy<Value = RawHeaders> {
    proptest::collection::vec(
        (proptest::sample::select(NAMES.to_vec()), header_value()),
        0..8,
    )
    .prop_map(|pairs| {
        RawHeaders(
            pairs
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value))
                .collect(),
        )
    })
}

/// The signed headers as bytes, with the MAC in the signature header changed in one place to
/// another character of its alphabet.
fn with_tag_changed(kind: &Kind, signed: &[(String, String)], at: Index, to: Index) -> RawHeaders {
    let (name, before) = kind.signature;
    let alphabet: &[u8] = match kind.encoding {
        Encoding::Hex => b"0123456789abcdef",
        Encoding::Base64 => b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    };
    RawHeaders(
        signed
            .iter()
            .map(|(n, v)| {
                let mut value = v.clone().into_bytes();
                if n.eq_ignore_ascii_case(name) {
                    let start =
                        v.find(before).expect("the signature has its prefix") + before.len();
                    let tag_len = v[start..].trim_end_matches('=').len();
                    let i = start + at.index(tag_len);
                    let current = value[i].to_ascii_lowercase();
                    let others: Vec<u8> = alphabet
                        .iter()
                        .copied()
                        .filter(|c| *c != value[i] && c.to_ascii_lowercase() != current)
                        .collect();
                    value[i] = others[to.index(others.len())];
                }
                (n.clone(), value)
            })
            .collect(),
    )
}

/// What must still be true of a changed header set for it to verify: the genuine MAC is still
/// written in the signature header, and the signed timestamp and id are unchanged.
fn still_carries_the_signature(
    kind: &Kind,
    genuine: &[(String, String)],
    changed: &RawHeaders,
) -> bool {
    let value = |headers: &dyn Headers, name: &str| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v).trim().to_owned())
    };
    let genuine_header = value(&genuine.to_vec(), kind.signature.0).expect("signed");
    let tag = decode_all(&genuine_header, kind.encoding)
        .into_iter()
        .max_by_key(Vec::len)
        .expect("the genuine header has a MAC");
    let Some(changed_header) = value(changed, kind.signature.0) else {
        return false;
    };
    let same = |name: Option<&str>| {
        name.is_none_or(|name| value(&genuine.to_vec(), name) == value(changed, name))
    };
    // Stripe signs the `t=` value, inside the signature header.
    let stripe_t = !matches!(kind.scheme, Scheme::Stripe)
        || changed_header
            .replace(|c: char| c.is_ascii_whitespace(), "")
            .contains(genuine_header.split(',').next().expect("t= first"));
    decode_all(&changed_header, kind.encoding).contains(&tag)
        && same(kind.timestamp)
        && same(kind.signed_id)
        && stripe_t
}

/// Every run of the encoding's characters in `text`, decoded where it decodes.
fn decode_all(text: &str, encoding: Encoding) -> Vec<Vec<u8>> {
    let in_run = |c: char| match encoding {
        Encoding::Hex => c.is_ascii_hexdigit(),
        Encoding::Base64 => c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '=',
    };
    text.split(|c: char| !in_run(c))
        .filter(|run| !run.is_empty())
        .filter_map(|run| match encoding {
            Encoding::Hex => hex::decode(run).ok(),
            Encoding::Base64 => BASE64.decode(run).ok(),
        })
        .collect()
}

/// A single edit of one header value: a byte replaced, inserted or removed.
#[derive(Debug, Clone)]
enum Edit {
    Replace(Index, u8),
    Insert(Index, u8),
    Remove(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Remove),
    ]
}

fn apply(edit: &Edit, value: &mut Vec<u8>) {
    match edit {
        Edit::Replace(i, b) if !value.is_empty() => {
            let at = i.index(value.len());
            value[at] = *b;
        }
        Edit::Insert(i, b) => {
            let at = i.index(value.len() + 1);
            value.insert(at, *b);
        }
        Edit::Remove(i) if !value.is_empty() => {
            value.remove(i.index(value.len()));
        }
        _ => {}
    }
}

fn bytes_of(signed: &[(String, String)]) -> RawHeaders {
    RawHeaders(
        signed
            .iter()
            .map(|(n, v)| (n.clone(), v.clone().into_bytes()))
            .collect(),
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn what_a_scheme_signs_verifies_within_the_tolerance_and_only_then(
        kind in kind(),
        secret in proptest::collection::vec(any::<u8>(), 1..48),
        body in proptest::collection::vec(any::<u8>(), 0..512),
        timestamp in 0i64..=4_102_444_800,
        id in "[A-Za-z0-9_.:-]{1,64}",
        skew in 0u64..=86_400,
    ) {
        let verifier = verifier(&kind.scheme, &secret);
        let signed = verifier.sign(&body, timestamp, &id, Some("thing.happened"));
        prop_assert_eq!(verifier.verify(&signed, &body, timestamp), Ok(()));
        let expected = if timestamped(&kind.scheme) && skew > TOLERANCE.as_secs() {
            Err(SignatureError::Stale)
        } else {
            Ok(())
        };
        let skew = skew as i64;
        prop_assert_eq!(verifier.verify(&signed, &body, timestamp + skew), expected);
        prop_assert_eq!(verifier.verify(&signed, &body, timestamp - skew), expected);
    }

    #[test]
    fn any_changed_body_byte_or_mac_character_fails_verification(
        kind in kind(),
        secret in proptest::collection::vec(any::<u8>(), 1..48),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        flip in any::<Index>(),
        bit in 0u8..8,
        at in any::<Index>(),
        to in any::<Index>(),
    ) {
        let verifier = verifier(&kind.scheme, &secret);
        let now = 1_700_000_000;
        let signed = verifier.sign(&body, now, "evt_1", None);
        let mut changed = body.clone();
        let i = flip.index(changed.len());
        changed[i] ^= 1 << bit;
        prop_assert_eq!(verifier.verify(&signed, &changed, now), Err(SignatureError::Invalid));
        let mut longer = body.clone();
        longer.push(b' ');
        prop_assert_eq!(verifier.verify(&signed, &longer, now), Err(SignatureError::Invalid));
        let tampered = with_tag_changed(&kind, &signed, at, to);
        prop_assert_eq!(verifier.verify(&tampered, &body, now), Err(SignatureError::Invalid));
        let other_secret = verifier_with_other_secret(&kind.scheme, &secret);
        prop_assert_eq!(other_secret.verify(&signed, &body, now), Err(SignatureError::Invalid));
    }

    #[test]
    fn a_signed_header_set_edited_once_verifies_only_if_it_still_carries_the_signature(
        kind in kind(),
        body in proptest::collection::vec(any::<u8>(), 0..128),
        which in any::<Index>(),
        edit in edit(),
    ) {
        let verifier = verifier(&kind.scheme, b"whsec_fuzz_secret");
        let now = 1_700_000_000;
        let signed = verifier.sign(&body, now, "evt_1", Some("t"));
        let mut changed = bytes_of(&signed);
        let i = which.index(changed.0.len());
        apply(&edit, &mut changed.0[i].1);
        if verifier.verify(&changed, &body, now).is_ok() {
            prop_assert!(
                still_carries_the_signature(&kind, &signed, &changed),
                "{:?} verified after {:?}", changed, edit
            );
        }
        let _ = verifier.identify(&changed, None);
    }

    #[test]
    fn arbitrary_headers_never_panic_and_never_verify(
        kind in kind(),
        headers in raw_headers(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        now in any::<i64>(),
    ) {
        let verifier = verifier(&kind.scheme, b"whsec_AAECAwQFBgcICQoLDA0ODw==");
        prop_assert_eq!(verifier.verify(&headers, &body, now), Err(SignatureError::Invalid));
        let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        let identity = verifier.identify(&headers, json.as_ref());
        if let Some(id) = identity.event_id {
            let _ = EventId::try_from(id);
        }
    }

    #[test]
    fn event_ids_are_found_only_where_the_scheme_puts_them(
        id in json_scalar(),
        event in json_scalar(),
        noise in json_value(),
    ) {
        let body = serde_json::json!({"id": id, "event_id": event, "type": noise.clone(), "data": noise});
        let text = |value: &serde_json::Value| match value {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        };
        let none = RawHeaders(Vec::new());
        let stripe = verifier(&Scheme::Stripe, b"k").identify(&none, Some(&body));
        prop_assert_eq!(stripe.event_id, text(&id));
        let slack = verifier(&Scheme::Slack, b"k").identify(&none, Some(&body));
        prop_assert_eq!(slack.event_id, text(&event));
        for kind in kinds() {
            let _ = verifier(&kind.scheme, b"k").identify(&none, Some(&body));
        }
    }

    #[test]
    fn an_event_id_is_accepted_exactly_when_it_is_short_printable_trimmed_and_not_empty(id in any::<String>()) {
        let expected = if id.is_empty() {
            Err(EventIdError::Missing)
        } else if id.len() > MAX_EVENT_ID_BYTES {
            Err(EventIdError::TooLong)
        } else if id.chars().any(char::is_control) {
            Err(EventIdError::ControlCharacter)
        } else if id.contains(char::REPLACEMENT_CHARACTER) {
            Err(EventIdError::NotText)
        } else if id.trim() != id {
            Err(EventIdError::OuterWhitespace)
        } else {
            Ok(id.clone())
        };
        prop_assert_eq!(EventId::try_from(id).map(|e| e.as_str().to_owned()), expected);
    }

    #[test]
    fn locators_parse_only_headers_and_json_pointers_and_print_back(text in locator_text()) {
        match text.parse::<Locator>() {
            Ok(Locator::Header(name)) => {
                prop_assert_eq!(&text, &format!("header:{name}"));
                let token = |b: u8| b.is_ascii_graphic() && !b"\"(),/:;<=>?@[\\]{}".contains(&b);
                prop_assert!(!name.is_empty() && name.bytes().all(token), "{:?}", name);
                prop_assert_eq!(Locator::Header(name).to_string(), text);
            }
            Ok(Locator::Json(pointer)) => {
                prop_assert_eq!(&text, &format!("json:{pointer}"));
                prop_assert!(pointer.is_empty() || pointer.starts_with('/'));
                // Following it into any document is safe.
                let _ = serde_json::json!({"a": [1, {"~": "/"}]}).pointer(&pointer);
                prop_assert_eq!(Locator::Json(pointer).to_string(), text);
            }
            Err(message) => prop_assert!(!message.is_empty()),
        }
    }

    #[test]
    fn a_config_with_any_event_id_locator_is_parsed_or_refused_without_a_panic(text in locator_text()) {
        let quoted = toml::Value::String(text.clone()).to_string();
        let config = format!(
            "[sources.acme]\nscheme = \"hmac-sha256\"\nsecrets = [\"s\"]\nsignature_header = \"X-Sig\"\nevent_id = {quoted}\n"
        );
        let parsed = hookbox::config::Config::parse(&config, &|_: &str| None);
        prop_assert_eq!(parsed.is_ok(), text.parse::<IdSource>().is_ok(), "{:?}", parsed.err());
    }

    #[test]
    fn any_bytes_are_a_capture_line_or_a_reason_never_a_panic(line in capture_bytes()) {
        if let Err(reason) = CaptureLine::parse(&line) {
            prop_assert!(!reason.message.is_empty() && !reason.message.contains('\n'));
        }
    }

    #[test]
    fn a_capture_line_reads_back_as_written(line in capture_line()) {
        let mut out = Vec::new();
        line.write_to(&mut out).expect("writes to a Vec");
        prop_assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        prop_assert_eq!(CaptureLine::parse(&out), Ok(line));
    }
}

proptest! {
    // Each case writes a file.
    #![proptest_config(ProptestConfig { cases: quarter(), ..config() })]

    #[test]
    fn a_capture_file_of_any_bytes_gives_one_entry_per_line_that_is_not_blank(
        content in proptest::collection::vec(
            prop_oneof![Just(b"\n".to_vec()), Just(b"  \r\n".to_vec()), capture_bytes()],
            0..12,
        ).prop_map(|parts| parts.concat()),
    ) {
        let file = TempFile::with_extension(&content, "ndjson");
        let expected = content
            .split(|b| *b == b'\n')
            .filter(|line| !line.trim_ascii().is_empty())
            .count();
        let files = vec![InputFile::new(file.0.clone(), InputKind::Capture)];
        prop_assert_eq!(Entries::count(&files), expected as u64);
        prop_assert_eq!(Entries::new(files).count(), expected);
    }
}

fn verifier_with_other_secret(scheme: &Scheme, secret: &[u8]) -> Verifier {
    let mut other = secret.to_vec();
    other.push(b'x');
    verifier(scheme, &other)
}

fn json_scalar() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    json_scalar().prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z/~]{0,4}", inner, 0..4)
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

fn locator_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "(header|json|Header|body)?:?[ -~]{0,24}",
        "header:[A-Za-z0-9!#$%&'*+.^_`|~ -]{0,24}",
        "json:(/[a-z~01]{0,6}){0,4}",
    ]
}

/// Bytes near a capture line: arbitrary bytes, JSON of the right shape with odd values, and
/// genuine lines with a byte changed.
fn capture_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        json_value().prop_map(|v| serde_json::to_vec(&v).expect("serializes")),
        (json_value(), json_value(), json_value()).prop_map(|(a, b, c)| {
            serde_json::to_vec(&serde_json::json!({
                "source": a, "event_id": "e", "headers": b, "body": c, "body_base64": a,
            }))
            .expect("serializes")
        }),
        (capture_line(), any::<Index>(), any::<u8>()).prop_map(|(line, at, byte)| {
            let mut out = Vec::new();
            line.write_to(&mut out).expect("writes to a Vec");
            let i = at.index(out.len());
            out[i] = byte;
            out
        }),
    ]
}

fn capture_line() -> impl Strategy<Value = CaptureLine> {
    (
        "[a-z0-9_-]{1,16}",
        any::<String>().prop_filter("not empty", |s| !s.is_empty()),
        proptest::option::of(any::<String>()),
        proptest::option::of((0i64..4_102_444_800, 0u32..1_000_000_000)),
        proptest::collection::btree_map("[a-z0-9-]{1,20}", any::<String>(), 0..4),
        proptest::collection::vec(any::<u8>(), 0..256),
    )
        .prop_map(
            |(source, event_id, event_type, received, headers, body)| CaptureLine {
                source,
                event_id,
                event_type,
                received_at: received.map(|(secs, nanos)| -> DateTime<Utc> {
                    Utc.timestamp_opt(secs, nanos).single().expect("in range")
                }),
                headers: headers.into_iter().collect::<BTreeMap<_, _>>(),
                body,
            },
        )
}

/// Over the network: random bodies and headers, signed or not, to every source. Whatever
/// arrives, the answer is never a 5xx, and every error answer is the contract's JSON.
#[actix_web::test]
async fn no_request_of_random_bytes_to_any_source_is_answered_with_a_5xx() {
    let app = TestApp::spawn().await;
    let address = app.address.clone();
    let hookbox_config = app.config.clone();
    let cases = quarter();
    actix_web::rt::task::spawn_blocking(move || {
        let mut runner =
            proptest::test_runner::TestRunner::new(ProptestConfig { cases, ..config() });
        let strategy = (
            proptest::sample::select(SOURCES.to_vec()),
            proptest::collection::vec(any::<u8>(), 0..300),
            raw_headers(),
            any::<bool>(),
            "[ -~]{0,40}",
        );
        runner
            .run(&strategy, |(source, body, extra, signed, id)| {
                let mut headers: Vec<(String, Vec<u8>)> = if signed {
                    delivery_of_bytes(&hookbox_config, source, &body, &id, unix_now())
                        .headers
                        .into_iter()
                        .map(|(n, v)| (n, v.into_bytes()))
                        .collect()
                } else {
                    Vec::new()
                };
                // Extra headers never repeat a genuine one (that would make it count as
                // absent), so a signed delivery still gets through.
                let extra: Vec<_> = extra
                    .0
                    .into_iter()
                    .filter(|(n, v)| {
                        !headers.iter().any(|(m, _)| m.eq_ignore_ascii_case(n))
                            && v.iter()
                                .all(|b| *b == b'\t' || (b' '..=b'~').contains(b) || *b >= 0x80)
                    })
                    .collect();
                headers.extend(extra);
                let pairs: Vec<(&str, &[u8])> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_slice()))
                    .collect();
                let request = raw::request("POST", &format!("/webhooks/{source}"), &pairs, &body);
                let answer = raw::exchange(&address, &request, Duration::from_secs(10))
                    .map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
                prop_assert!(
                    answer.status < 500,
                    "{source}: {} {:?}",
                    answer.status,
                    answer.body
                );
                if answer.status >= 400 {
                    prop_assert!(
                        answer.code().is_some(),
                        "{source}: not the contract's JSON: {:?}",
                        answer
                    );
                }
                Ok(())
            })
            .map_err(|e| e.to_string())
    })
    .await
    .expect("the property's thread")
    .unwrap_or_else(|failure| panic!("{failure}"));
}

/// For properties whose cases are slow (a file, a request): a quarter of the cases.
fn quarter() -> u32 {
    config().cases / 4 + 1
}
