//! Certificates a delivery names by URL (PayPal's `PAYPAL-CERT-URL`, SNS's `SigningCertURL`):
//! the URL is checked against the source's allowed prefixes before anything is fetched, each URL
//! is fetched once, with a timeout and a size limit, and the certificate is kept for the life of
//! the process, shared by every source and worker thread. Concurrent deliveries naming a URL not
//! yet fetched wait on one fetch, so a burst fetches once. A failed fetch is not kept: the
//! provider's retry fetches again, with no restart. The same allowlist and client serve the one
//! other request a delivery may ask for: [`visit`], SNS's GET of its `SubscribeURL`.
//!
//! What the certificate schemes (PayPal, SNS) share beyond the fetch lives here too: a source's
//! `cert_urls` ([`Allowlist::from_settings`]), the check of an RSA signature with the key of a
//! certificate valid at the time ([`RsaSignature`]), and the key `send` and `replay` sign with
//! ([`RsaSigningKey`]). Each provider keeps only its own rules: what it signs, where the
//! signature, digest and certificate URL travel, and the event's id.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use openssl::asn1::Asn1Time;
use openssl::hash::MessageDigest;
use openssl::pkey::{Id, PKey, Private, Public};
use openssl::sign::{Signer as RsaSigner, Verifier as RsaVerifier};
use openssl::x509::X509;
use tokio::sync::watch;

use super::{ProviderError, Refusal, Settings, SignatureError, Signing};

/// How long one certificate fetch may take, connection and body included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest certificate (or chain) body taken; PayPal's chain is a few kilobytes.
pub const MAX_CERT_BYTES: usize = 64 * 1024;

/// At most this many certificates are kept; past it the cache starts afresh (an allowed
/// prefix could otherwise name endless URLs).
const MAX_CACHED: usize = 256;

/// A certificate fetched (or seeded) for a URL: its public key and validity period.
pub struct Certificate {
    x509: X509,
    key: PKey<Public>,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Certificate({:?})", self.x509.subject_name())
    }
}

impl Certificate {
    /// The first certificate of a PEM body (a chain starts with the signer's own).
    ///
    /// # Errors
    /// A body that holds no PEM certificate, or one without a usable public key.
    pub fn from_pem(pem: &[u8]) -> Result<Certificate, String> {
        let x509 = X509::from_pem(pem).map_err(|_| "not a PEM certificate".to_owned())?;
        let key = x509
            .public_key()
            .map_err(|_| "the certificate's public key cannot be read".to_owned())?;
        Ok(Certificate { x509, key })
    }

    /// The public key that checks signatures.
    pub fn public_key(&self) -> &PKey<Public> {
        &self.key
    }

    /// Whether `now` (unix seconds) is within the certificate's validity period.
    pub fn valid_at(&self, now: i64) -> bool {
        let Ok(now) = Asn1Time::from_unix(now) else {
            return false;
        };
        self.x509.not_before() <= now && self.x509.not_after() >= now
    }
}

/// A source's allowed certificate URL prefixes (`cert_urls`), each normalised as a URL is.
/// A prefix's host may hold [`REGION`] once, standing for any one AWS region name
/// (`sns.<region>.amazonaws.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist(Vec<Prefix>);

/// What `<region>` in an allowed prefix's host stands for: one AWS region name, such as
/// `us-east-1`, `us-gov-west-1` or `cn-north-1` (two letters, words, a number, joined by `-`).
pub const REGION: &str = "<region>";

/// Stands in for [`REGION`] while a prefix is parsed: a host label no real URL is expected to
/// carry, and one [`CertUrl::parse`] takes.
const REGION_STAND_IN: &str = "hookbox-region-stand-in";

/// One allowed prefix: the URL, and where its host has [`REGION`], the origin's text before and
/// after it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefix {
    url: CertUrl,
    region: Option<(String, String)>,
}

impl Prefix {
    fn parse(prefix: &str) -> Result<Prefix, String> {
        let regions = prefix.matches(REGION).count();
        if regions > 1 || prefix.contains(REGION_STAND_IN) {
            return Err(format!("{REGION} may stand for one label of the host only"));
        }
        let url = CertUrl::parse(&prefix.replace(REGION, REGION_STAND_IN))?;
        if regions == 0 {
            return Ok(Prefix { url, region: None });
        }
        let origin = url.origin();
        let at = origin
            .find(REGION_STAND_IN)
            .filter(|at| {
                let host_from = origin.find("://").map_or(0, |i| i + 3);
                let end = at + REGION_STAND_IN.len();
                *at >= host_from
                    && [None, Some(b'.'), Some(b':')].contains(&origin.as_bytes().get(end).copied())
                    && (*at == host_from || origin.as_bytes()[at - 1] == b'.')
            })
            .ok_or_else(|| format!("{REGION} may stand for one label of the host only"))?;
        let region = (
            origin[..at].to_owned(),
            origin[at + REGION_STAND_IN.len()..].to_owned(),
        );
        Ok(Prefix {
            url,
            region: Some(region),
        })
    }

    fn admits(&self, url: &CertUrl) -> bool {
        let origin_ok = match &self.region {
            None => self.url.origin() == url.origin(),
            Some((before, after)) => url
                .origin()
                .strip_prefix(before.as_str())
                .and_then(|rest| rest.strip_suffix(after.as_str()))
                .is_some_and(is_region),
        };
        // The prefix's path as whole segments: `/certs` admits `/certs` and `/certs/x`, not
        // `/certsevil/x`, whether or not it was written with its trailing `/`.
        let path = self.url.path();
        let segment_ok = url.path_and_query().strip_prefix(path).is_some_and(|rest| {
            path.ends_with('/') || rest.is_empty() || rest.starts_with(['/', '?'])
        });
        origin_ok && segment_ok
    }
}

/// Whether `label` has the shape of an AWS region name: two lowercase letters, one or more
/// lowercase words, and a number of one or two digits, joined by `-` (`us-east-1`,
/// `us-gov-west-1`, `ap-southeast-4`). Legacy S3 hosts such as `s3-us-west-2` do not pass.
fn is_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    let letters = |part: &&str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase());
    match parts.as_slice() {
        [first, words @ .., number] if !words.is_empty() => {
            first.len() == 2
                && letters(first)
                && words.iter().all(letters)
                && (1..=2).contains(&number.len())
                && number.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

impl Allowlist {
    /// The prefixes, each an absolute `https://` (or `http://`) URL whose host and port are
    /// matched exactly (a [`REGION`] label of the host by shape) and whose path is a prefix.
    ///
    /// # Errors
    /// An empty list, or the first prefix that is not such a URL.
    pub fn new<S: AsRef<str>>(prefixes: &[S]) -> Result<Allowlist, String> {
        if prefixes.is_empty() {
            return Err("give at least one allowed URL prefix".to_owned());
        }
        prefixes
            .iter()
            .map(|prefix| {
                let prefix = prefix.as_ref();
                Prefix::parse(prefix).map_err(|e| format!("{prefix:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Allowlist)
    }

    /// A source's `cert_urls`, or `defaults` (the provider's own hosts) when it names none.
    ///
    /// # Errors
    /// Under `cert_urls`: not a list of texts, an empty list, or a prefix [`Allowlist::new`]
    /// refuses.
    pub fn from_settings(
        settings: &Settings<'_>,
        defaults: &[&str],
    ) -> Result<Allowlist, ProviderError> {
        match settings.texts("cert_urls")? {
            Some(prefixes) => Allowlist::new(&prefixes),
            None => Allowlist::new(defaults),
        }
        .map_err(|problem| ProviderError::at("cert_urls", problem))
    }

    /// The URL, normalised, when it starts with an allowed prefix: same scheme, host and port,
    /// and a path that begins with the prefix's path, segment by segment.
    pub fn admit(&self, url: &str) -> Option<CertUrl> {
        let url = CertUrl::parse(url).ok()?;
        self.0
            .iter()
            .any(|prefix| prefix.admits(&url))
            .then_some(url)
    }
}

/// An absolute URL in one spelling: lowercase scheme and host, no default port, no userinfo,
/// no fragment, no `.` or `..` path segments (percent-encoded or not), no encoded `/` or `\`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertUrl {
    text: String,
    origin_len: usize,
    path_len: usize,
}

impl fmt::Display for CertUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl CertUrl {
    /// The URL as it is fetched.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn origin(&self) -> &str {
        &self.text[..self.origin_len]
    }

    fn path(&self) -> &str {
        &self.text[self.origin_len..self.origin_len + self.path_len]
    }

    fn path_and_query(&self) -> &str {
        &self.text[self.origin_len..]
    }

    /// Parses and normalises `raw`.
    ///
    /// # Errors
    /// Anything but an absolute `http`/`https` URL with a plain host, or one whose path could
    /// mean another path once a server decodes or resolves it.
    pub fn parse(raw: &str) -> Result<CertUrl, String> {
        if raw.len() > 2048 || raw.bytes().any(|b| !b.is_ascii_graphic() || b == b'\\') {
            return Err("not a plain absolute URL".to_owned());
        }
        let (scheme, rest) = raw.split_once("://").ok_or("not an absolute URL")?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "https" => "443",
            "http" => "80",
            _ => return Err("only https:// (or http://) URLs".to_owned()),
        };
        if rest.contains('#') {
            return Err("a URL with a fragment".to_owned());
        }
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(split);
        if authority.contains('@') {
            return Err("a URL with userinfo".to_owned());
        }
        // An IPv6 literal is bracketed; anything else is a name or an IPv4 address.
        let (host, port) = if authority.starts_with('[') {
            let end = authority.find(']').ok_or("a URL without a plain host")? + 1;
            let (host, rest) = authority.split_at(end);
            match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None if rest.is_empty() => (host, None),
                None => return Err("a URL without a plain host".to_owned()),
            }
        } else {
            match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let inner = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        let host_ok = match inner {
            Some(v6) => {
                !v6.is_empty()
                    && v6
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() || b":.".contains(&b))
            }
            None => {
                !host.is_empty()
                    && host
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b))
            }
        };
        if !host_ok {
            return Err("a URL without a plain host".to_owned());
        }
        let port = match port {
            None => None,
            Some(port) => {
                let number: u16 = port
                    .parse()
                    .ok()
                    .filter(|_| port.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or("a URL with a bad port")?;
                (number.to_string() != default_port).then_some(number)
            }
        };
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        let path = if path.is_empty() { "/" } else { path };
        // No provider's certificate URL escapes anything in its path or carries a path
        // parameter: a `%` (a valid escape or not: `%%32e`, `%2%65` are `..` to a server that
        // decodes twice) or a `;` (`..;`, which some servers drop with what follows) could
        // mean another path to the server than the one checked here.
        if path.contains(['%', ';']) {
            return Err("a URL whose path has a % or a ;".to_owned());
        }
        if path
            .split('/')
            .any(|segment| segment == "." || segment == "..")
        {
            return Err("a URL with a . or .. path segment".to_owned());
        }
        let mut text = format!("{scheme}://{}", host.to_ascii_lowercase());
        if let Some(port) = port {
            text.push_str(&format!(":{port}"));
        }
        let origin_len = text.len();
        text.push_str(path);
        if let Some(query) = query {
            text.push('?');
            text.push_str(query);
        }
        Ok(CertUrl {
            text,
            origin_len,
            path_len: path.len(),
        })
    }
}

/// The certificate at `url` could not be had just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

type Fetched = Result<Arc<Certificate>, Unavailable>;

enum Slot {
    Ready(Arc<Certificate>),
    /// A fetch under way; its result is published here.
    Fetching(watch::Receiver<Option<Fetched>>),
}

static CACHE: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn cache() -> MutexGuard<'static, HashMap<String, Slot>> {
    // A panic while holding the lock leaves a map that is still whole.
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn keep(cache: &mut HashMap<String, Slot>, url: &str, certificate: Arc<Certificate>) {
    if cache.len() >= MAX_CACHED {
        cache.retain(|_, slot| matches!(slot, Slot::Fetching(_)));
    }
    cache.insert(url.to_owned(), Slot::Ready(certificate));
}

/// Serves `pem` for `url` as if it had been fetched, without fetching: for tests and vectors,
/// whose certificate URLs name hosts that are not to be reached.
///
/// # Errors
/// A URL that does not parse, or a body that holds no certificate.
pub fn seed(url: &str, pem: &[u8]) -> Result<(), String> {
    let url = CertUrl::parse(url)?;
    let certificate = Arc::new(Certificate::from_pem(pem)?);
    keep(&mut cache(), url.as_str(), certificate);
    Ok(())
}

/// Drops what the cache holds for `url` (for tests: the next delivery fetches it again).
pub fn forget(url: &str) {
    if let Ok(url) = CertUrl::parse(url) {
        cache().remove(url.as_str());
    }
}

/// The certificate at `url` when it is already cached, without fetching.
pub fn cached(url: &CertUrl) -> Option<Arc<Certificate>> {
    match cache().get(url.as_str()) {
        Some(Slot::Ready(certificate)) => Some(certificate.clone()),
        _ => None,
    }
}

/// Removes a fetch's pending slot if the fetch ends without publishing (its request was
/// dropped), so the next delivery starts another.
struct Leader<'u> {
    url: &'u str,
    sender: Option<watch::Sender<Option<Fetched>>>,
}

impl Leader<'_> {
    fn publish(mut self, fetched: Fetched) {
        {
            let mut cache = cache();
            match &fetched {
                Ok(certificate) => keep(&mut cache, self.url, certificate.clone()),
                Err(Unavailable) => {
                    cache.remove(self.url);
                }
            }
        }
        if let Some(sender) = self.sender.take() {
            // Nobody else waiting is fine.
            let _ = sender.send(Some(fetched));
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if self.sender.is_some() {
            let mut cache = cache();
            if matches!(cache.get(self.url), Some(Slot::Fetching(_))) {
                cache.remove(self.url);
            }
        }
    }
}

/// The certificate at `url` (already admitted by a source's [`Allowlist`]): from the cache, or
/// fetched once however many deliveries ask at the same time.
///
/// # Errors
/// [`Unavailable`] when the fetch fails (network, timeout, a status other than 200, a body too
/// large or not a certificate); the next call fetches again.
pub async fn certificate(url: &CertUrl) -> Fetched {
    let key = url.as_str();
    let role = {
        let mut cache = cache();
        match cache.get(key) {
            Some(Slot::Ready(certificate)) => return Ok(certificate.clone()),
            // A fetch whose leader is still there: wait for it.
            Some(Slot::Fetching(receiver)) if receiver.has_changed().is_ok() => {
                Role::Wait(receiver.clone())
            }
            _ => {
                let (sender, receiver) = watch::channel(None);
                cache.insert(key.to_owned(), Slot::Fetching(receiver));
                Role::Lead(sender)
            }
        }
    };
    match role {
        Role::Lead(sender) => {
            let leader = Leader {
                url: key,
                sender: Some(sender),
            };
            let fetched = fetch(url).await.map(Arc::new);
            leader.publish(fetched.clone());
            fetched
        }
        Role::Wait(mut receiver) => match receiver.wait_for(Option::is_some).await {
            Ok(published) => published.clone().unwrap_or(Err(Unavailable)),
            // The leader's request went away before its fetch ended.
            Err(_) => Err(Unavailable),
        },
    }
}

/// What a delivery does about a certificate not yet cached: fetch it, or wait for the fetch
/// under way.
enum Role {
    Lead(watch::Sender<Option<Fetched>>),
    Wait(watch::Receiver<Option<Fetched>>),
}

/// One GET of `url`: 200 with a PEM certificate within the size limit, within the timeout,
/// redirects not followed (a redirect could lead outside the allowlist).
async fn fetch(url: &CertUrl) -> Result<Certificate, Unavailable> {
    let outcome = tokio::time::timeout(FETCH_TIMEOUT, async {
        let mut response = client()
            .get(url.as_str())
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        if response.status() != awc::http::StatusCode::OK {
            return Err(format!("answered {}", response.status().as_u16()));
        }
        let body = response
            .body()
            .limit(MAX_CERT_BYTES)
            .await
            .map_err(|e| format!("body unreadable: {e}"))?;
        Certificate::from_pem(&body)
    })
    .await
    .unwrap_or_else(|_| Err("timed out".to_owned()));
    outcome.map_err(|reason| {
        tracing::warn!(cert_url = %url, %reason, "certificate fetch failed");
        Unavailable
    })
}

/// The client of every request made for a delivery: a timeout, and no redirects (a redirect
/// could lead outside the allowlist).
fn client() -> awc::Client {
    awc::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .disable_redirects()
        .finish()
}

/// One GET of `url` (already admitted by a source's [`Allowlist`]) whose answer matters only as
/// a success: SNS's `SubscribeURL`, which confirms a subscription. The same client as a
/// certificate fetch (timeout, no redirects); the body is read up to the size limit and dropped.
///
/// # Errors
/// [`Unavailable`] when the request fails, times out or is answered other than 2xx.
pub async fn visit(url: &CertUrl) -> Result<(), Unavailable> {
    let outcome = tokio::time::timeout(FETCH_TIMEOUT, async {
        let mut response = client()
            .get(url.as_str())
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status().as_u16()));
        }
        // Read to the end so the connection closes cleanly; what it says does not matter.
        let _ = response.body().limit(MAX_CERT_BYTES).await;
        Ok(())
    })
    .await
    .unwrap_or_else(|_| Err("timed out".to_owned()));
    outcome.map_err(|reason| {
        tracing::warn!(url = %url.origin(), %reason, "confirmation request failed");
        Unavailable
    })
}

/// An RSA signature a delivery carries, made with the key of the certificate at `cert_url` over
/// what the provider signs, with the digest the provider names (PayPal's SHA256withRSA, SNS's
/// SHA1withRSA or SHA256withRSA).
pub struct RsaSignature {
    /// The certificate's URL, already admitted by the source's [`Allowlist`].
    pub cert_url: CertUrl,
    /// The digest signed with.
    pub digest: MessageDigest,
    bytes: Vec<u8>,
}

impl RsaSignature {
    /// The signature as the provider spells it, standard base64.
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] for text that is not base64 or decodes to nothing.
    pub fn from_base64(
        text: &str,
        digest: MessageDigest,
        cert_url: CertUrl,
    ) -> Result<RsaSignature, SignatureError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|_| SignatureError::Invalid)?;
        if bytes.is_empty() {
            return Err(SignatureError::Invalid);
        }
        Ok(RsaSignature {
            cert_url,
            digest,
            bytes,
        })
    }

    /// Checks `signed` against the certificate only if it is already cached: one not fetched
    /// yet counts as a mismatch (for [`Provider::verify`](super::Provider::verify), which
    /// cannot wait for a fetch).
    ///
    /// # Errors
    /// [`SignatureError::Invalid`] as [`RsaSignature::verify`] says, or for a certificate not
    /// cached.
    pub fn verify_cached(&self, signed: &[u8], now: i64) -> Result<(), SignatureError> {
        let certificate = cached(&self.cert_url).ok_or(SignatureError::Invalid)?;
        self.check(&certificate, signed, now)
    }

    /// Fetches the certificate (once per URL, see [`certificate`]) and checks `signed` with
    /// its key.
    ///
    /// # Errors
    /// [`Refusal::Unavailable`] when the fetch fails (503: the provider retries);
    /// [`SignatureError::Untrusted`] for a key that is not RSA or a certificate outside its
    /// validity period at `now`, [`SignatureError::Invalid`] for a signature that does not
    /// match.
    pub async fn verify(&self, signed: &[u8], now: i64) -> Result<(), Refusal> {
        let certificate = certificate(&self.cert_url)
            .await
            .map_err(|Unavailable| Refusal::Unavailable)?;
        Ok(self.check(&certificate, signed, now)?)
    }

    fn check(
        &self,
        certificate: &Certificate,
        signed: &[u8],
        now: i64,
    ) -> Result<(), SignatureError> {
        let key = certificate.public_key();
        if key.id() != Id::RSA {
            return Err(SignatureError::Untrusted(
                "the certificate's key is not RSA",
            ));
        }
        if !certificate.valid_at(now) {
            return Err(SignatureError::Untrusted(
                "the certificate is outside its validity period (expired, or not valid yet)",
            ));
        }
        let good = RsaVerifier::new(self.digest, key)
            .and_then(|mut verifier| verifier.verify_oneshot(&self.bytes, signed))
            .unwrap_or(false);
        if good {
            Ok(())
        } else {
            Err(SignatureError::Invalid)
        }
    }
}

/// The RSA private key `send` and `replay` sign with (`--key FILE`, PEM) and the URL
/// `--cert-url` says its certificate is at. `Debug` is not implemented: the key is never shown.
pub struct RsaSigningKey {
    key: PKey<Private>,
    /// Where the receiver fetches the certificate.
    pub cert_url: String,
}

impl RsaSigningKey {
    /// The key and URL of `signing`, for `scheme`; `names_it` says where the scheme names the
    /// certificate's URL ("in each delivery"), for the error when `--cert-url` is missing.
    ///
    /// # Errors
    /// Under `--key`: no key, or one that is not a PEM RSA private key; under `--cert-url`: no
    /// URL.
    pub fn load(
        signing: &Signing,
        scheme: &str,
        names_it: &str,
    ) -> Result<RsaSigningKey, ProviderError> {
        let pem = signing.key_pem.as_ref().ok_or_else(|| {
            ProviderError::at(
                "--key",
                format!(
                    "{scheme} signs with an RSA private key: give --key FILE (PEM) and \
                     --cert-url URL (where the receiver fetches its certificate)"
                ),
            )
        })?;
        let key = PKey::private_key_from_pem(pem.expose().as_bytes())
            .ok()
            .filter(|key| key.id() == Id::RSA)
            .ok_or_else(|| ProviderError::at("--key", "not a PEM RSA private key"))?;
        let cert_url = signing.cert_url.clone().ok_or_else(|| {
            ProviderError::at(
                "--cert-url",
                format!("{scheme} names its certificate's URL {names_it}: give --cert-url URL"),
            )
        })?;
        Ok(RsaSigningKey { key, cert_url })
    }

    /// Why a delivery signed with this key's `--cert-url` would be refused by a receiver whose
    /// `cert_urls` are `allowlist`: 401 without fetching it, saying no more than
    /// `invalid_signature` (`send` with the PayPal page's own sample did just that, found by a
    /// newcomer's run). `None` when the list admits it.
    pub fn not_admitted_by(&self, allowlist: &Allowlist) -> Option<String> {
        allowlist.admit(&self.cert_url).is_none().then(|| {
            format!(
                "--cert-url: {} is not within this source's cert_urls (the provider's own hosts \
                 when it names none): a receiver with this config refuses every delivery \
                 signed so, 401 without fetching it. Add a prefix of it to the source's \
                 cert_urls, or give a --cert-url within them; nothing was sent",
                self.cert_url
            )
        })
    }

    /// The signature over `signed` with `digest`, in standard base64.
    pub fn sign_base64(&self, digest: MessageDigest, signed: &[u8]) -> String {
        let signature = RsaSigner::new(digest, &self.key)
            .and_then(|mut rsa| rsa.sign_oneshot_to_vec(signed))
            .expect("an RSA key checked when it was loaded signs");
        base64::engine::general_purpose::STANDARD.encode(signature)
    }
}

/// For the certificate schemes' unit tests: a fresh RSA key and a self-signed certificate for
/// it named `common_name`, valid from `from` to `until` (unix seconds), as PEM.
#[cfg(test)]
pub(super) fn test_key_and_cert(
    common_name: &str,
    from: i64,
    until: i64,
) -> (PKey<Private>, String) {
    use openssl::bn::BigNum;
    use openssl::rsa::Rsa;
    use openssl::x509::X509Name;

    let key = PKey::from_rsa(Rsa::generate(2048).expect("rsa")).expect("pkey");
    let mut name = X509Name::builder().expect("name");
    name.append_entry_by_text("CN", common_name).expect("cn");
    let name = name.build();
    let mut cert = X509::builder().expect("x509");
    cert.set_version(2).expect("version");
    let serial = BigNum::from_u32(1).and_then(|n| n.to_asn1_integer());
    cert.set_serial_number(&serial.expect("serial"))
        .expect("serial");
    cert.set_subject_name(&name).expect("subject");
    cert.set_issuer_name(&name).expect("issuer");
    cert.set_pubkey(&key).expect("pubkey");
    cert.set_not_before(&Asn1Time::from_unix(from).expect("time"))
        .expect("nb");
    cert.set_not_after(&Asn1Time::from_unix(until).expect("time"))
        .expect("na");
    cert.sign(&key, MessageDigest::sha256()).expect("sign");
    let pem = cert.build().to_pem().expect("pem");
    (key, String::from_utf8(pem).expect("pem is text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(prefixes: &[&str]) -> Allowlist {
        Allowlist::new(prefixes).expect("valid prefixes")
    }

    #[test]
    fn urls_are_normalised() {
        for (raw, normal) in [
            ("HTTPS://API.PayPal.com/v1/x", "https://api.paypal.com/v1/x"),
            (
                "https://api.paypal.com:443/v1/x",
                "https://api.paypal.com/v1/x",
            ),
            ("https://api.paypal.com", "https://api.paypal.com/"),
            ("http://127.0.0.1:8080/c?x=1", "http://127.0.0.1:8080/c?x=1"),
            ("http://127.0.0.1:80/c", "http://127.0.0.1/c"),
        ] {
            assert_eq!(CertUrl::parse(raw).expect(raw).as_str(), normal, "{raw}");
        }
    }

    #[test]
    fn tricky_urls_are_refused() {
        for raw in [
            "",
            "api.paypal.com/v1",
            "ftp://api.paypal.com/x",
            "https://user@api.paypal.com/x",
            "https://api.paypal.com:pass@evil.example/x",
            "https://api.paypal.com/v1/../../evil",
            "https://api.paypal.com/v1/%2e%2E/evil",
            "https://api.paypal.com/v1/./x",
            "https://api.paypal.com/v1/..%2fevil",
            "https://api.paypal.com/v1/%5c..",
            "https://api.paypal.com/v1/%252e%252e/evil",
            "https://api.paypal.com/v1/%252F",
            "https://api.paypal.com/v1/%%32e%%32e/evil",
            "https://api.paypal.com/v1/%2%65%2%65/evil",
            "https://api.paypal.com/v1/%%32%65/evil",
            "https://api.paypal.com/v1/..;/evil",
            "https://api.paypal.com/v1/%2e%2e;x/evil",
            "https://api.paypal.com/v1/x;y",
            "https://api.paypal.com/v1/cert%2Dname",
            "https://api.paypal.com\\@evil.example/",
            "https://api.paypal.com/x#frag",
            "https://api.paypal.com /x",
            "https://api.paypal.com:99999/x",
            "https://api.paypal.com:+443/x",
            "https:///x",
            "https://api.paypal.com/\u{e9}",
        ] {
            assert!(CertUrl::parse(raw).is_err(), "{raw:?}");
        }
    }

    #[test]
    fn the_allowlist_matches_scheme_host_and_port_exactly_and_the_path_as_a_prefix() {
        let list = allow(&["https://api.paypal.com/", "https://api.sandbox.paypal.com/"]);
        for good in [
            "https://api.paypal.com/v1/notifications/certs/CERT-1",
            "https://API.SANDBOX.PAYPAL.COM/v1/notifications/certs/CERT-1",
            "https://api.paypal.com:443/v1/notifications/certs/CERT-1",
        ] {
            assert!(list.admit(good).is_some(), "{good}");
        }
        for bad in [
            "https://api.paypal.com.evil.example/v1/certs/CERT-1",
            "https://api.paypal.com:8443/v1/certs/CERT-1",
            "http://api.paypal.com/v1/certs/CERT-1",
            "https://evil.example/https://api.paypal.com/",
            "https://evil.example@api.paypal.com/",
            "https://api.paypal.com/../x",
        ] {
            assert!(list.admit(bad).is_none(), "{bad}");
        }
        let narrow = allow(&["https://api.paypal.com/v1/notifications/certs/"]);
        assert!(narrow.admit("https://api.paypal.com/v1/other").is_none());
        assert!(narrow
            .admit("https://api.paypal.com/v1/notifications/certs/CERT-2")
            .is_some());
        // Written without its trailing `/`, a prefix still ends at a segment's end.
        let bare = allow(&["http://127.0.0.1:18722/certs"]);
        for good in [
            "http://127.0.0.1:18722/certs",
            "http://127.0.0.1:18722/certs/paypal.pem",
            "http://127.0.0.1:18722/certs?id=1",
        ] {
            assert!(bare.admit(good).is_some(), "{good}");
        }
        assert!(bare
            .admit("http://127.0.0.1:18722/certsevil/paypal.pem")
            .is_none());
    }

    #[test]
    fn a_region_label_matches_aws_region_names_and_nothing_else() {
        let list = allow(&[
            "https://sns.<region>.amazonaws.com/",
            "https://sns.<region>.amazonaws.com.cn/",
        ]);
        for good in [
            "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-1.pem",
            "https://SNS.EU-WEST-3.amazonaws.com/SimpleNotificationService-1.pem",
            "https://sns.us-gov-west-1.amazonaws.com/x.pem",
            "https://sns.cn-north-1.amazonaws.com.cn/x.pem",
            "https://sns.ap-southeast-4.amazonaws.com:443/x.pem",
            "https://sns.us-isob-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=t",
        ] {
            assert!(list.admit(good).is_some(), "{good}");
        }
        for bad in [
            "https://sns.amazonaws.com/x.pem",
            "https://sns..amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
            "https://sns.us-east-1.evil.amazonaws.com/x.pem",
            "https://evil.sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.s3-us-west-2.amazonaws.com/x.pem",
            "https://sns.s3.amazonaws.com/x.pem",
            "https://sns.us-east.amazonaws.com/x.pem",
            "https://sns.useast-1.amazonaws.com/x.pem",
            "https://sns.us-east-100.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com:8443/x.pem",
            "http://sns.us-east-1.amazonaws.com/x.pem",
            "https://sns.us-east-1.amazonaws.com.cn.evil.example/x.pem",
            "https://sns.us_east-1.amazonaws.com/x.pem",
            "https://sns.hookbox-region-stand-in.amazonaws.com/x.pem",
        ] {
            assert!(list.admit(bad).is_none(), "{bad}");
        }
        let pinned = allow(&["https://sns.eu-west-1.amazonaws.com/"]);
        assert!(pinned
            .admit("https://sns.eu-west-1.amazonaws.com/c.pem")
            .is_some());
        assert!(pinned
            .admit("https://sns.us-east-1.amazonaws.com/c.pem")
            .is_none());
    }

    #[test]
    fn a_region_anywhere_but_one_host_label_is_refused() {
        for bad in [
            "https://sns.amazonaws.com/<region>/",
            "https://sns.<region>.<region>.amazonaws.com/",
            "https://sns<region>.amazonaws.com/",
            "https://sns.<region>x.amazonaws.com/",
            "https://<region>:<region>/",
        ] {
            assert!(Allowlist::new(&[bad]).is_err(), "{bad}");
        }
        assert!(Allowlist::new(&["https://<region>.example/"]).is_ok());
    }

    #[test]
    fn a_bad_prefix_or_none_is_refused() {
        assert!(Allowlist::new::<&str>(&[]).is_err());
        let error = Allowlist::new(&["api.paypal.com"]).unwrap_err();
        assert!(error.contains("api.paypal.com"), "{error}");
    }
}
