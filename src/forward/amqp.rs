//! The `amqp://` and `amqps://` transport (RabbitMQ, AMQP 0-9-1): a publish per attempt on a
//! channel in confirm mode.
//!
//! Each publish is persistent (`delivery_mode = 2`) and `mandatory`, with
//! `message_id = {source}:{event_id}` (or, for a key over AMQP's 255 bytes, `sha256:` and the
//! key's hex digest), `content_type` as the body's, and the `X-Hookbox-*` values as headers.
//! Delivered means the broker's confirm (ack) with nothing returned; a nack, a return (no
//! queue is bound for the routing key), a missing exchange or a lost connection is a retry.
//!
//! One connection per target, opened when its first delivery is due, and on it one
//! confirm-mode channel per publish in flight, kept for the next once its confirm is in: a
//! channel never has two publishes awaiting their confirms. lapin gives a returned
//! (unroutable) message to whichever confirm it resolves next, and a multiple ack resolves
//! several at once in no set order, so on a shared channel a return could reach another
//! publish's confirm (an unroutable event read as delivered, a routed one as returned); and a
//! publish to an exchange that does not exist makes the broker close its channel, which on a
//! shared one lost every other publish's confirm with it. A channel the broker closed is
//! dropped; a connection that dropped is opened again, no sooner than a backoff after a failed
//! connect ([`bus::Reconnect`]), so a dead broker costs each attempt nothing but a quick retry.
//! A connection the broker has gone silent on is taken as dropped after [`bus::silent_for`]
//! the target's timeout: its AMQP heartbeat is half that, unless the URL sets one.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::bus;
use super::transport::{hookbox_headers, idempotency_key, Handoff, Step, Transport};
use crate::db::deliveries::Due;
use crate::routing::{self, Template};

/// A target's RabbitMQ: where it is, the exchange and routing key templates, and the link.
pub struct Amqp {
    /// The configured URL, credentials included (lapin logs in with them).
    url: String,
    /// How long an attempt may take: a connect's probe takes at most half of it.
    timeout: Duration,
    exchange: Template,
    routing_key: Template,
    link: Mutex<Link>,
}

/// The connection, once open, and its confirm-mode channels that no publish is using.
#[derive(Default)]
struct Link {
    connection: Option<Connection>,
    idle: Vec<Channel>,
    reconnect: bus::Reconnect,
}

impl Amqp {
    /// The transport of a target at `url` (checked by the config); each attempt may take
    /// `timeout`.
    pub fn new(url: &str, exchange: Template, routing_key: Template, timeout: Duration) -> Amqp {
        Amqp {
            url: url.to_owned(),
            timeout,
            exchange,
            routing_key,
            link: Mutex::default(),
        }
    }

    /// A confirm-mode channel for one publish: an idle one, or a new one (opening the
    /// connection first if it is closed). Given back with [`Amqp::give_back`] once its
    /// confirm is in.
    async fn channel(&self, step: &Step) -> Result<Channel, String> {
        step.at("waiting for another attempt's connect to RabbitMQ");
        let mut link = self.link.lock().await;
        while let Some(channel) = link.idle.pop() {
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        if !link
            .connection
            .as_ref()
            .is_some_and(|c| c.status().connected())
        {
            link.connection = None;
            link.reconnect.check()?;
            step.at("connecting to RabbitMQ");
            match self.connect("hookbox").await {
                Ok(connection) => {
                    link.connection = Some(connection);
                    link.reconnect.connected();
                }
                Err(error) => {
                    link.reconnect.failed(error.clone());
                    return Err(error);
                }
            }
        }
        let connection = link.connection.as_ref().expect("opened just above");
        step.at("opening a channel");
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        step.at("putting the channel in confirm mode");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| format!("cannot put the channel in confirm mode: {e}"))?;
        Ok(channel)
    }

    /// A channel whose publish has its confirm: kept for the next publish, unless the broker
    /// closed it.
    async fn give_back(&self, channel: Channel) {
        if channel.status().connected() {
            self.link.lock().await.idle.push(channel);
        }
    }

    /// Checks, as the dispatcher starts, that the broker lets this target in, and that its
    /// exchange exists where the exchange is the same for every event of `source`: what is
    /// ready, or what is wrong. On a connection of its own, closed after: the deliveries' link
    /// is never held while the check waits on a broker that does not answer.
    pub async fn check(&self, source: &str) -> Result<bus::Ready, String> {
        let told = |error: String| crate::redact::message_about(&error, &self.url);
        let connection = self
            .connect("hookbox (startup check)")
            .await
            .map_err(told)?;
        let checked = self.check_exchange(&connection, source).await.map_err(told);
        let _ = connection.close(200, "hookbox: checked".into()).await;
        checked
    }

    /// Opens a connection named `name`, once the broker has shown it speaks AMQP ([`probe`]),
    /// within a third of the timeout more: a broker that answers the header and then says
    /// nothing would otherwise hold the connect until the attempt's own timeout dropped it, and
    /// a connect dropped so was never counted as failed, so the next attempt connected again
    /// at once (a black-box run: 90 handshakes a minute). Failed in time, it waits for the
    /// reconnect's backoff like any other, and its socket is shut down ([`Handshake`]).
    async fn connect(&self, name: &str) -> Result<Connection, String> {
        probe(&self.url, bus::share_of(self.timeout, 2)).await?;
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        let mut uri: AMQPUri = self
            .url
            .parse()
            .map_err(|e| format!("cannot connect to RabbitMQ: {e}"))?;
        // lapin closes a connection with nothing read for two heartbeats. One the URL sets
        // (`?heartbeat=N`) is kept.
        uri.query.heartbeat.get_or_insert_with(|| {
            let silent = bus::silent_for(self.timeout).as_secs().div_ceil(2);
            u16::try_from(silent).unwrap_or(u16::MAX)
        });
        let runtime = lapin::runtime::default_runtime()
            .map_err(|e| format!("cannot connect to RabbitMQ: {e}"))?;
        let handshake = Arc::new(Handshake::default());
        // Dropped with its attempt (whose own timeout counts the wait for the link too), the
        // connect is given up on like one that timed out here.
        let _given_up_if_dropped = EndOnDrop(handshake.clone());
        let socket = {
            let (handshake, timeout) = (handshake.clone(), self.timeout);
            async move |uri: AMQPUri, _| handshake.open(&uri, timeout).await
        };
        let wait = bus::share_of(self.timeout, 3);
        let connecting = Connection::connector(uri, runtime, socket, properties);
        match tokio::time::timeout(wait, connecting).await {
            Ok(Ok(connection)) => {
                // The copy is not needed once connected; lapin's own socket lives on.
                handshake.end(false);
                Ok(connection)
            }
            Ok(Err(e)) => {
                handshake.end(true);
                Err(format!("cannot connect to RabbitMQ: {e}"))
            }
            Err(_) => {
                handshake.end(true);
                Err(format!(
                    "RabbitMQ answered AMQP's header but did not finish its handshake within {}",
                    crate::config::Spelt(wait)
                ))
            }
        }
    }

    /// [`Amqp::check`]'s look at the exchange, on `connection`.
    async fn check_exchange(
        &self,
        connection: &Connection,
        source: &str,
    ) -> Result<bus::Ready, String> {
        let Some(exchange) = self.exchange.fixed(source) else {
            return Ok(bus::Ready::said(
                "RabbitMQ answers (the exchange is named by each event)",
            ));
        };
        if exchange.is_empty() {
            return Ok(bus::Ready::said(
                "RabbitMQ answers; publishing to the default exchange",
            ));
        }
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| format!("cannot open a channel: {e}"))?;
        // A passive declare only asks whether it exists (the broker closes the channel of one
        // that does not).
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                ShortString::from(exchange.clone()),
                ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                format!(
                    "exchange {exchange:?} is not there to publish to (hookbox never declares \
                     exchanges; declare it, e.g. `rabbitmqadmin declare exchange name={exchange} \
                     type=topic durable=true`): {e}"
                )
            })?;
        // Closed before its connection is: lapin logs a connection closed under an open
        // channel as an ERROR (`invalid channel state: Closing`), on every healthy start.
        let _ = channel.close(200, "hookbox: checked".into()).await;
        Ok(bus::Ready::said(format!(
            "RabbitMQ answers; exchange {exchange:?} exists"
        )))
    }

    /// One attempt: publish the event and wait for the broker's confirm. The dispatcher
    /// bounds it by the target's timeout.
    async fn publish(&self, due: &Due, step: &Step) -> Handoff {
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
            let mut lent = Lent(Some(self.channel(step).await?));
            let channel = lent.0.as_ref().expect("lent just above");
            step.at("publishing");
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
                .map_err(|e| format!("the publish failed: {e}"));
            let confirmed = match confirm {
                Ok(confirm) => {
                    step.at("waiting for the broker's confirm");
                    confirm
                        .await
                        .map_err(|e| format!("no confirm from the broker: {e}"))
                }
                Err(e) => Err(e),
            };
            // Only once its one publish is confirmed: an attempt that times out before drops
            // the channel with it, and a late confirm meets no other publish.
            if let Some(channel) = lent.0.take() {
                self.give_back(channel).await;
            }
            confirmed
        };
        let outcome = match attempt.await {
            Err(error) => Err(error),
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(format!(
                "the broker returned the message unroutable ({} {}): no queue is bound for it",
                returned.reply_code, returned.reply_text
            )),
            Ok(Confirmation::Nack(_)) => Err("the broker refused the message (nack)".to_owned()),
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

/// The socket of one connect through lapin, kept so that a handshake given up on can be ended.
/// lapin's handshake has no time limit, and its I/O thread owns the socket: a connect future
/// dropped leaves both behind, waiting on the broker for ever (a black-box run: a thread and a
/// descriptor per attempt against a broker that answered AMQP's header and then stalled). The
/// socket is made here, a copy of its descriptor kept, and when the connect is given up on
/// ([`Handshake::end`]) shut down: lapin's thread reads the end, fails the connect and exits,
/// closing its socket.
#[derive(Default)]
struct Handshake {
    state: std::sync::Mutex<HandshakeState>,
}

#[derive(Default)]
enum HandshakeState {
    #[default]
    Connecting,
    /// The copy of the socket's descriptor.
    Open(std::net::TcpStream),
    /// The connect has been answered or given up on: no socket is made any more.
    Ended,
}

/// Ends its handshake as given up on when dropped, unless it has ended already: a connect
/// dropped with its attempt left lapin to finish the handshake alone, and the connection it
/// made was held by no one, open for as long as the broker kept it (a black-box run: one in
/// eight or so reconnects to a broker that stopped answering after its handshake left a
/// connection and a thread behind).
struct EndOnDrop(Arc<Handshake>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end(true);
    }
}

impl Handshake {
    /// lapin's connect: a TCP connection to `uri`'s broker, with TLS over it for `amqps://`.
    /// One per handshake: lapin does not connect again (no reconnect is configured), and a
    /// second socket would escape [`Handshake::end`].
    ///
    /// The socket gives up on data the broker has not acknowledged within `timeout` (the
    /// target's; `TCP_USER_TIMEOUT`), as an HTTP target's connections do
    /// ([`super::http::GiveUpWithTheAttempt`]): a publish written into a path gone silent (a
    /// black hole: no answer, no reset) stayed in the kernel's send queue after its attempt
    /// timed out, and reached the broker once the path came back, after the attempts that
    /// followed it. The connection ends instead, and the retry goes on a new one.
    async fn open(
        &self,
        uri: &AMQPUri,
        timeout: Duration,
    ) -> lapin::Result<lapin::tcp::AsyncTcpStream<async_compat::Compat<tokio::net::TcpStream>>>
    {
        use lapin::uri::AMQPScheme;
        let failed = |e: std::io::Error| lapin::Error::from(lapin::ErrorKind::IOError(Arc::new(e)));
        let refused = |why: &str| failed(std::io::Error::other(why.to_owned()));
        let stream =
            tokio::net::TcpStream::connect((uri.authority.host.as_str(), uri.authority.port))
                .await
                .map_err(failed)?;
        // Best effort: a kernel without the option connects as before.
        let _ = socket2::SockRef::from(&stream).set_tcp_user_timeout(Some(timeout));
        let stream = stream.into_std().map_err(failed)?;
        let copy = stream.try_clone().map_err(failed)?;
        {
            let mut state = self.state.lock().expect("the handshake's state");
            match *state {
                HandshakeState::Connecting => *state = HandshakeState::Open(copy),
                HandshakeState::Open(_) => return Err(refused("one connect per handshake")),
                HandshakeState::Ended => return Err(refused("the connect has ended")),
            }
        }
        let stream = tokio::net::TcpStream::from_std(stream).map_err(failed)?;
        let stream = lapin::tcp::AsyncTcpStream::Plain(async_compat::Compat::new(stream));
        match uri.scheme {
            AMQPScheme::AMQP => Ok(stream),
            AMQPScheme::AMQPS => stream
                .into_tls(
                    &uri.authority.host,
                    lapin::tcp::OwnedTLSConfig::default().as_ref(),
                )
                .await
                .map_err(failed),
        }
    }

    /// The connect is over: answered, or given up on (`shut`), when its socket, if open, is
    /// shut down. Either way the copy is closed, and a socket not yet made is refused.
    fn end(&self, shut: bool) {
        let mut state = self.state.lock().expect("the handshake's state");
        if let HandshakeState::Open(socket) = std::mem::replace(&mut *state, HandshakeState::Ended)
        {
            if shut {
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Whether the broker at `url` answers AMQP's protocol header within `wait`, on a socket of
/// its own, closed after. A broker that takes connections and says nothing (frozen, or behind
/// a proxy whose backend is gone) is told apart from one that stalls in its handshake, and
/// costs no lapin thread: lapin is called only once the broker has answered here. Over TLS (`amqps://`) the probe makes its own TLS session first,
/// and the header goes inside it.
async fn probe(url: &str, wait: Duration) -> Result<(), String> {
    use lapin::uri::{AMQPScheme, AMQPUri};
    let uri: AMQPUri = url
        .parse()
        .map_err(|e| format!("the RabbitMQ URL cannot be read: {e}"))?;
    let (host, port) = (uri.authority.host.as_str(), uri.authority.port);
    // A connect that never completes (its packets dropped) is said as the network's, not as
    // a broker that took the connection and froze (a black-box run behind a black hole).
    let connected = std::cell::Cell::new(false);
    let talk = async {
        let socket = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("cannot connect to RabbitMQ: {e}"))?;
        connected.set(true);
        match uri.scheme {
            AMQPScheme::AMQPS => speaks_amqp(tls_session(host, socket).await?).await,
            AMQPScheme::AMQP => speaks_amqp(socket).await,
        }
    };
    let answered = tokio::time::timeout(wait, talk).await;
    answered.unwrap_or_else(|_| {
        let wait = crate::config::Spelt(wait);
        Err(if connected.get() {
            format!("RabbitMQ took the connection but did not answer within {wait}")
        } else {
            format!(
                "cannot connect to RabbitMQ: no answer to the connect to {host}:{port} within \
                 {wait} (nothing refused it: packets dropped on the way, by a firewall, a route \
                 gone or a host that is down)"
            )
        })
    })
}

/// Sends AMQP 0-9-1's protocol header on `stream` and waits for the broker's first byte.
async fn speaks_amqp<S>(mut stream: S) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"AMQP\x00\x00\x09\x01")
        .await
        .map_err(|e| format!("cannot connect to RabbitMQ: {e}"))?;
    let mut first = [0u8; 1];
    match stream.read(&mut first).await {
        Ok(1..) => Ok(()),
        Ok(0) => Err("RabbitMQ closed the connection before its handshake".to_owned()),
        Err(e) => Err(format!("cannot connect to RabbitMQ: {e}")),
    }
}

/// The probe's TLS session over `socket`. Its certificate is not checked here: lapin checks it
/// as it connects, and says why it refuses one; the probe asks only that a broker answers.
async fn tls_session(
    host: &str,
    socket: tokio::net::TcpStream,
) -> Result<tokio_openssl::SslStream<tokio::net::TcpStream>, String> {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let failed = |e: &dyn std::fmt::Display| format!("cannot connect to RabbitMQ over TLS: {e}");
    let mut connector = SslConnector::builder(SslMethod::tls_client()).map_err(|e| failed(&e))?;
    connector.set_verify(SslVerifyMode::NONE);
    let ssl = connector
        .build()
        .configure()
        .and_then(|c| c.verify_hostname(false).into_ssl(host))
        .map_err(|e| failed(&e))?;
    let mut session = tokio_openssl::SslStream::new(ssl, socket).map_err(|e| failed(&e))?;
    std::pin::Pin::new(&mut session)
        .connect()
        .await
        .map_err(|e| failed(&e))?;
    Ok(session)
}

/// A channel lent to one attempt. Dropped with it (the attempt timed out before the confirm),
/// the channel is closed rather than kept: its confirm may still come, and channels left open
/// would pile up on the connection.
struct Lent(Option<Channel>);

impl Drop for Lent {
    fn drop(&mut self) {
        // No runtime (the process is stopping and its runtime going): the connection's end
        // closes the channel anyway.
        if let (Some(channel), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                let _ = channel
                    .close(200, ShortString::from("hookbox: the attempt timed out"))
                    .await;
            });
        }
    }
}

/// Shared by the target and every dispatcher thread's lane: one connection and channel.
impl Transport for Arc<Amqp> {
    fn hand_off<'a>(&'a self, due: &'a Due, step: &'a Step) -> LocalBoxFuture<'a, Handoff> {
        Box::pin(self.publish(due, step))
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
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An AMQP 0-9-1 frame on channel 0 of a connection-class method.
    fn method(method: u16, args: &[u8]) -> Vec<u8> {
        let mut payload = 10u16.to_be_bytes().to_vec();
        payload.extend(method.to_be_bytes());
        payload.extend(args);
        let mut frame = vec![1, 0, 0];
        frame.extend(u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend(payload);
        frame.push(0xce);
        frame
    }

    fn read_frame(client: &mut std::net::TcpStream) -> std::io::Result<()> {
        let mut head = [0u8; 7];
        client.read_exact(&mut head)?;
        let size = u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize;
        client.read_exact(&mut vec![0u8; size + 1])
    }

    /// A broker that answers the handshake's steps, Connection.Open-Ok only `open_ok_after`
    /// it was asked, and then says nothing. Counts the connections that got as far as Open,
    /// and of those the ones the client closed.
    fn slow_broker(open_ok_after: Duration) -> (u16, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let counts = (opened.clone(), closed.clone());
        std::thread::spawn(move || {
            let long = |s: &[u8]| [&u32::try_from(s.len()).unwrap().to_be_bytes()[..], s].concat();
            let start = method(
                10,
                &[
                    [0, 9].as_slice(),
                    &[0, 0, 0, 0],
                    &long(b"PLAIN"),
                    &long(b"en_US"),
                ]
                .concat(),
            );
            let tune = method(
                30,
                &[[0x07, 0xff].as_slice(), &131_072u32.to_be_bytes(), &[0, 60]].concat(),
            );
            let open_ok = method(41, &[0]);
            for mut client in listener.incoming().flatten() {
                let (start, tune, open_ok) = (start.clone(), tune.clone(), open_ok.clone());
                let (opened, closed) = (counts.0.clone(), counts.1.clone());
                std::thread::spawn(move || {
                    let mut header = [0u8; 8];
                    let handshake = client
                        .read_exact(&mut header)
                        .and_then(|()| client.write_all(&start))
                        // Start-Ok; Tune-Ok and Open. The probe's connection ends before.
                        .and_then(|()| read_frame(&mut client))
                        .and_then(|()| client.write_all(&tune))
                        .and_then(|()| read_frame(&mut client))
                        .and_then(|()| read_frame(&mut client));
                    if handshake.is_err() {
                        return;
                    }
                    opened.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(open_ok_after);
                    let _ = client.write_all(&open_ok);
                    let mut rest = [0u8; 512];
                    while matches!(client.read(&mut rest), Ok(1..)) {}
                    closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (port, opened, closed)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connect_dropped_with_its_attempt_closes_the_connection_it_began() {
        // The attempt's own timeout (which counts the wait for the link) dropped the connect
        // mid-handshake; lapin finished it alone, and the connection stayed open, held by no
        // one, with its thread, until the broker let go.
        let (port, opened, closed) = slow_broker(Duration::from_secs(2));
        let template =
            |t: &str| routing::Template::parse(t, routing::Kind::AmqpRoutingKey).unwrap();
        let amqp = Amqp::new(
            &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            template("x"),
            template("k"),
            Duration::from_secs(9),
        );
        // Dropped once the handshake has got as far as Open, before the broker's Open-Ok.
        let until_open = async {
            while opened.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::select! {
            connected = amqp.connect("test") => panic!("connected: {:?}", connected.err()),
            () = until_open => {}
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while closed.load(Ordering::SeqCst) < 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the connection was left open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn a_message_id_fits_in_a_short_string_and_is_stable() {
        assert_eq!(message_id("stripe:evt_1"), "stripe:evt_1");
        let long = format!("stripe:{}", "x".repeat(300));
        let id = message_id(&long);
        assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
        assert_eq!(id, message_id(&long));
    }
}
