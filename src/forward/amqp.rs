//! The `amqp://` and `amqps://` transport (RabbitMQ, AMQP 0-9-1): a publish per attempt on a
//! channel in confirm mode.
//!
//! Each publish is persistent (`delivery_mode = 2`) and `mandatory`, with
//! `message_id = {source}:{event_id}` (or, for a key over AMQP's 255 bytes, `sha256:` and the
//! key's hex digest), `content_type` as the body's, and the `X-Hookbox-*` values as headers.
//! Delivered means the broker's confirm (ack) with nothing returned; a nack, a return (no
//! queue is bound for the routing key), a missing exchange or a lost connection is a retry.
//!
//! One connection and one confirm-mode channel per target, opened when its first delivery is
//! due and shared by its attempts. A channel the broker closed (a publish to an exchange that
//! does not exist does that) is opened again on the next attempt; a connection that dropped
//! likewise, no sooner than a backoff after a failed connect ([`bus::Reconnect`]), so a dead
//! broker costs each attempt nothing but a quick retry.

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::bus;
use super::transport::{hookbox_headers, idempotency_key, Handoff, Transport};
use crate::db::deliveries::Due;
use crate::routing::{self, Template};

/// A target's RabbitMQ: where it is, the exchange and routing key templates, and the link.
pub struct Amqp {
    /// The configured URL, credentials included (lapin logs in with them).
    url: String,
    exchange: Template,
    routing_key: Template,
    link: Mutex<Link>,
}

/// The connection and its confirm-mode channel, once open.
#[derive(Default)]
struct Link {
    connection: Option<Connection>,
    channel: Option<Channel>,
    reconnect: bus::Reconnect,
}

impl Amqp {
    /// The transport of a target at `url` (checked by the config).
    pub fn new(url: &str, exchange: Template, routing_key: Template) -> Amqp {
        Amqp {
            url: url.to_owned(),
            exchange,
            routing_key,
            link: Mutex::default(),
        }
    }

    /// The open confirm-mode channel, opening the connection or the channel first if either
    /// is closed.
    async fn channel(&self) -> Result<Channel, String> {
        let mut link = self.link.lock().await;
        if let Some(channel) = &link.channel {
            if channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        link.channel = None;
        if !link
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected())
        {
            link.connection = None;
            link.reconnect.check()?;
            let properties = ConnectionProperties::default().with_connection_name("hookbox".into());
            match Connection::connect(&self.url, properties).await {
                Ok(connection) => {
                    link.connection = Some(connection);
                    link.reconnect.connected();
                }
                Err(e) => {
                    let error = format!("cannot connect to RabbitMQ: {e}");
                    link.reconnect.failed(error.clone());
                    return Err(error);
                }
            }
        }
        let connection = link.connection.as_ref().expect("opened just above");
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("cannot put the channel in confirm mode: {e}"))?;
        link.channel = Some(channel.clone());
        Ok(channel)
    }

    /// One attempt: publish the event and wait for the broker's confirm. The dispatcher
    /// bounds it by the target's timeout.
    async fn publish(&self, due: &Due) -> Handoff {
        let names = bus::names(due);
        let exchange = self.exchange.render(names);
        let routing_key = self.routing_key.render(names);
        let properties = properties(due);
        let exchange_shown = if exchange.is_empty() {
            "the default exchange".to_owned()
        } else {
            format!("exchange {exchange:?}")
        };
        let attempt = async {
            let channel = self.channel().await?;
            let confirm = channel
                .basic_publish(
                    ShortString::from(exchange.clone()),
                    ShortString::from(routing_key.clone()),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &due.payload,
                    properties,
                )
                .await
                .map_err(|e| format!("the publish failed: {e}"))?;
            confirm
                .await
                .map_err(|e| format!("no confirm from the broker: {e}"))
        };
        let outcome = match attempt.await {
            Err(error) => Err(error),
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(format!(
                "the broker returned the message unroutable ({} {}): no queue is bound to \
                 {exchange_shown} for routing key {routing_key:?}",
                returned.reply_code, returned.reply_text
            )),
            Ok(Confirmation::Nack(_)) => Err(format!(
                "the broker refused the message (nack) on {exchange_shown}"
            )),
            Ok(Confirmation::NotRequested) => Err("the channel was not in confirm mode".to_owned()),
        };
        match outcome {
            Ok(()) => Handoff::Accepted { status: None },
            Err(error) => bus::failed(
                &format!("{error} (routing key {routing_key:?} on {exchange_shown})"),
                &self.url,
            ),
        }
    }
}

/// Shared by the target and every dispatcher thread's lane: one connection and channel.
impl Transport for Arc<Amqp> {
    fn hand_off<'a>(&'a self, due: &'a Due) -> LocalBoxFuture<'a, Handoff> {
        Box::pin(self.publish(due))
    }
}

/// The message's properties: persistent, its key as `message_id`, its media type, and the
/// `X-Hookbox-*` headers.
fn properties(due: &Due) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in hookbox_headers(due) {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(message_id(&idempotency_key(due))))
        .with_headers(headers);
    let content_type = bus::content_type(due);
    // A short string: a media type too long for one is left off rather than cut.
    if content_type.len() <= routing::AMQP_SHORT_STRING {
        properties.with_content_type(ShortString::from(content_type))
    } else {
        properties
    }
}

/// `key` as AMQP can carry it in `message_id`: itself when it fits in 255 bytes, else
/// `sha256:` and its hex digest (the same for every attempt, so a consumer still dedupes on
/// it; `X-Hookbox-Source` and `X-Hookbox-Event-Id` carry the whole key).
fn message_id(key: &str) -> String {
    if key.len() <= routing::AMQP_SHORT_STRING {
        key.to_owned()
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_id_fits_in_a_short_string_and_is_stable() {
        assert_eq!(message_id("stripe:evt_1"), "stripe:evt_1");
        let long = format!("stripe:{}", "x".repeat(300));
        let id = message_id(&long);
        assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
        assert_eq!(id, message_id(&long));
    }
}
