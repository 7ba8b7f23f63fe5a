//! Makes and removes what `bench/forward.sh`'s bus rows publish into: a JetStream stream and a
//! RabbitMQ topic exchange with one durable queue bound to it, all named `NAME`. hookbox never
//! creates either (see docs/bus-targets.md), so the benchmark does.
//!
//! ```text
//! cargo run --release --example busprep -- up NAME [NATS_URL] [AMQP_URL]
//! cargo run --release --example busprep -- down NAME [NATS_URL] [AMQP_URL]
//! ```
//!
//! The stream captures `NAME.>` with a 10-minute duplicate window; it and the queue keep at most
//! 20 000 messages (the oldest are dropped), so a long run does not fill the disk. Dropping old
//! messages does not slow a publish: JetStream still acknowledges it, RabbitMQ still confirms it.

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};

/// The most messages the stream and the queue keep.
const KEEP: i64 = 20_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(action), Some(name)) = (args.first(), args.get(1)) else {
        eprintln!("usage: busprep up|down NAME [NATS_URL] [AMQP_URL]");
        std::process::exit(2);
    };
    let nats = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let amqp = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let done = runtime.block_on(async {
        match action.as_str() {
            "up" => up(name, &nats, &amqp).await,
            "down" => down(name, &nats, &amqp).await,
            other => Err(format!("{other}: the actions are up and down")),
        }
    });
    if let Err(e) = done {
        eprintln!("busprep: {e}");
        std::process::exit(1);
    }
}

async fn up(name: &str, nats: &str, amqp: &str) -> Result<(), String> {
    let client = async_nats::connect(nats)
        .await
        .map_err(|e| format!("NATS at {nats}: {e}"))?;
    jetstream::new(client)
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("{name}.>")],
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(600),
            max_messages: KEEP,
            discard: stream::DiscardPolicy::Old,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create stream {name}: {e}"))?;
    let connection = Connection::connect(amqp, ConnectionProperties::default())
        .await
        .map_err(|e| format!("RabbitMQ: {e}"))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("declare exchange {name}: {e}"))?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-max-length"),
        AMQPValue::LongLongInt(KEEP),
    );
    arguments.insert(
        ShortString::from("x-overflow"),
        AMQPValue::LongString(LongString::from("drop-head")),
    );
    channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .map_err(|e| format!("declare queue {name}: {e}"))?;
    channel
        .queue_bind(
            name.into(),
            name.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("bind queue {name}: {e}"))?;
    connection
        .close(200, "done".into())
        .await
        .map_err(|e| e.to_string())
}

async fn down(name: &str, nats: &str, amqp: &str) -> Result<(), String> {
    if let Ok(client) = async_nats::connect(nats).await {
        let _ = jetstream::new(client).delete_stream(name).await;
    }
    let connection = Connection::connect(amqp, ConnectionProperties::default())
        .await
        .map_err(|e| format!("RabbitMQ: {e}"))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    let _ = channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await;
    let _ = channel
        .exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await;
    connection
        .close(200, "done".into())
        .await
        .map_err(|e| e.to_string())
}
