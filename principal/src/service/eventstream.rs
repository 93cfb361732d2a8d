//! `eventstreamapi.EventStream`: the agent's bidirectional stream of CloudEvents.
//!
//! Per stream: the caller's identity comes from the [`IdentityFn`] seam; the agent's session
//! is attached (replacing any older stream of the same agent); a sender task drains the
//! session's outbox onto the stream; the receive loop applies each event in order and ACKs
//! it. A malformed, unknown or failing event is answered (ACKed) and logged; it never ends
//! the stream and is never retried forever.

use std::sync::Arc;

use protocol::event::AckRef;
use protocol::pb::eventstreamapi::event_stream_server::EventStream;
use protocol::pb::eventstreamapi::{Event as WireEvent, PingRequest, PongReply, PushSummary};
use protocol::{Event, EventType, Target};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::config::AgentMode;
use crate::hub::Hub;
use crate::ident::IdentityFn;
use crate::inbound;
use crate::resync;
use crate::session::AgentSession;

/// Events buffered between the sender task and the transport; the sender waits when it is
/// full (nothing is dropped; the outbox holds the rest).
const STREAM_BUFFER: usize = 64;

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

    fn session_for<T>(&self, request: &Request<T>) -> Result<(Arc<AgentSession>, AgentMode), Status> {
        let ident = (self.identity)(request.extensions(), request.metadata()).ok_or_else(|| {
            Status::unauthenticated("no authenticated agent on this call (the auth layer must identify the agent)")
        })?;
        if !self.hub.config.admits(&ident.name) {
            return Err(Status::permission_denied(format!(
                "agent {:?} is not covered by the principal's --allowed-namespaces or equals its namespace",
                ident.name
            )));
        }
        let session = self.hub.sessions.get_or_create(&ident.name, ident.mode);
        Ok((session, ident.mode))
    }
}

fn ack_for(r: &AckRef) -> Event {
    Event::new(EventType::Processed, Target::EventProcessed, r.resource_id.clone(), r.event_id.clone())
}

/// Handles one message from the agent; returns whether it was processed.
async fn on_message(hub: &Hub, session: &AgentSession, msg: WireEvent) -> bool {
    let ack_ref = msg.event.as_ref().and_then(AckRef::of);
    let ev = match Event::from_wire(msg) {
        Ok(ev) => ev,
        Err(e) => {
            tracing::warn!(agent = %session.name(), error = %e, "undecodable event from agent");
            match ack_ref {
                Some(r) => session.push(ack_for(&r)),
                None => tracing::warn!(agent = %session.name(), "it has no resourceid either; cannot answer it"),
            }
            return false;
        }
    };
    if ev.is_ack() {
        session.ack(&ev.resource_id, &ev.event_id);
        return true;
    }
    let span = tracing::info_span!("inbound", agent = %session.name(), mode = %session.mode(),
        event_type = %ev.event_type, target = %ev.target, resource_id = %ev.resource_id, event_id = %ev.event_id);
    async {
        match inbound::process(hub, session, &ev).await {
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

/// Drains the session's outbox onto the stream until `cancel` fires or the stream closes.
async fn send_loop(session: Arc<AgentSession>, tx: mpsc::Sender<Result<WireEvent, Status>>, cancel: CancellationToken) {
    loop {
        if cancel.is_cancelled() {
            return; // a replaced stream must not take events meant for its successor
        }
        let (ready, deadline) = session.take_ready();
        for mut ev in ready {
            ev.stamp_sent_at(chrono::Utc::now());
            if tx.send(Ok(ev.to_wire())).await.is_err() {
                return;
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
            () = cancel.cancelled() => return,
            () = tx.closed() => return,
            () = session.changed() => {}
            () = sleep => {}
        }
    }
}

/// One attached stream of an agent.
struct Stream {
    session: Arc<AgentSession>,
    generation: u64,
    cancel: CancellationToken,
}

async fn run_stream(
    hub: Arc<Hub>,
    stream: Stream,
    mut inbound: Streaming<WireEvent>,
    tx: mpsc::Sender<Result<WireEvent, Status>>,
) {
    let Stream { session, generation, cancel } = stream;
    tracing::info!(agent = %session.name(), mode = %session.mode(), "agent connected");
    tokio::spawn(send_loop(session.clone(), tx, cancel.clone()));
    if hub.config.namespace_create_enable && session.mode() == AgentMode::Autonomous {
        match crate::state::ensure_namespace(&hub.apps.client(), session.name(), &hub.config.namespace_create_labels)
            .await
        {
            Ok(true) => tracing::info!(agent = %session.name(), "created the agent's hub namespace"),
            Ok(false) => {}
            Err(e) => tracing::warn!(agent = %session.name(), error = %e, "cannot create the agent's hub namespace"),
        }
    }
    if let Err(e) = resync::on_connect(&hub, &session).await {
        tracing::warn!(agent = %session.name(), error = %e, "cannot start resync; it runs again on the next connect");
    }
    loop {
        let msg = tokio::select! {
            () = cancel.cancelled() => break,
            msg = inbound.message() => msg,
        };
        match msg {
            Ok(Some(msg)) => {
                on_message(&hub, &session, msg).await;
            }
            Ok(None) => break,
            Err(status) => {
                tracing::info!(agent = %session.name(), %status, "agent stream failed");
                break;
            }
        }
    }
    cancel.cancel();
    session.detach(generation);
}

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = ReceiverStream<Result<WireEvent, Status>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<WireEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (session, mode) = self.session_for(&request)?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        // Attach now, so an older stream of this agent is cancelled before this one runs.
        let (generation, cancel) = session.attach(mode);
        let stream = Stream { session, generation, cancel };
        tokio::spawn(run_stream(self.hub.clone(), stream, request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn push(&self, request: Request<Streaming<WireEvent>>) -> Result<Response<PushSummary>, Status> {
        let (session, _mode) = self.session_for(&request)?;
        let mut inbound = request.into_inner();
        let (mut received, mut processed) = (0i32, 0i32);
        while let Some(msg) = inbound.message().await? {
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
