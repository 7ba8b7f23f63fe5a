//! Signing a body as its source's provider would, with the first secret of the source (or the
//! one `--secret` gives), so a replay or a `send` passes the receiver's check like a provider's
//! own retry.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::providers::{
    self, Identity, Provider, ProviderError, Registry, Scheme, Signed, Signing,
};
use crate::secret::Secret;

/// A provider that signs: its first key is the one used.
pub type Verifier = Arc<dyn Provider>;

/// The keys to sign with: one per configured source, or one for every source.
#[derive(Debug)]
pub enum Signer {
    /// From the config: each source's scheme and its first secret, or why that source cannot
    /// sign (told only when a delivery of that source is to be signed, so a PayPal source
    /// without `--key` does not stop `send` to another source).
    Config {
        verifiers: HashMap<String, Result<Verifier, String>>,
        /// Sources whose secret's variable is not set here, each with its error: the
        /// environment must change before any of their deliveries can be signed.
        unset: HashMap<String, String>,
    },
    /// From `--scheme` and `--secret`: the same for whatever source a delivery names.
    Flags(Verifier),
    /// From `--secret` alone (`replay`): each capture line is signed by the scheme its kept
    /// headers show (see [`providers::fits_capture`]), with that secret.
    Detect {
        /// The schemes a secret alone can sign for.
        schemes: Vec<Detectable>,
        /// The others (Square's `public_url`, PayPal's `--key`): a line of theirs shows no
        /// scheme here, and its message names them.
        beyond: Vec<&'static str>,
    },
}

/// A built-in scheme `replay --secret` may find a capture line to be.
#[derive(Debug)]
pub struct Detectable {
    scheme: &'static str,
    /// The scheme built with a stand-in secret, to ask what it keeps and where its id lives,
    /// even when the given secret is not one it can use.
    probe: Verifier,
    /// The scheme with the given secret, or why it cannot sign with it.
    signer: Result<Verifier, String>,
}

/// A secret every scheme that signs with a shared secret accepts (Standard Webhooks' wants
/// base64 after `whsec_`); it only ever tells a scheme's headers, and signs nothing.
const PROBE_SECRET: &str = "whsec_AAECAwQFBgcICQoLDA0ODw==";

/// Why a delivery cannot be signed: the tool's error code and one line.
pub type Unsigned = (&'static str, String);

impl Signer {
    /// A signer for every source in `config`, each with its first secret: that is the secret
    /// a rotation makes current, and any configured secret passes the receiver's check. A
    /// scheme that signs with a private key takes it, and its certificate's URL, from
    /// `signing` (`--key`, `--cert-url`).
    ///
    /// `unset` are the sources [`Config::load_for_signing`] left out, each with its error: a
    /// source whose secret's variable is not set cannot sign, and says so when asked.
    ///
    /// # Errors
    /// None today: a source that cannot sign says why when it is asked to
    /// ([`Signer::for_source`]).
    pub fn from_config(
        config: &Config,
        unset: Vec<(String, ConfigError)>,
        signing: &Signing,
    ) -> Result<Signer, String> {
        let unset = unset
            .into_iter()
            .map(|(name, e)| {
                let why = format!(
                    "config error: {e} (set it to sign for source {name:?}, or sign without \
                     --config: --scheme NAME --secret S)"
                );
                (name, why)
            })
            .collect();
        let verifiers = config
            .sources
            .iter()
            .map(|source| {
                let verifier = source
                    .scheme
                    .build_signer(
                        source.secrets.get(..1).unwrap_or_default(),
                        source.tolerance,
                        signing,
                    )
                    .map_err(|e| {
                        if e.key.starts_with("--") {
                            e.to_string()
                        } else {
                            format!("config error: sources.{}.{e}", source.name)
                        }
                    })
                    // Signed as the config's source, checked as its receiver would check it.
                    .and_then(|verifier| match verifier.signing_refused() {
                        Some(why) => Err(why),
                        None => Ok(verifier),
                    });
                (source.name.as_str().to_owned(), verifier)
            })
            .collect();
        Ok(Signer::Config { verifiers, unset })
    }

    /// A signer from `--scheme` and `--secret`, or `--key` (and `--cert-url`) where the scheme
    /// signs with a private key (`--scheme sendgrid --key FILE`, `--scheme discord --key FILE`:
    /// no secret).
    ///
    /// # Errors
    /// An unknown scheme, one that needs keys only a config source has (`hmac`'s and
    /// `hmac-sha256`'s header and id location, `paypal`'s `webhook_id`), a secret the scheme
    /// cannot use (a standard secret that is not base64, any secret for discord), or no key to
    /// sign with.
    pub fn from_flags(
        scheme: &str,
        secret: Option<Secret>,
        signing: &Signing,
    ) -> Result<Signer, String> {
        let name = scheme;
        let secret_given = secret.is_some();
        let scheme = Scheme::builtin(scheme).map_err(|e| format!("--scheme: {e}"))?;
        // The tolerance plays no part in signing.
        scheme
            .build_signer(secret.as_slice(), Duration::ZERO, signing)
            .map(Signer::Flags)
            .map_err(|e| flag_error(name, secret_given, &e))
    }

    /// A signer from `--secret` without `--scheme`, for `replay`: every built-in scheme that
    /// can be built without a config, each capture line signed by the one its headers show.
    pub fn detecting(secret: Secret, signing: &Signing) -> Signer {
        let probe = [Secret::new(PROBE_SECRET)];
        let given = [secret];
        let mut beyond = Vec::new();
        let schemes = Registry::builtin()
            .schemes()
            .filter_map(|scheme| {
                let signer = scheme
                    .build_signer(&given, Duration::ZERO, signing)
                    .map_err(|e| flag_error(scheme.name(), true, &e));
                let probe = match &signer {
                    Ok(verifier) => Arc::clone(verifier),
                    // A scheme that needs more than a secret (a config's keys, a --key) is
                    // never one a line can be signed with here, so it is never a candidate.
                    Err(_) => match scheme.build_signer(&probe, Duration::ZERO, signing) {
                        Ok(probe) => probe,
                        Err(_) => {
                            beyond.push(scheme.name());
                            return None;
                        }
                    },
                };
                Some(Detectable {
                    scheme: scheme.name(),
                    probe,
                    signer,
                })
            })
            .collect();
        Signer::Detect { schemes, beyond }
    }

    /// The verifier that signs a capture line of `source` with these kept headers, body and
    /// event id: the source's (as [`Signer::for_source`]), or with `--secret` alone the
    /// scheme the headers show.
    ///
    /// # Errors
    /// As [`Signer::for_entry`]; `unknown_scheme` when the headers
    /// show no one scheme; `unusable_secret` when the scheme they show cannot use the secret.
    pub fn for_capture(
        &self,
        source: &str,
        headers: &[(String, String)],
        body: &[u8],
        event_id: &str,
    ) -> Result<&Verifier, Unsigned> {
        let Signer::Detect { schemes, beyond } = self else {
            return self.for_entry(source);
        };
        let fits: Vec<&Detectable> = schemes
            .iter()
            .filter(|s| providers::fits_capture(s.probe.as_ref(), headers, body, event_id))
            .collect();
        match fits.as_slice() {
            [one] => one.signer.as_ref().map_err(|why| {
                (
                    "unusable_secret",
                    format!("a {} delivery, but {why}", one.scheme),
                )
            }),
            [] => {
                let named: Vec<&str> = headers
                    .iter()
                    .map(|(name, _)| name.as_str())
                    .filter(|name| !name.eq_ignore_ascii_case("content-type"))
                    .collect();
                let kept = if named.is_empty() {
                    "it kept no signature header".to_owned()
                } else {
                    format!("its headers ({}) are no one scheme's", named.join(", "))
                };
                // A line of a scheme that needs more than a secret (a bb115 run: a Square
                // line was said to carry "no one scheme's" headers) is one of these.
                Err((
                    "unknown_scheme",
                    format!(
                        "cannot tell which scheme signs this {source} delivery ({kept}) among \
                         those a secret alone signs for; {} sign with more than a secret (a \
                         config's public_url or webhook_id, a --key): add --scheme NAME (or \
                         give --config FILE, which has what they need)",
                        beyond.join(", ")
                    ),
                ))
            }
            several => {
                let names: Vec<&str> = several.iter().map(|s| s.scheme).collect();
                Err((
                    "unknown_scheme",
                    format!(
                        "this {source} delivery's headers fit several schemes ({}): add \
                         --scheme NAME (or give --config FILE)",
                        names.join(", ")
                    ),
                ))
            }
        }
    }

    /// [`Signer::for_source`] for a replay's entry, with the tool's error code:
    /// `secret_not_set` when the source's secret variable is not set here, `cannot_sign` when
    /// the config has the source but it cannot sign with what the command line gives (no
    /// `--key` where it signs with a private key, one of another type or not among its
    /// `public_keys`, no `--cert-url`), `source_not_configured` otherwise.
    ///
    /// # Errors
    /// As [`Signer::for_source`].
    pub fn for_entry(&self, source: &str) -> Result<&Verifier, Unsigned> {
        match self {
            Signer::Config { unset, .. } if unset.contains_key(source) => {
                Err(("secret_not_set", unset[source].clone()))
            }
            Signer::Config { verifiers, .. } => match verifiers.get(source) {
                Some(Ok(verifier)) => Ok(verifier),
                Some(Err(why)) => Err(("cannot_sign", why.clone())),
                None => self
                    .for_source(source)
                    .map_err(|why| ("source_not_configured", why)),
            },
            _ => self
                .for_source(source)
                .map_err(|why| ("source_not_configured", why)),
        }
    }

    /// The verifier that signs `source`'s deliveries.
    ///
    /// # Errors
    /// The config has no such source; `--secret` without `--scheme`, which can sign only
    /// capture lines ([`Signer::for_capture`]).
    pub fn for_source(&self, source: &str) -> Result<&Verifier, String> {
        match self {
            Signer::Flags(verifier) => Ok(verifier),
            Signer::Detect { .. } => Err(
                "--secret without --scheme signs only capture lines, whose headers tell the \
                 scheme: add --scheme NAME"
                    .to_owned(),
            ),
            Signer::Config { verifiers, unset } => match verifiers.get(source) {
                Some(Ok(verifier)) => Ok(verifier),
                Some(Err(why)) => Err(why.clone()),
                None if unset.contains_key(source) => Err(unset[source].clone()),
                None if verifiers.is_empty() && unset.is_empty() => Err(format!(
                    "no source {source:?} to sign with: the config read has no sources at all \
                     (without --config it is $HOOKBOX_CONFIG, then ./hookbox.toml, which may not \
                     be there): give --config FILE, or --scheme and --secret"
                )),
                None => {
                    let mut names: Vec<&str> = verifiers
                        .keys()
                        .chain(unset.keys())
                        .map(String::as_str)
                        .collect();
                    names.sort_unstable();
                    Err(format!(
                        "the config has no source {source:?} to sign with (it has {}): give \
                         the right --config FILE, or --scheme and --secret",
                        names.join(", ")
                    ))
                }
            },
        }
    }
}

/// What `--scheme NAME` with or without `--secret` has wrong, as the flags name it.
fn flag_error(name: &str, secret_given: bool, e: &ProviderError) -> String {
    match e.key.as_str() {
        "secrets" if secret_given => format!("--secret: {}", e.problem),
        "secrets" => format!(
            "--scheme: {name} signs with a secret: give --secret ({})",
            e.problem
        ),
        flag if flag.starts_with("--") => e.to_string(),
        // A scheme that exists only as a config source's (hmac, hmac-sha256).
        "scheme" => format!(
            "--scheme: {}: give --config with that source (and --source) instead",
            e.problem
        ),
        key => format!(
            "--scheme: {name} signs with its source's {key}, which only a config has: \
             give --config instead ({})",
            e.problem
        ),
    }
}

/// The id and type a body will be received under: read from the body where the scheme keeps
/// them there, else the given ones (which then travel in headers).
pub fn identity(
    verifier: &Verifier,
    body: &[u8],
    event_id: Option<&str>,
    event_type: Option<&str>,
) -> Identity {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let no_headers: Vec<(String, String)> = Vec::new();
    let from_body = verifier.identify_body(&no_headers, body, json.as_ref());
    Identity {
        // The scheme finds the id in the body (or derives it from it), whatever a header says.
        event_id: if verifier.id_in_body() {
            from_body.event_id
        } else {
            event_id.map(str::to_owned)
        },
        event_type: event_type.map(str::to_owned).or(from_body.event_type),
    }
}

/// The `Content-Type` a signed delivery goes out with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentType {
    /// A capture line's: the one it kept, or none when it kept none (as the provider sent it),
    /// unless the scheme rewrites the body in a format of its own (Braintree's form).
    Captured(Option<String>),
    /// A body of `send` or a `.json` body file: the scheme's own format where it has one,
    /// else JSON.
    Default,
}

/// `body` signed at `timestamp` (unix seconds) as the scheme sends it: its headers, with the id
/// and type headers where the scheme has them, and `Content-Type` as `content_type` says, the
/// body (which a scheme that signs inside it rewrites) and the query the scheme puts on the
/// URL. One stored item of a batch scheme (as `export` writes it) is sent as a delivery of one,
/// wrapped as the provider would send it.
pub fn signed(
    verifier: &Verifier,
    body: &[u8],
    timestamp: i64,
    identity: &Identity,
    content_type: &ContentType,
) -> Signed {
    let body = verifier.as_delivery(body);
    let mut signed = verifier.sign_delivery(
        &body,
        timestamp,
        identity.event_id.as_deref().unwrap_or_default(),
        identity.event_type.as_deref(),
    );
    let content_type = match content_type {
        ContentType::Captured(Some(captured)) => Some(captured.as_str()),
        ContentType::Captured(None) => signed.content_type,
        ContentType::Default => Some(signed.content_type.unwrap_or("application/json")),
    };
    if let Some(content_type) = content_type {
        signed
            .headers
            .push(("Content-Type".to_owned(), content_type.to_owned()));
    }
    signed
}

/// `url` with the query a signed delivery carries, after any the URL has.
pub fn with_query(url: &str, query: Option<&str>) -> String {
    match query {
        None | Some("") => url.to_owned(),
        Some(query) if url.contains('?') => format!("{url}&{query}"),
        Some(query) => format!("{url}?{query}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_name_a_builtin_scheme_and_hmac_sha256_needs_a_config() {
        assert!(Signer::from_flags("github", Some(Secret::new("s")), &Signing::default()).is_ok());
        let error = Signer::from_flags("hmac-sha256", Some(Secret::new("s")), &Signing::default())
            .expect_err("refused");
        assert_eq!(
            error,
            "--scheme: the hmac-sha256 scheme takes its signature header, encoding and event id \
             from a config source: give --config with that source (and --source) instead"
        );
        let error = Signer::from_flags("papyal", Some(Secret::new("s")), &Signing::default())
            .expect_err("refused");
        assert!(error.contains("stripe, standard"), "{error}");
        let error = Signer::from_flags("paypal", Some(Secret::new("s")), &Signing::default())
            .expect_err("refused");
        assert!(
            error.contains("webhook_id") && error.contains("--config"),
            "{error}"
        );
        let error = Signer::from_flags(
            "standard",
            Some(Secret::new("whsec_!!")),
            &Signing::default(),
        )
        .expect_err("refused");
        assert!(error.starts_with("--secret"), "{error}");
    }

    #[test]
    fn secret_alone_tells_each_line_by_its_kept_headers_and_id() {
        let signer = Signer::detecting(
            Secret::new("whsec_AAECAwQFBgcICQoLDA0ODw=="),
            &Signing::default(),
        );
        let kept = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect()
        };
        let scheme = |headers: &[(String, String)], body: &[u8], id: &str| {
            signer
                .for_capture("src", headers, body, id)
                .map(|verifier| verifier.scheme())
        };
        let body = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
        let hub = ("x-hub-signature-256", "sha256=00");
        let typed = ("content-type", "application/json");
        assert_eq!(
            scheme(
                &kept(&[("stripe-signature", "t=1,v1=00"), typed]),
                body,
                "evt_1"
            ),
            Ok("stripe")
        );
        let github = kept(&[
            hub,
            ("x-github-delivery", "d-1"),
            ("x-github-event", "push"),
        ]);
        assert_eq!(scheme(&github, body, "d-1"), Ok("github"));
        // The same signature header alone, under Meta's id (the body's hash), is Meta's.
        let meta_id = crate::providers::body_hash_id(body);
        assert_eq!(scheme(&kept(&[hub]), body, &meta_id), Ok("meta"));
        let standard = kept(&[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", "1"),
            ("webhook-signature", "v1,AA=="),
        ]);
        assert_eq!(scheme(&standard, body, "msg_1"), Ok("standard"));
        for (headers, id) in [
            (kept(&[("x-acme-signature", "00")]), "evt_1"),
            (kept(&[typed]), "evt_1"),
            (kept(&[hub]), "not-the-hash"),
        ] {
            let (code, message) = scheme(&headers, body, id).expect_err("cannot tell");
            assert_eq!(code, "unknown_scheme");
            assert!(message.contains("add --scheme"), "{message}");
        }
        // A scheme told, whose secret the given one cannot be: said so, not "unknown".
        let stripe_secret =
            Signer::detecting(Secret::new("whsec_not base64!"), &Signing::default());
        let (code, message) = stripe_secret
            .for_capture("src", &standard, body, "msg_1")
            .expect_err("a standard secret is base64");
        assert_eq!(code, "unusable_secret", "{message}");
        assert!(message.starts_with("a standard delivery"), "{message}");
    }

    #[test]
    fn a_header_id_scheme_carries_the_given_id_and_a_body_id_scheme_reads_its_own() {
        let Signer::Flags(github) =
            Signer::from_flags("github", Some(Secret::new("s")), &Signing::default()).expect("ok")
        else {
            unreachable!("from_flags builds Flags")
        };
        let found = identity(&github, b"{}", Some("d-1"), Some("push"));
        assert_eq!(found.event_id.as_deref(), Some("d-1"));
        let headers = signed(&github, b"{}", 0, &found, &ContentType::Default).headers;
        assert!(headers.contains(&("X-GitHub-Delivery".to_owned(), "d-1".to_owned())));
        assert!(headers.contains(&("X-GitHub-Event".to_owned(), "push".to_owned())));
        assert!(headers.contains(&("Content-Type".to_owned(), "application/json".to_owned())));

        let Signer::Flags(stripe) =
            Signer::from_flags("stripe", Some(Secret::new("s")), &Signing::default()).expect("ok")
        else {
            unreachable!("from_flags builds Flags")
        };
        let body = br#"{"id":"evt_9","type":"charge.succeeded"}"#;
        let found = identity(&stripe, body, Some("ignored"), None);
        assert_eq!(found.event_id.as_deref(), Some("evt_9"));
        assert_eq!(found.event_type.as_deref(), Some("charge.succeeded"));
        let captured = ContentType::Captured(Some("text/plain".to_owned()));
        let headers = signed(&stripe, body, 0, &found, &captured).headers;
        assert_eq!(stripe.verify(&headers, body, 0), Ok(()));
        assert!(headers.contains(&("Content-Type".to_owned(), "text/plain".to_owned())));
        let headers = signed(&stripe, body, 0, &found, &ContentType::Captured(None)).headers;
        assert!(!headers.iter().any(|(name, _)| name == "Content-Type"));
    }
}
