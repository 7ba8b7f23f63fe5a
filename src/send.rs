//! `hookbox send`: signs one body the way the source's provider would and posts it, a local
//! stand-in for `stripe trigger`. It prints the status, whether the receiver had seen the event
//! before, and the answer's body.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::web::Bytes;
use sha2::{Digest, Sha256};

use crate::ids::SourceName;
use crate::providers::unix_now;
use crate::replay::client::{self, Request};
use crate::replay::{signing, Signer, Target};

/// What `hookbox send` was asked to do.
#[derive(Debug)]
pub struct SendOptions {
    /// Where to send.
    pub to: Target,
    /// The source: the URL's `{source}`, and (with a config) the scheme and secret.
    pub source: SourceName,
    /// The keys.
    pub signer: Signer,
    /// The event id, for schemes whose id travels in a header; generated when absent.
    pub event_id: Option<String>,
    /// The event type, for schemes whose type travels in a header.
    pub event_type: Option<String>,
    /// The raw body, sent byte for byte.
    pub body: Vec<u8>,
}

/// Why `send` did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The options do not fit the scheme (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The receiver could not be reached (exit 1).
    #[error("{0}")]
    Network(String),
}

/// `body` signed as the source's provider would, now, for `event_id` and `event_type`, with
/// the identity it was signed under.
fn signed_now(
    verifier: &signing::Verifier,
    body: &[u8],
    event_id: &str,
    event_type: Option<&str>,
) -> (crate::providers::Identity, crate::providers::Signed) {
    let identity = signing::identity(verifier, body, Some(event_id), event_type);
    let signed = signing::signed(
        verifier,
        body,
        unix_now(),
        &identity,
        &signing::ContentType::Default,
    );
    (identity, signed)
}

/// The event type the receiver reads from `signed`.
fn type_read(verifier: &signing::Verifier, signed: &crate::providers::Signed) -> Option<String> {
    let json: Option<serde_json::Value> = serde_json::from_slice(&signed.body).ok();
    verifier
        .identify_body(&signed.headers, &signed.body, json.as_ref())
        .event_type
}

/// Whether `--event-type` would have travelled in a header of the scheme's (as GitHub's
/// `X-GitHub-Event`): signed with a stand-in type, does the receiver read it back?
fn type_travels_in_a_header(verifier: &signing::Verifier, body: &[u8]) -> bool {
    const STAND_IN: &str = "hookbox.send.type";
    type_read(
        verifier,
        &signed_now(verifier, body, "id", Some(STAND_IN)).1,
    )
    .as_deref()
        == Some(STAND_IN)
}

/// Signs and posts the body, writes what came back to `out`, and returns whether it was a 2xx.
///
/// # Errors
/// [`SendError::Usage`] for `--event-id` or `--event-type` where the body carries the id or the
/// type, or a source the config lacks; [`SendError::Network`] when no answer came, after the retries.
pub fn run(options: &SendOptions, out: &mut dyn Write) -> Result<bool, SendError> {
    let verifier = options
        .signer
        .for_source(options.source.as_str())
        .map_err(SendError::Usage)?;
    if verifier.id_in_body() && options.event_id.is_some() {
        // A scheme whose provider sends no id derives one from the body's bytes: there is no
        // id in it to change (a black-box run was told to change one).
        let derived = signing::identity(verifier, &options.body, None, None)
            .event_id
            .is_some_and(|id| id.starts_with("sha256:"));
        return Err(SendError::Usage(if derived {
            format!(
                "the {} scheme derives the event id from the body (sha256: and the hash of its \
                 bytes), so --event-id does not apply; another body is another event",
                verifier.scheme()
            )
        } else {
            format!(
                "the {} scheme reads the event id from the body, so --event-id does not \
                 apply; change the id in the body instead",
                verifier.scheme()
            )
        }));
    }
    // An empty id (`--event-id "$(uuidgen)"` where uuidgen is missing) is refused here, not
    // sent for the receiver to refuse.
    if options
        .event_id
        .as_deref()
        .is_some_and(|id| id.trim().is_empty())
    {
        return Err(SendError::Usage(
            "--event-id is empty: give an id, or leave the flag out for a fresh one; nothing \
             was sent"
                .to_owned(),
        ));
    }
    if let Some(why) = verifier.unsignable(&options.body) {
        return Err(SendError::Usage(format!(
            "{why}; nothing was sent (add the field to the body)"
        )));
    }
    let event_id = options.event_id.clone().unwrap_or_else(generated_id);
    let (identity, signed) = signed_now(
        verifier,
        &options.body,
        &event_id,
        options.event_type.as_deref(),
    );
    // Read back as the receiver reads it: a type the scheme takes from the body is not the
    // flag's, and sending it anyway would store another type than the one asked for.
    if let Some(wanted) = options.event_type.as_deref() {
        if type_read(verifier, &signed).as_deref() != Some(wanted) {
            return Err(SendError::Usage(format!(
                "the {} scheme reads the event type from the body, so --event-type does not \
                 apply; change the type in the body instead",
                verifier.scheme()
            )));
        }
    } else if type_read(verifier, &signed).is_none()
        && type_travels_in_a_header(verifier, &options.body)
    {
        // GitHub, GitLab and the like always send their type header; without it the event
        // is stored with no type, which filters and `events` patterns then never match.
        errln!(
            "hookbox: the {} scheme takes the event type from a header, and without \
             --event-type none is sent: the event is stored with no type, and forward \
             targets with `events` patterns will not match it (give one, e.g. \
             --event-type push)",
            verifier.scheme()
        );
    }
    // As the receiver reads what is sent: the id of a scheme that derives it from the signed
    // body (Braintree's form), and whether it is a handshake (answered, never stored).
    let json: Option<serde_json::Value> = serde_json::from_slice(&signed.body).ok();
    let read = verifier.identify_body(&signed.headers, &signed.body, json.as_ref());
    let handshake = verifier
        .handshake(
            &crate::providers::Inbound {
                method: "POST",
                query: signed.query.as_deref().unwrap_or_default(),
                headers: &signed.headers,
                body: &signed.body,
                now: unix_now(),
            },
            json.as_ref(),
        )
        .is_some();
    // A header HTTP cannot carry (a CR or LF in --event-id or --event-type) is the command
    // line's to change, as replay says before it sends anything.
    for (name, value) in &signed.headers {
        client::header_pair(name, value).map_err(|e| {
            SendError::Usage(format!(
                "{e}: check --event-id and --event-type; nothing was sent"
            ))
        })?;
    }
    let request = Request {
        url: signing::with_query(
            &options.to.url_for(options.source.as_str()),
            signed.query.as_deref(),
        ),
        headers: signed.headers,
        body: Bytes::from(signed.body),
    };
    let answer = actix_web::rt::System::new()
        .block_on(async {
            // One delivery, by hand: say why it is taking a while.
            let on_busy = |retry: u32, wait: Duration| {
                errln!(
                    "hookbox: 409 in_progress (another delivery of this event is being \
                     processed, or the store is busy); trying again in {} ({retry} of {})",
                    crate::config::Spelt(wait),
                    client::IN_PROGRESS_RETRIES
                );
            };
            client::deliver(&client::client(), &request, &on_busy).await
        })
        .map_err(SendError::Network)?;

    // GoCardless's 498 has no standard phrase: the line is then `498: rejected ...`.
    let reason = awc::http::StatusCode::from_u16(answer.status)
        .ok()
        .and_then(|status| status.canonical_reason())
        .map_or_else(String::new, |phrase| format!(" {phrase}"));
    let verdict = match answer.status {
        200..=299 if answer.replayed => {
            "replayed (Idempotent-Replayed: true; the answer stored when it was first processed)"
                .to_owned()
        }
        200..=299 if handshake => {
            "answered as a handshake (the provider's check of the URL; never stored)".to_owned()
        }
        200..=299 => "processed".to_owned(),
        status => {
            // As replay counts it: a 4xx refused the delivery, anything else (a redirect, a
            // 5xx) failed it.
            let kind = if (400..500).contains(&status) {
                "rejected"
            } else {
                "failed"
            };
            match answer.error_code() {
                Some(code) => format!("{kind} ({code})"),
                None => kind.to_owned(),
            }
        }
    };
    let event = if handshake {
        "a handshake".to_owned()
    } else {
        let id = read.event_id.or(identity.event_id);
        format!("event {}", id.as_deref().unwrap_or("-"))
    };
    let written = writeln!(
        out,
        "POST {} ({event})",
        crate::redact::target_url(&request.url)
    )
    .and_then(|()| writeln!(out, "{}{reason}: {verdict}", answer.status))
    .and_then(|()| match answer.location.as_deref() {
        // An empty body says nothing of where it went: replay's sentence, with the Location.
        Some(_) if (300..400).contains(&answer.status) => writeln!(out, "{}", answer.message()),
        _ => out.write_all(&answer.body),
    })
    .and_then(|()| writeln!(out));
    // The answer came; a closed stdout is no reason to report otherwise.
    drop(written);
    if answer.error_code().as_deref() == Some("invalid_signature") {
        // As replay says it: the receiver's answer cannot say which side holds the wrong one.
        errln!(
            "hookbox: the receiver checks with another secret than send signed with (the \
             source's first secret in --config, or --secret), or wants a header the scheme \
             signs and this body lacks, or credentials it also checks (Adyen's basic_auth, \
             which send takes only from --config): give the receiver's config or secret"
        );
    }
    Ok((200..300).contains(&answer.status))
}

/// A fresh event id, `evt_` and 24 hex digits. Not a secret, only unique: the clock, the
/// process and a counter, hashed.
pub fn generated_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut hash = Sha256::new();
    hash.update(nanos.to_le_bytes());
    hash.update(std::process::id().to_le_bytes());
    hash.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    format!("evt_{}", &hex::encode(hash.finalize())[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_differ_and_look_like_event_ids() {
        let (a, b) = (generated_id(), generated_id());
        assert_ne!(a, b);
        assert!(a.starts_with("evt_") && a.len() == 28, "{a}");
    }
}
