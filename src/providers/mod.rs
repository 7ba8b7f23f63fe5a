//! Everything hookbox knows about each provider, one file per provider behind [`Provider`].
//!
//! A provider's file holds how its deliveries are verified, where their id and type live, which
//! headers are kept, how `send` and `replay` sign as it would, the fingerprint's volatile fields,
//! its redelivery horizon and the handshakes it expects answered without storing. The rest of
//! hookbox reaches it only through the trait; nothing outside this folder matches on a scheme.
//!
//! Adding a provider: a file with a type that implements [`Provider`] and a [`Constructor`]
//! that builds it from a source's [`Settings`], and one line in [`Registry::builtin`] (or, for a
//! provider of one's own, [`Registry::with`] and [`Config::parse_with`](crate::Config::parse_with)).

mod adyen;
mod bitbucket;
mod braintree;
pub mod certs;
mod checkout;
mod discord;
mod ed25519;
mod family;
pub mod generic;
mod github;
mod gitlab;
mod gocardless;
mod keys;
mod lemonsqueezy;
mod linear;
pub mod mac;
mod meta;
mod mollie;
mod paddle;
mod paypal;
mod razorpay;
mod sendgrid;
mod shopify;
mod slack;
mod sns;
mod square;
pub mod standard;
mod stripe;
mod twilio;
mod twitch;
mod zoom;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use crate::secret::Secret;

pub use generic::{Algorithm, Encoding, GenericRule, IdSource, Locator, Template};
pub use keys::Keys;
pub use standard::Standard;

/// Read access to request headers, case-insensitive by name. The crate implements it for actix's
/// `HeaderMap`.
pub trait Headers {
    /// The first value of header `name` (any case), as raw bytes.
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// Every value of header `name` (any case), one per header line, in order: for the few
    /// providers that repeat a header on purpose (Mollie, one signature per secret while one is
    /// rotated). By default the one value [`get`](Headers::get) finds.
    fn all(&self, name: &str) -> Vec<&[u8]> {
        self.get(name).into_iter().collect()
    }
}

/// A plain list of `(name, value)` pairs, as a capture or a test holds them.
impl Headers for [(String, String)] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_bytes())
    }

    fn all(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_bytes())
            .collect()
    }
}

/// Lets a `&Vec<(String, String)>` stand in as `&dyn Headers`, which a slice cannot.
impl Headers for Vec<(String, String)> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        Headers::get(self.as_slice(), name)
    }

    fn all(&self, name: &str) -> Vec<&[u8]> {
        Headers::all(self.as_slice(), name)
    }
}

/// Why a delivery's signature was refused. Deliberately coarse: telling a caller which part of
/// the check failed would help a forger, and the messages never carry a header value, a computed
/// signature or a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing or malformed, or no signature matched any secret.
    #[error("The request signature is missing, unreadable or does not match.")]
    Invalid,
    /// A signature matched, but its timestamp is too far in the past or the future.
    #[error("The request signature's timestamp is outside the allowed tolerance.")]
    Stale,
    /// The signature matched, but credentials the source also requires (Adyen's HTTP Basic)
    /// are missing or do not match: what they are, for the log. Answered as [`Self::Invalid`]
    /// is; only the log line tells the two apart, so that an operator who mistyped the
    /// credentials does not chase the signing key.
    #[error("The request's credentials are missing or do not match.")]
    Credentials(&'static str),
    /// The certificate that would check the signature is not one to trust (PayPal's, SNS's):
    /// its URL under none of the source's `cert_urls`, its key not RSA, or now outside its
    /// validity period. Answered as [`Self::Invalid`] is; the log line says which, so that an
    /// operator whose every PayPal delivery is refused learns why.
    #[error("The request's signing certificate is not one to trust.")]
    Untrusted(&'static str),
}

impl SignatureError {
    /// The error as the answer reads it: [`Self::Credentials`] and [`Self::Untrusted`] are
    /// answered as [`Self::Invalid`] (tables of refusals compare so).
    #[cfg(test)]
    pub fn as_answered(self) -> SignatureError {
        match self {
            SignatureError::Credentials(_) | SignatureError::Untrusted(_) => {
                SignatureError::Invalid
            }
            other => other,
        }
    }
}

/// What a delivery says about itself: its id and type, found where the provider puts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The provider's event id, the key of idempotency.
    pub event_id: Option<String>,
    /// The provider's event type, e.g. `charge.succeeded`.
    pub event_type: Option<String>,
}

/// One request to `/webhooks/{source}`, as a provider sees it.
pub struct Inbound<'a> {
    /// The HTTP method (a handshake may come as a `GET`).
    pub method: &'a str,
    /// The query string, without the `?` (empty when there is none).
    pub query: &'a str,
    /// The request headers.
    pub headers: &'a dyn Headers,
    /// The raw body bytes, as received.
    pub body: &'a [u8],
    /// Unix seconds now, what signed timestamps are judged against.
    pub now: i64,
}

/// An event a delivery carries, verified and identified.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// The provider's event id (or one derived from the body where it sends none).
    pub event_id: String,
    /// The provider's event type, where it says.
    pub event_type: Option<String>,
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<serde_json::Value>,
}

/// An answer a provider expects to a request hookbox does not store (a handshake).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its body.
    pub body: Vec<u8>,
}

/// A delivery signed as the provider would send it (see [`Provider::sign_delivery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The body to send: the one given, unless the provider signs inside the body.
    pub body: Vec<u8>,
    /// A query string (without `?`) the provider puts on the URL, when it signs one.
    pub query: Option<String>,
    /// The headers, as [`Provider::sign`] makes them.
    pub headers: Vec<(String, String)>,
    /// The `Content-Type` the provider sends this body with, when it is not JSON's.
    pub content_type: Option<&'static str>,
}

/// One event of a delivery that carries several (a batch: Adyen's notification items,
/// GoCardless's `events`), with its own payload: the item's JSON, as stored and exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The item's event id.
    pub event_id: String,
    /// The item's event type, where it says.
    pub event_type: Option<String>,
    /// The item's JSON, byte for byte as it stood in the body.
    pub payload: Vec<u8>,
    /// The item parsed.
    pub json: serde_json::Value,
}

/// What a verified request turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    /// An event to claim and store.
    Event(Incoming),
    /// Several events in one delivery, in the delivery's order, every one verified: claimed
    /// together, in one transaction, each with its own id, type, payload and fingerprint.
    Batch(Vec<Item>),
    /// A handshake, answered as it says and never stored.
    Handshake(Answer),
    /// A handshake answered only after one GET of a URL it names (SNS's `SubscribeURL`,
    /// which confirms a subscription), never stored.
    Confirm(Confirmation),
}

/// What confirming a handshake takes: one GET of `url`, which the source's allowlist has
/// admitted, then `answer`. A GET that fails is 503 `unavailable`, so the provider sends the
/// handshake again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    /// The URL to GET, once, normalised.
    pub url: certs::CertUrl,
    /// The answer once the GET has succeeded.
    pub answer: Answer,
}

/// Why a request was refused before anything was claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The signature check failed (see [`SignatureError`]).
    Signature(SignatureError),
    /// The body is not the JSON the provider needs to find the event.
    MalformedPayload,
    /// The delivery names no event id.
    MissingEventId,
    /// Something the check needs (a key or certificate fetched from the provider) could not be
    /// had just now; the provider should retry.
    Unavailable,
    /// A handshake refused (Meta's verification request: another `hub.mode`, no challenge, or
    /// a token that does not match): 403, nothing echoed. The sentence says which, and never
    /// depends on the token when something else is wrong too.
    Forbidden(&'static str),
    /// A request that is not what the provider sends, said in a sentence: a handshake's
    /// parameters (Braintree's `bt_challenge`), or a signed body that is no event of the
    /// provider's (Braintree's `bt_payload` that is no notification). 400 `malformed_payload`.
    Malformed(&'static str),
}

impl From<SignatureError> for Refusal {
    fn from(error: SignatureError) -> Self {
        Refusal::Signature(error)
    }
}

/// One provider's rules, with one source's keys. Built once per source at startup (see
/// [`Scheme::build`]) and shared by every request to it, so it must be cheap to call and never
/// show a key in `Debug`.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The scheme's name, as configuration spells it.
    fn scheme(&self) -> &'static str;

    /// Checks the signature over the raw body. `now` is unix seconds (injectable for vectors).
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] when a needed header is missing or malformed or no signature
    /// matches any secret; [`SignatureError::Stale`] when one matches but its signed timestamp is
    /// more than the tolerance away from `now`. The MAC is checked first, so an attacker cannot
    /// learn anything about the clock without a valid signature.
    fn verify(&self, headers: &dyn Headers, body: &[u8], now: i64) -> Result<(), SignatureError>;

    /// Whether the body must parse as JSON for the event to be found (its id is in the body).
    fn needs_json(&self) -> bool;

    /// Whether [`verify`](Provider::verify) judges a signed timestamp against the source's
    /// tolerance, as the source is configured (`hmac` only with a `timestamp_header`). A source
    /// that sets `tolerance` for a provider that checks no timestamp is a config error naming
    /// the key, as any key a scheme does not use is. By default it does, so that a provider of
    /// one's own keeps taking `tolerance`; a built-in provider that signs no time says so.
    fn checks_timestamp(&self) -> bool {
        true
    }

    /// Finds the event id and type where the provider puts them. `json` is the parsed body when
    /// it parsed. Values that are JSON strings are taken as is; JSON integers are rendered as
    /// decimal strings; anything else counts as absent. Header values that are not UTF-8 count
    /// as absent.
    fn identify(&self, headers: &dyn Headers, json: Option<&serde_json::Value>) -> Identity;

    /// Lowercase names of the headers this provider needs (signature, timestamp, id, type
    /// headers): what is kept with an event and what a capture keeps.
    fn kept_headers(&self) -> Vec<String>;

    /// Signs `body` the way the provider would, with the first key, at `timestamp` (unix
    /// seconds). Returns the headers to send in the provider's casing, including the id header
    /// where the id travels in a header and the type header where the type does (when
    /// `event_type` is `Some`). Does not add `Content-Type`.
    fn sign(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Vec<(String, String)>;

    /// Finds the event id and type with the raw body at hand too, for a provider that derives
    /// the id from the body or reads a form; by default [`identify`](Provider::identify).
    fn identify_body(
        &self,
        headers: &dyn Headers,
        _body: &[u8],
        json: Option<&serde_json::Value>,
    ) -> Identity {
        self.identify(headers, json)
    }

    /// Whether the event id comes from the body whatever a header says (so `send --event-id`
    /// does not apply); by default where the body must be JSON.
    fn id_in_body(&self) -> bool {
        self.needs_json()
    }

    /// Whether the provider sends a handshake as a `GET` to the webhook URL, answered by
    /// [`receive`](Provider::receive). A `GET` to a source whose provider does not is answered
    /// as any method the route does not take.
    fn answers_get(&self) -> bool {
        false
    }

    /// Signs a delivery the way the provider would send it: by default the body as given with
    /// the headers of [`sign`](Provider::sign). A provider that signs inside the body (a form
    /// field) or signs a query it puts on the URL overrides this.
    fn sign_delivery(
        &self,
        body: &[u8],
        timestamp: i64,
        event_id: &str,
        event_type: Option<&str>,
    ) -> Signed {
        Signed {
            body: body.to_vec(),
            query: None,
            headers: self.sign(body, timestamp, event_id, event_type),
            content_type: None,
        }
    }

    /// A verified request that is a handshake, with the answer it expects; `None` for an event.
    /// A handshake that lacks what its answer needs (a challenge) is refused with
    /// [`Refusal::Malformed`]: it is never stored as an event either.
    fn handshake(
        &self,
        _inbound: &Inbound<'_>,
        _json: Option<&serde_json::Value>,
    ) -> Option<Result<Answer, Refusal>> {
        None
    }

    /// How many public keys the source checks signatures against (its `public_keys`), for the
    /// startup line beside its secrets; 0 for a scheme of shared secrets.
    fn public_key_count(&self) -> usize {
        0
    }

    /// Built to sign, re-signing a captured delivery: renames what [`sign`](Provider::sign)
    /// made in `signed` to the header names the capture arrived with, where the scheme has
    /// more than one spelling (Standard Webhooks' `svix-*` beside `webhook-*`). A receiver
    /// that reads the names its sender uses gets them back. By default nothing.
    fn respell(&self, _captured: &dyn Headers, _signed: &mut [(String, String)]) {}

    /// Built to sign: why `body` cannot be signed as the provider would sign it (it lacks a
    /// field the provider's signature covers), for `send` and `replay` to refuse it rather
    /// than send it unsigned; `None` when it can be (most schemes sign any bytes).
    fn unsignable(&self, _body: &[u8]) -> Option<String> {
        None
    }

    /// Built to sign from a config's source: why the receiver with that config would refuse
    /// every delivery signed so (a `--cert-url` its `cert_urls` do not admit), for `send` and
    /// `replay` to refuse before sending; `None` when there is nothing against it.
    fn signing_refused(&self) -> Option<String> {
        None
    }

    /// A setting this source lacks that the provider's own advice calls for, said as `serve`
    /// logs it at startup (a WARN naming the key); `None` when there is none.
    fn setup_warning(&self) -> Option<&'static str> {
        None
    }

    /// What the provider changes between deliveries of one event, left out of the payload
    /// fingerprint, as JSON pointers (RFC 6901) into the event's payload (for a batch, into each
    /// item): `/pending_webhooks`, `/additionalData/hmacSignature`. For a form body, a pointer of
    /// one segment names a field (`/bt_signature`).
    fn volatile_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// The provider's own answer to a delivery that was processed (or replayed), where it
    /// expects one (Adyen's `[accepted]`), in place of the handler's stored response when that
    /// is a success; `None`: the handler's response is the answer.
    fn answer(&self) -> Option<Answer> {
        None
    }

    /// The provider's own status for a refusal, where it asks for one (GoCardless: `498` for a
    /// wrong signature); the error code and body stay the contract's. `None`: the usual status.
    fn refusal_status(&self, _refusal: Refusal) -> Option<u16> {
        None
    }

    /// A stored payload as the provider would send it: a batch provider wraps one stored item
    /// as a delivery of one (what `replay` and `send` then sign); a body that already is a
    /// whole delivery, and every payload of a provider that does not batch, stay as they are.
    fn as_delivery<'b>(&self, payload: &'b [u8]) -> Cow<'b, [u8]> {
        Cow::Borrowed(payload)
    }

    /// How long the provider may redeliver an event, and its own words for it, where it says:
    /// a retention window shorter than this forgets ids a retry can still bring back.
    fn redelivery_horizon(&self) -> Option<(Duration, &'static str)> {
        None
    }

    /// For `dedupe = "body"`, where bodies that differ in their bytes verify alike: the key of
    /// what the signature covers, so a body that verifies only because a genuine one did is
    /// found as that one's payload (Twilio signs a form's fields decoded and sorted by name,
    /// each value once, without separators: reordered, re-encoded, repeated or re-split fields
    /// verify under a genuine delivery's signature). `None` (every other scheme, and Twilio's
    /// JSON bodies, whose exact bytes are signed): the payload's fingerprint is the key.
    fn signed_payload_key(&self, _inbound: &Inbound<'_>) -> Option<[u8; 32]> {
        None
    }

    /// Whether a source of this scheme dedupes by body (`dedupe = "body"`) whatever its config
    /// says: where the event id is a hash of the payload and one payload verifies in more than
    /// one form (Braintree's, with or without its last line break), so that a genuine delivery
    /// sent again in its other form is its replay, not a second event.
    fn dedupes_body(&self) -> bool {
        false
    }

    /// For a scheme whose signature does not cover the body in full: a value of the delivery
    /// that the signature does cover and that the provider never sends with two different events
    /// (PayPal's transmission id, signed beside only the body's CRC32). The server binds it to
    /// the delivery's source, event id and body (`db::transmissions`) and refuses it with any
    /// other, so another body under a genuine delivery's headers (forged to the same CRC32) is
    /// not stored. Read
    /// from a delivery of one event; `None` (every other scheme): the signature covers the
    /// body itself.
    fn transmission_id<'h>(&self, _headers: &'h dyn Headers) -> Option<&'h str> {
        None
    }

    /// Turns one request into an event or a handshake: by default [`verify`](Provider::verify),
    /// then the JSON [`needs_json`](Provider::needs_json) asks for, then
    /// [`handshake`](Provider::handshake), then [`identify_body`](Provider::identify_body). A
    /// provider whose check must wait on something (a certificate it fetches) or needs more of
    /// the request (its method or query) overrides this.
    fn receive<'a>(
        &'a self,
        inbound: &'a Inbound<'a>,
    ) -> LocalBoxFuture<'a, Result<Received, Refusal>> {
        Box::pin(std::future::ready(receive_now(self, inbound)))
    }
}

/// The default [`Provider::receive`], done at once.
///
/// # Errors
/// A [`Refusal`] for a bad signature, a body that is not the JSON the provider needs, or a
/// delivery without an event id.
pub fn receive_now<P: Provider + ?Sized>(
    provider: &P,
    inbound: &Inbound<'_>,
) -> Result<Received, Refusal> {
    provider.verify(inbound.headers, inbound.body, inbound.now)?;
    receive_verified(provider, inbound)
}

/// Why a body that must be JSON could not be read as such. JSON lets a reader bound its
/// numbers, and hookbox reads them as 64-bit floats: a number past about 1.8e308 (`1e400`, an
/// integer of 400 digits) is valid JSON it cannot read, said so rather than "not JSON" (a
/// black-box run).
fn unreadable_json(error: &serde_json::Error) -> Refusal {
    if error.is_syntax() && error.to_string().starts_with("number out of range") {
        return Refusal::Malformed(
            "the body holds a number too large for hookbox to read (past about 1.8e308)",
        );
    }
    Refusal::MalformedPayload
}

/// The rest of [`receive_now`] once the signature is checked (a provider that checks with more
/// than the headers and body overrides `receive` and calls this): the JSON
/// [`needs_json`](Provider::needs_json) asks for, then [`handshake`](Provider::handshake), then
/// [`identify_body`](Provider::identify_body).
///
/// # Errors
/// A [`Refusal`] for a body that is not the JSON the provider needs, or a delivery without an
/// event id.
pub fn receive_verified<P: Provider + ?Sized>(
    provider: &P,
    inbound: &Inbound<'_>,
) -> Result<Received, Refusal> {
    let json = match serde_json::from_slice::<serde_json::Value>(inbound.body) {
        Ok(json) => Some(json),
        Err(e) if provider.needs_json() => return Err(unreadable_json(&e)),
        Err(_) => None,
    };
    if let Some(answer) = provider.handshake(inbound, json.as_ref()) {
        return answer.map(Received::Handshake);
    }
    let identity = provider.identify_body(inbound.headers, inbound.body, json.as_ref());
    Ok(Received::Event(Incoming {
        event_id: identity.event_id.ok_or(Refusal::MissingEventId)?,
        event_type: identity.event_type,
        json,
    }))
}

/// Whether a capture line looks like one of `provider`'s deliveries: it kept at least one
/// header besides `content-type`, every one of them is a header the provider keeps, and the
/// provider finds the line's event id in those headers and the body. A capture keeps only its
/// scheme's headers, so this is how `replay --secret` tells a line's scheme without `--scheme`,
/// from each provider's own [`kept_headers`](Provider::kept_headers) and
/// [`identify_body`](Provider::identify_body) rather than a list of its own; the id tells apart
/// schemes that share a signature header (GitHub and Meta, `X-Hub-Signature-256`).
pub fn fits_capture(
    provider: &dyn Provider,
    headers: &[(String, String)],
    body: &[u8],
    event_id: &str,
) -> bool {
    let kept = provider.kept_headers();
    let mut named = headers
        .iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .filter(|name| name != "content-type")
        .peekable();
    if named.peek().is_none() || !named.all(|name| kept.contains(&name)) {
        return false;
    }
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    // A slice cannot stand in as `&dyn Headers`; only the few that passed the names get here.
    let headers = headers.to_vec();
    provider
        .identify_body(&headers, body, json.as_ref())
        .event_id
        .is_some_and(|id| id == event_id)
}

/// A derived event id: `sha256:` and the lowercase hex SHA-256 of `bytes`. A redelivery of the
/// same bytes gets the same id, and so is a replay.
pub fn body_hash_id(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// Unix seconds now: what a delivery's signed timestamp is checked against, and what a fresh
/// signature carries.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A source's configuration that a provider cannot use: the key (under `sources.NAME.`) and a
/// one-line problem that never holds a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ProviderError {
    /// The key at fault, e.g. `secrets` or `signature_header`.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ProviderError {
    /// The problem with `key`.
    pub fn at(key: impl Into<String>, problem: impl Into<String>) -> Self {
        ProviderError {
            key: key.into(),
            problem: problem.into(),
        }
    }
}

/// What a provider is built from: one source's secrets, tolerance and its own keys.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The scheme's name, for messages.
    pub scheme: &'static str,
    /// The source's secrets, in order (the first signs). Empty when the source gives none:
    /// a provider that needs secrets refuses that ([`Keys`] does), and one whose key material
    /// is something else refuses any (see [`Settings::no_secrets`]).
    pub secrets: &'a [Secret],
    /// How far a signed timestamp may be from now, either way.
    pub tolerance: Duration,
    /// Whether the source set `tolerance` itself; when it did not, `tolerance` is
    /// [`DEFAULT_TOLERANCE`], which a provider with a window of its own (Twitch's ten minutes)
    /// may replace.
    pub tolerance_set: bool,
    /// The source's keys beyond the ones every source has, or `None` when the scheme is named
    /// alone (`--scheme` on the command line), with no config source behind it.
    pub table: Option<&'a toml::Table>,
    /// What `send` and `replay` sign with beyond the secrets, when the provider is built to
    /// sign (`None`: built to receive).
    pub signing: Option<&'a Signing>,
}

/// What `send` and `replay` sign with where the receiver checks a public key rather than a
/// shared secret: the private key (`--key FILE`) and where the receiver fetches the matching
/// certificate (`--cert-url URL`). `Debug` never shows the key.
#[derive(Clone, Default)]
pub struct Signing {
    /// The PEM private key, as read from `--key FILE`.
    pub key_pem: Option<Secret>,
    /// The URL the receiver fetches the certificate from.
    pub cert_url: Option<String>,
    /// The query `--to` puts on every request, before what a delivery adds: a provider that
    /// signs the request's query (Twilio) signs it as it is sent.
    pub to_query: Option<String>,
}

impl fmt::Debug for Signing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signing")
            .field("key_pem", &self.key_pem.as_ref().map(|_| "<set>"))
            .field("cert_url", &self.cert_url)
            .field("to_query", &self.to_query)
            .finish()
    }
}

/// How far a signed timestamp may be from now when a source sets no `tolerance` (a provider
/// with a window of its own may use that instead).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// "a stripe source", "an adyen source", "an sns source": a scheme's source, with its article
/// as the name is said (the acronyms letter by letter), for messages.
pub fn a_source(scheme: &str) -> String {
    let article = match scheme.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ if scheme == "sns" || scheme.starts_with("hmac") => "an",
        _ => "a",
    };
    format!("{article} {scheme} source")
}

/// The keys every source takes, whatever its scheme.
pub const COMMON_KEYS: &[&str] = &[
    "scheme",
    "secrets",
    "secrets_env",
    "tolerance",
    "retention",
    "dedupe",
    "forward",
];

impl Settings<'_> {
    /// Refuses any key of the source's table that is not in `own`.
    ///
    /// # Errors
    /// The first unknown key, with the keys the scheme does take.
    pub fn only(&self, own: &[&str]) -> Result<(), ProviderError> {
        self.only_among(own, true)
    }

    /// [`Settings::only`] for a provider whose key material is not a shared secret: the keys
    /// listed leave the secrets out (see [`Settings::no_secrets`]).
    ///
    /// # Errors
    /// The first unknown key, with the keys the scheme does take.
    pub fn only_keyless(&self, own: &[&str]) -> Result<(), ProviderError> {
        self.only_among(own, false)
    }

    /// For a provider whose key material is not a shared secret: refuses `secrets` (and
    /// `secrets_env`), naming what the scheme takes instead: `instead` for a source in a
    /// config, `to_sign` for `send` and `replay` (built to sign, where the secret came from
    /// `--secret`).
    ///
    /// # Errors
    /// Under `secrets`, when the source gives any.
    pub fn no_secrets(&self, instead: &str, to_sign: &str) -> Result<(), ProviderError> {
        if self.secrets.is_empty() {
            return Ok(());
        }
        let instead = if self.signing.is_some() {
            to_sign
        } else {
            instead
        };
        Err(ProviderError::at(
            "secrets",
            format!(
                "{} takes no secrets (nor secrets_env): {instead}",
                a_source(self.scheme)
            ),
        ))
    }

    /// [`Settings::only`], the common keys listed with or without the secrets.
    fn only_among(&self, own: &[&str], secrets: bool) -> Result<(), ProviderError> {
        let Some(table) = self.table else {
            return Ok(());
        };
        match table.keys().find(|key| !own.contains(&key.as_str())) {
            None => Ok(()),
            Some(key) => {
                // `tolerance` only where the scheme checks a timestamp, which the built
                // provider says (a later check refuses it elsewhere), so it is not listed.
                let takes: Vec<&str> = COMMON_KEYS
                    .iter()
                    .filter(|common| **common != "tolerance")
                    .filter(|common| secrets || !common.starts_with("secrets"))
                    .chain(own)
                    .copied()
                    .collect();
                Err(ProviderError::at(
                    key.as_str(),
                    format!(
                        "unknown field `{key}`: {} takes {} (and tolerance, where its scheme \
                         checks a signed timestamp)",
                        a_source(self.scheme),
                        takes.join(", ")
                    ),
                ))
            }
        }
    }

    /// The public keys an asymmetric scheme checks with, in order (several while one is
    /// rotated): the list `public_keys`, or the comma-separated variable `public_keys_env`
    /// names. Returns the key they came from, for the scheme's own messages, with the texts.
    ///
    /// # Errors
    /// Both keys given, the variable unset, an empty list or an empty key.
    pub fn public_keys(&self) -> Result<Option<(&'static str, Vec<String>)>, ProviderError> {
        let (key, texts) = match (self.texts("public_keys")?, self.text("public_keys_env")?) {
            (Some(_), Some(_)) => {
                return Err(ProviderError::at(
                    "public_keys_env",
                    "give either public_keys or public_keys_env, not both",
                ))
            }
            (Some(list), None) => (
                "public_keys",
                list.into_iter().map(str::to_owned).collect::<Vec<_>>(),
            ),
            (None, Some(var)) => match std::env::var(var) {
                Ok(value) if value.trim().is_empty() => {
                    return Err(ProviderError::at(
                        "public_keys_env",
                        format!(
                            "the environment variable {} is set but empty: put the public key \
                             in it (several, comma-separated, while one is rotated)",
                            crate::redact::variable_name(var)
                        ),
                    ))
                }
                Ok(value) => (
                    "public_keys_env",
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|text| !text.is_empty())
                        .map(str::to_owned)
                        .collect(),
                ),
                Err(_) => {
                    return Err(ProviderError::at(
                        "public_keys_env",
                        format!(
                            "the environment variable {} is not set",
                            crate::redact::variable_name(var)
                        ),
                    ))
                }
            },
            (None, None) => return Ok(None),
        };
        if texts.is_empty() || texts.iter().any(|text| text.trim().is_empty()) {
            return Err(ProviderError::at(
                key,
                "a source needs at least one public key, and no public key may be empty",
            ));
        }
        Ok(Some((key, texts)))
    }

    /// The strings of the list `key`, when it is set.
    ///
    /// # Errors
    /// A value that is not a list of strings.
    pub fn texts(&self, key: &str) -> Result<Option<Vec<&str>>, ProviderError> {
        let Some(value) = self.table.and_then(|table| table.get(key)) else {
            return Ok(None);
        };
        let toml::Value::Array(items) = value else {
            return Err(ProviderError::at(
                key,
                format!(
                    "invalid type: {}, expected a list of strings",
                    value.type_str()
                ),
            ));
        };
        items
            .iter()
            .map(|item| {
                item.as_str().ok_or_else(|| {
                    ProviderError::at(
                        key,
                        format!("invalid type: {}, expected a string", item.type_str()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The text of `key`, when it is set.
    ///
    /// # Errors
    /// A value that is not a string.
    pub fn text(&self, key: &str) -> Result<Option<&str>, ProviderError> {
        match self.table.and_then(|table| table.get(key)) {
            None => Ok(None),
            Some(toml::Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(ProviderError::at(
                key,
                format!("invalid type: {}, expected a string", other.type_str()),
            )),
        }
    }
}

/// Builds a provider for one source. Each provider's file has one; [`Registry`] lists them.
pub type Constructor = fn(&Settings<'_>) -> Result<Arc<dyn Provider>, ProviderError>;

/// The schemes a config may name, each with its constructor.
#[derive(Clone)]
pub struct Registry {
    entries: Vec<(&'static str, Constructor)>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(name, _)| name))
            .finish()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// Every provider hookbox has built in, one line each.
    pub fn builtin() -> Registry {
        Registry {
            entries: Vec::new(),
        }
        .with("stripe", stripe::build)
        .with("standard", standard::build)
        .with("github", github::build)
        .with("shopify", shopify::build)
        .with("slack", slack::build)
        .with("hmac-sha256", generic::build_sha256)
        .with("braintree", braintree::build)
        .with("twilio", twilio::build)
        .with("paddle", paddle::build)
        .with("checkout", checkout::build)
        .with("razorpay", razorpay::build)
        .with("mollie", mollie::build)
        .with("lemonsqueezy", lemonsqueezy::build)
        .with("square", square::build)
        .with("paypal", paypal::build)
        .with("adyen", adyen::build)
        .with("gocardless", gocardless::build)
        .with("gitlab", gitlab::build)
        .with("bitbucket", bitbucket::build)
        .with("linear", linear::build)
        .with("zoom", zoom::build)
        .with("twitch", twitch::build)
        .with("meta", meta::build)
        .with("sendgrid", sendgrid::build)
        .with("hmac", generic::build)
        .with("sns", sns::build)
        .with("discord", discord::build)
    }

    /// Adds (or replaces) the scheme `name`, built by `build`.
    #[must_use]
    pub fn with(mut self, name: &'static str, build: Constructor) -> Registry {
        self.entries.retain(|(known, _)| *known != name);
        self.entries.push((name, build));
        self
    }

    /// Every scheme, named alone (as `--scheme` names one), in the registry's order.
    pub fn schemes(&self) -> impl Iterator<Item = Scheme> + '_ {
        self.entries.iter().map(|(name, build)| Scheme {
            name,
            build: *build,
            table: None,
        })
    }

    /// Every scheme's name, comma-separated, for messages that list the choices.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.entries.iter().map(|(name, _)| *name).collect();
        names.join(", ")
    }

    /// The scheme `name`, with the source's own keys (`None`: named alone, as `--scheme` does).
    ///
    /// # Errors
    /// A one-line reason for an unknown name.
    pub fn scheme(&self, name: &str, table: Option<toml::Table>) -> Result<Scheme, String> {
        let (name, build) = self
            .entries
            .iter()
            .find(|(known, _)| *known == name)
            .ok_or_else(|| format!("unknown scheme {name:?}; expected one of {}", self.names()))?;
        Ok(Scheme {
            name,
            build: *build,
            table: table.map(Arc::new),
        })
    }
}

/// A source's scheme as configured: which provider, and the source's own keys for it. It builds
/// the [`Provider`] once the secrets are known.
#[derive(Clone)]
pub struct Scheme {
    name: &'static str,
    build: Constructor,
    table: Option<Arc<toml::Table>>,
}

/// The name only: a scheme's own keys may one day hold something private.
impl fmt::Debug for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scheme({:?})", self.name)
    }
}

impl Scheme {
    /// A built-in scheme named alone, with no config source behind it (`--scheme`).
    ///
    /// # Errors
    /// A one-line reason for an unknown name.
    pub fn builtin(name: &str) -> Result<Scheme, String> {
        Registry::builtin().scheme(name, None)
    }

    /// The scheme's name as configuration spells it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The provider with these secrets (the first signs) and this tolerance.
    ///
    /// # Errors
    /// A key of the source the provider refuses, or a secret it cannot use.
    pub fn build(
        &self,
        secrets: &[Secret],
        tolerance: Duration,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        (self.build)(&Settings {
            scheme: self.name,
            secrets,
            tolerance,
            tolerance_set: true,
            table: self.table.as_deref(),
            signing: None,
        })
    }

    /// The provider of a configured source: as [`Scheme::build`], with the source's
    /// `tolerance` when it sets one, and the provider's own default otherwise.
    ///
    /// # Errors
    /// As [`Scheme::build`].
    pub fn build_source(
        &self,
        secrets: &[Secret],
        tolerance: Option<Duration>,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        (self.build)(&Settings {
            scheme: self.name,
            secrets,
            tolerance: tolerance.unwrap_or(DEFAULT_TOLERANCE),
            tolerance_set: tolerance.is_some(),
            table: self.table.as_deref(),
            signing: None,
        })
    }

    /// The provider that signs for `send` and `replay`, with these secrets (the first signs)
    /// and `signing`'s key material where the scheme signs with a private key.
    ///
    /// # Errors
    /// As [`Scheme::build`], and a missing or unusable `--key` or `--cert-url` (the error's
    /// key is the flag) for a scheme that needs them.
    pub fn build_signer(
        &self,
        secrets: &[Secret],
        tolerance: Duration,
        signing: &Signing,
    ) -> Result<Arc<dyn Provider>, ProviderError> {
        (self.build)(&Settings {
            scheme: self.name,
            secrets,
            tolerance,
            tolerance_set: true,
            table: self.table.as_deref(),
            signing: Some(signing),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_takes_the_article_its_name_is_said_with() {
        assert_eq!(a_source("stripe"), "a stripe source");
        assert_eq!(a_source("adyen"), "an adyen source");
        assert_eq!(a_source("sns"), "an sns source");
        assert_eq!(a_source("hmac-sha256"), "an hmac-sha256 source");
        assert_eq!(a_source("square"), "a square source");
    }

    /// Builds an owned header list from literals.
    pub(super) fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    /// A `POST` of `body` with `sent`, received at `now`.
    pub(super) fn post<'a>(sent: &'a dyn Headers, body: &'a [u8], now: i64) -> Inbound<'a> {
        Inbound {
            method: "POST",
            query: "",
            headers: sent,
            body,
            now,
        }
    }

    /// A `POST` of `body` with `sent` to `provider`, received at time 0 (the providers whose
    /// `receive` is ready at once).
    pub(super) fn receive(
        provider: &dyn Provider,
        sent: &dyn Headers,
        body: &[u8],
    ) -> Result<Received, Refusal> {
        futures_util::FutureExt::now_or_never(provider.receive(&post(sent, body, 0)))
            .expect("ready")
    }

    /// The built-in provider `scheme` over the given secrets with a 300 s tolerance.
    pub(super) fn verifier(scheme: &str, secrets: &[&str]) -> Arc<dyn Provider> {
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Scheme::builtin(scheme)
            .expect("a built-in scheme")
            .build(&secrets, Duration::from_secs(300))
            .expect("valid test secrets")
    }

    /// An `hmac` provider with `rule` over the given secrets, with a 300 s tolerance.
    pub(super) fn generic(rule: GenericRule, secrets: &[&str]) -> Arc<dyn Provider> {
        let secrets: Vec<Secret> = secrets.iter().map(|s| Secret::new(*s)).collect();
        Arc::new(
            generic::Hmac::new(rule, &secrets, Duration::from_secs(300)).expect("valid test rule"),
        )
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
    fn each_provider_names_itself_as_the_registry_does() {
        let registry = Registry::builtin();
        assert_eq!(
            registry.names(),
            "stripe, standard, github, shopify, slack, hmac-sha256, braintree, twilio, paddle, \
             checkout, razorpay, mollie, lemonsqueezy, square, paypal, adyen, gocardless, gitlab, \
             bitbucket, linear, zoom, twitch, meta, sendgrid, hmac, sns, discord"
        );
        for provider in every_scheme() {
            assert!(registry.scheme(provider.scheme(), None).is_ok());
        }
        let error = registry.scheme("papyal", None).unwrap_err();
        assert!(error.starts_with("unknown scheme \"papyal\""), "{error}");
    }

    #[test]
    fn an_empty_secrets_list_is_refused() {
        let github = Scheme::builtin("github").expect("built in");
        let error = github.build(&[], Duration::from_secs(300)).unwrap_err();
        assert!(error.problem.contains("at least one secret"), "{error}");
        assert_eq!(error.key, "secrets");
    }

    #[test]
    fn an_empty_secret_is_refused() {
        let secrets = [Secret::new("fine"), Secret::new("")];
        let github = Scheme::builtin("github").expect("built in");
        let error = github
            .build(&secrets, Duration::from_secs(300))
            .unwrap_err();
        assert!(error.problem.contains("#2"), "{error}");
    }

    #[test]
    fn debug_shows_the_scheme_and_key_count_but_never_a_secret() {
        let verifier = verifier("stripe", &["whsec_very_secret_one", "another_secret"]);
        let shown = format!("{verifier:?}");
        assert_eq!(shown, "Stripe { keys: Keys(2), tolerance: 300s }");
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

    /// Every built-in provider, `hmac-sha256` in both encodings and a timestamped SHA-512
    /// `hmac`, all with one secret.
    fn every_scheme() -> Vec<Arc<dyn Provider>> {
        let secret = "whsec_AAECAwQFBgcICQoLDA0ODw==";
        let rule = |encoding, prefix: Option<&str>| {
            GenericRule::body_sha256(
                "X-Sig",
                prefix,
                encoding,
                IdSource::At(Locator::Header("X-Id".into())),
                Some(Locator::Json("/type".into())),
            )
        };
        let stamped = GenericRule {
            algorithm: Algorithm::Sha512,
            signed_content: "{timestamp}.{id}.{body}".parse().expect("a valid template"),
            timestamp_header: Some("X-Stamp".into()),
            ..rule(Encoding::Base64, Some("v1="))
        };
        let mut every: Vec<Arc<dyn Provider>> =
            ["stripe", "standard", "github", "shopify", "slack"]
                .into_iter()
                .map(|name| verifier(name, &[secret]))
                .collect();
        every.push(generic(rule(Encoding::Hex, Some("sha256=")), &[secret]));
        every.push(generic(rule(Encoding::Base64, None), &[secret]));
        every.push(generic(stamped, &[secret]));
        every
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
        for verifier in every_scheme() {
            let name = verifier.scheme();
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
        for verifier in every_scheme() {
            let name = verifier.scheme();
            let signed = verifier.sign(body, 1_700_000_000, "evt_1", Some("thing.happened"));
            assert_eq!(
                verifier.verify(&signed, body, 1_700_000_100),
                Ok(()),
                "{name}"
            );
            assert_eq!(
                verifier.verify(&signed, body, 1_700_000_301),
                if matches!(name, "stripe" | "standard" | "slack")
                    || verifier.kept_headers().contains(&"x-stamp".to_owned())
                {
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
}
