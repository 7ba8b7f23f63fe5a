//! The generic HMAC scheme, for providers without a scheme of their own, in two spellings:
//! - `hmac`: the hash (`algorithm`), what is signed (`signed_content`, a template over the body,
//!   a signed unix timestamp, the event id, the registered URL and named headers) and where the
//!   timestamp comes from (`timestamp_header`, judged within `tolerance`) are configured;
//! - `hmac-sha256`: the same scheme with SHA-256 over the body alone, and none of those keys.
//!
//! Both read the signature from one configured header, hex or base64 after an optional prefix,
//! and find the id and type where the source says (a header, a JSON pointer, or for the id the
//! body's hash).

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::Hmac as HmacOf;
use sha1::Sha1;
use sha2::{Sha256, Sha512};

use super::mac::{
    any_matches_with, header_id, header_text, is_token_byte, json_text, matched, parse_timestamp,
    required_header, tag_with, Clock,
};
use super::{
    body_hash_id, Headers, Identity, Keys, Provider, ProviderError, Settings, SignatureError,
};
use crate::secret::Secret;

/// The hash an `hmac` source's MAC is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA1 (GitHub's legacy `X-Hub-Signature`, Intercom, WebSub hubs).
    Sha1,
    /// HMAC-SHA256, the default.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

impl Algorithm {
    /// Whether any candidate tag is this MAC of `parts` under any key, compared in constant time.
    fn matches(self, keys: &[Vec<u8>], parts: &[&[u8]], tags: &[Vec<u8>]) -> bool {
        match self {
            Algorithm::Sha1 => any_matches_with::<HmacOf<Sha1>>(keys, parts, tags),
            Algorithm::Sha256 => any_matches_with::<HmacOf<Sha256>>(keys, parts, tags),
            Algorithm::Sha512 => any_matches_with::<HmacOf<Sha512>>(keys, parts, tags),
        }
    }

    /// This MAC of `parts` under `key`, for signing.
    fn tag(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        match self {
            Algorithm::Sha1 => tag_with::<HmacOf<Sha1>>(key, parts),
            Algorithm::Sha256 => tag_with::<HmacOf<Sha256>>(key, parts),
            Algorithm::Sha512 => tag_with::<HmacOf<Sha512>>(key, parts),
        }
    }
}

impl FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sha1" => Ok(Algorithm::Sha1),
            "sha256" => Ok(Algorithm::Sha256),
            "sha512" => Ok(Algorithm::Sha512),
            other => Err(format!(
                "unknown algorithm {other:?}: expected one of sha1, sha256, sha512"
            )),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        })
    }
}

/// How the generic scheme writes its MAC in the signature header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hexadecimal, either case.
    Hex,
    /// Base64, standard alphabet with padding.
    Base64,
}

impl Encoding {
    fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Encoding::Hex => hex::decode(text).ok(),
            Encoding::Base64 => STANDARD.decode(text).ok(),
        }
    }

    fn encode(self, tag: &[u8]) -> String {
        match self {
            Encoding::Hex => hex::encode(tag),
            Encoding::Base64 => STANDARD.encode(tag),
        }
    }
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

/// Where the generic scheme finds a value of the delivery: a header or a place in the body.
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
            if !is_header_name(name) {
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

/// Where the event id comes from: a [`Locator`], or (`"sha256"`) the body's hash, `sha256:<hex>`,
/// for a provider that sends no id, so a redelivery of the same bytes is a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdSource {
    /// A header or a place in the body.
    At(Locator),
    /// `sha256:` and the hex SHA-256 of the raw body.
    BodyHash,
}

impl FromStr for IdSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "sha256" {
            return Ok(IdSource::BodyHash);
        }
        s.parse().map(IdSource::At).map_err(|_| {
            format!(
                "event id {s:?} must be \"header:<name>\", \"json:<pointer>\" or \"sha256\" (the \
                 body's hash, for a provider that sends no id)"
            )
        })
    }
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdSource::At(locator) => locator.fmt(f),
            IdSource::BodyHash => f.write_str("sha256"),
        }
    }
}

/// One piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text signed as written.
    Text(String),
    /// `{body}`: the raw body.
    Body,
    /// `{timestamp}`: the value of `timestamp_header`, as sent.
    Timestamp,
    /// `{id}`: the event id as the source resolves it (its id header's value, or the body's
    /// `sha256:<hex>`).
    Id,
    /// `{url}`: the source's `public_url`.
    Url,
    /// `{header:NAME}`: that header's value, as sent.
    Header(String),
}

/// What an `hmac` source signs (`signed_content`), e.g. `{timestamp}.{body}`: text and
/// placeholders, concatenated in order. `{{` and `}}` are a literal brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Piece>);

impl Template {
    /// `{body}` alone, the default.
    pub fn body() -> Template {
        Template(vec![Piece::Body])
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.0
    }

    fn has(&self, piece: &Piece) -> bool {
        self.0.contains(piece)
    }

    /// The headers `{header:NAME}` names, in order.
    fn headers(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|piece| match piece {
            Piece::Header(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// The bytes to sign, piece by piece, borrowed from `values`.
    ///
    /// # Errors
    /// A header the template names that the request lacks (or repeats): the signature cannot
    /// be checked, so it is [`SignatureError::Invalid`].
    fn render<'a>(&'a self, values: &Values<'a>) -> Result<Vec<&'a [u8]>, SignatureError> {
        self.0
            .iter()
            .map(|piece| match piece {
                Piece::Text(text) => Ok(text.as_bytes()),
                Piece::Body => Ok(values.body),
                Piece::Timestamp => values.timestamp.ok_or(SignatureError::Invalid),
                Piece::Id => values.id.ok_or(SignatureError::Invalid),
                Piece::Url => values.url.ok_or(SignatureError::Invalid),
                Piece::Header(name) => values.headers.get(name).ok_or(SignatureError::Invalid),
            })
            .collect()
    }
}

impl FromStr for Template {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(at) = rest.find(['{', '}']) {
            text.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if rest[at..].starts_with("{{") || rest[at..].starts_with("}}") {
                text.push_str(&rest[at..=at]);
                rest = &rest[at + 2..];
                continue;
            }
            if rest[at..].starts_with('}') {
                return Err(format!(
                    "a lone '}}' in {s:?}: write '}}}}' for a literal brace"
                ));
            }
            let end = after.find('}').ok_or_else(|| {
                format!("'{{' without its '}}' in {s:?}: write '{{{{' for a literal brace")
            })?;
            let name = &after[..end];
            let piece = match name {
                "body" => Piece::Body,
                "timestamp" => Piece::Timestamp,
                "id" => Piece::Id,
                "url" => Piece::Url,
                _ => match name.strip_prefix("header:") {
                    Some(header) if is_header_name(header) => Piece::Header(header.to_owned()),
                    Some(header) => {
                        return Err(format!("{{header:{header}}} does not name a valid header"))
                    }
                    None => {
                        return Err(format!(
                            "unknown placeholder {{{name}}}: expected {{body}}, {{timestamp}}, \
                             {{id}}, {{url}} or {{header:NAME}} ('{{{{' and '}}}}' are literal \
                             braces)"
                        ))
                    }
                },
            };
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(piece);
            rest = &after[end + 1..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template(pieces))
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for piece in &self.0 {
            match piece {
                Piece::Text(text) => f.write_str(&text.replace('{', "{{").replace('}', "}}"))?,
                Piece::Body => f.write_str("{body}")?,
                Piece::Timestamp => f.write_str("{timestamp}")?,
                Piece::Id => f.write_str("{id}")?,
                Piece::Url => f.write_str("{url}")?,
                Piece::Header(name) => write!(f, "{{header:{name}}}")?,
            }
        }
        Ok(())
    }
}

/// What a [`Template`]'s placeholders stand for in one request (or one signing).
struct Values<'a> {
    body: &'a [u8],
    timestamp: Option<&'a [u8]>,
    id: Option<&'a [u8]>,
    url: Option<&'a [u8]>,
    headers: &'a dyn Headers,
}

/// A generic source's rule: how it is signed and where its id and type are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericRule {
    /// The hash of the HMAC.
    pub algorithm: Algorithm,
    /// What is signed.
    pub signed_content: Template,
    /// The header carrying the signed unix timestamp (seconds), judged within the tolerance;
    /// required exactly when `signed_content` has `{timestamp}`.
    pub timestamp_header: Option<String>,
    /// The URL as registered with the provider, for `{url}`; required exactly when
    /// `signed_content` has `{url}`.
    pub public_url: Option<String>,
    /// The header carrying the signature.
    pub signature_header: String,
    /// Text the header value starts with before the MAC, e.g. `sha256=`. When set, a header that
    /// lacks it is rejected.
    pub signature_prefix: Option<String>,
    /// How the MAC is written.
    pub encoding: Encoding,
    /// Where the event id is.
    pub event_id: IdSource,
    /// Where the event type is, if the provider sends one.
    pub event_type: Option<Locator>,
}

impl GenericRule {
    /// The rule of an `hmac-sha256` source: HMAC-SHA256 of the body alone, no timestamp.
    pub fn body_sha256(
        signature_header: impl Into<String>,
        signature_prefix: Option<&str>,
        encoding: Encoding,
        event_id: IdSource,
        event_type: Option<Locator>,
    ) -> GenericRule {
        GenericRule {
            algorithm: Algorithm::Sha256,
            signed_content: Template::body(),
            timestamp_header: None,
            public_url: None,
            signature_header: signature_header.into(),
            signature_prefix: signature_prefix.map(str::to_owned),
            encoding,
            event_id,
            event_type,
        }
    }

    /// Refuses a rule that could never match, or that would sign less than it seems to, so the
    /// mistake shows at startup; the error names the key to fix. The parsers already refuse a
    /// malformed value, but the rule's fields are public and may be built directly.
    ///
    /// # Errors
    /// The key at fault and what to do about it.
    pub fn check(&self) -> Result<(), ProviderError> {
        let header = |key: &str, name: &str| {
            if is_header_name(name) {
                Ok(())
            } else {
                Err(ProviderError::at(
                    key,
                    format!("{name:?} is not a valid header name"),
                ))
            }
        };
        header("signature_header", &self.signature_header)?;
        let content = |problem: String| Err(ProviderError::at("signed_content", problem));
        if !self.signed_content.has(&Piece::Body) {
            return content(format!(
                "{:?} does not sign {{body}}: anyone could change the body of a delivery it \
                 accepts; put {{body}} where the provider signs it",
                self.signed_content.to_string()
            ));
        }
        for name in self.signed_content.headers() {
            header("signed_content", name)?;
            if name.eq_ignore_ascii_case(&self.signature_header) {
                return content(format!(
                    "{{header:{name}}} is the signature header itself, which no provider can sign"
                ));
            }
        }
        match (
            &self.timestamp_header,
            self.signed_content.has(&Piece::Timestamp),
        ) {
            (Some(name), true) => {
                header("timestamp_header", name)?;
                if name.eq_ignore_ascii_case(&self.signature_header) {
                    return Err(ProviderError::at(
                        "timestamp_header",
                        "the timestamp cannot travel in the signature header",
                    ));
                }
            }
            (None, true) => {
                return Err(ProviderError::at(
                    "timestamp_header",
                    "signed_content signs {timestamp}: name the header the provider sends its \
                     unix timestamp in (timestamp_header = \"X-...-Timestamp\")",
                ))
            }
            (Some(name), false) => {
                return Err(ProviderError::at(
                    "timestamp_header",
                    format!(
                        "{name} is not signed, so anyone could change it and its check would \
                         prove nothing: put {{timestamp}} in signed_content where the provider \
                         signs it, or leave timestamp_header out"
                    ),
                ))
            }
            (None, false) => {}
        }
        match (&self.public_url, self.signed_content.has(&Piece::Url)) {
            (Some(url), true) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(ProviderError::at(
                        "public_url",
                        "expected an http:// or https:// URL, exactly as registered with the \
                         provider",
                    ));
                }
            }
            (None, true) => {
                return Err(ProviderError::at(
                    "public_url",
                    "signed_content signs {url}: set public_url to the URL exactly as registered \
                     with the provider",
                ))
            }
            (Some(_), false) => {
                return Err(ProviderError::at(
                    "public_url",
                    "public_url is only used by {url}, which signed_content does not sign: \
                     leave it out, or put {url} where the provider signs it",
                ))
            }
            (None, false) => {}
        }
        if let IdSource::At(Locator::Json(_)) = self.event_id {
            if self.signed_content.has(&Piece::Id) {
                return content(
                    "{id} with a json: event_id would parse the body before its signature is \
                     checked; {id} takes a header:NAME or sha256 event_id (the body is signed \
                     already through {body})"
                        .to_owned(),
                );
            }
        }
        for (key, locator) in [
            ("event_id", self.event_id_locator()),
            ("event_type", self.event_type.as_ref()),
        ] {
            match locator {
                Some(Locator::Header(name))
                    if crate::redact::CREDENTIAL_HEADERS
                        .iter()
                        .any(|credential| name.eq_ignore_ascii_case(credential)) =>
                {
                    return Err(ProviderError::at(
                        key,
                        format!(
                            "{name} carries the sender's credentials: an event id or type read \
                             from it would show them in logs, answers, exports and forwarded \
                             requests; read it from another header or from the body (json:/...)"
                        ),
                    ))
                }
                Some(Locator::Header(name)) => header(key, name)?,
                Some(Locator::Json(pointer))
                    if !(pointer.is_empty() || pointer.starts_with('/')) =>
                {
                    return Err(ProviderError::at(
                        key,
                        "a JSON pointer starts with '/' (json:/id)",
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn event_id_locator(&self) -> Option<&Locator> {
        match &self.event_id {
            IdSource::At(locator) => Some(locator),
            IdSource::BodyHash => None,
        }
    }
}

/// A generic source: its rule, the keys of its secrets (used as text) and its tolerance.
#[derive(Debug)]
pub struct Hmac {
    scheme: &'static str,
    rule: GenericRule,
    keys: Keys,
    tolerance: Duration,
}

impl Hmac {
    /// An `hmac` source checked by `rule` with `secrets`, a signed timestamp within `tolerance`.
    ///
    /// # Errors
    /// A rule [`GenericRule::check`] refuses, an empty list or an empty secret.
    pub fn new(
        rule: GenericRule,
        secrets: &[Secret],
        tolerance: Duration,
    ) -> Result<Hmac, ProviderError> {
        Hmac::named("hmac", rule, secrets, tolerance)
    }

    fn named(
        scheme: &'static str,
        rule: GenericRule,
        secrets: &[Secret],
        tolerance: Duration,
    ) -> Result<Hmac, ProviderError> {
        rule.check()?;
        Ok(Hmac {
            scheme,
            keys: Keys::as_text(scheme, secrets)?,
            rule,
            tolerance,
        })
    }
}

/// The keys an `hmac-sha256` source takes beyond the common ones.
const SHA256_KEYS: &[&str] = &[
    "signature_header",
    "signature_prefix",
    "encoding",
    "event_id",
    "event_type",
];

/// The keys an `hmac` source takes beyond the common ones.
const HMAC_KEYS: &[&str] = &[
    "algorithm",
    "signed_content",
    "timestamp_header",
    "public_url",
    "signature_header",
    "signature_prefix",
    "encoding",
    "event_id",
    "event_type",
];

/// Builds an `hmac` source from its configured rule.
pub(super) fn build(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(HMAC_KEYS)?;
    let mut rule = common_rule(settings)?;
    if let Some(text) = settings.text("algorithm")? {
        rule.algorithm = text
            .parse()
            .map_err(|e| ProviderError::at("algorithm", e))?;
    }
    if let Some(text) = settings.text("signed_content")? {
        rule.signed_content = text
            .parse()
            .map_err(|e| ProviderError::at("signed_content", e))?;
    }
    rule.timestamp_header = settings.text("timestamp_header")?.map(str::to_owned);
    rule.public_url = settings.text("public_url")?.map(str::to_owned);
    Ok(Arc::new(Hmac::named(
        "hmac",
        rule,
        settings.secrets,
        settings.tolerance,
    )?))
}

/// Builds an `hmac-sha256` source: `hmac` with SHA-256 over `{body}`, none of its other keys.
pub(super) fn build_sha256(settings: &Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError> {
    settings.only(SHA256_KEYS)?;
    let rule = common_rule(settings)?;
    Ok(Arc::new(Hmac::named(
        "hmac-sha256",
        rule,
        settings.secrets,
        settings.tolerance,
    )?))
}

/// The keys both spellings take: the signature header, its prefix and encoding, the id and type.
/// Named alone (`--scheme`), the scheme is refused: these come from a source's configuration.
fn common_rule(settings: &Settings<'_>) -> Result<GenericRule, ProviderError> {
    let scheme = settings.scheme;
    if settings.table.is_none() {
        return Err(ProviderError::at(
            "scheme",
            format!(
                "the {scheme} scheme takes its signature header, encoding and event id from \
                 a config source"
            ),
        ));
    }
    let signature_header = settings.text("signature_header")?.ok_or_else(|| {
        ProviderError::at(
            "signature_header",
            format!("an {scheme} source must name the header that carries the signature"),
        )
    })?;
    let event_id = settings.text("event_id")?.ok_or_else(|| {
        ProviderError::at(
            "event_id",
            format!(
                "an {scheme} source must say where the event id is (\"header:NAME\", \
                 \"json:/pointer\", or \"sha256\" for the body's hash)"
            ),
        )
    })?;
    Ok(GenericRule::body_sha256(
        signature_header,
        settings.text("signature_prefix")?.filter(|p| !p.is_empty()),
        match settings.text("encoding")? {
            None => Encoding::Hex,
            Some(text) => text.parse().map_err(|e| ProviderError::at("encoding", e))?,
        },
        event_id
            .parse()
            .map_err(|e| ProviderError::at("event_id", e))?,
        match settings.text("event_type")? {
            None => None,
            Some(text) => Some(
                text.parse::<Locator>()
                    .map_err(|e| ProviderError::at("event_type", e))?,
            ),
        },
    ))
}

impl Provider for Hmac {
    fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// Only with a `timestamp_header`: `hmac-sha256` never has one.
    fn checks_timestamp(&self) -> bool {
        self.rule.timestamp_header.is_some()
    }

    /// The MAC first, then the timestamp, so nothing about the clock is learnt without a valid
    /// signature.
    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError> {
        let rule = &self.rule;
        let timestamp = match &rule.timestamp_header {
            Some(name) => Some(required_header(headers, name)?),
            None => None,
        };
        let stamped = timestamp.map(parse_timestamp).transpose()?;
        let id: Option<Cow<'_, [u8]>> = match &rule.event_id {
            IdSource::At(Locator::Header(name)) => headers.get(name).map(Cow::Borrowed),
            IdSource::BodyHash => Some(Cow::Owned(body_hash_id(body).into_bytes())),
            // `check` keeps `{id}` away from a JSON id: the body is not parsed before this.
            IdSource::At(Locator::Json(_)) => None,
        };
        let values = Values {
            body,
            timestamp: timestamp.map(str::as_bytes),
            id: id.as_deref(),
            url: rule.public_url.as_deref().map(str::as_bytes),
            headers,
        };
        let parts = rule.signed_content.render(&values)?;
        matched(
            rule.algorithm
                .matches(self.keys.all(), &parts, &self.candidates(headers)),
        )?;
        match stamped {
            Some(timestamp) => Clock::new(now, self.tolerance).check(timestamp),
            None => Ok(()),
        }
    }

    fn needs_json(&self) -> bool {
        matches!(self.rule.event_id, IdSource::At(Locator::Json(_)))
    }

    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity {
        let id = |locator: &Locator| match locator {
            Locator::Header(name) => header_id(headers, name),
            Locator::Json(pointer) => json_text(json, pointer),
        };
        let kind = |locator: &Locator| match locator {
            Locator::Header(name) => header_text(headers, name),
            Locator::Json(pointer) => json_text(json, pointer),
        };
        Identity {
            event_id: self.rule.event_id_locator().and_then(id),
            event_type: self.rule.event_type.as_ref().and_then(kind),
        }
    }

    fn identify_body(
        &self,
        headers: &dyn Headers,
        body: &[u8],
        json: Option<&serde_json::Value>,
    ) -> Identity {
        let identity = self.identify(headers, json);
        match self.rule.event_id {
            IdSource::BodyHash => Identity {
                event_id: Some(body_hash_id(body)),
                ..identity
            },
            IdSource::At(_) => identity,
        }
    }

    fn id_in_body(&self) -> bool {
        !matches!(self.rule.event_id, IdSource::At(Locator::Header(_)))
    }

    /// A signature (or another header the check reads) in `Authorization` or a cookie, which
    /// hookbox never keeps: its captures cannot be replayed `--as-is`.
    fn setup_warning(&self) -> Option<&'static str> {
        self.kept_headers()
            .iter()
            .any(|name| crate::redact::CREDENTIAL_HEADERS.contains(&name.as_str()))
            .then_some(
                "this source's signature travels in Authorization (or a cookie), which hookbox \
                 never keeps with an event: its captures cannot be replayed --as-is (they fail \
                 verification); a default replay, which signs each delivery again, works",
            )
    }

    /// Every header the check or the identity reads, lowercase and without repeats.
    fn kept_headers(&self) -> Vec<String> {
        let rule = &self.rule;
        let located = [rule.event_id_locator(), rule.event_type.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|locator| match locator {
                Locator::Header(name) => Some(name.as_str()),
                Locator::Json(_) => None,
            });
        let mut kept: Vec<String> = Vec::new();
        for name in std::iter::once(rule.signature_header.as_str())
            .chain(rule.timestamp_header.as_deref())
            .chain(rule.signed_content.headers())
            .chain(located)
        {
            let name = name.to_ascii_lowercase();
            if !kept.contains(&name) {
                kept.push(name);
            }
        }
        kept
    }

    /// The headers such a provider would send, named as configured: the signature, then the
    /// timestamp, id and type headers, then any other header the template signs. hookbox cannot
    /// know what a provider puts in a header of its own, so such a header is sent empty (and
    /// signed so).
    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)> {
        let rule = &self.rule;
        let mut sent: Vec<(String, String)> = Vec::new();
        let mut add = |name: &str, value: &str| {
            if !sent
                .iter()
                .any(|(known, _)| known.eq_ignore_ascii_case(name))
            {
                sent.push((name.to_owned(), value.to_owned()));
            }
        };
        let stamp = timestamp.to_string();
        if let Some(name) = &rule.timestamp_header {
            add(name, &stamp);
        }
        if let IdSource::At(Locator::Header(name)) = &rule.event_id {
            add(name, event_id);
        }
        if let Some(Locator::Header(name)) = &rule.event_type {
            match event_type {
                Some(kind) => add(name, kind),
                None if rule
                    .signed_content
                    .headers()
                    .any(|h| h.eq_ignore_ascii_case(name)) =>
                {
                    add(name, "");
                }
                None => {}
            }
        }
        for name in rule.signed_content.headers() {
            add(name, "");
        }
        let values = Values {
            body,
            timestamp: Some(stamp.as_bytes()),
            id: Some(event_id.as_bytes()),
            url: rule.public_url.as_deref().map(str::as_bytes),
            headers: &sent,
        };
        let tag = rule
            .signed_content
            .render(&values)
            .map(|parts| rule.algorithm.tag(self.keys.first(), &parts))
            .expect("every header the template names is among those sent");
        let prefix = rule.signature_prefix.as_deref().unwrap_or("");
        let signature = format!("{prefix}{}", rule.encoding.encode(&tag));
        sent.insert(0, (rule.signature_header.clone(), signature));
        sent
    }
}

impl Hmac {
    /// Every signature the header carries. With a prefix, each line must start with it; the
    /// rest may hold several signatures separated by commas or whitespace, each optionally
    /// repeating the prefix (`sha256=a,sha256=b` and `sha256=a,b` both work, and so does a prefix
    /// that itself holds a separator, like `v1,`). The header may also be repeated, one line per
    /// signature, as some providers do while a secret is rotated: every line counts. A value
    /// that does not decode can only fail to match.
    fn candidates(&self, headers: &dyn Headers) -> Vec<Vec<u8>> {
        let rule = &self.rule;
        let prefix = rule.signature_prefix.as_deref().unwrap_or("");
        headers
            .all(&rule.signature_header)
            .into_iter()
            .filter_map(|line| std::str::from_utf8(line).ok())
            .filter_map(|line| line.trim().strip_prefix(prefix))
            .flat_map(|listed| {
                // The line's own prefix is gone; a token after it may repeat the prefix, but
                // the first may not carry it twice (`sha256=sha256=...`).
                listed
                    .split(|c: char| c == ',' || c.is_ascii_whitespace())
                    .enumerate()
                    .map(|(n, token)| match n {
                        0 => token,
                        _ => token.strip_prefix(prefix).unwrap_or(token),
                    })
            })
            .filter(|token| !token.is_empty())
            .filter_map(|token| rule.encoding.decode(token))
            .collect()
    }
}

/// RFC 9110's `token`: what a header name may be made of. Checked at configuration time so that
/// a typo like `header: X-Id` fails the start instead of never matching.
fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_token_byte)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::headers;
    use super::super::{Provider, ProviderError, SignatureError};
    use super::{Algorithm, Encoding, GenericRule, Hmac, IdSource, Locator, Piece, Template};
    use crate::secret::Secret;

    type Verifier = std::sync::Arc<dyn Provider>;

    const SECRET: &str = "acme-signing-secret";
    const BODY: &[u8] = br#"{"id":"ev_1","kind":"invoice.paid"}"#;
    // Each computed independently with Python's hmac module over SECRET and BODY.
    const GOOD_HEX: &str = "aedf7678a69a291a05801ceb602be4dd36f1d0d64c2d8e1a59caa475c7eb395a";
    const SHA1_HEX: &str = "9dc5c077e7c86dce9879f8855cc03e2c1ddd4685";
    const SHA512_BASE64: &str =
        "ClwNUmWHRD1cyLv5S80J+R/kZHZ8KV2Gh5lKjmrSz7NlDy1xevWG1P/u83d540gOxSXvl7+jECdsxAvRWiV7Kw==";
    /// Of `1700000000.` and BODY.
    const STAMPED_HEX: &str = "30c1673e6407a07c2069633d6693b3f2b106bcd31e03a35784e08901a76a0778";
    /// Base64 HMAC-SHA1 of BODY followed by the URL, as Trello signs.
    const TRELLO_BASE64: &str = "hrVvarRBatZQI4TddPxABOVyfrg=";
    /// Of `ev_1:n-42:` and BODY.
    const HEADERS_HEX: &str = "2d9839fd0d8d638b146929098f6b3500e1b701ad87c88edd0bc75d08ba11d3a9";
    const NOW: i64 = 1_700_000_000;

    fn rule(prefix: Option<&str>, encoding: Encoding) -> GenericRule {
        GenericRule::body_sha256(
            "X-Acme-Signature",
            prefix,
            encoding,
            IdSource::At(Locator::Json("/id".into())),
            Some(Locator::Json("/kind".into())),
        )
    }

    fn stamped() -> GenericRule {
        GenericRule {
            signed_content: "{timestamp}.{body}".parse().expect("valid"),
            timestamp_header: Some("X-Acme-Timestamp".into()),
            event_id: IdSource::At(Locator::Header("X-Acme-Id".into())),
            ..rule(None, Encoding::Hex)
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

    fn refused(rule: GenericRule) -> ProviderError {
        Hmac::new(rule, &[Secret::new(SECRET)], Duration::from_secs(300))
            .expect_err("a rule that is refused")
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
    fn sha1_and_sha512_sign_with_their_own_hash_and_refuse_another() {
        let sha1 = GenericRule {
            algorithm: Algorithm::Sha1,
            ..rule(Some("sha1="), Encoding::Hex)
        };
        let sha1 = generic(sha1, &[SECRET]);
        assert_eq!(check(&sha1, &format!("sha1={SHA1_HEX}"), BODY), Ok(()));
        assert_eq!(
            check(&sha1, &format!("sha1={GOOD_HEX}"), BODY),
            Err(SignatureError::Invalid)
        );
        let sha512 = GenericRule {
            algorithm: Algorithm::Sha512,
            ..rule(None, Encoding::Base64)
        };
        let sha512 = generic(sha512, &[SECRET]);
        assert_eq!(check(&sha512, SHA512_BASE64, BODY), Ok(()));
        assert_eq!(
            check(&sha512, &good_base64(), BODY),
            Err(SignatureError::Invalid)
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
        // Said once per signature: a doubled prefix is no signature, however good the rest.
        assert_eq!(
            check(&verifier, &format!("sha256=sha256={GOOD_HEX}"), BODY),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check(&verifier, &format!("sha256=00,sha256={GOOD_HEX}"), BODY),
            Ok(())
        );
    }

    #[test]
    fn a_wrong_secret_a_tampered_body_or_a_missing_header_is_invalid() {
        let other = generic(rule(None, Encoding::Hex), &["other"]);
        assert_eq!(check(&other, GOOD_HEX, BODY), Err(SignatureError::Invalid));
        let verifier = generic(rule(None, Encoding::Hex), &[SECRET]);
        for body in [
            &br#"{"id":"ev_2","kind":"invoice.paid"}"#[..],
            br#"{"id": "ev_1", "kind": "invoice.paid"}"#,
        ] {
            assert_eq!(
                check(&verifier, GOOD_HEX, body),
                Err(SignatureError::Invalid)
            );
        }
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
    fn any_of_several_signatures_in_one_line_or_in_repeated_lines_may_match() {
        let wrong = "0".repeat(64);
        let verifier = generic(rule(Some("sha256="), Encoding::Hex), &[SECRET]);
        for list in [
            format!("sha256={wrong},sha256={GOOD_HEX}"),
            format!("sha256={wrong}, {GOOD_HEX}"),
            format!("sha256={wrong} sha256={GOOD_HEX}"),
        ] {
            assert_eq!(check(&verifier, &list, BODY), Ok(()), "{list:?}");
        }
        let lines = headers(&[
            ("X-Acme-Signature", &format!("sha256={wrong}")),
            ("X-Acme-Signature", &format!("sha256={GOOD_HEX}")),
        ]);
        assert_eq!(verifier.verify(&lines, BODY, 0), Ok(()));
        let unprefixed = headers(&[
            ("X-Acme-Signature", &format!("sha256={wrong}")),
            ("X-Acme-Signature", GOOD_HEX),
        ]);
        assert_eq!(
            verifier.verify(&unprefixed, BODY, 0),
            Err(SignatureError::Invalid)
        );
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

    fn stamped_request(timestamp: &str, signature: &str) -> Vec<(String, String)> {
        headers(&[
            ("X-Acme-Timestamp", timestamp),
            ("X-Acme-Signature", signature),
            ("X-Acme-Id", "ev_1"),
        ])
    }

    #[test]
    fn a_signed_timestamp_is_judged_within_the_tolerance_both_ways_after_the_mac() {
        let verifier = generic(stamped(), &[SECRET]);
        let sent = stamped_request("1700000000", STAMPED_HEX);
        assert_eq!(verifier.verify(&sent, BODY, NOW + 300), Ok(()));
        assert_eq!(verifier.verify(&sent, BODY, NOW - 300), Ok(()));
        assert_eq!(
            verifier.verify(&sent, BODY, NOW + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verifier.verify(&sent, BODY, NOW - 301),
            Err(SignatureError::Stale)
        );
        // A fresh timestamp on an old signature, or a wrong MAC whatever the time: invalid.
        let restamped = stamped_request("1700000100", STAMPED_HEX);
        assert_eq!(
            verifier.verify(&restamped, BODY, NOW),
            Err(SignatureError::Invalid)
        );
        let wrong = stamped_request("1700000000", GOOD_HEX);
        assert_eq!(
            verifier.verify(&wrong, BODY, NOW + 10_000),
            Err(SignatureError::Invalid)
        );
        for malformed in ["", "+1700000000", "1700000000.0", "soon"] {
            let sent = stamped_request(malformed, STAMPED_HEX);
            assert_eq!(
                verifier.verify(&sent, BODY, NOW),
                Err(SignatureError::Invalid),
                "{malformed:?}"
            );
        }
        let unstamped = headers(&[("X-Acme-Signature", STAMPED_HEX)]);
        assert_eq!(
            verifier.verify(&unstamped, BODY, NOW),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn the_url_the_id_and_named_headers_are_signed_and_a_missing_one_is_invalid() {
        let trello = GenericRule {
            algorithm: Algorithm::Sha1,
            signed_content: "{body}{url}".parse().expect("valid"),
            public_url: Some("https://hooks.example.com/webhooks/trello".into()),
            ..rule(None, Encoding::Base64)
        };
        let trello = generic(trello, &[SECRET]);
        assert_eq!(check(&trello, TRELLO_BASE64, BODY), Ok(()));

        let named = GenericRule {
            signed_content: "{id}:{header:X-Nonce}:{body}".parse().expect("valid"),
            event_id: IdSource::At(Locator::Header("X-Acme-Id".into())),
            ..rule(None, Encoding::Hex)
        };
        let named = generic(named, &[SECRET]);
        let sent = headers(&[
            ("X-Acme-Signature", HEADERS_HEX),
            ("X-Acme-Id", "ev_1"),
            ("X-Nonce", "n-42"),
        ]);
        assert_eq!(named.verify(&sent, BODY, 0), Ok(()));
        for (name, value) in [("X-Acme-Id", "ev_2"), ("X-Nonce", "n-43")] {
            let mut changed = sent.clone();
            changed.retain(|(header, _)| header != name);
            assert_eq!(
                named.verify(&changed, BODY, 0),
                Err(SignatureError::Invalid),
                "without {name}"
            );
            changed.push((name.to_owned(), value.to_owned()));
            assert_eq!(
                named.verify(&changed, BODY, 0),
                Err(SignatureError::Invalid),
                "{name}: {value}"
            );
        }
    }

    #[test]
    fn the_body_hash_is_the_id_and_may_be_signed() {
        let hashed = GenericRule {
            signed_content: "{id}.{body}".parse().expect("valid"),
            event_id: IdSource::BodyHash,
            ..rule(None, Encoding::Hex)
        };
        let verifier = generic(hashed, &[SECRET, "next"]);
        let signed = verifier.sign(BODY, NOW, "ignored: the id is the body's", None);
        // The id `send` hands over is the one the scheme finds, so sign with it.
        let id = super::body_hash_id(BODY);
        let signed_with_id = verifier.sign(BODY, NOW, &id, Some("invoice.paid"));
        assert_ne!(signed, signed_with_id);
        assert_eq!(verifier.verify(&signed_with_id, BODY, 0), Ok(()));
        let identity = verifier.identify_body(&signed_with_id, BODY, None);
        assert_eq!(identity.event_id, Some(id));
        assert!(verifier.id_in_body() && !verifier.needs_json());
    }

    #[test]
    fn sign_output_verifies_and_keeps_every_header_it_reads() {
        let rich = GenericRule {
            algorithm: Algorithm::Sha512,
            signed_content: "{timestamp}:{id}:{header:X-Acme-Event}:{header:X-Nonce}:{body}"
                .parse()
                .expect("valid"),
            timestamp_header: Some("X-Acme-Timestamp".into()),
            event_id: IdSource::At(Locator::Header("X-Acme-Id".into())),
            event_type: Some(Locator::Header("X-Acme-Event".into())),
            ..rule(Some("v1="), Encoding::Base64)
        };
        let verifier = generic(rich, &[SECRET, "next"]);
        let signed = verifier.sign(BODY, NOW, "ev_1", Some("invoice.paid"));
        let names: Vec<&str> = signed.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "X-Acme-Signature",
                "X-Acme-Timestamp",
                "X-Acme-Id",
                "X-Acme-Event",
                "X-Nonce"
            ]
        );
        assert!(signed[0].1.starts_with("v1="));
        assert_eq!(verifier.verify(&signed, BODY, NOW), Ok(()));
        assert_eq!(
            verifier.kept_headers(),
            [
                "x-acme-signature",
                "x-acme-timestamp",
                "x-acme-event",
                "x-nonce",
                "x-acme-id"
            ]
        );
        let identity = verifier.identify(&signed, None);
        assert_eq!(identity.event_id.as_deref(), Some("ev_1"));
        assert_eq!(identity.event_type.as_deref(), Some("invoice.paid"));
        // Without a type, the signed type header still goes out (empty) and still verifies.
        let untyped = verifier.sign(BODY, NOW, "ev_1", None);
        assert_eq!(verifier.verify(&untyped, BODY, NOW), Ok(()));
    }

    #[test]
    fn sign_output_of_the_sha256_spelling_is_what_it_always_was() {
        let header_rule = GenericRule::body_sha256(
            "X-Acme-Signature",
            Some("sha256="),
            Encoding::Hex,
            IdSource::At(Locator::Header("X-Acme-Event-Id".into())),
            Some(Locator::Header("X-Acme-Event".into())),
        );
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
        assert_eq!(verifier.sign(BODY, 0, "ev_1", None).len(), 2);
        let json = generic(rule(None, Encoding::Base64), &[SECRET]);
        let signed = json.sign(BODY, 0, "ev_1", Some("invoice.paid"));
        assert_eq!(signed, headers(&[("X-Acme-Signature", &good_base64())]));
        let identity = json.identify(
            &headers(&[]),
            Some(&serde_json::json!({"id": 991, "kind": "x"})),
        );
        assert_eq!(identity.event_id.as_deref(), Some("991"));
        assert!(json.needs_json());
        assert_eq!(json.kept_headers(), ["x-acme-signature"]);
    }

    #[test]
    fn a_signature_in_authorization_is_warned_of_at_startup() {
        let in_authorization = GenericRule::body_sha256(
            "Authorization",
            Some("HMAC "),
            Encoding::Hex,
            IdSource::At(Locator::Header("X-Acme-Event-Id".into())),
            None,
        );
        let warning = generic(in_authorization, &[SECRET])
            .setup_warning()
            .expect("warned");
        assert!(warning.contains("--as-is"), "{warning}");
        assert_eq!(
            generic(rule(None, Encoding::Hex), &[SECRET]).setup_warning(),
            None
        );
    }

    #[test]
    fn templates_parse_print_back_and_refuse_what_they_cannot_mean() {
        let template: Template = "v0:{timestamp}:{{{body}}}{header:X-Id}"
            .parse()
            .expect("valid");
        assert_eq!(
            template.pieces(),
            [
                Piece::Text("v0:".into()),
                Piece::Timestamp,
                Piece::Text(":{".into()),
                Piece::Body,
                Piece::Text("}".into()),
                Piece::Header("X-Id".into()),
            ]
        );
        assert_eq!(
            template.to_string(),
            "v0:{timestamp}:{{{body}}}{header:X-Id}"
        );
        assert_eq!("{body}".parse::<Template>(), Ok(Template::body()));
        for (bad, says) in [
            ("{bdy}", "unknown placeholder {bdy}"),
            ("{body", "without its '}'"),
            ("{body}}", "a lone '}'"),
            ("{header:}", "{header:} does not name a valid header"),
            ("{header:X Id}", "does not name a valid header"),
            ("{Body}", "unknown placeholder"),
        ] {
            let error = bad.parse::<Template>().expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
        assert_eq!("sha512".parse::<Algorithm>(), Ok(Algorithm::Sha512));
        let error = "md5".parse::<Algorithm>().expect_err("refused");
        assert!(error.contains("sha1, sha256, sha512"), "{error}");
        assert_eq!("sha256".parse::<IdSource>(), Ok(IdSource::BodyHash));
        assert!("sha1".parse::<IdSource>().is_err());
        assert_eq!(IdSource::BodyHash.to_string(), "sha256");
    }

    #[test]
    fn a_rule_that_could_never_match_or_signs_too_little_is_refused_naming_the_key() {
        let with = |content: &str| GenericRule {
            signed_content: content.parse().expect("valid template"),
            ..rule(None, Encoding::Hex)
        };
        let cases = [
            (
                GenericRule {
                    signature_header: "X Acme".into(),
                    ..rule(None, Encoding::Hex)
                },
                "signature_header",
            ),
            (
                GenericRule {
                    event_type: Some(Locator::Json("kind".into())),
                    ..rule(None, Encoding::Hex)
                },
                "event_type",
            ),
            (
                GenericRule {
                    event_id: IdSource::At(Locator::Header(String::new())),
                    ..rule(None, Encoding::Hex)
                },
                "event_id",
            ),
            (with("{timestamp}.{body}"), "timestamp_header"),
            (
                GenericRule {
                    timestamp_header: Some("X-Acme-Timestamp".into()),
                    ..rule(None, Encoding::Hex)
                },
                "timestamp_header",
            ),
            (with("{url}{body}"), "public_url"),
            (
                GenericRule {
                    public_url: Some("https://example.com/hook".into()),
                    ..rule(None, Encoding::Hex)
                },
                "public_url",
            ),
            (
                GenericRule {
                    public_url: Some("example.com/hook".into()),
                    ..with("{url}{body}")
                },
                "public_url",
            ),
            (with("{timestamp}"), "signed_content"),
            (with("{id}.{body}"), "signed_content"),
            (with("{header:x-acme-signature}{body}"), "signed_content"),
        ];
        for (bad, key) in cases {
            let shown = format!("{bad:?}");
            let error = refused(bad);
            assert_eq!(error.key, key, "{shown}: {error}");
        }
    }
}
