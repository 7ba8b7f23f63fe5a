//! `hmac-sha256`: a configured HMAC-SHA256 of the raw body in one header, for providers without a
//! scheme of their own. No timestamp is signed, so replays are caught only by idempotency.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use super::mac::{any_matches, header_text, is_token_byte, json_text, required_header, tag_of};
use super::{Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError};
use crate::secret::Secret;

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

/// An `hmac-sha256` source: its rule and the keys of its secrets, used as text.
#[derive(Debug)]
pub struct HmacSha256 {
    rule: GenericRule,
    keys: Keys,
}

impl HmacSha256 {
    /// A source checked by `rule` with `secrets`.
    ///
    /// # Errors
    /// A rule that could never match, an empty list or an empty secret.
    pub fn new(rule: GenericRule, secrets: &[Secret]) -> Result<HmacSha256, ProviderError> {
        check_rule(&rule).map_err(|reason| ProviderError::at("scheme", reason))?;
        Ok(HmacSha256 {
            keys: Keys::as_text("hmac-sha256", secrets)?,
            rule,
        })
    }
}

/// The keys an `hmac-sha256` source takes beyond the common ones.
const OWN_KEYS: &[&str] = &[
    "signature_header",
    "signature_prefix",
    "encoding",
    "event_id",
    "event_type",
];

/// Builds an `hmac-sha256` source from its configured rule. Named alone (`--scheme`), it is
/// refused: its header and id location come from a source's configuration.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    if settings.table.is_none() {
        return Err(ProviderError::at(
            "scheme",
            "the hmac-sha256 scheme needs a config source (its signature header and event id location are configured)",
        ));
    }
    settings.only(OWN_KEYS)?;
    let signature_header = settings.text("signature_header")?.ok_or_else(|| {
        ProviderError::at(
            "signature_header",
            "an hmac-sha256 source must name the header that carries the signature",
        )
    })?;
    let event_id = settings.text("event_id")?.ok_or_else(|| {
        ProviderError::at(
            "event_id",
            "an hmac-sha256 source must say where the event id is (\"header:NAME\" or \"json:/pointer\")",
        )
    })?;
    let rule = GenericRule {
        signature_header: signature_header.to_owned(),
        signature_prefix: settings
            .text("signature_prefix")?
            .filter(|prefix| !prefix.is_empty())
            .map(str::to_owned),
        encoding: match settings.text("encoding")? {
            None => Encoding::Hex,
            Some(text) => text.parse().map_err(|e| ProviderError::at("encoding", e))?,
        },
        event_id: event_id
            .parse()
            .map_err(|e| ProviderError::at("event_id", e))?,
        event_type: match settings.text("event_type")? {
            None => None,
            Some(text) => Some(
                text.parse::<Locator>()
                    .map_err(|e| ProviderError::at("event_type", e))?,
            ),
        },
    };
    Ok(Arc::new(HmacSha256::new(rule, settings.secrets)?))
}

impl Provider for HmacSha256 {
    fn scheme(&self) -> &'static str {
        "hmac-sha256"
    }

    fn verify(&self, headers: &dyn Headers, body: &[u8], _now: i64) -> Result<(), SignatureError> {
        verify(&self.rule, self.keys.all(), headers, body)
    }

    fn needs_json(&self) -> bool {
        matches!(self.rule.event_id, Locator::Json(_))
    }

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        identify(&self.rule, headers, json)
    }

    fn kept_headers(&self) -> Vec<String> {
        kept_headers(&self.rule)
    }

    fn sign(
        &self,
        body: &[u8],
        _timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        sign(&self.rule, self.keys.first(), body, event_id, event_type)
    }
}

/// Refuses a rule that could never match, so the mistake shows at startup. [`Locator`]'s
/// `FromStr` already checks this, but the rule's fields are public and may be built directly.
fn check_rule(rule: &GenericRule) -> Result<(), String> {
    check_header_name(&rule.signature_header, "signature_header")?;
    for (locator, what) in [
        (Some(&rule.event_id), "event_id"),
        (rule.event_type.as_ref(), "event_type"),
    ] {
        match locator {
            Some(Locator::Header(name)) => check_header_name(name, what)?,
            Some(Locator::Json(pointer)) if !(pointer.is_empty() || pointer.starts_with('/')) => {
                return Err(format!("{what} needs a JSON pointer starting with '/'"));
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_header_name(name: &str, what: &str) -> Result<(), String> {
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(format!("{what} {name:?} is not a valid header name"));
    }
    Ok(())
}

/// Checks the configured header. With a prefix, the header must start with it. The rest may hold
/// several signatures separated by commas or whitespace, each optionally repeating the prefix
/// (`sha256=a,sha256=b` and `sha256=a,b` both work), so that a prefix which itself contains a
/// separator, like `v1,`, still works.
fn verify(
    rule: &GenericRule,
    keys: &[Vec<u8>],
    headers: &dyn Headers,
    body: &[u8],
) -> Result<(), SignatureError> {
    let header = required_header(headers, &rule.signature_header)?;
    let prefix = rule.signature_prefix.as_deref().unwrap_or("");
    let listed = header.strip_prefix(prefix).ok_or(SignatureError::Invalid)?;
    let tags: Vec<Vec<u8>> = listed
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .map(|token| token.strip_prefix(prefix).unwrap_or(token))
        .filter(|token| !token.is_empty())
        .filter_map(|token| decode(rule.encoding, token))
        .collect();
    if any_matches(keys, &[body], &tags) {
        Ok(())
    } else {
        Err(SignatureError::Invalid)
    }
}

fn decode(encoding: Encoding, text: &str) -> Option<Vec<u8>> {
    match encoding {
        Encoding::Hex => hex::decode(text).ok(),
        Encoding::Base64 => STANDARD.decode(text).ok(),
    }
}

fn encode(encoding: Encoding, tag: &[u8]) -> String {
    match encoding {
        Encoding::Hex => hex::encode(tag),
        Encoding::Base64 => STANDARD.encode(tag),
    }
}

/// Follows the configured locators.
fn identify(
    rule: &GenericRule,
    headers: &dyn Headers,
    json: Option<&serde_json::Value>,
) -> Identity {
    let locate = |locator: &Locator| match locator {
        Locator::Header(name) => header_text(headers, name),
        Locator::Json(pointer) => json_text(json, pointer),
    };
    Identity {
        event_id: locate(&rule.event_id),
        event_type: rule.event_type.as_ref().and_then(locate),
    }
}

/// The signature header and every header a locator names, lowercase and without repeats.
fn kept_headers(rule: &GenericRule) -> Vec<String> {
    let mut kept = vec![rule.signature_header.to_ascii_lowercase()];
    for locator in std::iter::once(&rule.event_id).chain(rule.event_type.as_ref()) {
        if let Locator::Header(name) = locator {
            let name = name.to_ascii_lowercase();
            if !kept.contains(&name) {
                kept.push(name);
            }
        }
    }
    kept
}

/// The headers such a provider would send, named as configured.
fn sign(
    rule: &GenericRule,
    key: &[u8],
    body: &[u8],
    event_id: &str,
    event_type: Option<&str>,
) -> Vec<(String, String)> {
    let prefix = rule.signature_prefix.as_deref().unwrap_or("");
    let mut signed = vec![(
        rule.signature_header.clone(),
        format!("{prefix}{}", encode(rule.encoding, &tag_of(key, &[body]))),
    )];
    if let Locator::Header(name) = &rule.event_id {
        signed.push((name.clone(), event_id.to_owned()));
    }
    if let (Some(Locator::Header(name)), Some(event_type)) = (&rule.event_type, event_type) {
        signed.push((name.clone(), event_type.to_owned()));
    }
    signed
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers;
    use super::super::{Encoding, GenericRule, Locator, Provider, SignatureError};
    type Verifier = std::sync::Arc<dyn Provider>;
    use crate::secret::Secret;

    const SECRET: &str = "acme-signing-secret";
    const BODY: &[u8] = br#"{"id":"ev_1","kind":"invoice.paid"}"#;
    // HMAC-SHA256(SECRET, BODY), computed independently with Python's hmac module.
    const GOOD_HEX: &str = "aedf7678a69a291a05801ceb602be4dd36f1d0d64c2d8e1a59caa475c7eb395a";

    fn rule(prefix: Option<&str>, encoding: Encoding) -> GenericRule {
        GenericRule {
            signature_header: "X-Acme-Signature".into(),
            signature_prefix: prefix.map(str::to_owned),
            encoding,
            event_id: Locator::Json("/id".into()),
            event_type: Some(Locator::Json("/kind".into())),
        }
    }

    fn generic(rule: GenericRule, secrets: &[&str]) -> Verifier {
        super::super::tests::generic(rule, secrets)
    }

    fn check(verifier: &Verifier, signature: &str, body: &[u8]) -> Result<(), SignatureError> {
        verifier.verify(&headers(&[("x-acme-signature", signature)]), body, 0)
    }

    fn good_base64() -> String {
        use base64::Engine;
        let bytes = hex::decode(GOOD_HEX).expect("constant is hex");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn a_valid_hex_or_base64_signature_passes() {
        assert_eq!(
            check(
                &generic(rule(None, Encoding::Hex), &[SECRET]),
                GOOD_HEX,
                BODY
            ),
            Ok(())
        );
        assert_eq!(
            check(
                &generic(rule(None, Encoding::Base64), &[SECRET]),
                &good_base64(),
                BODY
            ),
            Ok(())
        );
    }

    #[test]
    fn the_prefix_is_required_when_configured() {
        let verifier = generic(rule(Some("sha256="), Encoding::Hex), &[SECRET]);
        assert_eq!(
            check(&verifier, &format!("sha256={GOOD_HEX}"), BODY),
            Ok(())
        );
        assert_eq!(
            check(&verifier, GOOD_HEX, BODY),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check(&verifier, &format!("sha1={GOOD_HEX}"), BODY),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_wrong_secret_is_invalid() {
        assert_eq!(
            check(
                &generic(rule(None, Encoding::Hex), &["other"]),
                GOOD_HEX,
                BODY
            ),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_tampered_or_reserialized_body_is_invalid() {
        let verifier = generic(rule(None, Encoding::Hex), &[SECRET]);
        assert_eq!(
            check(
                &verifier,
                GOOD_HEX,
                br#"{"id":"ev_2","kind":"invoice.paid"}"#
            ),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check(
                &verifier,
                GOOD_HEX,
                br#"{"id": "ev_1", "kind": "invoice.paid"}"#
            ),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn a_missing_header_is_invalid() {
        let verifier = generic(rule(None, Encoding::Hex), &[SECRET]);
        let elsewhere = headers(&[("X-Other-Signature", GOOD_HEX)]);
        assert_eq!(
            verifier.verify(&elsewhere, BODY, 0),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn an_empty_truncated_or_undecodable_signature_never_matches() {
        let hex = generic(rule(Some("sha256="), Encoding::Hex), &[SECRET]);
        for signature in [
            "sha256=".to_owned(),
            "sha256=,".to_owned(),
            format!("sha256={}", &GOOD_HEX[..63]),
            format!("sha256={}", &GOOD_HEX[..32]),
            "sha256=not-hex".to_owned(),
        ] {
            assert_eq!(
                check(&hex, &signature, BODY),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
        let base64 = generic(rule(None, Encoding::Base64), &[SECRET]);
        let good = good_base64();
        for signature in ["", &good[..good.len() - 1], &good[..20], GOOD_HEX] {
            assert_eq!(
                check(&base64, signature, BODY),
                Err(SignatureError::Invalid),
                "{signature:?}"
            );
        }
    }

    #[test]
    fn the_second_of_several_signatures_may_be_the_right_one() {
        let wrong = "0".repeat(64);
        let verifier = generic(rule(Some("sha256="), Encoding::Hex), &[SECRET]);
        for list in [
            format!("sha256={wrong},sha256={GOOD_HEX}"),
            format!("sha256={wrong}, {GOOD_HEX}"),
            format!("sha256={wrong} sha256={GOOD_HEX}"),
        ] {
            assert_eq!(check(&verifier, &list, BODY), Ok(()), "{list:?}");
        }
    }

    #[test]
    fn a_prefix_holding_a_separator_still_works() {
        let verifier = generic(rule(Some("v1,"), Encoding::Base64), &[SECRET]);
        let good = good_base64();
        let wrong = "A".repeat(43) + "=";
        assert_eq!(check(&verifier, &format!("v1,{good}"), BODY), Ok(()));
        assert_eq!(
            check(&verifier, &format!("v1,{wrong} v1,{good}"), BODY),
            Ok(())
        );
    }

    #[test]
    fn the_second_of_two_secrets_may_be_the_right_one() {
        assert_eq!(
            check(
                &generic(rule(None, Encoding::Hex), &["old", SECRET]),
                GOOD_HEX,
                BODY
            ),
            Ok(())
        );
    }

    #[test]
    fn sign_output_verifies_with_header_locators() {
        let header_rule = GenericRule {
            signature_header: "X-Acme-Signature".into(),
            signature_prefix: Some("sha256=".into()),
            encoding: Encoding::Hex,
            event_id: Locator::Header("X-Acme-Event-Id".into()),
            event_type: Some(Locator::Header("X-Acme-Event".into())),
        };
        let verifier = generic(header_rule, &[SECRET, "next"]);
        let signed = verifier.sign(BODY, 0, "ev_1", Some("invoice.paid"));
        assert_eq!(
            signed,
            headers(&[
                ("X-Acme-Signature", &format!("sha256={GOOD_HEX}")),
                ("X-Acme-Event-Id", "ev_1"),
                ("X-Acme-Event", "invoice.paid"),
            ])
        );
        assert_eq!(verifier.verify(&signed, BODY, 0), Ok(()));
        assert_eq!(verifier.sign(BODY, 0, "ev_1", None).len(), 2);
        let identity = verifier.identify(&signed, None);
        assert_eq!(identity.event_id.as_deref(), Some("ev_1"));
        assert_eq!(identity.event_type.as_deref(), Some("invoice.paid"));
        assert!(!verifier.needs_json());
        assert_eq!(
            verifier.kept_headers(),
            ["x-acme-signature", "x-acme-event-id", "x-acme-event"]
        );
    }

    #[test]
    fn sign_output_verifies_in_base64_with_json_locators() {
        let verifier = generic(rule(None, Encoding::Base64), &[SECRET]);
        let signed = verifier.sign(BODY, 0, "ev_1", Some("invoice.paid"));
        assert_eq!(signed, headers(&[("X-Acme-Signature", &good_base64())]));
        assert_eq!(verifier.verify(&signed, BODY, 0), Ok(()));
    }

    #[test]
    fn identify_follows_json_locators() {
        let verifier = generic(rule(None, Encoding::Hex), &[SECRET]);
        let json = serde_json::json!({"id": 991, "kind": "invoice.paid"});
        let identity = verifier.identify(&headers(&[]), Some(&json));
        assert_eq!(identity.event_id.as_deref(), Some("991"));
        assert_eq!(identity.event_type.as_deref(), Some("invoice.paid"));
        assert_eq!(verifier.identify(&headers(&[]), None), Default::default());
        assert!(verifier.needs_json());
        assert_eq!(verifier.kept_headers(), ["x-acme-signature"]);
    }

    #[test]
    fn a_rule_that_could_never_match_is_refused() {
        let mut bad_header = rule(None, Encoding::Hex);
        bad_header.signature_header = "X Acme".into();
        let mut bad_pointer = rule(None, Encoding::Hex);
        bad_pointer.event_type = Some(Locator::Json("kind".into()));
        let mut bad_id_header = rule(None, Encoding::Hex);
        bad_id_header.event_id = Locator::Header(String::new());
        for bad in [bad_header, bad_pointer, bad_id_header] {
            let outcome = super::HmacSha256::new(bad, &[Secret::new(SECRET)]);
            assert!(outcome.is_err());
        }
    }
}
