//! The claim of a delivery that carries several events (a batch: Adyen, GoCardless): every item
//! is an event of its own, and all of them are claimed in one transaction.
//!
//! The items are claimed by one INSERT ([`events::claim`]), in (event id) order, so two
//! deliveries that share items never wait on each other in opposite orders; an item another
//! transaction holds makes the INSERT wait for it, as a single event's claim does. An item already committed is not processed again,
//! and its stored answer stands; an item stored with another fingerprint refuses the whole
//! delivery ([`BatchOutcome::Mismatch`], everything rolled back). Then the handler runs for each
//! claimed item, in the delivery's order, and its response is stored with the item (and an
//! outbox row queued, where the source forwards). A handler failure on any item rolls the whole
//! delivery back.

use diesel::result::Error as DieselError;

use super::{answer, event, new_event, run_handler, ClaimError, Delivery, StoredResponse};
use crate::db::{self, deliveries, events, AnyConnection};
use crate::handlers::Handler;

/// What claiming a batch came to.
#[derive(Debug)]
pub enum BatchOutcome {
    /// At least one item was claimed and processed by this delivery. The answers are in the
    /// delivery's order: the new ones, and the stored ones of items stored before.
    Claimed(Vec<StoredResponse>),
    /// Every item was stored before: their stored answers, in the delivery's order.
    Replay(Vec<StoredResponse>),
    /// Another delivery holding one of the items was still in its transaction after the
    /// in-flight wait.
    InFlight,
    /// On SQLite: the write lock stayed with another writer past the in-flight wait.
    Busy,
    /// On PostgreSQL: the wait was for a table another session holds locked.
    Locked,
    /// An item's id is stored with another payload (or repeats in the delivery with another
    /// payload): nothing of the delivery is stored.
    Mismatch,
}

/// Why a batch's transaction was rolled back.
enum Abort {
    /// The handler or the database failed.
    Failed(ClaimError),
    /// An item's id is stored with another payload.
    Mismatch,
    /// A conflicting row vanished (purged) before its answer was read: try again.
    Vanished,
}

impl From<DieselError> for Abort {
    fn from(error: DieselError) -> Self {
        Abort::Failed(ClaimError::Database(error))
    }
}

impl From<ClaimError> for Abort {
    fn from(error: ClaimError) -> Self {
        Abort::Failed(error)
    }
}

/// Claims, processes and stores every item of one delivery in one transaction, or finds their
/// stored answers. `items` is in the delivery's order and not empty.
pub fn claim_batch(
    conn: &mut db::Conn,
    items: &[Delivery],
    handler: &dyn Handler,
) -> Result<BatchOutcome, ClaimError> {
    let Some(deadline) = items.iter().map(|item| item.deadline).min() else {
        return Ok(BatchOutcome::Replay(Vec::new()));
    };
    let Ok(_turn) = conn.write_turn(deadline) else {
        return Ok(BatchOutcome::Busy);
    };
    conn.waiting_until(deadline, |conn| {
        // Round twice only when a stored row vanished between the conflict and its read.
        for _ in 0..2 {
            let claimed = db::write_transaction(conn, |conn| {
                claim_in_transaction(conn, items, handler, deadline)
            });
            match claimed {
                Ok(outcome) => return Ok(outcome),
                Err(Abort::Mismatch) => return Ok(BatchOutcome::Mismatch),
                Err(Abort::Vanished) => continue,
                Err(Abort::Failed(ClaimError::Database(e))) if db::sqlite::is_busy(&e) => {
                    return Ok(BatchOutcome::Busy)
                }
                Err(Abort::Failed(ClaimError::Database(e)))
                    if db::is_lock_timeout(&e) || db::pg::is_statement_timeout(&e) =>
                {
                    return Ok(match db::tables_locked(conn) {
                        true => BatchOutcome::Locked,
                        false => BatchOutcome::InFlight,
                    })
                }
                // As for one event (`inbox::claim_within`): a batch whose every item is
                // stored is answered from what is stored though the store refuses writes (an
                // Adyen redelivery, always a batch, was a 503 on a full disk, found by a
                // black-box run).
                Err(Abort::Failed(ClaimError::Database(e))) if super::write_refused(&e) => {
                    return match stored_batch(conn, items) {
                        Ok(Some(outcome)) => Ok(outcome),
                        _ => Err(ClaimError::Database(e)),
                    };
                }
                Err(Abort::Failed(e)) => return Err(e),
            }
        }
        Err(ClaimError::Database(DieselError::NotFound))
    })
}

/// The answer of a batch from what is stored alone, reads only: its replay when every item is
/// stored, a mismatch when one is stored with another payload; `None` when an item is not
/// stored (the batch needs its write).
fn stored_batch(
    conn: &mut AnyConnection,
    items: &[Delivery],
) -> Result<Option<BatchOutcome>, ClaimError> {
    let mut answers = Vec::with_capacity(items.len());
    for item in items {
        match super::stored(conn, item)? {
            Some(super::Outcome::Replay(stored) | super::Outcome::BodyReplay { stored, .. }) => {
                answers.push(stored);
            }
            Some(super::Outcome::Mismatch) => return Ok(Some(BatchOutcome::Mismatch)),
            _ => return Ok(None),
        }
    }
    Ok(Some(BatchOutcome::Replay(answers)))
}

/// Where an item's answer comes from.
enum Slot {
    /// Claimed now, in this row: the handler answers it.
    Claimed(i64),
    /// Stored before: its answer.
    Stored(StoredResponse),
    /// The same id (and payload) as the item at this index of the delivery.
    SameAs(usize),
}

fn claim_in_transaction(
    conn: &mut AnyConnection,
    items: &[Delivery],
    handler: &dyn Handler,
    deadline: std::time::Instant,
) -> Result<BatchOutcome, Abort> {
    // Each item its own time, in the delivery's order (see `received_times`).
    let received_at = super::received_times(items.len());
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|a, b| items[*a].event_id.as_str().cmp(items[*b].event_id.as_str()));
    let mut slots: Vec<Option<Slot>> = (0..items.len()).map(|_| None).collect();
    // Each id once, in id order; a repeat is the same item, unless its payload differs.
    let mut unique: Vec<usize> = Vec::with_capacity(items.len());
    for index in order {
        let item = &items[index];
        match unique.last() {
            Some(&first) if items[first].event_id == item.event_id => {
                if items[first].fingerprint != item.fingerprint {
                    return Err(Abort::Mismatch);
                }
                slots[index] = Some(Slot::SameAs(first));
            }
            _ => unique.push(index),
        }
    }
    let rows: Vec<_> = unique
        .iter()
        .map(|index| new_event(&items[*index], received_at[*index], None))
        .collect();
    // The whole INSERT within the deadline, however many claims it waits behind in turn.
    let claimed = db::within_deadline(conn, deadline, |conn| events::claim(conn, &rows))?;
    for index in unique {
        let item = &items[index];
        let row = claimed
            .iter()
            .find(|claimed| claimed.event_id == item.event_id.as_str())
            .map(|claimed| claimed.row);
        slots[index] = Some(match row {
            Some(row) => Slot::Claimed(row),
            None => Slot::Stored(stored(conn, item)?),
        });
    }
    let slots: Vec<Slot> = slots
        .into_iter()
        .map(|slot| slot.expect("every item has a slot"))
        .collect();
    let mut claimed_any = false;
    let mut answers: Vec<Option<StoredResponse>> = vec![None; items.len()];
    // The handler runs in the delivery's order.
    for (index, slot) in slots.iter().enumerate() {
        match slot {
            Slot::Claimed(row) => {
                claimed_any = true;
                let item = &items[index];
                let response = run_handler(handler, conn, &event(item, *row, received_at[index]))?;
                events::set_answer(conn, *row, &answer(&response))?;
                if !item.forward.is_empty() {
                    deliveries::enqueue(conn, *row, &item.forward)?;
                }
                answers[index] = Some(StoredResponse::new(response, received_at[index]));
            }
            Slot::Stored(stored) => answers[index] = Some(stored.clone()),
            Slot::SameAs(_) => {}
        }
    }
    // An id repeated in the delivery has the answer of its first appearance.
    let answers: Vec<StoredResponse> = slots
        .iter()
        .enumerate()
        .map(|(index, slot)| {
            let from = match slot {
                Slot::SameAs(first) => *first,
                _ => index,
            };
            answers[from].clone().expect("every item is answered")
        })
        .collect();
    Ok(if claimed_any {
        BatchOutcome::Claimed(answers)
    } else {
        BatchOutcome::Replay(answers)
    })
}

/// The stored answer of an item another transaction committed: by its id (another fingerprint
/// is a mismatch), or for a source that dedupes by body, by its payload's key.
fn stored(conn: &mut AnyConnection, item: &Delivery) -> Result<StoredResponse, Abort> {
    match super::stored(conn, item)? {
        Some(super::Outcome::Replay(stored)) => Ok(stored),
        Some(super::Outcome::BodyReplay { stored, .. }) => Ok(stored),
        Some(super::Outcome::Mismatch) => Err(Abort::Mismatch),
        Some(_) => Err(Abort::Failed(ClaimError::Database(DieselError::NotFound))),
        None => Err(Abort::Vanished),
    }
}
