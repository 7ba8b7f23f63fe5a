//! A payments ledger that books each Stripe `payment_intent.succeeded` exactly once.
//!
//! The booking is a row in `ledger_entries`, written on the claim transaction's connection: it
//! commits together with the claim and the stored response, or not at all. A redelivery never
//! reaches the handler (it is answered from the stored response), and a delivery whose
//! transaction fails leaves no booking behind, so "order 101 is charged once" holds however often
//! Stripe retries, and however many of those retries arrive at the same moment.

use diesel::prelude::*;
use hookbox::{AnyConnection, Event, Handler, Response};

diesel::table! {
    ledger_entries (id) {
        id -> Int8,
        event_row -> Int8,
        payment_intent -> Text,
        order_id -> Nullable<Text>,
        amount -> Int8,
        currency -> Text,
    }
}

/// Books successful payments into `ledger_entries`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Ledger;

impl Handler for Ledger {
    fn prepare(&self, conn: &mut AnyConnection) -> anyhow::Result<()> {
        // ON DELETE CASCADE: when the retention purge removes the event, its booking goes too;
        // the UNIQUE is a second guard that one payment intent is booked once. The table's DDL
        // is the one thing that differs between the stores; the handler below is the same.
        let id = match conn {
            AnyConnection::Postgres(_) => "id BIGSERIAL PRIMARY KEY",
            AnyConnection::Sqlite(_) => "id INTEGER PRIMARY KEY AUTOINCREMENT",
        };
        diesel::sql_query(format!(
            "CREATE TABLE IF NOT EXISTS ledger_entries (
                {id},
                event_row BIGINT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
                payment_intent TEXT NOT NULL UNIQUE,
                order_id TEXT,
                amount BIGINT NOT NULL,
                currency TEXT NOT NULL
            )"
        ))
        .execute(conn)?;
        Ok(())
    }

    fn handle(&self, conn: &mut AnyConnection, event: &Event<'_>) -> anyhow::Result<Response> {
        if event.event_type != Some("payment_intent.succeeded") {
            return Ok(Response::processed(event));
        }
        let intent = event
            .json
            .and_then(|json| json.pointer("/data/object"))
            .ok_or_else(|| anyhow::anyhow!("the event has no data.object"))?;
        let payment_intent = intent["id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("the payment intent has no id"))?;
        let amount = intent["amount"]
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("the payment intent has no amount"))?;
        let currency = intent["currency"].as_str().unwrap_or("usd");
        let order_id = intent
            .pointer("/metadata/order_id")
            .and_then(|v| v.as_str());
        diesel::insert_into(ledger_entries::table)
            .values((
                ledger_entries::event_row.eq(event.row_id),
                ledger_entries::payment_intent.eq(payment_intent),
                ledger_entries::order_id.eq(order_id),
                ledger_entries::amount.eq(amount),
                ledger_entries::currency.eq(currency),
            ))
            .execute(conn)?;
        Ok(Response::json(
            200,
            &serde_json::json!({
                "status": "processed",
                "source": event.source.as_str(),
                "event_id": event.event_id.as_str(),
                "event_type": event.event_type,
                "booked": { "payment_intent": payment_intent, "order_id": order_id, "amount": amount, "currency": currency },
            }),
        ))
    }
}
