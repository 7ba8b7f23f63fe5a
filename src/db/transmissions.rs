//! The owner of the `transmissions` table: for a scheme whose signature covers a transmission id
//! beside only a checksum of the body (PayPal's CRC32, see
//! [`Provider::transmission_id`](crate::providers::Provider::transmission_id)), each
//! transmission id bound to the one event id it may carry. A body forged to a genuine
//! delivery's CRC32 and sent with its headers verifies; it is refused because its event id is
//! not the one the transmission id is bound to. Every instance sharing the store shares the
//! bindings, and the primary key settles two that race.
//!
//! A binding is written for every delivery whose signature matched (the one that stores its
//! event, and every replay after it, each of which a retry or a resend brings under a new
//! transmission id) and for one whose check waited on a certificate that could not be fetched
//! (answered 503, so its headers are out in the world with a signature that will verify once
//! the certificate can be had). Rows go with the source's events, at the same retention window
//! ([`purge`]).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, Text};

use super::AnyConnection;

/// Binds `transmission_id` of `source` to `event_id`, unless it is bound already, and returns
/// the event id it is bound to: `event_id` when the delivery may go on, another when it must
/// be refused. One statement, committed on its own: a binding whose claim then fails stays, and
/// the provider's retry of the same event passes it.
pub fn bind(
    conn: &mut AnyConnection,
    source: &str,
    transmission_id: &str,
    event_id: &str,
    now: DateTime<Utc>,
) -> QueryResult<String> {
    #[derive(QueryableByName)]
    struct Bound {
        #[diesel(sql_type = Text)]
        event_id: String,
    }
    // The no-op update makes a conflicting insert return the row already there.
    let bound: Bound = match conn {
        AnyConnection::Postgres(c) => diesel::sql_query(
            "INSERT INTO transmissions (source, transmission_id, event_id, seen_at) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (source, transmission_id) DO UPDATE SET source = EXCLUDED.source \
             RETURNING event_id",
        )
        .bind::<Text, _>(source)
        .bind::<Text, _>(transmission_id)
        .bind::<Text, _>(event_id)
        .bind::<super::pg::Instant, _>(now)
        .get_result(c)?,
        AnyConnection::Sqlite(c) => diesel::sql_query(
            "INSERT INTO transmissions (source, transmission_id, event_id, seen_at) \
             VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (source, transmission_id) DO UPDATE SET source = excluded.source \
             RETURNING event_id",
        )
        .bind::<Text, _>(source)
        .bind::<Text, _>(transmission_id)
        .bind::<Text, _>(event_id)
        .bind::<super::sqlite::Instant, _>(now)
        .get_result(c)?,
    };
    Ok(bound.event_id)
}

/// Removes the bindings seen before `cutoff`: of `source`, or with `None` of every source not
/// in `named` (those have windows of their own), as the retention pass removes events.
pub fn purge(
    conn: &mut AnyConnection,
    source: Option<&str>,
    named: &[String],
    cutoff: DateTime<Utc>,
) -> QueryResult<usize> {
    match conn {
        AnyConnection::Postgres(c) => {
            let sql = diesel::sql_query(match source {
                Some(_) => "DELETE FROM transmissions WHERE seen_at < $1 AND source = $2",
                None => "DELETE FROM transmissions WHERE seen_at < $1 AND source <> ALL($2)",
            })
            .bind::<super::pg::Instant, _>(cutoff);
            match source {
                Some(source) => sql.bind::<Text, _>(source).execute(c),
                None => sql.bind::<Array<Text>, _>(named).execute(c),
            }
        }
        AnyConnection::Sqlite(c) => {
            let sql = diesel::sql_query(match source {
                Some(_) => "DELETE FROM transmissions WHERE seen_at < ?1 AND source = ?2",
                None => {
                    "DELETE FROM transmissions WHERE seen_at < ?1 \
                     AND source NOT IN (SELECT value FROM json_each(?2))"
                }
            })
            .bind::<super::sqlite::Instant, _>(cutoff);
            match source {
                Some(source) => sql.bind::<Text, _>(source).execute(c),
                None => {
                    let named = serde_json::to_string(named).expect("a list of strings serializes");
                    sql.bind::<Text, _>(named).execute(c)
                }
            }
        }
    }
}
