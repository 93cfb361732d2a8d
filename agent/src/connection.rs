//! The connection lifecycle: an explicit state machine.
//!
//! ```text
//!   Disconnected{attempt} --(backoff delay for attempt; 0 = at once)--> Connecting{attempt}
//!   Connecting{attempt}   --dial, Subscribe answered--> Connected
//!                         --failure--------------------> Disconnected{attempt + 1}
//!   Connected             --stream ends----------------> Disconnected{1}
//! ```
//!
//! Connecting opens the `Subscribe` call and starts sending at once: the sender task drains the
//! outbox onto the stream and the resync requests go out (as upstream's agent does on its
//! first stream) *before* the principal's response headers arrive. grpc-go sends a stream's
//! headers only with its first message, so an upstream principal with nothing to send would
//! otherwise never answer, and the two sides would wait for each other forever.
//!
//! While connected the receive loop applies each event in order and ACKs it. When the stream
//! ends, or the principal refuses it, events in flight are put back for the next stream;
//! nothing is lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use link::Attachment;
use link::recv::{Inbound, Next};
use link::send::{SendHooks, SendOptions};
use protocol::outbox::Parked;
use protocol::pb::eventstreamapi::Event as WireEvent;
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

/// An open stream: what arrives, and the task sending on it (started before the principal
/// answered).
#[derive(Debug)]
struct Stream {
    inbound: Streaming<WireEvent>,
    sender: Sender,
}

/// The task draining the outbox onto one stream, and how to stop it.
#[derive(Debug)]
struct Sender {
    task: tokio::task::JoinHandle<()>,
    cancel: CancellationToken,
    attachment: Attachment,
}

/// What the send loop reports.
struct PrincipalHooks;

impl SendHooks for PrincipalHooks {
    fn peer(&self) -> &str {
        "principal"
    }
    fn sent(&self, _event: &Event) {
        crate::metrics::global().event_sent();
    }
    fn discarded(&self, parked: &Parked<Event>) {
        crate::metrics::global().event_discarded(&parked.item);
    }
}

impl Sender {
    /// Attaches a new stream to the outbox and starts draining it onto `tx` until `cancel` (or
    /// a child of it) fires.
    fn start(spoke: &Arc<Spoke>, tx: mpsc::Sender<WireEvent>, cancel: &CancellationToken) -> Self {
        let cancel = cancel.child_token();
        let attachment = spoke.mailbox.attach();
        let options =
            SendOptions { heartbeat: spoke.config.heartbeat_interval, max_bytes: spoke.config.max_message_bytes };
        let task = tokio::spawn({
            let (spoke, cancel) = (spoke.clone(), cancel.clone());
            async move { link::send::send_loop(&spoke.mailbox, attachment, &tx, &cancel, options, &PrincipalHooks).await }
        });
        Self { task, cancel, attachment }
    }

    /// Stops the task and waits for it, so nothing is sent after the stream is given up; what
    /// the stream had in flight is due again on the next one.
    async fn stop(self, spoke: &Spoke) {
        self.cancel.cancel();
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "the stream's sender task failed");
        }
        spoke.mailbox.detach(self.attachment);
    }
}

/// What answers the principal's requests on this cluster: the Redis proxy's half
/// ([`crate::redis`]) and the resource proxy's (`crate::live`, also the pods for logs and
/// terminals). The connection owns them, as it owns its stream.
struct Halves {
    redis: Arc<crate::redis::Redis>,
    live: Arc<crate::live::Live>,
}

/// Runs the state machine until `cancel` fires.
pub(crate) async fn run(spoke: Arc<Spoke>, cancel: CancellationToken) {
    // The halves that answer the principal's requests, owned here as the stream is. Redis-proxy
    // subscriptions outlive a stream (the principal pings them on the next one).
    let halves = Halves {
        redis: Arc::new(crate::redis::Redis::new(spoke.config.redis.as_ref())),
        live: Arc::new(crate::live::Live::new(spoke.apps.client(), &spoke.config.namespace)),
    };
    let mut state = State::Disconnected { attempt: 0 };
    // Whether the next stream starts with a resync: after start and after every stream the
    // principal accepted; not after a refused one, whose resync requests are still queued.
    let mut resync_due = true;
    // Quick retries left after a handover: the first reconnect may still reach the replica
    // going away (e.g. through a sidecar's pooled connection until its drain's GOAWAY lands).
    let mut handover_retries = 0u32;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        state = match state {
            State::Disconnected { attempt } => {
                if attempt > 0 && handover_retries > 0 {
                    handover_retries -= 1;
                    tracing::info!(
                        attempt,
                        delay_ms = HANDOVER_RETRY.as_millis(),
                        "handover: reconnecting again shortly"
                    );
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(HANDOVER_RETRY) => {}
                    }
                } else if attempt > 0 {
                    let delay = spoke.config.backoff.delay_random(attempt);
                    tracing::info!(attempt, delay_ms = delay.as_millis(), "reconnecting after backoff");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                State::Connecting { attempt }
            }
            State::Connecting { attempt } => match connect(&spoke, &cancel, &mut resync_due).await {
                Ok(stream) => State::Connected(Box::new(stream)),
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "cannot connect to the principal");
                    if let ConnectError::Refused(status) = &e {
                        session_refused(&spoke, status);
                    }
                    // Unavailable is no refusal: the principal was not reached (e.g. the
                    // WebSocket under `--enable-websocket` could not be dialled).
                    let cause = match &e {
                        ConnectError::Refused(status) if status.code() != tonic::Code::Unavailable => "refused",
                        _ => "connect_failed",
                    };
                    crate::metrics::global().reconnect(cause);
                    State::Disconnected { attempt: attempt.saturating_add(1) }
                }
            },
            State::Connected(stream) => {
                spoke.connected.store(true, Ordering::Relaxed);
                crate::metrics::global().connected();
                handover_retries = 0;
                let at_once = serve(&spoke, &halves, *stream, &cancel).await;
                if at_once {
                    handover_retries = HANDOVER_RETRIES;
                }
                spoke.connected.store(false, Ordering::Relaxed);
                crate::metrics::global().disconnected();
                resync_due = true;
                // A principal replica that hands the agent over says so: another replica can
                // take it now (a refused reconnect still backs off).
                State::Disconnected { attempt: u32::from(!at_once) }
            }
        };
    }
}

async fn connect(
    spoke: &Arc<Spoke>,
    cancel: &CancellationToken,
    resync_due: &mut bool,
) -> Result<Stream, ConnectError> {
    let cfg = &spoke.config;
    let addr = cfg.principal_addr.clone();
    let channel = crate::transport::connect_over(&addr, cfg.tls.as_ref(), cfg.keepalive, cfg.wire).await?;
    let mut client = crate::compression::event_stream_client(channel.clone(), cfg.compression)
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(credentials) = &cfg.credentials {
        credentials(request.metadata_mut());
    }
    // Send before the principal answers (see the module docs): the request body is written
    // while `subscribe` waits for the response headers.
    let sender = Sender::start(spoke, tx, cancel);
    let subscribe = client.subscribe(request);
    let resync = async {
        if std::mem::take(resync_due)
            && let Err(e) = resync::on_connect(spoke).await
        {
            tracing::warn!(error = %e, "cannot start resync; it runs again on the next connect");
        }
    };
    let answer = tokio::select! {
        (answer, ()) = async { tokio::join!(subscribe, resync) } => answer,
        () = cancel.cancelled() => Err(tonic::Status::cancelled("the agent is shutting down")),
    };
    match answer {
        Ok(response) => {
            tracing::info!(principal = %addr, "connected to the principal");
            *link::lock(&spoke.principal) = Some(channel);
            Ok(Stream { inbound: response.into_inner(), sender })
        }
        Err(status) => {
            sender.stop(spoke).await;
            Err(ConnectError::Refused(status))
        }
    }
}

/// Serves one stream until it ends; returns whether the principal asked for an immediate
/// reconnect (a replica shutting down or giving the agent up, see [`RECONNECT_TRAILER`]).
async fn serve(spoke: &Arc<Spoke>, halves: &Halves, stream: Stream, cancel: &CancellationToken) -> bool {
    let Stream { mut inbound, sender } = stream;
    let mut at_once = false;
    // Ends with the stream: the next one starts its own.
    let _periodic =
        spoke.config.resync_interval.map(|every| AbortOnDrop(tokio::spawn(crate::resync::every(spoke.clone(), every))));
    // This cluster's cache counts for the hub's Argo CD, while the stream lasts.
    let _cache_report = spoke.config.cache_refresh_interval.filter(|_| halves.redis.is_configured()).map(|every| {
        AbortOnDrop(tokio::spawn(crate::cluster_cache::every(spoke.clone(), halves.redis.clone(), every)))
    });
    let silence_limit = spoke.config.stream_silence_limit();
    loop {
        match link::recv::next(&mut inbound, cancel, silence_limit).await {
            Next::Message(msg) => on_message(spoke, halves, msg).await,
            Next::Stopped => break,
            Next::Silent(silent_for) => {
                tracing::warn!(
                    ?silent_for,
                    "nothing from the principal (not even heartbeat ACKs); \
                    the stream is taken as dead and replaced"
                );
                crate::metrics::global().reconnect("silent");
                break;
            }
            Next::Ended => {
                tracing::info!("the principal closed the stream");
                crate::metrics::global().reconnect(crate::metrics::stream_end_cause(None));
                break;
            }
            Next::Failed(status) => {
                at_once = status.metadata().get(RECONNECT_TRAILER).is_some_and(|v| v == "immediately");
                tracing::info!(%status, reconnect_at_once = at_once, "event stream failed");
                session_refused(spoke, &status);
                crate::metrics::global().reconnect(crate::metrics::stream_end_cause(Some(&status)));
                break;
            }
        }
    }
    sender.stop(spoke).await;
    at_once
}

/// After a handover, refused reconnects are retried this many times at [`HANDOVER_RETRY`]
/// before the backoff applies.
const HANDOVER_RETRIES: u32 = 3;
/// The pause between those retries.
const HANDOVER_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The trailer with which a principal replica asks for an immediate reconnect (the
/// principal's `peer::RECONNECT_TRAILER`).
pub(crate) const RECONNECT_TRAILER: &str = "x-argocd-agent-reconnect";

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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

/// Handles one message from the principal by the ACK policy of [`link::recv`].
async fn on_message(spoke: &Arc<Spoke>, halves: &Halves, msg: WireEvent) {
    crate::metrics::global().event_received();
    let Inbound::Event(ev) = link::recv::receive(&spoke.mailbox, "principal", msg) else {
        return;
    };
    if crate::redis::is_request(&ev) {
        // Answered from this cluster's Redis in the background; acknowledged now.
        let result = crate::redis::accept(spoke, &halves.redis, &ev);
        link::recv::settle(&spoke.mailbox, &ev, &result);
        return;
    }
    if crate::logs::is_request(&ev) {
        // Streamed on a `StreamLogs` call in the background; acknowledged now.
        let result = crate::logs::accept(spoke, &halves.live, &ev);
        link::recv::settle(&spoke.mailbox, &ev, &result);
        return;
    }
    if crate::terminal::is_request(&ev) {
        // Carried on a `StreamTerminal` call in the background; acknowledged now.
        let result = crate::terminal::accept(spoke, &halves.live, &ev);
        link::recv::settle(&spoke.mailbox, &ev, &result);
        return;
    }
    if crate::live::is_request(&ev) {
        // Executed in the background and answered by a `response`; acknowledged now.
        let result = crate::live::accept(spoke, &halves.live, &ev);
        link::recv::settle(&spoke.mailbox, &ev, &result);
        return;
    }
    let span = crate::otel::received_span(&spoke.config, &ev);
    async {
        let started = std::time::Instant::now();
        let result = inbound::process(spoke, &ev).await;
        crate::metrics::global().event_processed(spoke.config.mode, &ev, &result, started.elapsed());
        let acked = link::recv::settle(&spoke.mailbox, &ev, &result);
        if let Err(e) = &result
            && acked
        {
            report_error(spoke, &ev, e);
        }
    }
    .instrument(span)
    .await;
}

/// Managed mode: tells the principal an Application could not be applied (`.error`, upstream
/// §4.2), so the hub shows it instead of the failure staying in the agent's log.
fn report_error(spoke: &Spoke, ev: &Event, err: &crate::error::InboundError) {
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
