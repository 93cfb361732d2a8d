//! The connection lifecycle: an explicit state machine.
//!
//! ```text
//!   Disconnected{attempt} --(backoff delay for attempt; 0 = at once)--> Connecting{attempt}
//!   Connecting{attempt}   --dial + Subscribe ok--> Connected
//!                         --failure--------------> Disconnected{attempt + 1}
//!   Connected             --stream ends----------> Disconnected{1}
//! ```
//!
//! While connected: a sender task drains the outbox onto the stream, the resync starts, and
//! the receive loop applies each event in order and ACKs it. When the stream ends, events in
//! flight are put back for the next stream; nothing is lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use protocol::event::AckRef;
use protocol::pb::eventstreamapi::Event as WireEvent;
use protocol::pb::eventstreamapi::event_stream_client::EventStreamClient;
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tracing::Instrument;

use crate::inbound;
use crate::resync;
use crate::spoke::Spoke;
use crate::transport::TransportError;

/// Events buffered between the sender task and the transport (the sender waits when full).
const STREAM_BUFFER: usize = 64;

/// Why a connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address, TLS settings or the connection itself.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The principal refused the stream.
    #[error("the principal refused the event stream: {0}")]
    Refused(#[source] tonic::Status),
}

/// The connection states.
#[derive(Debug)]
enum State {
    Disconnected { attempt: u32 },
    Connecting { attempt: u32 },
    Connected(Box<Stream>),
}

/// An open stream: where to send, what arrives.
#[derive(Debug)]
struct Stream {
    tx: mpsc::Sender<WireEvent>,
    inbound: Streaming<WireEvent>,
}

/// Runs the state machine until `cancel` fires.
pub(crate) async fn run(spoke: Arc<Spoke>, cancel: CancellationToken) {
    let mut state = State::Disconnected { attempt: 0 };
    loop {
        if cancel.is_cancelled() {
            return;
        }
        state = match state {
            State::Disconnected { attempt } => {
                if attempt > 0 {
                    let delay = spoke.config.backoff.delay_random(attempt);
                    tracing::info!(attempt, delay_ms = delay.as_millis(), "reconnecting after backoff");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                State::Connecting { attempt }
            }
            State::Connecting { attempt } => match connect(&spoke).await {
                Ok(stream) => State::Connected(Box::new(stream)),
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "cannot connect to the principal");
                    if let ConnectError::Refused(status) = &e {
                        session_refused(&spoke, status);
                    }
                    let cause = if matches!(e, ConnectError::Refused(_)) { "refused" } else { "connect_failed" };
                    crate::metrics::global().reconnect(cause);
                    State::Disconnected { attempt: attempt.saturating_add(1) }
                }
            },
            State::Connected(stream) => {
                spoke.connected.store(true, Ordering::Relaxed);
                crate::metrics::global().connected();
                serve(&spoke, *stream, &cancel).await;
                spoke.connected.store(false, Ordering::Relaxed);
                crate::metrics::global().disconnected();
                spoke.mailbox.on_disconnect();
                State::Disconnected { attempt: 1 }
            }
        };
    }
}

async fn connect(spoke: &Spoke) -> Result<Stream, ConnectError> {
    let cfg = &spoke.config;
    let addr = cfg.principal_addr.clone();
    let channel = crate::transport::connect(&addr, cfg.tls.as_ref(), cfg.keepalive).await?;
    let mut client = EventStreamClient::new(channel)
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(credentials) = &cfg.credentials {
        credentials(request.metadata_mut());
    }
    let inbound = client.subscribe(request).await.map_err(ConnectError::Refused)?.into_inner();
    tracing::info!(principal = %addr, "connected to the principal");
    Ok(Stream { tx, inbound })
}

async fn serve(spoke: &Spoke, stream: Stream, cancel: &CancellationToken) {
    let Stream { tx, mut inbound } = stream;
    let stream_cancel = cancel.child_token();
    let sender = {
        let cancel = stream_cancel.clone();
        let heartbeat = spoke.config.heartbeat_interval;
        let max_bytes = spoke.config.max_message_bytes;
        async move { spoke.mailbox.send_loop(tx, cancel, heartbeat, max_bytes).await }
    };
    let receiver = async {
        if let Err(e) = resync::on_connect(spoke).await {
            tracing::warn!(error = %e, "cannot start resync; it runs again on the next connect");
        }
        let silence_limit = spoke.config.stream_silence_limit();
        loop {
            let silent = async {
                match silence_limit {
                    Some(limit) => tokio::time::sleep(limit).await,
                    None => std::future::pending().await,
                }
            };
            let msg = tokio::select! {
                () = stream_cancel.cancelled() => break,
                () = silent => {
                    tracing::warn!(silent_for = ?silence_limit, "nothing from the principal (not even heartbeat ACKs); \
                        the stream is taken as dead and replaced");
                    break;
                }
                msg = inbound.message() => msg,
            };
            match msg {
                Ok(Some(msg)) => on_message(spoke, msg).await,
                Ok(None) => {
                    tracing::info!("the principal closed the stream");
                    crate::metrics::global().reconnect(crate::metrics::stream_end_cause(None));
                    break;
                }
                Err(status) => {
                    tracing::info!(%status, "event stream failed");
                    session_refused(spoke, &status);
                    crate::metrics::global().reconnect(crate::metrics::stream_end_cause(Some(&status)));
                    break;
                }
            }
        }
        stream_cancel.cancel();
    };
    tokio::join!(sender, receiver);
}

/// The principal refused the session (expired, revoked, blocklisted): tell whoever holds the
/// credentials to refresh or authenticate now instead of at the next scheduled refresh.
fn session_refused(spoke: &Spoke, status: &tonic::Status) {
    if status.code() == tonic::Code::Unauthenticated
        && let Some(renew) = &spoke.config.renew_session
    {
        renew.notify_one();
    }
}

fn ack_for(r: &AckRef) -> Event {
    Event::new(EventType::Processed, Target::EventProcessed, r.resource_id.clone(), r.event_id.clone())
}

async fn on_message(spoke: &Spoke, msg: WireEvent) {
    crate::metrics::global().event_received();
    let ack_ref = msg.event.as_ref().and_then(AckRef::of);
    let ev = match Event::from_wire(msg) {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(error = %e, "undecodable event from the principal");
            if let Some(r) = ack_ref {
                spoke.mailbox.push(ack_for(&r));
            }
            return;
        }
    };
    if ev.is_ack() {
        spoke.mailbox.ack(&ev.resource_id, &ev.event_id);
        return;
    }
    let span = crate::otel::received_span(&spoke.config, &ev);
    async {
        let started = std::time::Instant::now();
        let result = inbound::process(spoke, &ev).await;
        crate::metrics::global().event_processed(spoke.config.mode, &ev, &result, started.elapsed());
        match result {
            Ok(()) => spoke.mailbox.push(ev.processed_ack()),
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "cannot apply event now; the principal will resend it")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot apply event; acknowledged so it is not resent");
                spoke.mailbox.push(ev.processed_ack());
                report_error(spoke, &ev, &e);
            }
        }
    }
    .instrument(span)
    .await;
}

/// Managed mode: tells the principal an Application could not be applied (`.error`, upstream
/// §4.2), so the hub shows it instead of the failure staying in the agent's log.
fn report_error(spoke: &Spoke, ev: &Event, err: &inbound::InboundError) {
    if spoke.config.mode != crate::config::AgentMode::Managed || ev.target != Target::Application {
        return;
    }
    let (namespace, name) = ev.subject.as_deref().and_then(|s| s.split_once('/')).unwrap_or_default();
    if name.is_empty() {
        return; // nothing the principal could mark
    }
    let data = protocol::payload::ErrorData {
        resource_name: name.to_owned(),
        resource_namespace: namespace.to_owned(),
        message: err.to_string(),
    };
    match Event::new(EventType::Error, Target::Application, ev.resource_id.clone(), protocol::event::new_uuid())
        .with_json(&data)
    {
        Ok(error_event) => spoke.mailbox.push(error_event),
        Err(e) => tracing::error!(error = %e, "cannot encode an error event"),
    }
}
