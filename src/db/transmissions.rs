//! The owner of the `transmissions` table: for a scheme whose signature covers a transmission id
//! beside only a checksum of the body (PayPal's CRC32, see
//! [`Provider::transmission_id`](crate::providers::Provider::transmission_id)), each
//! transmission id bound to the one source, event id and body it may carry. A body forged to a
//! genuine delivery's CRC32 and sent with its headers verifies; it is refused because it is not
//! the body the transmission id is bound to (whatever event id it names), and so is the genuine
//! delivery sent to another source. Transmission ids are the provider's, unique across its
//! webhooks, so the key is the id alone. Every instance sharing the store shares the bindings,
//! and the primary key settles two that race.
//!
//! A binding is written for every delivery whose signature matched (the one that stores its
//! event, and every replay after it, each of which a retry or a resend brings under a new
//! transmission id) and for one whose check waited on a certificate that could not be fetched
//! (answered 503, so its headers are out in the world with a signature that will verify once
//! the certificate can be had). Rows go with the source's events, at the same retention window
//! ([`purge`]).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::Text;

use super::{on_backend, AnyConnection};

/// What a transmission id is bound to: the source, event id and body (its SHA-256) of the
/// first delivery that came with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// The source it came to.
    pub source: String,
    /// Its event id.
    pub event_id: String,
    /// The SHA-256 of its raw body.
    pub body_sha256: Vec<u8>,
}

/// Binds `transmission_id` to `delivery`, unless it is bound already, and returns what it is
/// bound to: `delivery` itself when the delivery may go on, another when it must be refused
/// (another body, event or source under the same transmission). One statement, committed on
/// its own: a binding whose claim then fails stays, and the provider's retry of the same
/// delivery passes it.
pub fn bind(
    conn: &mut AnyConnection,
    transmission_id: &str,
    delivery: &Bound,
    now: DateTime<Utc>,
) -> QueryResult<Bound> {
    // The no-op update makes a conflicting insert return the row already there.
    let (source, event_id, body_sha256) = on_backend!(conn, c => diesel::insert_into(transmissions::table)
        .values((
            transmissions::transmission_id.eq(transmission_id),
            transmissions::source.eq(&delivery.source),
            transmissions::event_id.eq(&delivery.event_id),
            transmissions::body_sha256.eq(&delivery.body_sha256),
            transmissions::seen_at.eq(now),
        ))
        .on_conflict(transmissions::transmission_id)
        .do_update()
        .set(transmissions::source.eq(transmissions::source))
        .returning((
            transmissions::source,
            transmissions::event_id,
            transmissions::body_sha256,
        ))
        .get_result::<(String, String, Vec<u8>)>(c))?;
    Ok(Bound {
        source,
        event_id,
        body_sha256,
    })
}

/// The event an older hookbox bound `transmission_id` to, if one did, under one of `sources`
/// (those of the scheme), with the source it is under. Releases of 2026-12-05 and 6 (before
/// this table) kept the binding in the event's own row: `events.dedupe_key` set to the SHA-256
/// of `transmission:` and the id, for the event that came with it. Those rows stay for the
/// source's retention window after an upgrade, and an older instance may still write them
/// while a rolling deploy runs, so a delivery is also held against them (a black-box run stored
/// a body forged to the CRC32 of a delivery the older release had taken, sent with its headers
/// to this one).
pub fn bound_by_an_older_release(
    conn: &mut AnyConnection,
    sources: &[String],
    transmission_id: &str,
) -> QueryResult<Option<(String, super::events::Stored)>> {
    use sha2::{Digest, Sha256};
    let mut key = Sha256::new();
    key.update(b"transmission:");
    key.update(transmission_id.as_bytes());
    let key: [u8; 32] = key.finalize().into();
    for source in sources {
        if let Some(stored) = super::events::answer_by_key(conn, source, &key)? {
            return Ok(Some((source.clone(), stored)));
        }
    }
    Ok(None)
}

/// Removes the bindings seen before `cutoff`: of `source`, or with `None` of every source not
/// in `named` (those have windows of their own), as the retention pass removes events. Returns
/// the transmission ids removed.
pub fn purge(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Gone {
        #[diesel(sql_type = Text)]
        transmission_id: String,
    }
    let sql = format!(
        "DELETE FROM transmissions WHERE {} RETURNING transmission_id",
        super::purge_filter(conn, source, "seen_at")
    );
    let gone: Vec<Gone> = super::purge_statement(conn, &sql, source, named, cutoff, None)?;
    Ok(gone.into_iter().map(|row| row.transmission_id).collect())
}
