//! Webhook signature checks, one file per provider scheme behind the [`Scheme`] enum.
//!
//! A [`Verifier`] is built once per source at startup: it derives every configured secret's MAC
//! key up front, so a misconfigured secret fails the start rather than the first delivery. On the
//! request path it checks the signature over the raw body bytes, before anything is parsed, and
//! then tells where the scheme keeps the event's id and type ([`Verifier::identify`]).

mod generic;
mod github;
mod shopify;
mod slack;
mod standard;
mod stripe;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::secret::Secret;

type HmacSha256 = Hmac<Sha256>;

/// Read access to request headers, case-insensitive by name. The crate implements it for actix's
/// `HeaderMap`.
pub trait Headers {
    /// The first value of header `name` (any case), as raw bytes.
    fn get(&self, name: &str) -> Option<&[u8]>;
}

/// A plain list of `(name, value)` pairs, as a capture or a test holds them.
impl Headers for [(String, String)] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_bytes())
    }
}

/// Lets a `&Vec<(String, String)>` stand in as `&dyn Headers`, which a slice cannot.
impl Headers for Vec<(String, String)> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        Headers::get(self.as_slice(), name)
    }
}

/// How the `hmac-sha256` scheme writes its MAC in the signature header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Base64, standard alphabet with padding.
    Base64,
}

impl FromStr for Encoding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hex" => Ok(Encoding::Hex),
            "base64" => Ok(Encoding::Base64),
            other => Err(format!(
                "unknown signature encoding {other:?}: expected one of hex, base64"
            )),
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Encoding::Hex => "hex",
            Encoding::Base64 => "base64",
        })
    }
}

/// Where the `hmac-sha256` scheme finds a value of the delivery: a header or a place in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locator {
    /// A request header, by name (any case).
    Header(String),
    /// A JSON pointer (RFC 6901) into the parsed body: `/id`, `/data/object/id`, or empty for the
    /// whole document.
    Json(String),
}

impl FromStr for Locator {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(name) = s.strip_prefix("header:") {
            if name.is_empty() || !name.bytes().all(is_token_byte) {
                return Err(format!(
                    "locator {s:?} does not name a valid header after \"header:\""
                ));
            }
            Ok(Locator::Header(name.to_owned()))
        } else if let Some(pointer) = s.strip_prefix("json:") {
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(format!(
                    "locator {s:?} needs a JSON pointer starting with '/' after \"json:\""
                ));
            }
            Ok(Locator::Json(pointer.to_owned()))
        } else {
            Err(format!(
                "locator {s:?} must be \"header:<name>\" or \"json:<pointer>\""
            ))
        }
    }
}

impl fmt::Display for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Locator::Header(name) => write!(f, "header:{name}"),
            Locator::Json(pointer) => write!(f, "json:{pointer}"),
        }
    }
}

/// RFC 9110 `tchar`: what a header name may be made of. Checked at configuration time so that a
/// typo like `header: X-Id` fails the start instead of never matching.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The configuration of the `hmac-sha256` scheme, for providers with no scheme of their own:
/// an HMAC-SHA256 of the raw body in one header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericRule {
    /// The header carrying the signature.
    pub signature_header: String,
    /// Text the header value starts with before the MAC, e.g. `sha256=`. When set, a header that
    /// lacks it is rejected.
    pub signature_prefix: Option<String>,
    /// How the MAC is written.
    pub encoding: Encoding,
    /// Where the event id is.
    pub event_id: Locator,
    /// Where the event type is, if the provider sends one.
    pub event_type: Option<Locator>,
}

/// A provider's signature scheme. See the contract's "Signature schemes" table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Stripe: `Stripe-Signature: t=..,v1=..`.
    Stripe,
    /// Standard Webhooks (and Svix): `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    Standard,
    /// GitHub: `X-Hub-Signature-256: sha256=..`.
    Github,
    /// Shopify: `X-Shopify-Hmac-Sha256`.
    Shopify,
    /// Slack: `X-Slack-Signature: v0=..` and `X-Slack-Request-Timestamp`.
    Slack,
    /// A configured HMAC-SHA256 of the body.
    HmacSha256(GenericRule),
}

impl Scheme {
    /// Every scheme's name, as configuration spells it, for messages that list the choices.
    pub const NAMES: &'static str = "stripe, standard, github, shopify, slack, hmac-sha256";

    /// A scheme that needs nothing but its name. `hmac-sha256` is refused: its header and id
    /// location come from a source's configuration, so it cannot be named alone.
    ///
    /// # Errors
    /// A one-line reason for `hmac-sha256` or an unknown name.
    pub fn builtin(name: &str) -> Result<Scheme, String> {
        match name {
            "stripe" => Ok(Scheme::Stripe),
            "standard" => Ok(Scheme::Standard),
            "github" => Ok(Scheme::Github),
            "shopify" => Ok(Scheme::Shopify),
            "slack" => Ok(Scheme::Slack),
            "hmac-sha256" => Err(
                "the hmac-sha256 scheme needs a config source (its signature header and event id location are configured)"
                    .to_owned(),
            ),
            other => Err(format!(
                "unknown scheme {other:?}; expected one of {}",
                Scheme::NAMES
            )),
        }
    }

    /// The scheme's name as configuration spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Stripe => "stripe",
            Scheme::Standard => "standard",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::Slack => "slack",
            Scheme::HmacSha256(_) => "hmac-sha256",
        }
    }
}

/// Why a delivery's signature was refused. Deliberately coarse: telling a caller which part of
/// the check failed would help a forger, and the messages never carry a header value, a computed
/// signature or a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing or malformed, or no signature matched any secret.
    #[error("The request signature is missing or does not match.")]
    Invalid,
    /// A signature matched, but its timestamp is too far in the past or the future.
    #[error("The request signature's timestamp is outside the allowed tolerance.")]
    Stale,
}

/// What a delivery says about itself: its id and type, found where the scheme puts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The provider's event id, the key of idempotency.
    pub event_id: Option<String>,
    /// The provider's event type, e.g. `charge.succeeded`.
    pub event_type: Option<String>,
}

/// Checks one source's deliveries: a scheme, the MAC keys of its secrets (several while a secret
/// is being rotated) and the timestamp tolerance.
pub struct Verifier {
    scheme: Scheme,
    keys: Vec<Vec<u8>>,
    tolerance: Duration,
}

/// Shows only what is safe to log: never a key.
impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme.name())
            .field("keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Verifier {
    /// Derives each secret's MAC key once, at startup. Err(String) = a one-line reason (never the
    /// secret), e.g. a standard secret that is not base64 after `whsec_`, or an empty secrets list.
    ///
    /// # Errors
    /// An empty secrets list, an empty secret, a standard secret that is not base64, or an
    /// `hmac-sha256` rule naming an invalid header or JSON pointer.
    pub fn new(
        scheme: Scheme,
        secrets: &[Secret],
        tolerance: Duration,
    ) -> Result<Verifier, String> {
        if secrets.is_empty() {
            return Err(format!(
                "a {} source needs at least one secret",
                scheme.name()
            ));
        }
        if let Scheme::HmacSha256(rule) = &scheme {
            generic::check_rule(rule)?;
        }
        let keys = secrets
            .iter()
            .enumerate()
            .map(|(index, secret)| {
                let value = secret.expose();
                // An empty key would let anyone who guesses the misconfiguration sign.
                if value.is_empty() {
                    return Err(format!("secret #{} is empty", index + 1));
                }
                let key = match scheme {
                    Scheme::Standard => standard::derive_key(value),
                    _ => Ok(value.as_bytes().to_vec()),
                };
                key.map_err(|reason| format!("secret #{}: {reason}", index + 1))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Verifier {
            scheme,
            keys,
            tolerance,
        })
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// Checks the signature over the raw body. `now` is unix seconds (injectable for vectors).
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] when a needed header is missing or malformed or no signature
    /// matches any secret; [`SignatureError::Stale`] when one matches but its signed timestamp is
    /// more than the tolerance away from `now`. The MAC is checked first, so an attacker cannot
    /// learn anything about the clock without a valid signature.
    pub fn verify(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let clock = Clock {
            now,
            tolerance: self.tolerance,
        };
        match &self.scheme {
            Scheme::Stripe => stripe::verify(&self.keys, headers, body, clock),
            Scheme::Standard => standard::verify(&self.keys, headers, body, clock),
            Scheme::Github => github::verify(&self.keys, headers, body),
            Scheme::Shopify => shopify::verify(&self.keys, headers, body),
            Scheme::Slack => slack::verify(&self.keys, headers, body, clock),
            Scheme::HmacSha256(rule) => generic::verify(rule, &self.keys, headers, body),
        }
    }

    /// Whether this scheme must parse the body as JSON to find the event id (stripe, slack,
    /// hmac-sha256 with a json: id locator).
    pub fn needs_json(&self) -> bool {
        match &self.scheme {
            Scheme::Stripe | Scheme::Slack => true,
            Scheme::Standard | Scheme::Github | Scheme::Shopify => false,
            Scheme::HmacSha256(rule) => matches!(rule.event_id, Locator::Json(_)),
        }
    }

    /// Finds the event id and type where the scheme puts them. `json` is the parsed body when it
    /// parsed. Values that are JSON strings are taken as is; JSON integers are rendered as decimal
    /// strings; anything else counts as absent. Header values that are not UTF-8 count as absent.
    pub fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        match &self.scheme {
            Scheme::Stripe => stripe::identify(json),
            Scheme::Standard => standard::identify(headers, json),
            Scheme::Github => github::identify(headers),
            Scheme::Shopify => shopify::identify(headers),
            Scheme::Slack => slack::identify(json),
            Scheme::HmacSha256(rule) => generic::identify(rule, headers, json),
        }
    }

    /// Lowercase names of the headers this scheme needs (signature, timestamp, id, type headers):
    /// what a capture keeps. For standard, both webhook-* and svix-* names.
    pub fn kept_headers(&self) -> Vec<String> {
        let fixed: &[&str] = match &self.scheme {
            Scheme::Stripe => stripe::KEPT_HEADERS,
            Scheme::Standard => standard::KEPT_HEADERS,
            Scheme::Github => github::KEPT_HEADERS,
            Scheme::Shopify => shopify::KEPT_HEADERS,
            Scheme::Slack => slack::KEPT_HEADERS,
            Scheme::HmacSha256(rule) => return generic::kept_headers(rule),
        };
        fixed.iter().map(|name| (*name).to_owned()).collect()
    }

    /// Signs `body` the way the provider would, with the first secret, at `timestamp` (unix
    /// seconds). Returns the headers to send in the provider's casing, including the id header
    /// where the scheme's id travels in a header and the type header where the type does (when
    /// `event_type` is `Some`). Does not add `Content-Type`.
    pub fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let key = self
            .keys
            .first()
            .expect("Verifier::new refuses an empty secrets list");
        match &self.scheme {
            Scheme::Stripe => stripe::sign(key, body, timestamp),
            Scheme::Standard => standard::sign(key, body, timestamp, event_id),
            Scheme::Github => github::sign(key, body, event_id, event_type),
            Scheme::Shopify => shopify::sign(key, body, event_id, event_type),
            Scheme::Slack => slack::sign(key, body, timestamp),
            Scheme::HmacSha256(rule) => generic::sign(rule, key, body, event_id, event_type),
        }
    }
}

/// Unix seconds now: what a delivery's signed timestamp is checked against, and what a fresh
/// signature carries.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The verification time and how far a signed timestamp may stray from it.
#[derive(Debug, Clone, Copy)]
struct Clock {
    now: i64,
    tolerance: Duration,
}

impl Clock {
    /// Judges a timestamp whose signature already matched: a replayed old delivery and one
    /// stamped in the future are refused alike.
    fn check(self, timestamp: i64) -> Result<(), SignatureError> {
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
fn parse_timestamp(raw: &str) -> Result<i64, SignatureError> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Invalid);
    }
    Ok(raw.parse::<i64>().unwrap_or(i64::MAX))
}

/// A header the check needs, as text. Absent and non-UTF-8 are the same to a verifier: there is
/// no signature it could check.
fn required_header<'h>(headers: &'h dyn Headers, name: &str) -> Result<&'h str, SignatureError> {
    let raw = headers.get(name).ok_or(SignatureError::Invalid)?;
    let text = std::str::from_utf8(raw).map_err(|_| SignatureError::Invalid)?;
    Ok(text.trim())
}

/// A header value for [`Identity`]: absent when missing or not UTF-8.
fn header_text(headers: &dyn Headers, name: &str) -> Option<String> {
    let raw = headers.get(name)?;
    std::str::from_utf8(raw).ok().map(str::to_owned)
}

/// A value found in the body for [`Identity`]. Integers are rendered because some providers send
/// numeric ids; floats, objects and the like cannot be an id.
fn json_text(json: Option<&serde_json::Value>, pointer: &str) -> Option<String> {
    match json?.pointer(pointer)? {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Number(number) if number.is_i64() || number.is_u64() => {
            Some(number.to_string())
        }
        _ => None,
    }
}

/// An HMAC-SHA256 keyed by `key` over the concatenation of `parts`, so signed content such as
/// `{t}.{body}` never has to be copied into one buffer.
fn mac_over(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// Whether any candidate tag is the MAC of `parts` under any key. Each comparison is
/// constant-time through `verify_slice`, which also refuses a tag of the wrong length, so an
/// empty or truncated signature never matches.
fn any_matches(keys: &[Vec<u8>], parts: &[&[u8]], candidates: &[Vec<u8>]) -> bool {
    if candidates.is_empty() {
        return false;
    }
    keys.iter().any(|key| {
        let mac = mac_over(key, parts);
        candidates
            .iter()
            .any(|tag| mac.clone().verify_slice(tag).is_ok())
    })
}

/// The MAC of `parts` under `key`, for signing.
fn tag_of(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    mac_over(key, parts).finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds an owned header list from literals.
    pub(super) fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    /// A verifier over the given secrets with a 300 s tolerance.
    pub(super) fn verifier(scheme: Scheme, secrets: &[&str]) -> Verifier {
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Verifier::new(scheme, &secrets, Duration::from_secs(300)).expect("valid test secrets")
    }

    #[test]
    fn header_lookup_ignores_case_and_takes_the_first_value() {
        let list = headers(&[("X-Thing", "one"), ("x-thing", "two")]);
        assert_eq!(Headers::get(&list, "x-THING"), Some(&b"one"[..]));
        assert_eq!(Headers::get(list.as_slice(), "X-Other"), None);
    }

    #[test]
    fn encoding_parses_its_names_and_lists_the_choices_otherwise() {
        assert_eq!("hex".parse::<Encoding>(), Ok(Encoding::Hex));
        assert_eq!("base64".parse::<Encoding>(), Ok(Encoding::Base64));
        let error = "base32".parse::<Encoding>().unwrap_err();
        assert!(error.contains("hex") && error.contains("base64"), "{error}");
        assert!("HEX".parse::<Encoding>().is_err());
        assert!("".parse::<Encoding>().is_err());
    }

    #[test]
    fn locator_parses_headers_and_json_pointers() {
        assert_eq!(
            "header:X-Acme-Event-Id".parse::<Locator>(),
            Ok(Locator::Header("X-Acme-Event-Id".into()))
        );
        assert_eq!(
            "json:/data/id".parse::<Locator>(),
            Ok(Locator::Json("/data/id".into()))
        );
        assert_eq!("json:".parse::<Locator>(), Ok(Locator::Json(String::new())));
        for round_trip in ["header:X-Id", "json:/a/b"] {
            let locator: Locator = round_trip.parse().expect("valid locator");
            assert_eq!(locator.to_string(), round_trip);
        }
    }

    #[test]
    fn locator_refuses_what_it_cannot_follow() {
        for bad in [
            "",
            "id",
            "header:",
            "header: X-Id",
            "header:X Id",
            "json:id",
            "json:data/id",
            "body:/id",
            "Header:X-Id",
        ] {
            let error = bad.parse::<Locator>().unwrap_err();
            assert!(!error.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn scheme_names_match_the_configuration_spelling() {
        let rule = GenericRule {
            signature_header: "X-Sig".into(),
            signature_prefix: None,
            encoding: Encoding::Hex,
            event_id: Locator::Json("/id".into()),
            event_type: None,
        };
        let names: Vec<_> = [
            Scheme::Stripe,
            Scheme::Standard,
            Scheme::Github,
            Scheme::Shopify,
            Scheme::Slack,
            Scheme::HmacSha256(rule),
        ]
        .iter()
        .map(Scheme::name)
        .collect();
        assert_eq!(
            names,
            [
                "stripe",
                "standard",
                "github",
                "shopify",
                "slack",
                "hmac-sha256"
            ]
        );
    }

    #[test]
    fn an_empty_secrets_list_is_refused() {
        let error = Verifier::new(Scheme::Github, &[], Duration::from_secs(300)).unwrap_err();
        assert!(error.contains("at least one secret"), "{error}");
    }

    #[test]
    fn an_empty_secret_is_refused() {
        let secrets = [Secret::new("fine"), Secret::new("")];
        let error = Verifier::new(Scheme::Github, &secrets, Duration::from_secs(300)).unwrap_err();
        assert!(error.contains("#2"), "{error}");
    }

    #[test]
    fn debug_shows_the_scheme_and_key_count_but_never_a_secret() {
        let verifier = verifier(Scheme::Stripe, &["whsec_very_secret_one", "another_secret"]);
        let shown = format!("{verifier:?}");
        assert_eq!(shown, r#"Verifier { scheme: "stripe", keys: 2, .. }"#);
        assert!(!shown.contains("secret_one") && !shown.contains("another"));
    }

    #[test]
    fn error_messages_are_one_plain_sentence() {
        for error in [SignatureError::Invalid, SignatureError::Stale] {
            let message = error.to_string();
            assert!(
                message.ends_with('.') && !message.contains('\n'),
                "{message}"
            );
        }
    }

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

    fn every_scheme() -> Vec<Scheme> {
        let rule = |encoding, prefix: Option<&str>| GenericRule {
            signature_header: "X-Sig".into(),
            signature_prefix: prefix.map(str::to_owned),
            encoding,
            event_id: Locator::Header("X-Id".into()),
            event_type: Some(Locator::Json("/type".into())),
        };
        vec![
            Scheme::Stripe,
            Scheme::Standard,
            Scheme::Github,
            Scheme::Shopify,
            Scheme::Slack,
            Scheme::HmacSha256(rule(Encoding::Hex, Some("sha256="))),
            Scheme::HmacSha256(rule(Encoding::Base64, None)),
        ]
    }

    /// Every header any scheme reads, all set to the same value.
    struct Everywhere<'v>(&'v [u8]);

    impl Headers for Everywhere<'_> {
        fn get(&self, _name: &str) -> Option<&[u8]> {
            Some(self.0)
        }
    }

    #[test]
    fn no_header_value_panics_or_passes_without_a_signature() {
        let long_digits = "9".repeat(400);
        let strange: Vec<Vec<u8>> = [
            &b""[..],
            b"\xff\xfe\x00",
            b"=",
            b",,,",
            b"t=,v1=",
            b"t=1,v1=\xc3\xa9",
            b"v1,",
            b"v1, v1,=",
            b"sha256=",
            b"v0=",
            "t=١٢٣,v1=é".as_bytes(),
            "sha256=éé".as_bytes(),
            long_digits.as_bytes(),
        ]
        .iter()
        .map(|value| value.to_vec())
        .chain([format!("t={long_digits},v1=00").into_bytes()])
        .collect();
        for scheme in every_scheme() {
            let name = scheme.name();
            let verifier = verifier(scheme, &["whsec_AAECAwQFBgcICQoLDA0ODw=="]);
            for value in &strange {
                for now in [0, i64::MIN, i64::MAX] {
                    let outcome = verifier.verify(&Everywhere(value), b"{}", now);
                    assert_eq!(outcome, Err(SignatureError::Invalid), "{name} {value:?}");
                }
                let _ = verifier.identify(&Everywhere(value), None);
            }
        }
    }

    #[test]
    fn every_scheme_signs_what_it_verifies_and_keeps_what_it_reads() {
        let body = br#"{"id":"evt_1","event_id":"evt_1","type":"thing.happened"}"#;
        let json: serde_json::Value = serde_json::from_slice(body).expect("test body is JSON");
        for scheme in every_scheme() {
            let name = scheme.name();
            let verifier = verifier(scheme, &["whsec_AAECAwQFBgcICQoLDA0ODw=="]);
            let signed = verifier.sign(body, 1_700_000_000, "evt_1", Some("thing.happened"));
            assert_eq!(
                verifier.verify(&signed, body, 1_700_000_100),
                Ok(()),
                "{name}"
            );
            assert_eq!(
                verifier.verify(&signed, body, 1_700_000_301),
                if matches!(name, "stripe" | "standard" | "slack") {
                    Err(SignatureError::Stale)
                } else {
                    Ok(())
                },
                "{name}"
            );
            let identity = verifier.identify(&signed, Some(&json));
            assert_eq!(identity.event_id.as_deref(), Some("evt_1"), "{name}");
            assert_eq!(
                identity.event_type.as_deref(),
                Some("thing.happened"),
                "{name}"
            );
            // A capture that keeps only these headers must still verify and identify.
            let kept = verifier.kept_headers();
            assert!(kept.iter().all(|k| *k == k.to_ascii_lowercase()), "{name}");
            let captured: Vec<(String, String)> = signed
                .iter()
                .filter(|(header, _)| kept.contains(&header.to_ascii_lowercase()))
                .cloned()
                .collect();
            assert_eq!(captured.len(), signed.len(), "{name} drops a signed header");
            assert_eq!(
                verifier.verify(&captured, body, 1_700_000_000),
                Ok(()),
                "{name}"
            );
            assert!(!signed
                .iter()
                .any(|(h, _)| h.eq_ignore_ascii_case("content-type")));
        }
    }

    #[test]
    fn non_utf8_headers_are_absent_for_identity_and_invalid_for_checks() {
        struct Raw;
        impl Headers for Raw {
            fn get(&self, _name: &str) -> Option<&[u8]> {
                Some(b"\xff\xfe")
            }
        }
        assert_eq!(header_text(&Raw, "x"), None);
        assert_eq!(required_header(&Raw, "x"), Err(SignatureError::Invalid));
    }
}
