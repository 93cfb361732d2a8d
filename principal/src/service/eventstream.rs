//! `eventstreamapi.EventStream`: the agent's bidirectional stream of CloudEvents.
//!
//! Per stream: the caller's identity comes from the [`IdentityFn`] seam, the id and expiry of
//! the access token it presented from the auth layer ([`StreamGrant`]); the agent's session is
//! attached (closing any older stream of the same agent); a sender task drains the session's
//! outbox onto the stream; the receive loop applies each event in order and ACKs it.
//!
//! Policies (docs/reliability.md, "Delivery guarantees"):
//! * **Bad events.** A malformed, unknown or failing event is answered (ACKed) and logged; it
//!   never ends the stream and is never retried forever. Two cannot be answered and are only
//!   logged: a message without a usable `resourceid` (no sender can be tracking it) and an
//!   undecodable ACK (an ACK is never ACKed, so two peers cannot ping-pong).
//! * **Oversized messages.** A message from the agent above
//!   [`PrincipalConfig::max_message_bytes`](crate::PrincipalConfig::max_message_bytes) cannot
//!   be skipped (tonic fails the stream at decode time): the stream ends with `OutOfRange`
//!   and the agent sees that status. An event for the agent that would encode above the limit
//!   is never sent: it is given up on at once and logged, and the next resync repairs.
//! * **One stream per agent, the newest wins**: the older stream ends with `Aborted`.
//! * **Expiry and revocation.** A stream ends with `Unauthenticated` when the access token
//!   that opened it expires, or when [`crate::Principal::revoke`] revokes the session; the
//!   agent refreshes or re-authenticates and reconnects. Expired or revoked tokens are refused
//!   when a stream opens.

use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use futures::Stream;
use protocol::event::AckRef;
use protocol::pb::cloudevents::CloudEvent;
use protocol::pb::cloudevents::cloud_event::cloud_event_attribute_value::Attr;
use protocol::pb::eventstreamapi::event_stream_server::EventStream;
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::config::AgentMode;
use crate::hub::Hub;
use crate::ident::{IdentityFn, StreamGrant};
use crate::inbound;
use crate::resync;
use crate::session::{AgentSession, StreamHandle};

/// Events buffered between the sender task and the transport; the sender waits when it is
/// full (nothing is dropped; the outbox holds the rest).
const STREAM_BUFFER: usize = 64;

/// What the principal sends on a `Subscribe` stream: the outbox's events, then the status the
/// stream was closed with.
pub type Outgoing = Pin<Box<dyn Stream<Item = Result<WireEvent, Status>> + Send + 'static>>;

/// The `EventStream` service.
#[derive(Clone)]
pub struct EventStreamService {
    hub: Arc<Hub>,
    identity: IdentityFn,
}

impl std::fmt::Debug for EventStreamService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStreamService").finish_non_exhaustive()
    }
}

impl EventStreamService {
    pub(crate) fn new(hub: Arc<Hub>, identity: IdentityFn) -> Self {
        Self { hub, identity }
    }

    /// The caller's session, mode and token grant; refuses unidentified, unadmitted, expired
    /// and revoked callers.
    fn session_for<T>(&self, request: &Request<T>) -> Result<(Arc<AgentSession>, AgentMode, StreamGrant), Status> {
        let ident = (self.identity)(request.extensions(), request.metadata()).ok_or_else(|| {
            Status::unauthenticated("no authenticated agent on this call (the auth layer must identify the agent)")
        })?;
        if !self.hub.config.admits(&ident.name) {
            return Err(Status::permission_denied(format!(
                "agent {:?} is not covered by the principal's --allowed-namespaces or equals its namespace",
                ident.name
            )));
        }
        let grant = StreamGrant::of(request.extensions(), &ident.name);
        if let Some(expires_at) = grant.expires_at
            && expires_at <= SystemTime::now()
        {
            return Err(expired(&ident.name, expires_at));
        }
        if self.is_revoked(&grant) {
            return Err(revoked(&ident.name));
        }
        let session = self.hub.sessions.get_or_create(&ident.name, ident.mode);
        Ok((session, ident.mode, grant))
    }

    fn is_revoked(&self, grant: &StreamGrant) -> bool {
        grant.token_id.as_deref().is_some_and(|id| self.hub.sessions.is_revoked(id))
    }
}

/// The status a stream ends with when its access token expires.
fn expired(agent: &str, expires_at: SystemTime) -> Status {
    let at = chrono::DateTime::<chrono::Utc>::from(expires_at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    Status::unauthenticated(format!(
        "the session of agent {agent:?} expired at {at}: refresh the access token or authenticate again, then reconnect"
    ))
}

/// The status a stream opened with a revoked token is refused with.
fn revoked(agent: &str) -> Status {
    Status::unauthenticated(format!(
        "the session of agent {agent:?} was revoked by the principal: authenticate again, then reconnect"
    ))
}

fn ack_for(r: &AckRef) -> Event {
    Event::new(EventType::Processed, Target::EventProcessed, r.resource_id.clone(), r.event_id.clone())
}

/// Whether a raw CloudEvent claims to be an ACK (by type or by `dataschema`).
fn claims_to_be_ack(ce: &CloudEvent) -> bool {
    let schema = ce.attributes.get("dataschema").and_then(|v| match &v.attr {
        Some(Attr::CeString(s) | Attr::CeUri(s) | Attr::CeUriRef(s)) => Some(s.as_str()),
        _ => None,
    });
    ce.r#type == EventType::Processed.as_str() || schema == Some(Target::EventProcessed.as_str())
}

/// Handles one message from the agent; returns whether it was processed.
async fn on_message(hub: &Hub, session: &AgentSession, msg: WireEvent) -> bool {
    crate::metrics::global().event_received();
    let ack_ref = msg.event.as_ref().and_then(AckRef::of);
    let is_ack = msg.event.as_ref().is_some_and(claims_to_be_ack);
    let ev = match Event::from_wire(msg) {
        Ok(ev) => ev,
        Err(e) => {
            match ack_ref {
                Some(r) if is_ack => tracing::warn!(agent = %session.name(), error = %e, resource_id = %r.resource_id,
                    event_id = %r.event_id, "undecodable ACK from agent; ignored (an ACK is never answered)"),
                Some(r) => {
                    tracing::warn!(agent = %session.name(), error = %e, resource_id = %r.resource_id,
                        event_id = %r.event_id, "undecodable event from agent; acknowledged so it is not resent");
                    session.push(ack_for(&r));
                }
                None => tracing::warn!(agent = %session.name(), error = %e,
                    "undecodable event from agent without a resourceid; cannot answer it, ignored"),
            }
            return false;
        }
    };
    if ev.is_ack() {
        session.ack(&ev.resource_id, &ev.event_id);
        return true;
    }
    let span = crate::otel::received_span(session, &ev);
    async {
        let started = std::time::Instant::now();
        let result = inbound::process(hub, session, &ev).await;
        crate::metrics::global().event_processed(session.name(), &ev.target, &result, started.elapsed());
        match result {
            Ok(()) => session.push(ev.processed_ack()),
            Err(e) if e.is_retryable() => {
                tracing::warn!(error = %e, "cannot apply event now; the agent will resend it")
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot apply event; acknowledged so it is not resent");
                session.push(ev.processed_ack());
            }
        }
    }
    .instrument(span)
    .await;
    true
}

/// Drains the session's outbox onto the stream until the stream is closed or replaced, or the
/// transport goes away. Events that would encode above `max_bytes` are given up on.
async fn send_loop(
    session: Arc<AgentSession>,
    tx: mpsc::Sender<Box<WireEvent>>,
    handle: StreamHandle,
    max_bytes: usize,
) {
    loop {
        if handle.is_closed() {
            return;
        }
        // `None`: a newer stream replaced this one and must not lose events to it.
        let Some((ready, deadline)) = session.take_ready(handle.generation()) else {
            return;
        };
        for mut ev in ready {
            ev.stamp_sent_at(chrono::Utc::now());
            let wire = ev.to_wire();
            let len = prost::Message::encoded_len(&wire);
            if len > max_bytes {
                tracing::warn!(agent = %session.name(), event_type = %ev.event_type, target = %ev.target,
                    resource_id = %ev.resource_id, event_id = %ev.event_id, bytes = len, limit = max_bytes,
                    "event too large to send; given up (the next resync repairs)");
                session.reject(&ev, format!("encodes to {len} bytes, above the {max_bytes}-byte message limit"));
                continue;
            }
            tokio::select! {
                biased;
                () = handle.closed() => return,
                sent = tx.send(Box::new(wire)) => match sent {
                    Ok(()) => crate::metrics::global().event_sent(),
                    Err(_) => {
                        crate::metrics::global().send_failed(session.name(), "transport-closing");
                        return;
                    }
                },
            }
        }
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = handle.closed() => return,
            () = tx.closed() => return,
            () = session.changed() => {}
            () = sleep => {}
        }
    }
}

/// Closes the stream with `Unauthenticated` when its session expires: the access token that
/// opened it, or the latest one a refresh of the same session issued.
async fn expire_at(handle: StreamHandle, agent: String) {
    let mut deadline = handle.deadline();
    loop {
        let Some(at) = *deadline.borrow_and_update() else { return };
        let remaining = at.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            () = handle.closed() => return,
            changed = deadline.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(remaining) => {
                if deadline.borrow().is_some_and(|d| d > at) {
                    continue;
                }
                tracing::info!(%agent, "the agent's session expired without a refresh; stream closed");
                handle.close(Some(expired(&agent, at)));
                return;
            }
        }
    }
}

/// The outgoing half: what the sender task queues until the stream is closed, then the status
/// it was closed with. Whatever is still buffered then is dropped: the outbox has those events
/// in flight and sends them again on the next stream.
/// The channel carries boxed events: tokio allocates a channel's slots in blocks of 32, so a
/// slot the size of a pointer keeps an idle stream's channel at a few hundred bytes (a
/// `Result<WireEvent, Status>` slot made it 6 KiB per agent).
fn outgoing(rx: mpsc::Receiver<Box<WireEvent>>, handle: StreamHandle) -> Outgoing {
    Box::pin(futures::stream::unfold(Some((rx, handle)), |state| async move {
        let (mut rx, handle) = state?;
        let item = tokio::select! {
            biased;
            () = handle.closed() => None,
            item = rx.recv() => item,
        };
        match item {
            Some(item) => Some((Ok(*item), Some((rx, handle)))),
            None => handle.end_status().map(|status| (Err(status), None)),
        }
    }))
}

/// The status relayed to the agent when reading its stream failed.
fn inbound_failure(agent: &str, status: Status, limit: usize) -> Status {
    if status.code() == Code::OutOfRange {
        tracing::warn!(%agent, %status, limit,
            "the agent sent a message above the maximum message size; its stream is closed");
        Status::out_of_range(format!(
            "the principal closed the stream: {} (an event this large can never be delivered; the agent must give it up)",
            status.message()
        ))
    } else {
        tracing::info!(%agent, %status, "agent stream failed");
        status
    }
}

/// First and longest pause between attempts to start a resync.
const RESYNC_RETRY_INITIAL: std::time::Duration = std::time::Duration::from_millis(500);
const RESYNC_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);

async fn run_stream(
    hub: Arc<Hub>,
    session: Arc<AgentSession>,
    handle: StreamHandle,
    mut inbound: Streaming<WireEvent>,
) {
    tracing::info!(agent = %session.name(), mode = %session.mode(), "agent connected");
    crate::metrics::global().agent_connected(session.name());
    if hub.config.namespace_create_enable && session.mode() == AgentMode::Autonomous {
        match Box::pin(crate::state::ensure_namespace(
            &hub.apps.client(),
            session.name(),
            &hub.config.namespace_create_labels,
        ))
        .await
        {
            Ok(true) => tracing::info!(agent = %session.name(), "created the agent's hub namespace"),
            Ok(false) => {}
            Err(e) => tracing::warn!(agent = %session.name(), error = %e, "cannot create the agent's hub namespace"),
        }
    }
    // The resync start reads the hub; under a reconnect storm or a hub restart those reads can
    // fail for a moment. Retried with backoff while the stream lives, beside the receive loop,
    // so a transient failure does not leave the agent unsynced until its next reconnect.
    tokio::spawn({
        let (hub, session, handle) = (hub.clone(), session.clone(), handle.clone());
        async move {
            let mut delay = RESYNC_RETRY_INITIAL;
            loop {
                match Box::pin(resync::on_connect(&hub, &session)).await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(agent = %session.name(), error = %e, retry_in = ?delay,
                        "cannot start resync; retrying"),
                }
                tokio::select! {
                    () = handle.closed() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(RESYNC_RETRY_MAX);
            }
        }
    });
    loop {
        // Biased: once replaced, expired or revoked, nothing more from this stream is applied.
        let msg = tokio::select! {
            biased;
            () = handle.closed() => break,
            msg = inbound.message() => msg,
        };
        match msg {
            Ok(Some(msg)) => {
                // Boxed: inline, the largest message handler (hub writes) would size this
                // task, which lives as long as the stream, for every idle agent.
                Box::pin(on_message(&hub, &session, msg)).await;
            }
            Ok(None) => break,
            Err(status) => {
                handle.close(Some(inbound_failure(session.name(), status, hub.config.max_message_bytes)));
                break;
            }
        }
    }
    if let Some(status) = handle.end_status() {
        tracing::info!(agent = %session.name(), code = ?status.code(), reason = status.message(), "agent stream closed");
    }
    handle.close(None);
    session.detach(&handle);
    crate::metrics::global().agent_disconnected(session.name(), handle.end_status().as_ref());
}

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = Outgoing;

    async fn subscribe(
        &self,
        request: Request<Streaming<WireEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (session, mode, grant) = self.session_for(&request)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let expires = grant.expires_at.is_some();
        // Attach now, so an older stream of this agent is closed before this one runs.
        let handle = session.attach(mode, grant);
        if expires {
            tokio::spawn(expire_at(handle.clone(), session.name().to_owned()));
        }
        tokio::spawn(send_loop(session.clone(), tx, handle.clone(), self.hub.config.max_message_bytes));
        tokio::spawn(run_stream(self.hub.clone(), session, handle.clone(), request.into_inner()));
        Ok(Response::new(outgoing(rx, handle)))
    }

    async fn push(&self, request: Request<Streaming<WireEvent>>) -> Result<Response<PushSummary>, Status> {
        let (session, _mode, grant) = self.session_for(&request)?;
        let mut inbound = request.into_inner();
        let expiry = async {
            match grant.expires_at {
                Some(at) => {
                    tokio::time::sleep(at.duration_since(SystemTime::now()).unwrap_or_default()).await;
                    at
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let (mut received, mut processed) = (0i32, 0i32);
        loop {
            let msg = tokio::select! {
                at = &mut expiry => return Err(expired(session.name(), at)),
                msg = inbound.message() => msg?,
            };
            let Some(msg) = msg else { break };
            if self.is_revoked(&grant) {
                return Err(revoked(session.name()));
            }
            received = received.saturating_add(1);
            if on_message(&self.hub, &session, msg).await {
                processed = processed.saturating_add(1);
            }
        }
        Ok(Response::new(PushSummary { result: "ok".into(), received, processed }))
    }

    /// Unimplemented, as upstream (§2.1); liveness rides on the stream's heartbeats.
    async fn ping(&self, _request: Request<PingRequest>) -> Result<Response<PongReply>, Status> {
        Err(Status::unimplemented("Ping is not implemented; send heartbeat events on the Subscribe stream"))
    }
}
